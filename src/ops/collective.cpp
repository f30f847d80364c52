#include "weft/ops/collective.hpp"

#include "weft/core/env.hpp"
#include "weft/core/error.hpp"
#include "weft/runtime/team.hpp"

namespace weft {

namespace ops_detail {
bool pdl_enabled() {
  // WEFT_PDL unset: on, except where ranks share a GPU; 0: off; 1: on everywhere.
  static const int setting = env_int(process_env(), "WEFT_PDL", -1);
  if (setting >= 0) return setting != 0;
  return !gpu_shared_in_process();
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
