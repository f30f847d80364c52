// Expert-parallel dispatch and combine's index maps (src/ops/moe/ep_layout.hpp),
// on the CPU at world sizes 1 to 8: every routing's tokens and pairs land in
// rows that tile each receiver's buffers exactly, in the documented order,
// and a combine that reads them back returns what a direct float64 reference
// computes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "ops/moe/ep_layout.hpp"

namespace {

using weft::moe_detail::ExpertPlacement;
using weft::moe_detail::low_latency_row;
using weft::moe_detail::placement_error;
using weft::moe_detail::receive_expert_rows;
using weft::moe_detail::receive_pair_base;
using weft::moe_detail::receive_token_base;
using weft::moe_detail::RowError;
using weft::moe_detail::source_layout;
using weft::moe_detail::SourceLayout;
using weft::moe_detail::token_destinations;

TEST(EpLayout, PlacementPutsConsecutiveExpertsOnEachRank) {
  for (int world = 1; world <= 8; ++world) {
    const ExpertPlacement p{8 * world, world};
    EXPECT_STREQ(placement_error(p.experts, world), "");
    for (int e = 0; e < p.experts; ++e) {
      EXPECT_EQ(p.owner(e), e / 8);
      EXPECT_EQ(p.local(e), e % 8);
      EXPECT_EQ(p.global(p.owner(e), p.local(e)), e);
    }
  }
  EXPECT_STRNE(placement_error(8, 3), "") << "8 experts do not split over 3 ranks";
  EXPECT_STRNE(placement_error(0, 2), "");
  EXPECT_STRNE(placement_error(8, 0), "");
}

TEST(EpLayout, ATokenGoesOnceToEachRankOfItsExpertsInRankOrder) {
  const ExpertPlacement p{16, 4};  // 4 experts per rank
  int ranks[8];
  RowError error;
  const std::int64_t row[] = {13, 2, -1, 3, 6, 15};  // ranks 3, 0, -, 0, 1, 3
  ASSERT_EQ(token_destinations(row, 6, p, ranks, error), 3);
  EXPECT_EQ(error, RowError::none);
  EXPECT_EQ(ranks[0], 0);
  EXPECT_EQ(ranks[1], 1);
  EXPECT_EQ(ranks[2], 3);
  const std::int64_t none[] = {-1, -1};
  EXPECT_EQ(token_destinations(none, 2, p, ranks, error), 0);
  EXPECT_EQ(error, RowError::none) << "a token routed nowhere is not an error";
  const std::int64_t out_of_range[] = {1, 16};
  EXPECT_EQ(token_destinations(out_of_range, 2, p, ranks, error), 0);
  EXPECT_EQ(error, RowError::expert_out_of_range);
  const std::int64_t negative[] = {-2};
  token_destinations(negative, 1, p, ranks, error);
  EXPECT_EQ(error, RowError::expert_out_of_range);
  const std::int64_t twice[] = {5, 7, 5};
  token_destinations(twice, 3, p, ranks, error);
  EXPECT_EQ(error, RowError::expert_twice);
}

TEST(EpLayout, TheLayoutStepReportsTheFirstBadToken) {
  const ExpertPlacement p{8, 2};
  const std::vector<std::int64_t> topk = {0, 1, 2, 9, 3, 3, 4, 5};  // token 1 is out of range, token 2 lists 3 twice
  const SourceLayout l = source_layout(topk.data(), 4, 2, p);
  EXPECT_EQ(l.bad_token, 1);
  EXPECT_EQ(l.bad_row, RowError::expert_out_of_range);
  EXPECT_EQ(l.tokens_per_rank[0], 1) << "token 0 goes to rank 0; bad tokens are not counted";
  EXPECT_EQ(l.tokens_per_rank[1], 1) << "token 3 goes to rank 1";
}

// Routings: every source draws its own tokens and top-k rows.
enum class Routing { uniform, skewed, with_none, one_expert };

std::vector<std::int64_t> route(std::mt19937_64& rng, std::int64_t tokens, int k, int experts, Routing how) {
  std::vector<std::int64_t> topk(static_cast<std::size_t>(tokens) * k, -1);
  std::vector<int> all(experts);
  std::iota(all.begin(), all.end(), 0);
  for (std::int64_t t = 0; t < tokens; ++t) {
    std::shuffle(all.begin(), all.end(), rng);
    for (int j = 0; j < k && j < experts; ++j) topk[t * k + j] = all[j];
    if (how == Routing::skewed && t % 2 == 0) {
      // Half of the tokens list expert 0 first (kept distinct within the row).
      auto* row = &topk[t * k];
      auto* it = std::find(row, row + k, 0);
      if (it != row + k) std::swap(*it, row[0]);
      else row[0] = 0;
    }
    if (how == Routing::with_none)
      for (int j = 0; j < k; ++j)
        if (rng() % 3 == 0) topk[t * k + j] = -1;
    if (how == Routing::one_expert) {
      for (int j = 0; j < k; ++j) topk[t * k + j] = -1;
      topk[t * k + (t % k)] = experts - 1;
    }
  }
  return topk;
}

struct Case {
  int world, experts, k;
  Routing routing;
  std::vector<std::int64_t> tokens;  // per source rank
};

// Dispatch and combine simulated through the maps alone, checked against the
// routing itself.
void check(const Case& c, std::mt19937_64& rng) {
  const ExpertPlacement p{c.experts, c.world};
  const int W = c.world, E = c.experts, k = c.k, per = p.per_rank();
  std::vector<std::vector<std::int64_t>> topk(W);
  std::vector<SourceLayout> layout(W);
  // What the ranks exchange once in throughput mode.
  std::vector<std::int32_t> pairs(static_cast<std::size_t>(W) * E), tokens(static_cast<std::size_t>(W) * W);
  std::int64_t max_tokens = 0;
  for (int s = 0; s < W; ++s) {
    topk[s] = route(rng, c.tokens[s], k, E, c.routing);
    layout[s] = source_layout(topk[s].data(), c.tokens[s], k, p);
    ASSERT_EQ(layout[s].bad_token, -1);
    std::copy(layout[s].pairs_per_expert.begin(), layout[s].pairs_per_expert.end(), pairs.begin() + s * E);
    std::copy(layout[s].tokens_per_rank.begin(), layout[s].tokens_per_rank.end(), tokens.begin() + s * W);
    max_tokens = std::max(max_tokens, c.tokens[s]);
  }
  if (max_tokens == 0) max_tokens = 1;

  // Every receiver: token-major rows (dispatch, once per token), expert-major
  // rows (throughput), low-latency rows; each row records who wrote it.
  using Writer = std::tuple<int, std::int64_t, int>;  // (source, token, slot j; -1 for a token row)
  const Writer empty{-1, -1, -1};
  // The expert outputs as each receiver computes them: row by row, for the
  // expert its position in the buffer says, on the token that landed there.
  auto expert_out = [](int s, std::int64_t t, std::int64_t e) { return static_cast<double>((s * 131 + t) % 977 * (e + 1)); };
  std::vector<std::vector<double>> outputs(W);
  for (int r = 0; r < W; ++r) {
    std::int64_t token_rows = 0, pair_rows = 0;
    for (int s = 0; s < W; ++s) token_rows += tokens[s * W + r];
    for (int e = 0; e < per; ++e) pair_rows += receive_expert_rows(pairs.data(), p, r, e);
    std::vector<Writer> by_token(token_rows, empty), by_pair(pair_rows, empty),
        low_latency(static_cast<std::size_t>(per) * W * max_tokens, empty);
    for (int s = 0; s < W; ++s) {
      for (std::int64_t t = 0; t < c.tokens[s]; ++t) {
        const std::int32_t pos = layout[s].rank_position[t * W + r];
        bool has_expert_here = false;
        for (int j = 0; j < k; ++j) {
          const std::int64_t e = topk[s][t * k + j];
          if (e < 0 || p.owner(static_cast<int>(e)) != r) continue;
          has_expert_here = true;
          const int le = p.local(static_cast<int>(e));
          const std::int32_t pp = layout[s].pair_position[t * k + j];
          ASSERT_GE(pp, 0);
          const std::int64_t row = receive_pair_base(pairs.data(), p, r, le, s) + pp;
          ASSERT_GE(row, 0);
          ASSERT_LT(row, pair_rows);
          ASSERT_EQ(by_pair[row], empty) << "two pairs in one row of rank " << r;
          by_pair[row] = {s, t, j};
          ASSERT_LT(pp, max_tokens) << "a source has at most max_tokens pairs per expert";
          const std::int64_t ll = low_latency_row(p, max_tokens, le, s, pp);
          ASSERT_EQ(low_latency[ll], empty);
          low_latency[ll] = {s, t, j};
        }
        ASSERT_EQ(pos >= 0, has_expert_here) << "a token is sent to a rank iff one of its experts is there";
        if (pos < 0) continue;
        const std::int64_t row = receive_token_base(tokens.data(), W, r, s) + pos;
        ASSERT_LT(row, token_rows);
        ASSERT_EQ(by_token[row], empty) << "a token sent twice to rank " << r;
        by_token[row] = {s, t, -1};
      }
    }
    // Token rows: all written, in (source, token) order.
    for (std::int64_t i = 0; i < token_rows; ++i) {
      ASSERT_NE(by_token[i], empty) << "rank " << r << ": token row " << i << " left empty";
      if (i > 0) {
        ASSERT_LT(by_token[i - 1], by_token[i]);
      }
    }
    // Pair rows: all written, each expert's rows contiguous at its base, in (source, token) order.
    for (int e = 0; e < per; ++e) {
      const std::int64_t lo = receive_pair_base(pairs.data(), p, r, e, 0);
      const std::int64_t hi = lo + receive_expert_rows(pairs.data(), p, r, e);
      for (std::int64_t i = lo; i < hi; ++i) {
        ASSERT_NE(by_pair[i], empty);
        const auto [s, t, j] = by_pair[i];
        ASSERT_EQ(topk[s][t * k + j], p.global(r, e)) << "row " << i << " is not local expert " << e << "'s";
        if (i > lo) {
          ASSERT_LT(by_pair[i - 1], by_pair[i]);
        }
      }
    }
    outputs[r].resize(pair_rows);
    for (int e = 0; e < per; ++e) {
      const std::int64_t lo = receive_pair_base(pairs.data(), p, r, e, 0);
      for (std::int64_t i = lo; i < lo + receive_expert_rows(pairs.data(), p, r, e); ++i)
        outputs[r][i] = expert_out(std::get<0>(by_pair[i]), std::get<1>(by_pair[i]), p.global(r, e));
    }
  }

  // Combine, reading each pair's output back from the row the maps name, in
  // the fixed order. Outputs are integers and weights small integers, so the
  // float64 sums are exact in any order and must equal the direct reference.
  auto weight = [](std::int64_t t, int j) { return static_cast<double>((t + j) % 5 + 1); };
  for (int s = 0; s < W; ++s) {
    for (std::int64_t t = 0; t < c.tokens[s]; ++t) {
      double reference = 0;
      for (int j = 0; j < k; ++j) {
        const std::int64_t e = topk[s][t * k + j];
        if (e >= 0) reference += weight(t, j) * expert_out(s, t, e);
      }
      int ranks[16];
      RowError error;
      const int n = token_destinations(&topk[s][t * k], k, p, ranks, error);
      double out = 0;
      for (int i = 0; i < n; ++i) {  // destinations ascending
        const int r = ranks[i];
        double partial = 0;
        for (int j = 0; j < k; ++j) {  // slots ascending
          const std::int64_t e = topk[s][t * k + j];
          if (e < 0 || p.owner(static_cast<int>(e)) != r) continue;
          // The row the receiver read this pair from names its writer.
          const std::int64_t row = receive_pair_base(pairs.data(), p, r, p.local(static_cast<int>(e)), s) +
                                   layout[s].pair_position[t * k + j];
          partial += weight(t, j) * outputs[r][row];
        }
        out += partial;
      }
      ASSERT_EQ(out, reference) << "source " << s << " token " << t;
    }
  }
}

TEST(EpLayout, RowsTileEveryReceiverAtWorldSizesOneToEight) {
  std::mt19937_64 rng(0x5eed);
  int cases = 0;
  for (int world = 1; world <= 8; ++world) {
    std::vector<int> expert_counts;
    for (int e : {8, 64, 256})
      if (e % world == 0) expert_counts.push_back(e);
    if (expert_counts.empty()) expert_counts.push_back(8 * world);
    for (int experts : expert_counts) {
      for (int k : {1, 2, 8}) {
        if (k > experts) continue;
        for (Routing routing : {Routing::uniform, Routing::skewed, Routing::with_none, Routing::one_expert}) {
          Case c{world, experts, k, routing, {}};
          for (int s = 0; s < world; ++s) {
            // A rank with no tokens, T = 1, and sizes that are multiples of nothing.
            const std::int64_t t = s == 1 ? 0 : s == 2 ? 1 : 37 + 61 * s;
            c.tokens.push_back(t);
          }
          SCOPED_TRACE(testing::Message() << "W " << world << " E " << experts << " k " << k << " routing "
                                          << static_cast<int>(routing));
          check(c, rng);
          if (HasFatalFailure()) return;
          ++cases;
        }
      }
    }
  }
  EXPECT_GE(cases, 100);
}

}  // namespace
