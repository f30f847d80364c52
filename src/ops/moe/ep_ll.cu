// Expert-parallel dispatch and combine, low-latency mode: the plan. Its three
// kernels (send, recv, combine) and how they reuse buffers without a reset
// are in ep_ll_kernels.cuh; on one node they run here with every peer reached
// by stores (DirectPeers); across nodes weft::internode runs the same kernels
// with NVSHMEM's puts to the peers of other nodes (internode/ep_ll.cu,
// ops_detail::TwoLevelEpLl), rows bound there staged in this rank's heap.
#include <algorithm>

#include "../two_level.hpp"
#include "ep_ll_kernels.cuh"
#include "weft/core/error.hpp"
#include "weft/ops/ep.hpp"

namespace weft {

using namespace ops_detail;
using namespace moe_detail;

ExpertParallelLowLatency::ExpertParallelLowLatency(std::shared_ptr<Context> ctx, const EpLowLatencyOptions& options)
    : ctx_(std::move(ctx)), opt_(options) {
  WEFT_REQUIRE(ctx_, "ExpertParallelLowLatency needs a Context");
  const bool across = !ctx_->all_peers_direct();
  const int W = ctx_->world_size();
  const char* placement = moe_detail::placement_error(opt_.experts, W);
  WEFT_REQUIRE(*placement == 0, "ExpertParallelLowLatency: experts = ", opt_.experts, " on ", W, " ranks: ",
               placement);
  WEFT_REQUIRE(opt_.experts <= kMaxExpertsLl, "ExpertParallelLowLatency: experts = ", opt_.experts, " exceeds ",
               kMaxExpertsLl);
  WEFT_REQUIRE(opt_.hidden > 0 && opt_.hidden % 8 == 0, "ExpertParallelLowLatency: hidden = ", opt_.hidden,
               " must be a positive multiple of 8: tokens move as 16-byte vectors of 8 bf16");
  WEFT_REQUIRE(opt_.top_k >= 1 && opt_.top_k <= 32, "ExpertParallelLowLatency: top_k = ", opt_.top_k,
               " must be in [1, 32]");
  WEFT_REQUIRE(opt_.max_tokens >= 1 && opt_.max_tokens <= kMaxTokensLl, "ExpertParallelLowLatency: max_tokens = ",
               opt_.max_tokens, " must be in [1, ", kMaxTokensLl, "]");
  WEFT_REQUIRE(opt_.max_sms >= 0, "ExpertParallelLowLatency: max_sms = ", opt_.max_sms, " must be >= 0");
  WEFT_REQUIRE(!opt_.fp8_dispatch || opt_.hidden % kFp8ScaleChannels == 0, "ExpertParallelLowLatency: hidden = ",
               opt_.hidden, " must be a multiple of ", kFp8ScaleChannels, " for fp8_dispatch: one scale per ",
               kFp8ScaleChannels, " channels");
  ctx_->verify_same_call(str("ExpertParallelLowLatency plan: experts ", opt_.experts, ", hidden ", opt_.hidden,
                             ", top_k ", opt_.top_k, ", max_tokens ", opt_.max_tokens, ", fp8_dispatch ",
                             opt_.fp8_dispatch ? "on" : "off",
                             across ? str(", across nodes", two_level_readiness()) : std::string()));
  // Across nodes: the same kernels with NVSHMEM's puts to the peers of other nodes (weft::internode).
  if (across) across_ = two_level_or_refuse(*ctx_, "ExpertParallelLowLatency").expert_parallel_low_latency(*ctx_, opt_);
  const int sms = std::max(1, ctx_->team().sm_count);
  blocks_ = opt_.max_sms > 0 ? std::min(opt_.max_sms, sms) : sms;
  const std::uint64_t per = opt_.experts / W, M = opt_.max_tokens, H = opt_.hidden, k = opt_.top_k;
  recv_x_ = SymmetricBuffer(ctx_->heap(), per * W * M * H * (opt_.fp8_dispatch ? 1 : 2),
                            opt_.fp8_dispatch ? "fp8_e4m3" : "bf16", "ep_ll.recv_x");
  if (opt_.fp8_dispatch)
    recv_scales_ =
        SymmetricBuffer(ctx_->heap(), per * W * M * (H / kFp8ScaleChannels) * 4, "f32", "ep_ll.recv_scales");
  recv_src_ = SymmetricBuffer(ctx_->heap(), per * W * M * 4, "i32", "ep_ll.recv_src");
  comb_buf_ = SymmetricBuffer(ctx_->heap(), M * k * H * 2, "bf16", "ep_ll.combine");
  count_signals_ = SignalArray(ctx_->heap(), per * W, "ep_ll.count.flags");
  combine_signals_ = SignalArray(ctx_->heap(), W, "ep_ll.combine.flags");
  recv_signals_ = SignalArray(ctx_->heap(), 1, "ep_ll.recv.epoch");
  recv_count_ = DeviceBuffer(per * W * 4);
  WEFT_CUDA(cudaMemset(recv_count_.get(), 0, per * W * 4));
  scratch_ = DeviceBuffer(3 * 8);
  const std::uint64_t init[3] = {kNoErrorLl, 0, 0};
  WEFT_CUDA(cudaMemcpy(scratch_.get(), init, sizeof(init), cudaMemcpyHostToDevice));
}

ExpertParallelLowLatency::~ExpertParallelLowLatency() = default;

void ExpertParallelLowLatency::dispatch_send(const std::int64_t* topk_idx, const void* x, std::int64_t num_tokens,
                                             cudaStream_t stream) {
  WEFT_REQUIRE(num_tokens >= 0 && num_tokens <= opt_.max_tokens, "ExpertParallelLowLatency::dispatch_send: ",
               num_tokens, " tokens exceed the plan's max_tokens = ", opt_.max_tokens,
               " (the low-latency buffers are fixed; build the plan for more, or use ExpertParallel)");
  WEFT_REQUIRE(num_tokens == 0 || (topk_idx && x), "ExpertParallelLowLatency::dispatch_send: topk_idx and x are "
               "needed for ", num_tokens, " tokens");
  WEFT_REQUIRE(reinterpret_cast<std::uintptr_t>(x) % 16 == 0, "ExpertParallelLowLatency::dispatch_send: x must be "
               "16-byte aligned");
  WEFT_REQUIRE(stage_ == 0, "ExpertParallelLowLatency::dispatch_send: the previous step's ",
               stage_ == 1 ? "dispatch_recv" : "combine", " has not run (every step is send, recv, combine)");
  if (ctx_->check_calls()) ctx_->verify_same_call("ExpertParallelLowLatency dispatch_send");
  LlArgs a{};
  a.w = ctx_->world();
  a.experts = opt_.experts;
  a.world = ctx_->world_size();
  a.k = opt_.top_k;
  a.hidden = opt_.hidden;
  a.max_tokens = opt_.max_tokens;
  a.fp8 = opt_.fp8_dispatch;
  a.tokens = num_tokens;
  a.topk = topk_idx;
  a.x = static_cast<const uint4*>(x);
  a.recv_x = recv_x_.as<uint4>();
  a.recv_scales = opt_.fp8_dispatch ? recv_scales_.as<float>() : nullptr;
  a.recv_src = recv_src_.as<std::int32_t>();
  a.count_flags = count_signals_.flags();
  a.error = scratch_.as<std::uint64_t>();
  a.done = scratch_.as<std::uint64_t>() + 1;
  a.epoch = count_signals_.launch_epoch();
  const int grid = static_cast<int>(std::clamp<std::int64_t>((num_tokens + kWarpsLl - 1) / kWarpsLl, 1, blocks_));
  if (across_) across_->send(a, grid, stream);
  else launch_pdl(ll_send_kernel<DirectPeers>, grid, kThreadsLl, stream, a);
  WEFT_CUDA(cudaGetLastError());
  tokens_ = num_tokens;
  stage_ = 1;
}

void ExpertParallelLowLatency::dispatch_recv(cudaStream_t stream) {
  WEFT_REQUIRE(stage_ == 1, "ExpertParallelLowLatency::dispatch_recv: dispatch_send must come first");
  LlArgs a{};
  a.w = ctx_->world();
  a.experts = opt_.experts;
  a.world = ctx_->world_size();
  a.count_flags = count_signals_.flags();
  a.recv_count = recv_count_.as<std::int32_t>();
  a.epoch = recv_signals_.launch_epoch();
  launch_pdl(ll_recv_kernel, 1, kRecvThreads, stream, a);
  WEFT_CUDA(cudaGetLastError());
  stage_ = 2;
}

void ExpertParallelLowLatency::combine(const void* y, const std::int64_t* topk_idx, const float* topk_weights,
                                       void* out, std::int64_t num_tokens, cudaStream_t stream) {
  WEFT_REQUIRE(stage_ == 2, "ExpertParallelLowLatency::combine: dispatch_send and dispatch_recv must come first");
  WEFT_REQUIRE(num_tokens == tokens_, "ExpertParallelLowLatency::combine: ", num_tokens,
               " tokens, but this step's dispatch sent ", tokens_);
  WEFT_REQUIRE(y, "ExpertParallelLowLatency::combine: y is null");
  WEFT_REQUIRE(num_tokens == 0 || (topk_idx && topk_weights && out),
               "ExpertParallelLowLatency::combine: topk_idx, topk_weights and out are needed for ", num_tokens,
               " tokens");
  WEFT_REQUIRE((reinterpret_cast<std::uintptr_t>(y) | reinterpret_cast<std::uintptr_t>(out)) % 16 == 0,
               "ExpertParallelLowLatency::combine: y and out must be 16-byte aligned");
  if (ctx_->check_calls()) ctx_->verify_same_call("ExpertParallelLowLatency combine");
  LlArgs a{};
  a.w = ctx_->world();
  a.experts = opt_.experts;
  a.world = ctx_->world_size();
  a.k = opt_.top_k;
  a.hidden = opt_.hidden;
  a.max_tokens = opt_.max_tokens;
  a.tokens = num_tokens;
  a.topk = topk_idx;
  a.weights = topk_weights;
  a.y = static_cast<const uint4*>(y);
  a.out = static_cast<uint4*>(out);
  a.recv_src = recv_src_.as<std::int32_t>();
  a.recv_count = recv_count_.as<std::int32_t>();
  a.comb_buf = comb_buf_.as<uint4>();
  a.comb_flags = combine_signals_.flags();
  a.done = scratch_.as<std::uint64_t>() + 2;
  a.epoch = combine_signals_.launch_epoch();
  const std::int64_t slots = static_cast<std::int64_t>(opt_.experts) * opt_.max_tokens;  // per x W x M
  const std::int64_t work = std::max<std::int64_t>(slots / 4, num_tokens);
  const int grid = static_cast<int>(std::clamp<std::int64_t>((work + kWarpsLl - 1) / kWarpsLl, 1, blocks_));
  if (across_) across_->combine(a, grid, stream);
  else launch_pdl(ll_combine_kernel<DirectPeers>, grid, kThreadsLl, stream, a);
  WEFT_CUDA(cudaGetLastError());
  stage_ = 0;
}

void ExpertParallelLowLatency::check_errors(cudaStream_t stream) {
  std::uint64_t key = kNoErrorLl;
  WEFT_CUDA(cudaMemcpyAsync(&key, scratch_.get(), 8, cudaMemcpyDeviceToHost, stream));
  ctx_->synchronize(stream);
  if (key == kNoErrorLl) return;
  const std::uint64_t none = kNoErrorLl;
  WEFT_CUDA(cudaMemcpy(scratch_.get(), &none, 8, cudaMemcpyHostToDevice));
  WEFT_FAIL("ExpertParallelLowLatency: rank ", ctx_->rank(), "'s token ", key >> 8, " (slot ", (key >> 2) & 63u, ") ",
            (key & 3u) == 2 ? "lists an expert twice" : "has an expert id out of range",
            ": ids must be in [-1, ", opt_.experts, ") and distinct within a token; the token was not sent");
}

}  // namespace weft
