// A wait that can never complete must end as an error naming the rank, the
// flag and the values - not as a hang. Trapping leaves the waiting rank's CUDA
// context unusable, so this test runs only in its own process
// (WEFT_TEST_PROVOKE_TIMEOUT=1; scripts/test.sh and CTest's gpu_wait_timeout do that).
#include <chrono>
#include <cstdlib>

#include "gpu_test.hpp"
#include "weft/core/error.hpp"
#include "weft/device.cuh"

using namespace weft;
using weft::test::ctx;

namespace {
__global__ void wait_forever(dev::World w, std::uint64_t* flag) {
  dev::wait_until(w, flag, dev::Cmp::ge, 1, dev::Scope::sys);
}
}  // namespace

TEST(WaitTimeout, ReportsTheRankTheFlagAndTheValues) {
  if (!std::getenv("WEFT_TEST_PROVOKE_TIMEOUT"))
    GTEST_SKIP() << "runs only with WEFT_TEST_PROVOKE_TIMEOUT=1, in a process of its own";
  ASSERT_GT(ctx().wait_timeout().count(), 0) << "set WEFT_WAIT_TIMEOUT to a short bound for this test";
  SymmetricBuffer flag(ctx().heap(), sizeof(std::uint64_t), "u64", "test.never_signalled");
  const int victim = ctx().world_size() - 1;  // the last rank waits; nobody signals it
  std::string message;
  auto t0 = std::chrono::steady_clock::now();
  if (ctx().rank() == victim) {
    wait_forever<<<1, 1, 0, test::stream()>>>(ctx().world(), flag.as<std::uint64_t>());
    try {
      ctx().synchronize(test::stream());
    } catch (const Error& e) {
      message = e.what();
    }
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_NE(message.find(str("rank ", victim, " (block 0) waited")), std::string::npos) << message;
    EXPECT_NE(message.find("test.never_signalled"), std::string::npos) << message;
    EXPECT_NE(message.find(">= 1; it holds 0"), std::string::npos) << message;
    EXPECT_LT(waited, ctx().wait_timeout().count() / 1000.0 + 10.0) << "reported too late";
    std::printf("[ info ] provoked hang reported after %.2f s: %s\n", waited, message.c_str());
  }
  ctx().host_barrier("timeout test done");
}
