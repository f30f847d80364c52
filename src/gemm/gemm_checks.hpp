// gemm_checks.hpp (private) - what weft::Gemm checks before it launches
// anything: a plan's HookLayout against its hook, and a run's operands against
// the plan (Gemm::can_implement). Plain functions of the options and
// arguments, so the CPU tests run every refusal without a GPU.
#pragma once

#include <string>

#include "weft/gemm/gemm.hpp"

namespace weft::gemm_detail {

/// Every configuration's tile is at most this tall: a row range that starts
/// and ends on a multiple of it holds whole tiles, whichever runs.
inline constexpr std::int64_t kTallestTileRows = 256;

/// "" if the plan's HookLayout fits its hook (and GemmOptions::any_tile_order),
/// else what was expected.
std::string hook_layout_error(const GemmOptions& o);

/// "" if a plan of options `o` can run `args`, else what was expected: the
/// operands' presence and alignment (whole elements where the shape runs on
/// cuBLAS alone, `cublas_only`; 16 bytes for TMA otherwise), the epilogue the
/// hook computes and its row ranges, a wait with the plan's flag granularity,
/// a report with its band size, and the tile walk's first row.
std::string run_args_error(const GemmOptions& o, bool cublas_only, const GemmArgs& args);

}  // namespace weft::gemm_detail
