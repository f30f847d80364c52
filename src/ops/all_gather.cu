// AllGather: the plan (host) and its one-node SM kernels (push, pull, ll, ring).
// The copy-engine variant is host code: copies ordered by one-thread signal kernels.
// The two-level variant's kernel is weft::internode's (two_level.hpp).
//
// Flags (one SignalArray of 2W): for rank r, slot [p] is written by peer p and
// slot [W + p] too; values are epochs (set) or epoch x blocks (add).
//   push: ready[p]   = e        "p's output may be overwritten for epoch e"
//         arrived[p] += 1/block "a block of p has stored its slice of p's shard here"
//   pull: ready[p]   = e        "p's input holds epoch e's data"
//         done[p]    += 1/block "a block of p has finished reading my input"
#include <algorithm>

#include "ce_signals.hpp"
#include "kernel_util.cuh"
#include "two_level.hpp"
#include "weft/core/env.hpp"
#include "weft/core/error.hpp"
#include "weft/device.cuh"
#include "weft/ops/all_gather.hpp"

namespace weft {
namespace {

using namespace ops_detail;
constexpr std::uint64_t kAutoLowLatencyMaxBytes = 1u << 20;
constexpr std::uint64_t kAutoCopyEngineMinBytes = 32u << 20;

struct Args {
  dev::World w;
  const char* input;
  char* output;
  std::uint64_t bytes;
  std::uint64_t* ready;    // [W]
  std::uint64_t* counted;  // [W] arrived (push) or done (pull)
  dev::LaunchEpoch epoch;
  bool in_place;           // input is this rank's slot of output (pull reads peers' slots then)
  std::uint64_t* staging;  // ll: [2][W][words] lines
};

// This block's slice [lo, hi) of a shard, 16-byte aligned so copies vectorise.
__device__ void block_slice(std::uint64_t bytes, std::uint64_t& lo, std::uint64_t& hi) {
  block_range(0, bytes, 16, lo, hi);
}

// Block 0's threads wait, one peer each, until every peer's blocks have counted in.
__device__ void wait_counts(const Args& a, std::uint64_t target) {
  if (blockIdx.x != 0) return;
  for (int p = static_cast<int>(threadIdx.x); p < a.w.size; p += blockDim.x)
    if (p != a.w.rank) dev::wait_until(a.w, a.counted + p, dev::Cmp::ge, target, dev::Scope::sys, p);
}

__global__ void __launch_bounds__(kThreads) push_kernel(Args a) {
  const std::uint64_t e = dev::epoch_begin(a.epoch);
  const int me = a.w.rank, world = a.w.size;
  if (blockIdx.x == 0)  // my output is free: peers may write epoch e into it
    for (int p = static_cast<int>(threadIdx.x); p < world; p += blockDim.x)
      if (p != me) dev::notify(a.w, a.ready + me, p, e, dev::SignalOp::set, dev::Scope::sys);

  std::uint64_t lo, hi;
  block_slice(a.bytes, lo, hi);
  char* mine = a.output + me * a.bytes;
  if (a.input != mine) dev::copy_block(mine + lo, a.input + lo, hi - lo);
  for (int i = 1; i < world; ++i) {
    const int p = (me + i) % world;  // rank-rotated: no two ranks hit the same peer first
    if (threadIdx.x == 0) dev::wait_until(a.w, a.ready + p, dev::Cmp::ge, e, dev::Scope::sys, p);
    __syncthreads();
    dev::copy_block(a.w.symm_at(mine + lo, p), a.input + lo, hi - lo);
    __syncthreads();  // the release below covers every thread's stores (cumulativity)
    if (threadIdx.x == 0) dev::notify(a.w, a.counted + me, p, 1, dev::SignalOp::add, dev::Scope::sys);
  }
  wait_counts(a, e * gridDim.x);
  dev::epoch_end(a.epoch, e);
}

__global__ void __launch_bounds__(kThreads) pull_kernel(Args a) {
  const std::uint64_t e = dev::epoch_begin(a.epoch);
  const int me = a.w.rank, world = a.w.size;
  if (blockIdx.x == 0) {  // my input holds epoch e's data: peers may read it
    dev::fence_sc(dev::Scope::sys);
    for (int p = static_cast<int>(threadIdx.x); p < world; p += blockDim.x)
      if (p != me) dev::notify(a.w, a.ready + me, p, e, dev::SignalOp::set, dev::Scope::sys);
  }
  std::uint64_t lo, hi;
  block_slice(a.bytes, lo, hi);
  char* mine = a.output + me * a.bytes;
  if (a.input != mine) dev::copy_block(mine + lo, a.input + lo, hi - lo);
  for (int i = 1; i < world; ++i) {
    const int p = (me + world - i) % world;
    if (threadIdx.x == 0) dev::wait_until(a.w, a.ready + p, dev::Cmp::ge, e, dev::Scope::sys, p);
    __syncthreads();
    const char* theirs = a.in_place ? a.output + p * a.bytes : a.input;  // p's input, at p's offset
    dev::copy_block(a.output + p * a.bytes + lo, a.w.symm_at(theirs + lo, p), hi - lo);
    __syncthreads();  // every thread's loads of p's input are done before p hears so
    if (threadIdx.x == 0) dev::notify(a.w, a.counted + me, p, 1, dev::SignalOp::add, dev::Scope::sys);
  }
  wait_counts(a, e * gridDim.x);  // peers finished reading my input: the caller may overwrite it
  dev::epoch_end(a.epoch, e);
}

// LL: every thread sends its words (payload + epoch flag, one store per line)
// to every peer's staging, then collects the peers' words from its own staging.
// Staging is double-buffered by epoch parity: a rank that runs epoch e + 2 has
// finished e + 1, so every peer has finished reading e's lines (stream order).
__global__ void __launch_bounds__(kThreads) ll_kernel(Args a) {
  const std::uint64_t e = dev::epoch_begin(a.epoch);
  const auto flag = static_cast<std::uint32_t>(e);
  const int me = a.w.rank, world = a.w.size;
  const std::uint64_t words = (a.bytes + 3) / 4;
  std::uint64_t* stage = a.staging + (e & 1) * world * words;
  const std::uint64_t first = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x;
  const std::uint64_t stride = std::uint64_t{gridDim.x} * blockDim.x;
  char* mine = a.output + me * a.bytes;
  for (std::uint64_t i = first; i < words; i += stride) {
    const std::uint32_t v = load_word(a.input, a.bytes, i);
    for (int k = 1; k < world; ++k)
      dev::ll_store(a.w.symm_at(stage + me * words + i, (me + k) % world), v, flag);
    if (!a.in_place) store_word(mine, a.bytes, i, v);
  }
  for (int k = 1; k < world; ++k) {
    const int p = (me + world - k) % world;
    for (std::uint64_t i = first; i < words; i += stride)
      store_word(a.output + p * a.bytes, a.bytes, i, dev::ll_wait(a.w, stage + p * words + i, flag, p));
  }
  dev::epoch_end(a.epoch, e);
}


// Ring: at step s a rank forwards shard (me - s + 1) to the next rank: its own
// at s = 1, else the one that arrived from the previous rank at step s - 1.
// The next rank's "ready" (its output is free for epoch e) gates the first store.
__global__ void __launch_bounds__(kThreads) ring_kernel(Args a) {
  const std::uint64_t e = dev::epoch_begin(a.epoch);
  const int me = a.w.rank, world = a.w.size, next = (me + 1) % world, prev = (me + world - 1) % world;
  const int steps = world - 1, blocks = gridDim.x;
  std::uint64_t* arrived = a.counted + world;  // [steps][blocks], after the [W] counters
  if (blockIdx.x == 0 && threadIdx.x == 0 && world > 1)
    dev::notify(a.w, a.ready + me, prev, e, dev::SignalOp::set, dev::Scope::sys);
  std::uint64_t lo, hi;
  block_slice(a.bytes, lo, hi);
  char* mine = a.output + me * a.bytes;
  if (a.input != mine) dev::copy_block(mine + lo, a.input + lo, hi - lo);
  if (world == 1) {
    dev::epoch_end(a.epoch, e);
    return;
  }
  if (threadIdx.x == 0) dev::wait_until(a.w, a.ready + next, dev::Cmp::ge, e, dev::Scope::sys, next);
  __syncthreads();
  for (int s = 1; s <= steps; ++s) {
    const int c = schedule::ring_all_gather_shard(me, s, world);
    if (s > 1) {
      if (threadIdx.x == 0)
        dev::wait_until(a.w, arrived + (s - 2) * blocks + blockIdx.x, dev::Cmp::ge, e, dev::Scope::sys, prev);
      __syncthreads();
    }
    const char* src = s == 1 ? a.input : a.output + c * a.bytes;
    dev::copy_block(a.w.symm_at(a.output + c * a.bytes + lo, next), src + lo, hi - lo);
    __syncthreads();
    if (threadIdx.x == 0)
      dev::notify(a.w, arrived + (s - 1) * blocks + blockIdx.x, next, e, dev::SignalOp::set, dev::Scope::sys);
  }
  if (threadIdx.x == 0)
    dev::wait_until(a.w, arrived + (steps - 1) * blocks + blockIdx.x, dev::Cmp::ge, e, dev::Scope::sys, prev);
  dev::epoch_end(a.epoch, e);
}

}  // namespace

constexpr VariantName<AllGatherVariant> kAllGatherVariantNames[] = {
    {AllGatherVariant::automatic, "auto"},
    {AllGatherVariant::push, "push"},
    {AllGatherVariant::pull, "pull"},
    {AllGatherVariant::copy_engine, "ce", "copy_engine"},
    {AllGatherVariant::low_latency, "ll", "low_latency"},
    {AllGatherVariant::ring, "ring"},
    {AllGatherVariant::two_level, "two_level"},
};

const char* to_string(AllGatherVariant v) { return variant_name(kAllGatherVariantNames, v); }

AllGatherVariant parse_all_gather_variant(const std::string& name) {
  return parse_variant(kAllGatherVariantNames, name, "all_gather");
}

AllGather::AllGather(std::shared_ptr<Context> ctx, const AllGatherOptions& options)
    : ctx_(std::move(ctx)), bytes_(options.bytes_per_rank), variant_(options.variant) {
  WEFT_REQUIRE(ctx_, "AllGather needs a Context");
  WEFT_REQUIRE(bytes_ > 0, "AllGather: bytes_per_rank must be positive");
  WEFT_REQUIRE(options.max_sms >= 0, "AllGather: max_sms = ", options.max_sms, " must be >= 0 (0: no cap)");
  // Across nodes (some peer without an address) automatic takes the two-level schedule (docs/decisions/0066).
  if (variant_ == AllGatherVariant::automatic && !ctx_->all_peers_direct()) variant_ = AllGatherVariant::two_level;
  if (variant_ == AllGatherVariant::two_level) {
    ctx_->verify_same_call(str("AllGather plan: ", bytes_, " bytes per rank, two_level, max_sms ", options.max_sms,
                               ops_detail::two_level_readiness()));
    two_level_ = ops_detail::two_level_or_refuse(*ctx_, "AllGather").all_gather(*ctx_, bytes_, options.max_sms);
    blocks_ = two_level_->blocks();
    return;
  }
  // The one-node kernels load and store every peer's heap.
  ctx_->require_direct_peers(str("AllGather (variant ", to_string(variant_), ")"),
                             ops_detail::two_level_remedy("AllGather"));
  // Chosen from the 2 x H200 measurements in docs/PERF.md (docs/decisions/0008): LL up to 1 MB, SM
  // push in the middle, the copy engines (no SMs) from 32 MB.
  if (variant_ == AllGatherVariant::automatic)
    variant_ = bytes_ <= kAutoLowLatencyMaxBytes ? AllGatherVariant::low_latency
               : bytes_ < kAutoCopyEngineMinBytes ? AllGatherVariant::push
                                                  : AllGatherVariant::copy_engine;
  WEFT_REQUIRE(variant_ != AllGatherVariant::low_latency || bytes_ <= kAllGatherLowLatencyMaxBytes,
               "AllGather (ll): bytes_per_rank = ", bytes_, " exceeds the low-latency limit of ",
               kAllGatherLowLatencyMaxBytes, " bytes (LL doubles the bytes it sends); use push or ce");
  const int sms = ctx_->team().sm_count;
  blocks_ = variant_ == AllGatherVariant::low_latency ? ll_blocks((bytes_ + 3) / 4, sms, options.max_sms)
                                                      : bulk_blocks(bytes_, 32u << 10, sms, options.max_sms);
  ctx_->verify_same_call(str("AllGather plan: ", bytes_, " bytes per rank, ", to_string(variant_), ", max_sms ",
                             options.max_sms));
  const int world = ctx_->world_size();
  if (variant_ == AllGatherVariant::low_latency)
    staging_ = SymmetricBuffer(ctx_->heap(), 2 * static_cast<std::uint64_t>(world) * ((bytes_ + 3) / 4) * 8, "u64",
                               "all_gather.ll.staging");
  signals_ = SignalArray(ctx_->heap(), schedule::all_gather_flags(world, blocks_),
                         str("all_gather.", to_string(variant_), ".flags"));
  if (variant_ == AllGatherVariant::copy_engine) {
    side_streams_.resize(world);
    side_events_.resize(world);
  }
}

AllGather::~AllGather() = default;

void AllGather::validate(const void* input, const void* output) const {
  const std::uint64_t total = bytes_ * ctx_->world_size();
  WEFT_REQUIRE(input && output, "AllGather::run: input and output must be device pointers (got ", input, ", ",
               output, ")");
  SymmetricHeap& heap = ctx_->heap();
  if (variant_ == AllGatherVariant::low_latency) return;  // stages through its own symmetric buffer
  if (variant_ == AllGatherVariant::pull) {
    WEFT_REQUIRE(heap.contains(input, bytes_), "AllGather (pull): the input (", input, ", ", bytes_,
                 " bytes) must lie in one symmetric-heap allocation, since peers read it; allocate it with "
                 "ctx->heap().alloc(...)");
  } else {
    WEFT_REQUIRE(heap.contains(output, total), "AllGather (", to_string(variant_), "): the output (", output, ", ",
                 total, " bytes = world ", ctx_->world_size(), " x ", bytes_,
                 ") must lie in one symmetric-heap allocation, since peers write into it; allocate it with "
                 "ctx->heap().alloc(...)");
  }
}

void AllGather::run(const void* input, void* output, cudaStream_t stream) {
  validate(input, output);
  if (ctx_->check_calls())
    ctx_->verify_same_call(str("AllGather run #", ++runs_, ": ", bytes_, " bytes per rank, ", to_string(variant_)));
  if (variant_ == AllGatherVariant::copy_engine) return run_copy_engine(input, output, stream);
  if (two_level_) return two_level_->run(input, output, stream);
  const int world = ctx_->world_size();
  auto* out = static_cast<char*>(output);
  Args a{ctx_->world(),           static_cast<const char*>(input), out, bytes_, signals_.flags(),
         signals_.flags() + world, signals_.launch_epoch(), input == out + ctx_->rank() * bytes_,
         staging_.as<std::uint64_t>()};
  switch (variant_) {
    case AllGatherVariant::push: launch_pdl(push_kernel, blocks_, kThreads, stream, a); break;
    case AllGatherVariant::pull: launch_pdl(pull_kernel, blocks_, kThreads, stream, a); break;
    case AllGatherVariant::ring: launch_pdl(ring_kernel, blocks_, kThreads, stream, a); break;
    default: launch_pdl(ll_kernel, blocks_, kThreads, stream, a); break;
  }
  WEFT_CUDA(cudaGetLastError());
}

void AllGather::run_copy_engine(const void* input, void* output, cudaStream_t stream) {
  const dev::World& w = ctx_->world();
  const int me = ctx_->rank(), world = ctx_->world_size();
  SymmetricHeap& heap = ctx_->heap();
  const dev::LaunchEpoch epoch = signals_.launch_epoch();
  std::uint64_t* ready = signals_.flags();
  std::uint64_t* arrived = ready + world;
  char* mine = static_cast<char*>(output) + me * bytes_;

  // A new epoch; my output is free for it.
  ops_detail::ce_begin(epoch, stream);
  ops_detail::ce_signal_peers(w, ready + me, epoch, stream);
  WEFT_CUDA(cudaEventRecord(fork_event_, stream));
  // One side stream per peer, so the copy engines serve all peers at once.
  for (int i = 1; i < world; ++i) {
    const int p = (me + i) % world;
    cudaStream_t s = side_streams_[p];
    WEFT_CUDA(cudaStreamWaitEvent(s, fork_event_));
    ops_detail::ce_wait(w, ready, 1, p, epoch, s);
    WEFT_CUDA(cudaMemcpyAsync(heap.peer_ptr(mine, p), input, bytes_, cudaMemcpyDeviceToDevice, s));
    ops_detail::ce_signal(w, arrived + me, p, epoch, s);
    WEFT_CUDA(cudaEventRecord(side_events_[p], s));
  }
  if (input != mine) WEFT_CUDA(cudaMemcpyAsync(mine, input, bytes_, cudaMemcpyDeviceToDevice, stream));
  for (int p = 0; p < world; ++p)
    if (p != me) WEFT_CUDA(cudaStreamWaitEvent(stream, side_events_[p]));
  ops_detail::ce_wait(w, arrived, 1, -1, epoch, stream);
}

}  // namespace weft
