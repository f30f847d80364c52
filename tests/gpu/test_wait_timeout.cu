// A rank that skips a collective must not leave the others hanging: their
// device waits end, past WEFT_WAIT_TIMEOUT, in an error that names the rank
// that never signalled, the flag and the values. Trapping leaves the waiting
// ranks' CUDA contexts unusable, so each test runs only in a process of its own:
// WEFT_TEST_PROVOKE_TIMEOUT=1 runs the collective's, =gemm the GEMM's
// (scripts/gpu_session.sh and CTest's gpu_wait_timeout, gpu_wait_timeout_gemm).
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>

#include "gpu_test.hpp"
#include "weft/core/error.hpp"
#include "weft/gemm/gemm.hpp"
#include "weft/ops/all_reduce.hpp"

using namespace weft;
using weft::test::ctx;

namespace {
/// WEFT_TEST_PROVOKE_TIMEOUT, or "" if unset.
std::string provoked() {
  const char* v = std::getenv("WEFT_TEST_PROVOKE_TIMEOUT");
  return v ? v : "";
}
}  // namespace

TEST(WaitTimeout, ARankThatSkipsAnAllReduceIsNamed) {
  if (provoked().empty() || provoked() == "gemm")
    GTEST_SKIP() << "runs only with WEFT_TEST_PROVOKE_TIMEOUT=1, in processes of their own";
  WEFT_NEED_RANKS(2);
  ASSERT_GT(ctx().wait_timeout().count(), 0) << "set WEFT_WAIT_TIMEOUT to a short bound for this test";
  const int skipper = ctx().world_size() - 1;
  AllReduce plan(test::ctx_ptr(), {4096, DType::bf16, AllReduceVariant::low_latency, 0});
  SymmetricBuffer buf(ctx().heap(), 4096 * 2, "bf16", "test.timeout.buffer");
  WEFT_CUDA(cudaMemset(buf.get(), 0x3c, 4096 * 2));
  bool named_skipper = false;
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
    // Under MPS the first rank whose wait times out ends the work of every
    // rank on that GPU: a rank stopped so says that, and another names the skipper.
    const bool own = message.find(str("device wait timed out: rank ", ctx().rank())) != std::string::npos;
    const bool stopped_by_another =
        ctx().team().mps_client && message.find("share this GPU under MPS") != std::string::npos;
    EXPECT_TRUE(own || stopped_by_another) << message;
    if (own) {
      EXPECT_NE(message.find(str("rank ", skipper, " never signalled it")), std::string::npos) << message;
      EXPECT_NE(message.find("all_reduce.ll.staging"), std::string::npos) << message;
      named_skipper = message.find(str("rank ", skipper, " never signalled it")) != std::string::npos;
    }
    EXPECT_LT(waited, ctx().wait_timeout().count() / 1000.0 + 10.0) << "reported too late";
    std::printf("[ info ] rank %d: provoked hang reported after %.2f s: %s\n", ctx().rank(), waited, message.c_str());
  }
  // Some rank named the one that skipped.
  bool any = false;
  for (const std::string& v : test::gather(named_skipper ? "1" : "0")) any |= v == "1";
  EXPECT_TRUE(any) << "no rank's message named rank " << skipper;
  ctx().host_barrier("timeout test done");
}

// The GEMM's own waits (a hooked pingpong kernel waiting for its source rows,
// the wait GEMM + ReduceScatter makes) report the same way: they are written
// inline (dev::wait_until_no_call), so this is the path that test covers.
TEST(WaitTimeout, AGemmWhoseSourceRowsNeverArriveNamesTheFlag) {
  if (provoked() != "gemm")
    GTEST_SKIP() << "runs only with WEFT_TEST_PROVOKE_TIMEOUT=gemm, in a process of its own";
  ASSERT_GT(ctx().wait_timeout().count(), 0) << "set WEFT_WAIT_TIMEOUT to a short bound for this test";
  const std::int64_t m = 512, n = 512, k = 256, rows_per_flag = 128;
  GemmOptions o{m, n, k};
  o.hook = GemmHook::wait_source_rows;
  o.hook_layout.rows_per_flag = rows_per_flag;
  std::string pingpong;
  for (const std::string& c : Gemm(o).configurations())
    if (c.find("pingpong") != std::string::npos) pingpong = c;
  ASSERT_FALSE(pingpong.empty()) << "no hooked pingpong configuration adds a source";
  o.config = pingpong;
  Gemm gemm(o);
  SymmetricBuffer flags(ctx().heap(), m / rows_per_flag * 8, "u64", "test.timeout.gemm_rows");
  void *a, *b, *c, *src;  // not freed: the trap leaves this process's CUDA context unusable
  for (void** p : {&a, &b, &c, &src}) WEFT_CUDA(cudaMalloc(p, m * std::max(n, k) * 2));
  cudaStream_t s = test::stream();
  for (void* p : {a, b, src}) WEFT_CUDA(cudaMemsetAsync(p, 0x3c, m * std::max(n, k) * 2, s));
  WEFT_CUDA(cudaMemsetAsync(flags.get(), 0, m / rows_per_flag * 8, s));  // raised by nobody
  GemmArgs args{.a = a, .b = b, .c = c, .epilogue = AddSource{.source = src}};
  args.wait = RowSignals{.world = &ctx().world(),
                         .flags = static_cast<std::uint64_t*>(flags.get()),
                         .value = 1,
                         .from_rank = ctx().rank()};
  gemm.prepare(args, s);  // tuning never waits
  WEFT_CUDA(cudaStreamSynchronize(s));
  auto t0 = std::chrono::steady_clock::now();
  std::string message;
  gemm.run(args, s);
  try {
    ctx().synchronize(s);
  } catch (const Error& e) {
    message = e.what();
  }
  double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(message.find(str("device wait timed out: rank ", ctx().rank())), std::string::npos) << message;
  EXPECT_NE(message.find(str("rank ", ctx().rank(), " never signalled it")), std::string::npos) << message;
  EXPECT_NE(message.find("test.timeout.gemm_rows"), std::string::npos) << message;
  EXPECT_LT(waited, ctx().wait_timeout().count() / 1000.0 + 10.0) << "reported too late";
  std::printf("[ info ] provoked GEMM hang (%s) reported after %.2f s: %s\n", pingpong.c_str(), waited,
              message.c_str());
}
