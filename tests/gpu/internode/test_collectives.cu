// The collectives' two-level schedules on the GPU, across nodes (virtual ones on one
// machine, WEFT_VIRTUAL_NODES, or real ones): weft::AllGather, ReduceScatter and AllReduce built
// across nodes take their two-level path (weft::internode's kernels, through
// NVSHMEM between nodes and by load and store within one) while a
// weft::RemotePeers is alive, and refuse by name without one. AllGather is
// checked bitwise against every rank's input, rebuilt from its seed (the
// one-node AllGather's result by definition); ReduceScatter and AllReduce
// against the float64 reference of the one-node tests and, bitwise, against
// fp32 sums in the two-level order (each node's ranks in order, then the
// nodes in order, rounded once); AllReduce's halving-doubling rail against
// float64, with every rank's output bitwise the same. Ragged and odd sizes, every element type, in
// place, hundreds of back-to-back runs with no host synchronisation and
// alternating inputs (epochs, no reset), CUDA-graph replays, and, in a process
// of its own (WEFT_TEST_PROVOKE_TIMEOUT=internode), a rank that skips the
// AllGather named by the others' bounded waits. Also Context::barrier across
// nodes, which a RemotePeers installs: no rank passes it before the last one
// reaches it. docs/decisions/0066.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "gpu_check.hpp"
#include "internode_test.hpp"
#include "ops/hierarchy.hpp"
#include "weft/core/error.hpp"
#include "weft/device/memory.cuh"
#include "weft/internode/remote_peers.hpp"
#include "weft/ops/all_gather.hpp"
#include "weft/ops/all_reduce.hpp"
#include "weft/ops/reduce_scatter.hpp"

using namespace weft;
using weft::test::ctx;

namespace {

constexpr DType kTypes[] = {DType::bf16, DType::fp16, DType::fp32};

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

hierarchy::NodeGrid grid() {
  hierarchy::NodeGrid g;
  const std::string why = hierarchy::grid_from_nodes(ctx().team().node_of, g);
  EXPECT_EQ(why, "");
  return g;
}

std::vector<std::uint64_t> gathered_seeds(std::uint64_t salt) {
  std::vector<std::uint64_t> seeds;
  for (auto& s : test::gather(std::to_string(bench::fresh_seed(ctx().rank(), salt)))) seeds.push_back(std::stoull(s));
  return seeds;
}

double to_double(const unsigned char* p, DType t) {
  if (t == DType::fp32) return *reinterpret_cast<const float*>(p);
  if (t == DType::bf16) return __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(p));
  return __half2float(*reinterpret_cast<const __half*>(p));
}

void round_to(float v, DType t, unsigned char* out) {
  if (t == DType::fp32) {
    std::memcpy(out, &v, 4);
  } else if (t == DType::bf16) {
    const __nv_bfloat16 r = __float2bfloat16_rn(v);
    std::memcpy(out, &r, 2);
  } else {
    const __half r = __float2half_rn(v);
    std::memcpy(out, &r, 2);
  }
}

struct Verdict {
  double relative_error = 0;      // against the float64 sum
  std::uint64_t node_order = 0;   // elements whose bits differ from the two-level order's fp32 sum
};

/// Checks `count` results at `device_out` against the sum over ranks q of
/// uniform(seeds[q], offset + i): in float64 (the one-node tests' reference),
/// and bitwise against fp32 sums in the two-level order (node by node, each
/// node's ranks in local order, then the nodes in order), rounded once.
Verdict check_sum(const void* device_out, std::uint64_t count, DType t, const std::vector<std::uint64_t>& seeds,
                  std::uint64_t offset) {
  const hierarchy::NodeGrid g = grid();
  const std::size_t size = dtype_size(t);
  std::vector<unsigned char> host(count * size);
  WEFT_CUDA(cudaMemcpy(host.data(), device_out, host.size(), cudaMemcpyDeviceToHost));
  Verdict v;
  double diff2 = 0, ref2 = 0;
  bool finite = true;
  for (std::uint64_t i = 0; i < count; ++i) {
    double ref = 0;
    float total = 0;
    for (int n = 0; n < g.nodes; ++n) {
      float node = 0;
      for (int l = 0; l < g.local; ++l) {
        const double x = bench::uniform_value(to_string(t), seeds[g.rank(n, l)], offset + i);
        ref += x;
        node = l == 0 ? static_cast<float>(x) : node + static_cast<float>(x);
      }
      total = n == 0 ? node : total + node;
    }
    unsigned char want[4];
    round_to(total, t, want);
    v.node_order += std::memcmp(want, &host[i * size], size) != 0;
    const double d = to_double(&host[i * size], t) - ref;
    finite = finite && std::isfinite(d);
    diff2 += d * d;
    ref2 += ref * ref;
  }
  // Random values can sum to exactly zero: then only an exact result passes.
  v.relative_error = !finite ? INFINITY : ref2 == 0 ? (diff2 == 0 ? 0.0 : INFINITY) : std::sqrt(diff2 / ref2);
  return v;
}

double tolerance(DType t) { return t == DType::fp32 ? 1e-6 : 1e-2; }

/// FNV-1a of `bytes` device bytes, as text: equal on two ranks whose bytes are (but for a collision).
std::string device_hash(const void* p, std::uint64_t bytes) {
  std::vector<unsigned char> host(bytes);
  WEFT_CUDA(cudaMemcpy(host.data(), p, bytes, cudaMemcpyDeviceToHost));
  std::uint64_t h = 14695981039346656037ull;
  for (unsigned char c : host) h = (h ^ c) * 1099511628211ull;
  return std::to_string(h);
}

/// The number of wrong bytes over `replays` back-to-back replays of a graph
/// holding one `run` and a comparison of `out` with `expected`.
template <class Run>
unsigned long long replay_and_compare(Run run, const void* out, const void* expected, std::uint64_t bytes,
                                      int replays) {
  cudaStream_t s = test::stream();
  unsigned long long* bad = nullptr;
  WEFT_CUDA(cudaMalloc(&bad, sizeof(*bad)));
  WEFT_CUDA(cudaMemsetAsync(bad, 0, sizeof(*bad), s));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  WEFT_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  run(s);
  bench::accumulate_mismatches(out, expected, bytes, bad, s);
  WEFT_CUDA(cudaStreamEndCapture(s, &graph));
  WEFT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < replays; ++i) WEFT_CUDA(cudaGraphLaunch(exec, s));
  ctx().synchronize(s);
  unsigned long long h = 1;
  WEFT_CUDA(cudaMemcpy(&h, bad, sizeof(h), cudaMemcpyDeviceToHost));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  WEFT_CUDA(cudaFree(bad));
  return h;
}

}  // namespace

// ---- the choice, and the refusals --------------------------------------------------------

TEST(TwoLevel, AutomaticPlansTakeTheTwoLevelPathWhileRemotePeersIsAlive) {
  NEED_NODES();
  const int sms = ctx().team().sm_count;
  {
    auto remote = std::make_unique<RemotePeers>(test::ctx_ptr());
    AllGather ag(test::ctx_ptr(), {4096, AllGatherVariant::automatic, 0});
    ReduceScatter rs(test::ctx_ptr(), {4096, DType::bf16, ReduceScatterVariant::automatic, 0});
    AllReduce ar(test::ctx_ptr(), {4096, DType::bf16, AllReduceVariant::automatic, 0});
    EXPECT_EQ(ag.variant(), AllGatherVariant::two_level);
    EXPECT_EQ(rs.variant(), ReduceScatterVariant::two_level);
    EXPECT_EQ(ar.variant(), AllReduceVariant::two_level);
    EXPECT_STREQ(to_string(ag.variant()), "two_level");
    EXPECT_EQ(parse_all_reduce_variant("two_level"), AllReduceVariant::two_level);
    for (int used : {ag.sms_used(), rs.sms_used(), ar.sms_used()}) {
      EXPECT_GE(used, 1);
      EXPECT_LE(used, sms) << "every block waits on other ranks' blocks: the grid stays within the rank's SM share";
    }
    AllReduce capped(test::ctx_ptr(), {1u << 22, DType::bf16, AllReduceVariant::automatic, 2});
    EXPECT_LE(capped.sms_used(), 2);

    // A one-node variant asked for by name still loads and stores every peer: refused, naming the pairs.
    const std::string e = error_of([] { AllGather p(test::ctx_ptr(), {4096, AllGatherVariant::push, 0}); });
    EXPECT_NE(e.find("AllGather (variant push) reaches every peer by load and store"), std::string::npos) << e;
    EXPECT_NE(e.find(str("rank ", ctx().rank(), " cannot address rank(s) ")), std::string::npos) << e;
    EXPECT_NE(e.find("variant auto or two_level"), std::string::npos) << e;
    const std::string r = error_of([] {
      ReduceScatter p(test::ctx_ptr(), {4096, DType::fp32, ReduceScatterVariant::low_latency, 0});
    });
    EXPECT_NE(r.find("ReduceScatter (variant ll) reaches every peer"), std::string::npos) << r;

    // A plan built while RemotePeers is alive and run after it is gone says why, on every rank.
    SymmetricBuffer buf(ctx().heap(), 4096 * 2, "bf16", "test.two_level.buf");
    AllReduce later(test::ctx_ptr(), {4096, DType::bf16, AllReduceVariant::automatic, 0});
    remote.reset();
    const std::string gone = error_of([&] { later.run(buf.get(), buf.get(), test::stream()); });
    EXPECT_NE(gone.find("no weft::RemotePeers is alive"), std::string::npos) << gone;
  }
  // Without a RemotePeers the two-level schedules are not at hand: the plans refuse by name.
  for (const std::string& e :
       {error_of([] { AllGather p(test::ctx_ptr(), {4096, AllGatherVariant::automatic, 0}); }),
        error_of([] { ReduceScatter p(test::ctx_ptr(), {4096, DType::bf16, ReduceScatterVariant::automatic, 0}); }),
        error_of([] { AllReduce p(test::ctx_ptr(), {4096, DType::bf16, AllReduceVariant::two_level, 0}); })}) {
    EXPECT_NE(e.find("reaches every peer by load and store"), std::string::npos) << e;
    EXPECT_NE(e.find("construct a weft::RemotePeers"), std::string::npos) << e;
    EXPECT_NE(e.find(str("rank ", ctx().rank(), " cannot address rank(s) ")), std::string::npos) << e;
  }
}

// ---- Context::barrier across nodes ------------------------------------------------------

// One thread: spins until `hold_ns` have passed since it started, then writes
// the GPU's global timer to *stamp (mapped host memory).
__global__ void hold_then_stamp(std::uint64_t hold_ns, std::uint64_t* stamp) {
  const std::uint64_t t0 = dev::globaltimer_ns();
  while (dev::globaltimer_ns() - t0 < hold_ns) {
  }
  *reinterpret_cast<volatile std::uint64_t*>(stamp) = dev::globaltimer_ns();
}

TEST(TwoLevel, ContextBarrierHoldsEveryRankUntilTheLastArrives) {
  NEED_NODES();
  EXPECT_NE(error_of([] { ctx().barrier(test::stream()); }).find("construct one first"), std::string::npos)
      << "without a RemotePeers Context::barrier refuses, naming the remedy";
  RemotePeers remote(test::ctx_ptr());
  const int world = ctx().world_size(), me = ctx().rank();
  cudaStream_t s = test::stream();
  std::uint64_t* stamps = nullptr;  // [round][before, after]
  WEFT_CUDA(cudaHostAlloc(&stamps, 2 * world * sizeof(std::uint64_t), cudaHostAllocMapped));
  // Each round one rank reaches the barrier 20 ms late: no rank may pass it
  // before that rank reached it. The margin (1 ms) absorbs the timers' skew
  // between GPUs; without a barrier the others pass 19 ms early.
  constexpr std::uint64_t kLateNs = 20'000'000, kSkewNs = 1'000'000;
  for (int late = 0; late < world; ++late) {
    hold_then_stamp<<<1, 1, 0, s>>>(me == late ? kLateNs : 0, &stamps[2 * late]);
    ctx().barrier(s);
    hold_then_stamp<<<1, 1, 0, s>>>(0, &stamps[2 * late + 1]);
    WEFT_CUDA(cudaGetLastError());
  }
  // Then hundreds back to back with nothing between them: epochs, no reset, no hang.
  for (int i = 0; i < 300; ++i) ctx().barrier(s);
  ctx().synchronize(s);
  std::string mine;
  for (int i = 0; i < 2 * world; ++i) mine += std::to_string(stamps[i]) + " ";
  const auto all = test::gather(mine);
  std::vector<std::vector<std::uint64_t>> t(world);
  for (int r = 0; r < world; ++r) {
    std::istringstream in(all[r]);
    for (std::uint64_t v; in >> v;) t[r].push_back(v);
    ASSERT_EQ(t[r].size(), std::size_t(2 * world)) << all[r];
  }
  for (int late = 0; late < world; ++late) {
    const std::uint64_t arrived = t[late][2 * late];
    for (int r = 0; r < world; ++r)
      EXPECT_GE(t[r][2 * late + 1] + kSkewNs, arrived)
          << "rank " << r << " passed the barrier " << (arrived - t[r][2 * late + 1]) / 1000
          << " us before rank " << late << " reached it";
  }
  WEFT_CUDA(cudaFreeHost(stamps));
}

// ---- AllGather ---------------------------------------------------------------------------

TEST(TwoLevelAllGather, EveryRanksBytesArriveBitwiseAtRaggedSizesAndInPlace) {
  NEED_NODES();
  RemotePeers remote(test::ctx_ptr());
  const int world = ctx().world_size(), me = ctx().rank();
  cudaStream_t s = test::stream();
  for (std::uint64_t bytes : {std::uint64_t{1}, std::uint64_t{2}, std::uint64_t{1002}, std::uint64_t{4099},
                              std::uint64_t{(1u << 16) + 3}, std::uint64_t{(1u << 20) + 6},
                              std::uint64_t{(4u << 20) + 1}}) {
    SymmetricBuffer input(ctx().heap(), bytes, "bytes", "test.two_level.ag.input");
    SymmetricBuffer output(ctx().heap(), bytes * world, "bytes", "test.two_level.ag.output");
    for (int max_sms : {0, 1}) {
      AllGather plan(test::ctx_ptr(), {bytes, AllGatherVariant::automatic, max_sms});
      ASSERT_EQ(plan.variant(), AllGatherVariant::two_level);
      for (bool in_place : {false, true}) {
        const std::uint64_t seed = bench::fresh_seed(me, bytes);
        const auto seeds = test::gather(std::to_string(seed));
        char* in = in_place ? output.as<char>() + me * bytes : input.as<char>();
        bench::poison(output.get(), bytes * world, 0xA5, s);
        bench::fill_random(in, bytes, seed, s);
        plan.run(in, output.get(), s);
        ctx().synchronize(s);
        std::uint64_t bad = 0;
        for (int p = 0; p < world; ++p)
          bad += bench::count_mismatches_random(output.as<char>() + p * bytes, bytes, std::stoull(seeds[p]), s);
        EXPECT_EQ(bad, 0u) << bytes << " bytes per rank, " << plan.sms_used() << " blocks"
                           << (in_place ? ", in place" : "");
        ctx().host_barrier("two-level all_gather checked");  // nobody poisons an output a peer still writes
      }
    }
  }
}

TEST(TwoLevelAllGather, HundredsOfBackToBackRunsWithFreshDataNeedNoReset) {
  NEED_NODES();
  RemotePeers remote(test::ctx_ptr());
  const int world = ctx().world_size(), runs = 300;
  cudaStream_t s = test::stream();
  unsigned long long* bad = nullptr;
  WEFT_CUDA(cudaMalloc(&bad, sizeof(*bad)));
  for (std::uint64_t bytes : {std::uint64_t{4096}, std::uint64_t{(200u << 10) + 3}}) {
    SymmetricBuffer input(ctx().heap(), bytes, "bytes", "test.two_level.ag.input");
    SymmetricBuffer output(ctx().heap(), bytes * world, "bytes", "test.two_level.ag.output");
    AllGather plan(test::ctx_ptr(), {bytes, AllGatherVariant::automatic, 0});
    const std::uint64_t base = std::stoull(test::gather(std::to_string(bench::fresh_seed(0, bytes)))[0]);
    auto seed_of = [&](int run, int rank) { return base * 1000003 + run * 131 + rank; };
    WEFT_CUDA(cudaMemsetAsync(bad, 0, sizeof(*bad), s));
    // Fill, gather, verify, all enqueued: a missing "ready" or a stale flag shows as wrong bytes.
    for (int i = 0; i < runs; ++i) {
      bench::fill_random(input.get(), bytes, seed_of(i, ctx().rank()), s);
      plan.run(input.get(), output.get(), s);
      for (int p = 0; p < world; ++p)
        bench::accumulate_mismatches_random(output.as<char>() + p * bytes, bytes, seed_of(i, p), bad, s);
    }
    ctx().synchronize(s);
    unsigned long long h = 1;
    WEFT_CUDA(cudaMemcpy(&h, bad, sizeof(h), cudaMemcpyDeviceToHost));
    EXPECT_EQ(h, 0u) << bytes << " bytes per rank, " << runs << " runs";
    ctx().host_barrier("two-level all_gather runs checked");
  }
  WEFT_CUDA(cudaFree(bad));
}

// ---- ReduceScatter and AllReduce ---------------------------------------------------------

TEST(TwoLevelReduceScatter, EveryTypeMatchesFloat64AndTheTwoLevelOrderBitwise) {
  NEED_NODES();
  RemotePeers remote(test::ctx_ptr());
  cudaStream_t s = test::stream();
  const int world = ctx().world_size(), me = ctx().rank();
  for (DType t : kTypes) {
    const std::size_t size = dtype_size(t);
    for (std::uint64_t count : {std::uint64_t{1}, std::uint64_t{7}, std::uint64_t{1000}, std::uint64_t{4099},
                                std::uint64_t{(1u << 18) + 5}}) {
      const std::uint64_t total = count * world;
      SymmetricBuffer in(ctx().heap(), total * size, to_string(t), "test.two_level.rs.in");
      SymmetricBuffer out(ctx().heap(), count * size, to_string(t), "test.two_level.rs.out");
      const auto seeds = gathered_seeds(count + 1);
      ReduceScatter plan(test::ctx_ptr(), {count, t, ReduceScatterVariant::automatic, 0});
      ASSERT_EQ(plan.variant(), ReduceScatterVariant::two_level);
      for (bool in_place : {false, true}) {
        bench::fill_uniform(in.get(), total, to_string(t), seeds[me], s);
        void* dst = in_place ? static_cast<char*>(in.get()) + me * count * size : out.get();
        if (!in_place) bench::poison(out.get(), count * size, 0xA5, s);
        plan.run(in.get(), dst, s);
        ctx().synchronize(s);
        const Verdict v = check_sum(dst, count, t, seeds, me * count);
        EXPECT_LE(v.relative_error, tolerance(t)) << to_string(t) << " count " << count;
        EXPECT_EQ(v.node_order, 0u) << to_string(t) << " count " << count << (in_place ? " in place" : "")
                                    << ": bits differ from fp32 sums in the two-level order";
        ctx().host_barrier("two-level reduce_scatter checked");
      }
    }
  }
}

TEST(TwoLevelAllReduce, EveryTypeMatchesFloat64AndTheTwoLevelOrderBitwiseOnEveryRank) {
  NEED_NODES();
  RemotePeers remote(test::ctx_ptr());
  cudaStream_t s = test::stream();
  const int me = ctx().rank();
  for (DType t : kTypes) {
    const std::size_t size = dtype_size(t);
    for (std::uint64_t count : {std::uint64_t{1}, std::uint64_t{7}, std::uint64_t{1000}, std::uint64_t{4099},
                                std::uint64_t{(1u << 19) + 5}}) {
      SymmetricBuffer in(ctx().heap(), count * size, to_string(t), "test.two_level.ar.in");
      SymmetricBuffer out(ctx().heap(), count * size, to_string(t), "test.two_level.ar.out");
      const auto seeds = gathered_seeds(count);
      AllReduce plan(test::ctx_ptr(), {count, t, AllReduceVariant::automatic, 0});
      ASSERT_EQ(plan.variant(), AllReduceVariant::two_level);
      for (bool in_place : {false, true}) {
        bench::fill_uniform(in.get(), count, to_string(t), seeds[me], s);
        void* dst = in_place ? in.get() : out.get();
        if (!in_place) bench::poison(out.get(), count * size, 0xA5, s);
        plan.run(in.get(), dst, s);
        ctx().synchronize(s);
        const Verdict v = check_sum(dst, count, t, seeds, 0);
        EXPECT_LE(v.relative_error, tolerance(t)) << to_string(t) << " count " << count;
        EXPECT_EQ(v.node_order, 0u) << to_string(t) << " count " << count << (in_place ? " in place" : "")
                                    << ": bits differ from fp32 sums in the two-level order";
        ctx().host_barrier("two-level all_reduce checked");
      }
    }
  }
  // Buffers anywhere: the caller's memory is written only by its own rank.
  void* plain = nullptr;
  const std::uint64_t count = 4099;
  WEFT_CUDA(cudaMalloc(&plain, count * 4));
  const auto seeds = gathered_seeds(7);
  bench::fill_uniform(plain, count, "fp32", seeds[me], s);
  AllReduce plan(test::ctx_ptr(), {count, DType::fp32, AllReduceVariant::automatic, 0});
  plan.run(plain, plain, s);
  ctx().synchronize(s);
  const Verdict v = check_sum(plain, count, DType::fp32, seeds, 0);
  EXPECT_EQ(v.node_order, 0u) << "buffers outside the heap";
  WEFT_CUDA(cudaFree(plain));
}

// AllReduce with the halving-doubling rail (AllReduceOptions::rail_way) at 2
// and 4 nodes: every type within the float64 tolerance and every rank's output
// bitwise the same (each sub-chunk is summed at one node and copied); at 2
// nodes, where the butterfly's sum is node order (a + b = b + a), bitwise the
// two-level order's too. Random inputs, poisoned outputs, ragged sizes, in place.
TEST(TwoLevelAllReduce, HalvingDoublingMatchesFloat64AndEveryRankHoldsTheSameBits) {
  NEED_NODES();
  RemotePeers remote(test::ctx_ptr());
  cudaStream_t s = test::stream();
  const int me = ctx().rank();
  const hierarchy::NodeGrid g = grid();
  const AllReduceRailWay runs =
      hierarchy::hd_applies(g.nodes) ? AllReduceRailWay::halving_doubling : AllReduceRailWay::direct;
  EXPECT_STREQ(to_string(AllReduceRailWay::halving_doubling), "halving_doubling");
  for (DType t : kTypes) {
    const std::size_t size = dtype_size(t);
    for (std::uint64_t count : {std::uint64_t{1}, std::uint64_t{7}, std::uint64_t{1000}, std::uint64_t{4099},
                                std::uint64_t{(1u << 19) + 5}}) {
      SymmetricBuffer in(ctx().heap(), count * size, to_string(t), "test.two_level.ar_hd.in");
      SymmetricBuffer out(ctx().heap(), count * size, to_string(t), "test.two_level.ar_hd.out");
      const auto seeds = gathered_seeds(count + 3);
      AllReduce plan(test::ctx_ptr(), {count, t, AllReduceVariant::automatic, 0, AllReduceRailWay::halving_doubling});
      ASSERT_EQ(plan.variant(), AllReduceVariant::two_level);
      ASSERT_EQ(plan.rail_way(), runs) << g.nodes << " nodes";
      for (bool in_place : {false, true}) {
        bench::fill_uniform(in.get(), count, to_string(t), seeds[me], s);
        void* dst = in_place ? in.get() : out.get();
        if (!in_place) bench::poison(out.get(), count * size, 0xA5, s);
        plan.run(in.get(), dst, s);
        ctx().synchronize(s);
        const std::string what = str(to_string(t), " count ", count, in_place ? " in place" : "");
        const Verdict v = check_sum(dst, count, t, seeds, 0);
        EXPECT_LE(v.relative_error, tolerance(t)) << what;
        if (g.nodes == 2) EXPECT_EQ(v.node_order, 0u) << what << ": bits differ from fp32 sums in the two-level order";
        const auto hashes = test::gather(device_hash(dst, count * size));
        for (std::size_t q = 1; q < hashes.size(); ++q)
          EXPECT_EQ(hashes[q], hashes[0]) << what << ": rank " << q << "'s result differs from rank 0's";
        ctx().host_barrier("two-level all_reduce, halving-doubling, checked");
      }
    }
  }
}

// Halving-doubling's staging by parity, as TwoLevelReductions checks the
// direct way's: two inputs in turn, hundreds of runs with no host
// synchronisation, each repeating its input's first bits.
TEST(TwoLevelAllReduce, HalvingDoublingBackToBackRunsOnAlternatingInputsRepeatBitwise) {
  NEED_NODES();
  RemotePeers remote(test::ctx_ptr());
  cudaStream_t s = test::stream();
  const int runs = 200;
  const std::uint64_t count = (96u << 10) + 3;
  unsigned long long* bad = nullptr;
  WEFT_CUDA(cudaMalloc(&bad, sizeof(*bad)));
  for (DType t : {DType::bf16, DType::fp32}) {
    const std::uint64_t bytes = count * dtype_size(t);
    SymmetricBuffer a(ctx().heap(), bytes, to_string(t), "test.two_level.ar_hd_rep.a");
    SymmetricBuffer b(ctx().heap(), bytes, to_string(t), "test.two_level.ar_hd_rep.b");
    SymmetricBuffer out(ctx().heap(), bytes, to_string(t), "test.two_level.ar_hd_rep.out");
    SymmetricBuffer first_a(ctx().heap(), bytes, to_string(t), "test.two_level.ar_hd_rep.first_a");
    SymmetricBuffer first_b(ctx().heap(), bytes, to_string(t), "test.two_level.ar_hd_rep.first_b");
    bench::fill_uniform(a.get(), count, to_string(t), bench::fresh_seed(ctx().rank(), 21), s);
    bench::fill_uniform(b.get(), count, to_string(t), bench::fresh_seed(ctx().rank(), 22), s);
    AllReduce plan(test::ctx_ptr(), {count, t, AllReduceVariant::automatic, 0, AllReduceRailWay::halving_doubling});
    plan.run(a.get(), first_a.get(), s);
    plan.run(b.get(), first_b.get(), s);
    WEFT_CUDA(cudaMemsetAsync(bad, 0, sizeof(*bad), s));
    for (int i = 0; i < runs; ++i) {
      plan.run(a.get(), out.get(), s);
      bench::accumulate_mismatches(out.get(), first_a.get(), bytes, bad, s);
      plan.run(b.get(), out.get(), s);
      bench::accumulate_mismatches(out.get(), first_b.get(), bytes, bad, s);
    }
    ctx().synchronize(s);
    unsigned long long h = 1;
    WEFT_CUDA(cudaMemcpy(&h, bad, sizeof(h), cudaMemcpyDeviceToHost));
    EXPECT_EQ(h, 0u) << to_string(t) << ": wrong bytes over " << 2 * runs << " runs";
    EXPECT_EQ(bench::count_mismatches(first_a.get(), first_b.get(), bytes, s) > 0, true)
        << "the two inputs gave the same result: the check above proves nothing";
    const auto hashes = test::gather(device_hash(first_a.get(), bytes));
    for (std::size_t q = 1; q < hashes.size(); ++q)
      EXPECT_EQ(hashes[q], hashes[0]) << to_string(t) << ": rank " << q << "'s result differs from rank 0's";
    ctx().host_barrier("two-level all_reduce, halving-doubling, repeats checked");
  }
  WEFT_CUDA(cudaFree(bad));
}

// Two inputs in turn, hundreds of runs with no host synchronisation: every
// run must give the bits of the first run on the same input. A run that read
// the staging of the run before (the other input) would differ.
TEST(TwoLevelReductions, BackToBackRunsOnAlternatingInputsRepeatBitwise) {
  NEED_NODES();
  RemotePeers remote(test::ctx_ptr());
  cudaStream_t s = test::stream();
  const int world = ctx().world_size(), runs = 200;
  const std::uint64_t count = (96u << 10) + 3;
  unsigned long long* bad = nullptr;
  WEFT_CUDA(cudaMalloc(&bad, sizeof(*bad)));
  for (DType t : {DType::bf16, DType::fp32}) {
    const std::uint64_t size = dtype_size(t);
    for (bool scatter : {true, false}) {
      const std::uint64_t in_count = scatter ? count * world : count, bytes = count * size;
      SymmetricBuffer a(ctx().heap(), in_count * size, to_string(t), "test.two_level.rep.a");
      SymmetricBuffer b(ctx().heap(), in_count * size, to_string(t), "test.two_level.rep.b");
      SymmetricBuffer out(ctx().heap(), bytes, to_string(t), "test.two_level.rep.out");
      SymmetricBuffer first_a(ctx().heap(), bytes, to_string(t), "test.two_level.rep.first_a");
      SymmetricBuffer first_b(ctx().heap(), bytes, to_string(t), "test.two_level.rep.first_b");
      bench::fill_uniform(a.get(), in_count, to_string(t), bench::fresh_seed(ctx().rank(), 11), s);
      bench::fill_uniform(b.get(), in_count, to_string(t), bench::fresh_seed(ctx().rank(), 12), s);
      std::unique_ptr<ReduceScatter> rs;
      std::unique_ptr<AllReduce> ar;
      if (scatter) rs = std::make_unique<ReduceScatter>(test::ctx_ptr(), ReduceScatterOptions{count, t});
      else ar = std::make_unique<AllReduce>(test::ctx_ptr(), AllReduceOptions{count, t});
      auto run = [&](const void* in, void* o) { scatter ? rs->run(in, o, s) : ar->run(in, o, s); };
      run(a.get(), first_a.get());
      run(b.get(), first_b.get());
      WEFT_CUDA(cudaMemsetAsync(bad, 0, sizeof(*bad), s));
      for (int i = 0; i < runs; ++i) {
        run(a.get(), out.get());
        bench::accumulate_mismatches(out.get(), first_a.get(), bytes, bad, s);
        run(b.get(), out.get());
        bench::accumulate_mismatches(out.get(), first_b.get(), bytes, bad, s);
      }
      ctx().synchronize(s);
      unsigned long long h = 1;
      WEFT_CUDA(cudaMemcpy(&h, bad, sizeof(h), cudaMemcpyDeviceToHost));
      EXPECT_EQ(h, 0u) << (scatter ? "reduce_scatter " : "all_reduce ") << to_string(t) << ": wrong bytes over "
                       << 2 * runs << " runs";
      EXPECT_EQ(bench::count_mismatches(first_a.get(), first_b.get(), bytes, s) > 0, true)
          << "the two inputs gave the same result: the check above proves nothing";
      ctx().host_barrier("two-level repeats checked");
    }
  }
  WEFT_CUDA(cudaFree(bad));
}

// Back-to-back launches of the widest grid with nothing between them: each
// launch's successor starts early (PDL) and waits resident beside it, so two
// launches of every rank on a GPU must fit at once. Every run on the same
// input must give the first run's bits.
TEST(TwoLevel, BackToBackLaunchesOfTheWidestGridRepeatBitwise) {
  NEED_NODES();
  RemotePeers remote(test::ctx_ptr());
  cudaStream_t s = test::stream();
  const int world = ctx().world_size(), runs = 24;
  const std::uint64_t count = (1u << 20) + 5;  // bf16 elements per rank: 2 MB, more than 32 blocks' worth
  const std::uint64_t bytes = count * 2;
  SymmetricBuffer in(ctx().heap(), bytes * world, "bf16", "test.two_level.wide.in");
  SymmetricBuffer out(ctx().heap(), bytes * world, "bf16", "test.two_level.wide.out");
  SymmetricBuffer first(ctx().heap(), bytes * world, "bf16", "test.two_level.wide.first");
  bench::fill_uniform(in.get(), count * world, "bf16", bench::fresh_seed(ctx().rank(), 31), s);
  const Team& team = ctx().team();
  auto check = [&](const std::string& name, auto& plan, std::uint64_t out_bytes) {
    EXPECT_LE(plan.sms_used() * 2 * team.ranks_per_gpu, team.gpu_sm_count)
        << name << ": two launches of every rank on this GPU must be resident at once";
    bench::poison(first.get(), out_bytes, 0xA5, s);
    bench::poison(out.get(), out_bytes, 0x5A, s);
    plan.run(in.get(), first.get(), s);
    ctx().synchronize(s);
    ctx().host_barrier("first run done");
    for (int i = 0; i < runs; ++i) plan.run(in.get(), out.get(), s);
    ctx().synchronize(s);
    EXPECT_EQ(bench::count_mismatches(out.get(), first.get(), out_bytes, s), 0u)
        << name << ", " << plan.sms_used() << " blocks: wrong bytes after " << runs << " back-to-back runs";
    ctx().host_barrier("back-to-back runs checked");
  };
  AllGather ag(test::ctx_ptr(), {bytes, AllGatherVariant::two_level, 0});
  check("all_gather", ag, bytes * world);
  ReduceScatter rs(test::ctx_ptr(), {count, DType::bf16, ReduceScatterVariant::two_level, 0});
  check("reduce_scatter", rs, bytes);
  AllReduce ar(test::ctx_ptr(), {count, DType::bf16, AllReduceVariant::two_level, 0});
  check("all_reduce", ar, bytes);
}

// ---- all three in CUDA graphs --------------------------------------------------------------

TEST(TwoLevel, GraphReplaysMatchEager) {
  NEED_NODES();
  RemotePeers remote(test::ctx_ptr());
  cudaStream_t s = test::stream();
  const int world = ctx().world_size(), replays = 2000;
  const std::uint64_t count = 20000 + 3;  // elements per rank (AllGather: bytes = 2 x count)
  const std::uint64_t bytes = count * 2;
  SymmetricBuffer in(ctx().heap(), bytes * world, "bf16", "test.two_level.graph.in");
  SymmetricBuffer out(ctx().heap(), bytes * world, "bf16", "test.two_level.graph.out");
  SymmetricBuffer eager(ctx().heap(), bytes * world, "bf16", "test.two_level.graph.eager");
  bench::fill_uniform(in.get(), count * world, "bf16", bench::fresh_seed(ctx().rank(), 9), s);
  auto check = [&](const std::string& name, auto& plan, std::uint64_t out_bytes) {
    plan.run(in.get(), eager.get(), s);
    ctx().synchronize(s);
    ctx().host_barrier("eager done");
    const auto bad = replay_and_compare([&](cudaStream_t st) { plan.run(in.get(), out.get(), st); }, out.get(),
                                        eager.get(), out_bytes, replays);
    EXPECT_EQ(bad, 0u) << name << ": wrong bytes over " << replays << " replays";
    ctx().host_barrier("replays done");
  };
  AllGather ag(test::ctx_ptr(), {bytes, AllGatherVariant::automatic, 0});
  check("all_gather", ag, bytes * world);
  ReduceScatter rs(test::ctx_ptr(), {count, DType::bf16, ReduceScatterVariant::automatic, 0});
  check("reduce_scatter", rs, bytes);
  AllReduce ar(test::ctx_ptr(), {count, DType::bf16, AllReduceVariant::automatic, 0});
  check("all_reduce", ar, bytes);
}

// ---- a rank that skips: the bounded waits name it ------------------------------------------

// Trapping leaves every rank's CUDA context unusable (under MPS, every rank on
// the GPU), and NVSHMEM cannot be torn down on a dead context: this case runs
// only in a process of its own (WEFT_TEST_PROVOKE_TIMEOUT=internode,
// scripts/gpu_tests.sh), and the processes leave with _Exit once every rank
// has reported, without NVSHMEM's teardown. The last rank skips; the others'
// waits end in reports. A rank blocked behind another blocked rank names that
// one (it is the one that never raised the flag), so each report is checked
// against the schedule: the flag's slot, decoded from its offset in
// 'all_gather.two_level.flags', is one the reporting rank waits for in
// hierarchy::ag_walk, raised by the rank the report names.
TEST(TwoLevelWaitTimeout, AWaitThatTimesOutNamesItsRankTheFlagAndTheRankThatNeverRaisedIt) {
  const char* provoke = std::getenv("WEFT_TEST_PROVOKE_TIMEOUT");
  if (!provoke || std::string(provoke) != "internode")
    GTEST_SKIP() << "runs only with WEFT_TEST_PROVOKE_TIMEOUT=internode, in a process of its own";
  NEED_NODES();
  ASSERT_GT(ctx().wait_timeout().count(), 0) << "set WEFT_WAIT_TIMEOUT to a short bound for this test";
  ASSERT_FALSE(ctx().check_calls()) << "run with WEFT_CHECK_CALLS=0: the skipping rank makes no call to compare";
  RemotePeers remote(test::ctx_ptr());
  const int skipper = ctx().world_size() - 1, me = ctx().rank();
  const std::uint64_t bytes = 4096;
  SymmetricBuffer out(ctx().heap(), bytes * ctx().world_size(), "bytes", "test.two_level.timeout.output");
  AllGather plan(test::ctx_ptr(), {bytes, AllGatherVariant::automatic, 0});
  const int blocks = plan.sms_used();
  bool own = false, ok = true;
  if (me != skipper) {
    const auto t0 = std::chrono::steady_clock::now();
    std::string message;
    plan.run(out.get(), out.get(), test::stream());
    try {
      ctx().synchronize(test::stream());
    } catch (const Error& e) {
      message = e.what();
    }
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // The report names the flag array with its element type: 'all_gather.two_level.flags (u64)' + 24 bytes.
    const std::regex report(
        R"(device wait timed out: rank (\d+) \(block (\d+)\).*'all_gather\.two_level\.flags[^']*' \+ (\d+) bytes.* rank (\d+) never signalled it)");
    std::smatch m;
    own = std::regex_search(message, m, report);
    const bool stopped_by_another =
        ctx().team().mps_client && message.find("share this GPU under MPS") != std::string::npos;
    ok = (own || stopped_by_another) && waited < ctx().wait_timeout().count() / 1000.0 + 10.0;
    if (own) {
      const int rank = std::stoi(m[1]), block = std::stoi(m[2]), named = std::stoi(m[4]);
      const std::uint64_t index = std::stoull(m[3]) / sizeof(std::uint64_t);
      const int slot = static_cast<int>(index / blocks);
      bool waits_for_it = false;
      hierarchy::ag_walk(grid(), me, [&](const hierarchy::Step& st) {
        waits_for_it = waits_for_it || (st.act == hierarchy::Act::wait && st.flag == slot && st.peer == named);
      });
      EXPECT_EQ(rank, me) << message;
      EXPECT_EQ(static_cast<int>(index % blocks), block) << "the flag is the reporting block's own: " << message;
      EXPECT_TRUE(waits_for_it) << "rank " << me << " has no wait for flag slot " << slot << " raised by rank "
                                << named << ": " << message;
      ok = ok && rank == me && waits_for_it;
    }
    std::printf("[ info ] rank %d: provoked hang reported after %.2f s: %s\n", me, waited, message.c_str());
  }
  int reports = 0, wrong = 0;
  for (const std::string& v : test::gather(str(own ? 1 : 0, ok ? 1 : 0))) {
    reports += v[0] == '1';
    wrong += v[1] == '0';
  }
  if (me == 0)
    std::printf("[ info ] provoked hang (rank %d skips): %d report(s) name their rank, the flag and the rank that "
                "never raised it, as the schedule says; %d rank(s) reported wrongly\n",
                skipper, reports, wrong);
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(reports >= 1 && wrong == 0 && !::testing::Test::HasFailure() ? 0 : 1);
}
