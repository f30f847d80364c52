// chunk_scan.cuh (private) - the sorts' column scan: where each chunk's rows of one key start.
#pragma once

#include <cstdint>

namespace weft::ops_detail {

/// counts is a [chunks, cols] matrix of per-chunk counts (rows of `cols`,
/// chunk-major). Replaces column `col` with its exclusive prefix sums down
/// the chunks and returns the column's total. One thread per column, which
/// keeps `kBatch` loads in flight: each sum waits on its load, so a load at a
/// time would serialise the column on memory latency.
__device__ inline std::int32_t exclusive_scan_column(std::int32_t* counts, std::int64_t chunks, std::int64_t cols,
                                                     std::int64_t col) {
  constexpr int kBatch = 8;
  std::int32_t total = 0;
  for (std::int64_t c0 = 0; c0 < chunks; c0 += kBatch) {
    std::int32_t v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) v[u] = c0 + u < chunks ? counts[(c0 + u) * cols + col] : 0;
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (c0 + u < chunks) counts[(c0 + u) * cols + col] = total;
      total += v[u];
    }
  }
  return total;
}

}  // namespace weft::ops_detail
