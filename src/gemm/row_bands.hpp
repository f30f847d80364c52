// row_bands.hpp (private) - the arithmetic of a hooked GEMM's stored-row reports
// (weft::RowsDone), shared by the kernel (device) and the CPU tests (host).
//
// A band is rows [band * per, (band + 1) * per) of C. A tile covering rows
// [row0, row1) and `cols` columns adds rows_in_band(...) x cols to the band's
// counter, for every band it touches; over all tiles, a band's counter then
// reaches band_stored_value(...) exactly, whatever the tile shape.
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

}  // namespace weft::gemm_detail
