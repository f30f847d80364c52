// weft/ops/ag_gemm.hpp - AllGather + GEMM, overlapped: C = allgather(A) x B^T on every rank.
//
// Tensor-parallel column-sharded Linear: each rank holds a row shard of the
// activations, A_r [M/W, K], and its own column block of the weight, B_r
// ([N_r, K] as PyTorch stores it, or [K, N_r]). Every rank computes
// C_r = [A_0; A_1; ...; A_{W-1}] x B_r^T, [M, N_r], and ends with the gathered A.
//
// Fused path (one persistent GEMM; docs/ARCHITECTURE.md, docs/decisions/0021 and 0022):
//   - at the start, each rank tells every peer "my gathered A is free" from the
//     stream's front end; its pushes wait (on a side stream) for every peer's
//     word, the GEMM waits for nobody and starts on the local rows;
//   - the copy engines push this rank's shard into every peer's gathered A, in
//     chunks, each followed by a flag raised on the peer from the stream's
//     front end (no SM involved);
//   - the GEMM starts at this rank's own rows and walks the shards in the order
//     they arrive (rank r, r+1, ...); the producer warp of each tile waits only
//     for the chunk flags of the rows that tile reads.
// Fused path with plain steps (AgWay::plain_steps): the same pushes, and a
// plain GEMM per shard (any tile order, or cuBLAS), ours first; each later one
// starts after a one-block wait (bounded by the timeout) for its shard's
// flags, which landed while the step before ran.
// Sequential path: weft's AllGather, then a plain GEMM (weft's, or cuBLAS where
// the tuner finds it faster). `automatic` times both
// on the first run (outside graph capture) and keeps the faster, the same on
// every rank; path() says which runs.
// Across nodes (or virtual nodes), with weft::internode and a
// weft::RemotePeers alive: the fused path is plain steps over the two-level
// AllGather (docs/decisions/0074). That kernel gathers on a side stream,
// counting each shard's landed slices; a plain GEMM per shard runs in the
// order the shards land (own, then by hop: the rail's shard, then the node
// peers'), each after a one-block wait for its count. AgWay::one_gemm is
// refused there; the sequential path's AllGather takes the two-level schedule
// (docs/decisions/0073).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "weft/gemm/gemm.hpp"
#include "weft/ops/all_gather.hpp"
#include "weft/ops/collective.hpp"
#include "weft/runtime/context.hpp"

namespace weft {

/// Which fused way an AgGemm plan runs.
enum class AgWay {
  automatic,   ///< every way the plan can run, timed on the first run with the sequential paths
  one_gemm,    ///< one hooked persistent GEMM over all M rows, its tiles waiting for their rows ("fused")
  /// a plain GEMM per shard (any tile order, or cuBLAS), the local one first,
  /// each later one once its shard has landed ("fused, plain steps"); 2 ranks
  /// or more; the one fused way across nodes
  plain_steps
};

/// The path name a fused way runs under (AgGemm::path()): "fused"
/// (one_gemm), "fused, plain steps"; "fused, automatic" for AgWay::automatic,
/// which no run reports.
const char* path_name(AgWay way);

/// What an AgGemm plan is built for.
struct AgGemmOptions {
  std::int64_t m = 0;  ///< rows of the gathered A (all ranks together); a multiple of the world size
  std::int64_t n = 0;  ///< this rank's columns of C (N / W for a column-sharded weight)
  std::int64_t k = 0;  ///< inner dimension (not a multiple of 8: the sequential path, on cuBLAS)
  DType dtype = DType::bf16;  ///< bf16 or fp16
  BLayout b_layout = BLayout::nk;
  OverlapMode mode = OverlapMode::automatic;
  /// Copy and signal granularity: at most this many chunks per shard, fewer
  /// where a chunk would be under 16 MB (each costs a copy launch and a
  /// signal), rounded down to divide M / W.
  int chunks_per_shard = 4;
  AgWay way = AgWay::automatic;  ///< the fused path's way (or ways, timed)
};

namespace ops_detail {
struct AgPlan;
class CopyPipe;
class PathChoice;
class TileWaits;
class TwoLevelAgArrivals;
}  // namespace ops_detail

/// A planned AllGather + GEMM. Collective construction; runs many times
/// (epochs: no resets), graph-capturable once its path is chosen.
class AgGemm {
 public:
  /// Plans AllGather + GEMM for `options` on every rank of `ctx` (collective:
  /// every rank constructs it with the same options, or the call check
  /// names the rank that differs). Allocates the gathered A and the arrival
  /// flags in the symmetric heap and builds the GEMMs its modes need; the
  /// path is chosen (and the GEMMs tuned) on the first run(). Throws
  /// weft::Error naming what was expected on bad options (bf16, M a multiple
  /// of the world size, Gemm's rules on N and K: multiples of 8).
  AgGemm(std::shared_ptr<Context> ctx, const AgGemmOptions& options);
  ~AgGemm();
  AgGemm(const AgGemm&) = delete;
  AgGemm& operator=(const AgGemm&) = delete;

  /// This rank's slot of the gathered A ([M/W, K], symmetric). Writing the
  /// shard here and passing it to run() saves a copy.
  void* local_shard() const;
  /// The gathered A [M, K], complete once run() is (on the run's stream).
  const void* gathered() const;

  /// C [M, n] = gathered(A) x B^T on `stream`. `a_shard`: this rank's [M/W, K]
  /// (any device memory; local_shard() avoids a copy). `b`: [n, K] (nk) or
  /// [K, n] (kn). `c`: [M, n], any device memory. Every rank calls it, in the
  /// same order. Throws weft::Error naming what was expected on bad input.
  void run(const void* a_shard, const void* b, void* c, cudaStream_t stream);

  /// "fused" (one hooked GEMM), "fused, plain steps" (a GEMM per shard),
  /// "sequential" (weft's all-gather, then the GEMM), "sequential, NCCL"
  /// (NCCL's; never where ranks share a GPU), or "" before the first run.
  std::string path() const;
  /// The first automatic run's measurement of the fused path (ms, slowest
  /// rank), else 0.
  float measured_fused_ms() const;
  /// The same for the sequential path (all-gather, then the GEMM), else 0.
  float measured_sequential_ms() const;
  /// The GEMM configuration the path uses.
  std::string gemm_config() const;
  /// The options as planned: `mode` is sequential where the shape left the
  /// fused paths out (K or N not a multiple of 8; logged at info).
  const AgGemmOptions& options() const { return options_; }

 private:
  /// Enqueues a fused way's run from its plan (ag_plan.hpp): its pushes (or,
  /// across nodes, the two-level AllGather), then its steps.
  void run_plan(const ops_detail::AgPlan& plan, const void* b, void* c, cudaStream_t stream);
  /// On the side stream: our shard to each of `peers` in order, chunk by chunk, each chunk's flag raised there.
  void push_shard(const std::vector<int>& peers, cudaStream_t side);
  /// The hooked GEMM's arguments: gathered A, and the row flags of the shards still to arrive.
  GemmArgs fused_args(const void* b, void* c) const;
  void run_sequential(const void* b, void* c, cudaStream_t stream, bool nccl);
  /// The shards gathered into gathered_, by NCCL or weft's AllGather (the
  /// sequential paths, and real data for the fused GEMMs to tune on).
  void gather(cudaStream_t stream, bool nccl);

  std::shared_ptr<Context> ctx_;
  AgGemmOptions options_;
  unsigned operand_alignment_ = 16;  // operands' bytes: 16 for TMA, one element where cuBLAS alone runs
  std::int64_t shard_rows_, chunk_rows_, chunks_;
  std::unique_ptr<ops_detail::TileWaits> tile_waits_;  // WEFT_TILE_WAITS: per flag of arrived_
  std::unique_ptr<ops_detail::CopyPipe> pipe_;         // fused: the side stream and the "free" exchange
  std::unique_ptr<ops_detail::PathChoice> choice_;     // which path runs
  std::vector<ops_detail::AgPlan> plans_;              // each built fused way's run on this rank, in AgWay order
  SymmetricBuffer gathered_;  // [M, K]
  SymmetricBuffer arrived_;   // u64 [W x chunks]: chunk c of shard q has landed here (across nodes: word q counts blocks)
  std::unique_ptr<Gemm> fused_gemm_, plain_gemm_;
  std::unique_ptr<Gemm> step_gemm_;  // AgWay::plain_steps: M / W rows, no hook
  std::unique_ptr<AllGather> all_gather_;
  // Across nodes, the fused path's AllGather: counts each shard's landed slices
  // into arrived_'s word q (docs/decisions/0074); null on one node.
  std::unique_ptr<ops_detail::TwoLevelAgArrivals> ag_arrivals_;
};

}  // namespace weft
