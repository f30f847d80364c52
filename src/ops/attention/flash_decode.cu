// flash_decode.cu - weft::FlashDecode: the plan, its split-KV attention kernel and the merge of the splits.
//
// First launch, one thread block per (query-head tile, split, KV head, sequence):
//   - 4 warps; a tile of 64 keys is 16 keys per warp. K and V tiles stream
//     through kStages shared-memory stages filled by 16-byte cp.async (rows
//     past the range are zero-filled, never read), so kStages - 1 tiles are
//     in flight while one is computed; at 3 stages two blocks fit on an SM.
//   - S = Q K^T and O += P V on mma.sync m16n8k16: the group's query heads
//     (16 per block, padded with zero rows) are M, so one read of K and V
//     serves every head of the group. Q lives in registers as A fragments;
//     K and V are read from shared memory by ldmatrix (V transposed), rows
//     swizzled (16-byte chunk c of row r at c ^ (r mod 8)) so the 8 rows of
//     an ldmatrix hit 8 different bank groups.
//   - Online softmax in fp32, base 2 (scores pre-multiplied by scale x
//     log2 e); each warp keeps its own max, sum and output over its keys,
//     and the warps merge through shared memory in warp order at the end.
// Second launch (only with more than one split): one warp per (sequence,
// query head) merges the splits' (output, lse) in split order
// (attention_detail::LseMerge), so the result is the same bits every run.
// Both launches use programmatic dependent launch: the merge is scheduled
// while the first launch drains. DecodeMerge::last_block instead counts the
// blocks of each (sequence, KV head, head tile) as they finish; the last one
// merges its splits in the same launch [0064].
//
// Variants, chosen per plan (FlashDecodeOptions; weft-bench decode --sweep
// times them side by side) [0064]: the stage count (3 or 6 at head dim 128),
// the merge (launch, last_block) and, paged, how a tile finds its pages (per
// row, per warp); the defaults are the sweep's winners. The stage count and
// the page lookup change where the bytes come from and when, never the
// arithmetic: their results are the same bits for the same split count.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "decode_split.hpp"
#include "../kernel_util.cuh"
#include "weft/core/error.hpp"
#include "weft/device/signal.cuh"
#include "weft/ops/flash_decode.hpp"

namespace weft {
namespace attention_detail {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kTileKeys = 16 * kWarps;  // each warp takes 16 keys of a tile: one m16n8k16 k-step of P V
constexpr int kHeadsPerBlock = 16;      // the M of the tensor-core products
constexpr int kMaxSplits = 128;
constexpr int kMinKeysPerSplit = 256;   // 4 tiles: below this a split's pipeline never fills
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// The stage counts built at head dim 128 (head dim 64 has 6: 96 KB, two
// blocks per SM; decode_default_stages chooses when the plan leaves it
// open), and what they mean at 32/8 heads, 32K keys, batch 1 (134 MB of K and
// V: 31 us at 4.3 TB/s). A block reads at most (bytes in flight) /
// (latency), about 3 us under load (decode_split.hpp), so the HBM stays busy
// only while enough blocks run; the end of a launch - blocks finishing
// unevenly, fewer and fewer left - is where a short launch loses.
//   3 stages: 96 KB, two blocks per SM, 264 slots: 32 splits, 256 blocks
//     of 1024 keys, 2 tiles (64 KB) in flight per block, 128 KB per SM; the
//     HBM stays busy down to about 200 running blocks (78 %).
//   6 stages (this case's default): 192 KB, one block per SM: 16 splits, 5
//     tiles (160 KB) in flight per block and SM, 2.5x a 3-stage block's
//     reach: the HBM stays busy down to about 80 running blocks (63 %), a
//     shorter tail - at 4 warps an SM instead of 8, the tensor-core and
//     softmax work of a tile has fewer warps to hide behind. On one H200,
//     with the last_block merge, 38.0-39.4 us against 44.2-45.6 for 3
//     stages and the merge launch (SDPA: 49.8).
// Not built: 4 stages (128 KB, 3 tiles in flight per SM) and twice the
// splits, which won no case of the sweep [0064].

/// Shapes of the first launch for head dimension D and S pipeline stages.
template <int D, int S>
struct Tile {
  static constexpr int kChunks = D * 2 / 16;                  // 16-byte chunks per row
  static constexpr int kRowsPerPass = kThreads / kChunks;     // rows one pass of the block loads
  static constexpr int kRowsPerThread = kTileKeys / kRowsPerPass;
  static constexpr int kTileBytes = kTileKeys * D * 2;        // K or V of one tile
  static constexpr int kStages = S;
  static constexpr int kSmemBytes = kStages * 2 * kTileBytes;
  static constexpr int kBlocksPerSm = kSmemBytes <= 113 * 1024 ? 2 : 1;
  // The end-of-block merge of the warps reuses the stages: outputs, then max and sum.
  static constexpr int kMergeBytes = kWarps * kHeadsPerBlock * D * 4 + 2 * kWarps * kHeadsPerBlock * 4;
  // The last_block merge reuses them too: weights [16 heads][splits], then each head's scale and lse.
  static constexpr int kLastMergeBytes = (kHeadsPerBlock * kMaxSplits + 2 * kHeadsPerBlock) * 4;
  static_assert(S >= 2, "a stage computed while the next lands");
  static_assert(kThreads % kChunks == 0 && kTileKeys % kRowsPerPass == 0, "whole rows per pass");
  static_assert(kMergeBytes <= kSmemBytes && kLastMergeBytes <= kSmemBytes,
                "the merges fit in the pipeline's shared memory");
  static_assert(kSmemBytes <= 227 * 1024, "one block per SM at least");
};

/// Where a tile's key rows come from.
enum class Cache {
  contiguous,  // one run per (sequence, KV head)
  paged_rows,  // PageLookup::per_row
  paged_warp   // PageLookup::per_warp
};

struct Params {
  const void* q;
  const void* k;
  const void* v;
  const std::int32_t* kv_lens;
  const std::int32_t* block_table;
  void* out;
  float* lse;
  float* part_o;    // [batch, q_heads, splits, D]
  float* part_lse;  // [batch, q_heads, splits]
  int q_heads, kv_heads, group, head_tiles, splits;
  bool final_output;        // one split, and the caller wants the result: the first launch writes it
  std::int64_t max_kv_len;  // lengths are clamped to the cache's capacity
  int page_size, max_pages;  // paged only
  FastDiv page_div;          // paged: division by page_size
  std::int64_t page_stride, head_stride;  // elements; a key row is D elements
  float scale_log2;  // softmax scale x log2(e)
  // DecodeMerge::last_block: blocks of each (sequence, KV head, head tile) that have written their
  // partial, [batch][kv_heads][head_tiles]; zero between runs. Null: the merge launch (or one split).
  std::uint64_t* arrivals;
};

// Byte offset of 16-byte chunk c of row r in a swizzled tile of D-element rows.
template <int D>
__device__ __forceinline__ int swizzle(int r, int c) {
  return r * (D * 2) + ((c ^ (r & 7)) << 4);
}

__device__ __forceinline__ void cp_async_16(std::uint32_t dst, const void* src, bool valid) {
  // src-size 0 zero-fills the 16 bytes and reads nothing: rows past the range hold zeros, not stale data.
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(std::uint32_t addr, std::uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t addr, std::uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

template <class T>
struct Mma;
template <>
struct Mma<__nv_bfloat16> {
  __device__ __forceinline__ static void run(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                             std::uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ __forceinline__ static std::uint32_t pack(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<std::uint32_t*>(&h);
  }
};
template <>
struct Mma<__half> {
  __device__ __forceinline__ static void run(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                             std::uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ __forceinline__ static std::uint32_t pack(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<std::uint32_t*>(&h);
  }
};

/// Keys [begin, end) of a sequence of `len` keys that split `split` of `splits` reads: ranges of whole
/// tiles (ceil(len / splits) rounded up to a tile), the last ones shorter or empty.
__device__ __forceinline__ void split_range(std::int64_t len, int splits, int split, std::int64_t& begin,
                                            std::int64_t& end) {
  std::int64_t per = (len + splits - 1) / splits;
  per = (per + kTileKeys - 1) / kTileKeys * kTileKeys;
  begin = per * split < len ? per * split : len;
  end = begin + per < len ? begin + per : len;
}

template <class T, int D>
__device__ void merge_splits_in_block(const Params& p, unsigned char* smem, std::int64_t head0, int rows);

template <class T, int D, int S, Cache kCache>
__global__ void __launch_bounds__(kThreads, Tile<D, S>::kBlocksPerSm) flash_decode_kernel(const Params p) {
  using Cfg = Tile<D, S>;
  constexpr bool kPaged = kCache != Cache::contiguous;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ int last_to_arrive;  // DecodeMerge::last_block: this block merges its splits
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, c = lane % 4;  // the mma fragment's row group and column pair
  const int head_tile = blockIdx.x % p.head_tiles, split = blockIdx.x / p.head_tiles;
  const int kvh = blockIdx.y, b = blockIdx.z;
  const int row0 = head_tile * kHeadsPerBlock;                            // first head of the group here
  const int rows = min(kHeadsPerBlock, p.group - row0);                   // heads of this block (<= 16)
  const std::int64_t head0 = std::int64_t{b} * p.q_heads + kvh * p.group + row0;  // (b, first query head)

  dev::pdl_wait();  // q, the cache and the lengths may come from the previous kernel

  std::int64_t len = p.kv_lens ? p.kv_lens[b] : p.max_kv_len;
  len = len < 0 ? 0 : len > p.max_kv_len ? p.max_kv_len : len;
  std::int64_t begin, end;
  split_range(len, p.splits, split, begin, end);
  const int n_tiles = static_cast<int>((end - begin + kTileKeys - 1) / kTileKeys);

  // Q as A fragments, one per 16-dim k-step: rows g and g + 8, columns 2c, 2c + 1 (+ 8). Padded rows are zero.
  std::uint32_t qa[D / 16][4];
  {
    const std::uint32_t* q = static_cast<const std::uint32_t*>(p.q);  // pairs of elements
    const std::int64_t r_lo = (head0 + g) * (D / 2), r_hi = (head0 + g + 8) * (D / 2);
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      const int w = ks * 8 + c;  // pair index of column 16 ks + 2c
      qa[ks][0] = g < rows ? q[r_lo + w] : 0u;
      qa[ks][1] = g + 8 < rows ? q[r_hi + w] : 0u;
      qa[ks][2] = g < rows ? q[r_lo + w + 4] : 0u;
      qa[ks][3] = g + 8 < rows ? q[r_hi + w + 4] : 0u;
    }
  }

  // Loads: thread tid copies chunk tid % kChunks of rows tid / kChunks + j x kRowsPerPass.
  const T* k_base = static_cast<const T*>(p.k) + kvh * p.head_stride;
  const T* v_base = static_cast<const T*>(p.v) + kvh * p.head_stride;
  const int my_chunk = tid % Cfg::kChunks, my_row = tid / Cfg::kChunks;
  const std::uint32_t smem_base = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem));
  // Paged, per row: the page of each of this thread's rows in the next tile to load, fetched one tile
  // ahead so the block-table read is off the path that issues the copies.
  // Paged, per warp: lane l holds the block-table entry of the next tile's l-th page (a tile of 64 keys
  // spans at most 5 pages of 16 or more), read in one coalesced load per warp, one tile ahead; each row
  // takes its page from the lane that holds it. The tile's first page and the offset of its first key
  // in it are kept beside it, so a row's page is (offset + row) / page_size, a multiply-high.
  constexpr int kPageRegs = kCache == Cache::paged_rows ? Cfg::kRowsPerThread : 1;
  int pages[kPageRegs];
  std::uint32_t next_first_page = 0, next_offset = 0;
  const std::int32_t* table = kPaged ? p.block_table + std::int64_t{b} * p.max_pages : nullptr;
  auto fetch_pages = [&](int tile) {
    if constexpr (kCache == Cache::paged_rows) {
#pragma unroll
      for (int j = 0; j < Cfg::kRowsPerThread; ++j) {
        const std::int64_t t = begin + std::int64_t{tile} * kTileKeys + my_row + j * Cfg::kRowsPerPass;
        pages[j] = t < end ? table[static_cast<unsigned>(t) / static_cast<unsigned>(p.page_size)] : 0;  // t < 2^31
      }
    } else if constexpr (kCache == Cache::paged_warp) {
      const std::int64_t t0 = begin + std::int64_t{tile} * kTileKeys;
      pages[0] = 0;
      if (t0 < end) {  // uniform over the block
        const std::int64_t t_last = (t0 + kTileKeys < end ? t0 + kTileKeys : end) - 1;
        next_first_page = p.page_div.div(static_cast<std::uint32_t>(t0));  // keys < 2^31
        next_offset = static_cast<std::uint32_t>(t0) - next_first_page * p.page_div.d;
        const std::uint32_t last_page = p.page_div.div(static_cast<std::uint32_t>(t_last));
        if (static_cast<std::uint32_t>(lane) <= last_page - next_first_page) pages[0] = table[next_first_page + lane];
      }
    }
  };
  auto load_tile = [&](int tile, int stage) {
    const std::int64_t t0 = begin + std::int64_t{tile} * kTileKeys;
    const std::uint32_t k_smem = smem_base + stage * 2 * Cfg::kTileBytes, v_smem = k_smem + Cfg::kTileBytes;
#pragma unroll
    for (int j = 0; j < Cfg::kRowsPerThread; ++j) {
      const int r = my_row + j * Cfg::kRowsPerPass;
      const std::int64_t t = t0 + r;
      const bool valid = t < end;
      std::int64_t off;  // element offset of the row's chunk from the KV head's base
      if constexpr (kCache == Cache::paged_rows) {
        off = std::int64_t{pages[j]} * p.page_stride +
              (valid ? static_cast<unsigned>(t) % static_cast<unsigned>(p.page_size) : 0u) * D + my_chunk * 8;
      } else if constexpr (kCache == Cache::paged_warp) {
        // Every lane takes part in the shuffle; a row past the range reads nothing (src-size 0) and
        // points into the tile's first page (or page 0), an address inside the cache.
        const std::uint32_t at = next_offset + static_cast<std::uint32_t>(r);  // < 256 + 64
        const std::uint32_t page_in_tile = p.page_div.div(at);                 // < 20
        const int page = __shfl_sync(0xffffffffu, pages[0], static_cast<int>(page_in_tile));
        const std::uint32_t key_in_page = valid ? at - page_in_tile * p.page_div.d : 0u;
        off = std::int64_t{valid ? page : 0} * p.page_stride + std::int64_t{key_in_page} * D + my_chunk * 8;
      } else {
        off = std::int64_t{b} * p.page_stride + (valid ? t : 0) * D + my_chunk * 8;
      }
      const int s = swizzle<D>(r, my_chunk);
      cp_async_16(k_smem + s, k_base + off, valid);
      cp_async_16(v_smem + s, v_base + off, valid);
    }
    fetch_pages(tile + 1);
  };

  // Online softmax state of this warp's rows g and g + 8 (base 2); l is this thread's part of the row
  // sum (its columns), summed over the quad at the end.
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;

  fetch_pages(0);
#pragma unroll
  for (int s = 0; s < Cfg::kStages - 1; ++s) {
    if (s < n_tiles) load_tile(s, s);
    cp_async_commit();
  }
  for (int i = 0; i < n_tiles; ++i) {
    cp_async_wait<Cfg::kStages - 2>();  // tile i has landed (this thread's copies)...
    __syncthreads();                    // ...everyone's; and every warp is done with tile i - 1's stage
    if (i + Cfg::kStages - 1 < n_tiles) load_tile(i + Cfg::kStages - 1, (i + Cfg::kStages - 1) % Cfg::kStages);
    cp_async_commit();

    const int stage = i % Cfg::kStages;
    const std::uint32_t k_smem = smem_base + stage * 2 * Cfg::kTileBytes, v_smem = k_smem + Cfg::kTileBytes;
    const int key0 = warp * 16;  // this warp's keys in the tile

    // S [16 heads, 16 keys] = Q K^T: two n-tiles of 8 keys. ldmatrix x4: matrices (keys 0-7, dims lo),
    // (keys 0-7, dims hi), (keys 8-15, dims lo), (keys 8-15, dims hi) of the k-step.
    float s_acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
    {
      const int r = key0 + (lane / 16) * 8 + lane % 8;
      const int half = (lane / 8) % 2;
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        std::uint32_t kb[4];
        ldmatrix_x4(k_smem + swizzle<D>(r, 2 * ks + half), kb);
        Mma<T>::run(s_acc[0], qa[ks], kb[0], kb[1]);
        Mma<T>::run(s_acc[1], qa[ks], kb[2], kb[3]);
      }
    }
    // Scale to base 2, mask keys past the range, and update the running max and sum.
    const std::int64_t t_warp = begin + std::int64_t{i} * kTileKeys + key0;
    float row_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool valid = t_warp + n * 8 + 2 * c + (e & 1) < end;
        s_acc[n][e] = valid ? s_acc[n][e] * p.scale_log2 : -INFINITY;
        row_max[e / 2] = fmaxf(row_max[e / 2], s_acc[n][e]);
      }
    float alpha[2], base[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      row_max[h] = fmaxf(row_max[h], __shfl_xor_sync(0xffffffffu, row_max[h], 1));
      row_max[h] = fmaxf(row_max[h], __shfl_xor_sync(0xffffffffu, row_max[h], 2));
      const float m_new = fmaxf(m[h], row_max[h]);
      base[h] = m_new == -INFINITY ? 0.f : m_new;  // no key yet: exp2(-inf - 0) = 0, never -inf - -inf
      alpha[h] = exp2f(m[h] - base[h]);
      m[h] = m_new;
    }
    float sum[2] = {0.f, 0.f};
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s_acc[n][e] = exp2f(s_acc[n][e] - base[e / 2]);
        sum[e / 2] += s_acc[n][e];
      }
    l[0] = l[0] * alpha[0] + sum[0];
    l[1] = l[1] * alpha[1] + sum[1];
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }
    // P as the A fragment of O += P V (its k = the warp's 16 keys): the S accumulators' layout is the
    // A fragment's, n-tile 0 giving columns 0-7 and n-tile 1 columns 8-15.
    const std::uint32_t pa[4] = {Mma<T>::pack(s_acc[0][0], s_acc[0][1]), Mma<T>::pack(s_acc[0][2], s_acc[0][3]),
                                 Mma<T>::pack(s_acc[1][0], s_acc[1][1]), Mma<T>::pack(s_acc[1][2], s_acc[1][3])};
    // V [16 keys, D]: ldmatrix x4 trans: matrices (keys 0-7, dims lo), (keys 8-15, dims lo),
    // (keys 0-7, dims hi), (keys 8-15, dims hi) of two 8-dim n-tiles.
    {
      const int r = key0 + ((lane / 8) % 2) * 8 + lane % 8;
      const int half = lane / 16;
#pragma unroll
      for (int dn = 0; dn < D / 16; ++dn) {
        std::uint32_t vb[4];
        ldmatrix_x4_trans(v_smem + swizzle<D>(r, 2 * dn + half), vb);
        Mma<T>::run(o[2 * dn], pa, vb[0], vb[1]);
        Mma<T>::run(o[2 * dn + 1], pa, vb[2], vb[3]);
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the stages: the merge below reuses them
  dev::pdl_trigger();

  // Merge the warps: each writes its (max, sum, output) per row; then every thread finishes elements.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
  }
  float* merge_o = reinterpret_cast<float*>(smem);                     // [warp][16][D]
  float* merge_m = merge_o + kWarps * kHeadsPerBlock * D;              // [warp][16]
  float* merge_l = merge_m + kWarps * kHeadsPerBlock;                  // [warp][16]
  {
    float* mine = merge_o + warp * kHeadsPerBlock * D;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      const int d = n * 8 + 2 * c;
      *reinterpret_cast<float2*>(mine + g * D + d) = make_float2(o[n][0], o[n][1]);
      *reinterpret_cast<float2*>(mine + (g + 8) * D + d) = make_float2(o[n][2], o[n][3]);
    }
    if (c == 0) {
      merge_m[warp * kHeadsPerBlock + g] = m[0];
      merge_m[warp * kHeadsPerBlock + g + 8] = m[1];
      merge_l[warp * kHeadsPerBlock + g] = l[0];
      merge_l[warp * kHeadsPerBlock + g + 8] = l[1];
    }
  }
  __syncthreads();
  const bool one_split = p.final_output;
  for (int idx = tid; idx < rows * D; idx += kThreads) {
    const int r = idx / D, d = idx % D;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, merge_m[w * kHeadsPerBlock + r]);
    const float shift = mx == -INFINITY ? 0.f : mx;
    float total = 0.f, acc = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {  // warp order: the same bits every run
      const float f = exp2f(merge_m[w * kHeadsPerBlock + r] - shift);
      total += merge_l[w * kHeadsPerBlock + r] * f;
      acc += merge_o[(w * kHeadsPerBlock + r) * D + d] * f;
    }
    const float value = total > 0.f ? acc / total : 0.f;
    const float lse = total > 0.f ? (shift + log2f(total)) * kLn2 : -INFINITY;  // natural log
    const std::int64_t head = head0 + r;  // b x q_heads + query head
    if (one_split) {
      static_cast<T*>(p.out)[head * D + d] = static_cast<T>(value);
      if (d == 0 && p.lse) p.lse[head] = lse;
    } else {
      const std::int64_t part = head * p.splits + split;
      p.part_o[part * D + d] = value;
      if (d == 0) p.part_lse[part] = lse;
    }
  }
  if (p.arrivals != nullptr) {  // DecodeMerge::last_block
    std::uint64_t* arrivals = p.arrivals + (std::int64_t{b} * p.kv_heads + kvh) * p.head_tiles + head_tile;
    __syncthreads();  // every thread's partial is stored before thread 0's release below
    if (tid == 0) {
      // Device scope, acquire-release: releases this block's partial (the barrier above orders the
      // other threads' stores before it; a release is cumulative) and, in the last block to arrive,
      // acquires every other block's. The barrier below passes that on to the block's threads.
      const std::uint64_t before = dev::atomic_add(arrivals, 1, dev::Scope::gpu, dev::Order::acq_rel);
      last_to_arrive = before == static_cast<std::uint64_t>(p.splits) - 1;
      // Zero for the next run: it reads the counter only after this grid has completed (pdl_wait).
      if (last_to_arrive) dev::st_relaxed(arrivals, 0, dev::Scope::gpu);
    }
    __syncthreads();
    if (last_to_arrive) merge_splits_in_block<T, D>(p, smem, head0, rows);
  }
}

/// DecodeMerge::last_block: the block that completed a (sequence, KV head, head tile) merges that
/// tile's `rows` query heads over every split: per head, the largest lse (exact in any order), each
/// split's weight exp(lse_s - max), their sum in a fixed order (each lane's splits in order, then a
/// butterfly whose partners add the same two values), and the weighted sum of the splits' outputs in
/// split order: the same bits every run. Partials are read from L2 (ld.global.cg): other SMs wrote them.
template <class T, int D>
__device__ void merge_splits_in_block(const Params& p, unsigned char* smem, std::int64_t head0, int rows) {
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int splits = p.splits;
  float* weight = reinterpret_cast<float*>(smem);          // [rows][splits]: the lses, then the weights
  float* scale = weight + kHeadsPerBlock * kMaxSplits;     // [rows]: 1 / sum of the weights
  float* lse = scale + kHeadsPerBlock;                     // [rows]
  const float* part_lse = p.part_lse + head0 * splits;     // the rows' lses are contiguous: [rows][splits]
  for (int i = tid; i < rows * splits; i += kThreads) weight[i] = __ldcg(part_lse + i);
  __syncthreads();
  for (int r = warp; r < rows; r += kWarps) {
    float* w = weight + r * splits;
    float mx = -INFINITY;
    for (int s = lane; s < splits; s += 32) mx = fmaxf(mx, w[s]);
#pragma unroll
    for (int o = 16; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.f;
    for (int s = lane; s < splits; s += 32) {
      const float l = w[s];
      const float e = l == -INFINITY ? 0.f : expf(l - mx);  // an empty split (or all empty: mx = -inf) weighs 0
      w[s] = e;
      sum += e;
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) {
      scale[r] = sum > 0.f ? 1.0f / sum : 0.f;
      lse[r] = sum > 0.f ? mx + logf(sum) : -INFINITY;
    }
  }
  __syncthreads();
  constexpr int kVecs = D / 4;  // float4 per row
  for (int i = tid; i < rows * kVecs; i += kThreads) {
    const int r = i / kVecs, c4 = i % kVecs;
    const float4* o = reinterpret_cast<const float4*>(p.part_o + (head0 + r) * splits * D) + c4;
    const float* w = weight + r * splits;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 8
    for (int s = 0; s < splits; ++s) {  // independent loads: up to 8 in flight
      const float4 v = __ldcg(o + s * kVecs);
      acc.x += w[s] * v.x;
      acc.y += w[s] * v.y;
      acc.z += w[s] * v.z;
      acc.w += w[s] * v.w;
    }
    const float sc = scale[r];
    T* out = static_cast<T*>(p.out) + (head0 + r) * D + 4 * c4;
    out[0] = static_cast<T>(acc.x * sc);
    out[1] = static_cast<T>(acc.y * sc);
    out[2] = static_cast<T>(acc.z * sc);
    out[3] = static_cast<T>(acc.w * sc);
  }
  if (tid < rows && p.lse) p.lse[head0 + tid] = lse[tid];
}

/// One warp per (sequence, query head): merges the splits' partials in split order.
template <class T, int D>
__global__ void __launch_bounds__(128) flash_decode_merge_kernel(const Params p, int rows) {
  dev::pdl_wait();  // the partials come from the first launch
  const int row = blockIdx.x * 4 + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= rows) return;
  constexpr int kPer = D / 32;  // elements per lane
  const float* lse = p.part_lse + std::int64_t{row} * p.splits;
  const float* o = p.part_o + std::int64_t{row} * p.splits * D + lane * kPer;
  LseMerge merge;
#pragma unroll 4
  for (int s = 0; s < p.splits; ++s) {
    float unused;
    merge.add(lse[s], unused);
  }
  // With the largest lse known, every part's weight is exp(lse_s - max): the loads below do not
  // depend on one another, so they overlap.
  float acc[kPer] = {};
#pragma unroll 4
  for (int s = 0; s < p.splits; ++s) {
    const float l_s = lse[s];
    if (l_s == -INFINITY) continue;  // an empty split wrote no output
    const float w = expf(l_s - merge.max_lse);
#pragma unroll
    for (int e = 0; e < kPer; ++e) acc[e] += w * o[std::int64_t{s} * D + e];
  }
  const float scale = merge.output_scale();
  T* out = static_cast<T*>(p.out) + std::int64_t{row} * D + lane * kPer;
#pragma unroll
  for (int e = 0; e < kPer; ++e) out[e] = static_cast<T>(acc[e] * scale);
  if (lane == 0 && p.lse) p.lse[row] = merge.lse();
}

template <class T, int D, int S, Cache kCache>
void launch_attention(const Params& p, dim3 grid, cudaStream_t stream) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = Tile<D, S>::kSmemBytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = ops_detail::pdl_enabled() ? 1 : 0;
  WEFT_CUDA(cudaLaunchKernelEx(&cfg, flash_decode_kernel<T, D, S, kCache>, p));
}

template <class T, int D>
void launch_merge(const Params& p, int rows, cudaStream_t stream) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>((rows + 3) / 4));
  cfg.blockDim = dim3(128);
  cfg.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = ops_detail::pdl_enabled() ? 1 : 0;
  WEFT_CUDA(cudaLaunchKernelEx(&cfg, flash_decode_merge_kernel<T, D>, p, rows));
}

/// A plan's attention kernel: its template arguments, resolved from the options.
struct Variant {
  DType dtype;
  int head_dim, stages;
  Cache cache;
};

int head_tiles(const FlashDecodeOptions& o) {
  return (o.q_heads / o.kv_heads + kHeadsPerBlock - 1) / kHeadsPerBlock;
}

/// Thread blocks of one split: sequences x KV heads x head tiles.
std::int64_t units_per_split(const FlashDecodeOptions& o) {
  return std::int64_t{o.batch} * o.kv_heads * head_tiles(o);
}

/// The plan's kernel on `sm_count` SMs, the options' automatic choices resolved [0064]: the stage
/// count by decode_default_stages, and on paged caches pages per warp (1.10-1.12x pages per row
/// on every paged case of the sweep: one block-table read per warp and tile instead of one per
/// row and thread).
Variant variant_of(const FlashDecodeOptions& o, int sm_count) {
  const bool paged = o.layout == KvLayout::paged;
  Variant v{o.dtype, o.head_dim, o.stages, Cache::contiguous};
  if (v.stages == 0) v.stages = decode_default_stages(!paged, o.head_dim, units_per_split(o), sm_count);
  if (paged) v.cache = o.page_lookup == PageLookup::per_row ? Cache::paged_rows : Cache::paged_warp;
  return v;
}

template <int N>
using Int = std::integral_constant<int, N>;

/// Calls fn(T{}, Int<D>{}, Int<S>{}, std::integral_constant<Cache, C>{}) for the variant (check() has
/// refused stage counts that are not built).
template <class Fn>
void dispatch(const Variant& v, Fn&& fn) {
  auto by_cache = [&](auto t, auto d, auto s) {
    switch (v.cache) {
      case Cache::contiguous: fn(t, d, s, std::integral_constant<Cache, Cache::contiguous>{}); return;
      case Cache::paged_rows: fn(t, d, s, std::integral_constant<Cache, Cache::paged_rows>{}); return;
      case Cache::paged_warp: fn(t, d, s, std::integral_constant<Cache, Cache::paged_warp>{}); return;
    }
  };
  auto by_stages = [&](auto t, auto d) {
    if constexpr (decltype(d)::value == 128) {
      if (v.stages == 6) by_cache(t, d, Int<6>{});
      else by_cache(t, d, Int<3>{});
    } else {
      by_cache(t, d, Int<6>{});
    }
  };
  auto by_dim = [&](auto t) {
    if (v.head_dim == 64) by_stages(t, Int<64>{});
    else by_stages(t, Int<128>{});
  };
  if (v.dtype == DType::fp16) by_dim(__half{});
  else by_dim(__nv_bfloat16{});
}

/// Shared memory of the variant's attention kernel.
int smem_bytes(const Variant& v) {
  int bytes = 0;
  dispatch(v, [&](auto, auto d, auto s, auto) { bytes = Tile<decltype(d)::value, decltype(s)::value>::kSmemBytes; });
  return bytes;
}

std::int64_t capacity(const FlashDecodeOptions& o) {
  return o.layout == KvLayout::paged ? std::int64_t{o.page_size} * o.max_pages_per_seq : o.max_kv_len;
}

}  // namespace
}  // namespace attention_detail

const char* to_string(KvLayout layout) { return layout == KvLayout::paged ? "paged" : "contiguous"; }
const char* to_string(DecodeMerge merge) {
  return merge == DecodeMerge::launch ? "launch" : merge == DecodeMerge::last_block ? "last_block" : "auto";
}
const char* to_string(PageLookup lookup) {
  return lookup == PageLookup::per_row ? "row" : lookup == PageLookup::per_warp ? "warp" : "auto";
}

std::string FlashDecodeOptions::check() const {
  const FlashDecodeOptions& o = *this;
  if (o.batch < 1 || o.batch > 1024) return str("FlashDecode: batch = ", o.batch, " must be 1 to 1024");
  if (o.kv_heads < 1 || o.kv_heads > 16) return str("FlashDecode: kv_heads = ", o.kv_heads, " must be 1 to 16");
  if (o.q_heads < 1 || o.q_heads > 128) return str("FlashDecode: q_heads = ", o.q_heads, " must be 1 to 128");
  if (o.q_heads % o.kv_heads != 0)
    return str("FlashDecode: q_heads = ", o.q_heads, " must be a multiple of kv_heads = ", o.kv_heads,
               " (grouped-query attention: q_heads / kv_heads query heads per KV head)");
  if (o.head_dim != 64 && o.head_dim != 128)
    return str("FlashDecode: head_dim = ", o.head_dim, " is not supported: expected 64 or 128");
  if (o.dtype != DType::bf16 && o.dtype != DType::fp16)
    return str("FlashDecode: dtype = ", to_string(o.dtype), " is not supported: expected bf16 or fp16");
  if (o.layout == KvLayout::contiguous) {
    if (o.max_kv_len < 1 || o.max_kv_len > (std::int64_t{1} << 31) - 1)
      return str("FlashDecode: max_kv_len = ", o.max_kv_len,
                 " must be 1 to 2^31 - 1 with the contiguous layout (the cache's keys per sequence)");
    if (o.page_size != 0 || o.max_pages_per_seq != 0)
      return str("FlashDecode: page_size and max_pages_per_seq are for KvLayout::paged; the contiguous layout ",
                 "takes neither (got ", o.page_size, " and ", o.max_pages_per_seq, ")");
  } else {
    if (o.page_size < 16 || o.page_size > 256)
      return str("FlashDecode: page_size = ", o.page_size, " must be 16 to 256 with the paged layout");
    if (o.max_pages_per_seq < 1)
      return str("FlashDecode: max_pages_per_seq = ", o.max_pages_per_seq,
                 " must be positive with the paged layout (the block table's row length)");
    if (std::int64_t{o.page_size} * o.max_pages_per_seq > (std::int64_t{1} << 31) - 1)
      return str("FlashDecode: page_size x max_pages_per_seq = ", std::int64_t{o.page_size} * o.max_pages_per_seq,
                 " keys must be below 2^31");
    if (o.max_kv_len < 0 || o.max_kv_len > std::int64_t{o.page_size} * o.max_pages_per_seq)
      return str("FlashDecode: max_kv_len = ", o.max_kv_len, " must be 0 (the block table's capacity) to ",
                 "page_size x max_pages_per_seq = ", std::int64_t{o.page_size} * o.max_pages_per_seq);
  }
  if (!(o.softmax_scale >= 0.f) || std::isinf(o.softmax_scale))
    return str("FlashDecode: softmax_scale = ", o.softmax_scale, " must be finite and not negative (0: 1 / sqrt(",
               "head_dim))");
  if (o.splits < 0 || o.splits > attention_detail::kMaxSplits)
    return str("FlashDecode: splits = ", o.splits, " must be 0 (chosen from the SM count) to ",
               attention_detail::kMaxSplits);
  if (o.sm_count < 0) return str("FlashDecode: sm_count = ", o.sm_count, " must be 0 (the device's) or positive");
  const bool built = o.stages == 0 || (o.head_dim == 128 && (o.stages == 3 || o.stages == 6)) ||
                     (o.head_dim == 64 && o.stages == 6);
  if (!built)
    return str("FlashDecode: stages = ", o.stages, " is not built at head_dim = ", o.head_dim, ": expected 0 (the ",
               "default), 3 or 6 at head dim 128, 6 at head dim 64");
  if (o.merge != DecodeMerge::automatic && o.merge != DecodeMerge::launch && o.merge != DecodeMerge::last_block)
    return str("FlashDecode: merge = ", static_cast<int>(o.merge), " is not a DecodeMerge");
  if (o.page_lookup != PageLookup::automatic && o.page_lookup != PageLookup::per_row &&
      o.page_lookup != PageLookup::per_warp)
    return str("FlashDecode: page_lookup = ", static_cast<int>(o.page_lookup), " is not a PageLookup");
  if (o.layout == KvLayout::contiguous && o.page_lookup != PageLookup::automatic)
    return str("FlashDecode: page_lookup = ", to_string(o.page_lookup), " is for KvLayout::paged; the contiguous ",
               "layout takes PageLookup::automatic");
  return "";
}

std::string FlashDecode::can_implement(const FlashDecodeOptions& o) {
  std::string why = o.check();
  if (!why.empty()) return why;
  int device = 0, optin = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    cudaGetLastError();
    return "FlashDecode: no usable CUDA device";
  }
  const int need = attention_detail::smem_bytes(attention_detail::variant_of(o, o.sm_count ? o.sm_count : sms));
  if (optin < need)
    return str("FlashDecode: the kernel needs ", need, " bytes of shared memory per block; this device allows ", optin);
  return "";
}

FlashDecode::FlashDecode(const FlashDecodeOptions& options) : FlashDecode(options, false) {}

FlashDecode::FlashDecode(const FlashDecodeOptions& options, bool partials_only)
    : o_(options), partials_only_(partials_only) {
  using namespace attention_detail;
  const std::string why = can_implement(o_);
  WEFT_REQUIRE(why.empty(), why);
  if (o_.layout == KvLayout::paged && o_.max_kv_len == 0) o_.max_kv_len = capacity(o_);
  int device = 0;
  WEFT_CUDA(cudaGetDevice(&device));
  sm_count_ = o_.sm_count;
  if (sm_count_ == 0) WEFT_CUDA(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device));
  scale_ = o_.softmax_scale > 0.f ? o_.softmax_scale : 1.0f / std::sqrt(static_cast<float>(o_.head_dim));
  const Variant variant = variant_of(o_, sm_count_);
  stages_ = variant.stages;
  page_lookup_ = variant.cache == Cache::paged_warp   ? PageLookup::per_warp
                 : variant.cache == Cache::paged_rows ? PageLookup::per_row
                                                      : PageLookup::automatic;
  // automatic: the last_block merge on contiguous caches (1.01-1.18x the merge launch at batch 1:
  // no second launch's drain), the launch on paged ones (0.994-1.003x there, within noise) [0064].
  merge_ = o_.merge == DecodeMerge::automatic ? (o_.layout == KvLayout::contiguous ? DecodeMerge::last_block
                                                                                     : DecodeMerge::launch)
                                              : o_.merge;
  int per_sm = 0;
  dispatch(variant, [&](auto t, auto d, auto stages, auto cache) {
    using T = decltype(t);
    constexpr int D = decltype(d)::value, S = decltype(stages)::value;
    auto kernel = flash_decode_kernel<T, D, S, decltype(cache)::value>;
    WEFT_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile<D, S>::kSmemBytes));
    WEFT_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, Tile<D, S>::kSmemBytes));
  });
  WEFT_REQUIRE(per_sm >= 1, "FlashDecode: the kernel cannot be resident on this device (occupancy 0)");
  if (o_.splits > 0) {
    splits_ = o_.splits;
  } else {
    const std::int64_t units = units_per_split(o_);
    const std::int64_t by_length = std::max<std::int64_t>(1, o_.max_kv_len / kMinKeysPerSplit);
    splits_ = decode_splits(units, std::int64_t{sm_count_} * per_sm, std::min<std::int64_t>(by_length, kMaxSplits));
  }
  if (splits_ > 1 || partials_only_) {
    const std::uint64_t parts = std::uint64_t(o_.batch) * o_.q_heads * splits_;
    workspace_bytes_ = parts * (o_.head_dim + 1) * sizeof(float);
    if (uses_arrivals()) {
      arrivals_offset_ = (workspace_bytes_ + 7) / 8 * 8;
      workspace_bytes_ = arrivals_offset_ + std::uint64_t(o_.batch) * o_.kv_heads * head_tiles(o_) * 8;
    }
    workspace_ = DeviceBuffer(workspace_bytes_);
    if (uses_arrivals()) {
      // The counters start at zero; each run's last blocks leave them at zero. The plan may run on a
      // non-blocking stream, unordered with the default one: wait for the memset here, at plan time.
      WEFT_CUDA(cudaMemsetAsync(workspace_.as<char>() + arrivals_offset_, 0,
                                workspace_bytes_ - arrivals_offset_, nullptr));
      WEFT_CUDA(cudaStreamSynchronize(nullptr));
    }
  }
}

bool FlashDecode::uses_arrivals() const {
  return merge_ == DecodeMerge::last_block && splits_ > 1 && !partials_only_;
}

FlashDecode::~FlashDecode() = default;

const float* FlashDecode::partial_lses() const {
  return partial_outputs() + std::uint64_t(o_.batch) * o_.q_heads * splits_ * o_.head_dim;
}

std::uint64_t FlashDecode::kv_bytes(std::int64_t total_keys) const {
  return 2ull * static_cast<std::uint64_t>(total_keys) * o_.kv_heads * o_.head_dim * dtype_size(o_.dtype);
}

void FlashDecode::run(const FlashDecodeArgs& a, cudaStream_t stream) {
  using namespace attention_detail;
  auto aligned = [](const void* ptr, std::uintptr_t n) { return reinterpret_cast<std::uintptr_t>(ptr) % n == 0; };
  const struct {
    const void* ptr;
    const char* name;
  } tensors[] = {{a.q, "q"}, {a.k, "k"}, {a.v, "v"}, {partials_only_ ? a.q : a.out, "out"}};
  for (const auto& t : tensors) {
    WEFT_REQUIRE(t.ptr != nullptr, "FlashDecode::run: ", t.name, " must not be null");
    WEFT_REQUIRE(aligned(t.ptr, 16), "FlashDecode::run: ", t.name, " must be 16-byte aligned (got ", t.ptr, ")");
  }
  WEFT_REQUIRE(aligned(a.lse, 4), "FlashDecode::run: lse must be 4-byte aligned (got ", static_cast<void*>(a.lse), ")");
  WEFT_REQUIRE(aligned(a.kv_lens, 4), "FlashDecode::run: kv_lens must be 4-byte aligned");
  if (o_.layout == KvLayout::paged) {
    WEFT_REQUIRE(a.block_table != nullptr,
                 "FlashDecode::run: block_table must not be null with KvLayout::paged (int32 [batch, ",
                 o_.max_pages_per_seq, "])");
    WEFT_REQUIRE(a.kv_lens != nullptr,
                 "FlashDecode::run: kv_lens must not be null with KvLayout::paged (int32 [batch]: each ",
                 "sequence's keys)");
    WEFT_REQUIRE(aligned(a.block_table, 4), "FlashDecode::run: block_table must be 4-byte aligned");
  } else {
    WEFT_REQUIRE(a.block_table == nullptr,
                 "FlashDecode::run: block_table is for KvLayout::paged; this plan's layout is contiguous");
  }
  Params p{};
  p.q = a.q;
  p.k = a.k;
  p.v = a.v;
  p.kv_lens = a.kv_lens;
  p.block_table = a.block_table;
  p.out = a.out;
  p.lse = a.lse;
  p.q_heads = o_.q_heads;
  p.kv_heads = o_.kv_heads;
  p.group = o_.q_heads / o_.kv_heads;
  p.head_tiles = head_tiles(o_);
  p.splits = splits_;
  p.final_output = splits_ == 1 && !partials_only_;
  p.max_kv_len = capacity(o_);
  if (o_.layout == KvLayout::paged) {
    p.page_size = o_.page_size;
    p.max_pages = o_.max_pages_per_seq;
    p.head_stride = std::int64_t{o_.page_size} * o_.head_dim;
    p.page_stride = p.head_stride * o_.kv_heads;
  } else {
    p.page_size = 0;
    p.max_pages = 0;
    p.head_stride = o_.max_kv_len * o_.head_dim;  // a sequence is the contiguous layout's "page"
    p.page_stride = p.head_stride * o_.kv_heads;
  }
  p.scale_log2 = scale_ * kLog2e;
  if (workspace_.get()) {
    const std::uint64_t parts = std::uint64_t(o_.batch) * o_.q_heads * splits_;
    p.part_o = workspace_.as<float>();
    p.part_lse = p.part_o + parts * o_.head_dim;
  }
  p.arrivals = uses_arrivals()
                   ? reinterpret_cast<std::uint64_t*>(workspace_.as<char>() + arrivals_offset_)
                   : nullptr;
  if (o_.layout == KvLayout::paged) p.page_div = FastDiv::make(static_cast<std::uint32_t>(o_.page_size));
  const dim3 grid(static_cast<unsigned>(p.head_tiles * splits_), static_cast<unsigned>(o_.kv_heads),
                  static_cast<unsigned>(o_.batch));
  dispatch(variant_of(o_, sm_count_), [&](auto t, auto d, auto stages, auto cache) {
    using T = decltype(t);
    constexpr int D = decltype(d)::value;
    launch_attention<T, D, decltype(stages)::value, decltype(cache)::value>(p, grid, stream);
    if (splits_ > 1 && !partials_only_ && !p.arrivals) launch_merge<T, D>(p, o_.batch * o_.q_heads, stream);
  });
}

}  // namespace weft
