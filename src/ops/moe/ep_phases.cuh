// ep_phases.cuh (private) - what the throughput-mode EP kernels share on one node
// (ep.cu) and across nodes (internode/ep.cu): the count of a chunk of tokens, the
// send tables derived from every rank's exchanged counts, and the receive and the
// reduce, which read the same staging rows and meta records on both.
//
// Device functions only: each unit wraps them in kernels of its own (libweft is
// whole-program device code, weft::internode relocatable; a __global__ here would
// be defined in both).
#pragma once

#include <cstdint>

#include "ep_layout.hpp"
#include "row_sums.cuh"
#include "weft/device/types.cuh"

namespace weft::moe_detail {

constexpr int kCountChunk = 128;  // tokens per warp in the count
constexpr int kCountWarps = 4;    // warps per count block
constexpr int kCountRowTail = 8;  // after [E pairs][W tokens] in a counts row: T, E, H, k, bad token, slot, code, value
constexpr std::uint64_t kNoRowError = ~std::uint64_t{0};

/// One count launch: chunks of kCountChunk tokens, a warp each.
struct CountArgs {
  const std::int64_t* topk;  // [T][k]
  std::int64_t tokens;
  int experts, world, k;
  int nodes, local;             // the node grid (1 x W on one node: no node columns)
  std::uint64_t* error;         // [1]: min over bad pairs of (token << 8 | slot << 2 | code)
  std::int32_t* chunk_counts;   // [chunks][E + W (+ nodes)]: per chunk, pairs per expert, tokens per rank (per node)
  std::int32_t* pair_local;     // [T][k]: the pair's position among its chunk's pairs of its expert
  std::int32_t* rank_local;     // [T][W]: the token's position among its chunk's tokens for rank r, -1 if not sent
  std::int32_t* node_local;     // [T][nodes] or null (one node): the same per node
};

/// Columns of a chunk's counts: E + W, and the nodes where there are node columns.
WEFT_HD int count_columns(const CountArgs& a) { return a.experts + a.world + (a.node_local ? a.nodes : 0); }

/// The count, for a block of kCountWarps warps with `counters` ([warps][count_columns]
/// ints of shared memory): validates each token's row (the first bad pair goes to
/// a.error), counts per chunk the pairs of each expert, the tokens for each rank
/// (and node), and records each pair's and token's position within its chunk
/// (token order). Called by every thread of the block.
__device__ inline void count_chunk(const CountArgs& a, int* counters) {
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) & 31;
  const int E = a.experts, W = a.world, k = a.k, cols = count_columns(a), per = E / W;
  int* cnt = counters + warp * cols;
  const std::int64_t chunk = static_cast<std::int64_t>(blockIdx.x) * kCountWarps + warp;
  const std::int64_t t0 = chunk * kCountChunk;
  if (t0 >= a.tokens) return;  // the whole warp
  const std::int64_t t1 = t0 + kCountChunk < a.tokens ? t0 + kCountChunk : a.tokens;
  for (int i = lane; i < cols; i += 32) cnt[i] = 0;
  __syncwarp();
  const bool in = lane < k;
  std::int64_t ex_next = in ? a.topk[t0 * k + lane] : -1;
  for (std::int64_t t = t0; t < t1; ++t) {
    // The next token's row is loaded before this one is counted, so its latency overlaps the counting.
    const std::int64_t ex = ex_next;
    if (in && t + 1 < t1) ex_next = a.topk[(t + 1) * k + lane];
    const bool bad = in && (ex < -1 || ex >= E);
    const bool valid = in && ex >= 0 && !bad;
    // Lanes with the same valid expert; invalid lanes get a value of their own.
    const unsigned same = __match_any_sync(0xffffffffu, valid ? static_cast<unsigned long long>(ex)
                                                               : ~static_cast<unsigned long long>(lane) - 1);
    const bool repeat = valid && static_cast<int>(__ffs(same)) - 1 != lane;  // an earlier slot lists it
    const unsigned errors = __ballot_sync(0xffffffffu, bad || repeat);
    if (errors != 0) {
      const int first = __ffs(errors) - 1;  // the slot token_destinations stops at
      if (lane == first)
        atomicMin(reinterpret_cast<unsigned long long*>(a.error),
                  static_cast<unsigned long long>(
                      (static_cast<std::uint64_t>(t) << 8) | (static_cast<std::uint64_t>(lane) << 2) |
                      static_cast<std::uint64_t>(bad ? static_cast<int>(RowError::expert_out_of_range)
                                                     : static_cast<int>(RowError::expert_twice))));
      continue;  // uniform: `errors` is the warp's
    }
    if (valid) a.pair_local[t * k + lane] = cnt[ex]++;  // experts are distinct within a row
    const unsigned ranks = __reduce_or_sync(0xffffffffu, valid ? 1u << (static_cast<int>(ex) / per) : 0u);
    if (lane < W) a.rank_local[t * W + lane] = ((ranks >> lane) & 1u) ? cnt[E + lane]++ : -1;
    if (a.node_local && lane < a.nodes) {
      const unsigned on_node = (ranks >> (lane * a.local)) & (a.local == 32 ? ~0u : (1u << a.local) - 1u);
      a.node_local[t * a.nodes + lane] = on_node != 0 ? cnt[E + W + lane]++ : -1;
    }
    __syncwarp();
  }
  __syncwarp();
  for (int i = lane; i < cols; i += 32) a.chunk_counts[chunk * cols + i] = cnt[i];
}

/// The send tables of rank `me` from every rank's counts row in `matrix`
/// ([W][row]: pairs per expert, then tokens per rank; loads bypass L1, peers
/// wrote them), by one block of at least E threads, with `scan` ([2][E] shared):
///   pair_base[x]  = where this rank's pairs of expert x start in x's owner's recv_x:
///                   the pairs of the owner's earlier experts from every source, plus
///                   those of x from sources before this rank;
///   token_base[r] = where this rank's tokens start in rank r's staging.
/// Every thread of the block calls it; it syncs the block.
__device__ inline void send_tables(const std::int64_t* matrix, int row, int experts, int world, int me,
                                   std::int64_t (*scan)[1024], std::int32_t* pair_base, std::int32_t* token_base) {
  const int E = experts, W = world, tid = static_cast<int>(threadIdx.x);
  const ExpertPlacement pl{E, W};
  std::int64_t total = 0, before_me = 0;
  if (tid < E)
    for (int s = 0; s < W; ++s) {
      const std::int64_t v = __ldcg(matrix + static_cast<std::int64_t>(s) * row + tid);
      total += v;
      if (s < me) before_me += v;
    }
  int in = 0;  // Hillis-Steele inclusive scan over the experts, double-buffered
  if (tid < E) scan[0][tid] = total;
  __syncthreads();
  for (int step = 1; step < E; step *= 2) {
    if (tid < E) scan[in ^ 1][tid] = scan[in][tid] + (tid >= step ? scan[in][tid - step] : 0);
    in ^= 1;
    __syncthreads();
  }
  if (tid < E) {
    const int first = pl.global(pl.owner(tid), 0);  // the owner's first expert
    const std::int64_t earlier = scan[in][tid] - total - (first > 0 ? scan[in][first - 1] : 0);
    pair_base[tid] = static_cast<std::int32_t>(earlier + before_me);
  }
  for (int r = tid; r < W; r += blockDim.x) {
    std::int64_t base = 0;
    for (int s = 0; s < me; ++s) base += __ldcg(matrix + static_cast<std::int64_t>(s) * row + E + r);
    token_base[r] = static_cast<std::int32_t>(base);
  }
  __syncthreads();
}

/// A rank's staged tokens: the receive staging ([recv_tokens][stride] 16-byte
/// vectors a row: H bf16) and its meta records ([recv_tokens][2 + 2k] int32:
/// source token, pairs, their recv_x rows, their weights as float bits); rows
/// [self_lo, self_hi) hold this rank's own tokens, whose data the send already
/// put in recv_x (their staging rows hold the meta record only).
struct StagedRows {
  const uint4* staging;
  const std::int32_t* meta;
  int k;
  std::int64_t stride;  // 16-byte vectors of a staging row (H / 8)
  std::int64_t recv_tokens, self_lo, self_hi;
};

/// The receive: each staged token to its rows of recv_x (`vecs` vectors a row;
/// fp8 rows are followed in their staging row by `scales` floats, which go to
/// recv_scales), its weights to recv_weights (if not null). A warp per staged
/// token (warp0, warp0 + warps, ...); every lane calls. Loads bypass L1 (peers wrote the rows).
__device__ inline void receive_rows(const StagedRows& r, std::int64_t warp0, std::int64_t warps, std::int64_t vecs,
                                    int scales, uint4* recv_x, float* recv_scales, float* recv_weights) {
  const int lane = static_cast<int>(threadIdx.x) & 31, k = r.k, mstride = 2 + 2 * k;
  for (std::int64_t i = warp0; i < r.recv_tokens; i += warps) {
    const std::int32_t* m = r.meta + i * mstride;
    const int n = __ldcg(m + 1);
    const std::int32_t prow = lane < n ? __ldcg(m + 2 + lane) : -1;
    if (recv_weights && lane < n) recv_weights[prow] = __int_as_float(__ldcg(m + 2 + k + lane));
    if (i >= r.self_lo && i < r.self_hi) continue;  // this rank's own tokens: placed by the send
    const uint4* src = r.staging + i * r.stride;
    if (scales) {
      const float* sc = reinterpret_cast<const float*>(src + vecs);
      for (int p = 0; p < n; ++p) {
        float* dst = recv_scales + static_cast<std::int64_t>(__shfl_sync(0xffffffffu, prow, p)) * scales;
        for (int c = lane; c < scales; c += 32) dst[c] = __ldcg(sc + c);
      }
    }
    // Every lane runs every iteration (the shuffles need the whole warp); four loads in flight.
    for (std::int64_t v0 = 0; v0 < vecs; v0 += 32 * 4) {
      const std::int64_t v = v0 + lane;
      uint4 val[4];
#pragma unroll
      for (int u = 0; u < 4; ++u)
        if (v + 32 * u < vecs) val[u] = __ldcg(src + v + 32 * u);
      for (int p = 0; p < n; ++p) {
        uint4* dst = recv_x + static_cast<std::int64_t>(__shfl_sync(0xffffffffu, prow, p)) * vecs;
#pragma unroll
        for (int u = 0; u < 4; ++u)
          if (v + 32 * u < vecs) dst[v + 32 * u] = val[u];
      }
    }
  }
}

/// The reduce: each staged token's partial, w x y over its pairs in slot order
/// (fp32, rounded once to bf16), stored over its staging row; an own token that
/// went to no other rank (`only_here(t)`, warp-uniform) is its output, bit for
/// bit, and is stored at out[t] instead (a sum of one bf16 row would round it
/// again). A warp per staged token; every lane calls.
template <class OnlyHere>
__device__ inline void reduce_partials(const StagedRows& r, uint4* staging, std::int64_t warp0, std::int64_t warps,
                                       const uint4* y, uint4* out, OnlyHere only_here) {
  const int lane = static_cast<int>(threadIdx.x) & 31, k = r.k, mstride = 2 + 2 * k;
  const std::int64_t vecs = r.stride;
  for (std::int64_t i = warp0; i < r.recv_tokens; i += warps) {
    const std::int32_t* m = r.meta + i * mstride;
    const int n = __ldcg(m + 1);
    const std::int32_t prow = lane < n ? __ldcg(m + 2 + lane) : -1;
    const float pw = lane < n ? __int_as_float(__ldcg(m + 2 + k + lane)) : 0.f;
    const unsigned pairs = n >= 32 ? ~0u : (1u << n) - 1u;
    auto row_at = [&](int p) { return y + static_cast<std::int64_t>(__shfl_sync(0xffffffffu, prow, p)) * vecs; };
    auto weight = [&](int p) { return __shfl_sync(0xffffffffu, pw, p); };
    uint4* dst = staging + i * vecs;
    if (i >= r.self_lo && i < r.self_hi) {
      const std::int64_t t = __ldcg(m);
      if (only_here(t)) dst = out + t * vecs;
    }
    for (std::int64_t v0 = 0; v0 < vecs; v0 += 32 * kRowSumVecs) {  // every lane runs every step
      RowSumAcc acc{};  // fp32 sums, rounded once
      add_rows<true>(acc, pairs, row_at, weight, v0 + lane, vecs);
      store_rows(dst, acc, v0 + lane, vecs);
    }
  }
}

}  // namespace weft::moe_detail
