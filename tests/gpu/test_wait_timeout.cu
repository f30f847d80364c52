// A rank that skips a collective must not leave the others hanging: their
// device waits end, past WEFT_WAIT_TIMEOUT, in an error that names the rank
// that never signalled, the flag and the values. Trapping leaves the waiting
// ranks' CUDA contexts unusable, so this test runs only in processes of its own
// (WEFT_TEST_PROVOKE_TIMEOUT=1; scripts/gpu_session.sh and CTest's
// gpu_wait_timeout do that).
#include <chrono>
#include <cstdlib>

#include "gpu_test.hpp"
#include "weft/core/error.hpp"
#include "weft/ops/all_reduce.hpp"

using namespace weft;
using weft::test::ctx;

TEST(WaitTimeout, ARankThatSkipsAnAllReduceIsNamed) {
  if (!std::getenv("WEFT_TEST_PROVOKE_TIMEOUT"))
    GTEST_SKIP() << "runs only with WEFT_TEST_PROVOKE_TIMEOUT=1, in processes of their own";
  WEFT_NEED_RANKS(2);
  ASSERT_GT(ctx().wait_timeout().count(), 0) << "set WEFT_WAIT_TIMEOUT to a short bound for this test";
  const int skipper = ctx().world_size() - 1;
  AllReduce plan(test::ctx_ptr(), {4096, DType::bf16, AllReduceVariant::low_latency, 0});
  SymmetricBuffer buf(ctx().heap(), 4096 * 2, "bf16", "test.timeout.buffer");
  WEFT_CUDA(cudaMemset(buf.get(), 0x3c, 4096 * 2));
  if (ctx().rank() != skipper) {
    auto t0 = std::chrono::steady_clock::now();
    std::string message;
    plan.run(buf.get(), buf.get(), test::stream());
    try {
      ctx().synchronize(test::stream());
    } catch (const Error& e) {
      message = e.what();
    }
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_NE(message.find(str("device wait timed out: rank ", ctx().rank())), std::string::npos) << message;
    EXPECT_NE(message.find(str("rank ", skipper, " never signalled it")), std::string::npos) << message;
    EXPECT_NE(message.find("all_reduce.ll.staging"), std::string::npos) << message;
    EXPECT_LT(waited, ctx().wait_timeout().count() / 1000.0 + 10.0) << "reported too late";
    std::printf("[ info ] provoked hang reported after %.2f s: %s\n", waited, message.c_str());
  }
  ctx().host_barrier("timeout test done");
}
