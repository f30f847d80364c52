// grouped_kernel.cuh (private) - builds one sm_90a grouped GEMM from CUTLASS's ptr-array kernel,
// and the prologue that turns device-side row counts into its per-expert arguments.
//
// CUTLASS's grouped kernel takes, per group, a problem shape, operand
// pointers and strides, all in device memory, and with no host copy of the
// shapes its persistent tile scheduler reads them on the device: the grid is
// the SM count and each CTA walks the tiles of every group in turn (a group
// of 0 rows has no tiles). weft's prologue writes those arrays from the
// counts on the same stream, so a run is stream-ordered end to end and needs
// no host synchronisation; a graph replay reads the counts of that moment.
//
// The hook seam (GroupedRowWait): WaitingGroupedMainloop wraps CUTLASS's
// ptr-array mainloop collective as tile_hooks.cuh's WaitingMainloop wraps the
// dense one, so only its producer warp holds the wait, right before a tile's
// TMA loads. The kernel hands load() the tile's row block within its group
// but not the group: the collective learns it from tensormaps_perform_update,
// which the kernel calls with each new group before that group's first load,
// and reads the group's first row of A from the prologue's array.
//
// The report seam (GroupedRowsDone): ReportingGroupedEpilogue wraps CUTLASS's
// ptr-array epilogue collective. Its store() is handed the tile's coordinates
// and its group (l), and issues the tile's TMA stores from one elected lane of
// MMA warp 0 (CTA warp 8 in the cooperative kernel: row_bands.hpp's
// issues_tma_stores). That warp then waits for the
// *previous* tile's stores to complete (long done: free) and adds its rows x
// columns to the counter of each row band of out it covers (release, system
// scope); store_tail, at the CTA's end, waits for and reports its last tile.
// A tile is so reported one tile of its CTA late, at no cost to the consumers;
// the dense engine's scheduler reports a band's last tile at once
// (tile_hooks.cuh), which the grouped kernel's fixed group scheduler does not
// allow.
#pragma once

#include <climits>

#include "cutlass_kernel.cuh"  // KernelSpec, CutlassElement
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "grouped_config.hpp"
#include "row_bands.hpp"
#include "weft/device/signal.cuh"

namespace weft::gemm_detail {

/// Threads of the prologue's one block; each takes a contiguous run of experts.
constexpr int kGroupedPrologueThreads = 1024;

/// Rounds a byte offset up to 128 (TMA descriptors and CUTLASS's workspace want that much).
constexpr std::size_t grouped_align(std::size_t bytes) { return (bytes + 127) / 128 * 128; }

/// What the waiting mainloop's parameters hold: the run's wait, the
/// prologue's per-expert first rows and the fault record.
struct GroupedWaitParams {
  GroupedWait wait{};
  const std::int32_t* first_row = nullptr;  ///< [E]: the row of A where each expert's rows start
  GroupedFaultRecord* faults = nullptr;
};

/// CUTLASS's ptr-array mainloop collective `Base`, whose producer warp first
/// waits for the flags of the A rows each tile reads (GroupedRowWait; none
/// unless the run's flags are set).
template <class Base>
struct WaitingGroupedMainloop : Base {
  struct Arguments : Base::Arguments {
    GroupedWaitParams hook{};
  };
  struct Params : Base::Params {
    GroupedWaitParams hook{};
  };

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape problem, Arguments const& args, void* workspace) {
    Params p;
    static_cast<typename Base::Params&>(p) = Base::to_underlying_arguments(problem, args, workspace);
    p.hook = args.hook;
    return p;
  }

  /// Base::tensormaps_perform_update for the group `next_group`, whose tiles
  /// the following load() calls take: notes the group and its rows.
  template <class TensorMapStorage, class TensorMaps, class ProblemShapeMNKL>
  CUTLASS_DEVICE void tensormaps_perform_update(TensorMapStorage& shared, Params const& params, TensorMaps const& maps,
                                                ProblemShapeMNKL problem, int32_t next_group) {
    group_ = next_group;
    group_rows_ = static_cast<int>(cute::get<0>(problem));
    Base::tensormaps_perform_update(shared, params, maps, problem, next_group);
  }

  /// Base::load for the tile at blk_coord (m, n, _, _) of the current group, once its A rows are present.
  template <class Pipeline, class State, class LoadInputs, class TensorMaps, class BlockCoord, class... Rest>
  CUTLASS_DEVICE void load(Params const& params, Pipeline pipeline, State state, LoadInputs const& inputs,
                           TensorMaps const& maps, BlockCoord const& blk_coord, Rest&&... rest) {
    if (params.hook.wait.flags) {
      constexpr int kTileM = cute::size<0>(typename Base::TileShape{});
      const int row_in_group = static_cast<int>(cute::get<0>(blk_coord)) * kTileM;
      const int first = params.hook.first_row[group_];
      wait_for_rows(params.hook, first + row_in_group, first + min(row_in_group + kTileM, group_rows_));
    }
    Base::load(params, pipeline, state, inputs, maps, blk_coord, static_cast<Rest&&>(rest)...);
  }

 private:
  int group_ = 0, group_rows_ = 0;

  /// Every lane of the producer warp returns once the flags of rows [row0, row1) are up.
  CUTLASS_DEVICE static void wait_for_rows(GroupedWaitParams const& h, int row0, int row1) {
    const GroupedWait& w = h.wait;
    int polled = -1;  // rows of one flag mostly come together: each lane polls a flag once in a row
    for (int r = row0 + static_cast<int>(threadIdx.x % 32); r < row1; r += 32) {
      const int f = w.row_flag[r];
      if (f == polled) continue;
      if (f < 0 || f >= w.flag_count) {
        atomicOr(&h.faults->bits, static_cast<unsigned>(kBadRowFlag));
        atomicCAS(&h.faults->bad_flag_row, 0u, static_cast<unsigned>(r) + 1u);
        continue;
      }
      dev::wait_until_no_call(w.world, w.flags + f, dev::Cmp::ge, w.value, dev::Scope::sys, f / w.flags_per_rank);
      polled = f;
    }
    __syncwarp();
    // The rows came from a copy engine, a peer or another kernel; the TMA
    // loads that read them next belong to the async proxy.
    dev::fence_proxy_async_global();
  }
};

/// What the reporting epilogue's parameters hold: the run's report and the
/// prologue's per-expert first rows (of out, as of A).
struct GroupedReportParams {
  GroupedRowsDone report{};
  const std::int32_t* first_row = nullptr;
};

/// CUTLASS's ptr-array epilogue collective `Base`, whose store warp adds each
/// stored tile's rows x columns to the counters of the row bands of out it
/// covers once the tile's TMA stores are complete (GroupedRowsDone; nothing
/// unless the run's counters are set). kStoreGroupsPerTile: the bulk
/// async-groups Base::store commits per tile (one per epilogue subtile);
/// kMmaThreads: the kernel's MMA threads, which place the store warp.
template <class Base, int kStoreGroupsPerTile, int kMmaThreads>
struct ReportingGroupedEpilogue : Base {
  struct Arguments : Base::Arguments {
    GroupedReportParams hook{};
  };
  struct Params : Base::Params {
    GroupedReportParams hook{};
  };

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const& problem, Arguments const& args, void* workspace) {
    Params p;
    static_cast<typename Base::Params&>(p) = Base::to_underlying_arguments(problem, args, workspace);
    p.hook = args.hook;
    return p;
  }

  CUTLASS_DEVICE ReportingGroupedEpilogue(Params const& params, typename Base::TensorStorage& shared)
      : Base(params, shared), hook_(&params.hook) {}

  /// Base::store for the tile at tile_coord (m, n, _, group); then, on the
  /// store warp, the previous tile's report and this tile's rows noted.
  template <class LoadPipeline, class LoadState, class StorePipeline, class StoreState, class ProblemShapeMNKL,
            class TileShapeMNK, class TileCoordMNKL, class... Rest>
  CUTLASS_DEVICE auto store(LoadPipeline load_pipeline, LoadState load_state, StorePipeline store_pipeline,
                            StoreState store_state, ProblemShapeMNKL problem, TileShapeMNK tile_shape,
                            TileCoordMNKL tile_coord, Rest&&... rest) {
    auto next = Base::store(load_pipeline, load_state, store_pipeline, store_state, problem, tile_shape, tile_coord,
                            static_cast<Rest&&>(rest)...);
    if (hook_->report.counters && stores_here()) {
      if (pending_rows_ > 0) {
        dev::bulk_stores_wait<kStoreGroupsPerTile>();  // at most this tile's stores still in flight
        __syncwarp();
        if (threadIdx.x % 32 == 0) add_rows(pending_row0_, pending_rows_, pending_cols_);
      }
      constexpr int kTileM = cute::size<0>(TileShapeMNK{}), kTileN = cute::size<1>(TileShapeMNK{});
      const int m = static_cast<int>(cute::get<0>(tile_coord)), n = static_cast<int>(cute::get<1>(tile_coord));
      const int group = static_cast<int>(cute::get<3>(tile_coord));
      const int group_rows = static_cast<int>(cute::get<0>(problem)), cols = static_cast<int>(cute::get<1>(problem));
      pending_row0_ = hook_->first_row[group] + m * kTileM;
      pending_rows_ = min(kTileM, group_rows - m * kTileM);
      pending_cols_ = min(kTileN, cols - n * kTileN);
    }
    return next;
  }

  /// Base::store_tail (the CTA's end); then the last tile's report, once its stores are complete.
  template <class... Args>
  CUTLASS_DEVICE auto store_tail(Args&&... args) {
    auto next = Base::store_tail(static_cast<Args&&>(args)...);
    if (hook_->report.counters && stores_here() && pending_rows_ > 0) {
      dev::bulk_stores_wait<0>();
      __syncwarp();
      if (threadIdx.x % 32 == 0) add_rows(pending_row0_, pending_rows_, pending_cols_);
      pending_rows_ = 0;
    }
    return next;
  }

 private:
  /// True in the warp whose elected lane issues the epilogue's TMA stores
  /// (after the one producer warpgroup): only its lanes can wait for them.
  CUTLASS_DEVICE static bool stores_here() {
    return issues_tma_stores(static_cast<int>(threadIdx.x / 32), 128, kMmaThreads);
  }

  /// counters[band] += (rows of [row0, row0 + rows) in the band) x cols, for each band the rows cover.
  CUTLASS_DEVICE void add_rows(int row0, int rows, int cols) const {
    if (rows <= 0 || cols <= 0) return;
    dev::fence_proxy_async_global();  // the rows were written by the async proxy (TMA)
    const std::int64_t per = hook_->report.rows_per_report, row1 = std::int64_t{row0} + rows;
    for (std::int64_t band = row0 / per; band * per < row1; ++band)
      dev::red_release(hook_->report.counters + band, static_cast<std::uint64_t>(rows_in_band(row0, row1, band, per) * cols),
                       dev::Scope::sys);
  }

  // The kernel's own (grid-constant) parameters, read in place: a copy in
  // every consumer thread would stay live across the mainloop.
  const GroupedReportParams* hook_ = nullptr;
  int pending_row0_ = 0, pending_rows_ = 0, pending_cols_ = 0;  // the last tile whose stores were issued, unreported
};

/// One grouped configuration: Element in and out, W as [E, N, K] (LayoutB
/// ColumnMajor in CUTLASS's K x N view) or [E, K, N] (RowMajor).
template <class Element, class LayoutB, int TM, int TN, int TK, int CM, int CN>
struct GroupedKernel {
  using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;  // M, N, K per group
  using Shape = typename ProblemShape::UnderlyingProblemShape;
  using TileShape = cute::Shape<cute::Int<TM>, cute::Int<TN>, cute::Int<TK>>;
  using ClusterShape = cute::Shape<cute::Int<CM>, cute::Int<CN>, cute::_1>;
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlign = 16 / sizeof(Element);
  // No source matrix (void C): out = A x W, alpha 1.
  using BaseEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD*, kAlign, Element, LayoutD*, kAlign,
      cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
      cutlass::epilogue::fusion::LinearCombination<Element, float, void, float>>::CollectiveOp;
  static constexpr int kStoreGroupsPerTile =
      (TM * TN) / decltype(cute::size(typename BaseEpilogue::EpilogueTile{}))::value;
  // The reporting wrapper adds no shared storage: the mainloop's stages are carved around the base's.
  using BaseMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA*, kAlign, Element, LayoutB*, kAlign, float,
      TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename BaseEpilogue::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
  static constexpr int kMmaThreads = decltype(cute::size(typename BaseMainloop::TiledMma{}))::value;
  using Epilogue = ReportingGroupedEpilogue<BaseEpilogue, kStoreGroupsPerTile, kMmaThreads>;
  using Mainloop = WaitingGroupedMainloop<BaseMainloop>;
  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  // The ptr-array kernel indexes its MMA threads as threadIdx.x % size(TiledMma), after one load warpgroup.
  static_assert(GemmKernel::NumLoadWarpGroups == 1 && GemmKernel::NumMmaThreads == kMmaThreads &&
                    sizeof(typename Epilogue::SharedStorage) == sizeof(typename BaseEpilogue::SharedStorage),
                "the store warp assumes one load warpgroup; the wrapper adds no shared storage");
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
  using StrideA = typename GemmKernel::InternalStrideA;
  using StrideB = typename GemmKernel::InternalStrideB;
  using StrideD = typename GemmKernel::InternalStrideD;

  /// The per-expert arrays, carved from the front of the plan's workspace;
  /// CUTLASS's own workspace (per-SM TMA descriptors) follows them.
  struct Arrays {
    Shape* shapes;
    const Element** a;
    const Element** w;
    Element** out;
    StrideA* stride_a;
    StrideB* stride_w;
    StrideD* stride_out;
    std::int32_t* first_row;  ///< each expert's first row of A (the waiting mainloop's)
    void* cutlass_workspace;
  };

  static std::size_t arrays_bytes(int experts) {
    const std::size_t e = static_cast<std::size_t>(experts);
    return grouped_align(e * sizeof(Shape)) + 3 * grouped_align(e * sizeof(void*)) +
           grouped_align(e * sizeof(StrideA)) + grouped_align(e * sizeof(StrideB)) +
           grouped_align(e * sizeof(StrideD)) + grouped_align(e * sizeof(std::int32_t));
  }

  static Arrays carve(void* workspace, int experts) {
    const std::size_t e = static_cast<std::size_t>(experts);
    char* at = static_cast<char*>(workspace);
    auto take = [&](std::size_t bytes) {
      char* p = at;
      at += grouped_align(bytes);
      return p;
    };
    Arrays arr;
    arr.shapes = reinterpret_cast<Shape*>(take(e * sizeof(Shape)));
    arr.a = reinterpret_cast<const Element**>(take(e * sizeof(void*)));
    arr.w = reinterpret_cast<const Element**>(take(e * sizeof(void*)));
    arr.out = reinterpret_cast<Element**>(take(e * sizeof(void*)));
    arr.stride_a = reinterpret_cast<StrideA*>(take(e * sizeof(StrideA)));
    arr.stride_w = reinterpret_cast<StrideB*>(take(e * sizeof(StrideB)));
    arr.stride_out = reinterpret_cast<StrideD*>(take(e * sizeof(StrideD)));
    arr.first_row = reinterpret_cast<std::int32_t*>(take(e * sizeof(std::int32_t)));
    arr.cutlass_workspace = at;
    return arr;
  }

  static typename Gemm::Arguments arguments(const GroupedProblem& p, const Arrays& arr) {
    typename Gemm::Arguments args;
    args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
    // No host copy of the shapes: the scheduler reads them on the device, and
    // the grid is one CTA per SM.
    args.problem_shape = {p.experts, arr.shapes, nullptr};
    args.mainloop = {{arr.a, arr.stride_a, arr.w, arr.stride_w}, {p.wait, arr.first_row, p.faults}};
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    args.epilogue.ptr_C = nullptr;
    args.epilogue.dC = arr.stride_out;
    args.epilogue.ptr_D = arr.out;
    args.epilogue.dD = arr.stride_out;
    args.epilogue.hook = {p.report, arr.first_row};
    args.hw_info.sm_count = whole_cluster_sms(p.sm_count, CM * CN);
    // Along M: consecutive tiles of one expert share its weight's column tile (the larger operand), kept in L2.
    args.scheduler.raster_order = decltype(args.scheduler.raster_order)::AlongM;
    return args;
  }

  static std::size_t workspace(int experts, int sm_count) {
    GroupedProblem p{};
    p.experts = experts;
    p.sm_count = sm_count;
    const Arrays none{};
    return arrays_bytes(experts) + grouped_align(Gemm::get_workspace_size(arguments(p, none)));
  }

  static const char* run(const GroupedProblem& p, cudaStream_t stream);
};

/// Writes every expert's problem shape (its rows, N, K), pointers and strides
/// from the counts: one block, each thread a contiguous run of experts, their
/// first rows by a block-wide scan of the runs' sums (packed), or read from
/// p.expert_first_row. A negative count is taken as 0; packed, rows past
/// max_rows are dropped (an expert that straddles it keeps the rows that
/// fit); with first rows, an expert whose range is out of order, overlaps the
/// previous one or passes max_rows is computed as empty. Each is recorded in p.faults.
template <class K>
__global__ void __launch_bounds__(kGroupedPrologueThreads) grouped_prologue(typename K::Arrays arr, GroupedProblem p) {
  using Element = std::remove_const_t<std::remove_pointer_t<std::remove_pointer_t<decltype(arr.a)>>>;
  __shared__ std::int64_t sums[kGroupedPrologueThreads];
  const int t = threadIdx.x;
  const int per = (p.experts + kGroupedPrologueThreads - 1) / kGroupedPrologueThreads;
  const int first = min(t * per, p.experts), last = min(first + per, p.experts);
  std::int64_t mine = 0;
  bool negative = false;
  for (int e = first; e < last; ++e) {
    const int c = p.expert_rows[e];
    negative |= c < 0;
    mine += max(c, 0);
  }
  sums[t] = mine;
  __syncthreads();
  for (int offset = 1; offset < kGroupedPrologueThreads; offset <<= 1) {  // inclusive scan
    const std::int64_t before = t >= offset ? sums[t - offset] : 0;
    __syncthreads();
    sums[t] += before;
    __syncthreads();
  }
  const std::int64_t total = sums[kGroupedPrologueThreads - 1];
  std::int64_t row = sums[t] - mine;  // this thread's first expert's first row
  const Element* a = static_cast<const Element*>(p.a);
  const Element* w = static_cast<const Element*>(p.w);
  Element* out = static_cast<Element*>(p.out);
  const int n = static_cast<int>(p.n), k = static_cast<int>(p.k);
  bool bad_range = false;
  for (int e = first; e < last; ++e) {
    const std::int64_t c = max(p.expert_rows[e], 0);
    std::int64_t begin = row < p.max_rows ? row : p.max_rows;
    int m = static_cast<int>(c < p.max_rows - begin ? c : p.max_rows - begin);
    if (p.expert_first_row) {
      begin = p.expert_first_row[e];
      // The previous expert's range must end at or before this one's first row.
      const std::int64_t previous_end = e > 0 ? std::int64_t{p.expert_first_row[e - 1]} + max(p.expert_rows[e - 1], 0) : 0;
      m = static_cast<int>(c);
      if (begin < previous_end || begin < 0 || begin + c > p.max_rows) {
        if (!bad_range) atomicMax(&p.faults->bad_range_mark, static_cast<unsigned>(p.experts - e));
        bad_range = true;
        begin = 0;
        m = 0;
      }
    }
    arr.shapes[e] = cute::make_shape(m, n, k);
    arr.first_row[e] = static_cast<std::int32_t>(begin);
    arr.a[e] = a + begin * p.k;
    arr.w[e] = w + static_cast<std::int64_t>(e) * p.n * p.k;
    arr.out[e] = out + begin * p.n;
    arr.stride_a[e] = cutlass::make_cute_packed_stride(typename K::StrideA{}, cute::make_shape(m, k, 1));
    arr.stride_w[e] = cutlass::make_cute_packed_stride(typename K::StrideB{}, cute::make_shape(n, k, 1));
    arr.stride_out[e] = cutlass::make_cute_packed_stride(typename K::StrideD{}, cute::make_shape(m, n, 1));
    row += c;
  }
  if (negative) atomicOr(&p.faults->bits, static_cast<unsigned>(kNegativeCount));
  if (bad_range) atomicOr(&p.faults->bits, static_cast<unsigned>(kBadFirstRow));
  // Packed rows only: with first rows, each range is checked against max_rows on its own.
  if (t == 0 && !p.expert_first_row && total > p.max_rows) {
    atomicOr(&p.faults->bits, static_cast<unsigned>(kOverCapacity));
    atomicCAS(&p.faults->first_total, 0u,
              static_cast<unsigned>(total < std::int64_t{UINT_MAX} ? total : std::int64_t{UINT_MAX}));
  }
}

template <class Element, class LayoutB, int TM, int TN, int TK, int CM, int CN>
const char* GroupedKernel<Element, LayoutB, TM, TN, TK, CM, CN>::run(const GroupedProblem& p, cudaStream_t stream) {
  const Arrays arr = carve(p.workspace, p.experts);
  grouped_prologue<GroupedKernel><<<1, kGroupedPrologueThreads, 0, stream>>>(arr, p);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cudaGetErrorString(e);
  Gemm gemm;
  const auto args = arguments(p, arr);
  cutlass::Status s = gemm.can_implement(args);
  if (s == cutlass::Status::kSuccess) s = gemm.initialize(args, arr.cutlass_workspace, stream);
  if (s == cutlass::Status::kSuccess) s = gemm.run(stream);
  return s == cutlass::Status::kSuccess ? "" : cutlass::cutlassGetStatusString(s);
}

/// GroupedKernel<...> for one grouped row of the table (a KernelSpec: cooperative, no hook field).
template <KernelSpec S>
struct GroupedKernelOfSpec {
  static_assert(S.input == S.output, "a grouped kernel's output is its input type");
  static_assert(S.schedule == Schedule::cooperative && S.hook == Hook::none,
                "grouped kernels: the cooperative schedule; their seams need no hook field");
  using type = GroupedKernel<typename CutlassElement<S.input>::type,
                             std::conditional_t<S.b_layout == BLayout::nk, cutlass::layout::ColumnMajor,
                                                cutlass::layout::RowMajor>,
                             S.tile_m, S.tile_n, S.tile_k, S.cluster_m, S.cluster_n>;
};

/// The GroupedConfig of the table's grouped row S, named `name`.
template <KernelSpec S>
constexpr GroupedConfig grouped_spec_config(const char* name) {
  using K = typename GroupedKernelOfSpec<S>::type;
  return GroupedConfig{S.input, S.b_layout, name, S.tile_m, S.tile_n, S.cluster_m, S.cluster_n, &K::workspace, &K::run};
}

}  // namespace weft::gemm_detail
