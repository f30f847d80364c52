#include "weft/ops/collective.hpp"

#include "weft/core/env.hpp"
#include "weft/core/error.hpp"

namespace weft {

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
