// The overlapped tensor-parallel operators (AgGemm, GemmRs, GemmAr), every
// path, against a cuBLAS reference with fp32 accumulation and output, built on
// each rank from every rank's inputs (regenerated from their seeds, so the
// reference needs no communication and runs where ranks share a GPU):
// relative error on fresh random inputs and poisoned outputs, M not a multiple
// of the tile (1000), bf16 and fp16, shapes the engine cannot tile (the
// sequential fallback); the gathered A bitwise; 1,000 back-to-back runs bitwise
// equal; a CUDA-graph replay equal to eager; and the errors for bad input.
#include <cublas_v2.h>

#include <cstdlib>
#include <functional>

#include "gpu_check.hpp"
#include "gpu_test.hpp"
#include "overlap_check.hpp"
#include "weft/core/error.hpp"
#include "weft/ops/ag_gemm.hpp"
#include "weft/ops/gemm_ar.hpp"
#include "weft/ops/gemm_rs.hpp"

using namespace weft;
using namespace weft::test::overlap;
using weft::test::ctx;
using weft::test::ctx_ptr;

namespace {

const OverlapMode kModes[] = {OverlapMode::fused, OverlapMode::sequential, OverlapMode::automatic};

}  // namespace

TEST(AgGemm, EveryPathMatchesTheGatheredReference) {
  Cublas cb;
  const int w = ctx().world_size();
  for (std::int64_t m : {std::int64_t{1000}, std::int64_t{2048}})
    for (OverlapMode mode : kModes) {
      const std::int64_t mm = m / w * w;
      AgResult r = check_ag_gemm(mm, 768, 1024, mode, cb);
      EXPECT_LT(r.err, 1e-2) << "M=" << mm << " " << to_string(mode);
      EXPECT_EQ(r.gathered_mismatch, 0u) << "M=" << mm << " " << to_string(mode);
    }
  // Shards of 32 MB and more travel in several chunks (each at least 16 MB).
  for (OverlapMode mode : kModes) {
    AgResult r = check_ag_gemm(2048 * w, 768, 8192, mode, cb);
    EXPECT_LT(r.err, 1e-2) << "K=8192 " << to_string(mode);
    EXPECT_EQ(r.gathered_mismatch, 0u) << "K=8192 " << to_string(mode);
  }
  // Each fused way forced: one hooked GEMM, and a plain GEMM per shard (two
  // ranks or more), with shards in one chunk and in several.
  for (AgWay way : {AgWay::one_gemm, AgWay::plain_steps}) {
    if (way == AgWay::plain_steps && w == 1) continue;
    for (std::int64_t k : {std::int64_t{1024}, std::int64_t{8192}}) {
      AgResult r = check_ag_gemm(2048 * w, 768, k, OverlapMode::fused, cb, way);
      EXPECT_LT(r.err, 1e-2) << "K=" << k << " way " << static_cast<int>(way);
      EXPECT_EQ(r.gathered_mismatch, 0u) << "K=" << k << " way " << static_cast<int>(way);
    }
  }
}

// GemmRs (all_reduce = false) or GemmAr: every path at M = 1000 and 2048, and
// blocks of 32 MB and more, which travel in several chunks (each at least 16 MB).
static void expect_every_reduce_path_matches(bool all_reduce) {
  Cublas cb;
  const int w = ctx().world_size();
  for (std::int64_t m : {std::int64_t{1000}, std::int64_t{2048}})
    for (OverlapMode mode : kModes) {
      const std::int64_t mm = m / w * w;
      EXPECT_LT(check_gemm_reduce(all_reduce, mm, 768, 1024, mode, cb).err, 1e-2)
          << "M=" << mm << " " << to_string(mode);
    }
  for (OverlapMode mode : kModes)
    EXPECT_LT(check_gemm_reduce(all_reduce, 2048 * w, 8192, 1024, mode, cb).err, 1e-2) << "N=8192 " << to_string(mode);
  // Each fused way, where it can run: the ring per step and in one launch
  // (M / W a multiple of 512; its tiles walk the blocks in the ring's order at
  // every world size), with a plain first step (two ranks or more), and in one
  // launch adding (two ranks); blocks of 2048 rows travel in 4 chunks.
  for (std::int64_t rows : {std::int64_t{512}, std::int64_t{2048}})
    for (FusedWay way : {FusedWay::ring_per_step, FusedWay::ring_one_launch, FusedWay::ring_plain_first,
                         FusedWay::one_launch_add}) {
      if (way == FusedWay::ring_plain_first && w == 1) continue;
      if (way == FusedWay::one_launch_add && w != 2) continue;
      EXPECT_LT(check_gemm_reduce(all_reduce, rows * w, 8192, 1024, OverlapMode::fused, cb, way).err, 1e-2)
          << "M / W = " << rows << ", " << static_cast<int>(way);
    }
}

TEST(GemmRs, EveryPathMatchesTheSummedReference) { expect_every_reduce_path_matches(false); }

TEST(GemmAr, EveryPathMatchesTheSummedReference) { expect_every_reduce_path_matches(true); }

// fp16 through every operator, every mode and every fused way that runs at
// this world size, against cuBLAS's fp32-accumulated reference.
TEST(Overlap, Fp16EveryOperatorModeAndWayMatches) {
  Cublas cb;
  const int w = ctx().world_size();
  for (OverlapMode mode : kModes) {
    AgResult r = check_ag_gemm(2048, 768, 1024, mode, cb, AgWay::automatic, DType::fp16);
    EXPECT_LT(r.err, 1e-2) << "AgGemm " << to_string(mode);
    EXPECT_EQ(r.gathered_mismatch, 0u) << "AgGemm " << to_string(mode);
    for (bool all_reduce : {false, true})
      EXPECT_LT(
          check_gemm_reduce(all_reduce, 1024 * w, 1024, 1024, mode, cb, FusedWay::automatic, DType::fp16).err, 1e-2)
          << (all_reduce ? "GemmAr " : "GemmRs ") << to_string(mode);
  }
  for (AgWay way : {AgWay::one_gemm, AgWay::plain_steps}) {
    if (way == AgWay::plain_steps && w == 1) continue;
    AgResult r = check_ag_gemm(2048 * w, 768, 8192, OverlapMode::fused, cb, way, DType::fp16);
    EXPECT_LT(r.err, 1e-2) << "AgGemm way " << static_cast<int>(way);
    EXPECT_EQ(r.gathered_mismatch, 0u) << "AgGemm way " << static_cast<int>(way);
  }
  for (FusedWay way : {FusedWay::ring_per_step, FusedWay::ring_one_launch, FusedWay::ring_plain_first,
                       FusedWay::one_launch_add}) {
    if (way == FusedWay::ring_plain_first && w == 1) continue;
    if (way == FusedWay::one_launch_add && w != 2) continue;
    for (bool all_reduce : {false, true})
      EXPECT_LT(check_gemm_reduce(all_reduce, 512 * w, 8192, 1024, OverlapMode::fused, cb, way, DType::fp16).err, 1e-2)
          << (all_reduce ? "GemmAr" : "GemmRs") << " way " << static_cast<int>(way);
  }
}

// Shapes the GEMM engine cannot tile (K = 8190: rows of A not 16-byte
// aligned; GemmAr's M = 1001, not a multiple of the world size past one
// rank) run the sequential path on cuBLAS, whatever mode was asked, and are
// correct, in both types.
TEST(Overlap, UntileableShapesRunSequentiallyOnCublas) {
  Cublas cb;
  const int w = ctx().world_size();
  for (DType t : {DType::bf16, DType::fp16})
    for (OverlapMode mode : {OverlapMode::fused, OverlapMode::automatic}) {
      SCOPED_TRACE(str(to_string(t), " ", to_string(mode)));
      AgResult r = check_ag_gemm(501 * w, 768, 8190, mode, cb, AgWay::automatic, t);
      EXPECT_EQ(r.mode, OverlapMode::sequential) << "AgGemm K = 8190";
      EXPECT_LT(r.err, 1e-2) << "AgGemm K = 8190";
      EXPECT_EQ(r.gathered_mismatch, 0u) << "AgGemm K = 8190";
      ReduceResult rr = check_gemm_reduce(false, 501 * w, 768, 8190, mode, cb, FusedWay::automatic, t);
      EXPECT_LT(rr.err, 1e-2) << "GemmRs";
      EXPECT_EQ(rr.mode, OverlapMode::sequential) << "GemmRs K = 8190";
      rr = check_gemm_reduce(true, 1001, 768, 8190, mode, cb, FusedWay::automatic, t);
      EXPECT_LT(rr.err, 1e-2) << "GemmAr";
      EXPECT_EQ(rr.mode, OverlapMode::sequential) << "GemmAr M = 1001, K = 8190";
      rr = check_gemm_reduce(true, 1001, 768, 1024, mode, cb, FusedWay::automatic, t);
      EXPECT_LT(rr.err, 1e-2) << "GemmAr M = 1001";
      EXPECT_EQ(rr.mode, w == 1 ? mode : OverlapMode::sequential) << "GemmAr M = 1001, K = 1024";
    }
}

// FusedWay::one_launch_add: exactly 2 ranks, and an `out` the peer can write
// (the symmetric heap); forced, with any other `out` it refuses, naming why.
TEST(GemmRs, AddingInOneLaunchNeedsTwoRanksAndASymmetricOut) {
  const int w = ctx().world_size();
  const std::int64_t m = 1024 * w, n = 1024, k = 512;
  auto error_of = [&](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const GemmRsOptions o{.m = m, .n = n, .k = k, .mode = OverlapMode::fused, .way = FusedWay::one_launch_add};
  if (w != 2) {
    EXPECT_NE(error_of([&] { GemmRs plan(ctx_ptr(), o); }).find("needs exactly 2 ranks"), std::string::npos);
    return;
  }
  GemmRs plan(ctx_ptr(), o);
  EXPECT_TRUE(plan.builds(FusedWay::one_launch_add));
  cudaStream_t s = test::stream();
  void* a = dalloc(m * k * 2);
  void* b = dalloc(n * k * 2);
  void* plain_out = dalloc(m / w * n * 2);
  bench::fill_uniform(a, m * k, "bf16", bench::fresh_seed(ctx().rank(), ++salt), s);
  bench::fill_uniform(b, n * k, "bf16", bench::fresh_seed(ctx().rank(), ++salt), s);
  const std::string why = error_of([&] { plan.run(a, b, plain_out, s); });
  EXPECT_NE(why.find("in the symmetric heap"), std::string::npos) << why;
  ctx().synchronize(s);
  for (void* p : {a, b, plain_out}) cudaFree(p);
}

// 1,000 back-to-back fused runs of each operator, no host sync between them,
// each compared on the device with the first run's bits; then a CUDA graph of
// one run, replayed 100 times, compared with the same bits.
TEST(Overlap, ThousandRunsAndGraphReplaysAreBitwiseIdentical) {
  cudaStream_t s = test::stream();
  const int w = ctx().world_size(), me = ctx().rank();
  const std::int64_t m = 1024 * w, n = 1024, k = 1024;
  void* a = dalloc(m * k * 2);
  void* b = dalloc(n * k * 2);
  bench::fill_uniform(a, m * k, "bf16", bench::fresh_seed(me, ++salt), s);
  bench::fill_uniform(b, n * k, "bf16", bench::fresh_seed(me, ++salt), s);
  unsigned long long* mismatches = static_cast<unsigned long long*>(dalloc(8));
  // Ops 1 and 2 run their ring a GEMM per step, 3 and 4 in one launch; with
  // two ranks or more, 5 and 6 with a plain first step, 7 is AgGemm's plain
  // steps; with two ranks, 8 and 9 in one launch adding.
  for (int op = 0; op < (w == 2 ? 10 : w > 1 ? 8 : 5); ++op) {
    const char* names[] = {"AgGemm",
                           "GemmRs",
                           "GemmAr",
                           "GemmRs, one launch",
                           "GemmAr, one launch",
                           "GemmRs, plain first step",
                           "GemmAr, plain first step",
                           "AgGemm, plain steps",
                           "GemmAr, one launch adding",
                           "GemmRs, one launch adding"};
    const bool ag_op = op == 0 || op == 7;
    const char* name = names[op];
    const FusedWay way = op >= 8   ? FusedWay::one_launch_add
                         : op >= 5 ? FusedWay::ring_plain_first
                         : op >= 3 ? FusedWay::ring_one_launch
                                   : FusedWay::ring_per_step;
    const std::int64_t out_elems = ag_op ? m * n : op % 2 == 1 ? m / w * n : m * n;
    std::unique_ptr<AgGemm> ag;
    std::unique_ptr<GemmRs> rs;
    std::unique_ptr<GemmAr> ar;
    SymmetricBuffer out(ctx().heap(), out_elems * 2, "bf16", "test.out");
    void* first = dalloc(out_elems * 2);
    std::function<void()> run;
    if (ag_op) {
      ag = std::make_unique<AgGemm>(
          ctx_ptr(), AgGemmOptions{.m = m,
                                   .n = n,
                                   .k = k,
                                   .mode = OverlapMode::fused,
                                   .way = op == 7 ? AgWay::plain_steps : AgWay::automatic});
      WEFT_CUDA(cudaMemcpyAsync(ag->local_shard(), a, m / w * k * 2, cudaMemcpyDeviceToDevice, s));
      run = [&] { ag->run(ag->local_shard(), b, out.get(), s); };
    } else if (op % 2 == 1) {
      rs = std::make_unique<GemmRs>(ctx_ptr(),
                                    GemmRsOptions{.m = m, .n = n, .k = k, .mode = OverlapMode::fused, .way = way});
      run = [&] { rs->run(a, b, out.get(), s); };
    } else {
      ar = std::make_unique<GemmAr>(ctx_ptr(),
                                    GemmArOptions{.m = m, .n = n, .k = k, .mode = OverlapMode::fused, .way = way});
      run = [&] { ar->run(a, b, out.get(), s); };
    }
    bench::poison(out.get(), out_elems * 2, 0xFF, s);
    run();
    WEFT_CUDA(cudaMemcpyAsync(first, out.get(), out_elems * 2, cudaMemcpyDeviceToDevice, s));
    WEFT_CUDA(cudaMemsetAsync(mismatches, 0, 8, s));
    for (int i = 0; i < 1000; ++i) {
      bench::poison(out.get(), out_elems * 2, static_cast<unsigned char>(i), s);
      run();
      bench::accumulate_mismatches(out.get(), first, out_elems * 2, mismatches, s);
    }
    unsigned long long eager = 0;
    WEFT_CUDA(cudaMemcpyAsync(&eager, mismatches, 8, cudaMemcpyDeviceToHost, s));
    ctx().synchronize(s);
    EXPECT_EQ(eager, 0u) << name << ": bytes that differed over 1,000 runs";

    // Graph: capture poison + run + compare, replay 100 times.
    WEFT_CUDA(cudaMemsetAsync(mismatches, 0, 8, s));
    ctx().synchronize(s);
    ctx().host_barrier("overlap graph capture");
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    WEFT_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    bench::poison(out.get(), out_elems * 2, 0x7F, s);
    run();
    bench::accumulate_mismatches(out.get(), first, out_elems * 2, mismatches, s);
    WEFT_CUDA(cudaStreamEndCapture(s, &graph));
    WEFT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < 100; ++i) WEFT_CUDA(cudaGraphLaunch(exec, s));
    unsigned long long replayed = 0;
    WEFT_CUDA(cudaMemcpyAsync(&replayed, mismatches, 8, cudaMemcpyDeviceToHost, s));
    ctx().synchronize(s);
    EXPECT_EQ(replayed, 0u) << name << ": bytes that differed over 100 graph replays";
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaFree(first);
  }
  for (void* p : {a, b, static_cast<void*>(mismatches)}) cudaFree(p);
}

// Fused calls after the first launch a CUDA graph captured per operand
// pointers (GraphCache::launch): other pointers must get their own graph, and a
// plan whose pointers keep changing must go back to direct calls - all with
// the same bits as the first call on the same inputs.
TEST(Overlap, CachedLaunchesFollowChangingOperands) {
  cudaStream_t s = test::stream();
  const int w = ctx().world_size(), me = ctx().rank();
  const std::int64_t m = 512 * w, n = 512, k = 512, out_elems = m / w * n;
  GemmRs plan(ctx_ptr(), GemmRsOptions{.m = m, .n = n, .k = k, .mode = OverlapMode::fused});
  void* inputs[2] = {dalloc(m * k * 2), dalloc(m * k * 2)};
  void* b = dalloc(n * k * 2);
  void* expected[2] = {dalloc(out_elems * 2), dalloc(out_elems * 2)};
  bench::fill_uniform(b, n * k, "bf16", bench::fresh_seed(me, ++salt), s);
  for (int i = 0; i < 2; ++i) {
    bench::fill_uniform(inputs[i], m * k, "bf16", bench::fresh_seed(me, ++salt), s);
    plan.run(inputs[i], b, expected[i], s);
  }
  unsigned long long* mismatches = static_cast<unsigned long long*>(dalloc(8));
  WEFT_CUDA(cudaMemsetAsync(mismatches, 0, 8, s));
  // 3 outputs x 2 inputs, round and round: 6 graphs, each replayed.
  void* outs[3] = {dalloc(out_elems * 2), dalloc(out_elems * 2), dalloc(out_elems * 2)};
  for (int call = 0; call < 30; ++call) {
    void* out = outs[call % 3];
    const int in = (call / 3) % 2;
    bench::poison(out, out_elems * 2, static_cast<unsigned char>(call), s);
    plan.run(inputs[in], b, out, s);
    bench::accumulate_mismatches(out, expected[in], out_elems * 2, mismatches, s);
  }
  // 20 fresh outputs: past 16 captures the plan stops capturing.
  for (int call = 0; call < 20; ++call) {
    void* out = dalloc(out_elems * 2);
    bench::poison(out, out_elems * 2, 0x5A, s);
    plan.run(inputs[call % 2], b, out, s);
    bench::accumulate_mismatches(out, expected[call % 2], out_elems * 2, mismatches, s);
    ctx().synchronize(s);
    cudaFree(out);
  }
  unsigned long long differ = 0;
  WEFT_CUDA(cudaMemcpyAsync(&differ, mismatches, 8, cudaMemcpyDeviceToHost, s));
  ctx().synchronize(s);
  EXPECT_EQ(differ, 0u) << "bytes that differed from the first call on the same inputs";
  for (void* p : {inputs[0], inputs[1], b, expected[0], expected[1], outs[0], outs[1], outs[2],
                  static_cast<void*>(mismatches)})
    cudaFree(p);
}

// One launch builds at every world size where asked for by name; automatic
// times it at 2 ranks only until its GPU tests have passed at more (at one
// rank the per-step ring's one GEMM is the same GEMM).
TEST(GemmRs, OneLaunchBuildsWhereAskedForAndAutomaticTimesItAtTwoRanks) {
  const int w = ctx().world_size();
  GemmRs asked(ctx_ptr(), GemmRsOptions{.m = 512 * w, .n = 256, .k = 256, .mode = OverlapMode::fused,
                                        .way = FusedWay::ring_one_launch});
  EXPECT_TRUE(asked.builds(FusedWay::ring_one_launch));
  EXPECT_FALSE(asked.builds(FusedWay::ring_per_step));
  GemmRs automatic(ctx_ptr(), GemmRsOptions{.m = 512 * w, .n = 256, .k = 256, .mode = OverlapMode::fused});
  EXPECT_EQ(automatic.builds(FusedWay::ring_one_launch), w == 2);
  EXPECT_TRUE(automatic.builds(FusedWay::ring_per_step));
}

TEST(Overlap, BadInputIsRejectedNamingWhatWasExpected) {
  const int w = ctx().world_size();
  auto message = [](const std::function<void()>& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] { AgGemm(ctx_ptr(), AgGemmOptions{.m = 1024, .n = 256, .k = 256, .dtype = DType::fp32}); })
                .find("must be bf16 or fp16"),
            std::string::npos);
  if (w > 1)
    EXPECT_NE(message([&] { GemmRs(ctx_ptr(), GemmRsOptions{.m = 1024 * w + 1, .n = 256, .k = 256}); })
                  .find("multiple of the world size"),
              std::string::npos);
  EXPECT_NE(message([&] {
              GemmRs(ctx_ptr(), GemmRsOptions{.m = 256 * w, .n = 256, .k = 256, .way = FusedWay::ring_one_launch});
            }).find("a multiple of 512"),
            std::string::npos);
  GemmAr ar(ctx_ptr(), GemmArOptions{.m = 256 * w, .n = 256, .k = 256, .mode = OverlapMode::fused});
  void* a = dalloc(256 * w * 256 * 2);
  void* b = dalloc(256 * 256 * 2);
  void* not_symmetric = dalloc(256 * w * 256 * 2);
  EXPECT_NE(message([&] { ar.run(a, b, not_symmetric, test::stream()); }).find("must be in the symmetric heap"),
            std::string::npos);
  EXPECT_NE(message([&] { ar.run(a, static_cast<char*>(b) + 2, not_symmetric, test::stream()); })
                .find("16-byte aligned"),
            std::string::npos);
  for (void* p : {a, b, not_symmetric}) cudaFree(p);
}
