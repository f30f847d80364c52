// MoE under tensor parallelism: the AgMoe and MoeRs plans and their kernels.
//
// AgMoe's sequential path (moe_tp_layout.hpp has the shards and the sort's passes):
//   pack      this rank's count, routing, weights and token rows into its
//             shard of the gathered buffer (symmetric heap);
//   AllGather the W shards, in place (weft's AllGather: its own flags and
//             epochs keep a peer from writing a shard this rank still reads);
//   count     a warp per chunk of kSortChunk gathered tokens: each pair's
//             position among its chunk's pairs of its expert, token by token,
//             slots in lane order (__match_any_sync groups a token's slots
//             that name one expert, so a repeated expert keeps slot order);
//             the chunk's count per expert; an id outside [-1, E) counts as
//             none and is recorded (the lowest (token, slot) wins: atomicMin
//             of a key, an order-free record);
//   scan      one block: per expert, the chunks' counts into exclusive
//             prefixes and the expert's total (the grouped GEMM's counts),
//             then the experts' first rows (a block scan);
//   place     a warp per gathered token: each pair's row = offset[e] +
//             chunk prefix + position; the row <-> pair maps; the token's row
//             copied once per pair into the sorted A;
//   GroupedGemm  out = sorted A x W_up[e]^T, expert by expert, counts read on the device.
// AgMoe's overlapped path (decision 0071), the same passes split by what they need:
//   pack      the count, routing and weights alone into this rank's head;
//   push      (side stream, copy engines) once every peer said "free": this
//             rank's token rows into slot `me` of every peer's rows buffer,
//             then a flag there (copy_pipe.hpp);
//   AllGather the heads, in place;
//   count, scan, place  as above on the heads, the place pass writing the
//             maps only;
//   regions   a thread per (rank s, expert e): rank s's pairs of expert e are
//             the rows of e whose gathered token lies in shard s, found by
//             bisection over row_token (moe_tiles.hpp), no atomics;
//   per rank s in arrival order, this rank's first: a wait for s's flag (a
//             bounded kernel that names s), the place pass copying shard s's
//             rows into the sorted A, and GroupedGemm over s's regions (its
//             per-expert counts and first rows), which writes exactly the rows
//             the sequential path's one GroupedGemm writes for those pairs.
// MoeRs's sequential path:
//   GroupedGemm  y = h x W_down[e]^T (this rank's partial sums over its K slice);
//   combine   a warp per gathered token: sum over its slots ascending of
//             w x y[row] in fp32, one rounding, into the token-order partial
//             buffer [W][capacity][H] (symmetric heap; padding tokens 0);
//   ReduceScatter  in place: slice s (rank s's shard of tokens) summed over
//             the ranks lands in rank s's slice;
//   copy      this rank's T_r rows to out.
// MoeRs's overlapped path, by destination:
//   regions   as AgMoe's, from the routing's sorted rows;
//   per destination d, rank me + 1 first and this rank last: GroupedGemm over
//             d's regions (the rows of d's pairs, into y), combine over d's
//             tokens (slice d of the partial buffer), and, d not this rank,
//             once the combine is done (an event), a push of that slice on
//             the copy engines into slot `me` of rank d's incoming buffer,
//             then a flag there (copy_pipe.hpp; the pushes wait for every
//             peer's "free" of this run);
//   wait      one bounded kernel for every peer's flag, naming the late rank;
//   sum       out = the ranks' partials of this rank's tokens in rank order
//             (its own slice from the partial buffer, the peers' from
//             incoming), fp32, one rounding.
// Nothing reads the routing on the host, and every position is computed:
// the rows and sums are the same, bit for bit, in every run and replay.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "../copy_pipe.hpp"
#include "../kernel_util.cuh"
#include "../path_choice.hpp"
#include "chunk_scan.cuh"
#include "moe_tp_layout.hpp"
#include "weft/core/error.hpp"
#include "weft/device.cuh"
#include "weft/gemm/grouped_gemm.hpp"
#include "weft/ops/moe_tp.hpp"

namespace weft {
namespace {

using moe_detail::kMoeTpMaxExperts;
using moe_detail::kMoeTpMaxTopK;
using moe_detail::kSortChunk;
using moe_detail::ShardLayout;
using ops_detail::exclusive_scan_column;

constexpr int kCountWarps = 4;       // chunks per count block
constexpr int kScanThreads = kMoeTpMaxExperts;  // one expert a thread
constexpr int kWarpThreads = 256;    // pack, place and combine blocks
constexpr int kWarpsPerBlock = kWarpThreads / 32;
constexpr int kRowVecs = 4;          // 16-byte vectors a lane moves per row and step
constexpr std::uint64_t kNoError = ~std::uint64_t{0};
// Error record: [0] the lowest key (gathered token x 32 + slot) with a bad id,
// [1] that pair's id, [2] the key [1] belongs to.
constexpr int kErrorWords = 4;

std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }

// AgMoe's local scratch, carved from one cudaMalloc.
struct SortScratch {
  std::uint64_t* error;         // [kErrorWords]
  std::int32_t* chunk_counts;   // [chunks][E]: counts, then exclusive prefixes over chunks
  std::int32_t* pair_local;     // [G][k]: position among the chunk's pairs of its expert, -1 for none
  std::int32_t* token_row;      // [G][k]
  float* token_weight;          // [G][k]
  std::int32_t* row_token;      // [max_rows]
  std::int32_t* row_slot;       // [max_rows]
  std::int32_t* expert_rows;    // [E]
  std::int32_t* expert_offset;  // [E + 1]
  std::int32_t* region_count;   // [W][E]: the overlapped path's source regions (moe_tiles.hpp)
  std::int32_t* region_first;   // [W][E]
};

SortScratch carve(void* base, int world, std::int64_t cap, int k, int experts, std::uint64_t* bytes_out) {
  const auto g = static_cast<std::uint64_t>(moe_detail::gathered_tokens(world, cap));
  const auto rows = static_cast<std::uint64_t>(moe_detail::max_pair_rows(world, cap, k));
  const auto chunks = static_cast<std::uint64_t>(moe_detail::sort_chunks(world, cap));
  std::uint64_t off = 0;
  auto take = [&](std::uint64_t n) {
    const std::uint64_t at = off;
    off = align_up(off + n, 256);
    return static_cast<char*>(base) + at;
  };
  SortScratch s{};
  s.error = reinterpret_cast<std::uint64_t*>(take(kErrorWords * 8));
  s.chunk_counts = reinterpret_cast<std::int32_t*>(take(chunks * experts * 4));
  s.pair_local = reinterpret_cast<std::int32_t*>(take(g * k * 4));
  s.token_row = reinterpret_cast<std::int32_t*>(take(g * k * 4));
  s.token_weight = reinterpret_cast<float*>(take(g * k * 4));
  s.row_token = reinterpret_cast<std::int32_t*>(take(rows * 4));
  s.row_slot = reinterpret_cast<std::int32_t*>(take(rows * 4));
  s.expert_rows = reinterpret_cast<std::int32_t*>(take(experts * 4));
  s.expert_offset = reinterpret_cast<std::int32_t*>(take((experts + 1) * 4));
  s.region_count = reinterpret_cast<std::int32_t*>(take(static_cast<std::uint64_t>(world) * experts * 4));
  s.region_first = reinterpret_cast<std::int32_t*>(take(static_cast<std::uint64_t>(world) * experts * 4));
  if (bytes_out) *bytes_out = off;
  return s;
}

int clamp_grid(std::int64_t work_units, std::int64_t per_block, int most) {
  return static_cast<int>(std::clamp<std::int64_t>((work_units + per_block - 1) / per_block, 1, most));
}

// ---- AgMoe's kernels ------------------------------------------------------------

struct SortArgs {
  char* shards;          // symmetric [W] shards, or the overlapped path's heads: counts, ids, weights
  ShardLayout l;
  std::int64_t cap;      // tokens per shard
  std::int64_t tokens;   // gathered tokens, W x cap
  int world, experts, k;
  std::int64_t vecs;     // 16-byte vectors of a token row
  SortScratch s;
  uint4* sorted_a;       // [max_rows][H]
  // Shard s's token t's row: rows + s x rows_stride + t x row bytes. The
  // overlapped path's copies take one shard each, from its own buffer (stride 0).
  const char* rows;
  std::uint64_t rows_stride;
};

__device__ __forceinline__ const char* shard(const SortArgs& a, int s) {
  return a.shards + static_cast<std::uint64_t>(s) * a.l.bytes;
}
__device__ __forceinline__ const std::int64_t* shard_topk(const SortArgs& a, int s) {
  return reinterpret_cast<const std::int64_t*>(shard(a, s) + a.l.topk);
}

struct PackArgs {
  char* mine;  // this rank's shard
  ShardLayout l;
  std::int64_t tokens, k, vecs;
  const std::int64_t* topk;
  const float* weights;
  const uint4* x;
};

__global__ void __launch_bounds__(kWarpThreads) pack_kernel(PackArgs a) {
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  if (first == 0) *reinterpret_cast<std::int64_t*>(a.mine + a.l.count) = a.tokens;
  auto* topk = reinterpret_cast<std::int64_t*>(a.mine + a.l.topk);
  auto* weights = reinterpret_cast<float*>(a.mine + a.l.weights);
  for (std::int64_t i = first; i < a.tokens * a.k; i += stride) {
    topk[i] = a.topk[i];
    weights[i] = a.weights[i];
  }
  auto* x = reinterpret_cast<uint4*>(a.mine + a.l.x);
  for (std::int64_t v = first; v < a.tokens * a.vecs; v += stride) x[v] = a.x[v];
}

__global__ void __launch_bounds__(kCountWarps * 32) count_kernel(SortArgs a) {
  extern __shared__ std::int32_t counters[];  // [warps][E]
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) & 31;
  const int E = a.experts, k = a.k;
  std::int32_t* cnt = counters + warp * E;
  const std::int64_t chunk = static_cast<std::int64_t>(blockIdx.x) * kCountWarps + warp;
  const std::int64_t g0 = chunk * kSortChunk;
  if (g0 >= a.tokens) return;  // the whole warp
  const std::int64_t g1 = g0 + kSortChunk < a.tokens ? g0 + kSortChunk : a.tokens;
  for (int e = lane; e < E; e += 32) cnt[e] = 0;
  __syncwarp();
  int s = -1;
  std::int64_t count = 0;
  const std::int64_t* topk = nullptr;
  for (std::int64_t g = g0; g < g1; ++g) {
    const int gs = moe_detail::gathered_rank(g, a.cap);
    if (gs != s) {  // warp-uniform: a chunk may span two shards
      s = gs;
      count = __ldcg(reinterpret_cast<const std::int64_t*>(shard(a, s) + a.l.count));
      count = count < a.cap ? count : a.cap;  // run() keeps it so; a shard never reads past its room
      topk = shard_topk(a, s);
    }
    const std::int64_t t = g - static_cast<std::int64_t>(s) * a.cap;
    const bool in = lane < k && t < count;
    const std::int64_t ex = in ? __ldcg(topk + t * k + lane) : -1;
    const bool bad = in && (ex < -1 || ex >= E);
    const bool valid = in && ex >= 0 && ex < E;
    if (bad)
      atomicMin(reinterpret_cast<unsigned long long*>(a.s.error),
                static_cast<unsigned long long>(g) * kMoeTpMaxTopK + static_cast<unsigned long long>(lane));
    // The lanes naming the same expert (a lane without a pair matches only itself).
    const unsigned same =
        __match_any_sync(0xffffffffu, valid ? static_cast<unsigned long long>(ex) : ~0ull - static_cast<unsigned>(lane));
    const int below = __popc(same & ((1u << lane) - 1u));
    const std::int32_t base = valid ? cnt[ex] : 0;
    __syncwarp();  // every lane has read its expert's count before the first of its group adds to it
    if (valid && below == 0) cnt[ex] = base + __popc(same);
    if (lane < k) a.s.pair_local[g * k + lane] = valid ? base + below : -1;
    __syncwarp();
  }
  for (int e = lane; e < E; e += 32) a.s.chunk_counts[chunk * E + e] = cnt[e];
}

__global__ void __launch_bounds__(kScanThreads) scan_kernel(SortArgs a) {
  __shared__ std::int32_t scan[2][kMoeTpMaxExperts];
  const int E = a.experts, tid = static_cast<int>(threadIdx.x);
  const std::int64_t chunks = (a.tokens + kSortChunk - 1) / kSortChunk;
  std::int32_t total = 0;
  if (tid < E) {
    total = exclusive_scan_column(a.s.chunk_counts, chunks, E, tid);
    a.s.expert_rows[tid] = total;
    scan[0][tid] = total;
  }
  __syncthreads();
  int in = 0;  // Hillis-Steele inclusive scan over the experts, double-buffered
  for (int step = 1; step < E; step *= 2) {
    if (tid < E) scan[in ^ 1][tid] = scan[in][tid] + (tid >= step ? scan[in][tid - step] : 0);
    in ^= 1;
    __syncthreads();
  }
  if (tid < E) a.s.expert_offset[tid] = scan[in][tid] - total;
  if (tid == E - 1) a.s.expert_offset[E] = scan[in][tid];
  if (tid == 0) {
    // The bad id of the lowest key, read while this run's routing is in the shards. A
    // key recorded by an earlier run already has its id (words [1], [2]).
    const std::uint64_t key = a.s.error[0];
    if (key != kNoError && a.s.error[2] != key) {
      const std::int64_t g = static_cast<std::int64_t>(key / kMoeTpMaxTopK);
      const int slot = static_cast<int>(key % kMoeTpMaxTopK);
      const int s = moe_detail::gathered_rank(g, a.cap);
      a.s.error[1] = static_cast<std::uint64_t>(__ldcg(shard_topk(a, s) + (g - s * a.cap) * a.k + slot));
      a.s.error[2] = key;
    }
  }
}

// Gathered tokens [g_begin, g_end): with `maps`, each pair's row = offset[e]
// + chunk prefix + position, and the row <-> pair maps; else the rows are read
// back from token_row (the maps of an earlier pass). With `copy`, the token's
// row is copied once per pair into the sorted A. Both flags are grid-uniform.
__global__ void __launch_bounds__(kWarpThreads)
    place_kernel(SortArgs a, std::int64_t g_begin, std::int64_t g_end, bool maps, bool copy) {
  const int lane = static_cast<int>(threadIdx.x) & 31, k = a.k, E = a.experts;
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * kWarpsPerBlock;
  for (std::int64_t g = g_begin + static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32; g < g_end;
       g += warps) {
    const int s = moe_detail::gathered_rank(g, a.cap);
    const std::int64_t t = g - static_cast<std::int64_t>(s) * a.cap;
    std::int32_t row = -1;
    if (maps) {
      const std::int32_t pos = lane < k ? a.s.pair_local[g * k + lane] : -1;
      float w = 0.f;
      if (pos >= 0) {
        const auto e = static_cast<int>(__ldcg(shard_topk(a, s) + t * k + lane));
        w = __ldcg(reinterpret_cast<const float*>(shard(a, s) + a.l.weights) + t * k + lane);
        row = a.s.expert_offset[e] + a.s.chunk_counts[(g / kSortChunk) * E + e] + pos;
        a.s.row_token[row] = static_cast<std::int32_t>(g);
        a.s.row_slot[row] = lane;
      }
      if (lane < k) {
        a.s.token_row[g * k + lane] = row;
        a.s.token_weight[g * k + lane] = w;
      }
    } else if (lane < k) {
      row = a.s.token_row[g * k + lane];
    }
    if (!copy) continue;
    const unsigned pairs = __ballot_sync(0xffffffffu, row >= 0);
    if (pairs == 0) continue;  // warp-uniform
    // The token's row, loaded once, stored to each of its pairs' rows.
    const uint4* src = reinterpret_cast<const uint4*>(a.rows + static_cast<std::uint64_t>(s) * a.rows_stride) + t * a.vecs;
    for (std::int64_t v0 = 0; v0 < a.vecs; v0 += 32 * kRowVecs) {  // every lane runs every step (shuffles)
      const std::int64_t v = v0 + lane;
      uint4 val[kRowVecs];
#pragma unroll
      for (int u = 0; u < kRowVecs; ++u)
        if (v + 32 * u < a.vecs) val[u] = __ldcg(src + v + 32 * u);
      for (unsigned left = pairs; left != 0; left &= left - 1) {
        const std::int32_t r = __shfl_sync(0xffffffffu, row, __ffs(left) - 1);
        uint4* dst = a.sorted_a + static_cast<std::int64_t>(r) * a.vecs;
#pragma unroll
        for (int u = 0; u < kRowVecs; ++u)
          if (v + 32 * u < a.vecs) dst[v + 32 * u] = val[u];
      }
    }
  }
}

// Region (s, e) = rank s's pairs of expert e: the rows of e whose gathered
// token lies in [s x cap, (s + 1) x cap), one thread each. The rows of an
// expert hold ascending tokens, so two lower bounds find them. AgMoe's
// regions are the source ranks', MoeRs's the same rows read as destinations.
struct RegionArgs {
  const std::int32_t* expert_offset;  // [E + 1]
  const std::int32_t* row_token;      // [pairs]
  std::int32_t* region_count;         // [W][E]
  std::int32_t* region_first;         // [W][E]
  int world, experts;
  std::int64_t cap;
};

__global__ void regions_kernel(RegionArgs a) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= a.world * a.experts) return;
  const int s = i / a.experts, e = i % a.experts;
  const std::int64_t lo = a.expert_offset[e], hi = a.expert_offset[e + 1];
  const std::int64_t begin = moe_detail::first_row_at_or_after(a.row_token, lo, hi, s * a.cap);
  const std::int64_t end = moe_detail::first_row_at_or_after(a.row_token, begin, hi, (s + 1) * a.cap);
  a.region_first[i] = static_cast<std::int32_t>(begin);
  a.region_count[i] = static_cast<std::int32_t>(end - begin);
}

void launch_regions(const RegionArgs& a, cudaStream_t stream) {
  regions_kernel<<<static_cast<unsigned>((a.world * a.experts + 255) / 256), 256, 0, stream>>>(a);
  WEFT_CUDA(cudaGetLastError());
}

// ---- MoeRs's kernel ---------------------------------------------------------------

struct CombineArgs {
  const std::int32_t* token_row;  // [G][k]
  const float* token_weight;      // [G][k]
  const uint4* y;                 // [max_rows][H]
  uint4* partial;                 // [G][H]
  std::int64_t g_begin, g_end;    // the gathered tokens summed: all G, or one destination's shard
  int k;
  std::int64_t vecs;              // 16-byte vectors of a row
};

// partial[g] = sum over g's slots j ascending of w_j x y[row_j], fp32, one rounding; 0 without pairs.
template <class T>
__global__ void __launch_bounds__(kWarpThreads) combine_kernel(CombineArgs a) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * kWarpsPerBlock;
  for (std::int64_t g = a.g_begin + static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
       g < a.g_end; g += warps) {
    const std::int32_t row = lane < a.k ? a.token_row[g * a.k + lane] : -1;
    const float w = lane < a.k ? a.token_weight[g * a.k + lane] : 0.f;
    const unsigned pairs = __ballot_sync(0xffffffffu, row >= 0);
    uint4* dst = a.partial + g * a.vecs;
    for (std::int64_t v0 = 0; v0 < a.vecs; v0 += 32 * kRowVecs) {  // every lane runs every step (shuffles)
      const std::int64_t v = v0 + lane;
      dev::Acc<T, 16> acc[kRowVecs] = {};
      for (unsigned left = pairs; left != 0; left &= left - 1) {
        const int j = __ffs(left) - 1;
        const std::int32_t r = __shfl_sync(0xffffffffu, row, j);
        const float wj = __shfl_sync(0xffffffffu, w, j);
        const uint4* src = a.y + static_cast<std::int64_t>(r) * a.vecs;
        uint4 val[kRowVecs];
#pragma unroll
        for (int u = 0; u < kRowVecs; ++u)
          if (v + 32 * u < a.vecs) val[u] = __ldcg(src + v + 32 * u);
#pragma unroll
        for (int u = 0; u < kRowVecs; ++u)
          if (v + 32 * u < a.vecs) acc[u].add_scaled(val[u], wj);
      }
#pragma unroll
      for (int u = 0; u < kRowVecs; ++u)
        if (v + 32 * u < a.vecs) dst[v + 32 * u] = acc[u].template pack<uint4>();
    }
  }
}

void launch_combine(const CombineArgs& a, DType dtype, int sms, cudaStream_t stream) {
  const int grid = clamp_grid(a.g_end - a.g_begin, kWarpsPerBlock, 8 * sms);
  if (dtype == DType::bf16) combine_kernel<__nv_bfloat16><<<grid, kWarpThreads, 0, stream>>>(a);
  else combine_kernel<__half><<<grid, kWarpThreads, 0, stream>>>(a);
  WEFT_CUDA(cudaGetLastError());
}

// The overlapped path's last step: out[i] = sum over ranks q = 0..W-1, in that
// order, of source(q)[i] for i < elems (fp32, one rounding): this rank's own
// slice of partial sums for q = me, rank q's pushed slice for the others.
struct RankSumArgs {
  const void* own;       // [cap][H]: this rank's partials of its own tokens
  const void* incoming;  // [W][cap][H]: slot q, rank q's
  void* out;             // [elems]
  std::uint64_t slot_elems, elems;
  int world, me;
};

template <class T>
__global__ void __launch_bounds__(kWarpThreads) rank_sum_kernel(RankSumArgs a) {
  const T* own = static_cast<const T*>(a.own);
  const T* incoming = static_cast<const T*>(a.incoming);
  auto source = [&](int q) { return q == a.me ? own : incoming + static_cast<std::uint64_t>(q) * a.slot_elems; };
  dev::reduce_span(static_cast<T*>(a.out), source, a.world, 0, a.elems,
                   blockIdx.x * blockDim.x + threadIdx.x, gridDim.x * blockDim.x);
}

// ---- options ------------------------------------------------------------------------

// The checks both plans share; "" or why not.
std::string common_error(int experts, std::int64_t hidden, std::int64_t slice, const char* slice_name, int top_k,
                         std::int64_t cap, DType dtype, int max_sms, int world) {
  if (world < 1) return str("world_size = ", world, " must be at least 1");
  if (experts < 1 || experts > kMoeTpMaxExperts)
    return str("experts = ", experts, " must be in [1, ", kMoeTpMaxExperts, "] (the device scan holds one expert a thread)");
  if (hidden <= 0 || hidden % 8 != 0)
    return str("hidden = ", hidden, " must be a positive multiple of 8 (rows move as 16-byte vectors; TMA's 16-byte rows)");
  if (slice <= 0 || slice % 8 != 0)
    return str(slice_name, " = ", slice, " must be a positive multiple of 8 (the grouped GEMM's 16-byte rows)");
  if (top_k < 1 || top_k > kMoeTpMaxTopK)
    return str("top_k = ", top_k, " must be in [1, ", kMoeTpMaxTopK, "] (a token's slots are the lanes of a warp)");
  if (cap <= 0) return str("max_tokens_per_rank = ", cap, " must be positive");
  if (dtype != DType::bf16 && dtype != DType::fp16)
    return str("dtype = ", to_string(dtype), " must be bf16 or fp16 (the grouped GEMM's types)");
  if (max_sms < 0) return str("max_sms = ", max_sms, " must be >= 0 (0: the rank's share of its GPU)");
  // Sorted rows, gathered tokens and row tokens are int32 on the device.
  const std::int64_t limit = (std::int64_t{1} << 31) - 1;
  if (cap > limit / world || moe_detail::gathered_tokens(world, cap) > limit / top_k)
    return str("max_tokens_per_rank = ", cap, " x world ", world, " x top_k ", top_k,
               " pairs must stay below 2^31 (int32 row indices)");
  return "";
}

std::string describe(const AgMoeOptions& o) {
  return str("experts ", o.experts, ", hidden ", o.hidden, ", top_k ", o.top_k, ", max_tokens_per_rank ",
             o.max_tokens_per_rank, ", ", to_string(o.dtype), ", gather ", to_string(o.gather), ", max_sms ",
             o.max_sms, ", mode ", to_string(o.mode));
}
std::string describe(const MoeRsOptions& o) {
  return str("experts ", o.experts, ", hidden ", o.hidden, ", top_k ", o.top_k, ", max_tokens_per_rank ",
             o.max_tokens_per_rank, ", ", to_string(o.dtype), ", scatter ", to_string(o.scatter), ", max_sms ",
             o.max_sms, ", mode ", to_string(o.mode));
}

int sms_for(const Context& ctx, int max_sms) {
  const int share = std::max(1, ctx.team().sm_count);
  return max_sms > 0 ? std::min(max_sms, share) : share;
}

bool aligned(const void* p, std::uintptr_t a) { return reinterpret_cast<std::uintptr_t>(p) % a == 0; }

}  // namespace

// ---- AgMoe ----------------------------------------------------------------------------

std::string AgMoe::can_implement(const AgMoeOptions& o, int world_size) {
  std::string why = common_error(o.experts, o.hidden, o.n_local, "n_local", o.top_k, o.max_tokens_per_rank, o.dtype,
                                 o.max_sms, world_size);
  if (!why.empty()) return why;
  // What the AllGather moves: whole shards, or (mode fused) the routing heads alone.
  const bool heads_only = o.mode == OverlapMode::fused;
  const ShardLayout l = heads_only ? moe_detail::head_layout(o.max_tokens_per_rank, o.top_k)
                                   : moe_detail::shard_layout(o.max_tokens_per_rank, o.top_k, o.hidden,
                                                              static_cast<int>(dtype_size(o.dtype)));
  if (o.gather == AllGatherVariant::low_latency && l.bytes > kAllGatherLowLatencyMaxBytes)
    return str("gather = ll moves ", heads_only ? "routing heads" : "shards", " of at most ",
               kAllGatherLowLatencyMaxBytes, " bytes; max_tokens_per_rank = ", o.max_tokens_per_rank, " at hidden ",
               o.hidden, " and top_k ", o.top_k, " makes ", l.bytes, " (use another variant or fewer tokens)");
  return "";
}

AgMoe::AgMoe(std::shared_ptr<Context> ctx, const AgMoeOptions& options) : ctx_(std::move(ctx)), opt_(options) {
  WEFT_REQUIRE(ctx_, "AgMoe needs a Context");
  const int W = ctx_->world_size();
  // First the description (n_local may differ by rank), so ranks that disagree all hear so; then the
  // options' own checks, which then fail on every rank alike.
  ctx_->verify_same_call(str("AgMoe plan: ", describe(opt_)));
  const std::string why = can_implement(opt_, W);
  WEFT_REQUIRE(why.empty(), "AgMoe: ", why);
  if (opt_.mode == OverlapMode::fused)
    ctx_->require_direct_peers("AgMoe with mode fused (its copies write into every peer's heap)",
                               "use mode sequential, or automatic, which runs the sequential path there");
  sms_ = sms_for(*ctx_, opt_.max_sms);
  const int es = static_cast<int>(dtype_size(opt_.dtype));
  const std::int64_t cap = opt_.max_tokens_per_rank;
  // Every rank agrees on the mode (the description above) and on whether every peer is mapped (the heap's
  // reachability), so every rank makes the same symmetric allocations in the same order.
  const bool overlapped = opt_.mode != OverlapMode::sequential && ctx_->all_peers_direct();
  if (opt_.mode != OverlapMode::fused) {
    const ShardLayout l = moe_detail::shard_layout(cap, opt_.top_k, opt_.hidden, es);
    shards_ = SymmetricBuffer(ctx_->heap(), l.bytes * W, "u8", "ag_moe.shards");
    gather_ = std::make_unique<AllGather>(ctx_, AllGatherOptions{l.bytes, opt_.gather, opt_.max_sms});
  }
  if (overlapped) {
    const ShardLayout hl = moe_detail::head_layout(cap, opt_.top_k);
    heads_ = SymmetricBuffer(ctx_->heap(), hl.bytes * W, "u8", "ag_moe.heads");
    rows_ = SymmetricBuffer(ctx_->heap(), static_cast<std::uint64_t>(W) * cap * opt_.hidden * es, to_string(opt_.dtype),
                            "ag_moe.rows");
    arrived_ = SymmetricBuffer(ctx_->heap(), static_cast<std::uint64_t>(W) * 8, "u64", "ag_moe.arrived");
    head_gather_ = std::make_unique<AllGather>(ctx_, AllGatherOptions{hl.bytes, opt_.gather, opt_.max_sms});
    pipe_ = std::make_unique<ops_detail::CopyPipe>(ctx_, "ag_moe");
  }
  // Timing needs barriers across the ranks, which need every peer mapped; elsewhere weft's AllGather, untimed.
  if (ctx_->all_peers_direct())
    choice_ = std::make_unique<ops_detail::PathChoice>(
        ctx_, overlapped ? opt_.mode : OverlapMode::sequential,
        str("AgMoe E ", opt_.experts, ", H ", opt_.hidden, ", k ", opt_.top_k, ", ", cap, " tokens a rank"), nullptr,
        /*nccl_path=*/false);

  const std::int64_t max_rows = moe_detail::max_pair_rows(W, opt_.max_tokens_per_rank, opt_.top_k);
  std::uint64_t bytes = 0;
  carve(nullptr, W, opt_.max_tokens_per_rank, opt_.top_k, opt_.experts, &bytes);
  scratch_ = DeviceBuffer(bytes);
  WEFT_CUDA(cudaMemset(scratch_.get(), 0, bytes));
  const SortScratch s = carve(scratch_.get(), W, opt_.max_tokens_per_rank, opt_.top_k, opt_.experts, nullptr);
  WEFT_CUDA(cudaMemset(s.error, 0xff, kErrorWords * 8));  // no key, and no key's id
  sorted_a_ = DeviceBuffer(static_cast<std::size_t>(max_rows) * opt_.hidden * es);
  const int count_smem = kCountWarps * opt_.experts * 4;
  if (count_smem > 48 * 1024)
    WEFT_CUDA(cudaFuncSetAttribute(count_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, count_smem));

  routing_.world = W;
  routing_.experts = opt_.experts;
  routing_.top_k = opt_.top_k;
  routing_.capacity = opt_.max_tokens_per_rank;
  routing_.max_rows = max_rows;
  routing_.dtype = opt_.dtype;
  routing_.expert_rows = s.expert_rows;
  routing_.expert_offset = s.expert_offset;
  routing_.row_token = s.row_token;
  routing_.row_slot = s.row_slot;
  routing_.token_row = s.token_row;
  routing_.token_weight = s.token_weight;
  use_slice(opt_.n_local);
  WEFT_CUDA(cudaDeviceSynchronize());  // the memsets above run on the legacy stream; runs use the caller's
}

AgMoe::~AgMoe() = default;

std::string AgMoe::gemm_config() const { return gemm_->config(); }

std::string AgMoe::path() const {
  if (choice_) return choice_->path();
  return runs_ > 0 ? "sequential" : "";
}

void AgMoe::use_slice(std::int64_t n_local) {
  WEFT_REQUIRE(n_local > 0 && n_local % 8 == 0, "AgMoe::use_slice: n_local = ", n_local,
               " must be a positive multiple of 8 (16-byte rows)");
  auto& g = gemms_[n_local];
  if (!g)
    g = std::make_unique<GroupedGemm>(GroupedGemmOptions{.experts = opt_.experts,
                                                         .n = n_local,
                                                         .k = opt_.hidden,
                                                         .max_rows = routing_.max_rows,
                                                         .dtype = opt_.dtype,
                                                         .w_layout = BLayout::nk,
                                                         .max_sms = sms_});
  gemm_ = g.get();
  opt_.n_local = n_local;
}

void AgMoe::run(const void* x, const std::int64_t* topk_idx, const float* topk_weights, std::int64_t num_tokens,
                const void* w_up, void* out, cudaStream_t stream) {
  const std::int64_t cap = opt_.max_tokens_per_rank;
  WEFT_REQUIRE(num_tokens >= 0 && num_tokens <= cap, "AgMoe::run: num_tokens = ", num_tokens,
               " must be in [0, max_tokens_per_rank = ", cap, "]");
  WEFT_REQUIRE(num_tokens == 0 || (x && topk_idx && topk_weights), "AgMoe::run: x, topk_idx and topk_weights are needed for ",
               num_tokens, " tokens");
  WEFT_REQUIRE(num_tokens == 0 || (aligned(x, 16) && aligned(topk_idx, 8) && aligned(topk_weights, 4)),
               "AgMoe::run: x must be 16-byte aligned, topk_idx 8-byte, topk_weights 4-byte");
  WEFT_REQUIRE(w_up && out, "AgMoe::run: w_up [E, n_local, H] and out [max_rows = ", routing_.max_rows,
               ", n_local] are needed");
  WEFT_REQUIRE(aligned(w_up, 16) && aligned(out, 16), "AgMoe::run: w_up and out must be 16-byte aligned");
  if (ctx_->check_calls()) ctx_->verify_same_call(str("AgMoe run #", runs_ + 1));

  if (!choice_) {
    run_sequential(x, topk_idx, topk_weights, num_tokens, w_up, out, stream);
  } else {
    std::vector<ops_detail::FusedPath> fused;
    if (pipe_)
      fused.push_back({"fused, source regions", [&](cudaStream_t s) {
                         run_fused(x, topk_idx, topk_weights, num_tokens, w_up, out, s);
                       }});
    // A fused call's graph holds its pointers, its GEMM (the slice) and its token count (the pushes' bytes).
    const void* token_count = reinterpret_cast<const void*>(static_cast<std::uintptr_t>(num_tokens));
    choice_->run(
        stream, {x, topk_idx, topk_weights, w_up, out, gemm_, token_count},
        [&] { run_sequential(x, topk_idx, topk_weights, num_tokens, w_up, out, stream); },
        fused, [&](bool) { run_sequential(x, topk_idx, topk_weights, num_tokens, w_up, out, stream); });
  }
  ++runs_;
  routing_.run = runs_;
  routing_.num_tokens = num_tokens;
}

void AgMoe::run_sequential(const void* x, const std::int64_t* topk_idx, const float* topk_weights,
                           std::int64_t num_tokens, const void* w_up, void* out, cudaStream_t stream) {
  const int W = ctx_->world_size(), me = ctx_->rank(), k = opt_.top_k;
  const std::int64_t cap = opt_.max_tokens_per_rank;
  const int es = static_cast<int>(dtype_size(opt_.dtype));
  const ShardLayout l = moe_detail::shard_layout(cap, k, opt_.hidden, es);
  const std::int64_t vecs = opt_.hidden * es / 16;
  char* shards = shards_.as<char>();
  char* mine = shards + static_cast<std::uint64_t>(me) * l.bytes;

  PackArgs pa{mine, l, num_tokens, k, vecs, topk_idx, topk_weights, static_cast<const uint4*>(x)};
  pack_kernel<<<clamp_grid(num_tokens * vecs, kWarpThreads, 4 * sms_), kWarpThreads, 0, stream>>>(pa);
  WEFT_CUDA(cudaGetLastError());
  gather_->run(mine, shards, stream);  // in place: this rank's shard is its slot

  const SortScratch s = carve(scratch_.get(), W, cap, k, opt_.experts, nullptr);
  const std::int64_t tokens = moe_detail::gathered_tokens(W, cap);
  SortArgs sa{shards, l, cap, tokens, W, opt_.experts, k, vecs, s, sorted_a_.as<uint4>(), shards + l.x, l.bytes};
  const std::int64_t chunks = moe_detail::sort_chunks(W, cap);
  count_kernel<<<static_cast<unsigned>((chunks + kCountWarps - 1) / kCountWarps), kCountWarps * 32,
                 kCountWarps * opt_.experts * 4, stream>>>(sa);
  WEFT_CUDA(cudaGetLastError());
  scan_kernel<<<1, kScanThreads, 0, stream>>>(sa);
  WEFT_CUDA(cudaGetLastError());
  place_kernel<<<clamp_grid(tokens, kWarpsPerBlock, 8 * sms_), kWarpThreads, 0, stream>>>(sa, 0, tokens, true, true);
  WEFT_CUDA(cudaGetLastError());
  gemm_->run({.a = sorted_a_.get(), .w = w_up, .out = out, .expert_rows = s.expert_rows}, stream);
}

void AgMoe::run_fused(const void* x, const std::int64_t* topk_idx, const float* topk_weights,
                      std::int64_t num_tokens, const void* w_up, void* out, cudaStream_t stream) {
  const int W = ctx_->world_size(), me = ctx_->rank(), k = opt_.top_k, E = opt_.experts;
  const std::int64_t cap = opt_.max_tokens_per_rank;
  const int es = static_cast<int>(dtype_size(opt_.dtype));
  const ShardLayout hl = moe_detail::head_layout(cap, k);
  const std::int64_t vecs = opt_.hidden * es / 16;
  const std::uint64_t row_bytes = static_cast<std::uint64_t>(opt_.hidden) * es;
  const std::uint64_t slot_bytes = static_cast<std::uint64_t>(cap) * row_bytes;
  char* heads = heads_.as<char>();
  char* my_head = heads + static_cast<std::uint64_t>(me) * hl.bytes;
  char* rows = rows_.as<char>();
  auto* arrived = arrived_.as<std::uint64_t>();

  // The head: count, ids and weights (no rows: vecs 0).
  PackArgs pa{my_head, hl, num_tokens, k, 0, topk_idx, topk_weights, nullptr};
  pack_kernel<<<clamp_grid(num_tokens * k, kWarpThreads, 4 * sms_), kWarpThreads, 0, stream>>>(pa);
  WEFT_CUDA(cudaGetLastError());

  // The rows go on the copy engines once every peer said "free", to the
  // peer that needs them soonest first: rank me - 1 takes them at its step 1.
  cudaStream_t side = pipe_->begin(stream);
  for (int i = 1; i < W; ++i) {
    const int peer = (me - i + W) % W;
    ops_detail::push_chunk(ctx_->heap().peer_ptr(rows + me * slot_bytes, peer), x,
                           static_cast<std::uint64_t>(num_tokens) * row_bytes, 0,
                           static_cast<std::uint64_t*>(ctx_->heap().peer_ptr(arrived + me, peer)), side);
  }

  head_gather_->run(my_head, heads, stream);  // in place
  const SortScratch s = carve(scratch_.get(), W, cap, k, E, nullptr);
  const std::int64_t tokens = moe_detail::gathered_tokens(W, cap);
  SortArgs sa{heads, hl, cap, tokens, W, E, k, vecs, s, sorted_a_.as<uint4>(), nullptr, 0};
  const std::int64_t chunks = moe_detail::sort_chunks(W, cap);
  count_kernel<<<static_cast<unsigned>((chunks + kCountWarps - 1) / kCountWarps), kCountWarps * 32, kCountWarps * E * 4,
                 stream>>>(sa);
  WEFT_CUDA(cudaGetLastError());
  scan_kernel<<<1, kScanThreads, 0, stream>>>(sa);
  WEFT_CUDA(cudaGetLastError());
  place_kernel<<<clamp_grid(tokens, kWarpsPerBlock, 8 * sms_), kWarpThreads, 0, stream>>>(sa, 0, tokens, true, false);
  WEFT_CUDA(cudaGetLastError());
  launch_regions({s.expert_offset, s.row_token, s.region_count, s.region_first, W, E, cap}, stream);

  // Per source rank in arrival order: its rows into the sorted A, then the GEMM of its regions.
  for (int i = 0; i < W; ++i) {
    const int src = (me + i) % W;
    if (src != me) ops_detail::wait_from_and_consume(ctx_->world(), arrived + src, 1, src, stream);
    SortArgs one = sa;
    one.rows = src == me ? static_cast<const char*>(x) : rows + src * slot_bytes;
    one.rows_stride = 0;
    place_kernel<<<clamp_grid(cap, kWarpsPerBlock, 8 * sms_), kWarpThreads, 0, stream>>>(one, src * cap,
                                                                                         (src + 1) * cap, false, true);
    WEFT_CUDA(cudaGetLastError());
    gemm_->run({.a = sorted_a_.get(),
                .w = w_up,
                .out = out,
                .expert_rows = s.region_count + static_cast<std::int64_t>(src) * E,
                .expert_first_row = s.region_first + static_cast<std::int64_t>(src) * E},
               stream);
  }
  pipe_->join(stream);  // the pushes have read x: the caller may overwrite it
}

void AgMoe::check_errors(cudaStream_t stream) {
  ctx_->synchronize(stream);
  const SortScratch s = carve(scratch_.get(), ctx_->world_size(), opt_.max_tokens_per_rank, opt_.top_k, opt_.experts, nullptr);
  std::uint64_t e[kErrorWords];
  WEFT_CUDA(cudaMemcpy(e, s.error, sizeof(e), cudaMemcpyDeviceToHost));
  if (e[0] == kNoError) return;
  WEFT_CUDA(cudaMemset(s.error, 0xff, sizeof(e)));
  const std::int64_t g = static_cast<std::int64_t>(e[0] / kMoeTpMaxTopK);
  const std::int64_t cap = opt_.max_tokens_per_rank;
  WEFT_FAIL("AgMoe: rank ", g / cap, "'s token ", g % cap, ", slot ", e[0] % kMoeTpMaxTopK, " has expert id ",
            static_cast<std::int64_t>(e[1]), ", outside [-1, ", opt_.experts,
            "): the pair was left out (ids must be -1 or an expert of [0, experts))");
}

// ---- MoeRs ----------------------------------------------------------------------------

std::string MoeRs::can_implement(const MoeRsOptions& o, int world_size) {
  std::string why = common_error(o.experts, o.hidden, o.k_local, "k_local", o.top_k, o.max_tokens_per_rank, o.dtype,
                                 o.max_sms, world_size);
  if (!why.empty()) return why;
  const std::uint64_t slice = static_cast<std::uint64_t>(o.max_tokens_per_rank) * o.hidden * dtype_size(o.dtype);
  // The fused path builds no ReduceScatter: its variant's limits apply to the other modes only.
  if (o.mode != OverlapMode::fused && o.scatter == ReduceScatterVariant::low_latency &&
      slice > kReduceScatterLowLatencyMaxBytes)
    return str("scatter = ll takes slices of at most ", kReduceScatterLowLatencyMaxBytes,
               " bytes; max_tokens_per_rank = ", o.max_tokens_per_rank, " x hidden ", o.hidden, " makes ", slice,
               " (use another variant or fewer tokens)");
  return "";
}

MoeRs::MoeRs(std::shared_ptr<Context> ctx, const MoeRsOptions& options) : ctx_(std::move(ctx)), opt_(options) {
  WEFT_REQUIRE(ctx_, "MoeRs needs a Context");
  const int W = ctx_->world_size();
  ctx_->verify_same_call(str("MoeRs plan: ", describe(opt_)));
  const std::string why = can_implement(opt_, W);
  WEFT_REQUIRE(why.empty(), "MoeRs: ", why);
  if (opt_.mode == OverlapMode::fused)
    ctx_->require_direct_peers("MoeRs with mode fused (its copies write into every peer's heap)",
                               "use mode sequential, or automatic, which runs the sequential path there");
  sms_ = sms_for(*ctx_, opt_.max_sms);
  const int es = static_cast<int>(dtype_size(opt_.dtype));
  const std::int64_t cap = opt_.max_tokens_per_rank;
  const std::uint64_t slots_bytes = static_cast<std::uint64_t>(W) * cap * opt_.hidden * es;
  max_rows_ = moe_detail::max_pair_rows(W, cap, opt_.top_k);
  partial_ = SymmetricBuffer(ctx_->heap(), slots_bytes, to_string(opt_.dtype), "moe_rs.partial");
  // As AgMoe's: every rank agrees on the mode and on whether every peer is mapped, so the symmetric
  // allocations below come in the same order on every rank.
  const bool overlapped = opt_.mode != OverlapMode::sequential && ctx_->all_peers_direct();
  if (opt_.mode != OverlapMode::fused)
    scatter_ = std::make_unique<ReduceScatter>(
        ctx_, ReduceScatterOptions{static_cast<std::uint64_t>(cap * opt_.hidden), opt_.dtype, opt_.scatter,
                                   opt_.max_sms});
  if (overlapped) {
    incoming_ = SymmetricBuffer(ctx_->heap(), slots_bytes, to_string(opt_.dtype), "moe_rs.incoming");
    arrived_ = SymmetricBuffer(ctx_->heap(), static_cast<std::uint64_t>(W) * 8, "u64", "moe_rs.arrived");
    regions_ = DeviceBuffer(static_cast<std::size_t>(2) * W * opt_.experts * sizeof(std::int32_t));
    pipe_ = std::make_unique<ops_detail::CopyPipe>(ctx_, "moe_rs");
  }
  if (ctx_->all_peers_direct())
    choice_ = std::make_unique<ops_detail::PathChoice>(
        ctx_, overlapped ? opt_.mode : OverlapMode::sequential,
        str("MoeRs E ", opt_.experts, ", H ", opt_.hidden, ", k ", opt_.top_k, ", ", cap, " tokens a rank"), nullptr,
        /*nccl_path=*/false);
  y_ = DeviceBuffer(static_cast<std::size_t>(max_rows_) * opt_.hidden * es);
  use_slice(opt_.k_local);
  WEFT_CUDA(cudaDeviceSynchronize());  // the allocations' set-up, before any run's stream uses them
}

MoeRs::~MoeRs() = default;

std::string MoeRs::gemm_config() const { return gemm_->config(); }

std::string MoeRs::path() const {
  if (choice_) return choice_->path();
  return runs_ > 0 ? "sequential" : "";
}

void MoeRs::use_slice(std::int64_t k_local) {
  WEFT_REQUIRE(k_local > 0 && k_local % 8 == 0, "MoeRs::use_slice: k_local = ", k_local,
               " must be a positive multiple of 8 (16-byte rows)");
  auto& g = gemms_[k_local];
  if (!g)
    g = std::make_unique<GroupedGemm>(GroupedGemmOptions{.experts = opt_.experts,
                                                         .n = opt_.hidden,
                                                         .k = k_local,
                                                         .max_rows = max_rows_,
                                                         .dtype = opt_.dtype,
                                                         .w_layout = BLayout::nk,
                                                         .max_sms = sms_});
  gemm_ = g.get();
  opt_.k_local = k_local;
}

void MoeRs::run(const void* h, const MoeRouting& routing, const void* w_down, void* out, cudaStream_t stream) {
  const int W = ctx_->world_size();
  const std::int64_t cap = opt_.max_tokens_per_rank;
  WEFT_REQUIRE(routing.run != 0, "MoeRs::run: the routing is from no AgMoe run (run AgMoe first, pass its routing())");
  WEFT_REQUIRE(routing.world == W && routing.experts == opt_.experts && routing.top_k == opt_.top_k &&
                   routing.capacity == cap && routing.dtype == opt_.dtype,
               "MoeRs::run: the routing is from a plan of world ", routing.world, ", experts ", routing.experts,
               ", top_k ", routing.top_k, ", max_tokens_per_rank ", routing.capacity, ", ", to_string(routing.dtype),
               "; this plan expects world ", W, ", experts ", opt_.experts, ", top_k ", opt_.top_k,
               ", max_tokens_per_rank ", cap, ", ", to_string(opt_.dtype));
  WEFT_REQUIRE(routing.expert_rows && routing.token_row && routing.token_weight,
               "MoeRs::run: the routing's device maps are null");
  // The overlapped path finds each destination's rows by bisection over the sorted rows' tokens.
  WEFT_REQUIRE(!pipe_ || (routing.expert_offset && routing.row_token), "MoeRs::run: mode ", to_string(opt_.mode),
               " needs the routing's expert_offset and row_token (AgMoe::routing() has them)");
  WEFT_REQUIRE(h && w_down, "MoeRs::run: h [max_rows, k_local] and w_down [E, H, k_local] are needed");
  WEFT_REQUIRE(aligned(h, 16) && aligned(w_down, 16), "MoeRs::run: h and w_down must be 16-byte aligned");
  WEFT_REQUIRE(routing.num_tokens == 0 || out, "MoeRs::run: out is null for ", routing.num_tokens, " tokens");
  if (ctx_->check_calls()) ctx_->verify_same_call(str("MoeRs run #", runs_ + 1));

  if (!choice_) {
    run_sequential(h, routing, w_down, out, stream);
  } else {
    std::vector<ops_detail::FusedPath> fused;
    if (pipe_)
      fused.push_back({"fused, by destination", [&](cudaStream_t s) { run_fused(h, routing, w_down, out, s); }});
    // A fused call's graph holds its pointers (the routing's maps among them), its GEMM (the slice) and
    // the token count (the last sum's extent).
    const void* token_count = reinterpret_cast<const void*>(static_cast<std::uintptr_t>(routing.num_tokens));
    choice_->run(
        stream,
        {h, w_down, out, gemm_, routing.expert_offset, routing.row_token, routing.token_row, routing.token_weight,
         token_count},
        [&] { run_sequential(h, routing, w_down, out, stream); }, fused,
        [&](bool) { run_sequential(h, routing, w_down, out, stream); });
  }
  ++runs_;
}

void MoeRs::run_sequential(const void* h, const MoeRouting& routing, const void* w_down, void* out,
                           cudaStream_t stream) {
  const int W = ctx_->world_size(), me = ctx_->rank();
  const std::int64_t cap = opt_.max_tokens_per_rank;
  gemm_->run({.a = h, .w = w_down, .out = y_.get(), .expert_rows = routing.expert_rows}, stream);
  const int es = static_cast<int>(dtype_size(opt_.dtype));
  const std::int64_t vecs = opt_.hidden * es / 16;
  const std::int64_t tokens = moe_detail::gathered_tokens(W, cap);
  launch_combine({routing.token_row, routing.token_weight, y_.as<const uint4>(), partial_.as<uint4>(), 0, tokens,
                  opt_.top_k, vecs},
                 opt_.dtype, sms_, stream);

  // In place: this rank's slice of the partial sums receives its tokens' sums over the ranks.
  char* slice = partial_.as<char>() + static_cast<std::uint64_t>(me) * cap * opt_.hidden * es;
  scatter_->run(partial_.get(), slice, stream);
  if (routing.num_tokens > 0)
    WEFT_CUDA(cudaMemcpyAsync(out, slice, static_cast<std::size_t>(routing.num_tokens) * opt_.hidden * es,
                              cudaMemcpyDeviceToDevice, stream));
}

void MoeRs::run_fused(const void* h, const MoeRouting& routing, const void* w_down, void* out, cudaStream_t stream) {
  const int W = ctx_->world_size(), me = ctx_->rank(), E = opt_.experts;
  const std::int64_t cap = opt_.max_tokens_per_rank;
  const int es = static_cast<int>(dtype_size(opt_.dtype));
  const std::int64_t vecs = opt_.hidden * es / 16;
  // The destination's token count is on the device only: each push moves the whole shard (as the
  // sequential path's ReduceScatter does); the combine wrote its padding tokens as 0.
  const std::uint64_t slot_bytes = static_cast<std::uint64_t>(cap) * opt_.hidden * es;
  char* partial = partial_.as<char>();
  char* incoming = incoming_.as<char>();
  auto* arrived = arrived_.as<std::uint64_t>();
  auto* region_count = regions_.as<std::int32_t>();
  std::int32_t* region_first = region_count + static_cast<std::int64_t>(W) * E;

  cudaStream_t side = pipe_->begin(stream);
  launch_regions({routing.expert_offset, routing.row_token, region_count, region_first, W, E, cap}, stream);
  // Per destination, the peer after this rank first (every rank starts on a different one), its own last:
  // every slice but its own is on its way while a later GEMM runs.
  for (int i = 1; i <= W; ++i) {
    const int dest = (me + i) % W;
    gemm_->run({.a = h,
                .w = w_down,
                .out = y_.get(),
                .expert_rows = region_count + static_cast<std::int64_t>(dest) * E,
                .expert_first_row = region_first + static_cast<std::int64_t>(dest) * E},
               stream);
    launch_combine({routing.token_row, routing.token_weight, y_.as<const uint4>(), partial_.as<uint4>(), dest * cap,
                    (dest + 1) * cap, opt_.top_k, vecs},
                   opt_.dtype, sms_, stream);
    if (dest == me) continue;
    WEFT_CUDA(cudaEventRecord(combined_, stream));
    WEFT_CUDA(cudaStreamWaitEvent(side, combined_, 0));
    ops_detail::push_chunk(ctx_->heap().peer_ptr(incoming + me * slot_bytes, dest), partial + dest * slot_bytes,
                           slot_bytes, 0, static_cast<std::uint64_t*>(ctx_->heap().peer_ptr(arrived + me, dest)), side);
  }
  // Every peer's slice of this rank's tokens, then their sum in rank order.
  ops_detail::wait_all_and_consume(ctx_->world(), arrived, W, 1, stream);
  if (routing.num_tokens > 0) {
    const auto elems = static_cast<std::uint64_t>(routing.num_tokens) * opt_.hidden;
    RankSumArgs ra{partial + me * slot_bytes, incoming, out, slot_bytes / es, elems, W, me};
    const int grid = clamp_grid(static_cast<std::int64_t>(elems / (16 / es) + 1), kWarpThreads, 4 * sms_);
    if (opt_.dtype == DType::bf16) rank_sum_kernel<__nv_bfloat16><<<grid, kWarpThreads, 0, stream>>>(ra);
    else rank_sum_kernel<__half><<<grid, kWarpThreads, 0, stream>>>(ra);
    WEFT_CUDA(cudaGetLastError());
  }
  pipe_->join(stream);  // the pushes have read the partial buffer: the next run may write it
}

}  // namespace weft
