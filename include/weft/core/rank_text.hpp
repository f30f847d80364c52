// How error messages and logs name ranks: one spelling of a rank list, and one
// form for ranks that asked for different values of a setting that must agree.
#pragma once

#include <string>
#include <vector>

namespace weft::detail {

/// "0, 2, 5-9": ranks in the order given, runs of three or more consecutive
/// ranks as a range.
std::string rank_list(const std::vector<int>& ranks);

/// "rank 1", "ranks 0, 2", "no rank".
std::string ranks_text(const std::vector<int>& ranks);

/// Every rank's value of one setting, as gathered (index = rank), where a rank
/// that could not parse its own value sent "?". "" where every rank agrees
/// with rank 0; else "ranks disagree on <what>: rank 0 asked for A, rank 3
/// asked for B (<remedy>)", the same text on every rank.
std::string disagreement(const std::vector<std::string>& asked, const std::string& what, const std::string& remedy);

}  // namespace weft::detail
