// ring_plan.hpp (private) - GEMM+ReduceScatter's ring as data: for each step,
// the rows it computes, its GEMM, whose partial sum it adds, and where each
// block's rows go once stored. ring_plan() builds it for every fused way;
// RingExecutor (ring_executor.hpp) enqueues whatever plan it is given. The
// CPU tests check the plans at world sizes 1 to 8: every block computed once
// per rank, each step adding what the previous rank sent it a step earlier,
// every block ending, complete, at its owner.
//
// Buffers are indexed by block (rows [b x M / W, (b + 1) x M / W) of the
// [M, N] sum): RingLayout names where block b's staging, flags, stored-row
// counters and rows are.
#pragma once

#include <cstdint>
#include <vector>

#include "schedule.hpp"
#include "weft/ops/gemm_rs.hpp"

namespace weft::ops_detail {

/// The GEMM a ring step runs.
enum class RingGemm {
  plain,             ///< no hook, any tile order (or cuBLAS): one rank's one GEMM, a plain first step
  reporting,         ///< the first step: reports its stored rows, which leave as they are stored
  source_reporting,  ///< adds the partial sum from rank - 1 as it lands, and reports its stored rows
  source_any_order,  ///< the last step: adds the partial sum, reports nothing, any tile order
  /// The last step after a plain first step at 2 ranks: its source leaves the
  /// previous rank only as the step starts, so its tiles wait in the order it
  /// arrives (by column band where the plan sends bands, else by row chunk).
  source_arrival_order,
  /// One GEMM over all M rows, its tiles walking whole blocks down from
  /// `block` (the ring's order), each block after the first adding the
  /// partial sum from rank - 1; reports its stored rows.
  whole_ring,
  /// 2 ranks: one GEMM over all M rows, the peer's block (`block`) stored and
  /// reported, then ours added onto the peer's partial sum in `out`.
  whole_adding,
};
inline constexpr int kRingGemmKinds = 7;

/// Where a block's rows go once the step's GEMM has stored them.
enum class SendTo {
  next_staging,  ///< rank `rank`'s staging, at the block's rows: the ring's hand-on
  peer_out,      ///< rank `rank`'s `out` (one launch, adding: our partial sum of its block)
  out,           ///< this rank's `out`: our own block, final, moved from where the GEMM stored it
  caller,        ///< our own block, final in `out`: the caller (GemmAr) ships it on
};

/// When a send's copies start.
enum class SendWhen {
  stored,                    ///< chunk by chunk, each as soon as the GEMM reports it stored
  step_done,                 ///< once the step's GEMM is done, chunk by chunk
  step_done_by_column_band,  ///< once the step's GEMM is done, by column band (2-D copies)
};

struct BlockSend {
  int block = 0;
  SendTo to = SendTo::next_staging;
  int rank = -1;  ///< the rank it goes to (next_staging, peer_out); -1 for this rank
  SendWhen when = SendWhen::stored;
};

struct RingStep {
  RingGemm gemm = RingGemm::plain;
  /// Its rows: block `block`; for the whole-ring GEMMs, all M rows, starting at `block`.
  int block = 0;
  int source_rank = -1;  ///< the rank whose partial sum the step adds as it lands (-1: none)
  bool stores_to_out = false;  ///< stores into `out` (our own block, final) rather than the send buffer
  std::vector<BlockSend> sends;  ///< enqueued after the step's GEMM, in order
};

/// One rank's ring: its steps, in order.
struct RingPlan {
  int rank = 0, world = 1;
  std::vector<RingStep> steps;
};

/// The GEMM kinds a step of that kind reports stored rows from (its sends
/// wait for them).
inline bool reports_rows(RingGemm g) {
  return g == RingGemm::reporting || g == RingGemm::source_reporting || g == RingGemm::whole_ring ||
         g == RingGemm::whole_adding;
}

/// The ring of fused way `way` for `rank` of `world`. `caller_ships`: GemmAr's
/// case, whose own block leaves by the caller as it is stored. `column_bands`:
/// the plain first step's block leaves by column band where the way and the
/// world allow (2 ranks, nobody shipping). FusedWay::ring_one_launch needs 2
/// ranks or more here, one_launch_add exactly 2; at one rank every way is one
/// plain GEMM into `out`. The caller checks what the shape allows.
inline RingPlan ring_plan(FusedWay way, int rank, int world, bool caller_ships, bool column_bands) {
  RingPlan plan{rank, world, {}};
  const int last = world - 1, next = schedule::wrap(rank + 1, world), prev = schedule::wrap(rank - 1, world);
  const int first_block = schedule::ring_gemm_block(rank, 0, world);
  const BlockSend ship_own{rank, SendTo::caller, -1, SendWhen::stored};
  if (world == 1) {
    plan.steps.push_back(RingStep{RingGemm::plain, 0, -1, true, {}});
    return plan;
  }
  if (way == FusedWay::ring_one_launch) {
    RingStep whole{RingGemm::whole_ring, first_block, prev, false, {}};
    for (int s = 0; s < last; ++s)
      whole.sends.push_back({schedule::ring_gemm_block(rank, s, world), SendTo::next_staging, next, SendWhen::stored});
    whole.sends.push_back(caller_ships ? ship_own : BlockSend{rank, SendTo::out, -1, SendWhen::stored});
    plan.steps.push_back(whole);
    return plan;
  }
  if (way == FusedWay::one_launch_add) {
    const int peer = 1 - rank;
    RingStep whole{RingGemm::whole_adding, peer, peer, false, {{peer, SendTo::peer_out, peer, SendWhen::stored}}};
    if (caller_ships) whole.sends.push_back(ship_own);
    plan.steps.push_back(whole);
    return plan;
  }
  const bool plain_first = way == FusedWay::ring_plain_first;
  const bool bands = plain_first && column_bands && world == 2 && !caller_ships;
  for (int s = 0; s < world; ++s) {
    RingStep step;
    step.block = schedule::ring_gemm_block(rank, s, world);
    if (s > 0) step.source_rank = prev;
    if (s < last) {
      step.gemm = s > 0 ? RingGemm::source_reporting : plain_first ? RingGemm::plain : RingGemm::reporting;
      const SendWhen when = s > 0 || !plain_first ? SendWhen::stored
                            : bands               ? SendWhen::step_done_by_column_band
                                                  : SendWhen::step_done;
      step.sends.push_back({step.block, SendTo::next_staging, next, when});
    } else {
      step.gemm = caller_ships                    ? RingGemm::source_reporting
                  : plain_first && world == 2     ? RingGemm::source_arrival_order
                                                  : RingGemm::source_any_order;
      step.stores_to_out = true;
      if (caller_ships) step.sends.push_back(ship_own);
    }
    plan.steps.push_back(step);
  }
  return plan;
}

/// Where the ring's buffers keep block b. Flags and counters are u64 words of
/// one symmetric allocation: [W blocks][chunks] arrival flags (block b's
/// chunk c of the partial sum from rank - 1 has landed), then [W blocks]
/// [chunks] stored-row counters (our GEMM has stored block b's chunk c).
/// Staging and the send buffer hold [M, N] elements, block b at its rows.
struct RingLayout {
  int world = 1;
  std::int64_t n = 0, block_rows = 0, chunks = 1, chunk_rows = 0;
  std::int64_t element_bytes = 2;

  std::uint64_t block_bytes() const { return static_cast<std::uint64_t>(block_rows * n * element_bytes); }
  std::uint64_t chunk_bytes() const { return static_cast<std::uint64_t>(chunk_rows * n * element_bytes); }
  std::uint64_t all_bytes() const { return block_bytes() * static_cast<std::uint64_t>(world); }
  /// Words of the flag allocation: arrival flags, then stored-row counters.
  int flag_words() const { return static_cast<int>(2 * world * chunks); }
  /// Block b's arrival flags, its `chunks` words.
  std::int64_t arrived_word(int block) const { return block * chunks; }
  /// Block b's stored-row counters, its `chunks` words.
  std::int64_t stored_word(int block) const { return (world + block) * chunks; }
  /// Block b's rows, in bytes from the start of an [M, N] buffer.
  std::uint64_t block_offset(int block) const { return static_cast<std::uint64_t>(block) * block_bytes(); }
  /// A chunk's stored-row counter once final (RowsDone::complete_value).
  std::uint64_t chunk_stored() const { return static_cast<std::uint64_t>(chunk_rows * n); }
};

}  // namespace weft::ops_detail
