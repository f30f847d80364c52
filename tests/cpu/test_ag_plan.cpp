// AllGather+GEMM's fused ways as data (ops/ag_plan.hpp) at world sizes 1 to
// 8, every rank: every shard multiplied once, each shard used in the order
// its owner pushes it to us (the one-GEMM way's tile walk too, as its hooked
// scheduler rotates it), every peer pushed to once, and the inputs no way
// runs refused.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gemm/tile_walk.hpp"
#include "ops/ag_plan.hpp"

using namespace weft::ops_detail;
using weft::AgWay;

namespace {

/// The turn at which `owner` pushes its shard to `to`, from the owner's plan; 0 if never.
int push_turn(AgWay way, int owner, int to, int world) {
  const AgPlan plan = ag_plan(way, owner, world);
  for (std::size_t i = 0; i < plan.pushes.size(); ++i)
    if (plan.pushes[i] == to) return static_cast<int>(i) + 1;
  return 0;
}

// Calls check(plan) for every rank's plan of `way` at every world size the way runs at, under a trace that names it.
template <class Check>
void for_each_plan(AgWay way, Check check) {
  for (int world = way == AgWay::plain_steps ? 2 : 1; world <= 8; ++world)
    for (int rank = 0; rank < world; ++rank) {
      SCOPED_TRACE(testing::Message() << "world " << world << " rank " << rank);
      const AgPlan plan = ag_plan(way, rank, world);
      ASSERT_EQ(plan.rank, rank);
      ASSERT_EQ(plan.world, world);
      ASSERT_EQ(plan.way, way);
      check(plan);
    }
}

}  // namespace

TEST(AgPlan, PushesGoToEveryPeerOnceNeverOurselvesInTheSchedulesOrder) {
  for (AgWay way : {AgWay::one_gemm, AgWay::plain_steps})
    for_each_plan(way, [](const AgPlan& p) {
      ASSERT_EQ(static_cast<int>(p.pushes.size()), p.world - 1);
      std::vector<int> seen(p.world, 0);
      for (int peer : p.pushes) {
        ASSERT_GE(peer, 0);
        ASSERT_LT(peer, p.world);
        ++seen[peer];
      }
      for (int r = 0; r < p.world; ++r) EXPECT_EQ(seen[r], r == p.rank ? 0 : 1) << "peer " << r;
      for (int turn = 1; turn < p.world; ++turn)
        EXPECT_EQ(p.pushes[turn - 1], weft::schedule::shard_push_peer(p.rank, turn, p.world)) << "turn " << turn;
    });
}

TEST(AgPlan, PlainStepsMultiplyEveryShardOnceOursFirst) {
  for_each_plan(AgWay::plain_steps, [](const AgPlan& p) {
    ASSERT_EQ(static_cast<int>(p.steps.size()), p.world);
    std::vector<int> seen(p.world, 0);
    for (const AgStep& step : p.steps) {
      EXPECT_EQ(step.gemm, AgGemmKind::shard);
      ASSERT_GE(step.shard, 0);
      ASSERT_LT(step.shard, p.world);
      EXPECT_EQ(step.first_shard, step.shard);
      ++seen[step.shard];
    }
    for (int q = 0; q < p.world; ++q) EXPECT_EQ(seen[q], 1) << "shard " << q;
    // Our own rows are there from the start: the first step waits for nothing.
    EXPECT_EQ(p.steps[0].shard, p.rank);
    EXPECT_EQ(p.steps[0].wait, AgWait::none);
    EXPECT_EQ(p.steps[0].wait_from, -1);
  });
}

TEST(AgPlan, EachLaterPlainStepWaitsForItsShardWhichArrivesInStepOrder) {
  for_each_plan(AgWay::plain_steps, [](const AgPlan& p) {
    for (int s = 1; s < p.world; ++s) {
      SCOPED_TRACE(testing::Message() << "step " << s);
      const AgStep& step = p.steps[s];
      EXPECT_EQ(step.wait, AgWait::shard_flags_before_launch);
      // Shard q's flags are raised by its owner, rank q.
      EXPECT_EQ(step.wait_from, step.shard);
      // The shard its owner pushes to us at turn s is the one step s uses:
      // each wait is for the shard that landed during the step before.
      EXPECT_EQ(push_turn(AgWay::plain_steps, step.shard, p.rank, p.world), s);
    }
  });
}

TEST(AgPlan, OneGemmIsOneHookedGemmFromOurShardWaitingInTheKernel) {
  for_each_plan(AgWay::one_gemm, [](const AgPlan& p) {
    ASSERT_EQ(p.steps.size(), 1u);
    const AgStep& whole = p.steps[0];
    EXPECT_EQ(whole.gemm, AgGemmKind::whole_waiting);
    EXPECT_EQ(whole.shard, -1);  // all of them
    // First row rank x M / W: its tiles start on the rows that are already here.
    EXPECT_EQ(whole.first_shard, p.rank);
    EXPECT_EQ(whole.wait, AgWait::in_kernel_tiles);
    EXPECT_EQ(whole.wait_from, -1);
  });
}

TEST(AgPlan, OneGemmsTileWalkReachesEachShardOnceInTheOrderItArrives) {
  // The hooked scheduler rotates its walk to start at GemmArgs::first_row
  // (first_shard x M / W rows): with `tiles` row tiles per shard, positions
  // [s x tiles, (s + 1) x tiles) compute one shard, which must be the one its
  // owner pushes to us at turn s (ours at s = 0), each shard once.
  for (int tiles : {1, 3}) {
    for_each_plan(AgWay::one_gemm, [tiles](const AgPlan& p) {
      const int first_tile = p.steps[0].first_shard * tiles;
      std::vector<int> seen(p.world, 0);
      for (int s = 0; s < p.world; ++s) {
        const int shard = weft::gemm_detail::rotated_row_tile(s * tiles, first_tile, p.world * tiles) / tiles;
        for (int t = 1; t < tiles; ++t)
          EXPECT_EQ(weft::gemm_detail::rotated_row_tile(s * tiles + t, first_tile, p.world * tiles) / tiles, shard)
              << "a shard's tiles walk together";
        ++seen[shard];
        if (s == 0) {
          EXPECT_EQ(shard, p.rank);
        } else {
          EXPECT_EQ(push_turn(AgWay::one_gemm, shard, p.rank, p.world), s) << "step " << s;
        }
      }
      for (int q = 0; q < p.world; ++q) EXPECT_EQ(seen[q], 1) << "shard " << q;
    });
  }
}

TEST(AgPlan, RefusesAutomaticPlainStepsAtOneRankAndARankOutsideTheWorld) {
  EXPECT_THROW(ag_plan(AgWay::automatic, 0, 2), weft::Error);
  EXPECT_THROW(ag_plan(AgWay::automatic, 0, 1), weft::Error);
  EXPECT_THROW(ag_plan(AgWay::plain_steps, 0, 1), weft::Error);
  EXPECT_THROW(ag_plan(AgWay::one_gemm, 2, 2), weft::Error);
  EXPECT_THROW(ag_plan(AgWay::one_gemm, -1, 2), weft::Error);
  try {
    ag_plan(AgWay::plain_steps, 0, 1);
    ADD_FAILURE() << "plain_steps at one rank was not refused";
  } catch (const weft::Error& e) {
    EXPECT_NE(std::string(e.what()).find("2 or more ranks"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(ag_plan(AgWay::one_gemm, 0, 1));
  EXPECT_NO_THROW(ag_plan(AgWay::plain_steps, 1, 2));
}

TEST(AgLayout, EveryShardsFlagsAreItsOwnWordsAndFillTheAllocation) {
  for (int world = 1; world <= 8; ++world)
    for (std::int64_t chunks : {1, 2, 4}) {
      const AgLayout layout{world, chunks};
      ASSERT_EQ(layout.flag_words(), world * chunks);
      std::vector<int> owner(static_cast<std::size_t>(layout.flag_words()), -1);
      for (int q = 0; q < world; ++q)
        for (std::int64_t c = 0; c < chunks; ++c) {
          const std::int64_t word = layout.arrived_word(q) + c;
          ASSERT_GE(word, 0);
          ASSERT_LT(word, layout.flag_words());
          EXPECT_EQ(owner[static_cast<std::size_t>(word)], -1) << "world " << world << " shard " << q << " chunk " << c;
          owner[static_cast<std::size_t>(word)] = q;
        }
      for (int owned : owner) EXPECT_GE(owned, 0);
    }
}

// Across nodes (ag_plan_two_level), on every grid of 1-8 nodes x 1-8 GPUs of
// 2 GPUs or more, every GPU: one plain step per shard, its own first; each
// later step waits for its shard's arrival count, blaming the GPU that
// delivers it; and the shards come in the order the counting AllGather
// kernel's blocks wait for them (ag_walk with AgPushWaits::per_hop), so no
// step waits on a shard the kernel reaches after one a later step needs.
TEST(AgPlan, AcrossNodesEveryShardOnceInTheOrderTheTwoLevelAllGatherWaitsForIt) {
  using weft::hierarchy::Act;
  using weft::hierarchy::NodeGrid;
  using weft::hierarchy::Step;
  for (int nodes = 1; nodes <= 8; ++nodes)
    for (int local = 1; local <= 8; ++local) {
      const NodeGrid g{nodes, local};
      if (g.world() < 2) continue;
      for (int gpu = 0; gpu < g.world(); ++gpu) {
        SCOPED_TRACE(testing::Message() << nodes << " nodes of " << local << ", GPU " << gpu);
        const AgPlan p = ag_plan_two_level(g, gpu);
        EXPECT_EQ(p.way, AgWay::plain_steps);
        EXPECT_EQ(p.rank, gpu);
        EXPECT_EQ(p.world, g.world());
        EXPECT_TRUE(p.pushes.empty());  // the kernel moves every shard
        ASSERT_EQ(static_cast<int>(p.steps.size()), g.world());
        EXPECT_EQ(p.steps[0].shard, gpu);
        EXPECT_EQ(p.steps[0].wait, AgWait::none);
        EXPECT_EQ(p.steps[0].wait_from, -1);
        // The kernel's data waits, in order: (shard, the GPU that raises its flag).
        std::vector<std::pair<int, int>> kernel_waits;
        weft::hierarchy::ag_walk(
            g, gpu,
            [&](const Step& s) {
              if (s.act == Act::wait && s.index >= 0) kernel_waits.emplace_back(s.index, s.peer);
            },
            weft::hierarchy::AgPushWaits::per_hop);
        ASSERT_EQ(static_cast<int>(kernel_waits.size()), g.world() - 1);
        std::vector<int> seen(g.world(), 0);
        ++seen[gpu];
        for (int s = 1; s < g.world(); ++s) {
          SCOPED_TRACE(testing::Message() << "step " << s);
          const AgStep& step = p.steps[s];
          EXPECT_EQ(step.gemm, AgGemmKind::shard);
          EXPECT_EQ(step.first_shard, step.shard);
          EXPECT_EQ(step.wait, AgWait::shard_arrivals_before_launch);
          EXPECT_EQ(step.shard, kernel_waits[s - 1].first);
          EXPECT_EQ(step.wait_from, kernel_waits[s - 1].second);
          EXPECT_EQ(step.wait_from, weft::hierarchy::ag_delivery(g, gpu, step.shard).from);
          EXPECT_NE(step.wait_from, gpu);
          ASSERT_GE(step.shard, 0);
          ASSERT_LT(step.shard, g.world());
          ++seen[step.shard];
        }
        for (int q = 0; q < g.world(); ++q) EXPECT_EQ(seen[q], 1) << "shard " << q;
      }
    }
  EXPECT_THROW(ag_plan_two_level(NodeGrid{1, 1}, 0), weft::Error);
  EXPECT_THROW(ag_plan_two_level(NodeGrid{2, 2}, 4), weft::Error);
  EXPECT_THROW(ag_plan_two_level(NodeGrid{2, 2}, -1), weft::Error);
}
