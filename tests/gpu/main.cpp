// The GPU test binary: run it under weftrun (-n 1, -n 2, ...; more ranks than
// GPUs with --share-gpu). Without a GPU, or with fewer GPUs than ranks and no
// sharing, it says so and exits 77, which CTest and scripts/test.sh report as
// skipped (never as passed). A GPU that is here but unusable (a driver too old
// for the CUDA runtime, a GPU that is not Hopper) fails: it is a fault.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

#include "gpu_test.hpp"
#include "weft/core/error.hpp"
#include "weft/core/gpu_diagnosis.hpp"
#include "weft/runtime/launch_env.hpp"

namespace weft::test {
namespace {
std::shared_ptr<Context> g_ctx;
cudaStream_t g_stream = nullptr;
}  // namespace

Context& ctx() { return *g_ctx; }
std::shared_ptr<Context> ctx_ptr() { return g_ctx; }
cudaStream_t stream() { return g_stream; }

std::vector<std::string> gather(const std::string& mine) { return g_ctx->store().all_gather(mine, "test verdict"); }

bool all_ranks(bool mine) {
  bool all = true;
  for (auto& v : gather(mine ? "1" : "0")) all &= v == "1";
  return all;
}

}  // namespace weft::test

int main(int argc, char** argv) {
  using namespace weft;
  ::testing::InitGoogleTest(&argc, argv);
#ifdef GTEST_FLAG_GET
  const bool listing = GTEST_FLAG_GET(list_tests);
#else
  const bool listing = ::testing::GTEST_FLAG(list_tests);
#endif
  if (listing) return RUN_ALL_TESTS();  // CTest's discovery of the cases: no GPU needed
  LaunchEnv le;
  try {
    le = detect_launch_env(process_env());
  } catch (const Error& e) {
    std::fprintf(stderr, "weft GPU tests: %s\n", e.what());
    return 1;
  }
  const GpuDiagnosis gpus = diagnose_gpus();
  if (gpus.verdict == GpuVerdict::none) {
    std::printf("SKIPPED: weft GPU tests need a CUDA GPU: %s.\n", gpus.message.c_str());
    return 77;
  }
  if (gpus.verdict == GpuVerdict::broken) {
    std::fprintf(stderr, "weft GPU tests: FAILED: %s.\n", gpus.message.c_str());
    return 1;
  }
  const bool can_share = le.gpu_sharing == GpuSharing::mps || le.gpu_sharing == GpuSharing::timeslice ||
                         (le.gpu_sharing == GpuSharing::automatic && mps_pipe_present(std::getenv("CUDA_MPS_PIPE_DIRECTORY")));
  if (le.local_world_size > gpus.gpus && !can_share) {
    std::printf("SKIPPED: weft GPU tests at %d ranks per node need %d GPUs, or ranks sharing them "
                "(weftrun --share-gpu); this machine shows %d.\n",
                le.local_world_size, le.local_world_size, gpus.gpus);
    return 77;
  }
  if (le.rank != 0) {  // rank 0 reports; the others print failures only
#ifdef GTEST_FLAG_SET
    GTEST_FLAG_SET(brief, true);
#else
    ::testing::GTEST_FLAG(brief) = true;
#endif
  }
  // Tests compare every collective call across ranks (WEFT_CHECK_CALLS), so a
  // rank that strays is named at once; the provoked-hang run turns it off.
  ::setenv("WEFT_CHECK_CALLS", "1", 0);
  int result = 1;
  try {
    test::g_ctx = Context::from_env();
    WEFT_CUDA(cudaStreamCreateWithFlags(&test::g_stream, cudaStreamNonBlocking));
    result = RUN_ALL_TESTS();
    // A test failing on one rank fails the job on every rank.
    result = test::all_ranks(result == 0) ? 0 : 1;
    cudaStreamDestroy(test::g_stream);
    test::g_ctx.reset();
  } catch (const Error& e) {
    std::fprintf(stderr, "weft GPU tests: %s\n", e.what());
    return 1;
  }
  return result;
}
