// GEMM+ReduceScatter's ring as data (ops/ring_plan.hpp) at world sizes 1 to 8,
// every fused way: every rank computes every block once, each step adds exactly what the
// previous rank sent it a step earlier, each block ends complete at its owner,
// and the one-launch GEMM's tile walk (gemm/tile_walk.hpp, as its hooked
// scheduler runs it) computes at every step the block the ring sends then.
#include <gtest/gtest.h>

#include <vector>

#include "gemm/tile_walk.hpp"
#include "ops/ring_plan.hpp"

using namespace weft::ops_detail;
using weft::FusedWay;

namespace {

/// The block the tile at position `position` of one launch's walk computes
/// (FusedWay::ring_one_launch), its blocks `tiles_per_block` row tiles each.
/// GemmRs runs that GEMM with GemmArgs::first_row at the first step's block
/// and HookLayout::descending_block_rows = M / W, so the hooked scheduler walks whole
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

/// The per-step ways: the ring with a reporting first step, or a plain one.
FusedWay per_step_way(bool plain_first) { return plain_first ? FusedWay::ring_plain_first : FusedWay::ring_per_step; }

std::vector<RingPlan> plans(FusedWay way, int world, bool caller_ships, bool column_bands = true) {
  std::vector<RingPlan> all;
  for (int r = 0; r < world; ++r) all.push_back(ring_plan(way, r, world, caller_ships, column_bands));
  return all;
}

/// The one send of `step` to rank `rank`'s staging, or null.
const BlockSend* hand_on(const RingStep& step) {
  for (const BlockSend& s : step.sends)
    if (s.to == SendTo::next_staging) return &s;
  return nullptr;
}

// Calls check(plan, plain_first, ships, bands) for every rank's per-step plan
// of every world size 1 to 8, under a trace that names them.
template <class Check>
void for_each_plan(Check check) {
  for (int world = 1; world <= 8; ++world)
    for (bool plain_first : {false, true})
      for (bool ships : {false, true})
        for (bool bands : {false, true})
          for (const RingPlan& p : plans(per_step_way(plain_first), world, ships, bands)) {
            SCOPED_TRACE(testing::Message() << "world " << world << " rank " << p.rank << " plain_first "
                                            << plain_first << " ships " << ships << " bands " << bands);
            check(p, plain_first, ships, bands);
          }
}

}  // namespace

TEST(RingPlan, EveryRankComputesEveryBlockOnceAndEndsWithItsOwn) {
  for_each_plan([](const RingPlan& p, bool, bool, bool) {
    ASSERT_EQ(static_cast<int>(p.steps.size()), p.world);
    std::vector<int> seen(p.world, 0);
    for (const RingStep& s : p.steps) ++seen[s.block];
    for (int b = 0; b < p.world; ++b) EXPECT_EQ(seen[b], 1) << "block " << b;
    // Only the last step writes `out`, and it is this rank's own block.
    for (int s = 0; s < p.world; ++s) EXPECT_EQ(p.steps[s].stores_to_out, s == p.world - 1) << "step " << s;
    EXPECT_EQ(p.steps.back().block, p.rank);
  });
}

TEST(RingPlan, EachStepAddsWhatThePreviousRankSentAStepEarlier) {
  for (int world = 1; world <= 8; ++world)
    for (bool plain_first : {false, true})
      for (bool ships : {false, true}) {
        const std::vector<RingPlan> all = plans(per_step_way(plain_first), world, ships);
        for (const RingPlan& p : all)
          for (int s = 0; s < world; ++s) {
            SCOPED_TRACE(testing::Message() << "world " << world << " rank " << p.rank << " step " << s);
            const RingStep& step = p.steps[s];
            if (s == 0) {
              EXPECT_EQ(step.source_rank, -1) << "nobody sends the first step's block";
              continue;
            }
            ASSERT_GE(step.source_rank, 0);
            const BlockSend* sent = hand_on(all[step.source_rank].steps[s - 1]);
            ASSERT_NE(sent, nullptr) << "the source's previous step hands its block on";
            EXPECT_EQ(sent->rank, p.rank) << "the source's previous step sends to this rank";
            EXPECT_EQ(sent->block, step.block) << "and sends the block this step adds to";
          }
      }
}

TEST(RingPlan, EveryBlockCollectsEveryRanksProductOnceAndEndsAtItsOwner) {
  for (int world = 1; world <= 8; ++world) {
    const std::vector<RingPlan> all = plans(FusedWay::ring_per_step, world, false);
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

// Each step's GEMM is the kind its sends need: a send that waits for stored
// rows follows a GEMM that reports them; the last step reports only where
// the caller ships it; a plain first step's block leaves once the step is
// done, by column band only at 2 ranks with nobody shipping.
TEST(RingPlan, StepsRunTheGemmsTheirSendsNeed) {
  for_each_plan([](const RingPlan& p, bool plain_first, bool ships, bool bands) {
    const RingStep& first = p.steps.front();
    const RingStep& last = p.steps.back();
    for (const RingStep& step : p.steps)
      for (const BlockSend& send : step.sends)
        if (send.when == SendWhen::stored) {
          EXPECT_TRUE(reports_rows(step.gemm)) << "block " << step.block;
        }
    if (p.world == 1) {  // one plain GEMM into out
      EXPECT_EQ(first.gemm, RingGemm::plain);
      EXPECT_TRUE(first.sends.empty());
      return;
    }
    EXPECT_EQ(first.gemm, plain_first ? RingGemm::plain : RingGemm::reporting);
    ASSERT_EQ(first.sends.size(), 1u);
    const SendWhen first_when = !plain_first                       ? SendWhen::stored
                                : bands && p.world == 2 && !ships ? SendWhen::step_done_by_column_band
                                                                  : SendWhen::step_done;
    EXPECT_EQ(first.sends[0].when, first_when);
    for (int s = 1; s + 1 < p.world; ++s) EXPECT_EQ(p.steps[s].gemm, RingGemm::source_reporting) << s;
    const RingGemm last_gemm = ships                           ? RingGemm::source_reporting
                               : plain_first && p.world == 2 ? RingGemm::source_arrival_order
                                                             : RingGemm::source_any_order;
    EXPECT_EQ(last.gemm, last_gemm);
    if (ships) {
      ASSERT_EQ(last.sends.size(), 1u);
      EXPECT_EQ(last.sends[0].to, SendTo::caller);
      EXPECT_EQ(last.sends[0].block, p.rank);
    } else {
      EXPECT_TRUE(last.sends.empty());
    }
  });
}

// One launch: one GEMM over all M rows from the first step's block, whose
// sends hand each block on in the ring's order and end with our own block
// (moved to out, or shipped by the caller): the same blocks, to the same
// ranks, as the per-step ring's.
TEST(RingPlan, OneLaunchSendsWhatThePerStepRingSends) {
  for (int world = 2; world <= 8; ++world)
    for (bool ships : {false, true})
      for (int r = 0; r < world; ++r) {
        SCOPED_TRACE(testing::Message() << "world " << world << " rank " << r << " ships " << ships);
        const RingPlan one = ring_plan(FusedWay::ring_one_launch, r, world, ships, false);
        const RingPlan per_step = ring_plan(FusedWay::ring_per_step, r, world, ships, false);
        ASSERT_EQ(one.steps.size(), 1u);
        const RingStep& whole = one.steps[0];
        EXPECT_EQ(whole.gemm, RingGemm::whole_ring);
        EXPECT_EQ(whole.block, per_step.steps[0].block);
        EXPECT_EQ(whole.source_rank, weft::schedule::wrap(r - 1, world));
        EXPECT_FALSE(whole.stores_to_out);
        ASSERT_EQ(static_cast<int>(whole.sends.size()), world);
        for (int s = 0; s + 1 < world; ++s) {
          const BlockSend* expected = hand_on(per_step.steps[s]);
          ASSERT_NE(expected, nullptr);
          EXPECT_EQ(whole.sends[s].to, SendTo::next_staging);
          EXPECT_EQ(whole.sends[s].block, expected->block) << "send " << s;
          EXPECT_EQ(whole.sends[s].rank, expected->rank) << "send " << s;
          EXPECT_EQ(whole.sends[s].when, SendWhen::stored);
        }
        EXPECT_EQ(whole.sends.back().block, r);
        EXPECT_EQ(whole.sends.back().to, ships ? SendTo::caller : SendTo::out);
      }
}

// Adding in one launch (2 ranks): the peer's block first, stored and sent to
// the peer's out as it is stored; ours added onto what the peer sends us.
TEST(RingPlan, AddingSendsThePeersBlockToItsOutAndAddsOurs) {
  for (bool ships : {false, true})
    for (int r = 0; r < 2; ++r) {
      SCOPED_TRACE(testing::Message() << "rank " << r << " ships " << ships);
      const RingPlan p = ring_plan(FusedWay::one_launch_add, r, 2, ships, false);
      ASSERT_EQ(p.steps.size(), 1u);
      const RingStep& whole = p.steps[0];
      EXPECT_EQ(whole.gemm, RingGemm::whole_adding);
      EXPECT_EQ(whole.block, 1 - r);
      EXPECT_EQ(whole.source_rank, 1 - r);
      ASSERT_EQ(whole.sends.size(), ships ? 2u : 1u);
      EXPECT_EQ(whole.sends[0].to, SendTo::peer_out);
      EXPECT_EQ(whole.sends[0].block, 1 - r);
      EXPECT_EQ(whole.sends[0].rank, 1 - r);
      if (ships) {
        EXPECT_EQ(whole.sends[1].to, SendTo::caller);
      }
    }
}

// At one rank every way is the one plain GEMM into out.
TEST(RingPlan, OneRankRunsOnePlainGemmWhateverTheWay) {
  for (FusedWay way : {FusedWay::ring_per_step, FusedWay::ring_one_launch, FusedWay::ring_plain_first})
    for (bool ships : {false, true}) {
      const RingPlan p = ring_plan(way, 0, 1, ships, true);
      ASSERT_EQ(p.steps.size(), 1u);
      EXPECT_EQ(p.steps[0].gemm, RingGemm::plain);
      EXPECT_TRUE(p.steps[0].stores_to_out);
      EXPECT_TRUE(p.steps[0].sends.empty());
    }
}

// The layout's words and rows: arrival flags and stored-row counters of
// every block in disjoint words of one allocation, blocks' rows tiling the
// [M, N] buffer.
TEST(RingLayout, FlagsCountersAndRowsOfEveryBlockAreDisjoint) {
  for (int world = 1; world <= 8; ++world)
    for (std::int64_t chunks : {1, 3, 8}) {
      const RingLayout l{.world = world, .n = 768, .block_rows = 96 * chunks, .chunks = chunks, .chunk_rows = 96};
      std::vector<int> word_uses(static_cast<std::size_t>(l.flag_words()), 0);
      for (int b = 0; b < world; ++b)
        for (std::int64_t c = 0; c < chunks; ++c) {
          ++word_uses[static_cast<std::size_t>(l.arrived_word(b) + c)];
          ++word_uses[static_cast<std::size_t>(l.stored_word(b) + c)];
        }
      for (int u : word_uses) EXPECT_EQ(u, 1) << "world " << world << " chunks " << chunks;
      EXPECT_EQ(l.chunk_bytes() * static_cast<std::uint64_t>(chunks), l.block_bytes());
      EXPECT_EQ(l.block_offset(world - 1) + l.block_bytes(), l.all_bytes());
      EXPECT_EQ(l.chunk_stored(), static_cast<std::uint64_t>(96 * 768));
    }
}

// One launch (FusedWay::ring_one_launch) computes its blocks in the ring's
// order at every world size: the side stream sends block (r - 1 - s) mod W
// at step s, and waits for nothing the walk reaches later.
TEST(RingPlan, OneLaunchWalksTheRingsOrderAtEveryWorldSize) {
  for (int world = 1; world <= 8; ++world)
    for (int r = 0; r < world; ++r) {
      const std::vector<int> walk = ring_one_launch_walk(r, world);
      const RingPlan p = ring_plan(FusedWay::ring_per_step, r, world, false, false);
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
