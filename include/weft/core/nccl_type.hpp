// weft/core/nccl_type.hpp - NCCL's data type for each DType: what weft's NCCL
// calls (the overlapped operators' sequential paths) and the benchmarks' NCCL
// baselines pass.
#pragma once

#include <nccl.h>

#include "weft/core/dtype.hpp"

namespace weft {

/// NCCL's data type for `t`.
inline ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::bf16: return ncclBfloat16;
    case DType::fp16: return ncclHalf;
    case DType::fp32: return ncclFloat32;
  }
  return ncclBfloat16;
}

}  // namespace weft
