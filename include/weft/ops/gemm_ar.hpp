// weft/ops/gemm_ar.hpp - GEMM + AllReduce, overlapped: out = sum over ranks of A_q x B_q, on every rank.
//
// The same operands as GemmRs (A_q [M, K_q], B_q [N, K_q] or [K_q, N]); every
// rank ends with the whole sum [M, N].
// Fused path (two-shot): GemmRs's ring (one launch or one per step) leaves
// rank r's block of rows of the sum directly in its rows of `out`; the copy engines then push that block to
// every peer's `out`, chunk by chunk, each chunk followed by a flag raised on
// the peer from the stream's front end. Same fixed summation order as GemmRs:
// repeated runs are bitwise identical, and every rank holds the same bits.
// Sequential path (what small M wants: one-shot): a plain GEMM (weft's, or
// cuBLAS where faster) into `out`, then weft's AllReduce in place. `automatic`
// times both on the first run and keeps the faster, the same on every rank.
// Across nodes (or virtual nodes), with weft::internode and a
// weft::RemotePeers alive: the sequential path's AllReduce takes the two-level
// schedule (docs/decisions/0073), and the fused path ("fused, two-level
// steps") is GemmRs's across nodes (a GEMM per block beside the two-level
// ReduceScatter, 0075) into this rank's rows of `out`, then the two-level
// AllGather of the summed blocks in place: 3 / (2 x nodes) of the AllReduce's
// NIC bytes, which the cost model puts at 1.19-1.35x the sequential path at
// 16-64 GPUs (docs/SCALE.md; decision 0076). The ring's ways are refused there.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "weft/ops/all_gather.hpp"
#include "weft/ops/all_reduce.hpp"
#include "weft/ops/gemm_rs.hpp"

namespace weft::ops_detail {
class RingExecutor;
class PathChoice;
}  // namespace weft::ops_detail

namespace weft {

/// What a GemmAr plan is built for (the fields mean what they mean for GemmRs).
struct GemmArOptions {
  std::int64_t m = 0, n = 0, k = 0;
  DType dtype = DType::bf16;  ///< bf16 or fp16
  BLayout b_layout = BLayout::nk;
  OverlapMode mode = OverlapMode::automatic;
  int chunks_per_block = 8;
  FusedWay way = FusedWay::automatic;
};

/// A planned GEMM + AllReduce. Collective construction; runs many times.
class GemmAr {
 public:
  /// Plans GEMM + AllReduce for `options` on every rank of `ctx` (collective:
  /// same options on every rank, checked). Allocates its staging and flags in
  /// the symmetric heap and builds the GEMMs its modes need; the path is
  /// chosen on the first run(). Throws weft::Error naming what was expected
  /// on bad options (bf16, M a multiple of the world size, Gemm's rules on N
  /// and K: multiples of 8).
  GemmAr(std::shared_ptr<Context> ctx, const GemmArOptions& options);
  ~GemmAr();
  GemmAr(const GemmAr&) = delete;
  GemmAr& operator=(const GemmAr&) = delete;

  /// out [M, N] = sum_q A_q x B_q on every rank, on `stream`. `out` must be in
  /// the symmetric heap (peers write their blocks into it). Every rank calls
  /// it, in the same order. Throws weft::Error naming what was expected.
  void run(const void* a, const void* b, void* out, cudaStream_t stream);

  /// "fused" (the ring a GEMM per step), "fused, one launch", "fused,
  /// two-level steps" (across nodes), "sequential" (the GEMM, then weft's
  /// all-reduce), "sequential, NCCL" (NCCL's), or "" before the first run.
  std::string path() const;
  /// The first automatic run's measurement of the fused path (ms, slowest
  /// rank), else 0.
  float measured_fused_ms() const;
  /// The same for the sequential path (the GEMM, then the all-reduce), else 0.
  float measured_sequential_ms() const;
  /// The GEMM configuration(s) the path uses.
  std::string gemm_config() const;
  /// The options as planned: `mode` is sequential where the shape left the
  /// fused paths out (K or N not a multiple of 8, M not a multiple of the world size; logged at info).
  const GemmArOptions& options() const { return options_; }

 private:
  void run_fused(const void* a, const void* b, void* out, cudaStream_t stream, FusedWay way);
  void run_sequential(const void* a, const void* b, void* out, cudaStream_t stream, bool nccl);
  void run_two_level_steps(const void* a, const void* b, void* out, cudaStream_t stream);

  std::shared_ptr<Context> ctx_;
  GemmArOptions options_;
  unsigned operand_alignment_ = 16;  // operands' bytes: 16 for TMA, one element where cuBLAS alone runs
  std::unique_ptr<ops_detail::RingExecutor> ring_;  // fused: GemmRs's ring into our rows of out, shipped by us
  std::unique_ptr<ops_detail::PathChoice> choice_;  // which path runs
  SymmetricBuffer arrived_;  // u64 [W][chunks]: chunk c of rank q's block has landed in out
  std::unique_ptr<Gemm> plain_gemm_;
  std::unique_ptr<AllReduce> all_reduce_;
  std::unique_ptr<GemmRs> two_level_rs_;     // across nodes, fused: our block of the sum into our rows of out
  std::unique_ptr<AllGather> two_level_ag_;  // then every block, in place
};

}  // namespace weft
