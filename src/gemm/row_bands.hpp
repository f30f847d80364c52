// row_bands.hpp (private) - the arithmetic of a hooked GEMM's stored-row reports
// (weft::RowsDone), shared by the kernel (device) and the CPU tests (host).
//
// A band is rows [band * per, (band + 1) * per) of C. A tile covering rows
// [row0, row1) and `cols` columns adds rows_in_band(...) x cols to the band's
// counter, for every band it touches; over all tiles, a band's counter then
// reaches band_stored_value(...) exactly, whatever the tile shape. Which
// warp may report: issues_tma_stores.
#pragma once

#include <cstdint>

#include "weft/device/types.cuh"

namespace weft::gemm_detail {

/// Rows of [row0, row1) that fall in band `band` of `per` rows.
WEFT_HD std::int64_t rows_in_band(std::int64_t row0, std::int64_t row1, std::int64_t band, std::int64_t per) {
  const std::int64_t lo = row0 > band * per ? row0 : band * per;
  const std::int64_t hi = row1 < (band + 1) * per ? row1 : (band + 1) * per;
  return hi > lo ? hi - lo : 0;
}

/// The counter value of band `band` once every tile of an M x N product has stored it.
WEFT_HD std::uint64_t band_stored_value(std::int64_t band, std::int64_t per, std::int64_t m, std::int64_t n) {
  return static_cast<std::uint64_t>(rows_in_band(0, m, band, per) * n);  // RowsDone::complete_value
}

/// True for a CTA warp whose elected lane issues a tile's TMA stores in
/// CUTLASS's sm90 warp-specialised kernels. The epilogue issues from the
/// thread whose MMA index (threadIdx.x % mma_threads) lies in warp 0
/// (`issue_tma_store` in sm90_epilogue_tma_warpspecialized.hpp and its
/// ptr-array twin), and the MMA warpgroups follow `load_threads` producer
/// threads. The cooperative kernel (128 load threads, 256 MMA threads) stores
/// from CTA warp 8: thread 256 is MMA thread 0, thread 128 is MMA thread 128.
/// The pingpong kernel (128 MMA threads per consumer warpgroup) stores from
/// warps 4 and 8, each for its own tiles. Only the issuing warp's lanes hold
/// the stores' bulk async-groups, so only that warp can wait for them to
/// complete before it reports the rows.
WEFT_HD constexpr bool issues_tma_stores(int warp, int load_threads, int mma_threads) {
  return warp * 32 >= load_threads && (warp * 32) % mma_threads < 32;
}

/// The first CTA warp that issues TMA stores (issues_tma_stores): the
/// cooperative kernel's only one, 8.
WEFT_HD constexpr int first_tma_store_warp(int load_threads, int mma_threads) {
  int warp = load_threads / 32;
  while (!issues_tma_stores(warp, load_threads, mma_threads)) ++warp;
  return warp;
}

}  // namespace weft::gemm_detail
