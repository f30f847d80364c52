// weft/device/reduce.cuh - element-wise sums across ranks, in a fixed order, in fp32.
//
// Every reduction in weft adds the ranks' values in rank order 0, 1, ..., W-1
// (or, for ring algorithms, in the ring's order), accumulates in fp32 and
// rounds once to the element type. The result is therefore the same on every
// rank, in every run, whatever the variant: repeated calls are bitwise
// identical, and a CPU reference in the same order reproduces it exactly.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "weft/device/types.cuh"

#if defined(__CUDACC__)
namespace weft::dev {

/// Element-type traits: conversions to and from the fp32 accumulator.
template <class T>
struct Elem;
template <>
struct Elem<float> {
  WEFT_DEVICE static float to_float(float x) { return x; }
  WEFT_DEVICE static float from_float(float x) { return x; }
};
template <>
struct Elem<__nv_bfloat16> {
  WEFT_DEVICE static float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  WEFT_DEVICE static __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
};
template <>
struct Elem<__half> {
  WEFT_DEVICE static float to_float(__half x) { return __half2float(x); }
  WEFT_DEVICE static __half from_float(float x) { return __float2half_rn(x); }
};

/// A packet of N elements of T held as fp32 accumulators.
template <class T, int kBytes>
struct Acc {
  static constexpr int N = kBytes / static_cast<int>(sizeof(T));
  float v[N];

  /// Sets the accumulators to the elements packed in `bits` (the first rank).
  template <class Bits>
  WEFT_DEVICE void set(const Bits& bits) {
    const T* e = reinterpret_cast<const T*>(&bits);
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = Elem<T>::to_float(e[i]);
  }
  /// Adds the elements packed in `bits` (the next rank, in order).
  template <class Bits>
  WEFT_DEVICE void add(const Bits& bits) {
    const T* e = reinterpret_cast<const T*>(&bits);
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] += Elem<T>::to_float(e[i]);
  }
  /// Adds `w` times the elements packed in `bits` (a weighted sum, in the caller's order).
  template <class Bits>
  WEFT_DEVICE void add_scaled(const Bits& bits, float w) {
    const T* e = reinterpret_cast<const T*>(&bits);
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] += w * Elem<T>::to_float(e[i]);
  }
  /// Rounds the sums to T, packed as `Bits`.
  template <class Bits>
  WEFT_DEVICE Bits pack() const {
    Bits out;
    T* e = reinterpret_cast<T*>(&out);
#pragma unroll
    for (int i = 0; i < N; ++i) e[i] = Elem<T>::from_float(v[i]);
    return out;
  }
};

/// out[k] = sum over q = 0..n-1 (in that order) of src(q)[k], for k in [lo, hi),
/// by `nthreads` cooperating threads, this one numbered `t`. `src(q)` returns
/// the q-th source (a local or peer pointer to T). 16-byte vectors when every
/// pointer and `lo` allow it, elements otherwise. Loads bypass L1 (peer data).
/// No ordering: the caller waits for the sources and signals after.
template <class T, class Src>
WEFT_DEVICE void reduce_span(T* out, Src src, int n, std::uint64_t lo, std::uint64_t hi, unsigned t,
                             unsigned nthreads) {
  constexpr std::uint64_t kVec = 16 / sizeof(T);
  bool aligned = (reinterpret_cast<std::uintptr_t>(out + lo) & 15u) == 0;
  for (int q = 0; q < n && aligned; ++q) aligned = (reinterpret_cast<std::uintptr_t>(src(q) + lo) & 15u) == 0;
  std::uint64_t k = lo;
  if (aligned) {
    const std::uint64_t vecs = (hi - lo) / kVec;
    for (std::uint64_t v = t; v < vecs; v += nthreads) {
      const std::uint64_t at = lo + v * kVec;
      Acc<T, 16> acc;
      acc.set(__ldcg(reinterpret_cast<const uint4*>(src(0) + at)));
      for (int q = 1; q < n; ++q) acc.add(__ldcg(reinterpret_cast<const uint4*>(src(q) + at)));
      *reinterpret_cast<uint4*>(out + at) = acc.template pack<uint4>();
    }
    k = lo + vecs * kVec;
  }
  for (std::uint64_t e = k + t; e < hi; e += nthreads) {
    float s = Elem<T>::to_float(src(0)[e]);
    for (int q = 1; q < n; ++q) s += Elem<T>::to_float(src(q)[e]);
    out[e] = Elem<T>::from_float(s);
  }
}

}  // namespace weft::dev
#endif  // __CUDACC__
