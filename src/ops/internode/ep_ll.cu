// ExpertParallelLowLatency across nodes: the one-node plan's send and combine
// kernels (moe/ep_ll_kernels.cuh) with a transport that reaches the peers of
// other nodes through NVSHMEM (weft/device/remote.cuh). As in DeepEP's
// low-latency mode, every (token, expert) pair goes straight to the expert's
// owner, one put per pair, with no forwarding by a rail GPU: decode batches
// are small, and one hop is the latency floor. Peers of this node are still
// reached by stores.
//
// What NVSHMEM asks of such a kernel, and where the kernels do it:
//   - a NIC reads only registered memory: a row bound for another node is
//     first staged in this rank's symmetric heap (send_x_ / send_scales_, one
//     row per token, cast to e4m3 once under fp8; send_y_, one row per
//     received row), then put from there (nvshmemx_putmem_nbi_warp);
//   - puts issued by many warps are not ordered with a later signal: every
//     block completes its puts (remote::quiet_block) before the grid's last
//     block, through last_block's counter chain, raises the flags, so a flag
//     covers every row;
//   - a staging row is written again one call later, after that quiet.
#include "../moe/ep_ll_kernels.cuh"
#include "../two_level.hpp"
#include "collectives.hpp"
#include "weft/core/error.hpp"
#include "weft/device/remote.cuh"

namespace weft::ops_detail {
namespace {

using moe_detail::LlArgs;

/// Stores where the peer's heap is mapped here, NVSHMEM's puts and signals elsewhere.
struct NodesPeers {
  static constexpr bool kStaged = true;
  __device__ static bool direct(const dev::World& w, int pe) { return remote::direct(w, pe); }
  /// The calling warp: from `src` (any memory) by stores where `pe` is reachable, else a
  /// non-blocking put from `staged` (this rank's symmetric heap), completed by complete_block.
  __device__ static void row_warp(const dev::World& w, void* dst, const void* src, const void* staged,
                                  std::size_t bytes, int pe) {
    if (direct(w, pe)) dev::copy_warp(w.symm_at(dst, pe), src, bytes);
    else nvshmemx_putmem_nbi_warp(dst, staged, bytes, pe);
  }
  /// One thread: a store, or NVSHMEM's single-element put (delivered by complete_block).
  __device__ static void put_i32(const dev::World& w, std::int32_t* dst, std::int32_t v, int pe) {
    if (direct(w, pe)) *w.symm_at(dst, pe) = v;
    else nvshmem_int_p(dst, v, pe);
  }
  /// One thread: the flag, after everything this grid wrote or put (remote::signal_op).
  __device__ static void signal(const dev::World& w, std::uint64_t* sig, std::uint64_t v, int pe) {
    remote::signal_op(w, sig, v, dev::SignalOp::set, pe);
  }
  /// Every thread of the block: its puts delivered and visible at system scope.
  __device__ static void complete_block(const dev::World& w) { remote::quiet_block(w); }
};

class EpLlAcrossNodes final : public TwoLevelEpLl {
 public:
  EpLlAcrossNodes(Context& ctx, const EpLowLatencyOptions& o) : fp8_(o.fp8_dispatch) {
    const std::uint64_t per = o.experts / ctx.world_size(), W = ctx.world_size(), M = o.max_tokens, H = o.hidden;
    send_x_ = SymmetricBuffer(ctx.heap(), M * H * (fp8_ ? 1 : 2), fp8_ ? "fp8_e4m3" : "bf16", "ep_ll.two_level.send_x");
    if (fp8_)
      send_scales_ = SymmetricBuffer(ctx.heap(), M * (H / moe_detail::kFp8ScaleChannels) * 4, "f32",
                                     "ep_ll.two_level.send_scales");
    send_y_ = SymmetricBuffer(ctx.heap(), per * W * M * H * 2, "bf16", "ep_ll.two_level.send_y");
  }

  void send(LlArgs a, int grid, cudaStream_t stream) override {
    require_remote_peers("ExpertParallelLowLatency");
    a.send_x = send_x_.as<uint4>();
    a.send_scales = fp8_ ? send_scales_.as<float>() : nullptr;
    launch_pdl(moe_detail::ll_send_kernel<NodesPeers>, grid, moe_detail::kThreadsLl, stream, a);
    WEFT_CUDA(cudaGetLastError());
  }

  void combine(LlArgs a, int grid, cudaStream_t stream) override {
    require_remote_peers("ExpertParallelLowLatency");
    a.send_y = send_y_.as<uint4>();
    launch_pdl(moe_detail::ll_combine_kernel<NodesPeers>, grid, moe_detail::kThreadsLl, stream, a);
    WEFT_CUDA(cudaGetLastError());
  }

 private:
  bool fp8_;
  SymmetricBuffer send_x_, send_scales_, send_y_;
};

}  // namespace

std::unique_ptr<TwoLevelEpLl> make_two_level_expert_parallel_low_latency(Context& ctx,
                                                                         const EpLowLatencyOptions& options) {
  return std::make_unique<EpLlAcrossNodes>(ctx, options);
}

}  // namespace weft::ops_detail
