// row_sums.cuh - a warp's weighted sum of bf16 rows, in a fixed order, with loads kept in flight.
//
// Both combines (throughput and low-latency mode) sum, per token, a short
// list of rows of H bf16 channels: w x y over the token's pairs, or the
// partial sums from the ranks it went to. A warp owns a token; each lane
// owns kVecs 16-byte vectors of every row (channels v, v + 32, ..., in
// vectors). One load in flight per lane leaves HBM mostly idle (about
// 4 KiB per SM where some 20 KiB are needed to cover the latency), so the
// next row's vectors are loaded before the current row's are added: 2 x kVecs
// loads in flight per lane. The additions keep their order (row 0, 1, ...,
// each in fp32), so the result is the same, bit for bit, as a plain loop.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "weft/device/reduce.cuh"

namespace weft::moe_detail {

/// 16-byte vectors each lane loads per row and per step.
constexpr int kRowSumVecs = 4;

/// The sums of one step: kRowSumVecs vectors of 8 bf16 channels, as fp32.
using RowSumAcc = dev::Acc<__nv_bfloat16, 16>[kRowSumVecs];

/// Adds one row per set bit j of `rows` (warp-uniform), in ascending j:
/// row j's vectors at row_at(j)[v + 32 u] for u < kRowSumVecs (those below
/// `vecs`), times weight(j) when kWeighted. Every lane of the warp calls it
/// with the same mask (row_at and weight may shuffle from lane j); acc starts
/// as the caller set it.
template <bool kWeighted, class RowAt, class Weight>
__device__ __forceinline__ void add_rows(RowSumAcc& acc, unsigned rows, RowAt row_at, Weight weight, std::int64_t v,
                                         std::int64_t vecs) {
  if (rows == 0) return;
  uint4 cur[kRowSumVecs], next[kRowSumVecs];
  auto load = [&](int j, uint4 (&dst)[kRowSumVecs]) {
    const uint4* row = row_at(j);
#pragma unroll
    for (int u = 0; u < kRowSumVecs; ++u)
      if (v + 32 * u < vecs) dst[u] = __ldcg(row + v + 32 * u);
  };
  int j = __ffs(rows) - 1;
  load(j, cur);
  float w = kWeighted ? weight(j) : 1.f;
  for (unsigned left = rows & (rows - 1);; left &= left - 1) {
    const int j_next = left != 0 ? __ffs(left) - 1 : -1;
    float w_next = 0.f;
    if (j_next >= 0) {  // warp-uniform: the next row's loads go out before this row's adds
      load(j_next, next);
      if constexpr (kWeighted) w_next = weight(j_next);
    }
#pragma unroll
    for (int u = 0; u < kRowSumVecs; ++u) {
      if (v + 32 * u >= vecs) continue;
      if constexpr (kWeighted) acc[u].add_scaled(cur[u], w);
      else acc[u].add(cur[u]);
    }
    if (j_next < 0) break;
#pragma unroll
    for (int u = 0; u < kRowSumVecs; ++u) cur[u] = next[u];
    w = w_next;
  }
}

/// Stores the rounded sums of one step at dst[v + 32 u].
__device__ __forceinline__ void store_rows(uint4* dst, const RowSumAcc& acc, std::int64_t v, std::int64_t vecs) {
#pragma unroll
  for (int u = 0; u < kRowSumVecs; ++u)
    if (v + 32 * u < vecs) dst[v + 32 * u] = acc[u].pack<uint4>();
}

}  // namespace weft::moe_detail
