// weft/gemm/gemm_types.hpp - the names a GEMM kernel is compiled for: the B
// layout and the communication hook. Kept apart from gemm.hpp's plan and run
// arguments so the kernel translation units (one per configuration) depend on
// these names only.
#pragma once

namespace weft {

/// How B is stored.
enum class BLayout {
  nk,  ///< [N, K] row-major: C = A x B^T (PyTorch Linear weight)
  kn   ///< [K, N] row-major: C = A x B
};

/// The communication hook a plan's kernels carry (used by the overlapped
/// operators; plain GEMMs leave it at none). Every hooked plan can also report
/// the rows it has stored (GemmArgs::report), in bands its HookLayout names.
enum class GemmHook {
  none,          ///< a plain persistent GEMM
  wait_a_rows,   ///< before loading a tile's rows of A, wait for their flags (AllGather + GEMM)
  wait_source_rows,  ///< D = A x B + S (AddSource); before loading a tile's rows of S, wait for their flags (GEMM + ReduceScatter)
  report_rows,   ///< no wait: only report stored rows (a ring step whose output is sent on)
  /// Rows of A x B are added by TMA reduce-add into a matrix whose rows
  /// already hold a partial sum (ReduceAddRows: one bf16 rounding of the two
  /// bf16 values); the other rows are stored into C. A tile of the added rows
  /// first waits, in the mainloop's producer warp, for the flags of its rows
  /// (GemmArgs::wait: the partial sum has landed), and every tile reports its
  /// rows once its stores or adds are complete (GemmArgs::report). GEMM +
  /// ReduceScatter at 2 ranks in one launch (GemmRs, FusedWay::one_launch_add).
  add_rows
};

}  // namespace weft
