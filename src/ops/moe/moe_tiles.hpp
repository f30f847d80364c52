// moe_tiles.hpp (private) - the routing-to-tile maps of MoE under tensor parallelism, as plain functions.
//
// AllGather + MoE (the up-projection): each rank holds T / W tokens and their
// routing; the gathered tokens feed a grouped GEMM whose rows are the
// (token, expert) pairs sorted by expert, then by token. A row tile can start
// once the shards of every token it reads have arrived: the routing decides
// which shards those are, so the tile-to-source map comes from the routing
// (on the device, from the same functions). Shard s reaches rank `me` at
// arrival step (s - me) mod W (its own first, then r + 1, r + 2, ..., as
// AgGemm's pushes arrive), and the tiles run in the order of the step at
// which their last shard arrives.
//
// MoE + ReduceScatter (the down-projection): the grouped GEMM's rows are
// summed, top-k weighted, back into token order, and each token's sum goes
// to the rank that owns it. A chunk of an owner's tokens can leave once every
// row tile holding one of its pairs has stored: a per-chunk counter of
// stored tiles, complete at chunk_tile_counts(...).
//
// Row tiles are per expert (a tile never spans two experts, as in a grouped
// GEMM), numbered expert by expert; the last tile of an expert may be short.
//
// Source regions: within each expert the rows are in token order, so rank
// s's pairs of expert e are one contiguous run of rows, region (s, e). One
// grouped GEMM over rank s's regions (GroupedGemmArgs' per-expert counts and
// first rows) computes every pair that reads shard s, and can start as soon
// as shard s has arrived: the coarse-grained overlap of AllGather + MoE, one
// run per arriving shard, with no tile waiting inside the GEMM.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "weft/device/types.cuh"

namespace weft::moe_detail {

/// The rank that holds token t when T tokens are split evenly over W ranks
/// (tokens_per_rank = T / W; the gathered matrix is the shards in rank order).
WEFT_HD int token_owner(std::int64_t token, std::int64_t tokens_per_rank) {
  return static_cast<int>(token / tokens_per_rank);
}

/// The step at which rank `me` has shard `src`: 0 for its own, then one more per ring hop.
WEFT_HD int arrival_step(int src, int me, int world) { return ((src - me) % world + world) % world; }

/// The (token, expert) pairs sorted by expert, then token, then top-k slot:
/// row i of the grouped GEMM reads gathered token `token[i]` (slot `slot[i]`);
/// expert e's rows are [offset[e], offset[e + 1]).
struct ExpertRows {
  std::vector<std::int64_t> offset;  ///< [E + 1]
  std::vector<std::int64_t> token;   ///< [pairs]
  std::vector<std::int32_t> slot;    ///< [pairs]
};

/// Sorts the pairs of the gathered routing `topk` ([T][k], -1 = none) by expert (a counting sort, stable in token order).
inline ExpertRows expert_rows(const std::int64_t* topk, std::int64_t tokens, int k, int experts) {
  ExpertRows r;
  r.offset.assign(static_cast<std::size_t>(experts) + 1, 0);
  for (std::int64_t i = 0; i < tokens * k; ++i)
    if (topk[i] >= 0) ++r.offset[topk[i] + 1];
  for (int e = 0; e < experts; ++e) r.offset[e + 1] += r.offset[e];
  r.token.resize(r.offset[experts]);
  r.slot.resize(r.offset[experts]);
  std::vector<std::int64_t> next(r.offset.begin(), r.offset.end() - 1);
  for (std::int64_t t = 0; t < tokens; ++t)
    for (int j = 0; j < k; ++j) {
      const std::int64_t e = topk[t * k + j];
      if (e < 0) continue;
      r.token[next[e]] = t;
      r.slot[next[e]] = j;
      ++next[e];
    }
  return r;
}

/// One row tile of the grouped GEMM: expert `expert`'s rows [row_begin, row_end) (global row numbers).
struct RowTile {
  int expert;
  std::int64_t row_begin, row_end;
};

/// The row tiles, expert by expert, `tile_m` rows each (an expert's last one may be short; none for an empty expert).
inline std::vector<RowTile> row_tiles(const ExpertRows& rows, int tile_m) {
  std::vector<RowTile> tiles;
  const int experts = static_cast<int>(rows.offset.size()) - 1;
  for (int e = 0; e < experts; ++e)
    for (std::int64_t b = rows.offset[e]; b < rows.offset[e + 1]; b += tile_m)
      tiles.push_back({e, b, std::min<std::int64_t>(b + tile_m, rows.offset[e + 1])});
  return tiles;
}

/// AllGather + MoE: the arrival step after which every shard a tile reads is
/// here (the latest of its tokens' owners' arrival steps).
inline int tile_ready_step(const ExpertRows& rows, const RowTile& tile, std::int64_t tokens_per_rank, int me,
                           int world) {
  int step = 0;
  for (std::int64_t i = tile.row_begin; i < tile.row_end; ++i)
    step = std::max(step, arrival_step(token_owner(rows.token[i], tokens_per_rank), me, world));
  return step;
}

/// AllGather + MoE: the order rank `me` runs its tiles in, by ready step
/// (ties in tile order); tiles of step 0 read only this rank's own tokens.
inline std::vector<std::int32_t> tile_order(const ExpertRows& rows, const std::vector<RowTile>& tiles,
                                            std::int64_t tokens_per_rank, int me, int world) {
  std::vector<std::int32_t> order(tiles.size());
  std::vector<int> step(tiles.size());
  for (std::size_t i = 0; i < tiles.size(); ++i) {
    order[i] = static_cast<std::int32_t>(i);
    step[i] = tile_ready_step(rows, tiles[i], tokens_per_rank, me, world);
  }
  std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) { return step[a] < step[b]; });
  return order;
}

/// The first row in [begin, end) whose gathered token is at least
/// `first_token`, the rows' tokens ascending (one expert's rows): a lower
/// bound by bisection. Once the sort has placed every row, a device thread per
/// (rank, expert) region finds its first row this way in row_token, with no atomics.
template <class Token>
WEFT_HD std::int64_t first_row_at_or_after(const Token* row_token, std::int64_t begin, std::int64_t end,
                                           std::int64_t first_token) {
  while (begin < end) {
    const std::int64_t mid = begin + (end - begin) / 2;
    if (static_cast<std::int64_t>(row_token[mid]) < first_token) begin = mid + 1;
    else end = mid;
  }
  return begin;
}

/// Every rank's pairs of every expert as rows: region (s, e) is rows
/// [first[s x E + e], first[s x E + e] + count[s x E + e]). For rank s,
/// (count[s x E ...], first[s x E ...]) are the counts and first rows of the
/// grouped GEMM that computes the pairs reading shard s.
struct SourceRegions {
  int world = 0, experts = 0;
  std::vector<std::int32_t> count, first;  ///< [world][experts]
};

/// The source regions of sorted rows, rank s holding gathered tokens
/// [s x tokens_per_rank, (s + 1) x tokens_per_rank).
inline SourceRegions source_regions(const ExpertRows& rows, std::int64_t tokens_per_rank, int world) {
  SourceRegions r;
  r.world = world;
  r.experts = static_cast<int>(rows.offset.size()) - 1;
  r.count.resize(static_cast<std::size_t>(world) * r.experts);
  r.first.resize(r.count.size());
  for (int e = 0; e < r.experts; ++e)
    for (int s = 0; s < world; ++s) {
      const std::int64_t begin = first_row_at_or_after(rows.token.data(), rows.offset[e], rows.offset[e + 1],
                                                       s * tokens_per_rank);
      const std::int64_t end = first_row_at_or_after(rows.token.data(), rows.offset[e], rows.offset[e + 1],
                                                     (s + 1) * tokens_per_rank);
      r.first[static_cast<std::size_t>(s) * r.experts + e] = static_cast<std::int32_t>(begin);
      r.count[static_cast<std::size_t>(s) * r.experts + e] = static_cast<std::int32_t>(end - begin);
    }
  return r;
}

/// MoE + ReduceScatter: the chunk of token t when each owner's T / W tokens
/// leave in `chunks_per_rank` chunks (chunk c of owner o is o x chunks_per_rank + c).
WEFT_HD std::int64_t token_chunk(std::int64_t token, std::int64_t tokens_per_rank, int chunks_per_rank) {
  const std::int64_t owner = token / tokens_per_rank;
  const std::int64_t per_chunk = (tokens_per_rank + chunks_per_rank - 1) / chunks_per_rank;
  return owner * chunks_per_rank + (token - owner * tokens_per_rank) / per_chunk;
}

/// MoE + ReduceScatter: for every chunk, how many row tiles hold one of its
/// pairs (each tile counted once per chunk): its counter's complete value.
inline std::vector<std::int32_t> chunk_tile_counts(const ExpertRows& rows, const std::vector<RowTile>& tiles,
                                                   std::int64_t tokens_per_rank, int world, int chunks_per_rank) {
  std::vector<std::int32_t> counts(static_cast<std::size_t>(world) * chunks_per_rank, 0);
  std::vector<std::int64_t> seen_by(counts.size(), -1);  // the last tile that counted the chunk
  for (std::size_t t = 0; t < tiles.size(); ++t)
    for (std::int64_t i = tiles[t].row_begin; i < tiles[t].row_end; ++i) {
      const std::int64_t c = token_chunk(rows.token[i], tokens_per_rank, chunks_per_rank);
      if (seen_by[c] != static_cast<std::int64_t>(t)) {
        seen_by[c] = static_cast<std::int64_t>(t);
        ++counts[c];
      }
    }
  return counts;
}

}  // namespace weft::moe_detail
