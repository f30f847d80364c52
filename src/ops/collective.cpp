#include "weft/ops/collective.hpp"

#include "weft/core/env.hpp"
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

namespace ops_detail {
bool pdl_enabled() {
  static const bool on = env_int(process_env(), "WEFT_PDL", 1) != 0;
  return on;
}
}  // namespace ops_detail

namespace {
constexpr VariantName<OverlapMode> kOverlapModes[] = {
    {OverlapMode::automatic, "auto", "automatic"},
    {OverlapMode::fused, "fused"},
    {OverlapMode::sequential, "sequential", "seq"},
};
}  // namespace

const char* to_string(OverlapMode m) { return variant_name(kOverlapModes, m); }

OverlapMode parse_overlap_mode(const std::string& name) { return parse_variant(kOverlapModes, name, "overlap mode"); }

void throw_unknown_name(const std::string& what, const std::string& text, const std::string& names) {
  WEFT_FAIL("unknown ", what, " '", text, "': expected one of ", names);
}

}  // namespace weft
