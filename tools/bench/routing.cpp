#include "routing.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "weft/core/error.hpp"

namespace weft::bench {

const char* routing_name(Routing r) {
  switch (r) {
    case Routing::uniform: return "uniform";
    case Routing::zipf: return "zipf";
    case Routing::one_hot: return "one-hot";
    case Routing::zipf_reversed: return "zipf-reversed";
  }
  return "unknown";
}

Routing parse_routing(const std::string& name) {
  for (Routing r : {Routing::uniform, Routing::zipf, Routing::one_hot, Routing::zipf_reversed})
    if (name == routing_name(r)) return r;
  WEFT_FAIL("unknown --routing '", name, "': expected uniform, zipf, one-hot or zipf-reversed");
}

std::vector<std::int32_t> routing_counts(Routing r, std::int64_t rows, int experts) {
  WEFT_REQUIRE(experts >= 1, "routing_counts: experts = ", experts, " must be at least 1");
  WEFT_REQUIRE(rows >= 0 && rows <= INT32_MAX, "routing_counts: rows = ", rows, " must be 0 to ", INT32_MAX);
  std::vector<std::int32_t> counts(experts, 0);
  switch (r) {
    case Routing::uniform:
      for (int e = 0; e < experts; ++e) counts[e] = static_cast<std::int32_t>(rows / experts + (e < rows % experts));
      break;
    case Routing::one_hot:
      counts[0] = static_cast<std::int32_t>(rows);
      break;
    case Routing::zipf:
    case Routing::zipf_reversed: {
      std::vector<double> w(experts), frac(experts);
      double total = 0;
      for (int e = 0; e < experts; ++e) {
        w[e] = std::pow(static_cast<double>(e + 1), -kZipfExponent);
        total += w[e];
      }
      std::int64_t given = 0;
      for (int e = 0; e < experts; ++e) {
        const double exact = static_cast<double>(rows) * w[e] / total;
        const double floored = std::floor(exact);
        counts[e] = static_cast<std::int32_t>(floored);
        frac[e] = exact - floored;
        given += counts[e];
      }
      std::vector<int> order(experts);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return frac[x] > frac[y]; });
      // Rounding can leave the floors' sum off by the experts' count at most: hand out the rest in turn.
      for (std::int64_t i = 0; given < rows; ++i, ++given) ++counts[order[i % experts]];
      if (r == Routing::zipf_reversed) std::reverse(counts.begin(), counts.end());
      break;
    }
  }
  return counts;
}

}  // namespace weft::bench
