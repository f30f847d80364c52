// weft/ops/ep.hpp - expert-parallel dispatch and combine (MoE): throughput mode, and low-latency mode.
//
// E experts live on W ranks, E / W consecutive ones each. Every rank routes
// its own T tokens (T may differ by rank and by call, up to max_tokens):
//
//   weft::ExpertParallel ep(ctx, {.experts = 256, .hidden = 7168, .top_k = 8, .max_tokens = 4096});
//   weft::EpHandle h = ep.layout(topk_idx, T, stream);        // counts, one host read
//   // recv_x: h.recv_rows x hidden bf16, grouped by local expert
//   ep.dispatch(h, x, topk_weights, recv_x, recv_weights, stream);
//   // (or ep.dispatch_fp8(h, x_fp8, x_scales, ...): e4m3 rows and a scale per 128 channels)
//   ... experts compute y [h.recv_rows, hidden] from recv_x, row for row ...
//   ep.combine(h, y, out, stream);                             // out [T, hidden]
//
// The semantics are DeepEP's (src/ops/moe/ep_layout.hpp has the maps):
//   - topk_idx [T, k] int64 lists each token's experts, -1 for none, each at most once;
//   - layout counts, on the device, the tokens each rank receives, the
//     (token, expert) pairs per expert and each token's position; the ranks
//     exchange their counts and every rank reads them once on the host, to
//     size the receive buffers (DeepEP's normal mode does the same);
//   - dispatch sends each token once to each rank that owns one of its
//     experts (SM stores over NVLink, 16-byte vectors), with its pairs'
//     rows and weights; the receiver writes it to one row per local expert:
//     recv_x is expert-major (local expert, then source rank, then the
//     source's token order), h.expert_rows[e] rows from h.expert_offset[e];
//   - combine takes the experts' outputs in recv_x's rows; each receiving
//     rank sums, per token, w x y over its pairs in slot order (fp32, one
//     bf16 rounding), and the token's source sums those partials over the
//     ranks in ascending order (fp32, one rounding): a fixed order, so the
//     result is bitwise repeatable. A token routed nowhere combines to 0.
//
// Across nodes (ranks on several nodes, or virtual ones: WEFT_VIRTUAL_NODES)
// the plan takes weft::internode's kernels, which need that library linked
// and a weft::RemotePeers alive, as the collectives' two-level schedules do:
// a token crosses the NIC once per remote node it goes to, to the GPU of its
// own local rank there, which forwards it over NVLink. recv_x and the handle
// are the one-node plan's. Combine sums a remote node's partials on that GPU
// (rank order, fp32, rounded once) and the source sums its nodes in order, its
// own node's partials one by one: a fixed order, bitwise repeatable, the
// one-node sum on one node (docs/decisions/0072).
//
// Calls come in the order layout, dispatch, combine (combine may be left
// out); every rank makes the same calls. The handle is valid until the next
// layout; topk_idx must stay unchanged until dispatch has run. Signals carry
// epochs: repeated calls need no reset. Every device wait is bounded and names
// the rank and flag it waited for. Errors (weft::Error) are raised on every
// rank alike: an expert id outside [-1, E) or listed twice (with the source
// rank, token and slot), ranks that disagree on E, H or k (both values), a
// hidden size that is not a multiple of 8 (the 16-byte vector).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "weft/core/cuda_resources.hpp"
#include "weft/runtime/context.hpp"

namespace weft {

namespace ops_detail {
class TwoLevelEp;
class TwoLevelEpLl;
}

/// What an ExpertParallel plan is built for. Equal on every rank (checked).
struct EpOptions {
  int experts = 0;              ///< E: experts over all ranks, a multiple of the world size, at most 1024
  int hidden = 0;               ///< H: channels per token, bf16, a multiple of 8 (16-byte vectors)
  int top_k = 0;                ///< k: experts per token, 1 to 32
  std::int64_t max_tokens = 0;  ///< most tokens a rank routes in one call (> 0)
  /// Cap on the SMs (thread blocks) dispatch and combine occupy; 0 = the rank's
  /// share of its GPU (Team::sm_count).
  int max_sms = 0;
  /// Rows of the receive staging (tokens a rank receives) allocated up front;
  /// 0 = 2 x max_tokens. The staging grows, collectively, when a layout needs more.
  std::int64_t recv_capacity = 0;
};

/// The layout of one call: what this rank receives, and where. Valid until the next layout.
struct EpHandle {
  std::uint64_t id = 0;            ///< the layout call it belongs to (1, 2, ...)
  std::int64_t num_tokens = 0;     ///< T: the tokens this rank routed
  std::int64_t recv_tokens = 0;    ///< tokens this rank receives (once per source token)
  std::int64_t recv_rows = 0;      ///< (token, local expert) pairs this rank receives: rows of recv_x
  std::vector<std::int64_t> expert_rows;    ///< [E / W]: recv_x rows of each local expert
  std::vector<std::int64_t> expert_offset;  ///< [E / W]: first recv_x row of each local expert
  std::vector<std::int64_t> tokens_from;    ///< [W]: tokens received from each source rank
  std::vector<std::int64_t> tokens_to;      ///< [W]: this rank's tokens sent to each rank
};

/// An expert-parallel plan: allocates its symmetric staging and signals once (collective), runs many times.
class ExpertParallel {
 public:
  /// Collective. Validates the options (the same on every rank, else an error naming both descriptions).
  ExpertParallel(std::shared_ptr<Context> ctx, const EpOptions& options);
  ~ExpertParallel();
  ExpertParallel(const ExpertParallel&) = delete;
  ExpertParallel& operator=(const ExpertParallel&) = delete;

  /// Collective. Counts `topk_idx` ([num_tokens, k] int64, device memory) on
  /// the device, exchanges the counts and reads them on the host (the stream
  /// is synchronised). Throws on every rank if any rank's routing is invalid,
  /// naming the rank, token, slot and expert id.
  EpHandle layout(const std::int64_t* topk_idx, std::int64_t num_tokens, cudaStream_t stream);

  /// Collective. Sends x ([num_tokens, H] bf16) to the experts' ranks; writes
  /// recv_x ([h.recv_rows, H] bf16, device memory) and, if not null,
  /// recv_weights ([h.recv_rows] float: each row's top-k weight).
  /// topk_weights is [num_tokens, k] float (device memory).
  void dispatch(const EpHandle& h, const void* x, const float* topk_weights, void* recv_x, float* recv_weights,
                cudaStream_t stream);

  /// Collective. dispatch() for fp8 tokens (DeepEP's fp8 dispatch): x is [num_tokens, H]
  /// fp8 e4m3 (one byte a channel) with x_scales [num_tokens, H / 128] float, one
  /// scale per 128 channels; recv_x ([h.recv_rows, H] bytes) and recv_scales
  /// ([h.recv_rows, H / 128] float) receive them row for row, bit for bit. Needs
  /// H a multiple of 128. Moves about half the bytes of a bf16 dispatch.
  void dispatch_fp8(const EpHandle& h, const void* x, const float* x_scales, const float* topk_weights, void* recv_x,
                    float* recv_scales, float* recv_weights, cudaStream_t stream);

  /// Collective. Combines the experts' outputs y ([h.recv_rows, H] bf16, in
  /// recv_x's rows) into out ([num_tokens, H] bf16), weighted by the top-k
  /// weights dispatch was given. Once per dispatch.
  void combine(const EpHandle& h, const void* y, void* out, cudaStream_t stream);

  const EpOptions& options() const { return opt_; }
  int local_experts() const { return opt_.experts / ctx_->world_size(); }
  /// Thread blocks dispatch and combine run on (at most the rank's SM share).
  int blocks() const { return blocks_; }
  /// Rows of receive staging allocated now.
  std::int64_t recv_capacity() const { return capacity_; }

 private:
  void grow_staging(std::int64_t rows);
  const std::int64_t* count_and_exchange(const std::int64_t* topk_idx, std::int64_t num_tokens, cudaStream_t stream);
  void check_handle(const EpHandle& h, const char* call, int stage) const;
  void dispatch_rows(const EpHandle& h, bool fp8, const void* x, const float* x_scales, const float* topk_weights,
                     void* recv_x, float* recv_scales, float* recv_weights, cudaStream_t stream);

  std::shared_ptr<Context> ctx_;
  EpOptions opt_;
  int blocks_ = 1;
  std::int64_t capacity_ = 0;
  std::uint64_t layouts_ = 0;  // layout calls made
  int stage_ = 0;              // 1 after layout, 2 after dispatch, 3 after combine
  const std::int64_t* topk_ = nullptr;
  std::int64_t tokens_ = 0;
  EpHandle current_;

  SymmetricBuffer counts_;    // [2 parities][W][row] int64: every rank's counts, exchanged
  SymmetricBuffer staging_;   // [capacity][H] bf16: tokens received (dispatch), partial sums (combine)
  SymmetricBuffer meta_;      // [capacity][2 + 2k] int32: source token, pairs, their rows, their weights
  SignalArray exchange_signals_;  // [W]: counts row from rank p
  SignalArray dispatch_signals_;  // [W]: tokens from rank p have arrived
  SignalArray combine_signals_;   // [W]: rank p's partial sums are ready
  DeviceBuffer scratch_;          // local device memory, see ep.cu
  std::int64_t* host_counts_ = nullptr;  // pinned [W][row_]
  int row_ = 0;                          // int64 words of a counts row
  std::unique_ptr<ops_detail::TwoLevelEp> across_;  // the kernels across nodes (weft::internode), or null
};

/// What a low-latency plan is built for. Equal on every rank (checked).
struct EpLowLatencyOptions {
  int experts = 0;          ///< E: a multiple of the world size, at most 1024
  int hidden = 0;           ///< H: bf16 channels, a multiple of 8
  int top_k = 0;            ///< k: 1 to 32
  int max_tokens = 0;       ///< M: most tokens a rank routes in one call (1 to 4096)
  int max_sms = 0;          ///< cap on the SMs its kernels occupy; 0 = the rank's share of its GPU
  /// Dispatch casts each token to fp8 e4m3 with one float scale per 128 channels
  /// (DeepEP's use_fp8): scale = max |x| over the block / 448 (at least 1e-4 / 448),
  /// each channel x x 448 / max |x| rounded to nearest and saturated. recv_x then
  /// holds e4m3 bytes and recv_scales() the scales. Needs H a multiple of 128.
  bool fp8_dispatch = false;
};

/// Expert-parallel dispatch and combine for decoding: no host synchronisation,
/// CUDA-graph capturable, fixed buffers. The receive buffer is expert-major,
/// [local experts][W sources][M][H] (moe_detail::low_latency_row): local
/// expert e's tokens from source s are rows 0 .. recv_count[e][s] of its
/// block, in the source's token order. A token goes once to each of its
/// experts (not once per rank: the rows are the experts' inputs, in place).
/// Combine returns out[t] = sum over slots j ascending of w[t][j] x y(t, j)
/// (fp32, one rounding): bitwise repeatable.
///
///   weft::ExpertParallelLowLatency ll(ctx, {.experts = 256, .hidden = 7168, .top_k = 8, .max_tokens = 128});
///   ll.dispatch_send(topk_idx, x, T, stream);   // returns once the tokens are on their way
///   ... other work ...
///   ll.dispatch_recv(stream);                   // waits for every rank's tokens
///   ... experts: y [local experts][W x M][H] from ll.recv_x() ...
///   ll.combine(y, topk_idx, topk_weights, out, T, stream);
///
/// Across nodes (some peer's heap not mapped here: WEFT_HEAP_BACKEND=nvshmem
/// over several nodes, or WEFT_VIRTUAL_NODES) it needs weft::internode linked
/// and a weft::RemotePeers alive: the same kernels then reach the peers of
/// other nodes by NVSHMEM's puts, a row bound there staged in this rank's
/// symmetric heap first (a NIC reads only registered memory), which adds M x H
/// (dispatch) and local experts x W x M x H bf16 (combine) to the plan's heap.
///
/// Every rank makes the same calls in this order (send, recv, combine) each
/// step. What dispatch_recv delivers (recv_x, recv_scales, recv_source) is
/// valid until this rank's combine of the step: once it has run, a peer's
/// next dispatch_send may already be writing the buffers. A bad expert id
/// (outside [-1, E), or listed twice) skips its token (combine gives it
/// zeros; the other tokens are unaffected) and is recorded on the device;
/// check_errors() reports it.
class ExpertParallelLowLatency {
 public:
  /// Collective. Allocates the symmetric receive and combine buffers.
  ExpertParallelLowLatency(std::shared_ptr<Context> ctx, const EpLowLatencyOptions& options);
  ~ExpertParallelLowLatency();
  ExpertParallelLowLatency(const ExpertParallelLowLatency&) = delete;
  ExpertParallelLowLatency& operator=(const ExpertParallelLowLatency&) = delete;

  /// Sends each of the num_tokens (<= M) tokens of x ([T, H] bf16) to the
  /// ranks of its experts (topk_idx [T, k] int64, -1 = none). Does not wait for other ranks' tokens.
  void dispatch_send(const std::int64_t* topk_idx, const void* x, std::int64_t num_tokens, cudaStream_t stream);
  /// Waits until every rank's tokens for this rank have arrived; fills recv_count().
  void dispatch_recv(cudaStream_t stream);
  /// dispatch_send then dispatch_recv.
  void dispatch(const std::int64_t* topk_idx, const void* x, std::int64_t num_tokens, cudaStream_t stream) {
    dispatch_send(topk_idx, x, num_tokens, stream);
    dispatch_recv(stream);
  }
  /// y: the experts' outputs in recv_x()'s layout (any device memory); topk_idx
  /// and topk_weights ([T, k] float) as this step's dispatch had them; out [T, H] bf16.
  void combine(const void* y, const std::int64_t* topk_idx, const float* topk_weights, void* out,
               std::int64_t num_tokens, cudaStream_t stream);

  /// [local experts][W][M][H] bf16 (symmetric heap), or e4m3 bytes with fp8_dispatch: the tokens received.
  void* recv_x() const { return recv_x_.get(); }
  /// fp8_dispatch: [local experts][W][M][H / 128] float (symmetric heap), each
  /// received row's scales (channel c of a row is its e4m3 value x scale c / 128); else null.
  const float* recv_scales() const { return opt_.fp8_dispatch ? recv_scales_.as<float>() : nullptr; }
  /// [local experts][W] int32 (device): rows received per local expert and source.
  const std::int32_t* recv_count() const { return recv_count_.as<std::int32_t>(); }
  /// [local experts][W][M] int32 (symmetric heap): each row's token index at its source x 32 + its slot.
  const std::int32_t* recv_source() const { return recv_src_.as<std::int32_t>(); }
  /// Synchronises `stream` and throws if a dispatch since the last check met a
  /// bad expert id on this rank (naming the token, slot and id); clears it.
  void check_errors(cudaStream_t stream);
  const EpLowLatencyOptions& options() const { return opt_; }

 private:
  std::shared_ptr<Context> ctx_;
  EpLowLatencyOptions opt_;
  int blocks_ = 1;
  int stage_ = 0;  // 1 after send, 2 after recv, 0 after combine
  std::int64_t tokens_ = 0;
  SymmetricBuffer recv_x_;      // [per][W][M][H] bf16, or e4m3 bytes
  SymmetricBuffer recv_scales_; // fp8_dispatch: [per][W][M][H / 128] float
  SymmetricBuffer recv_src_;    // [per][W][M]
  SymmetricBuffer comb_buf_;    // [M][k][H]: the experts' outputs of this rank's tokens
  SignalArray count_signals_;   // [per][W]: (epoch << 32) | rows, set by each source
  SignalArray combine_signals_; // [W]: rank p's outputs for this rank are here
  SignalArray recv_signals_;    // the receive kernel's epoch (no flags used)
  DeviceBuffer recv_count_;  // i32 [per][W]
  DeviceBuffer scratch_;     // u64: [0] error key, [1] send blocks done, [2] combine blocks done
  std::unique_ptr<ops_detail::TwoLevelEpLl> across_;  // the kernels across nodes (weft::internode), or null
};

}  // namespace weft
