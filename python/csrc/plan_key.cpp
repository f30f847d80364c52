#include "plan_key.hpp"

#include <string>
#include <type_traits>

#include "weft/core/dtype.hpp"
#include "weft/core/error.hpp"
#include "weft/ops/collective.hpp"
#include "weft/ops/flash_decode.hpp"

namespace weft_torch {
namespace {

const char* dtype(std::int64_t v) { return weft::to_string(static_cast<weft::DType>(v)); }
const char* layout(std::int64_t v) { return weft::to_string(static_cast<weft::KvLayout>(v)); }

}  // namespace

std::optional<PlanKind> plan_kind_named(std::string_view name) {
  for (int i = 0; i < kPlanKindCount; ++i)
    if (name == kPlanKinds[i].name) return static_cast<PlanKind>(i);
  return std::nullopt;
}

std::string PlanKey::str() const {
  const auto& f = fields;
  const char* name = kind_info(kind).name;
  switch (kind) {
    case PlanKind::all_reduce:
      return weft::str("all_reduce ", f[0], " x ", dtype(f[1]));
    case PlanKind::all_gather:
      return weft::str("all_gather ", f[0], " bytes per rank");
    case PlanKind::reduce_scatter:
      return weft::str("reduce_scatter ", f[0], " x ", dtype(f[1]), " per rank");
    case PlanKind::ag_gemm:
    case PlanKind::gemm_rs:
    case PlanKind::gemm_ar:
      return weft::str(name, " m=", f[0], " n=", f[1], " k=", f[2]);
    case PlanKind::expert_parallel:
    case PlanKind::expert_parallel_low_latency:
      return weft::str(name, " experts=", f[0], " hidden=", f[1], " top_k=", f[2], " max_tokens=", f[3],
                       " max_sms=", f[4]);
    case PlanKind::ag_moe:
    case PlanKind::moe_rs:
      return weft::str(name, " experts=", f[0], " hidden=", f[1], " top_k=", f[2], " cap=", f[3], " ", dtype(f[4]),
                       " max_sms=", f[5], " mode=", weft::to_string(static_cast<weft::OverlapMode>(f[6])));
    case PlanKind::flash_decode:
    case PlanKind::dist_flash_decode:
      return weft::str(name, " ", layout(f[0]), " b=", f[1], " heads=", f[2], "/", f[3], " d=", f[4], " ", dtype(f[5]),
                       " kv=", f[6], " pages=", f[7], "x", f[8], " scale_bits=", f[9]);
  }
  return weft::str("plan kind ", static_cast<std::int64_t>(kind));
}

}  // namespace weft_torch
