// weft/ops/moe_tp.hpp - MoE under tensor parallelism: AllGather + the up-projection's grouped
// GEMM (AgMoe, sequential or overlapped), then the down-projection's grouped GEMM + the top-k
// weighted sum + ReduceScatter (MoeRs, sequential).
//
// Under tensor parallelism every rank holds every expert, each expert's
// intermediate dimension F split over the ranks: rank r holds W_up's rows
// F_r ([E, N_local, H], "nk") and W_down's columns F_r ([E, H, K_local]),
// with N_local = K_local = |F_r| (the slices may differ by rank). Tokens are
// split over the ranks too: rank r holds T_r tokens, any count up to
// max_tokens_per_rank, different on every rank if need be.
//
//   const int W = ctx->world_size();
//   weft::AgMoe up(ctx, {.experts = 8, .hidden = 4096, .n_local = 14336 / W, .top_k = 2,
//                        .max_tokens_per_rank = 2048});
//   weft::MoeRs down(ctx, {.experts = 8, .hidden = 4096, .k_local = 14336 / W, .top_k = 2,
//                          .max_tokens_per_rank = 2048});
//   // x [T_r, H], topk_idx [T_r, 2] int64 (-1 = none), topk_weights [T_r, 2] float
//   up.run(x, topk_idx, topk_weights, T_r, w_up, h, stream);   // h: [up.max_rows(), N_local]
//   ... an element-wise activation on h's rows, if any ...
//   down.run(h, up.routing(), w_down, out, stream);            // out: [T_r, H]
//
// AgMoe::run gathers every rank's tokens, routing and weights into fixed
// shards of max_tokens_per_rank tokens (weft's AllGather; the counts travel
// in the shards), sorts the gathered (token, slot) pairs by expert on the
// device - a counting sort whose order is (rank, token, slot) within each
// expert, computed, never claimed by atomics - copies each pair's token row
// into the sorted A and runs one GroupedGemm: h's first `pairs` rows are the
// pairs' up-projections, expert by expert. The pair count and every map stay
// on the device (MoeRouting): no host read, no synchronisation, and both
// runs can be captured in one CUDA graph.
//
// AgMoe's overlapped path (AgMoeOptions::mode fused, or automatic where it
// times faster; decision 0071) starts the GEMM before every rank's tokens
// are here. Only the routing heads (count, ids, weights: 16 + 12 k bytes a
// token) are gathered first and sorted; the token rows travel on the copy
// engines, each rank's pushed to every peer with a flag. Within an expert the
// sorted rows are in (rank, token, slot) order, so rank s's pairs of expert
// e are one run of rows, region (s, e): per rank s, in arrival order (this
// rank's own first), a wait for its flag, the copy of its pairs' rows into
// the sorted A, and one GroupedGemm over its regions (per-expert counts and
// first rows on the device). The rows, maps and routing are the same as the
// sequential path's.
//
// MoeRs::run multiplies h by W_down's slice (one GroupedGemm: partial sums
// over this rank's K_local), sums each token's pairs in slot order weighted
// by its top-k weights (fp32, one rounding), and ReduceScatters the
// token-order partial sums (weft's ReduceScatter over the same shards), so
// rank r receives its own T_r tokens summed over the ranks' slices. A token
// routed nowhere comes out 0. Every sum runs in a fixed order: repeated runs
// and graph replays are bitwise identical.
//
// MoeRs's overlapped path (MoeRsOptions::mode fused, or automatic where it
// times faster) works by destination: rank d's pairs of expert e are region
// (d, e) of the sorted rows, as in AgMoe's. Per destination d, this rank's
// own last, one GroupedGemm over d's regions, the weighted sum of d's
// tokens, and (d not this rank) that slice of partial sums on the copy
// engines into slot `me` of rank d's incoming buffer, with a flag, while the
// next destination's GEMM runs. Last, once every peer's slice is here, each
// of this rank's tokens is the sum over the ranks' partials in rank order
// (fp32, one rounding).
//
// Every rank makes the same calls in the same order (AgMoe::run, then
// MoeRs::run with that run's routing). An expert id outside [-1, E) counts
// as none and is recorded; check_errors() names the first (rank, token,
// slot, id) on every rank alike. A token that lists one expert twice gives
// two pairs, both summed.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "weft/core/cuda_resources.hpp"
#include "weft/core/dtype.hpp"
#include "weft/ops/all_gather.hpp"
#include "weft/ops/reduce_scatter.hpp"
#include "weft/runtime/context.hpp"

namespace weft {

class GroupedGemm;
namespace ops_detail {
class CopyPipe;
class PathChoice;
}  // namespace ops_detail

/// What an AgMoe plan is built for. Equal on every rank except n_local (checked).
struct AgMoeOptions {
  int experts = 0;                       ///< E: 1 to 1024
  std::int64_t hidden = 0;               ///< H: channels per token, a positive multiple of 8 (16-byte rows)
  std::int64_t n_local = 0;              ///< this rank's slice of F: W_up_local is [E, n_local, H]; a positive multiple of 8
  int top_k = 0;                         ///< k: slots per token, 1 to 32
  std::int64_t max_tokens_per_rank = 0;  ///< the shards' capacity: most tokens a rank passes to run()
  DType dtype = DType::bf16;             ///< x, W_up and the output: bf16 or fp16
  AllGatherVariant gather = AllGatherVariant::automatic;  ///< how the shards (or, overlapped, the routing heads) move
  /// Cap on the SMs of the grouped GEMM's persistent grid and of the sort's
  /// kernels; 0 = the rank's share of its GPU (Team::sm_count).
  int max_sms = 0;
  /// sequential: gather everything (weft's AllGather), then one grouped GEMM; fused:
  /// the overlapped path by source regions (needs every peer mapped);
  /// automatic: times both on the first run and keeps the faster, the same
  /// on every rank (sequential alone where a peer is not mapped). The default
  /// stays sequential until the overlapped path is timed on two GPUs.
  OverlapMode mode = OverlapMode::sequential;
};

/// What a MoeRs plan is built for. Equal on every rank except k_local (checked).
struct MoeRsOptions {
  int experts = 0;                       ///< E: 1 to 1024
  std::int64_t hidden = 0;               ///< H: output channels, a positive multiple of 8
  std::int64_t k_local = 0;              ///< this rank's slice of F: W_down_local is [E, H, k_local]; a positive multiple of 8
  int top_k = 0;                         ///< k: 1 to 32
  std::int64_t max_tokens_per_rank = 0;  ///< as AgMoe's: the ReduceScatter's slices are the same shards
  DType dtype = DType::bf16;             ///< h, W_down and out: bf16 or fp16
  ReduceScatterVariant scatter = ReduceScatterVariant::automatic;  ///< how the partial sums meet (sequential path)
  int max_sms = 0;                       ///< as AgMoe's
  /// sequential: one grouped GEMM, the weighted sum, then weft's
  /// ReduceScatter; fused: the overlapped path by destination (needs every
  /// peer mapped); automatic: times both on the first run and keeps the
  /// faster, as AgMoe's. The default stays sequential until the overlapped
  /// path is timed on two GPUs.
  OverlapMode mode = OverlapMode::sequential;
};

/// One AgMoe run's routing, on the device: what MoeRs needs, and what a
/// caller needs to read the sorted rows. Gathered token g = s x capacity + t
/// is rank s's token t. Valid until the plan's next run (the plan owns it).
struct MoeRouting {
  int world = 0, experts = 0, top_k = 0;
  std::int64_t capacity = 0;    ///< max_tokens_per_rank
  std::int64_t num_tokens = 0;  ///< this rank's T_r in that run
  std::int64_t max_rows = 0;    ///< world x capacity x top_k: rows h and the sorted maps have room for
  DType dtype = DType::bf16;
  std::uint64_t run = 0;        ///< the AgMoe run it belongs to (1, 2, ...); 0: none yet
  const std::int32_t* expert_rows = nullptr;    ///< [E]: pairs of each expert (the grouped GEMMs' counts)
  const std::int32_t* expert_offset = nullptr;  ///< [E + 1]: expert e's first sorted row; [E] = pairs
  const std::int32_t* row_token = nullptr;      ///< [max_rows]: each sorted row's gathered token (rows < pairs)
  const std::int32_t* row_slot = nullptr;       ///< [max_rows]: its top-k slot
  const std::int32_t* token_row = nullptr;      ///< [world x capacity][top_k]: each pair's sorted row, -1 for none
  const float* token_weight = nullptr;          ///< [world x capacity][top_k]: each pair's weight, 0 for none
};

/// AllGather + the up-projection's grouped GEMM. Collective to build and to run.
class AgMoe {
 public:
  /// "" if a plan for `options` can run on `world_size` ranks, else why not,
  /// naming the field and what was expected.
  static std::string can_implement(const AgMoeOptions& options, int world_size);

  /// Collective. Checks that every rank asked for the same plan, then throws
  /// can_implement's message (on every rank alike) if it is not empty;
  /// allocates the gathered shards (symmetric heap) and the sort's buffers.
  AgMoe(std::shared_ptr<Context> ctx, const AgMoeOptions& options);
  ~AgMoe();
  AgMoe(const AgMoe&) = delete;
  AgMoe& operator=(const AgMoe&) = delete;

  /// Collective. x [num_tokens, H], topk_idx [num_tokens, k] int64 (-1 =
  /// none), topk_weights [num_tokens, k] float: this rank's tokens, any
  /// device memory (x 16-byte aligned); num_tokens <= max_tokens_per_rank.
  /// w_up [E, n_local, H]; out [max_rows(), n_local], both 16-byte aligned:
  /// its first `pairs` rows (routing().expert_offset[E]) receive the sorted
  /// pairs' up-projections, the rest are left as they were. Enqueued on
  /// `stream`; no host synchronisation.
  void run(const void* x, const std::int64_t* topk_idx, const float* topk_weights, std::int64_t num_tokens,
           const void* w_up, void* out, cudaStream_t stream);

  /// Not collective: later runs take W_up slices of n_local rows ([E, n_local,
  /// H]; out [max_rows(), n_local]). A plan keeps a grouped GEMM per width it
  /// has used, building one locally on first use (it allocates: not during
  /// graph capture). For callers that share one plan across layers whose
  /// slices differ (the Python ops' plan cache, keyed on what every rank
  /// agrees on). Throws if n_local is not a positive multiple of 8.
  void use_slice(std::int64_t n_local);

  /// The latest run's routing (for MoeRs::run and for reading the sorted rows).
  const MoeRouting& routing() const { return routing_; }
  /// Rows `out` must hold: world x max_tokens_per_rank x top_k.
  std::int64_t max_rows() const { return routing_.max_rows; }
  const AgMoeOptions& options() const { return opt_; }
  /// The grouped GEMM's configuration ("128x256x64 c2x1 cooperative").
  std::string gemm_config() const;
  /// The path runs take ("sequential" or "fused, source regions"), chosen on
  /// the first run; "" before it.
  std::string path() const;
  /// Synchronises `stream`; throws if a run since the last check met an
  /// expert id outside [-1, E) in any rank's routing (the same error on every
  /// rank: the first such rank, token, slot and id), and clears the record.
  void check_errors(cudaStream_t stream);

 private:
  void run_sequential(const void* x, const std::int64_t* topk_idx, const float* topk_weights,
                      std::int64_t num_tokens, const void* w_up, void* out, cudaStream_t stream);
  void run_fused(const void* x, const std::int64_t* topk_idx, const float* topk_weights, std::int64_t num_tokens,
                 const void* w_up, void* out, cudaStream_t stream);

  std::shared_ptr<Context> ctx_;
  AgMoeOptions opt_;
  int sms_ = 1;
  std::uint64_t runs_ = 0;
  MoeRouting routing_;
  std::map<std::int64_t, std::unique_ptr<GroupedGemm>> gemms_;  // per n_local used
  GroupedGemm* gemm_ = nullptr;                                  // opt_.n_local's
  DeviceBuffer scratch_;          // local: the sort's counts and maps, the source regions, the error record
  DeviceBuffer sorted_a_;         // local: [max_rows][H], the pairs' token rows by expert
  // The sequential path (mode sequential or automatic):
  std::unique_ptr<AllGather> gather_;
  SymmetricBuffer shards_;        // [W] shards (moe_tp_layout.hpp's ShardLayout)
  // The overlapped path (mode fused or automatic):
  std::unique_ptr<AllGather> head_gather_;
  std::unique_ptr<ops_detail::CopyPipe> pipe_;
  SymmetricBuffer heads_;         // [W] routing heads: shards without token rows
  SymmetricBuffer rows_;          // [W][capacity][H]: slot s receives rank s's token rows
  SymmetricBuffer arrived_;       // u64 [W]: word s = 1 once rank s's rows landed here
  // Which path runs; null where a peer is not mapped (the sequential path on weft's AllGather, untimed).
  std::unique_ptr<ops_detail::PathChoice> choice_;
};

/// The down-projection's grouped GEMM + top-k weighted sum + ReduceScatter. Collective to build and to run.
class MoeRs {
 public:
  /// "" if a plan for `options` can run on `world_size` ranks, else why not, naming the field.
  static std::string can_implement(const MoeRsOptions& options, int world_size);

  /// Collective. As AgMoe's: same plan on every rank, else the same error on every rank.
  MoeRs(std::shared_ptr<Context> ctx, const MoeRsOptions& options);
  ~MoeRs();
  MoeRs(const MoeRs&) = delete;
  MoeRs& operator=(const MoeRs&) = delete;

  /// Collective. h [routing.max_rows, k_local]: the pairs' rows sorted as
  /// AgMoe left them (its first `pairs` rows are read); routing: that AgMoe
  /// run's (its plan must match this one's E, k, capacity and dtype);
  /// w_down [E, H, k_local]; out [routing.num_tokens, H]. Enqueued on
  /// `stream`, after the AgMoe run on the same stream (or ordered after it).
  void run(const void* h, const MoeRouting& routing, const void* w_down, void* out, cudaStream_t stream);

  /// Not collective: later runs take W_down slices of k_local columns ([E, H,
  /// k_local]; h [max_rows, k_local]), as AgMoe::use_slice.
  void use_slice(std::int64_t k_local);

  const MoeRsOptions& options() const { return opt_; }
  std::string gemm_config() const;
  /// The path runs take ("sequential" or "fused, by destination"), chosen
  /// on the first run; "" before it.
  std::string path() const;

 private:
  void run_sequential(const void* h, const MoeRouting& routing, const void* w_down, void* out, cudaStream_t stream);
  void run_fused(const void* h, const MoeRouting& routing, const void* w_down, void* out, cudaStream_t stream);

  std::shared_ptr<Context> ctx_;
  MoeRsOptions opt_;
  int sms_ = 1;
  std::uint64_t runs_ = 0;
  std::int64_t max_rows_ = 0;
  std::map<std::int64_t, std::unique_ptr<GroupedGemm>> gemms_;  // per k_local used
  GroupedGemm* gemm_ = nullptr;                                  // opt_.k_local's
  SymmetricBuffer partial_;  // [W][capacity][H]: token-order partial sums (the ReduceScatter's input)
  DeviceBuffer y_;           // local: [max_rows][H], the pairs' down-projections
  // The sequential path (mode sequential or automatic):
  std::unique_ptr<ReduceScatter> scatter_;
  // The overlapped path (mode fused or automatic):
  std::unique_ptr<ops_detail::CopyPipe> pipe_;
  SymmetricBuffer incoming_;  // [W][capacity][H]: slot s receives rank s's partial sums of this rank's tokens
  SymmetricBuffer arrived_;   // u64 [W]: word s = 1 once rank s's slice landed here
  DeviceBuffer regions_;      // local: int32 [2][W][E], each destination's region counts, then first rows
  Event combined_;            // a destination's weighted sum is done: its push may start
  // Which path runs; null where a peer is not mapped (the sequential path, untimed).
  std::unique_ptr<ops_detail::PathChoice> choice_;
};

}  // namespace weft
