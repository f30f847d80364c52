// moe_tp_layout.hpp (private) - the buffers of MoE under tensor parallelism's sequential path, as plain functions.
//
// AgMoe gathers every rank's tokens into fixed-capacity shards: shard s of
// the gathered buffer holds rank s's token count, routing, top-k weights and
// token rows, `capacity` (= max_tokens_per_rank) tokens' room each, whatever
// the rank's count. Gathered token g = s x capacity + t is rank s's token t;
// tokens t >= the shard's count are padding and have no pairs. Fixed shards
// keep every offset host-known (one AllGather of W x shard bytes, no host
// read of the counts) and make MoeRs's ReduceScatter slices exactly the
// shards: slice s of the token-order partial sums is rank s's tokens.
//
// The device sort of the (token, slot) pairs by expert is a counting sort in
// three passes over chunks of kSortChunk gathered tokens (one warp a chunk):
//   count - per chunk, the pairs of each expert, and each pair's position
//           among its chunk's pairs of its expert (tokens ascending, then slots);
//   scan  - per expert, the chunks' counts turned into exclusive prefixes,
//           the expert's total (the grouped GEMM's count) and its first row;
//   place - pair (g, j) of expert e goes to row
//           offset[e] + chunk_prefix[chunk(g)][e] + position.
// Every position is computed, never claimed by an atomic, so the order is
// (rank, token, slot) within each expert whatever the timing: the rows equal
// expert_rows() (moe_tiles.hpp) on the gathered routing. chunked_expert_rows()
// below runs the same three passes on the host (CPU-tested against it).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "moe_tiles.hpp"
#include "weft/device/types.cuh"

namespace weft::moe_detail {

/// Gathered tokens per warp in the sort's count pass.
inline constexpr int kSortChunk = 128;
/// Most experts: the scan runs one expert per thread of one 1024-thread block.
inline constexpr int kMoeTpMaxExperts = 1024;
/// Most top-k slots: a token's slots are the lanes of one warp.
inline constexpr int kMoeTpMaxTopK = 32;

/// Byte offsets inside one rank's shard of the gathered buffer; each region starts 16-byte aligned.
struct ShardLayout {
  std::uint64_t count = 0;    ///< int64: the rank's token count (then 8 bytes unused)
  std::uint64_t topk = 0;     ///< int64 [capacity][top_k]: expert ids, -1 = none
  std::uint64_t weights = 0;  ///< float [capacity][top_k]: top-k weights
  std::uint64_t x = 0;        ///< [capacity][hidden] elements of elem_bytes: token rows
  std::uint64_t bytes = 0;    ///< the shard's size, a multiple of 16: the AllGather's bytes per rank
};

WEFT_HD std::uint64_t align16(std::uint64_t v) { return (v + 15) / 16 * 16; }

WEFT_HD ShardLayout shard_layout(std::int64_t capacity, int top_k, std::int64_t hidden, int elem_bytes) {
  ShardLayout l;
  const auto cap = static_cast<std::uint64_t>(capacity), k = static_cast<std::uint64_t>(top_k);
  l.count = 0;
  l.topk = 16;
  l.weights = align16(l.topk + cap * k * 8);
  l.x = align16(l.weights + cap * k * 4);
  l.bytes = align16(l.x + cap * static_cast<std::uint64_t>(hidden) * static_cast<std::uint64_t>(elem_bytes));
  return l;
}

/// The routing head of a shard: its count, ids and weights at the same
/// offsets as shard_layout's, without the token rows (x = bytes). AgMoe's
/// overlapped path gathers these first and sends the rows on their own.
WEFT_HD ShardLayout head_layout(std::int64_t capacity, int top_k) { return shard_layout(capacity, top_k, 0, 1); }

/// Gathered tokens: world x capacity (padding included).
WEFT_HD std::int64_t gathered_tokens(int world, std::int64_t capacity) { return world * capacity; }
/// Rows of the grouped GEMMs' operands: every gathered token's every slot could be a pair.
WEFT_HD std::int64_t max_pair_rows(int world, std::int64_t capacity, int top_k) {
  return gathered_tokens(world, capacity) * top_k;
}
/// Chunks of the sort's count pass (the last one may be short).
WEFT_HD std::int64_t sort_chunks(int world, std::int64_t capacity) {
  return (gathered_tokens(world, capacity) + kSortChunk - 1) / kSortChunk;
}
/// Gathered token g's rank and its index there.
WEFT_HD int gathered_rank(std::int64_t g, std::int64_t capacity) { return static_cast<int>(g / capacity); }
WEFT_HD std::int64_t gathered_index(std::int64_t g, std::int64_t capacity) { return g % capacity; }

/// The gathered routing as the device sees it: [world x capacity][top_k],
/// rank s's `counts[s]` tokens from `topk[s]` ([counts[s]][top_k]) at rows
/// s x capacity + t, padding -1. What expert_rows() takes as the reference.
inline std::vector<std::int64_t> gathered_routing(const std::vector<std::vector<std::int64_t>>& topk,
                                                  const std::vector<std::int64_t>& counts, std::int64_t capacity,
                                                  int top_k) {
  const int world = static_cast<int>(counts.size());
  std::vector<std::int64_t> g(static_cast<std::size_t>(gathered_tokens(world, capacity)) * top_k, -1);
  for (int s = 0; s < world; ++s)
    std::copy(topk[s].begin(), topk[s].begin() + counts[s] * top_k, g.begin() + s * capacity * top_k);
  return g;
}

/// The device sort's three passes on the host (count, scan, place), for a
/// gathered routing [tokens][k] with ids outside [0, experts) treated as none.
/// Must equal expert_rows() on ids in [-1, experts).
inline ExpertRows chunked_expert_rows(const std::int64_t* topk, std::int64_t tokens, int k, int experts) {
  const std::int64_t chunks = (tokens + kSortChunk - 1) / kSortChunk;
  std::vector<std::int64_t> prefix(static_cast<std::size_t>(chunks) * experts, 0);  // count, then exclusive prefix
  std::vector<std::int64_t> position(static_cast<std::size_t>(tokens) * k, -1);
  for (std::int64_t c = 0; c < chunks; ++c)  // count
    for (std::int64_t g = c * kSortChunk; g < std::min(tokens, (c + 1) * kSortChunk); ++g)
      for (int j = 0; j < k; ++j) {
        const std::int64_t e = topk[g * k + j];
        if (e >= 0 && e < experts) position[g * k + j] = prefix[c * experts + e]++;
      }
  ExpertRows r;
  r.offset.assign(static_cast<std::size_t>(experts) + 1, 0);
  for (int e = 0; e < experts; ++e) {  // scan
    std::int64_t sum = 0;
    for (std::int64_t c = 0; c < chunks; ++c) {
      const std::int64_t v = prefix[c * experts + e];
      prefix[c * experts + e] = sum;
      sum += v;
    }
    r.offset[e + 1] = r.offset[e] + sum;
  }
  r.token.assign(r.offset[experts], -1);
  r.slot.assign(r.offset[experts], -1);
  for (std::int64_t g = 0; g < tokens; ++g)  // place
    for (int j = 0; j < k; ++j) {
      if (position[g * k + j] < 0) continue;
      const std::int64_t e = topk[g * k + j];
      const std::int64_t row = r.offset[e] + prefix[(g / kSortChunk) * experts + e] + position[g * k + j];
      r.token[row] = g;
      r.slot[row] = j;
    }
  return r;
}

}  // namespace weft::moe_detail
