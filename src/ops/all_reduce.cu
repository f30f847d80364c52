// AllReduce: the plan and its one-node SM kernels (ll, one_shot, two_shot); the
// two-level variant's kernel is weft::internode's (two_level.hpp).
//
// Flags (one SignalArray):
//   one_shot: [2 parities][W senders][B blocks], set to the epoch when that
//             sender's block has stored its slice into this rank's staging.
//   two_shot: ready[W] (set e: "my kernel e runs: my input is complete, my output
//             free"), reduced[W] (+1 per block: "my chunk of the sum is in my
//             output"), done[W] (+1 per block: "I have read all I need of yours").
// ll carries its flags inside the data lines.
#include "ce_reduction.hpp"
#include "kernel_util.cuh"
#include "two_level.hpp"
#include "weft/core/env.hpp"
#include "weft/device.cuh"
#include "weft/ops/all_reduce.hpp"

namespace weft {
namespace {

using namespace ops_detail;

struct Args {
  dev::World w;
  const void* input;
  void* output;
  std::uint64_t count;
  std::uint64_t* flags;
  void* staging;
  dev::LaunchEpoch epoch;
};

template <class T>
__global__ void __launch_bounds__(kThreads) ll_kernel(Args a) {
  const std::uint64_t e = dev::epoch_begin(a.epoch);
  const auto flag = static_cast<std::uint32_t>(e);
  const int me = a.w.rank, world = a.w.size;
  const std::uint64_t bytes = a.count * sizeof(T), words = (bytes + 3) / 4;
  auto* stage = static_cast<std::uint64_t*>(a.staging) + (e & 1) * world * words;
  const std::uint64_t first = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x;
  const std::uint64_t stride = std::uint64_t{gridDim.x} * blockDim.x;
  // Send every word first, then collect: a thread never waits between its sends.
  for (std::uint64_t i = first; i < words; i += stride) {
    const std::uint32_t v = load_word(a.input, bytes, i);
    for (int k = 1; k < world; ++k) dev::ll_store(a.w.symm_at(stage + me * words + i, (me + k) % world), v, flag);
  }
  for (std::uint64_t i = first; i < words; i += stride) {
    const std::uint32_t mine = load_word(a.input, bytes, i);
    dev::Acc<T, 4> acc;
    for (int q = 0; q < world; ++q) {
      const std::uint32_t v = q == me ? mine : dev::ll_wait(a.w, stage + q * words + i, flag, q);
      q == 0 ? acc.set(v) : acc.add(v);
    }
    store_word(a.output, bytes, i, acc.template pack<std::uint32_t>());
  }
  dev::epoch_end(a.epoch, e);
}

template <class T>
__global__ void __launch_bounds__(kThreads) one_shot_kernel(Args a) {
  const std::uint64_t e = dev::epoch_begin(a.epoch);
  const int me = a.w.rank, world = a.w.size, blocks = gridDim.x;
  const auto* in = static_cast<const T*>(a.input);
  auto* stage = static_cast<T*>(a.staging) + (e & 1) * world * a.count;  // [W][count]
  const int parity = static_cast<int>(e & 1);
  std::uint64_t lo, hi;
  block_range(0, a.count, 16 / sizeof(T), lo, hi);
  for (int k = 1; k < world; ++k)
    dev::copy_block(a.w.symm_at(stage + me * a.count + lo, (me + k) % world), in + lo, (hi - lo) * sizeof(T));
  __syncthreads();  // the releases below cover the whole block's stores
  const int p = static_cast<int>(threadIdx.x);
  if (p < world && p != me) {
    const int b = blockIdx.x;
    dev::notify(a.w, a.flags + schedule::all_reduce_one_shot_flag(parity, me, b, world, blocks), p, e,
                dev::SignalOp::set, dev::Scope::sys);
    dev::wait_until(a.w, a.flags + schedule::all_reduce_one_shot_flag(parity, p, b, world, blocks), dev::Cmp::ge, e,
                    dev::Scope::sys, p);
  }
  __syncthreads();
  dev::reduce_span<T>(
      static_cast<T*>(a.output), [&](int q) { return q == me ? in : stage + q * a.count; }, world, lo, hi,
      threadIdx.x, blockDim.x);
  dev::epoch_end(a.epoch, e);
}

template <class T>
__global__ void __launch_bounds__(kThreads) two_shot_kernel(Args a) {
  const std::uint64_t e = dev::epoch_begin(a.epoch);
  const int me = a.w.rank, world = a.w.size;
  const std::uint64_t blocks = gridDim.x;
  std::uint64_t *ready = a.flags, *reduced = a.flags + world, *done = a.flags + 2 * world;
  const auto* in = static_cast<const T*>(a.input);
  auto* out = static_cast<T*>(a.output);
  const int p = static_cast<int>(threadIdx.x);
  if (blockIdx.x == 0) {
    dev::fence_sc(dev::Scope::sys);  // earlier writes to my input are visible system-wide
    if (p < world && p != me) dev::notify(a.w, ready + me, p, e, dev::SignalOp::set, dev::Scope::sys);
  }
  if (p < world && p != me) dev::wait_until(a.w, ready + p, dev::Cmp::ge, e, dev::Scope::sys, p);
  __syncthreads();

  // Reduce-scatter: I sum chunk `me` of every rank's input, in rank order.
  constexpr std::uint64_t kGrain = 16 / sizeof(T);
  const std::uint64_t chunk = schedule::slice_size(a.count, world, kGrain);
  auto chunk_range = [&](int q, std::uint64_t& lo, std::uint64_t& hi) {
    block_range(std::min(a.count, q * chunk), std::min(a.count, (q + 1) * chunk), kGrain, lo, hi);
  };
  std::uint64_t lo, hi;
  chunk_range(me, lo, hi);
  dev::reduce_span<T>(out, [&](int q) { return a.w.symm_at(in, q); }, world, lo, hi, threadIdx.x, blockDim.x);
  __syncthreads();
  if (p < world && p != me) dev::notify(a.w, reduced + me, p, 1, dev::SignalOp::add, dev::Scope::sys);

  // All-gather: read every other chunk from its owner's output.
  for (int k = 1; k < world; ++k) {
    const int q = (me + k) % world;
    if (threadIdx.x == 0) dev::wait_until(a.w, reduced + q, dev::Cmp::ge, e * blocks, dev::Scope::sys, q);
    __syncthreads();
    chunk_range(q, lo, hi);
    dev::copy_block(out + lo, a.w.symm_at(out + lo, q), (hi - lo) * sizeof(T));
  }
  __syncthreads();
  if (p < world && p != me) dev::notify(a.w, done + me, p, 1, dev::SignalOp::add, dev::Scope::sys);
  // Before this kernel ends, every peer has finished reading my input and output.
  if (blockIdx.x == 0 && p < world && p != me)
    dev::wait_until(a.w, done + p, dev::Cmp::ge, e * blocks, dev::Scope::sys, p);
  dev::epoch_end(a.epoch, e);
}

// Chosen from the 2 x H200 measurements in docs/PERF.md (docs/decisions/0008).
constexpr std::uint64_t kAutoLowLatencyMaxBytes = 512u << 10;
constexpr std::uint64_t kAutoOneShotMaxBytes = 4u << 20;
constexpr std::uint64_t kAutoTwoShotMaxBytes = 16u << 20;

}  // namespace

constexpr VariantName<AllReduceVariant> kAllReduceVariantNames[] = {
    {AllReduceVariant::automatic, "auto"},
    {AllReduceVariant::low_latency, "ll", "low_latency"},
    {AllReduceVariant::one_shot, "one_shot"},
    {AllReduceVariant::two_shot, "two_shot"},
    {AllReduceVariant::copy_engine, "ce", "copy_engine"},
    {AllReduceVariant::two_level, "two_level"},
};

const char* to_string(AllReduceVariant v) { return variant_name(kAllReduceVariantNames, v); }

AllReduceVariant parse_all_reduce_variant(const std::string& name) {
  return parse_variant(kAllReduceVariantNames, name, "all_reduce");
}

constexpr VariantName<AllReduceRailWay> kAllReduceRailWayNames[] = {
    {AllReduceRailWay::direct, "direct"},
    {AllReduceRailWay::halving_doubling, "halving_doubling"},
};

const char* to_string(AllReduceRailWay w) { return variant_name(kAllReduceRailWayNames, w); }

AllReduce::AllReduce(std::shared_ptr<Context> ctx, const AllReduceOptions& options)
    : ctx_(std::move(ctx)), count_(options.count), dtype_(options.dtype), variant_(options.variant) {
  WEFT_REQUIRE(ctx_, "AllReduce needs a Context");
  WEFT_REQUIRE(count_ > 0, "AllReduce: count must be positive (elements per rank)");
  WEFT_REQUIRE(options.max_sms >= 0, "AllReduce: max_sms = ", options.max_sms, " must be >= 0 (0: no cap)");
  WEFT_REQUIRE(options.rail_way == AllReduceRailWay::direct || options.rail_way == AllReduceRailWay::halving_doubling,
               "AllReduce: rail_way = ", static_cast<int>(options.rail_way),
               " is neither AllReduceRailWay::direct nor AllReduceRailWay::halving_doubling");
  // Across nodes (some peer without an address) automatic takes the two-level schedule (docs/decisions/0066).
  if (variant_ == AllReduceVariant::automatic && !ctx_->all_peers_direct()) variant_ = AllReduceVariant::two_level;
  if (variant_ == AllReduceVariant::two_level) {
    ctx_->verify_same_call(str("AllReduce plan: ", count_, " x ", to_string(dtype_), ", two_level, ",
                               to_string(options.rail_way), " rail, max_sms ", options.max_sms,
                               ops_detail::two_level_readiness()));
    const auto& table = ops_detail::two_level_or_refuse(*ctx_, "AllReduce");
    const hierarchy::RailWay asked = options.rail_way == AllReduceRailWay::halving_doubling
                                         ? hierarchy::RailWay::halving_doubling
                                         : hierarchy::RailWay::direct;
    const hierarchy::RailWay way = hierarchy::ar_rail_way(ops_detail::two_level_grid(*ctx_, "AllReduce").nodes, asked);
    if (way == hierarchy::RailWay::halving_doubling) rail_way_ = AllReduceRailWay::halving_doubling;
    two_level_ = table.all_reduce(*ctx_, count_, dtype_, options.max_sms, way);
    blocks_ = two_level_->blocks();
    return;
  }
  // The one-node kernels load and store every peer's heap.
  ctx_->require_direct_peers(str("AllReduce (variant ", to_string(variant_), ")"),
                             ops_detail::two_level_remedy("AllReduce"));
  const std::uint64_t bytes = this->bytes();
  if (variant_ == AllReduceVariant::automatic)
    variant_ = bytes <= kAutoLowLatencyMaxBytes ? AllReduceVariant::low_latency
               : bytes <= kAutoOneShotMaxBytes  ? AllReduceVariant::one_shot
               : bytes <= kAutoTwoShotMaxBytes  ? AllReduceVariant::two_shot
                                                : AllReduceVariant::copy_engine;
  WEFT_REQUIRE(variant_ != AllReduceVariant::low_latency || bytes <= kAllReduceLowLatencyMaxBytes,
               "AllReduce (ll): ", bytes, " bytes per rank exceeds its limit of ", kAllReduceLowLatencyMaxBytes,
               " (LL doubles the bytes it sends); use one_shot or two_shot");
  WEFT_REQUIRE(variant_ != AllReduceVariant::one_shot || bytes <= kAllReduceOneShotMaxBytes,
               "AllReduce (one_shot): ", bytes, " bytes per rank exceeds its limit of ", kAllReduceOneShotMaxBytes,
               " (its staging holds 2 x world x the message); use two_shot");
  ctx_->verify_same_call(str("AllReduce plan: ", count_, " x ", to_string(dtype_), ", ", to_string(variant_),
                             ", max_sms ", options.max_sms));

  const int world = ctx_->world_size(), sms = ctx_->team().sm_count;
  const auto w64 = static_cast<std::uint64_t>(world);
  switch (variant_) {
    case AllReduceVariant::low_latency:
      blocks_ = ll_blocks((bytes + 3) / 4, sms, options.max_sms);
      staging_ = SymmetricBuffer(ctx_->heap(), 2 * w64 * ((bytes + 3) / 4) * 8, "u64", "all_reduce.ll.staging");
      signals_ = SignalArray(ctx_->heap(), 1, "all_reduce.ll.unused");
      break;
    case AllReduceVariant::one_shot:
      blocks_ = bulk_blocks(bytes, 32u << 10, sms, options.max_sms);
      staging_ = SymmetricBuffer(ctx_->heap(), 2 * w64 * bytes, to_string(dtype_), "all_reduce.one_shot.staging");
      signals_ = SignalArray(ctx_->heap(), schedule::all_reduce_one_shot_flags(world, blocks_),
                             "all_reduce.one_shot.flags");
      break;
    case AllReduceVariant::copy_engine: {
      constexpr std::uint64_t kGrain = 16;  // slices start on 16-byte boundaries
      const std::uint64_t per = kGrain / dtype_size(dtype_);
      const std::uint64_t slice = schedule::slice_size(count_, world, per);
      ce_ = std::make_unique<ops_detail::CopyEngineReduction>(*ctx_, count_, slice, dtype_, true, "all_reduce.ce");
      blocks_ = ce_->sms();
      break;
    }
    default:
      blocks_ = bulk_blocks(bytes / w64, 64u << 10, sms, options.max_sms);
      signals_ = SignalArray(ctx_->heap(), 3 * w64, "all_reduce.two_shot.flags");
      break;
  }
}

AllReduce::~AllReduce() = default;  // here, where CopyEngineReduction is complete

void AllReduce::run(const void* input, void* output, cudaStream_t stream) {
  WEFT_REQUIRE(input && output, "AllReduce::run: input and output must be device pointers (got ", input, ", ",
               output, ")");
  const std::uint64_t bytes = this->bytes();
  if (variant_ == AllReduceVariant::two_shot) {
    WEFT_REQUIRE(ctx_->heap().contains(input, bytes), "AllReduce (two_shot): the input (", input, ", ", bytes,
                 " bytes) must lie in one symmetric-heap allocation, since peers read it; allocate it with "
                 "ctx->heap().alloc(...), or use variant one_shot / ll");
    WEFT_REQUIRE(ctx_->heap().contains(output, bytes), "AllReduce (two_shot): the output (", output, ", ", bytes,
                 " bytes) must lie in one symmetric-heap allocation, since peers read it");
  }
  if (variant_ == AllReduceVariant::copy_engine)
    WEFT_REQUIRE(ctx_->heap().contains(output, bytes), "AllReduce (ce): the output (", output, ", ", bytes,
                 " bytes) must lie in one symmetric-heap allocation, since peers write into it");
  if (ctx_->check_calls())
    ctx_->verify_same_call(str("AllReduce run #", ++runs_, ": ", count_, " x ", to_string(dtype_), ", ",
                               to_string(variant_)));
  if (variant_ == AllReduceVariant::copy_engine) return ce_->run(input, output, stream);
  if (two_level_) return two_level_->run(input, output, stream);
  Args a{ctx_->world(), input, output, count_, signals_.flags(), staging_.get(), signals_.launch_epoch()};
  dispatch(dtype_, [&](auto t) {
    using T = decltype(t);
    switch (variant_) {
      case AllReduceVariant::low_latency: launch_pdl(ll_kernel<T>, blocks_, kThreads, stream, a); break;
      case AllReduceVariant::one_shot: launch_pdl(one_shot_kernel<T>, blocks_, kThreads, stream, a); break;
      default: launch_pdl(two_shot_kernel<T>, blocks_, kThreads, stream, a); break;
    }
  });
  WEFT_CUDA(cudaGetLastError());
}

}  // namespace weft
