// ep_layout.hpp (private) - the index maps of expert-parallel dispatch and combine, as plain functions.
//
// The semantics are DeepEP's, so that its users can switch:
//   - E experts over W ranks, E / W consecutive experts per rank;
//   - token t of a source rank lists k experts, topk[t][j] (-1: none), each at most once;
//   - dispatch sends a token once to each rank that owns one of its experts;
//   - a receiver lays its (token, expert) pairs out expert-major: grouped by
//     local expert, then by source rank, then in the source's token order,
//     which is what a grouped GEMM over the local experts reads;
//   - combine returns to each source, in its token order,
//       out[t]        = sum over destination ranks r, ascending, of partial[t][r]
//       partial[t][r] = sum over slots j, ascending, with owner(topk[t][j]) = r, of w[t][j] x y(t, topk[t][j])
//     a fixed order, so that results are bitwise repeatable.
//
// Two receive layouts:
//   - throughput mode: sized from the counts, which the ranks exchange once
//     ([W sources][E] pairs, [W sources][W] tokens); a pair's row is
//     expert_base + source_base + its position among its source's pairs for that expert;
//   - low-latency mode: fixed, [local experts][W x max_tokens] rows, so no
//     count needs to be known before the data moves; a pair's row is
//     (local expert, source, position).
// Across nodes (two hops, hierarchy.hpp's ep_two_hop and ep_walk) a token
// crosses the NIC once per remote node it goes to, into a rail staging on the
// GPU of its own local rank there, with a RailRecord; that GPU forwards it to
// the receivers' staging rows above, and returns the node's sum of its
// partials to the source's return rows. Both are sized from one more count
// the ranks exchange, [W sources][N nodes] tokens.
// The kernels (device) and the CPU tests (host, world sizes 1 to 8, grids of
// 1 to 8 nodes) call the same functions, as schedule.hpp's maps.
#pragma once

#include <cstdint>
#include <vector>

#include "../hierarchy.hpp"
#include "weft/device/types.cuh"

namespace weft::moe_detail {

/// fp8 dispatch (both modes): channels per float scale, DeepEP's layout.
inline constexpr int kFp8ScaleChannels = 128;

/// Where experts live: `experts` over `world` ranks, experts / world consecutive ones per rank.
struct ExpertPlacement {
  int experts = 0;
  int world = 1;

  WEFT_HD int per_rank() const { return experts / world; }
  /// The rank that holds expert e.
  WEFT_HD int owner(int expert) const { return expert / per_rank(); }
  /// Expert e's index among its owner's experts.
  WEFT_HD int local(int expert) const { return expert - owner(expert) * per_rank(); }
  /// The global id of rank r's local expert e.
  WEFT_HD int global(int rank, int local_expert) const { return rank * per_rank() + local_expert; }
};

/// "" if `experts` experts can be placed on `world` ranks, else what was expected.
inline const char* placement_error(int experts, int world) {
  if (world < 1) return "the world size must be at least 1";
  if (experts < 1) return "the number of experts must be at least 1";
  if (experts % world != 0) return "the number of experts must be a multiple of the world size (E / W per rank)";
  return "";
}

/// What a token's top-k row can be wrong by (reported with the token's index).
enum class RowError : int { none = 0, expert_out_of_range, expert_twice };

/// The distinct ranks that token row `topk` (k entries, -1 = none) goes to,
/// ascending, written to ranks[0..n) (room for k); returns n. An entry
/// outside [-1, E) or an expert listed twice sets `error` and returns 0.
WEFT_HD int token_destinations(const std::int64_t* topk, int k, ExpertPlacement p, int* ranks, RowError& error) {
  error = RowError::none;
  int n = 0;
  for (int j = 0; j < k; ++j) {
    const std::int64_t e = topk[j];
    if (e == -1) continue;
    if (e < -1 || e >= p.experts) {
      error = RowError::expert_out_of_range;
      return 0;
    }
    for (int i = 0; i < j; ++i) {
      if (topk[i] == e) {
        error = RowError::expert_twice;
        return 0;
      }
    }
    const int r = p.owner(static_cast<int>(e));
    // Insert r into the ascending ranks[0..n), once.
    int at = n;
    while (at > 0 && ranks[at - 1] > r) --at;
    if (at > 0 && ranks[at - 1] == r) continue;
    for (int i = n; i > at; --i) ranks[i] = ranks[i - 1];
    ranks[at] = r;
    ++n;
  }
  return n;
}

/// The throughput-mode row of source `src`'s pairs for local expert
/// `local_expert` on rank `rank`, before its position among them:
///   sum over local experts e' < local_expert and all sources of their pairs,
///   + sum over sources s' < src of their pairs for this expert.
/// `pairs` is [W sources][E], each source's pairs per expert (exchanged once).
WEFT_HD std::int64_t receive_pair_base(const std::int32_t* pairs, ExpertPlacement p, int rank, int local_expert,
                                       int src) {
  std::int64_t base = 0;
  for (int e = 0; e < local_expert; ++e)
    for (int s = 0; s < p.world; ++s) base += pairs[static_cast<std::int64_t>(s) * p.experts + p.global(rank, e)];
  for (int s = 0; s < src; ++s) base += pairs[static_cast<std::int64_t>(s) * p.experts + p.global(rank, local_expert)];
  return base;
}

/// Rows of rank `rank`'s expert-major receive buffer that hold local expert
/// `local_expert`'s pairs: [receive_pair_base(..., local_expert, 0), that + this).
WEFT_HD std::int64_t receive_expert_rows(const std::int32_t* pairs, ExpertPlacement p, int rank, int local_expert) {
  std::int64_t rows = 0;
  for (int s = 0; s < p.world; ++s) rows += pairs[static_cast<std::int64_t>(s) * p.experts + p.global(rank, local_expert)];
  return rows;
}

/// The throughput-mode row of source `src`'s first token on rank `rank`, in
/// its token-major receive buffer (one row per token and receiving rank):
/// sum over sources s' < src of the tokens they send to `rank`.
/// `tokens` is [W sources][W destinations].
WEFT_HD std::int64_t receive_token_base(const std::int32_t* tokens, int world, int rank, int src) {
  std::int64_t base = 0;
  for (int s = 0; s < src; ++s) base += tokens[static_cast<std::int64_t>(s) * world + rank];
  return base;
}

/// The low-latency row of a pair: local expert `local_expert`, from source
/// `src`, at `position` among that source's pairs for the expert (< max_tokens),
/// in [local experts][W x max_tokens].
WEFT_HD std::int64_t low_latency_row(ExpertPlacement p, std::int64_t max_tokens, int local_expert, int src,
                                     std::int64_t position) {
  return (static_cast<std::int64_t>(local_expert) * p.world + src) * max_tokens + position;
}

/// One source rank's routing, counted: what the layout step gives (DeepEP's
/// get_dispatch_layout, plus each token's and pair's position, which a
/// dispatch kernel gets from a scan). Host form, for plans and tests.
struct SourceLayout {
  std::vector<std::int32_t> tokens_per_rank;   ///< [W]: tokens sent to each rank (once per token)
  std::vector<std::int32_t> pairs_per_expert;  ///< [E]: (token, expert) pairs per expert
  std::vector<std::int32_t> rank_position;     ///< [T][W]: the token's index among those sent to the rank, -1 if not sent
  std::vector<std::int32_t> pair_position;     ///< [T][k]: the pair's index among the source's pairs for its expert, -1 if none
  std::int64_t bad_token = -1;                 ///< the first token whose row is wrong, -1 if none
  RowError bad_row = RowError::none;
};

/// Counts one source's routing `topk` ([T][k]).
inline SourceLayout source_layout(const std::int64_t* topk, std::int64_t tokens, int k, ExpertPlacement p) {
  SourceLayout l;
  l.tokens_per_rank.assign(p.world, 0);
  l.pairs_per_expert.assign(p.experts, 0);
  l.rank_position.assign(static_cast<std::size_t>(tokens) * p.world, -1);
  l.pair_position.assign(static_cast<std::size_t>(tokens) * k, -1);
  std::vector<int> ranks(static_cast<std::size_t>(k > 0 ? k : 1));
  for (std::int64_t t = 0; t < tokens; ++t) {
    const std::int64_t* row = topk + t * k;
    RowError error;
    const int n = token_destinations(row, k, p, ranks.data(), error);
    if (error != RowError::none) {
      if (l.bad_token < 0) {
        l.bad_token = t;
        l.bad_row = error;
      }
      continue;
    }
    for (int i = 0; i < n; ++i) l.rank_position[t * p.world + ranks[i]] = l.tokens_per_rank[ranks[i]]++;
    for (int j = 0; j < k; ++j)
      if (row[j] >= 0) l.pair_position[t * k + j] = l.pairs_per_expert[row[j]]++;
  }
  return l;
}

// ---- across nodes: the rail staging, the record a token carries, the return rows ----

using hierarchy::NodeGrid;

/// The row of rail peer `from`'s first token in `gpu`'s rail staging (token-major: by the
/// sender's node, then its token order): the tokens for gpu's node of the rail peers on the
/// nodes before from's. `node_tokens` is [W sources][nodes]; `from` is on gpu's rail, on another node.
WEFT_HD std::int64_t rail_receive_base(const std::int32_t* node_tokens, NodeGrid g, int gpu, int from) {
  const int node = g.node_of(gpu), l = g.local_of(gpu);
  std::int64_t base = 0;
  for (int m = 0; m < g.node_of(from); ++m)
    if (m != node) base += node_tokens[static_cast<std::int64_t>(g.rank(m, l)) * g.nodes + node];
  return base;
}

/// Rows of `gpu`'s rail staging: the tokens its rail peers send to its node.
WEFT_HD std::int64_t rail_receive_rows(const std::int32_t* node_tokens, NodeGrid g, int gpu) {
  std::int64_t rows = 0;
  for (int m = 0; m < g.nodes; ++m)
    if (m != g.node_of(gpu)) rows += node_tokens[static_cast<std::int64_t>(g.rank(m, g.local_of(gpu))) * g.nodes + g.node_of(gpu)];
  return rows;
}

/// The row of remote node `node`'s sums in `source`'s return buffer (by node, then token
/// order): the source's tokens for the remote nodes before it.
WEFT_HD std::int64_t return_base(const std::int32_t* node_tokens, NodeGrid g, int source, int node) {
  std::int64_t base = 0;
  for (int m = 0; m < node; ++m)
    if (m != g.node_of(source)) base += node_tokens[static_cast<std::int64_t>(source) * g.nodes + m];
  return base;
}

/// Rows of `source`'s return buffer: its tokens for remote nodes, once per node.
WEFT_HD std::int64_t return_rows(const std::int32_t* node_tokens, NodeGrid g, int source) {
  return return_base(node_tokens, g, source, g.nodes);
}

/// The int32 words that travel with a token on the rail, after its row: all the
/// rail GPU needs to place it on its node and to return its node sum, computed
/// by the source, which alone holds the counts' positions.
///   [0]              the token's index on its source
///   [1]              its row in the source's return buffer
///   [2 + j]          slot j's expert if it lives on this node, else -1 (j < k)
///   [2 + k + j]      that pair's row in its owner's recv_x
///   [2 + 2k + j]     its weight (float bits)
///   [2 + 3k + i]     the token's staging row on local rank i of this node, -1 if it goes there not (i < L)
struct RailRecord {
  int k = 0;      ///< top-k slots
  int local = 0;  ///< GPUs per node

  WEFT_HD int words() const { return 2 + 3 * k + local; }
  WEFT_HD int token() const { return 0; }
  WEFT_HD int return_row() const { return 1; }
  WEFT_HD int expert(int slot) const { return 2 + slot; }
  WEFT_HD int pair_row(int slot) const { return 2 + k + slot; }
  WEFT_HD int weight(int slot) const { return 2 + 2 * k + slot; }
  WEFT_HD int staging_row(int local_rank) const { return 2 + 3 * k + local_rank; }
};

/// One source rank's routing by node: what two hops add to SourceLayout. Host form, for plans and tests.
struct NodeLayout {
  std::vector<std::int32_t> tokens_per_node;  ///< [nodes]: tokens sent to each node (once per token), its own included
  std::vector<std::int32_t> node_position;    ///< [T][nodes]: the token's index among those sent to the node, -1 if none
};

/// Counts one source's routing `topk` ([T][k], valid rows) by node; p.world == g.world().
inline NodeLayout node_layout(const std::int64_t* topk, std::int64_t tokens, int k, ExpertPlacement p, NodeGrid g) {
  NodeLayout l;
  l.tokens_per_node.assign(g.nodes, 0);
  l.node_position.assign(static_cast<std::size_t>(tokens) * g.nodes, -1);
  std::vector<int> ranks(static_cast<std::size_t>(k > 0 ? k : 1));
  for (std::int64_t t = 0; t < tokens; ++t) {
    RowError error;
    const int n = token_destinations(topk + t * k, k, p, ranks.data(), error);
    int last = -1;
    for (int i = 0; i < n; ++i) {  // ranks ascending, so nodes ascending
      const int node = g.node_of(ranks[i]);
      if (node == last) continue;
      last = node;
      l.node_position[t * g.nodes + node] = l.tokens_per_node[node]++;
    }
  }
  return l;
}

}  // namespace weft::moe_detail
