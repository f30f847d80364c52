#include "ce_reduction.hpp"

#include "ce_signals.hpp"
#include "kernel_util.cuh"
#include "weft/device.cuh"

namespace weft::ops_detail {
namespace {

constexpr std::uint64_t kMinChunkBytes = 16u << 20;

template <class T>
__global__ void __launch_bounds__(kThreads) sum_chunk_kernel(const T* mine, const T* scratch, std::uint64_t slice,
                                                             T* out, std::uint64_t begin, std::uint64_t end, int me,
                                                             int world) {
  std::uint64_t lo, hi;
  block_range(begin, end, 16 / sizeof(T), lo, hi);
  dev::reduce_span<T>(out, [&](int q) { return q == me ? mine : scratch + q * slice; }, world, lo, hi, threadIdx.x,
                      blockDim.x);
}

}  // namespace

CopyEngineReduction::CopyEngineReduction(Context& ctx, std::uint64_t total, std::uint64_t slice, DType dtype,
                                         bool gather, const std::string& name)
    : ctx_(ctx), total_(total), slice_(slice), dtype_(dtype), gather_(gather) {
  const int world = ctx.world_size();
  const std::uint64_t slice_bytes = slice * dtype_size(dtype);
  // Chunks of at least 16 MB and at most 4 of them: measured on 2 x H200 at
  // 32 MB - 1 GB (docs/decisions/0010), more and smaller chunks cost more in per-copy
  // overhead than they gain in overlap. WEFT_CE_CHUNK fixes the size, for tuning.
  const std::uint64_t chunk_bytes = ctx.settings().ce_chunk;
  chunks_ = chunk_bytes ? static_cast<int>(std::clamp<std::uint64_t>(slice_bytes / chunk_bytes, 1, 16))
                        : static_cast<int>(std::clamp<std::uint64_t>(slice_bytes / kMinChunkBytes, 1, 4));
  sum_blocks_ = static_cast<int>(std::clamp<std::uint64_t>(slice_bytes / chunks_ / (64u << 10), 1,
                                                           static_cast<std::uint64_t>(ctx.team().sm_count)));
  const auto w64 = static_cast<std::uint64_t>(world);
  flags_ = SignalArray(ctx.heap(), w64 + 2 * w64 * chunks_, name + ".flags");
  scratch_ = SymmetricBuffer(ctx.heap(), w64 * slice_bytes, to_string(dtype), name + ".scratch");
  side_.resize(world);
  side_done_.resize(world);
  chunk_summed_.resize(chunks_);
}

CopyEngineReduction::~CopyEngineReduction() = default;

void CopyEngineReduction::run(const void* input, void* output, cudaStream_t stream) {
  const dev::World& w = ctx_.world();
  const int me = ctx_.rank(), world = ctx_.world_size();
  const std::uint64_t size = dtype_size(dtype_);
  SymmetricHeap& heap = ctx_.heap();
  const dev::LaunchEpoch epoch = flags_.launch_epoch();
  std::uint64_t* ready = flags_.flags();
  std::uint64_t* arrived = ready + world;             // [W][K]
  std::uint64_t* reduced = arrived + world * chunks_;  // [W][K]
  auto slice_begin = [&](int q) { return std::min(total_, q * slice_); };
  auto slice_end = [&](int q) { return std::min(total_, (q + 1) * slice_); };
  const std::uint64_t grain = 16 / size;
  auto chunk_range = [&](int q, int k, std::uint64_t& b, std::uint64_t& n) {  // elements, relative to the slice
    std::uint64_t lo, hi;
    schedule::split(0, slice_end(q) - slice_begin(q), grain, chunks_, k, lo, hi);
    b = lo;
    n = hi - lo;
  };
  const char* in = static_cast<const char*>(input);
  char* out = static_cast<char*>(output);
  char* scratch = scratch_.as<char>();
  // Where my summed slice goes: all-reduce keeps the full layout, reduce-scatter only my slice.
  char* my_out = gather_ ? out + slice_begin(me) * size : out;

  // 1. A new epoch; my scratch and output are free for it.
  ce_begin(epoch, stream);
  ce_signal_peers(w, ready + me, epoch, stream);
  WEFT_CUDA(cudaEventRecord(fork_, stream));
  // 2. Push my slice p of the input into rank p's scratch slot for me, chunk by chunk.
  for (int k = 1; k < world; ++k) {
    const int p = (me + k) % world;
    cudaStream_t s = side_[p];
    WEFT_CUDA(cudaStreamWaitEvent(s, fork_));
    ce_wait(w, ready, 1, p, epoch, s);
    for (int c = 0; c < chunks_; ++c) {
      std::uint64_t b, n;
      chunk_range(p, c, b, n);
      if (n) WEFT_CUDA(cudaMemcpyAsync(heap.peer_ptr(scratch + (me * slice_ + b) * size, p),
                                       in + (slice_begin(p) + b) * size, n * size, cudaMemcpyDeviceToDevice, s));
      ce_signal(w, arrived + me * chunks_ + c, p, epoch, s);
    }
  }
  // 3. Sum each chunk of my slice once every peer's part of it has landed.
  for (int c = 0; c < chunks_; ++c) {
    ce_wait(w, arrived + c, chunks_, -1, epoch, stream);
    std::uint64_t b, n;
    chunk_range(me, c, b, n);
    if (n)
      dispatch(dtype_, [&](auto t) {
        using T = decltype(t);
        sum_chunk_kernel<T><<<sum_blocks_, kThreads, 0, stream>>>(
            reinterpret_cast<const T*>(in) + slice_begin(me), reinterpret_cast<const T*>(scratch), slice_,
            reinterpret_cast<T*>(my_out), b, b + n, me, world);
      });
    WEFT_CUDA(cudaGetLastError());
    WEFT_CUDA(cudaEventRecord(chunk_summed_[c], stream));
  }
  // 4. All-reduce: push every summed chunk to every peer's output, then wait for theirs.
  if (gather_) {
    for (int k = 1; k < world; ++k) {
      const int p = (me + k) % world;
      cudaStream_t s = side_[p];
      for (int c = 0; c < chunks_; ++c) {
        std::uint64_t b, n;
        chunk_range(me, c, b, n);
        WEFT_CUDA(cudaStreamWaitEvent(s, chunk_summed_[c]));
        if (n) WEFT_CUDA(cudaMemcpyAsync(heap.peer_ptr(my_out + b * size, p), my_out + b * size, n * size,
                                         cudaMemcpyDeviceToDevice, s));
        ce_signal(w, reduced + me * chunks_ + c, p, epoch, s);
      }
    }
    for (int c = 0; c < chunks_; ++c) ce_wait(w, reduced + c, chunks_, -1, epoch, stream);
  }
  // Join: my input must not be overwritten before my side streams have read it.
  for (int k = 1; k < world; ++k) {
    const int p = (me + k) % world;
    WEFT_CUDA(cudaEventRecord(side_done_[p], side_[p]));
    WEFT_CUDA(cudaStreamWaitEvent(stream, side_done_[p]));
  }
}

}  // namespace weft::ops_detail
