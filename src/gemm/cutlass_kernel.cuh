// cutlass_kernel.cuh (private) - builds one sm_90a GEMM from CUTLASS's collective builders.
//
// CUTLASS 3 supplies the Hopper pieces weft does not rewrite: the TMA + wgmma
// warp-specialised mainloop, the persistent tile scheduler, the TMA-store
// epilogue. A Kernel<...> instantiation is one configuration; its static
// functions match gemm_detail::Config.
#pragma once

#include "config.hpp"
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"
#include "source_rows.cuh"
#include "tile_hooks.cuh"

namespace weft::gemm_detail {

// add_rows.cuh: included by the configurations that add rows (kAddRows), before this file.
template <class Base>
struct StoreOrAddEpilogue;

/// `Source` = void: D = A x B. Source = Out: D = A x B + source, except on
/// Problem::no_source_* rows (source_rows.cuh).
/// Scheduler = HookedSchedulerTag: the tile order rotates, the producer warp of
/// one load collective waits on row flags (tile_hooks.cuh: the mainloop's for
/// A rows, the epilogue's for source rows), and cooperative kernels report stored rows.
/// kSwapAB (plain, B as [N, K] only): CUTLASS computes D^T = B x A^T, so its
/// tile's M runs along our N and its N along our M, where wgmma takes any
/// multiple of 8: a TN of 144 covers M = 1000 in 7 tile rows (1008), where
/// 128-row tiles need 8 (1024) and leave the last wave 39 % full at N = 14336
/// (cuBLAS's choice there: 256x144, cluster 2x1, in its column-major view).
/// Its tile scheduler's M and N (swizzle, raster) are ours swapped too.
/// kAddRows (hooked, cooperative, no source): the tiles of Problem::add_* rows
/// are added into Problem::add_into by TMA reduce-add, the others stored to C
/// (add_rows.cuh); their mainloop producer waits on the row flags.
template <class In, class Out, class LayoutB, int TM, int TN, int TK, int CM, int CN, bool kCooperative,
          class Scheduler = cutlass::gemm::PersistentScheduler, class Source = void, bool kSwapAB = false,
          bool kAddRows = false>
struct Kernel {
  static constexpr bool kAddsRows = kAddRows;
  static constexpr bool kHooked = std::is_same_v<Scheduler, HookedSchedulerTag>;
  static constexpr bool kWithSource = !std::is_void_v<Source>;
  static_assert(!kSwapAB || (!kHooked && !kWithSource && std::is_same_v<LayoutB, cutlass::layout::ColumnMajor>),
                "swapped operands: plain kernels with B as [N, K] only (A [M, K] is then K-major as B^T's operand)");
  static_assert(!kAddRows || (kHooked && kCooperative && !kWithSource),
                "added rows: hooked cooperative kernels (they report stored rows) without a source");
  // D^T column-major is D row-major.
  using LayoutD = std::conditional_t<kSwapAB, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  static constexpr int kClusterM = kSwapAB ? CN : CM;  // CTAs per cluster along our M (Config::cluster_m)
  static constexpr int kClusterN = kSwapAB ? CM : CN;
  using TileShape = cute::Shape<cute::Int<TM>, cute::Int<TN>, cute::Int<TK>>;
  using ClusterShape = cute::Shape<cute::Int<CM>, cute::Int<CN>, cute::_1>;
  using MainSchedule = std::conditional_t<kCooperative, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                                          cutlass::gemm::KernelTmaWarpSpecializedPingpong>;
  using EpiSchedule = std::conditional_t<kCooperative, cutlass::epilogue::TmaWarpSpecializedCooperative,
                                         cutlass::epilogue::TmaWarpSpecialized>;
  static constexpr int kAlignIn = 16 / sizeof(In);
  static constexpr int kAlignOut = 16 / sizeof(Out);
  using Fusion = std::conditional_t<kWithSource, AddSourceOutsideRows<Out>,
                                    cutlass::epilogue::fusion::LinearCombination<Out, float, Source, float>>;
  using BuiltEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, Source, LayoutD, kAlignOut, Out, LayoutD,
      kAlignOut, EpiSchedule, Fusion>::CollectiveOp;
  // Hooked configurations wait in their load collectives (tile_hooks.cuh):
  // the mainloop's for A rows, the epilogue's for source rows.
  using Epilogue = std::conditional_t<kHooked && kWithSource, WaitingEpilogue<BuiltEpilogue>,
                                      std::conditional_t<kAddRows, StoreOrAddEpilogue<BuiltEpilogue>, BuiltEpilogue>>;
  using BuiltMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, In, cutlass::layout::RowMajor, kAlignIn, In, LayoutB,
      kAlignIn, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      MainSchedule>::CollectiveOp;
  // One wgmma spans the tile's N. A width that is not a power of two (144)
  // needs CuTe's extended shapes (CMakeLists.txt); without them CuTe falls
  // back to 16-wide wgmmas, and the swapped 144x256 tile ran at half speed.
  static_assert(cute::size<1>(typename BuiltMainloop::TiledMma::AtomShape_MNK{}) == TN,
                "wgmma narrower than the tile: build with CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED");
  using Mainloop = std::conditional_t<kHooked, WaitingMainloop<BuiltMainloop>, BuiltMainloop>;
  // The hooked scheduler reports a tile once at most one tile's worth of TMA
  // store groups (one per epilogue sub-tile) is in flight, from the warp that
  // issued them: MMA warp 0, after the one load warpgroup (row_bands.hpp).
  static constexpr int kStoreGroupsPerTile = (TM * TN) / decltype(cute::size(typename Epilogue::EpilogueTile{}))::value;
  static constexpr int kMmaThreads = decltype(cute::size(typename BuiltMainloop::TiledMma{}))::value;
  static constexpr int kStoreWarp = first_tma_store_warp(128, kMmaThreads);
  // Reporting stored rows needs the one store warp of the cooperative kernel;
  // the pingpong kernel's two consumer warpgroups store in turn, so its
  // hooked configurations wait (A rows, source rows) but do not report.
  static constexpr bool kReports = kHooked && kCooperative;
  using KernelScheduler = std::conditional_t<kHooked, HookedSchedulerFor<kStoreGroupsPerTile, kStoreWarp>, Scheduler>;
  using GemmKernel =
      cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop, Epilogue, KernelScheduler>;
  static_assert(!kHooked || (GemmKernel::NumLoadWarpGroups == 1 && GemmKernel::NumMMAThreads == kMmaThreads),
                "the hooked scheduler's store warp assumes one load warpgroup and the mainloop's MMA threads");
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

  static typename Gemm::Arguments arguments(const Problem& p) {
    // Swapped, CUTLASS's problem is N x M x K with B first (kSwapAB).
    const int m = static_cast<int>(kSwapAB ? p.n : p.m), n = static_cast<int>(kSwapAB ? p.m : p.n);
    const int k = static_cast<int>(p.k);
    auto sa = cutlass::make_cute_packed_stride(typename GemmKernel::StrideA{}, cute::make_shape(m, k, 1));
    auto sb = cutlass::make_cute_packed_stride(typename GemmKernel::StrideB{}, cute::make_shape(n, k, 1));
    auto sd = cutlass::make_cute_packed_stride(typename GemmKernel::StrideD{}, cute::make_shape(m, n, 1));
    cutlass::KernelHardwareInfo hw;
    hw.sm_count = whole_cluster_sms(p.sm_count, CM * CN);
    typename BuiltMainloop::Arguments mainloop{static_cast<const In*>(kSwapAB ? p.b : p.a), sa,
                                               static_cast<const In*>(kSwapAB ? p.a : p.b), sb};
    typename BuiltEpilogue::Arguments epilogue{
        {}, static_cast<const Out*>(kWithSource ? p.source : nullptr), sd, static_cast<Out*>(p.c), sd};
    if constexpr (kWithSource) epilogue.thread.op_0 = NoSourceRows{p.no_source_begin, p.no_source_end};
    else epilogue.thread.alpha = 1.0f;  // beta stays 0
    typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm, {m, n, k, 1}, {}, {}, hw};
    if constexpr (std::is_same_v<Mainloop, BuiltMainloop>) args.mainloop = mainloop;
    else args.mainloop = {mainloop, waits_in(p, WaitIn::mainloop)};
    if constexpr (kAddRows) args.epilogue = Epilogue::arguments(epilogue, p.add_into, p.add_begin, p.add_end);
    else if constexpr (std::is_same_v<Epilogue, BuiltEpilogue>) args.epilogue = epilogue;
    else args.epilogue = {epilogue, waits_in(p, WaitIn::epilogue)};
    using Raster = cutlass::gemm::kernel::detail::RasterOrderOptions;
    args.scheduler.max_swizzle_size = p.swizzle;
    args.scheduler.raster_order = p.raster == 1 ? Raster::AlongM : p.raster == 2 ? Raster::AlongN : Raster::Heuristic;
    if constexpr (kHooked) {
      args.scheduler.rotate_rows = p.wait.rotate_rows;
      args.scheduler.descending_block_rows = p.wait.descending_block_rows;
      args.scheduler.done = p.wait.done;
      args.scheduler.rows_per_done = p.wait.rows_per_done;
    }
    return args;
  }
  /// A walk by descending blocks (tile_walk.hpp) keeps each block's tiles
  /// together in the walk: the blocks tile M, and a swizzle band (whose tiles
  /// the scheduler interleaves) and a cluster never cross a block's edge.
  static bool descending_blocks_fit(const Problem& p) {
    const std::int64_t rows = p.wait.descending_block_rows;
    const std::int64_t band = static_cast<std::int64_t>(p.swizzle > 1 ? p.swizzle : 1) * CM * TM;
    return kHooked && !kSwapAB && rows > 0 && p.m % rows == 0 && rows % band == 0 && p.wait.rotate_rows % rows == 0;
  }
  /// The run's waits for the collective `in`; none for the other: only the warp that waits gets the flags.
  static TileWaitParams waits_in(const Problem& p, WaitIn in) {
    return p.wait.wait_in == in ? p.wait : TileWaitParams{};
  }
  static std::size_t workspace(const Problem& p) { return Gemm::get_workspace_size(arguments(p)); }
  static const char* check(const Problem& p) {
    if (kWithSource && !p.source) return "this configuration adds a source matrix, and none was given";
    if (kHooked && !kWithSource && p.wait.flags && p.wait.wait_in == WaitIn::epilogue)
      return "waiting for source rows needs a configuration that adds a source";
    if (!kAddRows && p.add_begin != p.add_end) return "adding rows into another matrix needs a configuration that adds";
    if (kHooked && p.raster == 1 && (p.wait.done || p.wait.rotate_rows || p.wait.descending_block_rows))
      return "hooked runs that rotate the tile order or report stored rows keep the row-major order (raster along N)";
    if (p.wait.descending_block_rows && !descending_blocks_fit(p))
      return "a walk by descending blocks needs M a multiple of the blocks and blocks of whole swizzle bands "
             "(swizzle x cluster x tile rows), so no band mixes two blocks";
    return Gemm::can_implement(arguments(p)) == cutlass::Status::kSuccess ? "" : "CUTLASS cannot implement this problem";
  }
  static const char* run(const Problem& p, cudaStream_t stream) {
    Gemm gemm;
    auto args = arguments(p);
    cutlass::Status s = gemm.initialize(args, p.workspace, stream);
    if (s == cutlass::Status::kSuccess) s = gemm.run(stream);
    return s == cutlass::Status::kSuccess ? "" : cutlass::cutlassGetStatusString(s);
  }
};

/// A Config for Kernel<...>.
template <class K>
constexpr Config make_config(DType in, DType out, BLayout layout, const char* name, int tm, int tn) {
  return Config{in,          out,        layout,         name,         tm,       tn,         K::kClusterM, K::kClusterN, K::kHooked,
                K::kWithSource, K::kReports, &K::workspace, &K::check, &K::run, false, K::kAddsRows};
}

/// The schedule of one row of src/gemm/kernel_table.cmake.
enum class Schedule : int {
  cooperative,           ///< two consumer warpgroups share each tile; one store warp (can report rows)
  pingpong,              ///< the consumer warpgroups take tiles in turn
  cooperative_stream_k,  ///< cooperative, K split across CTAs where tiles are few
  cooperative_swapped,   ///< cooperative, computed as D^T = B x A^T (kSwapAB; decision 0018)
};

/// The hook of one row of the table (tile_hooks.cuh).
enum class Hook : int {
  none,          ///< a plain GEMM
  waits,         ///< the mainloop waits for A rows; cooperative kernels report stored rows
  waits_source,  ///< D = A x B + source, the epilogue waits for source rows
  waits_add,     ///< some rows are added into another matrix (add_rows.cuh), the mainloop waits
};

/// One kernel as the table names it: a value, the template parameter of
/// KernelOf, so that a kernel is chosen by named fields, not by the position
/// of Kernel<...>'s thirteen arguments. Tile and cluster are the output's,
/// along our M and N, whichever operand CUTLASS takes first.
struct KernelSpec {
  DType input, output;
  BLayout b_layout;
  int tile_m, tile_n, tile_k;
  int cluster_m, cluster_n;
  Schedule schedule;
  Hook hook;
};

template <DType T>
struct CutlassElement;
template <>
struct CutlassElement<DType::bf16> { using type = cutlass::bfloat16_t; };
template <>
struct CutlassElement<DType::fp16> { using type = cutlass::half_t; };
template <>
struct CutlassElement<DType::fp32> { using type = float; };

/// Kernel<...> for a spec. Swapped, CUTLASS's tile and cluster are ours transposed.
template <KernelSpec S>
struct KernelOfSpec {
  static constexpr bool kSwap = S.schedule == Schedule::cooperative_swapped;
  using Out = typename CutlassElement<S.output>::type;
  using type = Kernel<typename CutlassElement<S.input>::type, Out,
                      std::conditional_t<S.b_layout == BLayout::nk, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>,
                      kSwap ? S.tile_n : S.tile_m, kSwap ? S.tile_m : S.tile_n, S.tile_k,
                      kSwap ? S.cluster_n : S.cluster_m, kSwap ? S.cluster_m : S.cluster_n,
                      S.schedule != Schedule::pingpong,
                      std::conditional_t<S.hook != Hook::none, HookedSchedulerTag,
                                         std::conditional_t<S.schedule == Schedule::cooperative_stream_k,
                                                            cutlass::gemm::StreamKScheduler,
                                                            cutlass::gemm::PersistentScheduler>>,
                      std::conditional_t<S.hook == Hook::waits_source, Out, void>, kSwap, S.hook == Hook::waits_add>;
};
template <KernelSpec S>
using KernelOf = typename KernelOfSpec<S>::type;

/// The Config of the table's row S, named `name` (the table's generator writes both).
template <KernelSpec S>
constexpr Config spec_config(const char* name) {
  using K = KernelOf<S>;
  static_assert(K::kClusterM == S.cluster_m && K::kClusterN == S.cluster_n, "the spec's cluster is the kernel's");
  static_assert(K::kHooked == (S.hook != Hook::none) && K::kAddsRows == (S.hook == Hook::waits_add));
  return make_config<K>(S.input, S.output, S.b_layout, name, S.tile_m, S.tile_n);
}

}  // namespace weft::gemm_detail
