// ring_executor.hpp (private) - GEMM+ReduceScatter's fused ring: its buffers,
// its GEMMs, and one loop that enqueues any RingPlan (ring_plan.hpp).
//
// GemmRs runs it into its `out`; GemmAr runs it with `caller_ships`, sending
// our own block to every peer as the last GEMM stores it. Per step: the
// step's GEMM (src/gemm/tile_hooks.cuh's hooks: a source added as it lands,
// stored rows reported), then the step's sends on the copy pipe's side stream,
// each chunk after the GEMM has stored it and followed by a flag raised on
// the receiver from the stream's front end.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "copy_pipe.hpp"
#include "overlap.hpp"
#include "path_choice.hpp"
#include "ring_plan.hpp"
#include "trace.hpp"
#include "weft/core/cuda_resources.hpp"
#include "weft/gemm/gemm.hpp"
#include "weft/ops/gemm_rs.hpp"

namespace weft::ops_detail {

/// GemmRs's fused ways, in the order plans list (and, on their first run, time) them.
inline constexpr FusedWay kFusedWays[] = {FusedWay::ring_per_step, FusedWay::ring_one_launch,
                                          FusedWay::ring_plain_first, FusedWay::one_launch_add};

/// The way whose path name (weft::path_name) is `path`; FusedWay::automatic for any other.
FusedWay fused_way_of(const std::string& path);

/// What a ring is built for.
struct RingOptions {
  const char* who = "GemmRs";  ///< names the plan in errors
  PlanShape shape{};
  BLayout b_layout = BLayout::nk;
  FusedWay way = FusedWay::automatic;  ///< the way asked for: automatic builds every way it may time
  RowChunks rows{};                    ///< rows per rank (a block), and its chunks
  bool caller_ships = false;           ///< the last step's block leaves by the caller (GemmAr)
};

class RingExecutor {
 public:
  /// Checks that the shape allows the way asked for (throws naming `who`),
  /// builds that way's GEMMs, and at 2 ranks or more allocates the staging,
  /// flags and send buffer in the symmetric heap. Collective.
  RingExecutor(std::shared_ptr<Context> ctx, const RingOptions& options);

  /// True if the ring built this way: the way asked for, or for automatic,
  /// the per-step ring and the plain first step (2 ranks or more), and one
  /// launch at 2 ranks (at 3 and more it runs when asked for: automatic picks
  /// by time alone, so a way without a GPU figure there is left out). One
  /// launch needs M / W a multiple of 512; one launch adding is never built
  /// by automatic (docs/decisions/0033).
  bool builds(FusedWay way) const;
  /// The fused paths of the ways built, in kFusedWays's order (the per-step
  /// ring first: the pick under capture); `enqueue(s, way)` enqueues one call.
  std::vector<FusedPath> paths(const std::function<void(cudaStream_t, FusedWay)>& enqueue) const;
  /// The GEMM configurations of `way`'s steps: "X" for one GEMM, "X; then Y"
  /// (the first step, then the rest), "X; then Y; last Z" where the last step
  /// runs its own; "" for a way not built.
  std::string gemm_config(FusedWay way) const;
  const RingLayout& layout() const { return layout_; }
  /// WEFT_TILE_WAITS's counters, one per [block][chunk] arrival flag.
  TileWaits& tile_waits() { return tile_waits_; }

  /// Called once per run where the caller ships our block (GemmAr), after
  /// the GEMMs are enqueued, with the side stream (past every peer's "free"
  /// for this run, joined back at the end of the run) and our block's
  /// stored-row counters: chunk c of `out` is final once done[c] >= done_value.
  using ShipOwnBlock = std::function<void(cudaStream_t side, const std::uint64_t* done, std::uint64_t done_value)>;
  /// out [M / W, N] = our block of the sum, `way`'s ring enqueued on `stream`.
  /// `all_rows`: where the caller has room for all M rows, `out` being our
  /// block of it (GemmAr's out). One launch then stores there (else into the
  /// private send buffer, from which our block moves to `out`); one launch
  /// adding stores into the send buffer either way, and its peer's partial
  /// sum of our block lands in `all_rows`'s block of ours (else in `out`).
  void run(FusedWay way, const void* a, const void* b, void* out, cudaStream_t stream,
           const ShipOwnBlock& ship_own = {}, void* all_rows = nullptr);

 private:
  Gemm& gemm(RingGemm kind) const;
  const RingPlan& plan(FusedWay way) const;
  /// The step's GEMM arguments: `d` is where non-final blocks are stored.
  GemmArgs step_args(const RingStep& step, const void* a, const void* b, void* out, char* d) const;
  void enqueue_send(const BlockSend& send, void* out, char* d, void* all_rows, cudaStream_t side,
                    const ShipOwnBlock& ship_own) const;

  std::shared_ptr<Context> ctx_;
  RingOptions options_;
  RingLayout layout_;
  std::int64_t band_cols_ = 0;  // > 0: a plain first step's block leaves in column bands this wide (2 ranks)
  std::array<std::optional<RingPlan>, 4> plans_;  // per way of kFusedWays: this rank's ring, where built
  std::array<std::unique_ptr<Gemm>, kRingGemmKinds> gemms_;
  CopyPipe pipe_;
  TileWaits tile_waits_;
  SymmetricBuffer staging_;  // [M, N]: block b's partial sum from rank - 1
  SymmetricBuffer flags_;    // RingLayout's arrival flags and stored-row counters
  DeviceBuffer send_;        // [M, N], local: the partial sums that leave (one launch: every block)
  Event step_done_;          // a plain first step's GEMM has finished
};

}  // namespace weft::ops_detail
