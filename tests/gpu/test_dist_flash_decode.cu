// DistFlashDecode at any world size (ranks may share a GPU): every rank holds
// a contiguous shard of each sequence's KV cache (ceil(length / world) keys
// each, so sequences shorter than the world leave ranks with empty shards),
// and every rank's result must match FlashDecode over the whole cache on one
// GPU (the local attention with the default kernel and the 6-stage one);
// repeated runs, CUDA-graph replays and the combine step run alone give the
// same bits; combine() before any run() is refused.
//
// weft_internode_tests compiles this file too (WEFT_TESTS_ACROSS_NODES): there
// the ranks span nodes (virtual ones on one machine, or real ones) and the
// partials travel by the two-level AllGather, against the same reference; every
// rank must also hold the same bits, and without a RemotePeers the plan is refused.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gpu_check.hpp"
#include "gpu_test.hpp"
#include "ops/attention/decode_split.hpp"
#include "weft/core/error.hpp"
#include "weft/ops/dist_flash_decode.hpp"
#include "weft/ops/flash_decode.hpp"

#include "across_nodes_setup.hpp"

using namespace weft;
using weft::test::ctx;

namespace {

constexpr int kBatch = 4, kQHeads = 32, kKvHeads = 8, kDim = 128;

/// The whole cache (the same on every rank: from one seed) and this rank's shard of it, on the device.
struct Sharded {
  std::vector<int> lens;
  std::int64_t lmax = 1, local_max = 1;
  void *q = nullptr, *k = nullptr, *v = nullptr, *local_k = nullptr, *local_v = nullptr;
  void *out_ref = nullptr, *out = nullptr;
  float *lse_ref = nullptr, *lse = nullptr;
  std::int32_t *lens_d = nullptr, *local_lens_d = nullptr;

  explicit Sharded(std::vector<int> lengths) : lens(std::move(lengths)) {
    cudaStream_t s = test::stream();
    const int world = ctx().world_size(), rank = ctx().rank();
    // One seed for every rank: rank 0's fresh one.
    const std::uint64_t seed = std::stoull(test::gather(std::to_string(bench::fresh_seed(rank, 0xd15c)))[0]);
    for (int len : lens) lmax = std::max<std::int64_t>(lmax, len);
    std::vector<std::int32_t> local_lens(kBatch);
    std::vector<std::int64_t> lo(kBatch), hi(kBatch);
    for (int b = 0; b < kBatch; ++b) {
      attention_detail::contiguous_shard(lens[b], world, rank, lo[b], hi[b]);
      local_lens[b] = static_cast<std::int32_t>(hi[b] - lo[b]);
      local_max = std::max<std::int64_t>(local_max, hi[b] - lo[b]);
    }
    const std::uint64_t elems = std::uint64_t(kBatch) * kKvHeads * lmax * kDim;
    const std::uint64_t local_elems = std::uint64_t(kBatch) * kKvHeads * local_max * kDim;
    const std::uint64_t q_elems = std::uint64_t(kBatch) * kQHeads * kDim;
    for (void** p : {&q, &out_ref, &out}) WEFT_CUDA(cudaMalloc(p, q_elems * 2));
    for (void** p : {&k, &v}) WEFT_CUDA(cudaMalloc(p, elems * 2));
    for (void** p : {&local_k, &local_v}) WEFT_CUDA(cudaMalloc(p, local_elems * 2));
    for (float** p : {&lse_ref, &lse}) WEFT_CUDA(cudaMalloc(p, kBatch * kQHeads * 4));
    WEFT_CUDA(cudaMalloc(&lens_d, kBatch * 4));
    WEFT_CUDA(cudaMalloc(&local_lens_d, kBatch * 4));
    std::vector<std::int32_t> all_lens(lens.begin(), lens.end());
    WEFT_CUDA(cudaMemcpy(lens_d, all_lens.data(), kBatch * 4, cudaMemcpyHostToDevice));
    WEFT_CUDA(cudaMemcpy(local_lens_d, local_lens.data(), kBatch * 4, cudaMemcpyHostToDevice));
    bench::fill_uniform(q, q_elems, "bf16", seed + 1, s);
    bench::fill_uniform(k, elems, "bf16", seed + 2, s);
    bench::fill_uniform(v, elems, "bf16", seed + 3, s);
    // This rank's keys [lo, hi) of every (sequence, KV head), packed at the start of its local rows.
    for (int b = 0; b < kBatch; ++b)
      for (int h = 0; h < kKvHeads; ++h) {
        const std::uint64_t from = ((std::uint64_t(b) * kKvHeads + h) * lmax + lo[b]) * kDim * 2;
        const std::uint64_t to = ((std::uint64_t(b) * kKvHeads + h) * local_max) * kDim * 2;
        const std::uint64_t bytes = std::uint64_t(hi[b] - lo[b]) * kDim * 2;
        if (!bytes) continue;
        WEFT_CUDA(cudaMemcpyAsync(static_cast<char*>(local_k) + to, static_cast<char*>(k) + from, bytes,
                                  cudaMemcpyDeviceToDevice, s));
        WEFT_CUDA(cudaMemcpyAsync(static_cast<char*>(local_v) + to, static_cast<char*>(v) + from, bytes,
                                  cudaMemcpyDeviceToDevice, s));
      }
    // The reference: the whole cache on this GPU.
    FlashDecode whole({.batch = kBatch, .q_heads = kQHeads, .kv_heads = kKvHeads, .max_kv_len = lmax});
    whole.run({.q = q, .k = k, .v = v, .kv_lens = lens_d, .out = out_ref, .lse = lse_ref}, s);
    WEFT_CUDA(cudaStreamSynchronize(s));
  }
  ~Sharded() {
    for (void* p : {q, k, v, local_k, local_v, out_ref, out, static_cast<void*>(lse_ref), static_cast<void*>(lse),
                    static_cast<void*>(lens_d), static_cast<void*>(local_lens_d)})
      cudaFree(p);
  }
  FlashDecodeOptions local_options() const {
    return {.batch = kBatch, .q_heads = kQHeads, .kv_heads = kKvHeads, .max_kv_len = local_max};
  }
  FlashDecodeArgs local_args() const {
    return {.q = q, .k = local_k, .v = local_v, .kv_lens = local_lens_d, .out = out, .lse = lse};
  }
  void poison(cudaStream_t s) const {
    bench::poison(out, std::uint64_t(kBatch) * kQHeads * kDim * 2, 0xFF, s);
    bench::poison(lse, kBatch * kQHeads * 4, 0xFF, s);
  }
  /// "" if this rank's out and lse match the whole-cache reference.
  std::string compare() const {
    const std::uint64_t n = std::uint64_t(kBatch) * kQHeads * kDim;
    const bench::ValueDiff d = bench::compare_values(out, out_ref, n, "bf16", test::stream());
    std::vector<float> got(kBatch * kQHeads), want(got.size());
    WEFT_CUDA(cudaMemcpy(got.data(), lse, got.size() * 4, cudaMemcpyDeviceToHost));
    WEFT_CUDA(cudaMemcpy(want.data(), lse_ref, want.size() * 4, cudaMemcpyDeviceToHost));
    double lse_err = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      if (want[i] == -INFINITY) {
        if (got[i] != -INFINITY) lse_err = INFINITY;
        continue;
      }
      const double e = std::fabs(double(got[i]) - want[i]) / std::max(1.0, std::fabs(double(want[i])));
      lse_err = std::isfinite(e) ? std::max(lse_err, e) : INFINITY;
    }
    if (d.relative_error <= 1e-2 && lse_err <= 1e-3) return "";
    return str("rank ", ctx().rank(), " of ", ctx().world_size(), ": output relative error ", d.relative_error,
               ", lse error ", lse_err);
  }
};

}  // namespace

TEST(DistFlashDecode, EveryRankGetsTheAttentionOverTheWholeCache) {
  ACROSS_NODES_SETUP();
  // Lengths 1 and 3 leave ranks with empty shards at world 2 and more; 0 leaves every rank empty.
  for (const std::vector<int>& lens : {std::vector<int>{5000, 1, 3, 777}, std::vector<int>{0, 20000, 64, 2}}) {
    Sharded sh(lens);
    // The local attention with each stage count built [0064] (the default is one of them: 6 for
    // these small batches at a whole GPU's SMs, 3 at a small share of them).
    for (int stages : {3, 6}) {
      FlashDecodeOptions local = sh.local_options();
      local.stages = stages;
      DistFlashDecode op(test::ctx_ptr(), local);
      cudaStream_t s = test::stream();
      sh.poison(s);
      op.run(sh.local_args(), s);
      WEFT_CUDA(cudaStreamSynchronize(s));
      const std::string bad = sh.compare();
      EXPECT_EQ(bad, "") << "lengths " << lens[0] << ", " << lens[1] << ", " << lens[2] << ", " << lens[3]
                         << ", local stages " << stages;
      EXPECT_TRUE(test::all_ranks(bad.empty())) << "some rank's result is off";
    }
  }
}

TEST(DistFlashDecode, RepeatedRunsAndGraphReplaysGiveTheSameBits) {
  ACROSS_NODES_SETUP();
  Sharded sh({9000, 33, 2, 4097});
  DistFlashDecode op(test::ctx_ptr(), sh.local_options());
  cudaStream_t s = test::stream();
  const std::uint64_t out_bytes = std::uint64_t(kBatch) * kQHeads * kDim * 2, lse_bytes = kBatch * kQHeads * 4;
  void *first_out, *first_lse;
  unsigned long long* mismatches;
  WEFT_CUDA(cudaMalloc(&first_out, out_bytes));
  WEFT_CUDA(cudaMalloc(&first_lse, lse_bytes));
  WEFT_CUDA(cudaMalloc(reinterpret_cast<void**>(&mismatches), 2 * sizeof(unsigned long long)));
  WEFT_CUDA(cudaMemsetAsync(mismatches, 0, 2 * sizeof(unsigned long long), s));
  op.run(sh.local_args(), s);
  WEFT_CUDA(cudaMemcpyAsync(first_out, sh.out, out_bytes, cudaMemcpyDeviceToDevice, s));
  WEFT_CUDA(cudaMemcpyAsync(first_lse, sh.lse, lse_bytes, cudaMemcpyDeviceToDevice, s));
  for (int i = 0; i < 20; ++i) {
    sh.poison(s);
    op.run(sh.local_args(), s);
    bench::accumulate_mismatches(sh.out, first_out, out_bytes, mismatches, s);
    bench::accumulate_mismatches(sh.lse, first_lse, lse_bytes, mismatches + 1, s);
  }
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  WEFT_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  sh.poison(s);
  op.run(sh.local_args(), s);
  bench::accumulate_mismatches(sh.out, first_out, out_bytes, mismatches, s);
  bench::accumulate_mismatches(sh.lse, first_lse, lse_bytes, mismatches + 1, s);
  WEFT_CUDA(cudaStreamEndCapture(s, &graph));
  WEFT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 100; ++i) WEFT_CUDA(cudaGraphLaunch(exec, s));
  unsigned long long host[2];
  WEFT_CUDA(cudaMemcpyAsync(host, mismatches, sizeof(host), cudaMemcpyDeviceToHost, s));
  WEFT_CUDA(cudaStreamSynchronize(s));
  EXPECT_EQ(host[0], 0u) << "output bytes that differed from the first run, over 20 runs and 100 replays";
  EXPECT_EQ(host[1], 0u) << "lse bytes that differed from the first run";
  EXPECT_EQ(sh.compare(), "");
  // Every rank merged the same partials in the same order: the same bits everywhere.
  {
    std::vector<unsigned char> bytes(out_bytes + lse_bytes);
    WEFT_CUDA(cudaMemcpy(bytes.data(), sh.out, out_bytes, cudaMemcpyDeviceToHost));
    WEFT_CUDA(cudaMemcpy(bytes.data() + out_bytes, sh.lse, lse_bytes, cudaMemcpyDeviceToHost));
    std::uint64_t h = 14695981039346656037ull;  // FNV-1a
    for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
    const auto hashes = test::gather(std::to_string(h));
    for (std::size_t q = 1; q < hashes.size(); ++q)
      EXPECT_EQ(hashes[q], hashes[0]) << "rank " << q << "'s output and lse differ from rank 0's";
  }
  // The combine step alone (what weft-bench decode --dist times) over the partials the last run left:
  // the same bits, 20 times.
  WEFT_CUDA(cudaMemsetAsync(mismatches, 0, 2 * sizeof(unsigned long long), s));
  for (int i = 0; i < 20; ++i) {
    sh.poison(s);
    op.combine(sh.local_args(), s);
    bench::accumulate_mismatches(sh.out, first_out, out_bytes, mismatches, s);
    bench::accumulate_mismatches(sh.lse, first_lse, lse_bytes, mismatches + 1, s);
  }
  WEFT_CUDA(cudaMemcpyAsync(host, mismatches, sizeof(host), cudaMemcpyDeviceToHost, s));
  WEFT_CUDA(cudaStreamSynchronize(s));
  EXPECT_EQ(host[0], 0u) << "output bytes of combine() alone that differed from run()'s";
  EXPECT_EQ(host[1], 0u) << "lse bytes of combine() alone that differed from run()'s";
  // combine() before any run() has no partials to merge: refused on every rank.
  DistFlashDecode fresh(test::ctx_ptr(), sh.local_options());
  try {
    fresh.combine(sh.local_args(), s);
    ADD_FAILURE() << "combine() before run() was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("DistFlashDecode::combine: run() must come first"), std::string::npos)
        << e.what();
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  for (void* p : {first_out, first_lse, static_cast<void*>(mismatches)}) cudaFree(p);
  EXPECT_TRUE(test::all_ranks(!HasFailure()));
}

#if defined(WEFT_TESTS_ACROSS_NODES)
TEST(DistFlashDecode, AcrossNodesWithoutRemotePeersIsRefusedNamingTheRemedy) {
  NEED_NODES();
  std::string error;
  try {
    DistFlashDecode op(test::ctx_ptr(), {.batch = kBatch, .q_heads = kQHeads, .kv_heads = kKvHeads, .max_kv_len = 64});
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("DistFlashDecode reaches every peer by load and store"), std::string::npos) << error;
  EXPECT_NE(error.find("construct a weft::RemotePeers"), std::string::npos) << error;
}
#endif
