// tile_hooks.cuh (private) - the GEMM's communication hook: a tile scheduler that rotates the tile
// order and makes one warp wait, per tile, for the rows that tile reads to have arrived.
//
// CUTLASS's persistent kernels ask their tile scheduler for every tile, in
// every warp (mainloop producer, epilogue producer, consumers). Wrapping the
// static persistent scheduler is therefore enough to put a wait exactly where
// a tile's data is first read, without touching the kernel:
//   - RowWait::a_rows: the mainloop producer warp waits before its TMA loads
//     of A (AllGather + GEMM: the rows of a remote shard);
//   - RowWait::source_rows: the epilogue producer warp waits before its TMA
//     load of the C source (GEMM + ReduceScatter: the partial sum from the
//     previous rank), so the tile's mainloop runs meanwhile.
// The other warps never wait: they are fed through shared memory by the one
// that did. The rotation starts the order at a chosen row tile (the rank's own
// shard first); it is a multiple of the cluster's M extent, so the CTAs of a
// cluster keep sharing their B tile.
#pragma once

#include "cutlass/gemm/kernel/sm90_tile_scheduler.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "config.hpp"
#include "weft/device/signal.cuh"
#include "weft/gemm/gemm.hpp"

namespace weft::gemm_detail {

/// Tag selecting HookedScheduler in CUTLASS's GemmUniversal.
struct HookedSchedulerTag {};

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
    const int cluster_m = cute::size<0>(cluster);
    p.tiles_m = static_cast<int>(p.problem_tiles_m_) * cluster_m;
    const int rot = static_cast<int>(args.wait.rotate_rows / p.tile_m);
    p.rotate_tiles = p.tiles_m > 0 ? (rot - rot % cluster_m) % p.tiles_m : 0;
    return p;
  }

  CUTLASS_HOST_DEVICE HookedScheduler() {}
  CUTLASS_DEVICE explicit HookedScheduler(Params const& params)
      : Base(params), wait_(params.wait), tile_m_(params.tile_m), rotate_tiles_(params.rotate_tiles),
        tiles_m_(params.tiles_m), rows_(params.rows) {}

  template <class ClusterShape>
  CUTLASS_DEVICE WorkTileInfo initial_work_tile_info(ClusterShape) {
    return hooked(Base::get_current_work());
  }
  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo) {
    Base::advance_to_next_work();
    return cute::make_tuple(hooked(Base::get_current_work()), true);
  }
  template <class Pipeline, class PipelineState>
  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo work, Pipeline&, PipelineState) {
    return fetch_next_work(work);
  }

 private:
  CUTLASS_DEVICE WorkTileInfo hooked(WorkTileInfo work) const {
    if (!work.is_valid()) return work;
    if (rotate_tiles_) work.M_idx = (work.M_idx + rotate_tiles_) % tiles_m_;
    const TileWaitParams& w = wait_;
    if (w.flags && static_cast<int>(threadIdx.x / 32) == w.wait_warp) {
      const std::int64_t row0 = static_cast<std::int64_t>(work.M_idx) * tile_m_;
      const std::int64_t row1 = std::min<std::int64_t>(row0 + tile_m_, rows_);  // the last tile may run past M
      if (row0 < row1 && (row0 < w.ready_begin || row1 > w.ready_end)) {
        bool waited = false;
        for (std::int64_t f = row0 / w.rows_per_flag; f * w.rows_per_flag < row1; ++f) {
          const std::int64_t f_row0 = f * w.rows_per_flag;
          if (f_row0 >= w.ready_begin && f_row0 + w.rows_per_flag <= w.ready_end) continue;
          const int from = w.flags_per_rank > 0 ? static_cast<int>(f / w.flags_per_rank) : w.from_rank;
          dev::wait_until(w.world, w.flags + f, dev::Cmp::ge, w.value, dev::Scope::sys, from);
          waited = true;
        }
        // The rows came from a copy engine or a peer; the TMA loads that read
        // them next belong to the async proxy.
        if (waited) dev::fence_proxy_async_global();
      }
    }
    return work;
  }

  TileWaitParams wait_;
  int tile_m_, rotate_tiles_, tiles_m_, rows_;
};

}  // namespace weft::gemm_detail

namespace cutlass::gemm::kernel::detail {
template <class ArchTag, class TileShape, class ClusterShape, uint32_t Stages>
struct TileSchedulerSelector<weft::gemm_detail::HookedSchedulerTag, ArchTag, TileShape, ClusterShape, Stages> {
  using Scheduler = weft::gemm_detail::HookedScheduler;
};
}  // namespace cutlass::gemm::kernel::detail
