// weft/core/dtype.hpp - element types, their sizes and names (every layer above core uses them).
#pragma once

#include <cstddef>
#include <string>

namespace weft {

/// Element types: GEMM inputs and outputs, and what the reducing collectives
/// accept (sums accumulate in fp32).
enum class DType { bf16, fp16, fp32 };

/// Bytes per element.
std::size_t dtype_size(DType t);
/// "bf16", "fp16", "fp32".
const char* to_string(DType t);
/// Parses the names above; throws naming the accepted ones.
DType parse_dtype(const std::string& name);

}  // namespace weft
