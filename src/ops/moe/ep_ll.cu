// Expert-parallel dispatch and combine, low-latency mode: the plan and its three kernels.
//
//   send     (grid from the rank's SM share; waits for nobody)
//            a warp per token validates its row, finds each pair's position
//            among this rank's earlier pairs of the same expert (a scan of
//            the earlier rows: M x k entries at most), and writes the token
//            into row (local expert, this rank, position) of each expert's
//            owner, with its (token, slot) in recv_src. With fp8_dispatch it
//            writes the token cast to e4m3 and a scale per 128 channels. The grid's last block
//            counts this rank's pairs per expert and sets each owner's flag
//            (local expert, this rank) to (epoch << 32) | pairs.
//   recv     (one block) waits for every (local expert, source) flag of this
//            epoch and writes the counts.
//   combine  (grid from the SM share) send half: each received row's output
//            goes back to its source, to row (token, slot) of the source's
//            combine buffer; the last block sets each source's flag to the
//            epoch. Receive half: once every rank's flag is set, a warp per
//            token sums w x y over its slots in order (fp32), rounds once.
//
// No host synchronisation: the counts travel in the flags, positions are
// computed on the device, every buffer has a fixed size. Reuse across calls
// without a reset: a source writes into a rank's receive buffer in send
// n + 1 only after its combine n has seen that rank's combine flag, set
// after the rank's combine n had read recv_src (and after its experts, which
// precede combine on its stream, had read recv_x); a rank writes into a
// source's combine buffer in combine n + 1 only after its recv n + 1 saw the
// source's counts of n + 1, sent after the source's combine n had read the
// buffer. Flags carry the epoch, so nothing is reset.
#include <cuda_fp8.h>

#include <algorithm>
#include <cstring>

#include "../kernel_util.cuh"
#include "ep_layout.hpp"
#include "row_sums.cuh"
#include "weft/core/error.hpp"
#include "weft/device.cuh"
#include "weft/ops/ep.hpp"

namespace weft {
namespace {

using namespace ops_detail;
using moe_detail::ExpertPlacement;

constexpr int kThreadsLl = 256;
constexpr int kWarpsLl = kThreadsLl / 32;
constexpr int kRecvThreads = 1024;
constexpr int kMaxExpertsLl = 1024;
constexpr int kMaxTokensLl = 4096;
constexpr std::uint64_t kNoErrorLl = ~std::uint64_t{0};
using moe_detail::kFp8ScaleChannels;
constexpr float kE4m3Max = 448.f;      // the largest finite e4m3 value
constexpr float kFp8MinAmax = 1e-4f;   // a block's amax floor, as DeepEP: an all-zero block gets a finite scale

struct LlArgs {
  dev::World w;
  int experts, world, k, hidden, max_tokens;
  bool fp8;                     // dispatch casts tokens to e4m3 (recv_x: bytes, recv_scales: floats)
  std::int64_t tokens;
  const std::int64_t* topk;     // [T][k]
  const float* weights;         // [T][k]
  const uint4* x;               // [T][H]
  const uint4* y;               // [per][W][M][H]
  uint4* out;                   // [T][H]
  uint4* recv_x;                // symmetric [per][W][M][H] bf16, or e4m3 bytes
  float* recv_scales;           // fp8: symmetric [per][W][M][H / 128]
  std::int32_t* recv_src;       // symmetric [per][W][M]
  std::uint64_t* count_flags;   // symmetric [per][W]
  std::int32_t* recv_count;     // local [per][W]
  uint4* comb_buf;              // symmetric [M][k][H]
  std::uint64_t* comb_flags;    // symmetric [W]
  std::uint64_t* error;         // local: min (token << 8 | slot << 2 | code)
  std::uint64_t* done;          // local counter for the last block
  dev::LaunchEpoch epoch;
};

// fp8 dispatch: a warp casts one token's row (src, `vecs` 16-byte vectors of 8 bf16) to e4m3
// once and stores it to each of its destinations: lane j of `sends` holds slot j's row
// (dst_x: H bytes) and scales (dst_scales: one float per 128 channels). scale = amax / 448
// over the block (amax at least kFp8MinAmax), each channel x * (448 / amax) rounded to
// nearest, saturated to the finite range. A step covers 256 channels: two blocks, one per
// half-warp; each lane stores its own 8 bytes to every destination, so nothing is staged.
__device__ void cast_row_to_fp8(const uint4* src, std::int64_t vecs, int lane, unsigned sends, std::uint8_t* dst_x,
                                float* dst_scales) {
  const auto x_at = reinterpret_cast<unsigned long long>(dst_x);
  const auto scales_at = reinterpret_cast<unsigned long long>(dst_scales);
  for (std::int64_t v0 = 0; v0 < vecs; v0 += 32) {  // every lane runs every step (the shuffles)
    const std::int64_t v = v0 + lane;
    const bool here = v < vecs;  // the same for a whole half-warp: vecs is a multiple of 16
    uint4 raw = make_uint4(0, 0, 0, 0);
    if (here) raw = src[v];
    const __nv_bfloat16* e = reinterpret_cast<const __nv_bfloat16*>(&raw);
    float f[8], amax = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      f[i] = __bfloat162float(e[i]);
      amax = fmaxf(amax, fabsf(f[i]));
    }
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));  // the half-warp's
    amax = fmaxf(amax, kFp8MinAmax);
    const float inv = kE4m3Max / amax;
    std::uint8_t q[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] = __nv_cvt_float_to_fp8(f[i] * inv, __NV_SATFINITE, __NV_E4M3);
    uint2 packed;
    std::memcpy(&packed, q, 8);
    for (unsigned left = sends; left != 0; left &= left - 1) {
      const int j = __ffs(left) - 1;
      auto* x = reinterpret_cast<uint2*>(__shfl_sync(0xffffffffu, x_at, j));
      auto* scales = reinterpret_cast<float*>(__shfl_sync(0xffffffffu, scales_at, j));
      if (!here) continue;
      x[v] = packed;
      if ((lane & 15) == 0) scales[v / 16] = amax / kE4m3Max;
    }
  }
}

__global__ void __launch_bounds__(kThreadsLl) ll_send_kernel(LlArgs a) {
  const std::uint64_t e = dev::epoch_begin(a.epoch);
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const std::int64_t warp0 = static_cast<std::int64_t>(blockIdx.x) * kWarpsLl + threadIdx.x / 32;
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * kWarpsLl;
  const int W = a.world, E = a.experts, k = a.k, per = E / W, me = a.w.rank, M = a.max_tokens;
  const std::int64_t vecs = a.hidden / 8;
  const ExpertPlacement pl{E, W};

  for (std::int64_t t = warp0; t < a.tokens; t += warps) {
    const bool in = lane < k;
    const std::int64_t ex = in ? a.topk[t * k + lane] : -1;
    const bool bad = in && (ex < -1 || ex >= E);
    const bool valid = in && ex >= 0 && !bad;
    const unsigned same = __match_any_sync(0xffffffffu, valid ? static_cast<unsigned long long>(ex)
                                                               : ~static_cast<unsigned long long>(lane) - 1);
    const bool repeat = valid && static_cast<int>(__ffs(same)) - 1 != lane;
    const unsigned errors = __ballot_sync(0xffffffffu, bad || repeat);
    if (errors != 0) {
      if (lane == __ffs(errors) - 1)
        atomicMin(reinterpret_cast<unsigned long long*>(a.error),
                  static_cast<unsigned long long>((static_cast<std::uint64_t>(t) << 8) |
                                                  (static_cast<std::uint64_t>(lane) << 2) | (bad ? 1u : 2u)));
      continue;  // warp-uniform
    }
    // Position of each pair among this rank's pairs of its expert: entries equal to it in earlier rows.
    int pos = 0;
    const std::int64_t earlier = t * k;
    for (std::int64_t base = 0; base < earlier; base += 32) {
      const std::int64_t idx = base + lane;
      const std::int64_t v = idx < earlier ? a.topk[idx] : -2;
      for (int j = 0; j < k; ++j) {
        const std::int64_t ej = __shfl_sync(0xffffffffu, ex, j);
        const int c = __popc(__ballot_sync(0xffffffffu, ej >= 0 && v == ej));
        if (lane == j) pos += c;
      }
    }
    const uint4* src = a.x + t * vecs;
    // Lane j's destination: row pos of (its expert's local index, this rank) at the expert's owner.
    // pos >= M only where an earlier row was bad (and recorded).
    const bool send = valid && pos < M;
    const int owner = send ? pl.owner(static_cast<int>(ex)) : 0;
    const std::int64_t row = send ? moe_detail::low_latency_row(pl, M, pl.local(static_cast<int>(ex)), me, pos) : 0;
    const unsigned sends = __ballot_sync(0xffffffffu, send);
    if (send) a.w.symm_at(a.recv_src, owner)[row] = static_cast<std::int32_t>(t * 32 + lane);
    if (a.fp8) {  // cast once, store to every destination
      cast_row_to_fp8(src, vecs, lane, sends,
                      send ? reinterpret_cast<std::uint8_t*>(a.w.symm_at(a.recv_x, owner)) + row * a.hidden : nullptr,
                      send ? a.w.symm_at(a.recv_scales, owner) + row * (a.hidden / kFp8ScaleChannels) : nullptr);
      continue;
    }
    for (unsigned left = sends; left != 0; left &= left - 1) {
      const int j = __ffs(left) - 1;
      const int r = __shfl_sync(0xffffffffu, owner, j);
      const std::int64_t rj = __shfl_sync(0xffffffffu, row, j);
      dev::copy_warp(a.w.symm_at(a.recv_x, r) + rj * vecs, src, static_cast<std::size_t>(vecs) * 16);
    }
  }
  if (last_block(a.done)) {
    // This rank's pairs per expert, then each owner's flag: the release covers
    // every block's rows (the counter chain, then the barrier).
    __shared__ int pairs[kMaxExpertsLl];
    for (int x = static_cast<int>(threadIdx.x); x < E; x += blockDim.x) pairs[x] = 0;
    __syncthreads();
    for (std::int64_t i = threadIdx.x; i < a.tokens * k; i += blockDim.x) {
      const std::int64_t v = a.topk[i];
      if (v >= 0 && v < E) atomicAdd(&pairs[v], 1);
    }
    __syncthreads();
    for (int x = static_cast<int>(threadIdx.x); x < E; x += blockDim.x) {
      const std::uint64_t rows = static_cast<std::uint64_t>(min(pairs[x], M));
      dev::notify(a.w, a.count_flags + static_cast<std::int64_t>(pl.local(x)) * W + me, pl.owner(x), (e << 32) | rows,
                  dev::SignalOp::set, dev::Scope::sys);
    }
  }
  (void)per;
  dev::epoch_end(a.epoch, e);
}

__global__ void __launch_bounds__(kRecvThreads) ll_recv_kernel(LlArgs a) {
  const std::uint64_t e = dev::epoch_begin(a.epoch);
  const int W = a.world, per = a.experts / W;
  for (int i = static_cast<int>(threadIdx.x); i < per * W; i += blockDim.x) {
    const std::uint64_t v = dev::wait_until(a.w, a.count_flags + i, dev::Cmp::ge, e << 32, dev::Scope::sys, i % W);
    a.recv_count[i] = static_cast<std::int32_t>(v & 0xffffffffu);
  }
  dev::epoch_end(a.epoch, e);
}

__global__ void __launch_bounds__(kThreadsLl) ll_combine_kernel(LlArgs a) {
  const std::uint64_t e = dev::epoch_begin(a.epoch);
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const std::int64_t warp0 = static_cast<std::int64_t>(blockIdx.x) * kWarpsLl + threadIdx.x / 32;
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * kWarpsLl;
  const int W = a.world, E = a.experts, k = a.k, per = E / W, me = a.w.rank, M = a.max_tokens;
  const std::int64_t vecs = a.hidden / 8;

  // Send half: every received row's output back to its source's (token, slot) row.
  const std::int64_t slots = static_cast<std::int64_t>(per) * W * M;
  for (std::int64_t i = warp0; i < slots; i += warps) {
    const std::int64_t block = i / M;  // (local expert, source)
    const int src = static_cast<int>(block % W);
    if (i % M >= a.recv_count[block]) continue;
    const std::int32_t sid = __ldcg(a.recv_src + i);
    const std::int64_t t = sid / 32, j = sid % 32;
    dev::copy_warp(a.w.symm_at(a.comb_buf, src) + (t * k + j) * vecs, a.y + i * vecs, static_cast<std::size_t>(vecs) * 16);
  }
  if (last_block(a.done)) {
    for (int p = static_cast<int>(threadIdx.x); p < W; p += blockDim.x)
      dev::notify(a.w, a.comb_flags + me, p, e, dev::SignalOp::set, dev::Scope::sys);
  }
  if (static_cast<int>(threadIdx.x) < W)
    dev::wait_until(a.w, a.comb_flags + threadIdx.x, dev::Cmp::ge, e, dev::Scope::sys, static_cast<int>(threadIdx.x));
  __syncthreads();

  // Receive half: out[t] = sum over slots j ascending of w[t][j] x y(t, j).
  for (std::int64_t t = warp0; t < a.tokens; t += warps) {
    const std::int64_t ex = lane < k ? a.topk[t * k + lane] : -1;
    const float w = lane < k ? a.weights[t * k + lane] : 0.f;
    const unsigned valid = __ballot_sync(0xffffffffu, ex >= 0 && ex < E);
    auto row_at = [&](int j) { return a.comb_buf + (t * k + j) * vecs; };
    auto weight = [&](int j) { return __shfl_sync(0xffffffffu, w, j); };
    for (std::int64_t v0 = 0; v0 < vecs; v0 += 32 * moe_detail::kRowSumVecs) {  // every lane runs every step
      moe_detail::RowSumAcc acc{};  // fp32 sums, rounded once
      moe_detail::add_rows<true>(acc, valid, row_at, weight, v0 + lane, vecs);
      moe_detail::store_rows(a.out + t * vecs, acc, v0 + lane, vecs);
    }
  }
  dev::epoch_end(a.epoch, e);
}

}  // namespace

ExpertParallelLowLatency::ExpertParallelLowLatency(std::shared_ptr<Context> ctx, const EpLowLatencyOptions& options)
    : ctx_(std::move(ctx)), opt_(options) {
  WEFT_REQUIRE(ctx_, "ExpertParallelLowLatency needs a Context");
  ctx_->require_direct_peers("ExpertParallelLowLatency");  // its kernels load and store every peer's heap
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
                             opt_.fp8_dispatch ? "on" : "off"));
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
  launch_pdl(ll_send_kernel, grid, kThreadsLl, stream, a);
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
  launch_pdl(ll_combine_kernel, grid, kThreadsLl, stream, a);
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
