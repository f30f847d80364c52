// GroupedGemm on one GPU, against a float64 CPU reference, expert by expert:
// issue 33's three MoE shapes scaled down, under uniform, Zipf (s = 1.2) and
// one-hot routing; empty experts (first, last, runs of them); one expert;
// odd totals (1001 rows); SM budgets of 1, 3 and 63; bf16 and fp16; W as [E, N, K] and [E, K, N];
// experts at given first rows (a padded [E, rows, K] layout; one source rank's
// pairs of each expert at a time, as an overlapped MoE layer runs them). Most
// cases run under every compiled configuration, each forced by name (at test
// sizes the heuristic alone would pick the narrow tile). Outputs start as
// NaNs, and the rows outside the experts' ranges must stay so. Then: 50 back-to-back runs and a CUDA
// graph's replays equal the eager run bitwise, a replay reads the counts of
// its moment, counts that are negative or overflow the capacity and first
// rows out of order are reported, autotune picks by timing and keeps its
// choice by shape, tiles wait for the flags of their rows (GroupedRowWait)
// before reading them, tiles report their rows only once stored
// (GroupedRowsDone), and bad options and operands are refused naming what was expected. Every rank runs each test on its own GPU share (any world size).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gpu_check.hpp"
#include "gpu_test.hpp"
#include "half_bits.hpp"
#include "routing.hpp"
#include "weft/core/error.hpp"
#include "weft/device.cuh"
#include "weft/gemm/grouped_gemm.hpp"

using namespace weft;
using weft::test::ctx;
using weft::test::half_bits_to_float;

namespace {

constexpr std::uint16_t kNaN = 0xFFFF;  // a NaN in bf16 and in fp16

struct Case {
  std::string name;
  std::int64_t n, k;
  std::vector<std::int32_t> counts;  // rows per expert
  DType dtype = DType::bf16;
  BLayout layout = BLayout::nk;
  std::int64_t spare_rows = 0;  // capacity past the experts' last row: must stay unwritten
  std::string config;           // forced configuration, or "" for the heuristic's
  int max_sms = 0;              // GroupedGemmOptions::max_sms
  std::vector<std::int32_t> first_rows;  // each expert's first row (GroupedGemmArgs::expert_first_row); empty: packed

  /// Expert e's first row: as given, or packed after expert e - 1's.
  std::int64_t first_row(int e) const {
    if (!first_rows.empty()) return first_rows[e];
    std::int64_t r = 0;
    for (int i = 0; i < e; ++i) r += counts[i];
    return r;
  }
  /// One past the last row any expert holds.
  std::int64_t extent() const {
    std::int64_t end = 0;
    for (int e = 0; e < static_cast<int>(counts.size()); ++e) end = std::max(end, first_row(e) + counts[e]);
    return end;
  }
};

Case routed(std::string name, std::int64_t rows, int experts, std::int64_t n, std::int64_t k, bench::Routing r) {
  return Case{name + ", " + bench::routing_name(r), n, k, bench::routing_counts(r, rows, experts)};
}

/// A case's operands on the device and the host (the host copies as doubles).
struct Problem {
  Case c;
  GroupedGemmOptions o;
  std::int64_t rows = 0;  // one past the experts' last row (packed: the counts' total)
  std::vector<double> a, w;
  void *da = nullptr, *dw = nullptr, *dout = nullptr;
  std::int32_t* dcounts = nullptr;
  std::int32_t* dfirst = nullptr;  // the case's first rows, if it has them

  Problem(const Case& cs, std::uint64_t salt) : c(cs) {
    rows = c.extent();
    o.experts = static_cast<int>(c.counts.size());
    o.n = c.n;
    o.k = c.k;
    o.max_rows = std::max<std::int64_t>(rows + c.spare_rows, 1);
    o.dtype = c.dtype;
    o.w_layout = c.layout;
    o.config = c.config;
    o.max_sms = c.max_sms;
    cudaStream_t s = test::stream();
    const std::string t = to_string(c.dtype);
    const std::uint64_t a_n = o.max_rows * c.k, w_n = std::uint64_t(o.experts) * c.n * c.k;
    WEFT_CUDA(cudaMalloc(&da, a_n * 2));
    WEFT_CUDA(cudaMalloc(&dw, w_n * 2));
    WEFT_CUDA(cudaMalloc(&dout, o.max_rows * c.n * 2));
    WEFT_CUDA(cudaMalloc(&dcounts, c.counts.size() * 4));
    WEFT_CUDA(cudaMemcpyAsync(dcounts, c.counts.data(), c.counts.size() * 4, cudaMemcpyHostToDevice, s));
    if (!c.first_rows.empty()) {
      WEFT_CUDA(cudaMalloc(&dfirst, c.first_rows.size() * 4));
      WEFT_CUDA(cudaMemcpyAsync(dfirst, c.first_rows.data(), c.first_rows.size() * 4, cudaMemcpyHostToDevice, s));
    }
    bench::fill_uniform(da, a_n, t, bench::fresh_seed(ctx().rank(), 2 * salt), s);
    bench::fill_uniform(dw, w_n, t, bench::fresh_seed(ctx().rank(), 2 * salt + 1), s);
    std::vector<std::uint16_t> ha(a_n), hw(w_n);
    WEFT_CUDA(cudaMemcpyAsync(ha.data(), da, a_n * 2, cudaMemcpyDeviceToHost, s));
    WEFT_CUDA(cudaMemcpyAsync(hw.data(), dw, w_n * 2, cudaMemcpyDeviceToHost, s));
    WEFT_CUDA(cudaStreamSynchronize(s));
    a.resize(a_n);
    w.resize(w_n);
    for (std::uint64_t i = 0; i < a_n; ++i) a[i] = half_bits_to_float(ha[i], c.dtype);
    for (std::uint64_t i = 0; i < w_n; ++i) w[i] = half_bits_to_float(hw[i], c.dtype);
  }
  ~Problem() {
    for (void* p : {da, dw, dout, static_cast<void*>(dcounts), static_cast<void*>(dfirst)}) cudaFree(p);
  }
  Problem(const Problem&) = delete;
  Problem& operator=(const Problem&) = delete;

  GroupedGemmArgs args() const {
    return {.a = da, .w = dw, .out = dout, .expert_rows = dcounts, .expert_first_row = dfirst};
  }
  void poison(cudaStream_t s) const { bench::poison(dout, o.max_rows * c.n * 2, 0xFF, s); }

  /// out[rows, N] in float64, row r of expert e = sum_k A[r, k] W[e](n, k)
  /// (rows of no expert: 0); rows split over threads.
  std::vector<double> reference() const {
    std::vector<double> ref(rows * c.n, 0.0);
    std::vector<int> expert_of(rows, -1);
    for (int e = 0; e < o.experts; ++e)
      for (std::int32_t i = 0; i < c.counts[e]; ++i) expert_of[c.first_row(e) + i] = e;
    const std::int64_t n = c.n, k = c.k;
    auto work = [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r) {
        if (expert_of[r] < 0) continue;
        const double* ar = &a[r * k];
        const double* we = &w[std::uint64_t(expert_of[r]) * n * k];
        for (std::int64_t j = 0; j < n; ++j) {
          double sum = 0;
          if (c.layout == BLayout::nk)
            for (std::int64_t q = 0; q < k; ++q) sum += ar[q] * we[j * k + q];
          else
            for (std::int64_t q = 0; q < k; ++q) sum += ar[q] * we[q * n + j];
          ref[r * n + j] = sum;
        }
      }
    };
    const int threads = static_cast<int>(std::max(1u, std::min(16u, std::thread::hardware_concurrency())));
    std::vector<std::thread> pool;
    const std::int64_t per = (rows + threads - 1) / threads;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back(work, std::min(rows, t * per), std::min(rows, (t + 1) * per));
    for (auto& th : pool) th.join();
    return ref;
  }

  /// The largest per-expert ||out - ref|| / ||ref|| (non-finite: infinity), and
  /// the elements outside every expert's rows that are not the poison.
  struct Verdict {
    double worst = 0;
    int worst_expert = -1;
    std::int64_t written_outside = 0;
  };
  Verdict check(cudaStream_t s) const {
    std::vector<std::uint16_t> got(o.max_rows * c.n);
    WEFT_CUDA(cudaMemcpyAsync(got.data(), dout, got.size() * 2, cudaMemcpyDeviceToHost, s));
    WEFT_CUDA(cudaStreamSynchronize(s));
    const std::vector<double> ref = reference();
    Verdict v;
    std::vector<char> inside(o.max_rows, 0);
    for (int e = 0; e < o.experts; ++e) {
      const std::int64_t r = c.first_row(e);
      std::fill(inside.begin() + r, inside.begin() + r + c.counts[e], 1);
      double diff = 0, norm = 0;
      bool finite = true;
      for (std::int64_t i = r * c.n; i < (r + c.counts[e]) * c.n; ++i) {
        const double x = half_bits_to_float(got[i], c.dtype);
        finite &= std::isfinite(x);
        diff += (x - ref[i]) * (x - ref[i]);
        norm += ref[i] * ref[i];
      }
      const double err = !finite ? INFINITY : norm > 0 ? std::sqrt(diff / norm) : (diff == 0 ? 0.0 : INFINITY);
      if (c.counts[e] > 0 && err >= v.worst) {
        v.worst = err;
        v.worst_expert = e;
      }
    }
    for (std::int64_t i = 0; i < o.max_rows * c.n; ++i) v.written_outside += !inside[i / c.n] && got[i] != kNaN;
    return v;
  }
};

/// Runs a case once on poisoned output and checks it; returns the configuration that ran.
std::string expect_right(const Case& cs, std::uint64_t salt) {
  SCOPED_TRACE(cs.name);
  cudaStream_t s = test::stream();
  Problem pr(cs, salt);
  GroupedGemm gg(pr.o);
  pr.poison(s);
  gg.run(pr.args(), s);
  gg.check_counts(s);
  const Problem::Verdict v = pr.check(s);
  EXPECT_LE(v.worst, 1e-2) << cs.name << " (" << gg.config() << "): expert " << v.worst_expert << " of "
                           << pr.o.experts << ", " << (v.worst_expert >= 0 ? cs.counts[v.worst_expert] : 0) << " rows";
  EXPECT_EQ(v.written_outside, 0) << cs.name << ": elements written outside the experts' rows";
  return gg.config();
}

/// The compiled configurations' names for a type and layout (a plan of any shape lists them).
std::vector<std::string> configuration_names(int experts, DType dtype, BLayout layout) {
  GroupedGemmOptions o;
  o.experts = experts;
  o.n = 256;
  o.k = 512;
  o.max_rows = 1;
  o.dtype = dtype;
  o.w_layout = layout;
  return GroupedGemm(o).configurations();
}

/// expect_right under every compiled configuration for the case's type and
/// layout, each forced by name (the heuristic picks the narrow tile at test sizes).
void expect_right_in_every_configuration(Case cs, std::uint64_t salt) {
  GroupedGemmOptions o;
  o.experts = static_cast<int>(cs.counts.size());
  o.n = cs.n;
  o.k = cs.k;
  o.max_rows = 1;
  o.dtype = cs.dtype;
  o.w_layout = cs.layout;
  const std::vector<std::string> names = GroupedGemm(o).configurations();
  EXPECT_FALSE(names.empty());
  const std::string base = cs.name;
  for (const std::string& name : names) {
    cs.config = name;
    cs.name = base + ", " + name;
    EXPECT_EQ(expect_right(cs, salt++), name) << "a forced configuration runs as named";
  }
}

// One warp per band of out's rows, all in one block (one SM beside the GEMM's
// grid, whose CTAs each hold a whole SM): lane 0 waits (bounded by the
// World's timeout) until the band's counter reaches its complete value, then
// the warp copies the band's rows into `snapshot` at once, last rows first
// (a tile's last epilogue subtile is stored last: the likeliest to be late).
// A report raised before its rows' stores had landed leaves the poison (NaNs)
// in the snapshot.
__global__ void snapshot_reported_bands(dev::World w, const std::uint64_t* counters, const std::uint64_t* complete,
                                        std::int64_t rows_per_band, std::int64_t rows, std::int64_t n,
                                        const std::uint16_t* out, std::uint16_t* snapshot) {
  const std::int64_t band = threadIdx.x / 32;
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (lane == 0 && complete[band] > 0)
    dev::wait_until(w, counters + band, dev::Cmp::ge, complete[band], dev::Scope::sys);
  __syncwarp();
  const std::int64_t begin = band * rows_per_band * n;
  const std::int64_t end = std::min(rows, (band + 1) * rows_per_band) * n;
  for (std::int64_t i = end - 1 - lane; i >= begin; i -= 32) snapshot[i] = out[i];
}

}  // namespace

TEST(GroupedGemm, TheIssueShapesScaledDownMatchFloat64UnderEachRouting) {
  // Mixtral-, Qwen3-30B-A3B- and DeepSeek-like up-projections (N = F, K = H),
  // rows / 16, N and K / 8: the experts' counts keep their shape (8 experts of
  // 128 rows, 128 of 32, 32 of 64, before the routing skews them).
  std::uint64_t salt = 1;
  for (bench::Routing r : {bench::Routing::uniform, bench::Routing::zipf}) {
    expect_right_in_every_configuration(routed("Mixtral-like", 1024, 8, 896, 512, r), salt += 10);
    expect_right_in_every_configuration(routed("Qwen3-like", 4096, 128, 96, 256, r), salt += 10);
    expect_right_in_every_configuration(routed("DeepSeek-like", 2048, 32, 256, 896, r), salt += 10);
  }
  // The plan's own choice (the size heuristic's), as a caller gets it.
  EXPECT_FALSE(expect_right(routed("DeepSeek-like", 2048, 32, 256, 896, bench::Routing::zipf), salt += 10).empty());
  // Every row to one expert: 127 experts without rows.
  expect_right_in_every_configuration(routed("Qwen3-like", 4096, 128, 96, 256, bench::Routing::one_hot), salt += 10);
}

TEST(GroupedGemm, EmptyExpertsOneExpertAndOddTotals) {
  std::uint64_t salt = 100;
  // Empty experts first, last and in a run, between experts of odd sizes.
  expect_right_in_every_configuration(Case{"empty first, last and in a run", 264, 136, {0, 17, 0, 0, 0, 300, 1, 129, 0}},
                                      salt);
  salt += 10;
  // Every expert empty: nothing to compute, nothing written.
  Case none{"every expert empty", 64, 64, {0, 0, 0, 0}};
  none.spare_rows = 256;
  expect_right(none, salt++);
  // One expert: a plain GEMM of 1001 rows.
  expect_right(Case{"one expert, 1001 rows", 520, 264, {1001}}, salt++);
  // 1001 rows over 8 experts, Zipf; with rows to spare that must stay unwritten.
  Case odd = routed("1001 rows over 8 experts", 1001, 8, 1032, 128, bench::Routing::zipf);
  odd.spare_rows = 39;
  expect_right(odd, salt++);
  // One row per expert.
  expect_right(Case{"one row each", 256, 256, std::vector<std::int32_t>(64, 1)}, salt++);
}

TEST(GroupedGemm, EveryConfigurationRunsOnAnSmBudgetOfAnySize) {
  // A 2x1-cluster kernel does not launch on a grid of 3 along M: budgets of 3 SMs,
  // 1 (below one cluster) and 63 (odd and wide) must each run whole clusters.
  std::uint64_t salt = 300;
  for (int sms : {1, 3, 63}) {
    Case c = routed("max_sms " + std::to_string(sms), 1001, 16, 512, 64, bench::Routing::zipf);
    c.max_sms = sms;
    c.spare_rows = 7;
    expect_right_in_every_configuration(c, salt);
    salt += 10;
  }
}

TEST(GroupedGemm, BothTypesBothLayoutsAndEveryConfiguration) {
  std::uint64_t salt = 200;
  for (DType t : {DType::bf16, DType::fp16})
    for (BLayout layout : {BLayout::nk, BLayout::kn}) {
      Case c = routed(std::string(to_string(t)) + (layout == BLayout::nk ? ", W [E, N, K]" : ", W [E, K, N]"), 1001, 16,
                      520, 256, bench::Routing::zipf);
      c.dtype = t;
      c.layout = layout;
      c.spare_rows = 23;
      expect_right_in_every_configuration(c, salt);
      salt += 10;
    }
}

TEST(GroupedGemm, ExpertsAtGivenFirstRowsLeaveTheRowsBetweenThemUnwritten) {
  std::uint64_t salt = 500;
  // A padded layout, [E, 128, K] with a count of valid rows per expert: empty
  // experts, a full one, one of a single row.
  Case padded{"padded [8, 128, K]", 264, 136, {17, 0, 128, 1, 100, 64, 0, 5}};
  for (int e = 0; e < 8; ++e) padded.first_rows.push_back(128 * e);
  expect_right_in_every_configuration(padded, salt);
  salt += 10;
  // Zipf counts with uneven gaps between the experts, and rows to spare past the last.
  Case gapped = routed("1001 rows over 16 experts with gaps", 1001, 16, 520, 64, bench::Routing::zipf);
  for (int e = 0, row = 3; e < 16; ++e) {
    gapped.first_rows.push_back(row);
    row += gapped.counts[e] + (e * 7) % 13;
  }
  gapped.spare_rows = 11;
  expect_right_in_every_configuration(gapped, salt);
  salt += 10;
  // Empty experts that start where the one before ends, the last two at max_rows itself.
  Case edges{"empty experts at the previous end and at max_rows", 64, 64, {5, 0, 0}};
  edges.first_rows = {3, 8, 8};
  expect_right(edges, salt++);
}

TEST(GroupedGemm, OneSourceRanksRowsOfEachExpertAtATimeMakeThePackedResult) {
  // How an overlapped MoE layer runs: the pairs of each expert are sorted by
  // source rank, and as each rank's tokens land, one run computes that rank's
  // part of every expert (its counts, and its first row inside each expert's
  // range). Three sources' runs into one output must give the packed result
  // and write nothing else.
  cudaStream_t s = test::stream();
  const int sources = 3;
  Case packed = routed("Zipf over 16 experts, by 3 sources", 1001, 16, 520, 256, bench::Routing::zipf);
  packed.spare_rows = 9;
  Problem pr(packed, 600);
  GroupedGemm gg(pr.o);
  const int experts = pr.o.experts;
  std::vector<std::vector<std::int32_t>> counts(sources, std::vector<std::int32_t>(experts));
  std::vector<std::vector<std::int32_t>> firsts(sources, std::vector<std::int32_t>(experts));
  for (int e = 0; e < experts; ++e) {
    std::int64_t row = packed.first_row(e);
    for (int src = 0; src < sources; ++src) {
      // An uneven split: source src holds [c x src / 3, c x (src + 1) / 3) of expert e's rows.
      const std::int64_t c = packed.counts[e];
      counts[src][e] = static_cast<std::int32_t>(c * (src + 1) / sources - c * src / sources);
      firsts[src][e] = static_cast<std::int32_t>(row);
      row += counts[src][e];
    }
  }
  std::int32_t *dcounts, *dfirsts;
  WEFT_CUDA(cudaMalloc(&dcounts, sources * experts * 4));
  WEFT_CUDA(cudaMalloc(&dfirsts, sources * experts * 4));
  for (int src = 0; src < sources; ++src) {
    WEFT_CUDA(cudaMemcpyAsync(dcounts + src * experts, counts[src].data(), experts * 4, cudaMemcpyHostToDevice, s));
    WEFT_CUDA(cudaMemcpyAsync(dfirsts + src * experts, firsts[src].data(), experts * 4, cudaMemcpyHostToDevice, s));
  }
  pr.poison(s);
  for (int src = sources - 1; src >= 0; --src) {  // any order: the sources land when they land
    GroupedGemmArgs x = pr.args();
    x.expert_rows = dcounts + src * experts;
    x.expert_first_row = dfirsts + src * experts;
    gg.run(x, s);
  }
  gg.check_counts(s);
  const Problem::Verdict v = pr.check(s);
  EXPECT_LE(v.worst, 1e-2) << "expert " << v.worst_expert << " after the sources' runs";
  EXPECT_EQ(v.written_outside, 0) << "elements written outside the experts' rows";
  cudaFree(dcounts);
  cudaFree(dfirsts);
}

TEST(GroupedGemm, RepeatedRunsAndGraphReplaysEqualTheEagerRunAndReplaysReadTheirCounts) {
  cudaStream_t s = test::stream();
  Case cs = routed("Qwen3-like, Zipf", 4096, 128, 96, 256, bench::Routing::zipf);
  Problem pr(cs, 300);
  GroupedGemm gg(pr.o);
  const std::uint64_t out_bytes = pr.o.max_rows * cs.n * 2;
  void* first;
  unsigned long long* mismatches;
  WEFT_CUDA(cudaMalloc(&first, out_bytes));
  WEFT_CUDA(cudaMalloc(reinterpret_cast<void**>(&mismatches), sizeof(unsigned long long)));
  WEFT_CUDA(cudaMemsetAsync(mismatches, 0, sizeof(unsigned long long), s));
  pr.poison(s);
  gg.run(pr.args(), s);
  WEFT_CUDA(cudaMemcpyAsync(first, pr.dout, out_bytes, cudaMemcpyDeviceToDevice, s));
  for (int i = 0; i < 50; ++i) {  // back to back: no host synchronisation between runs
    pr.poison(s);
    gg.run(pr.args(), s);
    bench::accumulate_mismatches(pr.dout, first, out_bytes, mismatches, s);
  }
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  WEFT_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  pr.poison(s);
  gg.run(pr.args(), s);
  WEFT_CUDA(cudaStreamEndCapture(s, &graph));
  WEFT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 50; ++i) {
    WEFT_CUDA(cudaGraphLaunch(exec, s));
    bench::accumulate_mismatches(pr.dout, first, out_bytes, mismatches, s);
  }
  unsigned long long host = 0;
  WEFT_CUDA(cudaMemcpyAsync(&host, mismatches, sizeof(host), cudaMemcpyDeviceToHost, s));
  WEFT_CUDA(cudaStreamSynchronize(s));
  EXPECT_EQ(host, 0u) << "output bytes that differed from the first run, over 50 runs and 50 replays";
  {
    const Problem::Verdict v = pr.check(s);
    EXPECT_LE(v.worst, 1e-2) << "the replays' output";
  }
  // New counts written to the device between replays (the same total, 4096
  // rows): the replay computes them, as the counts are read on the device
  // when the graph runs, not fixed at capture.
  Case uniform = routed("Qwen3-like, uniform", 4096, 128, 96, 256, bench::Routing::uniform);
  pr.c.counts = uniform.counts;
  WEFT_CUDA(cudaMemcpyAsync(pr.dcounts, pr.c.counts.data(), pr.c.counts.size() * 4, cudaMemcpyHostToDevice, s));
  WEFT_CUDA(cudaGraphLaunch(exec, s));
  {
    const Problem::Verdict v = pr.check(s);
    EXPECT_LE(v.worst, 1e-2) << "a replay after the counts changed";
  }
  gg.check_counts(s);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaFree(first);
  cudaFree(mismatches);
}

// autotune: the first run times every compiled configuration on its own
// routing and leaves the chosen one's result, bit for bit what that
// configuration forced by name computes; a second plan of the same shape takes
// the tuning cache's choice without timing; a plan whose first run is captured
// keeps the size heuristic's choice, and its replays are right.
TEST(GroupedGemm, AutotuneChoosesByTimingKeepsTheChoiceByShapeAndLeavesCapturesToTheHeuristic) {
  cudaStream_t s = test::stream();
  Case cs = routed("DeepSeek-like, Zipf", 2048, 32, 256, 896, bench::Routing::zipf);
  Problem pr(cs, 700);
  const std::uint64_t out_bytes = pr.o.max_rows * cs.n * 2;
  auto output = [&] {
    std::vector<std::uint16_t> bits(out_bytes / 2);
    WEFT_CUDA(cudaMemcpyAsync(bits.data(), pr.dout, out_bytes, cudaMemcpyDeviceToHost, s));
    WEFT_CUDA(cudaStreamSynchronize(s));
    return bits;
  };
  GroupedGemmOptions tuned = pr.o;
  tuned.autotune = true;
  // A row count of its own in the key: no earlier test (or process, with WEFT_TUNE_CACHE) chose for it.
  tuned.expected_rows = pr.o.max_rows - 1 - ctx().rank();
  GroupedGemm first(tuned);
  const std::vector<std::string> names = first.configurations();
  pr.poison(s);
  first.run(pr.args(), s);
  first.check_counts(s);
  const std::string chosen = first.config();
  EXPECT_NE(std::find(names.begin(), names.end(), chosen), names.end()) << chosen;
  EXPECT_FALSE(first.from_cache() && !std::getenv("WEFT_TUNE_CACHE")) << "a shape no plan tuned before";
  if (names.size() > 1 && !first.from_cache()) EXPECT_STREQ(first.chosen_by(), "timing");
  {
    const Problem::Verdict v = pr.check(s);
    EXPECT_LE(v.worst, 1e-2) << "the tuned run (" << chosen << ")";
    EXPECT_EQ(v.written_outside, 0);
  }
  const std::vector<std::uint16_t> tuned_bits = output();

  GroupedGemmOptions forced = pr.o;
  forced.config = chosen;
  GroupedGemm by_name(forced);
  pr.poison(s);
  by_name.run(pr.args(), s);
  EXPECT_TRUE(output() == tuned_bits) << "the tuned run's output differs from " << chosen << " forced by name";
  EXPECT_STREQ(by_name.chosen_by(), "forced");

  GroupedGemm second(tuned);
  pr.poison(s);
  second.run(pr.args(), s);
  EXPECT_EQ(second.config(), chosen);
  if (names.size() > 1) EXPECT_TRUE(second.from_cache()) << "a second plan of the shape timed again";
  if (names.size() > 1) EXPECT_STREQ(second.chosen_by(), "tuning cache");
  EXPECT_TRUE(output() == tuned_bits) << "the cached choice's output differs";

  // First run under capture: nothing can be timed there, the heuristic's choice stays.
  GroupedGemmOptions captured_opts = tuned;
  captured_opts.expected_rows = pr.o.max_rows - 100 - ctx().rank();
  GroupedGemm captured(captured_opts);
  const std::string heuristic = captured.config();
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  WEFT_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  captured.run(pr.args(), s);
  WEFT_CUDA(cudaStreamEndCapture(s, &graph));
  WEFT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  EXPECT_EQ(captured.config(), heuristic);
  EXPECT_FALSE(captured.from_cache());
  EXPECT_STREQ(captured.chosen_by(), "heuristic");
  pr.poison(s);
  WEFT_CUDA(cudaGraphLaunch(exec, s));
  {
    const Problem::Verdict v = pr.check(s);
    EXPECT_LE(v.worst, 1e-2) << "the replay of a captured first run (" << heuristic << ")";
    EXPECT_EQ(v.written_outside, 0);
  }
  captured.run(pr.args(), s);  // an eager run after it: still the same choice, no timing
  EXPECT_EQ(captured.config(), heuristic);
  captured.check_counts(s);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

TEST(GroupedGemm, TilesWaitForTheFlagsOfTheirRowsThenReadThem) {
  // GroupedRowWait, as an overlapped MoE layer would use it: within each
  // expert the rows come from three sources in order (flag 0, 1, 2 by
  // thirds). Flag 0 is up from the start; the rows of flags 1 and 2 start as
  // NaNs with their flags a run behind (epoch 4 of 5). The GEMM starts; 20 ms
  // later a copy engine writes the real rows, then raises the flags to 5. A
  // tile that read before its flags would carry the NaNs into its expert's
  // output. Under every configuration, both layouts; then with autotune on
  // (a run that waits is never timed, so it must not hang), and a row whose
  // flag is out of range (it waits for nothing; check_counts names it).
  cudaStream_t s = test::stream(), late;
  WEFT_CUDA(cudaStreamCreateWithFlags(&late, cudaStreamNonBlocking));
  const std::vector<std::int32_t> counts = {300, 0, 517, 129, 1, 256};  // an empty expert, a one-row expert
  constexpr int kFlags = 3;
  constexpr std::uint64_t kEpoch = 5;
  std::uint64_t *flags = nullptr, *host_flags = nullptr;
  std::int32_t* row_flag = nullptr;
  WEFT_CUDA(cudaMalloc(&flags, kFlags * 8));
  WEFT_CUDA(cudaMallocHost(&host_flags, kFlags * 8));
  std::uint64_t salt = 9100;
  int tried = 0;
  // Runs one case: `bad_row` >= 0 gets flag index kFlags (out of range) and nothing arrives late.
  auto run_case = [&](Case cs, bool autotune, std::int64_t bad_row) {
    SCOPED_TRACE(cs.name);
    Problem pr(cs, salt++);
    pr.o.autotune = autotune;
    GroupedGemm gg(pr.o);
    const std::int64_t rows = pr.rows, row_bytes = cs.k * 2;
    std::vector<std::int32_t> map(pr.o.max_rows, 0);
    for (int e = 0; e < pr.o.experts; ++e)
      for (std::int32_t i = 0; i < cs.counts[e]; ++i)
        map[cs.first_row(e) + i] = static_cast<std::int32_t>(std::int64_t{i} * kFlags / cs.counts[e]);
    const bool arrive_late = bad_row < 0;
    if (!arrive_late) map[bad_row] = kFlags;
    WEFT_CUDA(cudaMalloc(&row_flag, map.size() * 4));
    WEFT_CUDA(cudaMemcpyAsync(row_flag, map.data(), map.size() * 4, cudaMemcpyHostToDevice, s));
    char* real_a = nullptr;  // pinned, so the late copy is a copy engine's
    WEFT_CUDA(cudaMallocHost(&real_a, rows * row_bytes));
    WEFT_CUDA(cudaMemcpyAsync(real_a, pr.da, rows * row_bytes, cudaMemcpyDeviceToHost, s));
    WEFT_CUDA(cudaStreamSynchronize(s));
    for (int f = 0; f < kFlags; ++f) host_flags[f] = f == 0 || !arrive_late ? kEpoch : kEpoch - 1;
    WEFT_CUDA(cudaMemcpyAsync(flags, host_flags, kFlags * 8, cudaMemcpyHostToDevice, s));
    if (arrive_late)
      for (std::int64_t r = 0; r < rows; ++r)
        if (map[r] > 0) bench::poison(static_cast<char*>(pr.da) + r * row_bytes, row_bytes, 0xFF, s);
    pr.poison(s);
    GroupedGemmArgs args = pr.args();
    args.wait = GroupedRowWait{
        .world = &ctx().world(), .flags = flags, .flag_count = kFlags, .value = kEpoch, .row_flag = row_flag};
    gg.run(args, s);
    if (arrive_late) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      for (int f = 0; f < kFlags; ++f) host_flags[f] = kEpoch;
      WEFT_CUDA(cudaMemcpyAsync(pr.da, real_a, rows * row_bytes, cudaMemcpyHostToDevice, late));
      WEFT_CUDA(cudaMemcpyAsync(flags, host_flags, kFlags * 8, cudaMemcpyHostToDevice, late));
      WEFT_CUDA(cudaStreamSynchronize(late));
    }
    if (arrive_late) {
      EXPECT_NO_THROW(gg.check_counts(s));
    } else {
      try {
        gg.check_counts(s);
        ADD_FAILURE() << "a row whose flag is out of range was not reported";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("row " + std::to_string(bad_row) + "'s wait.row_flag was outside [0, "
                                             "flag_count)"),
                  std::string::npos)
            << e.what();
      }
    }
    const Problem::Verdict v = pr.check(s);
    EXPECT_LE(v.worst, 1e-2) << gg.config() << ": expert " << v.worst_expert;
    EXPECT_EQ(v.written_outside, 0) << gg.config() << ": elements written outside the experts' rows";
    // The run left the flags as they were: not consumed.
    std::vector<std::uint64_t> after(kFlags);
    WEFT_CUDA(cudaMemcpy(after.data(), flags, kFlags * 8, cudaMemcpyDeviceToHost));
    for (int f = 0; f < kFlags; ++f) EXPECT_EQ(after[f], kEpoch) << "flag " << f;
    cudaFreeHost(real_a);
    cudaFree(row_flag);
    row_flag = nullptr;
    ++tried;
  };
  for (auto [dtype, layout] : {std::pair{DType::bf16, BLayout::nk}, std::pair{DType::fp16, BLayout::kn}}) {
    for (const std::string& name : configuration_names(static_cast<int>(counts.size()), dtype, layout))
      run_case(Case{std::string("waits, ") + to_string(dtype) + ", " + name, 256, 512, counts, dtype, layout, 64, name}, false, -1);
  }
  run_case(Case{"waits, autotune", 256, 512, counts}, true, -1);
  run_case(Case{"a row's flag out of range", 256, 512, counts}, false, 700);
  EXPECT_GE(tried, 4) << "every configuration of two type/layout pairs, autotune, a bad flag";
  WEFT_CUDA(cudaStreamSynchronize(s));
  cudaStreamDestroy(late);
  cudaFree(flags);
  cudaFreeHost(host_flags);
}

TEST(GroupedGemm, TilesReportTheirStoredRowsOnlyOnceTheStoresHaveLanded) {
  // GroupedRowsDone, as MoE + ReduceScatter would use it: bands of 100 rows
  // (across tile edges and experts' edges), packed experts and experts at
  // given first rows with gaps between them (rows no expert covers count for
  // nothing). The GEMM leaves SMs free; on them, beside it, one block per
  // band waits for the band's counter and copies the band at once. Every
  // snapshot must equal the final output bitwise (a report before the stores
  // landed would have copied NaNs), every counter must end at exactly its
  // complete value (each tile reported once), and the output must match
  // float64. Under every configuration of two type/layout pairs; then with
  // autotune (a run that reports is never timed, or the counters would count twice).
  cudaStream_t s = test::stream(), watch;
  WEFT_CUDA(cudaStreamCreateWithFlags(&watch, cudaStreamNonBlocking));
  const std::vector<std::int32_t> counts = {300, 0, 517, 129, 1, 256};
  const std::vector<std::int32_t> gapped = {0, 300, 384, 960, 1100, 1120};  // ranges end at 300, 901, 1089, 1101, 1376
  constexpr std::int64_t kBandRows = 100;
  const int free_sms = 8;
  std::uint64_t salt = 9300;
  int tried = 0;
  auto run_case = [&](Case cs, bool autotune) {
    SCOPED_TRACE(cs.name);
    cs.max_sms = std::max(1, ctx().team().sm_count - free_sms);
    Problem pr(cs, salt++);
    pr.o.autotune = autotune;
    GroupedGemm gg(pr.o);
    const std::int64_t rows = pr.o.max_rows, n = cs.n, bands = (rows + kBandRows - 1) / kBandRows;
    std::vector<std::uint64_t> complete(bands, 0);
    for (int e = 0; e < pr.o.experts; ++e)
      for (std::int64_t r = cs.first_row(e); r < cs.first_row(e) + cs.counts[e]; ++r)
        complete[r / kBandRows] += GroupedRowsDone::complete_value(1, n);
    std::uint64_t *counters = nullptr, *dcomplete = nullptr;
    std::uint16_t* snapshot = nullptr;
    WEFT_CUDA(cudaMalloc(&counters, bands * 8));
    WEFT_CUDA(cudaMalloc(&dcomplete, bands * 8));
    WEFT_CUDA(cudaMalloc(&snapshot, rows * n * 2));
    WEFT_CUDA(cudaMemcpyAsync(dcomplete, complete.data(), bands * 8, cudaMemcpyHostToDevice, s));
    WEFT_CUDA(cudaMemsetAsync(counters, 0, bands * 8, s));
    bench::poison(snapshot, rows * n * 2, 0xFF, s);
    pr.poison(s);
    WEFT_CUDA(cudaStreamSynchronize(s));
    ASSERT_LE(bands, 32) << "one warp per band, in one block";
    snapshot_reported_bands<<<1, static_cast<unsigned>(32 * bands), 0, watch>>>(
        ctx().world(), counters, dcomplete, kBandRows, rows, n, static_cast<const std::uint16_t*>(pr.dout), snapshot);
    WEFT_CUDA(cudaGetLastError());
    GroupedGemmArgs args = pr.args();
    args.report = GroupedRowsDone{.counters = counters, .rows_per_report = kBandRows};
    gg.run(args, s);
    WEFT_CUDA(cudaStreamSynchronize(watch));
    gg.check_counts(s);
    std::vector<std::uint16_t> out(rows * n), snap(rows * n);
    std::vector<std::uint64_t> ended(bands);
    WEFT_CUDA(cudaMemcpy(out.data(), pr.dout, out.size() * 2, cudaMemcpyDeviceToHost));
    WEFT_CUDA(cudaMemcpy(snap.data(), snapshot, snap.size() * 2, cudaMemcpyDeviceToHost));
    WEFT_CUDA(cudaMemcpy(ended.data(), counters, bands * 8, cudaMemcpyDeviceToHost));
    std::int64_t early = 0, miscounted = 0;
    for (std::int64_t i = 0; i < rows * n; ++i) early += snap[i] != out[i];
    for (std::int64_t b = 0; b < bands; ++b) miscounted += ended[b] != complete[b];
    EXPECT_EQ(early, 0) << gg.config() << ": elements copied at their band's report differ from the final output";
    EXPECT_EQ(miscounted, 0) << gg.config() << ": counters that did not end at their band's rows x N";
    const Problem::Verdict v = pr.check(s);
    EXPECT_LE(v.worst, 1e-2) << gg.config() << ": expert " << v.worst_expert;
    EXPECT_EQ(v.written_outside, 0) << gg.config() << ": elements written outside the experts' rows";
    for (void* p : {static_cast<void*>(counters), static_cast<void*>(dcomplete), static_cast<void*>(snapshot)})
      cudaFree(p);
    ++tried;
  };
  for (auto [dtype, layout] : {std::pair{DType::bf16, BLayout::nk}, std::pair{DType::fp16, BLayout::kn}}) {
    for (const std::string& name : configuration_names(static_cast<int>(counts.size()), dtype, layout)) {
      const std::string what = std::string(to_string(dtype)) + ", " + name;
      run_case(Case{"reports, packed, " + what, 256, 512, counts, dtype, layout, 64, name}, false);
      Case gaps{"reports, first rows with gaps, " + what, 256, 512, counts, dtype, layout, 24, name};
      gaps.first_rows = gapped;
      run_case(gaps, false);
    }
  }
  run_case(Case{"reports, autotune", 256, 512, counts}, true);
  EXPECT_GE(tried, 9) << "every configuration of two type/layout pairs, packed and gapped, and autotune";
  cudaStreamDestroy(watch);
}

TEST(GroupedGemm, CountsThatAreNegativeOrPastTheCapacityAreReported) {
  cudaStream_t s = test::stream();
  Case cs{"capacity", 64, 64, {100, 100, 100, 100}};
  Problem pr(cs, 400);
  GroupedGemmOptions small = pr.o;
  small.max_rows = 250;  // the counts sum to 400
  GroupedGemm gg(small);
  pr.poison(s);
  gg.run(pr.args(), s);
  try {
    gg.check_counts(s);
    ADD_FAILURE() << "counts past max_rows were not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the row counts summed to 400, past max_rows = 250"), std::string::npos)
        << e.what();
  }
  // Nothing past the capacity was written (the rows past it were dropped).
  std::vector<std::uint16_t> got(pr.o.max_rows * cs.n);
  WEFT_CUDA(cudaMemcpy(got.data(), pr.dout, got.size() * 2, cudaMemcpyDeviceToHost));
  std::int64_t past = 0;
  for (std::int64_t i = small.max_rows * cs.n; i < pr.o.max_rows * cs.n; ++i) past += got[i] != kNaN;
  EXPECT_EQ(past, 0) << "elements written past max_rows";
  gg.check_counts(s);  // the record was cleared
  const std::int32_t negative[4] = {10, -5, 10, 10};
  WEFT_CUDA(cudaMemcpy(pr.dcounts, negative, sizeof(negative), cudaMemcpyHostToDevice));
  gg.run(pr.args(), s);
  try {
    gg.check_counts(s);
    ADD_FAILURE() << "a negative count was not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("an expert's row count was negative"), std::string::npos) << e.what();
  }
}

TEST(GroupedGemm, FirstRowsOutOfOrderOverlappingOrPastTheCapacityAreReportedNamingTheExpert) {
  cudaStream_t s = test::stream();
  Case cs{"first rows", 64, 64, {10, 10, 10, 10}};
  cs.first_rows = {0, 16, 32, 48};
  cs.spare_rows = 6;  // max_rows = 64
  Problem pr(cs, 700);
  GroupedGemm gg(pr.o);
  pr.poison(s);
  gg.run(pr.args(), s);
  gg.check_counts(s);  // a valid layout: nothing recorded
  EXPECT_LE(pr.check(s).worst, 1e-2);
  struct Bad {
    std::vector<std::int32_t> first;
    const char* expect;
  };
  const Bad bads[] = {
      {{0, 5, 32, 48}, "expert 1's rows"},      // begins inside expert 0's rows
      {{0, 16, 12, 48}, "expert 2's rows"},     // before the previous expert
      {{0, 16, 32, 60}, "expert 3's rows"},     // 60 + 10 rows pass max_rows = 64
      {{-1, 16, 32, 48}, "expert 0's rows"},    // negative
      {{0, 5, 2, 48}, "expert 1's rows"},       // two bad: the lowest is named
  };
  for (const Bad& b : bads) {
    WEFT_CUDA(cudaMemcpy(pr.dfirst, b.first.data(), 16, cudaMemcpyHostToDevice));
    gg.run(pr.args(), s);
    try {
      gg.check_counts(s);
      ADD_FAILURE() << "first rows {" << b.first[0] << ", " << b.first[1] << ", " << b.first[2] << ", " << b.first[3]
                    << "} were not reported";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(b.expect), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("max_rows = 64 (that expert was computed as empty)"), std::string::npos)
          << e.what();
    }
  }
  gg.check_counts(s);  // the record was cleared
}

TEST(GroupedGemm, RefusesBadOptionsAndOperandsNamingWhatWasExpected) {
  auto plan_error = [](GroupedGemmOptions o) {
    try {
      GroupedGemm g(o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  GroupedGemmOptions o;
  o.experts = 8;
  o.n = 256;
  o.k = 100;
  o.max_rows = 64;
  EXPECT_NE(plan_error(o).find("K = 100 must be a multiple of 8"), std::string::npos) << plan_error(o);
  o.k = 256;
  o.experts = 0;
  EXPECT_NE(plan_error(o).find("experts = 0: expected 1 to"), std::string::npos) << plan_error(o);
  o.experts = 8;
  o.dtype = DType::fp32;
  EXPECT_NE(plan_error(o).find("dtype must be bf16 or fp16"), std::string::npos) << plan_error(o);
  o.dtype = DType::bf16;
  GroupedGemm gg(o);
  void* buf;
  std::int32_t* counts;
  WEFT_CUDA(cudaMalloc(&buf, 1 << 20));
  WEFT_CUDA(cudaMalloc(&counts, 64));
  const GroupedGemmArgs good{.a = buf, .w = buf, .out = buf, .expert_rows = counts};
  auto run_error = [&](GroupedGemmArgs x) {
    try {
      gg.run(x, test::stream());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  GroupedGemmArgs x = good;
  x.w = nullptr;
  EXPECT_NE(run_error(x).find("W [E = 8, N = 256, K = 256] must be a device pointer"), std::string::npos) << run_error(x);
  x = good;
  x.a = static_cast<char*>(buf) + 8;
  EXPECT_NE(run_error(x).find("is not 16-byte aligned"), std::string::npos) << run_error(x);
  x = good;
  x.expert_rows = nullptr;
  EXPECT_NE(run_error(x).find("expert_rows int32 [E = 8]"), std::string::npos) << run_error(x);
  x = good;
  x.expert_first_row = reinterpret_cast<const std::int32_t*>(reinterpret_cast<char*>(counts) + 2);
  EXPECT_NE(run_error(x).find("expert_first_row int32 [E = 8] (optional) at"), std::string::npos) << run_error(x);
  WEFT_CUDA(cudaStreamSynchronize(test::stream()));
  cudaFree(buf);
  cudaFree(counts);
}
