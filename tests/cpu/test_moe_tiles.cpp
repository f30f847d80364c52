// MoE under tensor parallelism: the routing-to-tile maps (src/ops/moe/moe_tiles.hpp),
// on the CPU at world sizes 1 to 8, for uniform, Zipf, one-hot and skewed
// routings: the grouped GEMM's rows are exactly the routing's pairs in expert
// order, its row tiles cover them once, AllGather + MoE's tile order starts
// each tile only once every shard it reads has arrived, its source regions
// hold exactly each rank's pairs of each expert in GroupedGemm's first-row
// rules, and MoE + ReduceScatter's chunk counters complete exactly when a
// chunk's last pair is stored.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "ops/moe/moe_tiles.hpp"

namespace {

using namespace weft::moe_detail;

enum class Routing { uniform, zipf, one_hot, skewed, rank_to_one_expert, with_none };
const char* name(Routing r) {
  const char* names[] = {"uniform", "zipf", "one-hot", "skewed", "a rank's tokens to one expert", "with -1"};
  return names[static_cast<int>(r)];
}

// k distinct experts per token (fewer where E < k), drawn as the routing says.
std::vector<std::int64_t> route(std::mt19937_64& rng, std::int64_t tokens, std::int64_t per_rank, int k, int experts,
                                Routing how) {
  std::vector<double> weight(experts, 1.0);
  if (how == Routing::zipf)
    for (int e = 0; e < experts; ++e) weight[e] = 1.0 / std::pow(e + 1.0, 1.2);
  std::vector<std::int64_t> topk(static_cast<std::size_t>(tokens) * k, -1);
  for (std::int64_t t = 0; t < tokens; ++t) {
    std::vector<double> w = weight;
    if (how == Routing::skewed && t % 2 == 0) w[0] = 1e9;
    const bool one = how == Routing::one_hot || (how == Routing::rank_to_one_expert && t / per_rank == 0);
    for (int j = 0; j < k && j < experts; ++j) {
      if (one) {
        topk[t * k] = experts - 1;
        break;
      }
      std::discrete_distribution<int> pick(w.begin(), w.end());
      const int e = pick(rng);
      topk[t * k + j] = e;
      w[e] = 0;  // distinct within the token
      if (how == Routing::with_none && rng() % 4 == 0) topk[t * k + j] = -1;
    }
  }
  return topk;
}

void check(int world, int experts, int k, std::int64_t per_rank, int tile_m, int chunks, Routing how,
           std::mt19937_64& rng) {
  const std::int64_t tokens = per_rank * world;
  const std::vector<std::int64_t> topk = route(rng, tokens, per_rank, k, experts, how);
  const ExpertRows rows = expert_rows(topk.data(), tokens, k, experts);

  // Rows: the valid pairs, each once, by expert then token then slot.
  std::vector<std::tuple<std::int64_t, std::int64_t, int>> expected;  // (expert, token, slot)
  for (std::int64_t t = 0; t < tokens; ++t)
    for (int j = 0; j < k; ++j)
      if (topk[t * k + j] >= 0) expected.emplace_back(topk[t * k + j], t, j);
  std::sort(expected.begin(), expected.end());
  ASSERT_EQ(rows.offset.back(), static_cast<std::int64_t>(expected.size()));
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const auto [e, t, j] = expected[i];
    ASSERT_EQ(rows.token[i], t) << "row " << i;
    ASSERT_EQ(rows.slot[i], j) << "row " << i;
    ASSERT_GE(static_cast<std::int64_t>(i), rows.offset[e]);
    ASSERT_LT(static_cast<std::int64_t>(i), rows.offset[e + 1]) << "row " << i << " outside expert " << e << "'s rows";
  }

  // Row tiles: cover every row once, one expert each, short only at an expert's end.
  const std::vector<RowTile> tiles = row_tiles(rows, tile_m);
  std::int64_t next_row = 0;
  for (const RowTile& t : tiles) {
    ASSERT_EQ(t.row_begin, next_row) << "tiles leave a gap or overlap";
    ASSERT_GT(t.row_end, t.row_begin);
    ASSERT_LE(t.row_end - t.row_begin, tile_m);
    ASSERT_GE(t.row_begin, rows.offset[t.expert]);
    ASSERT_LE(t.row_end, rows.offset[t.expert + 1]) << "a tile spans two experts";
    if (t.row_end - t.row_begin < tile_m) {
      ASSERT_EQ(t.row_end, rows.offset[t.expert + 1]);
    }
    next_row = t.row_end;
  }
  ASSERT_EQ(next_row, rows.offset.back());

  // Source regions: region (s, e) is exactly rank s's pairs of expert e (counted
  // directly), the regions tile every row once, and each rank's regions keep
  // GroupedGemm's first-row rules (ascending, apart, within the rows).
  const SourceRegions regions = source_regions(rows, per_rank, world);
  ASSERT_EQ(regions.count.size(), static_cast<std::size_t>(world) * experts);
  std::vector<std::int32_t> direct(regions.count.size(), 0);
  for (std::int64_t t = 0; t < tokens; ++t)
    for (int j = 0; j < k; ++j)
      if (topk[t * k + j] >= 0) ++direct[(t / per_rank) * experts + topk[t * k + j]];
  std::vector<int> covered(rows.offset.back(), 0);
  for (int s = 0; s < world; ++s) {
    std::int64_t previous_end = 0;
    for (int e = 0; e < experts; ++e) {
      const std::int64_t first = regions.first[s * experts + e], count = regions.count[s * experts + e];
      ASSERT_EQ(count, direct[s * experts + e]) << "rank " << s << "'s pairs of expert " << e;
      ASSERT_GE(first, previous_end) << "rank " << s << ", expert " << e << ": out of order or overlapping";
      ASSERT_GE(first, rows.offset[e]);
      ASSERT_LE(first + count, rows.offset[e + 1]) << "a region leaves its expert's rows";
      for (std::int64_t r = first; r < first + count; ++r) {
        ASSERT_EQ(rows.token[r] / per_rank, s) << "row " << r << " of region (" << s << ", " << e << ")";
        ++covered[r];
      }
      previous_end = first + count;
    }
  }
  for (std::size_t r = 0; r < covered.size(); ++r) ASSERT_EQ(covered[r], 1) << "row " << r << " in how many regions";

  const std::vector<std::int32_t> counts = chunk_tile_counts(rows, tiles, per_rank, world, chunks);
  for (int me = 0; me < world; ++me) {
    // AllGather + MoE: the order is a permutation of the tiles, by the step
    // at which their last shard arrives; no tile reads a shard not yet there.
    const std::vector<std::int32_t> order = tile_order(rows, tiles, per_rank, me, world);
    ASSERT_EQ(order.size(), tiles.size());
    std::vector<int> seen(tiles.size(), 0);
    int step = 0;
    for (std::int32_t i : order) {
      ASSERT_EQ(seen[i]++, 0) << "tile " << i << " twice in the order";
      const int ready = tile_ready_step(rows, tiles[i], per_rank, me, world);
      ASSERT_GE(ready, step) << "the order goes back to an earlier arrival step";
      step = ready;
      int latest = 0;
      for (std::int64_t r = tiles[i].row_begin; r < tiles[i].row_end; ++r) {
        const int owner = static_cast<int>(rows.token[r] / per_rank);
        latest = std::max(latest, arrival_step(owner, me, world));
        if (ready == 0) {
          ASSERT_EQ(owner, me) << "a step-0 tile reads another rank's token";
        }
      }
      ASSERT_EQ(ready, latest);
    }

    // MoE + ReduceScatter: run the tiles in this order; a chunk's counter
    // (one per tile touching it) completes exactly when its last pair is stored.
    std::vector<std::int32_t> counter(counts.size(), 0);
    std::vector<std::int64_t> pairs_left(counts.size(), 0);
    for (std::int64_t t = 0; t < tokens; ++t)
      for (int j = 0; j < k; ++j)
        if (topk[t * k + j] >= 0) ++pairs_left[token_chunk(t, per_rank, chunks)];
    for (std::int32_t i : order) {
      std::set<std::int64_t> touched;
      for (std::int64_t r = tiles[i].row_begin; r < tiles[i].row_end; ++r) {
        const std::int64_t c = token_chunk(rows.token[r], per_rank, chunks);
        touched.insert(c);
        --pairs_left[c];
      }
      for (std::int64_t c : touched) {
        ++counter[c];
        ASSERT_LE(counter[c], counts[c]);
        ASSERT_EQ(counter[c] == counts[c], pairs_left[c] == 0)
            << "chunk " << c << ": counter " << counter[c] << " of " << counts[c] << ", pairs left " << pairs_left[c];
      }
    }
    for (std::size_t c = 0; c < counts.size(); ++c) ASSERT_EQ(pairs_left[c], 0);
  }
}

TEST(MoeTiles, ChunksAreEachOwnersTokensInOrder) {
  for (std::int64_t per_rank : {1, 7, 1001})
    for (int chunks : {1, 3, 4}) {
      std::int64_t prev = -1;
      for (std::int64_t t = 0; t < 3 * per_rank; ++t) {
        const std::int64_t c = token_chunk(t, per_rank, chunks);
        EXPECT_EQ(c / chunks, t / per_rank) << "a chunk holds one owner's tokens";
        EXPECT_GE(c, prev);
        prev = c;
      }
    }
  EXPECT_EQ(arrival_step(3, 3, 4), 0);
  EXPECT_EQ(arrival_step(0, 3, 4), 1) << "rank 3 has rank 0's shard after one hop";
  EXPECT_EQ(arrival_step(2, 3, 4), 3);
}

TEST(MoeTiles, RoutingToTileMapsAtWorldSizesOneToEight) {
  std::mt19937_64 rng(0x3e);
  int cases = 0;
  for (int world = 1; world <= 8; ++world)
    for (int experts : {8, 64})
      for (int k : {1, 2, 8})
        for (std::int64_t per_rank : {std::int64_t{1}, std::int64_t{37}, std::int64_t{1001}})
          for (Routing how : {Routing::uniform, Routing::zipf, Routing::one_hot, Routing::skewed,
                              Routing::rank_to_one_expert, Routing::with_none}) {
            if (per_rank == 1001 && (k == 8 || world > 4)) continue;  // the largest cases, at a few sizes
            SCOPED_TRACE(testing::Message() << "W " << world << " E " << experts << " k " << k << " T/W " << per_rank
                                            << " " << name(how));
            check(world, experts, k, per_rank, 128, 4, how, rng);
            if (HasFatalFailure()) return;
            ++cases;
          }
  EXPECT_GE(cases, 500);
}

}  // namespace
