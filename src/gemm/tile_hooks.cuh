// tile_hooks.cuh (private) - the GEMM's communication hooks: a tile scheduler that rotates the tile
// order, makes one warp wait, per tile, for the rows that tile reads to have arrived, and reports
// each tile's rows once its stores are complete.
//
// CUTLASS's persistent kernels ask their tile scheduler for every tile, in
// every warp (mainloop producer, epilogue producer, consumers): the
// cooperative kernel through fetch_next_work, the pingpong kernel through
// advance_to_next_work then get_current_work (its two consumer warpgroups
// take alternate tiles). Wrapping the static persistent scheduler is
// therefore enough to put a wait exactly where a tile's data is first read,
// without touching the kernel (both kernels give the same warps these roles):
//   - RowWait::a_rows: the mainloop producer warp waits before its TMA loads
//     of A (AllGather + GEMM: the rows of a remote shard);
//   - RowWait::source_rows: the epilogue producer warp waits before its TMA
//     load of the C source (GEMM + ReduceScatter: the partial sum from the
//     previous rank), so the tile's mainloop runs meanwhile.
// The other warps never wait: they are fed through shared memory by the one
// that did. The rotation starts the order at a chosen row tile (the rank's own
// shard first); it is a multiple of the cluster's M extent, so the CTAs of a
// cluster keep sharing their B tile. Plans keep the row-major tile order
// (along N), so rows are consumed, and stored, in the order they travel; a
// plan that neither rotates nor reports may walk along M too
// (GemmOptions::any_tile_order). With RowSignals::waited_ns the waiting lane
// adds the time it spent on each flag to that flag's counter (diagnostics).
//
// Reporting (RowsDone, cooperative kernel only): the consumers ask for their next tile right after the
// epilogue has issued the TMA stores of this one. The warp that issued them
// (consumer warp 0, CTA warp 4 in the cooperative kernel) then waits for the
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
#include "weft/device/signal.cuh"
#include "weft/gemm/gemm.hpp"

namespace weft::gemm_detail {

/// What a configuration names to get the hooked scheduler (cutlass_kernel.cuh
/// turns it into HookedSchedulerFor<its epilogue's store count>).
struct HookedSchedulerTag {};
/// Selects HookedScheduler<kStoreGroupsPerTile> in CUTLASS's GemmUniversal.
template <int kStoreGroupsPerTile>
struct HookedSchedulerFor {};

/// kStoreGroupsPerTile: the bulk async-groups the epilogue commits per tile
/// (one per epilogue sub-tile), so that "at most this many in flight" means
/// "the previous tile's stores are complete".
template <int kStoreGroupsPerTile>
class HookedScheduler : public cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90 {
  using Base = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90;
  using BaseParams = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90Params;
  using BaseArguments = Base::Arguments;

 public:
  struct Arguments : BaseArguments {
    TileWaitParams wait{};
  };
  struct Params : BaseParams {
    TileWaitParams wait{};
    int tile_m = 0;
    int rotate_tiles = 0;
    int tiles_m = 0;  ///< row tiles, rounded up to the cluster's M extent
    int rows = 0;     ///< M: rows past it belong to no flag
    int tile_n = 0;
    int cols = 0;     ///< N
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
    p.wait = args.wait;
    p.tile_m = cute::size<0>(tile);
    p.rows = static_cast<int>(cute::get<0>(problem));
    p.tile_n = cute::size<1>(tile);
    p.cols = static_cast<int>(cute::get<1>(problem));
    const int cluster_m = cute::size<0>(cluster);
    p.tiles_m = static_cast<int>(p.problem_tiles_m_) * cluster_m;
    const int rot = static_cast<int>(args.wait.rotate_rows / p.tile_m);
    p.rotate_tiles = p.tiles_m > 0 ? (rot - rot % cluster_m) % p.tiles_m : 0;
    return p;
  }

  CUTLASS_HOST_DEVICE HookedScheduler() {}
  CUTLASS_DEVICE explicit HookedScheduler(Params const& params)
      : Base(params), p_(&params) {}

  template <class ClusterShape>
  CUTLASS_DEVICE WorkTileInfo initial_work_tile_info(ClusterShape) {
    return hooked(Base::get_current_work());
  }
  /// Called by every warp after its part of tile `work`: the consumers call
  /// it right after the epilogue issued the tile's stores.
  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo work) {
    Base::advance_to_next_work();
    WorkTileInfo next = hooked(Base::get_current_work());
    if (p_->wait.done && static_cast<int>(threadIdx.x / 32) == kStoreWarp) report_stored(work, next);
    return cute::make_tuple(next, true);
  }
  template <class Pipeline, class PipelineState>
  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo work, Pipeline&, PipelineState) {
    return fetch_next_work(work);
  }
  /// The pingpong kernel's way to ask (after advance_to_next_work). Hides the
  /// base's; the cooperative kernel never calls it, and nothing here calls
  /// it unqualified, so no tile is rotated or waited for twice.
  CUTLASS_DEVICE WorkTileInfo get_current_work() const { return hooked(Base::get_current_work()); }

 private:
  /// The warp whose lanes issue the epilogue's TMA stores: the first warp of
  /// the consumers, after the one producer warpgroup (cooperative kernel).
  static constexpr int kStoreWarp = 4;

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
    const std::int64_t per = p_->wait.rows_per_done;
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
    const std::int64_t per = p_->wait.rows_per_done;
    for (std::int64_t band = row0 / per; band * per < row1; ++band)
      dev::red_release(p_->wait.done + band, static_cast<std::uint64_t>(rows_in_band(row0, row1, band, per) * cols),
                       dev::Scope::sys);
  }

  /// The wait on flag f, and (RowSignals::waited_ns) its time: the flag's
  /// counter takes -start before the wait and +end after it (wrapping
  /// arithmetic). Out of line: inline, the wait with its timeout report made
  /// the cooperative hooked kernel spill 24 bytes (48 with the timing), out
  /// of line it spills none (ptxas -v, 128x256x64 c2x1).
  static __noinline__ __device__ void wait_flag(const TileWaitParams& w, std::int64_t f, int from) {
    const bool timed = w.waited_ns && threadIdx.x % 32 == 0;
    if (timed) atomicAdd(w.waited_ns + f, 0ull - dev::globaltimer_ns());
    dev::wait_until(w.world, w.flags + f, dev::Cmp::ge, w.value, dev::Scope::sys, from);
    if (timed) atomicAdd(w.waited_ns + f, dev::globaltimer_ns());
  }

  /// The rank that raises flag f (for the timeout report).
  CUTLASS_DEVICE static int raiser(const TileWaitParams& w, std::int64_t f) {
    return w.flags_per_rank > 0 ? static_cast<int>(f / w.flags_per_rank) : w.from_rank;
  }

  /// True if flag f (by rows) covers only rows present from the start: no tile waits for it.
  CUTLASS_DEVICE static bool ready_flag(const TileWaitParams& w, std::int64_t f) {
    const std::int64_t f_row0 = f * w.rows_per_flag;
    return w.cols_per_flag == 0 && f_row0 >= w.ready_begin && f_row0 + w.rows_per_flag <= w.ready_end;
  }

  /// RowSignals::consume, by the waiting warp of each CTA, once. That warp
  /// asks for a tile past its CTA's last only after every wait it makes, so
  /// when the last CTA's warp counts itself out, every tile has seen its
  /// flags raised: its lanes make sure of each flag that may be waited on
  /// (already up: reads only) and set them all back to 0, then the count. No
  /// peer raises one again before the next run's "free", which follows this
  /// kernel in stream order. Static and out of line, as wait_flag.
  static __noinline__ __device__ void leave(const Params& p) {
    const TileWaitParams& w = p.wait;
    const int lane = static_cast<int>(threadIdx.x % 32);
    std::uint64_t before = 0;
    if (lane == 0) before = dev::atomic_add(w.exits, 1, dev::Scope::gpu, dev::Order::acq_rel);
    before = __shfl_sync(0xffffffffu, before, 0);
    const std::uint64_t ctas = static_cast<std::uint64_t>(gridDim.x) * gridDim.y * gridDim.z;
    if (before != ctas - 1) return;
    dev::fence_acq_rel(dev::Scope::gpu);  // every lane sees what the other CTAs did before counting out
    const bool by_columns = w.cols_per_flag > 0;
    const std::int64_t count = by_columns ? (p.cols + w.cols_per_flag - 1) / w.cols_per_flag
                                          : (p.rows + w.rows_per_flag - 1) / w.rows_per_flag;
    auto* flags = const_cast<std::uint64_t*>(w.flags);  // the caller handed them over (RowSignals::consume)
    for (std::int64_t f = lane; f < count; f += 32) {
      if (ready_flag(w, f)) continue;  // never raised
      dev::wait_until(w.world, flags + f, dev::Cmp::ge, w.value, dev::Scope::sys, raiser(w, f));
      dev::st_relaxed(flags + f, 0, dev::Scope::sys);
    }
    __syncwarp();
    if (lane == 0) dev::st_relaxed(w.exits, 0, dev::Scope::gpu);
  }

  CUTLASS_DEVICE WorkTileInfo hooked(WorkTileInfo work) const {
    if (!work.is_valid()) {
      if (p_->wait.exits && !left_ && static_cast<int>(threadIdx.x / 32) == p_->wait.wait_warp) {
        left_ = true;
        leave(*p_);
      }
      return work;
    }
    if (p_->rotate_tiles) work.M_idx = (work.M_idx + p_->rotate_tiles) % p_->tiles_m;
    const TileWaitParams& w = p_->wait;
    if (w.flags && static_cast<int>(threadIdx.x / 32) == w.wait_warp) {
      const std::int64_t row0 = static_cast<std::int64_t>(work.M_idx) * p_->tile_m;
      const std::int64_t row1 = std::min<std::int64_t>(row0 + p_->tile_m, p_->rows);  // the last tile may run past M
      if (row0 < row1 && (row0 < w.ready_begin || row1 > w.ready_end)) {
        bool waited = false;
        if (w.cols_per_flag > 0) {  // flags by column band: the source arrives band by band, every row at once
          const std::int64_t col0 = static_cast<std::int64_t>(work.N_idx) * p_->tile_n;
          const std::int64_t col1 = std::min<std::int64_t>(col0 + p_->tile_n, p_->cols);
          for (std::int64_t f = col0 / w.cols_per_flag; f * w.cols_per_flag < col1; ++f) {
            wait_flag(w, f, raiser(w, f));
            waited = true;
          }
        } else {
          for (std::int64_t f = row0 / w.rows_per_flag; f * w.rows_per_flag < row1; ++f) {
            if (ready_flag(w, f)) continue;
            wait_flag(w, f, raiser(w, f));
            waited = true;
          }
        }
        // The rows came from a copy engine or a peer; the TMA loads that read
        // them next belong to the async proxy.
        if (waited) dev::fence_proxy_async_global();
      }
    }
    return work;
  }

  // The kernel's own (grid-constant) parameters, read in place: a copy in
  // every thread kept ~30 registers live across the mainloop, and passing the
  // World to the timeout report by reference put that copy on the stack (the
  // hooked kernels spilled where the plain ones did not, and ran 1-4 % slower).
  const Params* p_ = nullptr;
  int pending_m_ = -1, pending_n_ = 0;  // the last tile this thread's stores were issued for, unreported
  mutable bool left_ = false;            // this thread counted its CTA out (leave)
};

}  // namespace weft::gemm_detail

namespace cutlass::gemm::kernel::detail {
template <int kStoreGroupsPerTile, class ArchTag, class TileShape, class ClusterShape, uint32_t Stages>
struct TileSchedulerSelector<weft::gemm_detail::HookedSchedulerFor<kStoreGroupsPerTile>, ArchTag, TileShape,
                             ClusterShape, Stages> {
  using Scheduler = weft::gemm_detail::HookedScheduler<kStoreGroupsPerTile>;
};
}  // namespace cutlass::gemm::kernel::detail
