// routing.hpp - how many rows each expert holds under a routing, for weft-bench grouped_gemm.
//
// The counts are a deterministic function of (routing, rows, experts): no
// random draw, so tools/bench/grouped_mm_torch.py computes the same counts in
// Python and both sides time the same problem.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace weft::bench {

enum class Routing {
  uniform,  ///< balanced: rows / E each, the first rows % E experts one more
  zipf,     ///< expert i's share proportional to (i + 1)^-s (s = kZipfExponent): expert 0 the heaviest
  one_hot,  ///< every row to expert 0, the others empty
  /// zipf's counts in reverse expert order: the heaviest expert last. The
  /// grouped kernel walks tiles expert by expert, so zipf against
  /// zipf_reversed shows what the order of a skewed routing's tiles costs.
  zipf_reversed,
};

/// The Zipf exponent of Routing::zipf (issue 33's acceptance: s = 1.2).
inline constexpr double kZipfExponent = 1.2;

/// "uniform", "zipf", "one-hot", "zipf-reversed".
const char* routing_name(Routing r);
/// Parses the names above; throws weft::Error naming them.
Routing parse_routing(const std::string& name);

/// Rows per expert, summing to `rows`, each >= 0. Zipf: each expert's exact
/// share rows * w_i / sum(w), floored, then the rows left over one each to the
/// largest fractional parts (ties to the lower index): the largest-remainder
/// rounding, done in double in index order so Python reproduces it bit for bit.
std::vector<std::int32_t> routing_counts(Routing r, std::int64_t rows, int experts);

}  // namespace weft::bench
