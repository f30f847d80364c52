// How messages name ranks (weft/core/rank_text.hpp): the one spelling of a rank
// list used by the store, the team's GPU-sharing checks and weft::RemotePeers,
// and the one "ranks disagree" form of settings that must agree on every rank.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "weft/core/rank_text.hpp"

using weft::detail::disagreement;
using weft::detail::rank_list;
using weft::detail::ranks_text;

TEST(RankText, RunsOfThreeOrMoreBecomeRanges) {
  EXPECT_EQ(rank_list({}), "");
  EXPECT_EQ(rank_list({4}), "4");
  EXPECT_EQ(rank_list({0, 1}), "0, 1");
  EXPECT_EQ(rank_list({0, 1, 2}), "0-2");
  EXPECT_EQ(rank_list({0, 2, 5, 6, 7, 8, 9}), "0, 2, 5-9");
  EXPECT_EQ(rank_list({1, 2, 4, 5, 6, 9, 10}), "1, 2, 4-6, 9, 10");
  EXPECT_EQ(rank_list({3, 2, 1}), "3, 2, 1") << "only ascending runs are ranges";
}

TEST(RankText, SaysRankOrRanks) {
  EXPECT_EQ(ranks_text({}), "no rank");
  EXPECT_EQ(ranks_text({7}), "rank 7");
  EXPECT_EQ(ranks_text({0, 2}), "ranks 0, 2");
  EXPECT_EQ(ranks_text({0, 1, 2, 3}), "ranks 0-3");
}

TEST(RankText, DisagreementNamesEveryRankThatDiffersFromRankZero) {
  EXPECT_EQ(disagreement({}, "x", "fix"), "");
  EXPECT_EQ(disagreement({"a"}, "x", "fix"), "");
  EXPECT_EQ(disagreement({"a", "a", "a"}, "x", "fix"), "");
  EXPECT_EQ(disagreement({"native", "nvshmem", "native", "automatic"}, "the heap backend",
                         "set WEFT_HEAP_BACKEND the same on every rank"),
            "ranks disagree on the heap backend: rank 0 asked for native, rank 1 asked for nvshmem, rank 3 asked "
            "for automatic (set WEFT_HEAP_BACKEND the same on every rank)");
  // A rank that could not parse its own value says so, rank 0 included.
  EXPECT_EQ(disagreement({"?", "2"}, "virtual nodes", "fix"),
            "ranks disagree on virtual nodes: rank 0 asked for a malformed value, rank 1 asked for 2 (fix)");
  EXPECT_EQ(disagreement({"2", "2", "?"}, "virtual nodes", "fix"),
            "ranks disagree on virtual nodes: rank 0 asked for 2, rank 2 asked for a malformed value (fix)");
  // Every rank malformed alike is agreement here: each rank raises its own parse error first.
  EXPECT_EQ(disagreement({"?", "?"}, "virtual nodes", "fix"), "");
}
