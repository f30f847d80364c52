// The overlapped tensor-parallel operators (AgGemm, GemmRs, GemmAr) across nodes
// (virtual ones on one machine, WEFT_VIRTUAL_NODES, or real ones), while a
// weft::RemotePeers is alive. AgGemm's fused path is plain steps over the
// counting two-level AllGather: a GEMM per shard, in the order the shards land
// (docs/decisions/0074); one_gemm is refused there. GemmRs's is a GEMM per
// block beside the two-level ReduceScatter after stores (docs/decisions/0075);
// the ring's ways are refused there. GemmAr's is those block steps into its
// own rows, then the two-level AllGather of the summed blocks in place
// (docs/decisions/0076); its sequential path's AllReduce takes the two-level
// schedule (0073).
// Checked as on one node (overlap_check.hpp): fresh inputs, poisoned outputs,
// runs through one plan, against cuBLAS with fp32 accumulation; the gathered
// A bitwise; shapes the engine cannot tile and M not a multiple of the tile;
// hundreds of runs and graph replays bitwise equal to the first. Where NCCL
// is up (a GPU per rank) the first run times weft's collective against
// NCCL's, meeting on the host between samples. Without a RemotePeers the
// plans refuse, naming themselves and the remedy.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "internode_test.hpp"
#include "overlap_check.hpp"
#include "weft/core/error.hpp"
#include "weft/internode/remote_peers.hpp"

using namespace weft;
using namespace weft::test::overlap;
using weft::test::ctx;
using weft::test::ctx_ptr;

namespace {
// The sequential path ran: weft's collective on its two-level schedule, or, where
// ranks have NCCL (a GPU each) and the first run timed it faster, NCCL's.
void expect_sequential(const std::string& path, const std::string& what) {
  if (ctx().has_nccl()) EXPECT_EQ(path.rfind("sequential", 0), 0u) << what << ": " << path;
  else EXPECT_EQ(path, "sequential") << what;
}

// Runs `run` (which writes `bytes` at `out` on test::stream()) once, then 200
// times back to back and 50 times replayed from a graph of one run, poisoning
// `out` before each: every result bitwise equal to the first.
void expect_runs_and_replays_repeat_bitwise(const std::function<void()>& run, void* out, std::int64_t bytes,
                                            const std::string& what) {
  cudaStream_t s = test::stream();
  void* first = dalloc(bytes);
  auto* mismatches = static_cast<unsigned long long*>(dalloc(8));
  bench::poison(out, bytes, 0xFF, s);
  run();
  WEFT_CUDA(cudaMemcpyAsync(first, out, bytes, cudaMemcpyDeviceToDevice, s));
  WEFT_CUDA(cudaMemsetAsync(mismatches, 0, 8, s));
  for (int i = 0; i < 200; ++i) {
    bench::poison(out, bytes, static_cast<unsigned char>(i), s);
    run();
    bench::accumulate_mismatches(out, first, bytes, mismatches, s);
  }
  unsigned long long eager = 0;
  WEFT_CUDA(cudaMemcpyAsync(&eager, mismatches, 8, cudaMemcpyDeviceToHost, s));
  ctx().synchronize(s);
  EXPECT_EQ(eager, 0u) << what << ": bytes that differed over 200 runs";

  WEFT_CUDA(cudaMemsetAsync(mismatches, 0, 8, s));
  ctx().synchronize(s);
  ctx().host_barrier(what + ": graph capture");
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  WEFT_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  bench::poison(out, bytes, 0x7F, s);
  run();
  bench::accumulate_mismatches(out, first, bytes, mismatches, s);
  WEFT_CUDA(cudaStreamEndCapture(s, &graph));
  WEFT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 50; ++i) WEFT_CUDA(cudaGraphLaunch(exec, s));
  unsigned long long replayed = 0;
  WEFT_CUDA(cudaMemcpyAsync(&replayed, mismatches, 8, cudaMemcpyDeviceToHost, s));
  ctx().synchronize(s);
  EXPECT_EQ(replayed, 0u) << what << ": bytes that differed over 50 graph replays";
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  for (void* p : {first, static_cast<void*>(mismatches)}) cudaFree(p);
}
}  // namespace

TEST(AcrossNodes, AgGemmFusesPlainStepsOverTheTwoLevelAllGatherInEveryMode) {
  NEED_NODES();
  RemotePeers remote(ctx_ptr());
  Cublas cb;
  const int w = ctx().world_size();
  const std::string plain_steps = path_name(AgWay::plain_steps);
  for (DType t : {DType::bf16, DType::fp16})
    for (OverlapMode mode : {OverlapMode::automatic, OverlapMode::fused, OverlapMode::sequential})
      for (AgWay way : {AgWay::automatic, AgWay::plain_steps}) {
        const std::string what = std::string("AgGemm ") + to_string(t) + ", " + to_string(mode) +
                                 (way == AgWay::plain_steps ? ", plain steps" : "");
        const AgResult ag = check_ag_gemm(256 * w, 512, 384, mode, cb, way, t);
        EXPECT_LT(ag.err, 1e-2) << what;
        EXPECT_EQ(ag.gathered_mismatch, 0u) << what;
        EXPECT_EQ(ag.mode, mode) << what;
        if (mode == OverlapMode::fused) EXPECT_EQ(ag.path, plain_steps) << what;
        else if (mode == OverlapMode::sequential) expect_sequential(ag.path, what);
        else if (ag.path != plain_steps) expect_sequential(ag.path, what + " (automatic took the sequential path)");
      }
  // Shards of many AllGather blocks (4 MB each), over several checks through one plan.
  const AgResult big = check_ag_gemm(1024 * w, 256, 2048, OverlapMode::fused, cb, AgWay::plain_steps,
                                     DType::bf16, 4);
  EXPECT_LT(big.err, 1e-2);
  EXPECT_EQ(big.gathered_mismatch, 0u);
  // M not a multiple of the tile; K the engine cannot tile (cuBLAS, odd shards: the sequential path).
  EXPECT_LT(check_ag_gemm(125 * w, 256, 256, OverlapMode::fused, cb, AgWay::plain_steps).err, 1e-2);
  const AgResult untileable = check_ag_gemm(125 * w, 256, 1001, OverlapMode::fused, cb);
  EXPECT_LT(untileable.err, 1e-2);
  EXPECT_EQ(untileable.mode, OverlapMode::sequential);
  // One hooked GEMM waits on flags peers raise in this heap: refused across nodes, naming the ways that run.
  for (OverlapMode mode : {OverlapMode::automatic, OverlapMode::fused}) {
    std::string error;
    try {
      AgGemm plan(ctx_ptr(), AgGemmOptions{.m = 256 * w, .n = 256, .k = 256, .mode = mode, .way = AgWay::one_gemm});
    } catch (const Error& e) {
      error = e.what();
    }
    EXPECT_NE(error.find("AgGemm: AgWay::one_gemm needs every peer's heap mapped"), std::string::npos) << error;
    EXPECT_NE(error.find("AgWay::plain_steps"), std::string::npos) << error;
  }
}

// The arrival words are consumed by each run's waits and the AllGather's
// flags are epochs: runs back to back, eager and replayed from a graph, need
// no reset and give the first run's bits.
TEST(AcrossNodes, AgGemmsFusedRunsAndGraphReplaysRepeatBitwise) {
  NEED_NODES();
  RemotePeers remote(ctx_ptr());
  cudaStream_t s = test::stream();
  const int w = ctx().world_size(), me = ctx().rank();
  const std::int64_t m = 512 * w, n = 512, k = 1024;
  AgGemm plan(ctx_ptr(), AgGemmOptions{.m = m, .n = n, .k = k, .mode = OverlapMode::fused, .way = AgWay::plain_steps});
  void* b = dalloc(n * k * 2);
  void* c = dalloc(m * n * 2);
  bench::fill_uniform(plan.local_shard(), m / w * k, "bf16", bench::fresh_seed(me, ++salt), s);
  bench::fill_uniform(b, n * k, "bf16", bench::fresh_seed(me, ++salt), s);
  expect_runs_and_replays_repeat_bitwise([&] { plan.run(plan.local_shard(), b, c, s); }, c, m * n * 2,
                                         "AgGemm across nodes");
  EXPECT_EQ(plan.path(), path_name(AgWay::plain_steps));
  for (void* p : {b, c}) cudaFree(p);
}

namespace {
// GemmRs (all_reduce false) or GemmAr (true) across nodes: "fused, two-level
// steps" in mode fused, the sequential path in mode sequential, either in
// automatic, each against cuBLAS in fp32 in bf16 and fp16; blocks of many
// collective thread blocks and M not a multiple of the tile on the fused
// path; K the engine cannot tile on the sequential one; and the ring's ways,
// which go through every peer's heap, refused naming the ways that run.
void expect_two_level_steps_in_every_mode(bool all_reduce) {
  Cublas cb;
  const int w = ctx().world_size();
  const std::string who = all_reduce ? "GemmAr" : "GemmRs", two_level_steps = "fused, two-level steps";
  for (DType t : {DType::bf16, DType::fp16})
    for (OverlapMode mode : {OverlapMode::automatic, OverlapMode::fused, OverlapMode::sequential}) {
      const std::string what = who + " " + to_string(t) + ", " + to_string(mode);
      const ReduceResult r = check_gemm_reduce(all_reduce, 256 * w, 512, 384, mode, cb, FusedWay::automatic, t);
      EXPECT_LT(r.err, 1e-2) << what;
      EXPECT_EQ(r.mode, mode) << what;
      if (mode == OverlapMode::fused) EXPECT_EQ(r.path, two_level_steps) << what;
      else if (mode == OverlapMode::sequential) expect_sequential(r.path, what);
      else if (r.path != two_level_steps) expect_sequential(r.path, what + " (automatic took the sequential path)");
    }
  EXPECT_LT(check_gemm_reduce(all_reduce, 1024 * w, 1024, 512, OverlapMode::fused, cb).err, 1e-2);
  EXPECT_LT(check_gemm_reduce(all_reduce, 125 * w, 256, 256, OverlapMode::fused, cb).err, 1e-2);
  const ReduceResult untileable = check_gemm_reduce(all_reduce, 125 * w, 256, 1001, OverlapMode::fused, cb);
  EXPECT_LT(untileable.err, 1e-2);
  EXPECT_EQ(untileable.mode, OverlapMode::sequential);
  for (FusedWay way : {FusedWay::ring_per_step, FusedWay::ring_one_launch, FusedWay::ring_plain_first}) {
    std::string error;
    try {
      if (all_reduce) {
        GemmAr plan(ctx_ptr(), GemmArOptions{.m = 256 * w, .n = 256, .k = 256, .mode = OverlapMode::fused, .way = way});
      } else {
        GemmRs plan(ctx_ptr(), GemmRsOptions{.m = 256 * w, .n = 256, .k = 256, .mode = OverlapMode::fused, .way = way});
      }
    } catch (const Error& e) {
      error = e.what();
    }
    EXPECT_NE(error.find(who + ": " + path_name(way) + " (FusedWay) walks a ring"), std::string::npos) << error;
    EXPECT_NE(error.find("FusedWay::automatic"), std::string::npos) << error;
  }
}
}  // namespace

TEST(AcrossNodes, GemmRsFusesBlockStepsOverTheTwoLevelReduceScatterInEveryMode) {
  NEED_NODES();
  RemotePeers remote(ctx_ptr());
  expect_two_level_steps_in_every_mode(false);
}

// The stored words go back to 0 at each run's start and the ReduceScatter's
// flags are epochs: runs back to back, eager and replayed from a graph, give
// the first run's bits.
TEST(AcrossNodes, GemmRsFusedRunsAndGraphReplaysRepeatBitwise) {
  NEED_NODES();
  RemotePeers remote(ctx_ptr());
  cudaStream_t s = test::stream();
  const int w = ctx().world_size(), me = ctx().rank();
  const std::int64_t m = 512 * w, n = 512, k = 1024, out_elems = m / w * n;
  GemmRs plan(ctx_ptr(), GemmRsOptions{.m = m, .n = n, .k = k, .mode = OverlapMode::fused});
  void* a = dalloc(m * k * 2);
  void* b = dalloc(n * k * 2);
  void* out = dalloc(out_elems * 2);
  bench::fill_uniform(a, m * k, "bf16", bench::fresh_seed(me, ++salt), s);
  bench::fill_uniform(b, n * k, "bf16", bench::fresh_seed(me, ++salt), s);
  expect_runs_and_replays_repeat_bitwise([&] { plan.run(a, b, out, s); }, out, out_elems * 2, "GemmRs across nodes");
  EXPECT_EQ(plan.path(), "fused, two-level steps");
  for (void* p : {a, b, out}) cudaFree(p);
}

TEST(AcrossNodes, GemmArFusesBlockStepsThenTheTwoLevelAllGatherInEveryMode) {
  NEED_NODES();
  RemotePeers remote(ctx_ptr());
  expect_two_level_steps_in_every_mode(true);
  // M not a multiple of the world size: the sequential path.
  Cublas cb;
  const ReduceResult ragged = check_gemm_reduce(true, 1001, 256, 256, OverlapMode::fused, cb);
  EXPECT_LT(ragged.err, 1e-2);
  EXPECT_EQ(ragged.mode, OverlapMode::sequential);
}

// Each block is summed once, in the two-level order, then copied: runs back to
// back, eager and replayed from a graph, give the first run's bits, and every
// rank holds the same bits.
TEST(AcrossNodes, GemmArFusedRunsAndGraphReplaysRepeatBitwiseAndEveryRankHoldsTheSameBits) {
  NEED_NODES();
  RemotePeers remote(ctx_ptr());
  cudaStream_t s = test::stream();
  const int w = ctx().world_size(), me = ctx().rank();
  const std::int64_t m = 512 * w, n = 512, k = 1024;
  GemmAr plan(ctx_ptr(), GemmArOptions{.m = m, .n = n, .k = k, .mode = OverlapMode::fused});
  void* a = dalloc(m * k * 2);
  void* b = dalloc(n * k * 2);
  SymmetricBuffer out(ctx().heap(), m * n * 2, "bf16", "test.gemm_ar.out");
  bench::fill_uniform(a, m * k, "bf16", bench::fresh_seed(me, ++salt), s);
  bench::fill_uniform(b, n * k, "bf16", bench::fresh_seed(me, ++salt), s);
  expect_runs_and_replays_repeat_bitwise([&] { plan.run(a, b, out.get(), s); }, out.get(), m * n * 2,
                                         "GemmAr across nodes");
  EXPECT_EQ(plan.path(), "fused, two-level steps");
  std::vector<unsigned char> host(static_cast<std::size_t>(m * n * 2));
  WEFT_CUDA(cudaMemcpy(host.data(), out.get(), host.size(), cudaMemcpyDeviceToHost));
  std::uint64_t h = 14695981039346656037ull;  // FNV-1a of the result's bytes
  for (unsigned char c : host) h = (h ^ c) * 1099511628211ull;
  const auto hashes = test::gather(std::to_string(h));
  for (int q = 1; q < w; ++q) EXPECT_EQ(hashes[q], hashes[0]) << "rank " << q << "'s sum differs from rank 0's";
  for (void* p : {a, b}) cudaFree(p);
}

TEST(AcrossNodes, OverlappedOperatorsWithoutRemotePeersAreRefusedNamingTheRemedy) {
  NEED_NODES();
  const int w = ctx().world_size();
  auto refusal = [](auto build) {
    try {
      build();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string ag = refusal([&] { AgGemm plan(ctx_ptr(), AgGemmOptions{.m = 256 * w, .n = 256, .k = 256}); });
  const std::string rs = refusal([&] { GemmRs plan(ctx_ptr(), GemmRsOptions{.m = 256 * w, .n = 256, .k = 256}); });
  const std::string ar = refusal([&] { GemmAr plan(ctx_ptr(), GemmArOptions{.m = 256 * w, .n = 256, .k = 256}); });
  const char* names[] = {"AgGemm", "GemmRs", "GemmAr"};
  const std::string* errors[] = {&ag, &rs, &ar};
  for (int i = 0; i < 3; ++i) {
    EXPECT_NE(errors[i]->find(std::string(names[i]) + ": some peers are on other nodes"), std::string::npos)
        << *errors[i];
    EXPECT_NE(errors[i]->find("weft::RemotePeers"), std::string::npos) << *errors[i];
  }
}
