// weft/device/copy.cuh - vectorised copies by a thread, a warp, a block or any span of threads.
//
// Used for local copies and for pushes/pulls through peer pointers. When both
// ends are 16-byte aligned each thread keeps four 16-byte loads in flight
// before storing them; otherwise it falls back to bytes. Loads bypass L1
// (ld.global.cg), so data another GPU wrote after an acquire is never served
// from a stale L1 line. No ordering, no signalling: pair with notify or a fence.
#pragma once

#include <cstddef>
#include <cstdint>

#include "weft/device/types.cuh"

#if defined(__CUDACC__)
namespace weft::dev {

/// Copies `bytes` from src to dst with `n` cooperating threads, this one being
/// number `i` (0 <= i < n); together they copy every byte once. Does not block
/// beyond its own loads.
WEFT_DEVICE void copy_span(void* dst, const void* src, std::size_t bytes, unsigned i, unsigned n) {
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  std::size_t done = 0;
  if (((reinterpret_cast<std::uintptr_t>(d) | reinterpret_cast<std::uintptr_t>(s)) & 15u) == 0) {
    const std::size_t n16 = bytes / 16;
    const auto* s4 = reinterpret_cast<const uint4*>(s);
    auto* d4 = reinterpret_cast<uint4*>(d);
    constexpr unsigned kUnroll = 4;
    std::size_t k = i;
    for (; k + (kUnroll - 1) * std::size_t{n} < n16; k += kUnroll * std::size_t{n}) {
      uint4 r[kUnroll];
#pragma unroll
      for (unsigned u = 0; u < kUnroll; ++u) r[u] = __ldcg(s4 + k + u * n);
#pragma unroll
      for (unsigned u = 0; u < kUnroll; ++u) d4[k + u * n] = r[u];
    }
    for (; k < n16; k += n) d4[k] = __ldcg(s4 + k);
    done = n16 * 16;
  }
  for (std::size_t b = done + i; b < bytes; b += n) d[b] = s[b];
}

/// One thread copies everything.
WEFT_DEVICE void copy_thread(void* dst, const void* src, std::size_t bytes) { copy_span(dst, src, bytes, 0, 1); }
/// The calling warp (all 32 lanes) copies together.
WEFT_DEVICE void copy_warp(void* dst, const void* src, std::size_t bytes) {
  copy_span(dst, src, bytes, threadIdx.x & 31u, 32);
}
/// Linear thread index within the block, and the block's thread count.
WEFT_DEVICE unsigned block_thread() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
WEFT_DEVICE unsigned block_threads() { return blockDim.x * blockDim.y * blockDim.z; }
/// The calling block (every thread) copies together.
WEFT_DEVICE void copy_block(void* dst, const void* src, std::size_t bytes) {
  copy_span(dst, src, bytes, block_thread(), block_threads());
}

}  // namespace weft::dev
#endif  // __CUDACC__
