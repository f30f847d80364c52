// weft/ops/gemm_rs.hpp - GEMM + ReduceScatter, overlapped: out_r = sum over ranks of rows block r of A_q x B_q.
//
// Tensor-parallel row-sharded Linear: each rank holds A_q [M, K_q] (its slice
// of the inner dimension) and B_q ([N, K_q] as PyTorch stores it, or [K_q, N]).
// Rank r ends with its block of rows of the sum, out_r [M/W, N].
//
// Fused path (a ring, docs/decisions/0028): the M rows are W blocks. At step s,
// rank r computes block b = (r - 1 - s) mod W with a persistent GEMM whose
// epilogue adds the partial sum of that block received from rank r - 1
// (D = A_b x B + S); the epilogue warp of each tile waits only for the chunk
// of S that tile adds. The result goes, by copy engine and chunk by chunk, to
// rank r + 1's staging, each chunk followed by a flag raised from the stream's
// front end. A chunk leaves as soon as the tiles covering it have stored it
// (the GEMM reports stored rows, weft::RowsDone), while the step goes on. At
// the last step the block is rank r's own and D is the output; that step sends
// nothing on (unless GemmAr ships it), so its GEMM may walk its tiles in any
// order (GemmOptions::any_tile_order), which the tuner times.
// The ring runs as one GEMM launch per step ("fused"), or as one persistent
// GEMM over all M rows whose tiles walk whole blocks in ring order, from the
// first step's block down ("fused, one launch": the same waits and reports,
// without a kernel boundary and a half-size GEMM per step; the first block
// adds no source). Either
// way block b accumulates in the fixed order b+1, b+2, ..., b: repeated runs
// are bitwise identical (each way with its own bits).
// At 2 ranks there is also "fused, one launch, adding" (FusedWay::
// one_launch_add): one GEMM over all M rows, the peer's block first, stored
// and sent chunk by chunk by copy engine straight into the peer's `out`;
// then our own block, whose tiles wait for the peer's partial sum of their
// rows to land in our `out` and add theirs onto it by TMA reduce-add: no
// source load, no second kernel (the ring's two steps cost 1.07-1.08x the
// whole GEMM before anything is sent: docs/decisions/0033). The
// sum, bf16(own) + bf16(peer's) rounded once, is what NCCL's ReduceScatter of
// the bf16 partial sums gives. It needs `out` in the symmetric heap, the same
// buffer on every rank. Sequential path: a plain GEMM (weft's, or cuBLAS where
// the tuner finds it faster), then weft's ReduceScatter. `automatic` times
// both on the first run (outside graph capture) and keeps the faster, the same
// on every rank.
// Across nodes (or virtual nodes), with weft::internode and a
// weft::RemotePeers alive: the fused path is "fused, two-level steps"
// (docs/decisions/0075): a plain GEMM per block of M / W rows in the order
// the two-level ReduceScatter reaches the blocks (hierarchy::rs_block: the
// other nodes' blocks first, this node's last, this rank's own very last),
// each followed by a word the stream's front end raises; the ReduceScatter
// kernel runs on a side stream, each of its thread blocks reading a block's
// partial once its word is up. The ring's ways are refused there (FusedWay
// automatic only); the sequential path's ReduceScatter takes the two-level
// schedule (docs/decisions/0073).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "weft/gemm/gemm.hpp"
#include "weft/ops/collective.hpp"
#include "weft/ops/reduce_scatter.hpp"
#include "weft/runtime/context.hpp"

namespace weft {

namespace ops_detail {
class RingExecutor;
class PathChoice;
class CopyPipe;
class TwoLevelRsAfterStores;
}  // namespace ops_detail

/// Which fused way a plan runs.
enum class FusedWay {
  automatic,        ///< every way the plan can run, timed on the first run with the sequential paths
  ring_per_step,    ///< the ring, one GEMM per step over M / W rows
  /// The ring as one persistent GEMM over all M rows, its tiles walking the
  /// blocks in the ring's order; needs M / W a multiple of 512. Among
  /// automatic's ways at 2 ranks; at 3 and more it runs when asked for
  /// (automatic does not time it there: no figure between 3 or more GPUs).
  ring_one_launch,
  /// The ring per step, its first step a plain GEMM (any tile order, or
  /// cuBLAS: the fastest the tuner finds) whose block leaves once whole,
  /// under the next step's GEMM; needs 2 ranks or more.
  ring_plain_first,
  /// 2 ranks: one persistent GEMM over all M rows, the peer's block first
  /// (sent by copy engine into the peer's `out` as it is stored), then ours,
  /// added onto the peer's partial sum in `out` by TMA reduce-add
  /// (GemmHook::add_rows); needs M / 2 a multiple of 512 and `out` in the
  /// symmetric heap (the same buffer on every rank); a run with another
  /// `out` is refused, naming why. Built only when asked for (not among
  /// automatic's ways) until its GPU tests have passed (docs/decisions/0033).
  one_launch_add
};

/// The path name a fused way runs under (GemmRs::path(), GemmAr::path()):
/// "fused" (ring_per_step), "fused, one launch", "fused, plain first step",
/// "fused, one launch, adding" (one_launch_add);
/// "fused, automatic" for FusedWay::automatic, which no run reports.
const char* path_name(FusedWay way);

/// What a GemmRs plan is built for.
struct GemmRsOptions {
  std::int64_t m = 0;  ///< rows of A and of the full sum; a multiple of the world size
  std::int64_t n = 0;  ///< columns of the output
  std::int64_t k = 0;  ///< this rank's slice of the inner dimension (K / W); not a multiple of 8: sequential, on cuBLAS
  DType dtype = DType::bf16;  ///< bf16 or fp16
  BLayout b_layout = BLayout::nk;
  OverlapMode mode = OverlapMode::automatic;
  /// Copy and signal granularity: at most this many chunks per block of M / W
  /// rows, fewer where a chunk would be under 8 MB (each costs a copy launch
  /// and a stream wait), rounded down to divide M / W.
  int chunks_per_block = 8;
  FusedWay way = FusedWay::automatic;  ///< the fused path's way (or ways, timed)
};

/// A planned GEMM + ReduceScatter. Collective construction; runs many times
/// (epochs: no resets), graph-capturable once its path is chosen.
class GemmRs {
 public:
  /// Plans GEMM + ReduceScatter for `options` on every rank of `ctx`
  /// (collective: same options on every rank, checked). Allocates its staging
  /// and flags in the symmetric heap and builds the GEMMs its modes need; the
  /// path is chosen on the first run(). Throws weft::Error naming what was
  /// expected on bad options (bf16, M a multiple of the world size, Gemm's
  /// rules on N and K: multiples of 8).
  GemmRs(std::shared_ptr<Context> ctx, const GemmRsOptions& options);
  ~GemmRs();
  GemmRs(const GemmRs&) = delete;
  GemmRs& operator=(const GemmRs&) = delete;

  /// out [M/W, N] = rows block `rank` of sum_q A_q x B_q, on `stream`. `a`: this
  /// rank's [M, k]; `b`: [N, k] (nk) or [k, N] (kn); `out`: any device memory,
  /// or (for FusedWay::one_launch_add, where peers copy into it) a buffer of
  /// the symmetric heap, the same one on every rank.
  /// Every rank calls it, in the same order. Throws weft::Error naming what was
  /// expected on bad input.
  void run(const void* a, const void* b, void* out, cudaStream_t stream);

  /// "fused" (the ring, a GEMM per step), "fused, one launch", "fused, plain
  /// first step", "fused, one launch, adding", "fused, two-level steps"
  /// (across nodes), "sequential"
  /// (the GEMM, then weft's reduce-scatter), "sequential, NCCL" (NCCL's), or
  /// "" before the first run.
  std::string path() const;
  /// The first automatic run's measurement of the fused path (ms, slowest
  /// rank), else 0.
  float measured_fused_ms() const;
  /// The same for the sequential path (the GEMM, then the reduce-scatter), else 0.
  float measured_sequential_ms() const;
  /// The chosen path's GEMM configurations, or "" before the first run.
  std::string gemm_config() const;
  /// A fused way's GEMM configurations, whichever path runs: per step, the
  /// first step's, then the steps' that add a source ("X; then Y", or "X;
  /// then Y; last Z" where the last step, which sends nothing on, runs its
  /// own); in one launch, its one GEMM's. "" before they are chosen.
  std::string fused_gemm_config(FusedWay way) const;
  /// True if the plan built this fused way (GemmRsOptions::way, and what the
  /// shape allows: one launch needs M / W a multiple of 512, and is built by
  /// automatic at 2 ranks only; a plain first step, 2 ranks or more; one
  /// launch adding, exactly 2 ranks and M / 2 a multiple of 512).
  bool builds(FusedWay way) const;
  /// The options as planned: `mode` is sequential where the shape left the
  /// fused paths out (K or N not a multiple of 8; logged at info).
  const GemmRsOptions& options() const { return options_; }

 private:
  void run_sequential(const void* a, const void* b, void* out, cudaStream_t stream, bool nccl);
  /// Across nodes, the fused path: block GEMMs into partial_ in rs_block
  /// order, each raising its stored_ word; the two-level ReduceScatter after
  /// stores on the side stream.
  void run_two_level_steps(const void* a, const void* b, void* out, cudaStream_t stream);

  std::shared_ptr<Context> ctx_;
  GemmRsOptions options_;
  unsigned operand_alignment_ = 16;  // operands' bytes: 16 for TMA, one element where cuBLAS alone runs
  std::int64_t block_rows_ = 0;
  std::unique_ptr<ops_detail::RingExecutor> ring_;  // the fused ways (src/ops/ring_executor.hpp)
  std::unique_ptr<ops_detail::PathChoice> choice_;  // which path runs
  // The sequential path: the GEMM into partial_ [M, N], then the reduce-scatter.
  std::unique_ptr<Gemm> plain_gemm_;
  SymmetricBuffer partial_;  // [M, N]: the sequential path's, and across nodes the fused path's
  std::unique_ptr<ReduceScatter> reduce_scatter_;
  // Across nodes, the fused path (null on one node): a GEMM over M / W rows,
  // the blocks in rs_block order, a u64 word per block, the side stream.
  std::unique_ptr<Gemm> block_gemm_;
  std::vector<int> block_order_;
  SymmetricBuffer stored_;
  std::unique_ptr<ops_detail::CopyPipe> pipe_;
  std::unique_ptr<ops_detail::TwoLevelRsAfterStores> rs_after_stores_;
};

}  // namespace weft
