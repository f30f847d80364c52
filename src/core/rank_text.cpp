#include "weft/core/rank_text.hpp"

#include "weft/core/error.hpp"

namespace weft::detail {

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    if (j - i >= 2) out += str(ranks[i], "-", ranks[j]);
    else if (j > i) out += str(ranks[i], ", ", ranks[j]);
    else out += std::to_string(ranks[i]);
    i = j + 1;
  }
  return out;
}

std::string ranks_text(const std::vector<int>& ranks) {
  if (ranks.empty()) return "no rank";
  return (ranks.size() == 1 ? "rank " : "ranks ") + rank_list(ranks);
}

std::string disagreement(const std::vector<std::string>& asked, const std::string& what, const std::string& remedy) {
  auto value = [](const std::string& v) { return v == "?" ? std::string("a malformed value") : v; };
  std::string differ;
  for (std::size_t r = 1; r < asked.size(); ++r)
    if (asked[r] != asked[0]) differ += str(", rank ", r, " asked for ", value(asked[r]));
  if (differ.empty()) return "";
  return str("ranks disagree on ", what, ": rank 0 asked for ", value(asked[0]), differ, " (", remedy, ")");
}

}  // namespace weft::detail
