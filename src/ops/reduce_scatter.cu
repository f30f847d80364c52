// ReduceScatter on one node: the plan, its SM kernels (ll, mesh, ring) and the
// copy-engine path (ce_reduction.hpp).
//
// Flags (one SignalArray):
//   mesh: ready[W] (set e: "my input is complete"), done[W] (+1 per block:
//         "I have read my slice of your input").
//   ring: [2 parities][W - 1 steps][B blocks], set to e when the previous rank's
//         block has stored that step's partial sums here.
//   copy_engine: see ce_reduction.hpp.
#include "ce_reduction.hpp"
#include "kernel_util.cuh"
#include "two_level.hpp"
#include "weft/device.cuh"
#include "weft/ops/reduce_scatter.hpp"

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
  const char* in = static_cast<const char*>(a.input);
  auto* stage = static_cast<std::uint64_t*>(a.staging) + (e & 1) * world * words;  // [W senders][words]
  const std::uint64_t first = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x;
  const std::uint64_t stride = std::uint64_t{gridDim.x} * blockDim.x;
  for (std::uint64_t i = first; i < words; i += stride)
    for (int k = 1; k < world; ++k) {
      const int p = (me + k) % world;  // slice p goes to rank p
      dev::ll_store(a.w.symm_at(stage + me * words + i, p), load_word(in + p * bytes, bytes, i), flag);
    }
  for (std::uint64_t i = first; i < words; i += stride) {
    dev::Acc<T, 4> acc;
    for (int q = 0; q < world; ++q) {
      const std::uint32_t v =
          q == me ? load_word(in + me * bytes, bytes, i) : dev::ll_wait(a.w, stage + q * words + i, flag, q);
      q == 0 ? acc.set(v) : acc.add(v);
    }
    store_word(a.output, bytes, i, acc.template pack<std::uint32_t>());
  }
  dev::epoch_end(a.epoch, e);
}

template <class T>
__global__ void __launch_bounds__(kThreads) mesh_kernel(Args a) {
  const std::uint64_t e = dev::epoch_begin(a.epoch);
  const int me = a.w.rank, world = a.w.size;
  std::uint64_t *ready = a.flags, *done = a.flags + world;
  const auto* in = static_cast<const T*>(a.input);
  const int p = static_cast<int>(threadIdx.x);
  if (blockIdx.x == 0) {
    dev::fence_sc(dev::Scope::sys);
    if (p < world && p != me) dev::notify(a.w, ready + me, p, e, dev::SignalOp::set, dev::Scope::sys);
  }
  if (p < world && p != me) dev::wait_until(a.w, ready + p, dev::Cmp::ge, e, dev::Scope::sys, p);
  __syncthreads();
  std::uint64_t lo, hi;
  block_range(0, a.count, 16 / sizeof(T), lo, hi);
  const T* my_slice = in + me * a.count;
  dev::reduce_span<T>(static_cast<T*>(a.output), [&](int q) { return a.w.symm_at(my_slice, q); }, world, lo, hi,
                      threadIdx.x, blockDim.x);
  __syncthreads();
  if (p < world && p != me) dev::notify(a.w, done + me, p, 1, dev::SignalOp::add, dev::Scope::sys);
  if (blockIdx.x == 0 && p < world && p != me)  // peers are done with my input before I return
    dev::wait_until(a.w, done + p, dev::Cmp::ge, e * gridDim.x, dev::Scope::sys, p);
  dev::epoch_end(a.epoch, e);
}

template <class T>
__global__ void __launch_bounds__(kThreads) ring_kernel(Args a) {
  const std::uint64_t e = dev::epoch_begin(a.epoch);
  const int me = a.w.rank, world = a.w.size, next = (me + 1) % world, prev = (me + world - 1) % world;
  const int steps = world - 1, blocks = gridDim.x;
  const auto* in = static_cast<const T*>(a.input);
  auto* stage = static_cast<T*>(a.staging) + (e & 1) * steps * a.count;     // [steps][count]
  const int parity = static_cast<int>(e & 1);
  auto flag = [&](int s) { return a.flags + schedule::reduce_scatter_ring_flag(parity, s, blockIdx.x, world, blocks); };
  std::uint64_t lo, hi;
  block_range(0, a.count, 16 / sizeof(T), lo, hi);
  // Step s sends slice (me - s) to the next rank: my input alone at s = 1, else
  // the partial that arrived at step s - 1 plus my input.
  for (int s = 1; s <= steps; ++s) {
    const int c = schedule::ring_reduce_scatter_slice(me, s, world);
    const T* mine = in + c * a.count;
    const T* got = s > 1 ? stage + (s - 2) * a.count : nullptr;
    if (s > 1) {
      if (threadIdx.x == 0)
        dev::wait_until(a.w, flag(s - 1), dev::Cmp::ge, e, dev::Scope::sys, prev);
      __syncthreads();
    }
    T* dst = a.w.symm_at(stage + (s - 1) * a.count, next);
    if (s == 1) dev::copy_block(dst + lo, mine + lo, (hi - lo) * sizeof(T));
    else dev::reduce_span<T>(dst, [&](int q) { return q == 0 ? got : mine; }, 2, lo, hi, threadIdx.x, blockDim.x);
    __syncthreads();
    if (threadIdx.x == 0)
      dev::notify(a.w, flag(s), next, e, dev::SignalOp::set, dev::Scope::sys);
  }
  if (threadIdx.x == 0)
    dev::wait_until(a.w, flag(steps), dev::Cmp::ge, e, dev::Scope::sys, prev);
  __syncthreads();
  const T* got = stage + (steps - 1) * a.count;
  const T* mine = in + me * a.count;
  dev::reduce_span<T>(static_cast<T*>(a.output), [&](int q) { return q == 0 ? got : mine; }, 2, lo, hi,
                      threadIdx.x, blockDim.x);
  dev::epoch_end(a.epoch, e);
}

// Chosen from the 2 x H200 measurements in docs/PERF.md (output bytes per rank; docs/decisions/0008).
constexpr std::uint64_t kAutoLowLatencyMaxBytes = 512u << 10;
constexpr std::uint64_t kAutoRingMaxBytes = 8u << 20;

}  // namespace

constexpr VariantName<ReduceScatterVariant> kReduceScatterVariantNames[] = {
    {ReduceScatterVariant::automatic, "auto"},
    {ReduceScatterVariant::low_latency, "ll", "low_latency"},
    {ReduceScatterVariant::mesh, "mesh"},
    {ReduceScatterVariant::ring, "ring"},
    {ReduceScatterVariant::copy_engine, "ce", "copy_engine"},
    {ReduceScatterVariant::two_level, "two_level"},
};

const char* to_string(ReduceScatterVariant v) { return variant_name(kReduceScatterVariantNames, v); }

ReduceScatterVariant parse_reduce_scatter_variant(const std::string& name) {
  return parse_variant(kReduceScatterVariantNames, name, "reduce_scatter");
}

ReduceScatter::ReduceScatter(std::shared_ptr<Context> ctx, const ReduceScatterOptions& options)
    : ctx_(std::move(ctx)), count_(options.count), dtype_(options.dtype), variant_(options.variant) {
  WEFT_REQUIRE(ctx_, "ReduceScatter needs a Context");
  WEFT_REQUIRE(count_ > 0, "ReduceScatter: count must be positive (output elements per rank)");
  WEFT_REQUIRE(options.max_sms >= 0, "ReduceScatter: max_sms = ", options.max_sms, " must be >= 0 (0: no cap)");
  // Across nodes (some peer without an address) automatic takes the two-level schedule (docs/decisions/0066).
  if (variant_ == ReduceScatterVariant::automatic && !ctx_->all_peers_direct())
    variant_ = ReduceScatterVariant::two_level;
  if (variant_ == ReduceScatterVariant::two_level) {
    ctx_->verify_same_call(str("ReduceScatter plan: ", count_, " x ", to_string(dtype_), " per rank, two_level, max_sms ",
                               options.max_sms, ops_detail::two_level_readiness()));
    two_level_ = ops_detail::two_level_or_refuse(*ctx_, "ReduceScatter")
                     .reduce_scatter(*ctx_, count_, dtype_, options.max_sms);
    blocks_ = two_level_->blocks();
    return;
  }
  // The one-node kernels load and store every peer's heap.
  ctx_->require_direct_peers(str("ReduceScatter (variant ", to_string(variant_), ")"),
                             ops_detail::two_level_remedy("ReduceScatter"));
  const std::uint64_t bytes = count_ * dtype_size(dtype_);
  const int world = ctx_->world_size(), sms = ctx_->team().sm_count;
  const auto w64 = static_cast<std::uint64_t>(world);
  if (variant_ == ReduceScatterVariant::automatic)
    variant_ = bytes <= kAutoLowLatencyMaxBytes ? ReduceScatterVariant::low_latency
               : bytes <= kAutoRingMaxBytes     ? ReduceScatterVariant::ring
                                                : ReduceScatterVariant::copy_engine;
  WEFT_REQUIRE(variant_ != ReduceScatterVariant::low_latency || bytes <= kReduceScatterLowLatencyMaxBytes,
               "ReduceScatter (ll): ", bytes, " bytes per rank exceeds its limit of ",
               kReduceScatterLowLatencyMaxBytes, "; use mesh, ring or ce");
  ctx_->verify_same_call(str("ReduceScatter plan: ", count_, " x ", to_string(dtype_), " per rank, ",
                             to_string(variant_), ", max_sms ", options.max_sms));
  switch (variant_) {
    case ReduceScatterVariant::low_latency:
      blocks_ = ll_blocks((bytes + 3) / 4, sms, options.max_sms);
      staging_ = SymmetricBuffer(ctx_->heap(), 2 * w64 * ((bytes + 3) / 4) * 8, "u64", "reduce_scatter.ll.staging");
      signals_ = SignalArray(ctx_->heap(), 1, "reduce_scatter.ll.unused");
      break;
    case ReduceScatterVariant::mesh:
      blocks_ = bulk_blocks(bytes, 32u << 10, sms, options.max_sms);
      signals_ = SignalArray(ctx_->heap(), 2 * w64, "reduce_scatter.mesh.flags");
      break;
    case ReduceScatterVariant::ring:
      blocks_ = bulk_blocks(bytes, 32u << 10, sms, options.max_sms);
      staging_ = SymmetricBuffer(ctx_->heap(), 2 * (w64 - 1) * bytes + 16, to_string(dtype_),
                                 "reduce_scatter.ring.staging");
      signals_ = SignalArray(ctx_->heap(), schedule::reduce_scatter_ring_flags(world, blocks_),
                             "reduce_scatter.ring.flags");
      break;
    default:
      ce_ = std::make_unique<ops_detail::CopyEngineReduction>(*ctx_, w64 * count_, count_, dtype_, false,
                                                              "reduce_scatter.ce");
      blocks_ = ce_->sms();
      break;
  }
}

ReduceScatter::~ReduceScatter() = default;

void ReduceScatter::run(const void* input, void* output, cudaStream_t stream) {
  WEFT_REQUIRE(input && output, "ReduceScatter::run: input and output must be device pointers (got ", input, ", ",
               output, ")");
  const std::uint64_t bytes = count_ * dtype_size(dtype_);
  const int world = ctx_->world_size();
  if (variant_ == ReduceScatterVariant::mesh)
    WEFT_REQUIRE(ctx_->heap().contains(input, bytes * world), "ReduceScatter (", to_string(variant_),
                 "): the input (", input, ", ", bytes * world, " bytes = world ", world, " x ", bytes,
                 ") must lie in one symmetric-heap allocation, since peers read it; allocate it with "
                 "ctx->heap().alloc(...), or use variant ll, ring or ce");
  if (ctx_->check_calls())
    ctx_->verify_same_call(str("ReduceScatter run #", ++runs_, ": ", count_, " x ", to_string(dtype_), ", ",
                               to_string(variant_)));
  if (two_level_) return two_level_->run(input, output, stream);
  if (world == 1) {  // nothing to reduce with
    if (input != output) WEFT_CUDA(cudaMemcpyAsync(output, input, bytes, cudaMemcpyDeviceToDevice, stream));
    return;
  }
  if (variant_ == ReduceScatterVariant::copy_engine) return run_copy_engine(input, output, stream);
  Args a{ctx_->world(), input, output, count_, signals_.flags(), staging_.get(), signals_.launch_epoch()};
  dispatch(dtype_, [&](auto t) {
    using T = decltype(t);
    switch (variant_) {
      case ReduceScatterVariant::low_latency: launch_pdl(ll_kernel<T>, blocks_, kThreads, stream, a); break;
      case ReduceScatterVariant::mesh: launch_pdl(mesh_kernel<T>, blocks_, kThreads, stream, a); break;
      default: launch_pdl(ring_kernel<T>, blocks_, kThreads, stream, a); break;
    }
  });
  WEFT_CUDA(cudaGetLastError());
}

void ReduceScatter::run_copy_engine(const void* input, void* output, cudaStream_t stream) {
  ce_->run(input, output, stream);
}

}  // namespace weft
