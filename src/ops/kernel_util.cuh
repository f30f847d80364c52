// kernel_util.cuh (private) - small pieces every collective kernel uses.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include <cuda_runtime.h>

#include "weft/core/error.hpp"
#include "weft/device/memory.cuh"
#include "schedule.hpp"
#include "weft/ops/collective.hpp"

namespace weft::ops_detail {

/// Calls fn(T{}) with T the CUDA type of `t` (float, __nv_bfloat16, __half).
template <class Fn>
void dispatch(DType t, Fn&& fn) {
  switch (t) {
    case DType::fp32: fn(float{}); return;
    case DType::bf16: fn(__nv_bfloat16{}); return;
    case DType::fp16: fn(__half{}); return;
  }
  WEFT_FAIL("unsupported element type");
}

/// This block's part [lo, hi) of [begin, end), cut in `grain`-element units so
/// vector copies stay aligned.
__device__ inline void block_range(std::uint64_t begin, std::uint64_t end, std::uint64_t grain, std::uint64_t& lo,
                                   std::uint64_t& hi) {
  schedule::split(begin, end, grain, gridDim.x, blockIdx.x, lo, hi);
}

/// True on every thread of the last block of the grid to get here (every block
/// calls it; the result is block-uniform). Every block's stores precede what
/// that block does next (bar.sync, then a release chain through the acq_rel
/// counter). `done` goes back to 0 for the next launch.
__device__ inline bool last_block(std::uint64_t* done) {
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    const std::uint64_t before = dev::atomic_add(done, 1, dev::Scope::sys, dev::Order::acq_rel);
    last = before == gridDim.x - 1;
    if (last) *done = 0;  // every block has counted; the next launch starts after this one
  }
  __syncthreads();
  return last;
}

/// Reads the 4 bytes of word i of a `bytes`-long buffer (fewer at the tail; the rest zero).
__device__ inline std::uint32_t load_word(const void* base, std::uint64_t bytes, std::uint64_t i) {
  const char* p = static_cast<const char*>(base);
  if (4 * i + 4 <= bytes && (reinterpret_cast<std::uintptr_t>(p) & 3u) == 0)
    return *reinterpret_cast<const std::uint32_t*>(p + 4 * i);
  std::uint32_t v = 0;
  for (std::uint64_t b = 4 * i; b < std::min(bytes, 4 * i + 4); ++b)
    v |= std::uint32_t(static_cast<unsigned char>(p[b])) << (8 * (b - 4 * i));
  return v;
}

/// Writes word i (only the bytes that lie inside the buffer).
__device__ inline void store_word(void* base, std::uint64_t bytes, std::uint64_t i, std::uint32_t v) {
  char* p = static_cast<char*>(base);
  if (4 * i + 4 <= bytes && (reinterpret_cast<std::uintptr_t>(p) & 3u) == 0) {
    *reinterpret_cast<std::uint32_t*>(p + 4 * i) = v;
    return;
  }
  for (std::uint64_t b = 4 * i; b < std::min(bytes, 4 * i + 4); ++b) p[b] = static_cast<char>(v >> (8 * (b - 4 * i)));
}

/// Launches `kernel` with programmatic stream serialisation allowed: on
/// Hopper the grid may be scheduled while the previous kernel of the stream
/// finishes, hiding launch latency; the kernel must start with dev::pdl_wait()
/// (dev::epoch_begin does). Works inside CUDA graphs too. Off where ranks
/// share a GPU (gpu_shared_in_process(); gpu_share.hpp says why); WEFT_PDL=0
/// turns it off everywhere (plain stream order, to measure what it buys),
/// WEFT_PDL=1 on everywhere.
bool pdl_enabled();

template <class... Params, class... Args>
void launch_pdl(void (*kernel)(Params...), int blocks, int threads, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(blocks));
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  WEFT_CUDA(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

/// Threads per block of the collective kernels.
constexpr int kThreads = 512;

/// Blocks for an LL kernel moving `words` 4-byte words: one word per thread,
/// up to half the SMs (so small messages leave from many SMs at once), capped.
inline int ll_blocks(std::uint64_t words, int sm_count, int max_sms) {
  auto b = static_cast<int>((words + kThreads - 1) / kThreads);
  int cap = std::max(1, sm_count / 2);
  if (max_sms > 0) cap = std::min(cap, max_sms);
  return std::clamp(b, 1, cap);
}

/// Blocks for a bulk SM kernel: about `per_block` bytes each, at most 32 (a
/// quarter of an H200) or the caller's cap.
inline int bulk_blocks(std::uint64_t bytes, std::uint64_t per_block, int sm_count, int max_sms) {
  auto b = static_cast<int>((bytes + per_block - 1) / per_block);
  int cap = std::min(32, sm_count);
  if (max_sms > 0) cap = std::min(cap, max_sms);
  return std::clamp(b, 1, std::max(1, cap));
}

}  // namespace weft::ops_detail
