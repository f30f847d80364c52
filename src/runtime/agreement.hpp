// agreement.hpp (private) - the one check behind every setting all ranks must share.
#pragma once

#include <string>
#include <vector>

#include "weft/core/error.hpp"

namespace weft::runtime_detail {

/// `asked` holds each rank's request for a setting, in rank order ("?" where
/// a rank's value did not parse). Throws on every rank when they differ:
/// "ranks disagree on <what>: rank 0 asked for A, rank 2 asked for B (set
/// <setting> the same on every rank)".
inline void require_same_request(const std::vector<std::string>& asked, const char* what, const char* setting) {
  auto shown = [](const std::string& v) { return v == "?" ? std::string("a malformed value") : v; };
  std::string differ;
  for (std::size_t r = 1; r < asked.size(); ++r)
    if (asked[r] != asked[0]) differ += str(", rank ", r, " asked for ", shown(asked[r]));
  WEFT_REQUIRE(differ.empty(), "ranks disagree on ", what, ": rank 0 asked for ", shown(asked[0]), differ, " (set ",
               setting, " the same on every rank)");
}

}  // namespace weft::runtime_detail
