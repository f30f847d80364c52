// GEMM+ReduceScatter's ring as data (ops/ring_plan.hpp) at world sizes 1 to 8:
// every rank computes every block once, each step adds exactly what the
// previous rank sent it a step earlier, each block ends complete at its owner,
// and the one-launch walk agrees with the ring's sends only at 1 and 2 ranks.
#include <gtest/gtest.h>

#include <vector>

#include "ops/ring_plan.hpp"

using namespace weft::ops_detail;

namespace {

std::vector<RingPlan> plans(int world, bool plain_first, bool caller_ships) {
  std::vector<RingPlan> all;
  for (int r = 0; r < world; ++r) all.push_back(ring_per_step_plan(r, world, plain_first, caller_ships));
  return all;
}

// Calls check(plan, plain_first, ships) for every rank's plan of every
// world size 1 to 8 and every way, under a trace that names them.
template <class Check>
void for_each_plan(Check check) {
  for (int world = 1; world <= 8; ++world)
    for (bool plain_first : {false, true})
      for (bool ships : {false, true})
        for (const RingPlan& p : plans(world, plain_first, ships)) {
          SCOPED_TRACE(testing::Message() << "world " << world << " rank " << p.rank << " plain_first " << plain_first
                                          << " ships " << ships);
          check(p, plain_first, ships);
        }
}

}  // namespace

TEST(RingPlan, EveryRankComputesEveryBlockOnceAndEndsWithItsOwn) {
  for_each_plan([](const RingPlan& p, bool, bool) {
    ASSERT_EQ(static_cast<int>(p.steps.size()), p.world);
    std::vector<int> seen(p.world, 0);
    for (const RingStep& s : p.steps) ++seen[s.block];
    for (int b = 0; b < p.world; ++b) EXPECT_EQ(seen[b], 1) << "block " << b;
    // Only the last step writes `out`, and it is this rank's own block.
    for (int s = 0; s < p.world; ++s) EXPECT_EQ(p.steps[s].to_out(), s == p.world - 1) << "step " << s;
    EXPECT_EQ(p.steps.back().block, p.rank);
  });
}

TEST(RingPlan, EachStepAddsWhatThePreviousRankSentAStepEarlier) {
  for (int world = 1; world <= 8; ++world)
    for (bool plain_first : {false, true})
      for (bool ships : {false, true}) {
        const std::vector<RingPlan> all = plans(world, plain_first, ships);
        for (const RingPlan& p : all)
          for (int s = 0; s < world; ++s) {
            SCOPED_TRACE(testing::Message() << "world " << world << " rank " << p.rank << " step " << s);
            const RingStep& step = p.steps[s];
            if (s == 0) {
              EXPECT_EQ(step.source_rank, -1) << "nobody sends the first step's block";
              continue;
            }
            ASSERT_GE(step.source_rank, 0);
            const RingStep& sent = all[step.source_rank].steps[s - 1];
            EXPECT_EQ(sent.send_rank, p.rank) << "the source's previous step sends to this rank";
            EXPECT_EQ(sent.block, step.block) << "and sends the block this step adds to";
            EXPECT_TRUE(sent.send == RingSend::when_stored || sent.send == RingSend::when_step_done);
          }
      }
}

TEST(RingPlan, EveryBlockCollectsEveryRanksProductOnceAndEndsAtItsOwner) {
  for (int world = 1; world <= 8; ++world) {
    const std::vector<RingPlan> all = plans(world, false, false);
    for (int b = 0; b < world; ++b) {
      // Follow block b through the ring: whoever computes it at step s hands it on.
      std::vector<int> contributed(world, 0);
      int holder = -1;
      for (int s = 0; s < world; ++s) {
        int computing = -1;
        for (const RingPlan& p : all) {
          if (p.steps[s].block != b) continue;
          EXPECT_EQ(computing, -1) << "block " << b << " computed twice at step " << s;
          computing = p.rank;
        }
        ASSERT_GE(computing, 0) << "block " << b << " at step " << s;
        if (s > 0) {
          EXPECT_EQ(all[computing].steps[s].source_rank, holder) << "block " << b << " step " << s;
        }
        ++contributed[computing];
        holder = computing;
      }
      EXPECT_EQ(holder, b) << "block " << b << " ends at its owner";
      for (int r = 0; r < world; ++r) EXPECT_EQ(contributed[r], 1) << "rank " << r << " to block " << b;
    }
  }
}

TEST(RingPlan, StepsRunTheGemmsGemmRsBuildsForThem) {
  for_each_plan([](const RingPlan& p, bool plain_first, bool ships) {
    const RingStep& first = p.steps.front();
    const RingStep& last = p.steps.back();
    if (p.world == 1) {  // one plain GEMM into out
      EXPECT_EQ(first.gemm, RingGemm::plain);
      EXPECT_EQ(first.send, RingSend::stays);
      return;
    }
    EXPECT_EQ(first.gemm, plain_first ? RingGemm::plain : RingGemm::reporting);
    EXPECT_EQ(first.send, plain_first ? RingSend::when_step_done : RingSend::when_stored);
    for (int s = 1; s + 1 < p.world; ++s) EXPECT_EQ(p.steps[s].gemm, RingGemm::source_reporting) << s;
    EXPECT_EQ(last.gemm, ships ? RingGemm::source_reporting : RingGemm::source_any_order);
    EXPECT_EQ(last.send, ships ? RingSend::shipped_by_caller : RingSend::stays);
    EXPECT_EQ(last.send_rank, -1);
  });
}

// GemmRs refuses FusedWay::ring_one_launch past 2 ranks: its tiles walk the
// blocks ascending while the ring sends them descending.
TEST(RingPlan, OneLaunchWalksTheRingsOrderOnlyAtOneAndTwoRanks) {
  for (int world = 1; world <= 8; ++world) {
    bool agree = true;
    for (int r = 0; r < world; ++r) {
      const std::vector<int> walk = ring_one_launch_walk(r, world);
      const RingPlan p = ring_per_step_plan(r, world, false, false);
      ASSERT_EQ(walk.size(), p.steps.size());
      EXPECT_EQ(walk.front(), p.steps.front().block) << "the walk starts at the first step's block";
      for (int s = 0; s < world; ++s) agree = agree && walk[s] == p.steps[s].block;
    }
    EXPECT_EQ(agree, world <= 2) << "world " << world;
  }
}
