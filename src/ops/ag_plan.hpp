// ag_plan.hpp (private) - AllGather+GEMM's fused ways as data: the peers our
// shard goes to, in order, and the steps that multiply the gathered A, each
// naming its GEMM, the shard (or shards) it multiplies and what it waits on.
// ag_plan() builds it for either way; AgGemm (ag_gemm.cpp) enqueues whatever
// plan it is given in one loop. The CPU tests check the plans at world sizes
// 1 to 8: every shard multiplied once, each shard used in the order its owner
// pushes it to us, every peer pushed to once.
//
// Shard q is rows [q x M / W, (q + 1) x M / W) of the gathered A, pushed by
// rank q in chunks; AgLayout names where its chunks' arrival flags are.
//
// Across nodes (ag_plan_two_level) no rank pushes: the two-level AllGather
// kernel gathers on the side stream and counts each shard's landed slices, and
// the steps multiply the shards in the order they land there
// (hierarchy::ag_arrival; docs/decisions/0074).
#pragma once

#include <cstdint>
#include <vector>

#include "hierarchy.hpp"
#include "schedule.hpp"
#include "weft/core/error.hpp"
#include "weft/ops/ag_gemm.hpp"

namespace weft::ops_detail {

/// The GEMM an AllGather+GEMM step runs.
enum class AgGemmKind {
  /// One hooked GEMM over all M rows, its tiles starting at `first_shard`'s
  /// rows and wrapping; each tile waits in its load warp for the chunk flags
  /// of the rows it reads.
  whole_waiting,
  /// A plain GEMM over one shard's rows (any tile order, or cuBLAS).
  shard,
};
inline constexpr int kAgGemmKinds = 2;

/// What a step waits on for its rows.
enum class AgWait {
  none,                       ///< its rows are ours: nothing
  in_kernel_tiles,            ///< inside the kernel, tile by tile (the hooked GEMM)
  shard_flags_before_launch,  ///< a one-block wait for all of shard `wait_from`'s chunk flags, enqueued before the GEMM
  /// Across nodes: a one-block wait for shard `shard`'s arrival count to reach
  /// the two-level AllGather's blocks, enqueued before the GEMM; `wait_from`
  /// names the GPU that delivers the shard (the rank a timeout blames).
  shard_arrivals_before_launch,
};

struct AgStep {
  AgGemmKind gemm = AgGemmKind::shard;
  int shard = -1;        ///< the shard it multiplies; -1 for whole_waiting (all of them)
  int first_shard = -1;  ///< whole_waiting: the shard whose rows its tiles start at; else `shard`
  AgWait wait = AgWait::none;
  int wait_from = -1;  ///< shard_flags_before_launch: the rank whose shard's flags it waits for;
                       ///< shard_arrivals_before_launch: the GPU that delivers the shard; else -1
};

/// One rank's run of a fused way: its pushes (on the side stream) and its steps (on the stream), in order.
struct AgPlan {
  AgWay way = AgWay::one_gemm;
  int rank = 0, world = 1;
  std::vector<int> pushes;  ///< the peers our shard goes to, soonest needed first
  std::vector<AgStep> steps;
};

/// The run of fused way `way` for `rank` of `world`. AgWay::plain_steps needs
/// 2 ranks or more; AgWay::automatic is no way of its own (the caller builds
/// the plans of the ways it times).
inline AgPlan ag_plan(AgWay way, int rank, int world) {
  WEFT_REQUIRE(world >= 1 && rank >= 0 && rank < world, "ag_plan: needs 0 <= rank < world, got rank ", rank,
               " of ", world);
  WEFT_REQUIRE(way != AgWay::automatic,
               "ag_plan: needs AgWay::one_gemm or AgWay::plain_steps, got AgWay::automatic (resolve it to the ways "
               "it times)");
  WEFT_REQUIRE(way != AgWay::plain_steps || world > 1, "ag_plan: AgWay::plain_steps needs 2 or more ranks, got ",
               world);
  AgPlan plan{way, rank, world, {}, {}};
  // Peer p's GEMM walks shards p, p + 1, ..., so the peer that reaches ours soonest comes first.
  for (int turn = 1; turn < world; ++turn) plan.pushes.push_back(schedule::shard_push_peer(rank, turn, world));
  if (way == AgWay::one_gemm) {
    plan.steps.push_back(AgStep{AgGemmKind::whole_waiting, -1, rank, AgWait::in_kernel_tiles, -1});
    return plan;
  }
  // Step s multiplies shard rank + s: the one its owner pushes to us at turn
  // s, which landed while step s - 1 ran.
  for (int s = 0; s < world; ++s) {
    const int q = schedule::wrap(rank + s, world);
    plan.steps.push_back(s == 0 ? AgStep{AgGemmKind::shard, q, q, AgWait::none, -1}
                                : AgStep{AgGemmKind::shard, q, q, AgWait::shard_flags_before_launch, q});
  }
  return plan;
}

/// The run of AllGather+GEMM across nodes for GPU `rank` of node grid `g`: no
/// pushes (the two-level AllGather kernel moves every shard), and one plain
/// step per shard in the order the shards land at `rank`
/// (hierarchy::ag_arrival: its own first, then by hop, the rail's shard before
/// the node peers'), each later one waiting for its shard's arrival count.
/// Way AgWay::plain_steps (path "fused, plain steps"); needs 2 or more GPUs.
inline AgPlan ag_plan_two_level(hierarchy::NodeGrid g, int rank) {
  const int world = g.world();
  WEFT_REQUIRE(world >= 2 && rank >= 0 && rank < world, "ag_plan_two_level: needs 0 <= rank < world and world >= 2, ",
               "got rank ", rank, " of ", world, " (", g.nodes, " nodes of ", g.local, ")");
  AgPlan plan{AgWay::plain_steps, rank, world, {}, {}};
  for (int i = 0; i < world; ++i) {
    const int q = hierarchy::ag_arrival(g, rank, i);
    plan.steps.push_back(i == 0 ? AgStep{AgGemmKind::shard, q, q, AgWait::none, -1}
                                : AgStep{AgGemmKind::shard, q, q, AgWait::shard_arrivals_before_launch,
                                         hierarchy::ag_delivery(g, rank, q).from});
  }
  return plan;
}

/// Where the arrival flags are: u64 words of one symmetric allocation,
/// [W shards][chunks], word (q, c) raised by rank q once chunk c of its shard
/// has landed here.
struct AgLayout {
  int world = 1;
  std::int64_t chunks = 1;

  /// Words of the flag allocation.
  int flag_words() const { return static_cast<int>(world * chunks); }
  /// Shard q's arrival flags, its `chunks` words.
  std::int64_t arrived_word(int shard) const { return shard * chunks; }
};

}  // namespace weft::ops_detail
