// dist_flash_decode.cu - weft::DistFlashDecode: the local attention, then one kernel that exchanges and merges partials.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "../kernel_util.cuh"
#include "../two_level.hpp"
#include "decode_split.hpp"
#include "weft/core/error.hpp"
#include "weft/device.cuh"
#include "weft/ops/dist_flash_decode.hpp"

namespace weft {
namespace attention_detail {
namespace {

constexpr int kExchangeThreads = 128;  // 4 warps, one row (sequence, query head) each at a time

struct ExchangeArgs {
  dev::World w;
  const float* part_o;    // [rows, splits, D]: this rank's splits
  const float* part_lse;  // [rows, splits]
  int splits;
  int rows;               // batch x q_heads
  float* staging;         // [2 parities][W][rows][D] outputs, then [2][W][rows] lses
  std::uint64_t* flags;   // [2 parities][W senders][blocks]
  dev::LaunchEpoch epoch;
  void* out;
  float* lse;
};

// This rank's partial of `row`: its splits merged in split order. Each lane
// holds kPer of the D values (scaled by the merge's output scale); returns the
// partial's lse. One warp per row; both paths (one node, across nodes) call it,
// so they stage the same bits.
template <int D>
__device__ __forceinline__ float local_partial(const ExchangeArgs& a, int row, int lane, float (&acc)[D / 32]) {
  constexpr int kPer = D / 32;
  const float* lse = a.part_lse + std::int64_t{row} * a.splits;
  const float* o = a.part_o + std::int64_t{row} * a.splits * D + lane * kPer;
  LseMerge merge;
  for (int s = 0; s < a.splits; ++s) {
    float unused;
    merge.add(lse[s], unused);
  }
#pragma unroll
  for (int i = 0; i < kPer; ++i) acc[i] = 0.0f;
  for (int s = 0; s < a.splits; ++s) {
    const float l_s = lse[s];
    if (l_s == -INFINITY) continue;
    const float wgt = expf(l_s - merge.max_lse);
#pragma unroll
    for (int i = 0; i < kPer; ++i) acc[i] += wgt * o[std::int64_t{s} * D + i];
  }
  const float scale = merge.output_scale();
#pragma unroll
  for (int i = 0; i < kPer; ++i) acc[i] *= scale;
  return merge.lse();
}

// The ranks' partials of `row` merged in rank order into out (and lse): every
// rank computes the same bits. `part_o(r)` is rank r's [D] output of the row,
// `part_lse(r)` its lse. One warp per row.
template <class T, int D, class PartO, class PartLse>
__device__ __forceinline__ void merge_ranks(const ExchangeArgs& a, int row, int lane, int world, PartO part_o,
                                            PartLse part_lse) {
  constexpr int kPer = D / 32;
  LseMerge merge;
  for (int r = 0; r < world; ++r) {
    float unused;
    merge.add(part_lse(r), unused);
  }
  float acc[kPer] = {};
  for (int r = 0; r < world; ++r) {
    const float l_r = part_lse(r);
    if (l_r == -INFINITY) continue;  // an empty shard: its output is zeros, skipped all the same
    const float wgt = expf(l_r - merge.max_lse);
    const float* o = part_o(r) + lane * kPer;
#pragma unroll
    for (int i = 0; i < kPer; ++i) acc[i] += wgt * o[i];
  }
  const float scale = merge.output_scale();
  T* out = static_cast<T*>(a.out) + std::int64_t{row} * D + lane * kPer;
#pragma unroll
  for (int i = 0; i < kPer; ++i) out[i] = static_cast<T>(acc[i] * scale);
  if (lane == 0 && a.lse) a.lse[row] = merge.lse();
}

template <class T, int D>
__global__ void __launch_bounds__(kExchangeThreads) exchange_kernel(ExchangeArgs a) {
  constexpr int kPer = D / 32;
  // dev::epoch_begin without its early trigger: the next kernel in the stream (the next run's attention,
  // 96 KB of shared memory a block) must not be scheduled while these blocks wait on other ranks, or on a
  // shared GPU it could hold the SMs another rank's attention needs before that rank can signal.
  dev::pdl_wait();  // the local attention has finished
  const std::uint64_t e = *a.epoch.value + 1;
  const int me = a.w.rank, world = a.w.size, blocks = gridDim.x, block = blockIdx.x;
  const int parity = static_cast<int>(e & 1);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const std::uint64_t rows = static_cast<std::uint64_t>(a.rows);
  float* stage_o = a.staging + parity * world * rows * D;                 // [W][rows][D]
  float* stage_lse = a.staging + 2 * world * rows * D + parity * world * rows;  // [W][rows]
  const int first = block * (kExchangeThreads / 32) + warp, stride = blocks * (kExchangeThreads / 32);

  // 1. This rank's partial of each of its rows, stored into every rank's slot `me`.
  for (int row = first; row < a.rows; row += stride) {
    float acc[kPer];
    const float part_lse = local_partial<D>(a, row, lane, acc);
    for (int q = 0; q < world; ++q) {
      float* dst = a.w.symm_at(stage_o + (std::uint64_t(me) * rows + row) * D + lane * kPer, q);
#pragma unroll
      for (int i = 0; i < kPer; ++i) dst[i] = acc[i];
      if (lane == 0) *a.w.symm_at(stage_lse + std::uint64_t(me) * rows + row, q) = part_lse;
    }
  }
  // 2. Every rank's block `block` handles the same rows: tell each rank this block's part has landed,
  // and wait until every rank's has (thread q talks to rank q).
  __syncthreads();  // the releases below cover every thread's stores
  const int q = static_cast<int>(threadIdx.x);
  if (q < world) {
    dev::notify(a.w, a.flags + (std::uint64_t(parity) * world + me) * blocks + block, q, e, dev::SignalOp::set,
                dev::Scope::sys);
    dev::wait_until(a.w, a.flags + (std::uint64_t(parity) * world + q) * blocks + block, dev::Cmp::ge, e,
                    dev::Scope::sys, q);
  }
  __syncthreads();
  // 3. Merge the ranks' partials in rank order.
  for (int row = first; row < a.rows; row += stride)
    merge_ranks<T, D>(
        a, row, lane, world, [&](int r) { return stage_o + (std::uint64_t(r) * rows + row) * D; },
        [&](int r) { return stage_lse[std::uint64_t(r) * rows + row]; });
  dev::epoch_end(a.epoch, e);
}

// Across nodes, step 1: this rank's partial of every row into its own slot of
// the gathered staging ([W][rows x D outputs, then rows lses]), which the
// two-level AllGather then fills with every rank's. Waits on no rank.
template <int D>
__global__ void __launch_bounds__(kExchangeThreads) stage_local_kernel(ExchangeArgs a) {
  constexpr int kPer = D / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const std::uint64_t rows = static_cast<std::uint64_t>(a.rows);
  float* mine = a.staging + std::uint64_t(a.w.rank) * rows * (D + 1);
  for (int row = blockIdx.x * (kExchangeThreads / 32) + warp; row < a.rows; row += gridDim.x * (kExchangeThreads / 32)) {
    float acc[kPer];
    const float part_lse = local_partial<D>(a, row, lane, acc);
#pragma unroll
    for (int i = 0; i < kPer; ++i) mine[std::uint64_t(row) * D + lane * kPer + i] = acc[i];
    if (lane == 0) mine[rows * D + row] = part_lse;
  }
}

// Across nodes, step 3: the gathered partials merged in rank order, as the
// one-node kernel's step 3 merges them.
template <class T, int D>
__global__ void __launch_bounds__(kExchangeThreads) merge_gathered_kernel(ExchangeArgs a) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, world = a.w.size;
  const std::uint64_t rows = static_cast<std::uint64_t>(a.rows);
  for (int row = blockIdx.x * (kExchangeThreads / 32) + warp; row < a.rows; row += gridDim.x * (kExchangeThreads / 32))
    merge_ranks<T, D>(
        a, row, lane, world, [&](int r) { return a.staging + std::uint64_t(r) * rows * (D + 1) + std::uint64_t(row) * D; },
        [&](int r) { return a.staging[std::uint64_t(r) * rows * (D + 1) + rows * D + row]; });
}

}  // namespace
}  // namespace attention_detail

DistFlashDecode::DistFlashDecode(std::shared_ptr<Context> ctx, const FlashDecodeOptions& local) : ctx_(std::move(ctx)) {
  using namespace attention_detail;
  WEFT_REQUIRE(ctx_ != nullptr, "DistFlashDecode: the Context must not be null");
  // One node: the exchange kernel stores into every peer's heap. Across nodes: the two-level AllGather
  // (weft::internode, while a weft::RemotePeers is alive) moves the partials; refused, by name, without it.
  across_nodes_ = !ctx_->all_peers_direct();
  if (across_nodes_ && !ops_detail::two_level_collectives())
    ctx_->require_direct_peers("DistFlashDecode",
                               "which DistFlashDecode takes across nodes through the two-level AllGather: it lives in "
                               "weft::internode, so link that library (CMake: weft_use_internode(<target>)) and "
                               "construct a weft::RemotePeers before the plan (weft/internode/remote_peers.hpp).");
  FlashDecodeOptions o = local;
  if (o.sm_count == 0) o.sm_count = ctx_->team().sm_count;  // ranks sharing a GPU split its SMs
  local_ = std::unique_ptr<FlashDecode>(new FlashDecode(o, true));
  const int world = ctx_->world_size();
  const std::uint64_t rows = std::uint64_t(o.batch) * o.q_heads;
  // The exchange blocks wait on other ranks: all of them must be resident at once, on every rank.
  blocks_ = static_cast<int>(std::min<std::uint64_t>((rows + 3) / 4, std::max(1, ctx_->team().sm_count)));
  ctx_->verify_same_call(str("DistFlashDecode plan: batch ", o.batch, ", ", o.q_heads, "/", o.kv_heads, " heads, dim ",
                             o.head_dim, ", ", to_string(o.dtype), ", ", to_string(o.layout), ", ", blocks_,
                             " exchange blocks", across_nodes_ ? ", across nodes (two-level AllGather)" : ""));
  if (across_nodes_) {
    // [W][rows x D outputs, then rows lses]: this rank's slot written locally, the rest by the AllGather.
    const std::uint64_t per_rank = rows * (o.head_dim + 1) * sizeof(float);
    staging_ = SymmetricBuffer(ctx_->heap(), std::uint64_t(world) * per_rank, "f32", "dist_flash_decode.gathered");
    gather_ = std::make_unique<AllGather>(ctx_, AllGatherOptions{per_rank, AllGatherVariant::two_level, 0});
    return;
  }
  staging_ = SymmetricBuffer(ctx_->heap(), 2 * std::uint64_t(world) * rows * (o.head_dim + 1) * sizeof(float), "f32",
                             "dist_flash_decode.staging");
  signals_ = SignalArray(ctx_->heap(), 2 * std::uint64_t(world) * blocks_, "dist_flash_decode.flags");
}

DistFlashDecode::~DistFlashDecode() = default;

void DistFlashDecode::run(const FlashDecodeArgs& args, cudaStream_t stream) {
  WEFT_REQUIRE(args.out != nullptr, "DistFlashDecode::run: out must not be null");
  WEFT_REQUIRE(reinterpret_cast<std::uintptr_t>(args.out) % 16 == 0, "DistFlashDecode::run: out must be 16-byte aligned");
  if (ctx_->check_calls()) ctx_->verify_same_call(str("DistFlashDecode run #", ++runs_));
  local_->run(args, stream);
  ran_ = true;
  launch_exchange(args, stream);
}

void DistFlashDecode::combine(const FlashDecodeArgs& args, cudaStream_t stream) {
  WEFT_REQUIRE(args.out != nullptr, "DistFlashDecode::combine: out must not be null");
  WEFT_REQUIRE(reinterpret_cast<std::uintptr_t>(args.out) % 16 == 0,
               "DistFlashDecode::combine: out must be 16-byte aligned");
  WEFT_REQUIRE(ran_, "DistFlashDecode::combine: run() must come first (combine merges the partials run() left)");
  if (ctx_->check_calls()) ctx_->verify_same_call(str("DistFlashDecode combine #", ++runs_));
  launch_exchange(args, stream);
}

void DistFlashDecode::launch_exchange(const FlashDecodeArgs& args, cudaStream_t stream) {
  using namespace attention_detail;
  const FlashDecodeOptions& o = local_->options();
  ExchangeArgs a{ctx_->world(),
                 local_->partial_outputs(),
                 local_->partial_lses(),
                 local_->splits(),
                 o.batch * o.q_heads,
                 staging_.as<float>(),
                 across_nodes_ ? nullptr : signals_.flags(),
                 across_nodes_ ? dev::LaunchEpoch{} : signals_.launch_epoch(),
                 args.out,
                 args.lse};
  auto launch = [&](auto t) {
    using T = decltype(t);
    auto by_dim = [&](auto dim) {
      constexpr int D = decltype(dim)::value;
      if (!across_nodes_) return ops_detail::launch_pdl(exchange_kernel<T, D>, blocks_, kExchangeThreads, stream, a);
      // Across nodes: stage this rank's partial, gather every rank's (in place), merge in rank order.
      stage_local_kernel<D><<<blocks_, kExchangeThreads, 0, stream>>>(a);
      WEFT_CUDA(cudaGetLastError());
      const std::uint64_t per_rank = std::uint64_t(a.rows) * (D + 1) * sizeof(float);
      gather_->run(staging_.as<char>() + std::uint64_t(ctx_->rank()) * per_rank, staging_.get(), stream);
      merge_gathered_kernel<T, D><<<blocks_, kExchangeThreads, 0, stream>>>(a);
    };
    if (o.head_dim == 64) by_dim(std::integral_constant<int, 64>{});
    else by_dim(std::integral_constant<int, 128>{});
  };
  if (o.dtype == DType::fp16) launch(__half{});
  else launch(__nv_bfloat16{});
  WEFT_CUDA(cudaGetLastError());
}

}  // namespace weft
