// The one diagnosis every weft program and the GPU tests make first, fed with
// made-up facts: no GPU (skip), a driver too old for the runtime, a GPU that
// is not Hopper, any other start-up error (fail, naming it), and the settings
// for ranks sharing a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "weft/core/gpu_diagnosis.hpp"
#include "weft/runtime/gpu_share.hpp"

using namespace weft;

namespace {
GpuFacts hopper(int gpus) {
  GpuFacts f;
  f.driver_present = true;
  f.driver_version = 13000;
  f.runtime_version = 13000;
  f.count_error = cudaSuccess;
  f.count_error_name = "cudaSuccess";
  f.device_count = gpus;
  for (int i = 0; i < gpus; ++i) {
    f.capability.emplace_back(9, 0);
    f.names.push_back("NVIDIA H200");
  }
  return f;
}
}  // namespace

TEST(GpuDiagnosis, HopperGpusAreReady) {
  const GpuDiagnosis d = judge_gpus(hopper(2));
  EXPECT_EQ(d.verdict, GpuVerdict::ready);
  EXPECT_EQ(d.gpus, 2);
  EXPECT_EQ(d.message, "");
}

TEST(GpuDiagnosis, NoDriverMeansNoGpuNotAFault) {
  GpuFacts f;
  f.count_error = cudaErrorInsufficientDriver;  // what the runtime says without any driver
  const GpuDiagnosis d = judge_gpus(f);
  EXPECT_EQ(d.verdict, GpuVerdict::none);
  EXPECT_NE(d.message.find("no NVIDIA driver"), std::string::npos) << d.message;
}

TEST(GpuDiagnosis, NoVisibleGpuSaysWhichSettingHidesThem) {
  GpuFacts f = hopper(0);
  f.count_error = cudaErrorNoDevice;
  f.visible_devices_set = true;
  f.visible_devices = "";
  const GpuDiagnosis d = judge_gpus(f);
  EXPECT_EQ(d.verdict, GpuVerdict::none);
  EXPECT_NE(d.message.find("no CUDA GPU is visible (CUDA_VISIBLE_DEVICES='')"), std::string::npos) << d.message;
}

TEST(GpuDiagnosis, ADriverTooOldForTheRuntimeIsAFaultNamingBothVersions) {
  GpuFacts f = hopper(0);
  f.driver_version = 12040;
  f.count_error = cudaErrorInsufficientDriver;
  f.count_error_name = "cudaErrorInsufficientDriver";
  const GpuDiagnosis d = judge_gpus(f);
  EXPECT_EQ(d.verdict, GpuVerdict::broken);
  EXPECT_NE(d.message.find("supports CUDA 12.4"), std::string::npos) << d.message;
  EXPECT_NE(d.message.find("CUDA 13.0 runtime"), std::string::npos) << d.message;
}

TEST(GpuDiagnosis, AGpuThatIsNotHopperIsAFaultNamingIt) {
  GpuFacts f = hopper(2);
  f.capability[1] = {8, 0};
  f.names[1] = "NVIDIA A100-SXM4-80GB";
  const GpuDiagnosis d = judge_gpus(f);
  EXPECT_EQ(d.verdict, GpuVerdict::broken);
  EXPECT_NE(d.message.find("GPU 1 (NVIDIA A100-SXM4-80GB) has compute capability 8.0"), std::string::npos) << d.message;
  EXPECT_NE(d.message.find("Hopper"), std::string::npos) << d.message;
}

TEST(GpuDiagnosis, AnyOtherStartUpErrorIsAFaultNamingIt) {
  GpuFacts f = hopper(0);
  f.count_error = cudaErrorNotPermitted;
  f.count_error_name = "cudaErrorNotPermitted";
  const GpuDiagnosis d = judge_gpus(f);
  EXPECT_EQ(d.verdict, GpuVerdict::broken);
  EXPECT_NE(d.message.find("cudaErrorNotPermitted"), std::string::npos) << d.message;
}

TEST(GpuSharing, SettingsParseAndSharesFitTheGpu) {
  EXPECT_EQ(parse_gpu_sharing(""), GpuSharing::automatic);
  EXPECT_EQ(parse_gpu_sharing("auto"), GpuSharing::automatic);
  EXPECT_EQ(parse_gpu_sharing("0"), GpuSharing::off);
  EXPECT_EQ(parse_gpu_sharing("off"), GpuSharing::off);
  EXPECT_EQ(parse_gpu_sharing("1"), GpuSharing::mps);
  EXPECT_EQ(parse_gpu_sharing("mps"), GpuSharing::mps);
  EXPECT_EQ(parse_gpu_sharing("timeslice"), GpuSharing::timeslice);
  EXPECT_FALSE(parse_gpu_sharing("yes").has_value());
  for (int k = 1; k <= 16; ++k) EXPECT_LE(k * sm_share(132, k), 132) << k << " ranks per GPU";
  EXPECT_EQ(sm_share(132, 1), 132);
  EXPECT_EQ(sm_share(132, 2), 66);
  EXPECT_EQ(sm_share(132, 8), 16);
  EXPECT_EQ(sm_share(4, 8), 1);
}

TEST(GpuSharing, VisibleDevicesAreCountedAsCudaReadsThem) {
  // Without NVIDIA's libraries (CI) the list alone counts; with them, no more than are present.
  const int listed = count_visible_gpus("0,1,2").count;
  EXPECT_TRUE(listed == 3 || count_visible_gpus(nullptr).count < 3) << listed;
  EXPECT_EQ(count_visible_gpus("").count, 0);
  EXPECT_NE(count_visible_gpus("").why.find("hides every GPU"), std::string::npos);
  EXPECT_EQ(count_visible_gpus("-1").count, 0);
  EXPECT_LE(count_visible_gpus("0,-1,1").count, 1);  // CUDA stops at the first invalid entry
}
