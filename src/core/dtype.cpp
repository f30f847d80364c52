#include "weft/core/dtype.hpp"

#include "weft/core/error.hpp"

namespace weft {

std::size_t dtype_size(DType t) { return t == DType::fp32 ? 4 : 2; }

const char* to_string(DType t) {
  switch (t) {
    case DType::bf16: return "bf16";
    case DType::fp16: return "fp16";
    case DType::fp32: return "fp32";
  }
  return "?";
}

DType parse_dtype(const std::string& name) {
  if (name == "bf16") return DType::bf16;
  if (name == "fp16") return DType::fp16;
  if (name == "fp32") return DType::fp32;
  WEFT_FAIL("unknown element type '", name, "': expected bf16, fp16 or fp32");
}

}  // namespace weft
