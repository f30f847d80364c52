// tile_hooks.cuh (private) - the GEMM's communication hooks: a tile scheduler that rotates the tile
// order and reports each tile's rows once its stores are complete, and the two
// load collectives that wait, per tile, for the rows that tile reads to have arrived.
//
// Waiting (RowWait): CUTLASS's warp-specialised kernels load a tile's inputs
// in one producer warp each, through their collectives' load(): the mainloop's
// (A and B) and the epilogue's (the C source). Wrapping those two collectives
// puts a wait exactly where a tile's data is first read, without touching the
// kernel:
//   - WaitingMainloop: the mainloop producer waits before its TMA loads of A
//     (AllGather + GEMM: the rows of a remote shard);
//   - WaitingEpilogue: the epilogue producer waits before its TMA load of the
//     C source (GEMM + ReduceScatter: the partial sum from the previous rank),
//     so the tile's mainloop runs meanwhile.
// The other warps never wait: they are fed through shared memory by the one
// that did. Waits in the tile scheduler, which every warp inlines, would
// change the consumers' code too: the pingpong kernel ran 2-7 % slower so,
// with nothing waited for (docs/decisions/0014).
// In the collectives only the waiting warp holds the code, and all
// of it is inline (dev::wait_until_no_call): one call in the kernel and ptxas
// ignores setmaxnreg (C7507). With RowSignals::waited_ns the waiting lane adds
// the time it spent on each flag to that flag's counter (diagnostics).
//
// Scheduling (HookedScheduler): the rotation starts the order at a chosen row
// tile (the rank's own shard first); it is a multiple of the cluster's M
// extent, so the CTAs of a cluster keep sharing their B tile. Or the walk
// goes through whole blocks of rows from a chosen block down (GEMM +
// ReduceScatter's ring in one launch: the order its blocks leave in), each
// block holding whole clusters and swizzle bands (tile_walk.hpp). Plans keep
// the row-major tile order (along N), so rows are consumed, and stored, in the
// order they travel; a plan that neither rotates nor reports may walk along M
// too (GemmOptions::any_tile_order).
//
// Reporting (RowsDone, cooperative kernel only): the consumers ask for their next tile right after the
// epilogue has issued the TMA stores of this one. The warp that issued them
// (MMA warp 0: CTA warp 8 in the cooperative kernel, row_bands.hpp's
// issues_tma_stores) then waits for the
// *previous* tile's stores to complete - long done by now, so it costs
// nothing - and adds that tile's rows x columns to the counter of each row
// band it covers (release, system scope). A tile whose successor on this CTA
// lies in other bands (or which is the CTA's last) waits for its own stores
// and reports at once, so no band waits a whole tile for its last report.
// A copy engine can then wait on a band's counter (cuStreamWaitValue64) and
// send the band while the GEMM goes on.
#pragma once

#include "cutlass/gemm/kernel/sm90_tile_scheduler.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "config.hpp"
#include "row_bands.hpp"
#include "tile_walk.hpp"
#include "weft/device/signal.cuh"
#include "weft/gemm/gemm_types.hpp"

namespace weft::gemm_detail {

/// One collective's waits: the run's TileWaitParams plus the problem's extent,
/// in 32 bits (flag arithmetic on 64-bit values costs a division subroutine
/// per tile in a warp held to 40 registers).
struct RowWait {
  TileWaitParams w{};  ///< flags == nullptr: this collective never waits
  int rows = 0;        ///< M: rows past it belong to no flag
  int cols = 0;        ///< N
  int rows_per_flag = 1, cols_per_flag = 0;  ///< TileWaitParams's, clamped to M and N (same flag indices)

  /// The wait settings for a problem of rows x cols; `w` as the run gave it.
  static RowWait make(const TileWaitParams& w, std::int64_t rows, std::int64_t cols) {
    RowWait r;
    r.w = w;
    r.rows = static_cast<int>(rows);
    r.cols = static_cast<int>(cols);
    r.rows_per_flag = static_cast<int>(std::max<std::int64_t>(1, std::min(w.rows_per_flag, rows)));
    r.cols_per_flag = static_cast<int>(std::max<std::int64_t>(0, std::min(w.cols_per_flag, cols)));
    return r;
  }

  /// The rank that raises flag f (for the timeout report).
  CUTLASS_DEVICE int raiser(int f) const { return w.flags_per_rank > 0 ? f / w.flags_per_rank : w.from_rank; }

  /// True if flag f (by rows) covers only rows present from the start: no tile waits for it.
  CUTLASS_DEVICE bool ready_flag(int f) const {
    const std::int64_t f_row0 = static_cast<std::int64_t>(f) * rows_per_flag;
    return cols_per_flag == 0 && f_row0 >= w.ready_begin && f_row0 + rows_per_flag <= w.ready_end;
  }

  /// The wait on flag f, and (RowSignals::waited_ns) its time: the flag's
  /// counter takes -start before the wait and +end after it (wrapping arithmetic).
  CUTLASS_DEVICE void wait_flag(int f) const {
    const bool timed = w.waited_ns && threadIdx.x % 32 == 0;
    if (timed) atomicAdd(w.waited_ns + f, 0ull - dev::globaltimer_ns());
    dev::wait_until_no_call(w.world, w.flags + f, dev::Cmp::ge, w.value, dev::Scope::sys, raiser(f));
    if (timed) atomicAdd(w.waited_ns + f, dev::globaltimer_ns());
  }

  /// Every lane of the calling warp returns once the flags of the tile at
  /// rows [row0, row0 + tile_m) and columns [col0, col0 + tile_n) are raised
  /// (clipped to the problem); rows present from the start wait for nothing.
  CUTLASS_DEVICE void wait_for_tile(int row0, int tile_m, int col0, int tile_n) const {
    if (!w.flags) return;
    const int row1 = min(row0 + tile_m, rows);  // the last tile may run past M
    if (row0 >= row1 || (row0 >= w.ready_begin && row1 <= w.ready_end)) return;
    bool waited = false;
    if (cols_per_flag > 0) {  // flags by column band: the source arrives band by band, every row at once
      const int col1 = min(col0 + tile_n, cols);
      for (int f = col0 / cols_per_flag; f * cols_per_flag < col1; ++f) {
        wait_flag(f);
        waited = true;
      }
    } else {
      for (int f = row0 / rows_per_flag; f * rows_per_flag < row1; ++f) {
        if (ready_flag(f)) continue;
        wait_flag(f);
        waited = true;
      }
    }
    // The rows came from a copy engine or a peer; the TMA loads that read
    // them next belong to the async proxy.
    if (waited) dev::fence_proxy_async_global();
  }

  /// RowSignals::consume, by the waiting warp of each CTA, once, after its
  /// last wait: when the last CTA's warp counts itself out, every tile has
  /// seen its flags raised, so its lanes make sure of each flag that may be
  /// waited on (already up: reads only) and set them all back to 0, then the
  /// count. No peer raises one again before the next run's "free", which
  /// follows this kernel in stream order.
  CUTLASS_DEVICE void count_out() const {
    if (!w.flags || !w.exits) return;
    const int lane = static_cast<int>(threadIdx.x % 32);
    std::uint64_t before = 0;
    if (lane == 0) before = dev::atomic_add(w.exits, 1, dev::Scope::gpu, dev::Order::acq_rel);
    before = __shfl_sync(0xffffffffu, before, 0);
    const std::uint64_t ctas = static_cast<std::uint64_t>(gridDim.x) * gridDim.y * gridDim.z;
    if (before != ctas - 1) return;
    dev::fence_acq_rel(dev::Scope::gpu);  // every lane sees what the other CTAs did before counting out
    const int count = cols_per_flag > 0 ? (cols + cols_per_flag - 1) / cols_per_flag
                                        : (rows + rows_per_flag - 1) / rows_per_flag;
    auto* flags = const_cast<std::uint64_t*>(w.flags);  // the caller handed them over (RowSignals::consume)
    for (int f = lane; f < count; f += 32) {
      if (ready_flag(f)) continue;  // never raised
      dev::wait_until_no_call(w.world, flags + f, dev::Cmp::ge, w.value, dev::Scope::sys, raiser(f));
      dev::st_relaxed(flags + f, 0, dev::Scope::sys);
    }
    __syncwarp();
    if (lane == 0) dev::st_relaxed(w.exits, 0, dev::Scope::gpu);
  }
};

/// A CUTLASS load collective `Base` whose arguments carry the run's
/// TileWaitParams and whose parameters the RowWait made of them: what
/// WaitingMainloop and WaitingEpilogue share.
template <class Base>
struct WithRowWait : Base {
  using Base::Base;
  struct Arguments : Base::Arguments {
    TileWaitParams wait{};
  };
  struct Params : Base::Params {
    RowWait wait{};
  };

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const& problem, Arguments const& args,
                                                  void* workspace) {
    Params p;
    static_cast<typename Base::Params&>(p) = Base::to_underlying_arguments(problem, args, workspace);
    p.wait = RowWait::make(args.wait, cute::get<0>(problem), cute::get<1>(problem));
    return p;
  }
};

/// CUTLASS's mainloop collective `Base`, whose producer warp first waits for
/// the A rows of each tile (RowWait; none unless the run's flags are set).
template <class Base>
struct WaitingMainloop : WithRowWait<Base> {
  using typename WithRowWait<Base>::Params;

  /// Base::load for the tile at blk_coord (m, n, _, l), once its A rows are present.
  template <class Pipeline, class State, class LoadInputs, class BlockCoord, class... Rest>
  CUTLASS_DEVICE void load(Params const& params, Pipeline pipeline, State state, LoadInputs const& inputs,
                           BlockCoord const& blk_coord, Rest&&... rest) {
    constexpr int kTileM = cute::size<0>(typename Base::TileShape{});
    constexpr int kTileN = cute::size<1>(typename Base::TileShape{});
    params.wait.wait_for_tile(static_cast<int>(cute::get<0>(blk_coord)) * kTileM, kTileM,
                              static_cast<int>(cute::get<1>(blk_coord)) * kTileN, kTileN);
    Base::load(params, pipeline, state, inputs, blk_coord, static_cast<Rest&&>(rest)...);
  }

  /// Base::load_init; keeps the waits for load_tail, which is not given the
  /// parameters. Every thread of every CTA calls it, tiles or none.
  template <class ProblemShapeMNKL>
  CUTLASS_DEVICE auto load_init(ProblemShapeMNKL const& problem, Params const& params) {
    wait_ = &params.wait;
    return Base::load_init(problem, params);
  }

  /// Base::load_tail, after this CTA counted out of the run's flags.
  template <class Pipeline, class State>
  CUTLASS_DEVICE void load_tail(Pipeline pipeline, State state) {
    wait_->count_out();
    Base::load_tail(pipeline, state);
  }

 private:
  RowWait const* wait_ = nullptr;  // in the kernel's (grid-constant) parameters
};

/// CUTLASS's epilogue collective `Base`, whose producer warp first waits for
/// the source rows of each tile (RowWait; none unless the run's flags are set),
/// and counts its CTA out after the last (RowSignals::consume).
template <class Base>
struct WaitingEpilogue : WithRowWait<Base> {
  using typename WithRowWait<Base>::Params;

  CUTLASS_HOST_DEVICE WaitingEpilogue(Params const& params, typename Base::TensorStorage& shared)
      : WithRowWait<Base>(params, shared), wait_(params.wait) {}

  /// Base::load for the tile at tile_coord (m, n, k, l), once its source rows are present.
  template <class Pipeline, class State, class ProblemShape, class TileShape, class TileCoord, class... Rest>
  CUTLASS_DEVICE auto load(Pipeline pipeline, State state, ProblemShape problem, TileShape tile, TileCoord tile_coord,
                           Rest&&... rest) {
    constexpr int kTileM = cute::size<0>(TileShape{});
    constexpr int kTileN = cute::size<1>(TileShape{});
    wait_.wait_for_tile(static_cast<int>(cute::get<0>(tile_coord)) * kTileM, kTileM,
                        static_cast<int>(cute::get<1>(tile_coord)) * kTileN, kTileN);
    return Base::load(pipeline, state, problem, tile, tile_coord, static_cast<Rest&&>(rest)...);
  }

  /// Base::load_tail, after this CTA counted out of the run's flags.
  template <class Pipeline, class State>
  CUTLASS_DEVICE auto load_tail(Pipeline pipeline, State state) {
    wait_.count_out();
    return Base::load_tail(pipeline, state);
  }

 private:
  RowWait const& wait_;  // in the kernel's (grid-constant) parameters
};

/// What a configuration names to get the hooked scheduler (cutlass_kernel.cuh
/// turns it into HookedSchedulerFor<its epilogue's store count, its store warp>).
struct HookedSchedulerTag {};
/// Selects HookedScheduler<kStoreGroupsPerTile, kStoreWarp> in CUTLASS's GemmUniversal.
template <int kStoreGroupsPerTile, int kStoreWarp>
struct HookedSchedulerFor {};

/// kStoreGroupsPerTile: the bulk async-groups the epilogue commits per tile
/// (one per epilogue sub-tile), so that "at most this many in flight" means
/// "the previous tile's stores are complete". kStoreWarp: the CTA warp whose
/// lane issues them (issues_tma_stores), the one that can wait for them.
template <int kStoreGroupsPerTile, int kStoreWarp>
class HookedScheduler : public cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90 {
  using Base = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90;
  using BaseParams = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90Params;
  using BaseArguments = Base::Arguments;

 public:
  struct Arguments : BaseArguments {
    // TileWaitParams's fields that scheduling reads; the waits are the
    // load collectives' (WithRowWait).
    std::int64_t rotate_rows = 0;   ///< start the tile order at the tile holding this row
    std::int64_t descending_block_rows = 0;  ///< > 0: walk blocks of these rows down from rotate_rows's
    std::uint64_t* done = nullptr;  ///< RowsDone's counters, or nullptr
    std::int64_t rows_per_done = 1;
  };
  struct Params : BaseParams {
    int tile_m = 0;
    int rotate_tiles = 0;
    int tiles_m = 0;  ///< row tiles, rounded up to the cluster's M extent
    int tiles_per_block = 0;  ///< > 0: the walk by descending blocks (descending_walk_row_tile)
    int first_block = 0;      ///< ... starts at this block
    int blocks = 0;           ///< ... of this many
    int rows = 0;     ///< M: rows past it are stored by no tile
    int tile_n = 0;
    int cols = 0;     ///< N
    std::uint64_t* done = nullptr;  ///< RowsDone's counters, or nullptr
    std::int64_t rows_per_done = 1;
  };

  template <class ProblemShapeMNKL, class TileShape, class ClusterShape>
  static Params to_underlying_arguments(ProblemShapeMNKL problem, TileShape tile, ClusterShape cluster,
                                        cutlass::KernelHardwareInfo const& hw, Arguments const& args,
                                        void* workspace = nullptr, const uint32_t epilogue_subtile = 1,
                                        uint32_t ktile_start_alignment_count = 1u) {
    Params p;
    const BaseArguments& base_args = args;
    BaseParams& base_params = p;
    base_params = Base::to_underlying_arguments(problem, tile, cluster, hw, base_args, workspace, epilogue_subtile,
                                                ktile_start_alignment_count);
    p.tile_m = cute::size<0>(tile);
    p.rows = static_cast<int>(cute::get<0>(problem));
    p.tile_n = cute::size<1>(tile);
    p.cols = static_cast<int>(cute::get<1>(problem));
    p.done = args.done;
    p.rows_per_done = args.rows_per_done;
    const int cluster_m = cute::size<0>(cluster);
    p.tiles_m = static_cast<int>(p.problem_tiles_m_) * cluster_m;
    const int rot = static_cast<int>(args.rotate_rows / p.tile_m);
    p.rotate_tiles = p.tiles_m > 0 ? (rot - rot % cluster_m) % p.tiles_m : 0;
    // The kernel's check() has made sure the blocks tile the row tiles in
    // whole clusters; the guard keeps a problem it refused from dividing by 0.
    const int tiles_per_block = static_cast<int>(args.descending_block_rows / p.tile_m);
    if (args.descending_block_rows > 0 && tiles_per_block > 0 && p.tiles_m % tiles_per_block == 0) {
      p.tiles_per_block = tiles_per_block;
      p.blocks = p.tiles_m / tiles_per_block;
      p.first_block = static_cast<int>(args.rotate_rows / args.descending_block_rows) % p.blocks;
    }
    return p;
  }

  CUTLASS_HOST_DEVICE HookedScheduler() {}
  CUTLASS_DEVICE explicit HookedScheduler(Params const& params)
      : Base(params), p_(&params) {}

  template <class ClusterShape>
  CUTLASS_DEVICE WorkTileInfo initial_work_tile_info(ClusterShape) {
    return rotated(Base::get_current_work());
  }
  /// Called by every warp after its part of tile `work`: the consumers call
  /// it right after the epilogue issued the tile's stores.
  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo work) {
    Base::advance_to_next_work();
    WorkTileInfo next = rotated(Base::get_current_work());
    if (p_->done && static_cast<int>(threadIdx.x / 32) == kStoreWarp) report_stored(work, next);
    return cute::make_tuple(next, true);
  }
  template <class Pipeline, class PipelineState>
  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo work, Pipeline&, PipelineState) {
    return fetch_next_work(work);
  }
  /// The pingpong kernel's way to ask (after advance_to_next_work). Hides the
  /// base's; the cooperative kernel never calls it, and nothing here calls
  /// it unqualified, so no tile is rotated twice.
  CUTLASS_DEVICE WorkTileInfo get_current_work() const { return rotated(Base::get_current_work()); }

 private:
  /// Reports `work` one tile late (free: its stores are long complete by
  /// then) while this CTA's next tile lies in the same bands, since the bands
  /// cannot be complete before that next tile is anyway. Where the next tile
  /// leaves them (or there is none), it waits for this tile's own stores and
  /// reports now: a band's last tile would otherwise be reported a whole tile
  /// later, and its copy would wait for it.
  CUTLASS_DEVICE void report_stored(WorkTileInfo work, WorkTileInfo next) {
    const bool defer = next.is_valid() && same_bands(work.M_idx, next.M_idx);
    if (defer) {
      if (pending_m_ >= 0) {
        dev::bulk_stores_wait<kStoreGroupsPerTile>();  // at most this tile's stores still in flight
        __syncwarp();
        if (threadIdx.x % 32 == 0) add_rows(pending_m_, pending_n_);
      }
      pending_m_ = work.M_idx;
      pending_n_ = work.N_idx;
      return;
    }
    dev::bulk_stores_wait<0>();
    __syncwarp();
    if (threadIdx.x % 32 == 0) {
      if (pending_m_ >= 0) add_rows(pending_m_, pending_n_);
      add_rows(work.M_idx, work.N_idx);
    }
    pending_m_ = -1;
  }

  /// True if row tiles m1 and m2 cover the same first and last band.
  CUTLASS_DEVICE bool same_bands(int m1, int m2) const {
    const std::int64_t per = p_->rows_per_done;
    auto first = [&](int m) { return static_cast<std::int64_t>(m) * p_->tile_m / per; };
    auto last = [&](int m) {
      const std::int64_t row1 = std::min<std::int64_t>((static_cast<std::int64_t>(m) + 1) * p_->tile_m, p_->rows);
      return (row1 - 1) / per;
    };
    return first(m1) == first(m2) && last(m1) == last(m2);
  }

  /// done[band] += (rows of tile (m, n) in the band) x (its columns), per band it covers.
  CUTLASS_DEVICE void add_rows(int m, int n) const {
    const std::int64_t row0 = static_cast<std::int64_t>(m) * p_->tile_m;
    const std::int64_t row1 = std::min<std::int64_t>(row0 + p_->tile_m, p_->rows);
    const std::int64_t cols = std::min<std::int64_t>(p_->tile_n, p_->cols - static_cast<std::int64_t>(n) * p_->tile_n);
    if (row0 >= row1 || cols <= 0) return;  // a tile past M (cluster padding) stores nothing
    dev::fence_proxy_async_global();  // the rows were written by the async proxy (TMA)
    const std::int64_t per = p_->rows_per_done;
    for (std::int64_t band = row0 / per; band * per < row1; ++band)
      dev::red_release(p_->done + band, static_cast<std::uint64_t>(rows_in_band(row0, row1, band, per) * cols),
                       dev::Scope::sys);
  }

  /// `work` as the base scheduler's walk hands it out, moved to the row tile
  /// this run computes at that position of the walk (tile_walk.hpp).
  CUTLASS_DEVICE WorkTileInfo rotated(WorkTileInfo work) const {
    if (!work.is_valid()) return work;
    if (p_->tiles_per_block)
      work.M_idx = descending_walk_row_tile(work.M_idx, p_->first_block, p_->tiles_per_block, p_->blocks);
    else if (p_->rotate_tiles)
      work.M_idx = rotated_row_tile(work.M_idx, p_->rotate_tiles, p_->tiles_m);
    return work;
  }

  // The kernel's own (grid-constant) parameters, read in place: a copy in
  // every thread kept ~30 registers live across the mainloop.
  const Params* p_ = nullptr;
  int pending_m_ = -1, pending_n_ = 0;  // the last tile this thread's stores were issued for, unreported
};

}  // namespace weft::gemm_detail

namespace cutlass::gemm::kernel::detail {
template <int kStoreGroupsPerTile, int kStoreWarp, class ArchTag, class TileShape, class ClusterShape, uint32_t Stages>
struct TileSchedulerSelector<weft::gemm_detail::HookedSchedulerFor<kStoreGroupsPerTile, kStoreWarp>, ArchTag, TileShape,
                             ClusterShape, Stages> {
  using Scheduler = weft::gemm_detail::HookedScheduler<kStoreGroupsPerTile, kStoreWarp>;
};
}  // namespace cutlass::gemm::kernel::detail
