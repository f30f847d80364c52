// GEMM+ReduceScatter's ring as data (ops/ring_plan.hpp) at world sizes 1 to 8:
// every rank computes every block once, each step adds exactly what the
// previous rank sent it a step earlier, each block ends complete at its owner,
// and the one-launch GEMM's tile walk (gemm/tile_walk.hpp, as its hooked
// scheduler runs it) computes at every step the block the ring sends then.
#include <gtest/gtest.h>

#include <vector>

#include "gemm/tile_walk.hpp"
#include "ops/ring_plan.hpp"

using namespace weft::ops_detail;

namespace {

/// The block the tile at position `position` of one launch's walk computes
/// (FusedWay::ring_one_launch), its blocks `tiles_per_block` row tiles each.
/// GemmRs runs that GEMM with GemmArgs::first_row at the first step's block
/// and descending_block_rows = M / W, so the hooked scheduler walks whole
/// blocks down from it (src/gemm/tile_walk.hpp): the block the ring sends at step
/// s, (r - 1 - s) mod W, is the one its tiles compute at step s. (An ascending
/// walk agrees with the sends at 1 and 2 ranks only; from 3 on each rank's
/// GEMM would reach last the block its side stream must send second, and the
/// ranks would wait on each other in a cycle.)
int ring_one_launch_block(int rank, int world, int position, int tiles_per_block) {
  return weft::gemm_detail::descending_walk_block(position, weft::schedule::ring_gemm_block(rank, 0, world),
                                                  tiles_per_block, world);
}

/// The blocks one launch's tiles walk, in order, a block per step.
std::vector<int> ring_one_launch_walk(int rank, int world) {
  std::vector<int> blocks;
  for (int step = 0; step < world; ++step) blocks.push_back(ring_one_launch_block(rank, world, step, 1));
  return blocks;
}

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

// One launch (FusedWay::ring_one_launch) computes its blocks in the ring's
// order at every world size: the side stream sends block (r - 1 - s) mod W
// at step s, and waits for nothing the walk reaches later.
TEST(RingPlan, OneLaunchWalksTheRingsOrderAtEveryWorldSize) {
  for (int world = 1; world <= 8; ++world)
    for (int r = 0; r < world; ++r) {
      const std::vector<int> walk = ring_one_launch_walk(r, world);
      const RingPlan p = ring_per_step_plan(r, world, false, false);
      ASSERT_EQ(walk.size(), p.steps.size());
      for (int s = 0; s < world; ++s)
        EXPECT_EQ(walk[s], p.steps[s].block) << "world " << world << " rank " << r << " step " << s;
    }
}

// The walk as the hooked scheduler takes it: position t of the walk (in row
// tiles, the order CUTLASS's persistent scheduler hands them out along N) is
// row tile descending_walk_row_tile(t, ...) of the GEMM over all M rows. For
// every world size, rank and block height, each tile lies in the block the
// ring computes at step t / tiles_per_block, and each row tile comes once.
TEST(RingPlan, OneLaunchTilesComputeEachStepsBlockAndEveryTileOnce) {
  for (int world = 1; world <= 8; ++world)
    for (int tiles_per_block : {1, 2, 3, 4, 8, 16, 31})
      for (int r = 0; r < world; ++r) {
        SCOPED_TRACE(testing::Message() << "world " << world << " rank " << r << " tiles per block "
                                        << tiles_per_block);
        // As GemmRs asks for it: first_row at the first step's block.
        const int first_block = weft::schedule::ring_gemm_block(r, 0, world);
        const int tiles = world * tiles_per_block;
        std::vector<int> visits(tiles, 0);
        for (int t = 0; t < tiles; ++t) {
          const int step = t / tiles_per_block;
          const int row_tile = weft::gemm_detail::descending_walk_row_tile(t, first_block, tiles_per_block, world);
          ASSERT_GE(row_tile, 0) << "position " << t;
          ASSERT_LT(row_tile, tiles) << "position " << t;
          ++visits[row_tile];
          const int expected = weft::schedule::ring_gemm_block(r, step, world);
          EXPECT_EQ(row_tile / tiles_per_block, expected) << "position " << t << " step " << step;
          EXPECT_EQ(weft::gemm_detail::descending_walk_block(t, first_block, tiles_per_block, world), expected)
              << "position " << t;
          EXPECT_EQ(row_tile % tiles_per_block, t % tiles_per_block) << "a block's tiles ascend";
        }
        for (int tile = 0; tile < tiles; ++tile) EXPECT_EQ(visits[tile], 1) << "row tile " << tile;
      }
}

// At 2 ranks the descending walk is the rotated ascending one: the tile order
// at 2 ranks does not depend on which of the two the scheduler takes.
TEST(RingPlan, OneLaunchWalkAtTwoRanksIsTheRotatedOne) {
  for (int tiles_per_block : {1, 2, 4, 16})
    for (int r = 0; r < 2; ++r) {
      const int first_block = weft::schedule::ring_gemm_block(r, 0, 2);
      for (int t = 0; t < 2 * tiles_per_block; ++t)
        EXPECT_EQ(weft::gemm_detail::descending_walk_row_tile(t, first_block, tiles_per_block, 2),
                  weft::gemm_detail::rotated_row_tile(t, first_block * tiles_per_block, 2 * tiles_per_block))
            << "rank " << r << " tiles per block " << tiles_per_block << " position " << t;
    }
}

// CTAs of a cluster along M take consecutive positions from an even one; a
// block of whole clusters keeps them on consecutive row tiles, from an even
// one, so they go on sharing their B tile.
TEST(TileWalk, DescendingWalkKeepsClustersTogether) {
  for (int world = 1; world <= 8; ++world)
    for (int tiles_per_block : {2, 4, 6, 16})
      for (int first_block = 0; first_block < world; ++first_block)
        for (int t = 0; t < world * tiles_per_block; t += 2) {
          const int lead = weft::gemm_detail::descending_walk_row_tile(t, first_block, tiles_per_block, world);
          EXPECT_EQ(lead % 2, 0) << "world " << world << " position " << t;
          EXPECT_EQ(weft::gemm_detail::descending_walk_row_tile(t + 1, first_block, tiles_per_block, world), lead + 1)
              << "world " << world << " position " << t;
        }
}

// The other hooked plans keep the rotated walk (AllGather+GEMM from its own
// shard, the adding way from the peer's block): every row tile once, from the
// rotation on.
TEST(TileWalk, RotatedWalkStartsAtItsRowTileAndVisitsEachOnce) {
  for (int tiles_m : {1, 2, 5, 16, 64})
    for (int rotate = 0; rotate < tiles_m; ++rotate) {
      std::vector<int> visits(tiles_m, 0);
      for (int t = 0; t < tiles_m; ++t) ++visits[weft::gemm_detail::rotated_row_tile(t, rotate, tiles_m)];
      EXPECT_EQ(weft::gemm_detail::rotated_row_tile(0, rotate, tiles_m), rotate);
      for (int tile = 0; tile < tiles_m; ++tile) EXPECT_EQ(visits[tile], 1) << tiles_m << " " << rotate << " " << tile;
    }
}
