// half_bits.hpp - bf16 and fp16 values as the 16-bit patterns the tests write to and read back from the GPU.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "weft/core/dtype.hpp"

namespace weft::test {

/// The value a bf16 or fp16 bit pattern holds (exact in float).
inline float half_bits_to_float(std::uint16_t bits, DType t) {
  if (t == DType::bf16) {
    __nv_bfloat16_raw r;
    r.x = bits;
    return __bfloat162float(__nv_bfloat16(r));
  }
  __half_raw r;
  r.x = bits;
  return __half2float(__half(r));
}

/// The bf16 or fp16 bit pattern nearest to `f` (round to nearest even).
inline std::uint16_t float_to_half_bits(float f, DType t) {
  if (t == DType::bf16) {
    const __nv_bfloat16_raw r = __float2bfloat16_rn(f);
    return r.x;
  }
  const __half_raw r = __float2half_rn(f);
  return r.x;
}

}  // namespace weft::test
