// bf16x8.cuh (private) - a 16-byte vector (uint4) as 8 bf16 values: what the
// expert-parallel combines (ep.cu, ep_ll.cu) sum in fp32 and round once.
#pragma once

#include <cuda_bf16.h>

namespace weft::moe_detail {

/// acc[i] += w x (bf16 i of `v`), for the 8 values of `v`, in fp32.
__device__ __forceinline__ void add_bf16x8(float* acc, const uint4& v, float w) {
  const auto* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    acc[2 * i] += w * f.x;
    acc[2 * i + 1] += w * f.y;
  }
}

/// The 8 values of `acc`, each rounded to the nearest bf16, as one vector.
__device__ __forceinline__ uint4 pack_bf16x8(const float* acc) {
  uint4 out;
  auto* h = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
  return out;
}

}  // namespace weft::moe_detail
