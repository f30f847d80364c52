#include "weft/core/gpu_diagnosis.hpp"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdlib>

#include "weft/core/error.hpp"

namespace weft {
namespace {

std::string cuda_version(int v) { return str(v / 1000, ".", v % 1000 / 10); }

}  // namespace

GpuDiagnosis judge_gpus(const GpuFacts& f) {
  GpuDiagnosis d;
  const std::string visible =
      f.visible_devices_set ? str(" (CUDA_VISIBLE_DEVICES='", f.visible_devices, "')") : std::string();
  if (!f.driver_present) {
    d.message = "no NVIDIA driver on this machine (libcuda.so.1 is not installed), so no GPU is visible";
    return d;
  }
  if (f.count_error == cudaErrorInsufficientDriver || (f.count_error != cudaSuccess && f.driver_version > 0 &&
                                                       f.driver_version < f.runtime_version &&
                                                       f.driver_version / 1000 < f.runtime_version / 1000)) {
    d.verdict = GpuVerdict::broken;
    d.message = str("the NVIDIA driver supports CUDA ", cuda_version(f.driver_version),
                    " but weft was built with the CUDA ", cuda_version(f.runtime_version),
                    " runtime: install a driver for CUDA ", cuda_version(f.runtime_version),
                    " or newer (or build weft with the CUDA toolkit the driver supports)");
    return d;
  }
  if (f.count_error == cudaErrorNoDevice || (f.count_error == cudaSuccess && f.device_count == 0)) {
    d.message = str("no CUDA GPU is visible", visible);
    return d;
  }
  if (f.count_error != cudaSuccess) {
    d.verdict = GpuVerdict::broken;
    d.message = str("CUDA cannot start on the GPUs here: cudaGetDeviceCount failed with ", f.count_error_name,
                    visible, "; the NVIDIA driver (CUDA ", cuda_version(f.driver_version),
                    ") may be unloaded or the GPUs not accessible to this user");
    return d;
  }
  d.gpus = f.device_count;
  for (int i = 0; i < f.device_count && i < static_cast<int>(f.capability.size()); ++i) {
    const auto [major, minor] = f.capability[i];
    if (major != 9 || minor != 0) {
      d.verdict = GpuVerdict::broken;
      d.message = str("GPU ", i, " (", i < static_cast<int>(f.names.size()) ? f.names[i] : "?",
                      ") has compute capability ", major, ".", minor,
                      "; weft is built for Hopper only (compute capability 9.0, sm_90a: H100, H200, GH200)",
                      f.device_count > 1 ? "; CUDA_VISIBLE_DEVICES can hide the GPUs it cannot use" : "");
      return d;
    }
  }
  d.verdict = GpuVerdict::ready;
  return d;
}

GpuFacts read_gpu_facts() {
  GpuFacts f;
  f.runtime_version = CUDART_VERSION;
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) {
    f.visible_devices_set = true;
    f.visible_devices = v;
  }
  // The driver library is looked for directly: the runtime's own error for a
  // missing driver and for an old one can be the same.
  if (void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL)) {
    f.driver_present = true;
    dlclose(lib);
  }
  cudaDriverGetVersion(&f.driver_version);
  cudaError_t rc = cudaGetDeviceCount(&f.device_count);
  f.count_error = rc;
  f.count_error_name = cudaGetErrorName(rc);
  if (rc != cudaSuccess) {
    f.device_count = 0;
    return f;
  }
  for (int i = 0; i < f.device_count; ++i) {
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, i);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, i);
    f.capability.emplace_back(major, minor);
    cudaDeviceProp prop{};
    f.names.push_back(cudaGetDeviceProperties(&prop, i) == cudaSuccess ? prop.name : "?");
  }
  return f;
}

}  // namespace weft
