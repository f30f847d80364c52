// ring_plan.hpp (private) - GEMM+ReduceScatter's ring as data: for each step, its rows, its GEMM, the
// partial sum it adds and where its result goes.
//
// GemmRs::run_fused enqueues these steps today from its own loop; this is the
// same ring written as a plain value, so the CPU tests can check at world sizes
// 1 to 8 that every block is computed once per rank, that each step adds what
// the previous rank sent it a step earlier, and that every block ends,
// complete, at its owner. An executor that enqueues any RingPlan is the next
// step (docs/ROADMAP.md, the host side's restructure).
#pragma once

#include <vector>

#include "schedule.hpp"

namespace weft::ops_detail {

/// The GEMM a ring step runs.
enum class RingGemm {
  plain,             ///< no hook: the one step of a single rank, or a plain first step
  reporting,         ///< the first step: reports its stored rows, which leave as they are stored
  source_reporting,  ///< adds the partial sum from rank - 1 as it lands, and reports its stored rows
  source_any_order,  ///< the last step: adds the partial sum, reports nothing, any tile order
};

/// Where a step's rows go.
enum class RingSend {
  when_stored,        ///< to rank + 1's staging, chunk by chunk as the GEMM stores them
  when_step_done,     ///< to rank + 1's staging, once the whole step is done (a plain first step)
  shipped_by_caller,  ///< our own block, final: the caller (GemmAr) ships it on as it is stored
  stays,              ///< our own block, final, in `out`
};

struct RingStep {
  int block = 0;         ///< rows [block x M / W, (block + 1) x M / W)
  RingGemm gemm = RingGemm::plain;
  int source_rank = -1;  ///< the rank whose partial sum of `block` this step adds (-1: none)
  RingSend send = RingSend::stays;
  int send_rank = -1;    ///< where the rows go (-1: nowhere)
  /// The step stores into `out` (our own block, final) rather than the send buffer.
  bool to_out() const { return send == RingSend::stays || send == RingSend::shipped_by_caller; }
};

/// One rank's ring: step s of `steps` runs at position s.
struct RingPlan {
  int rank = 0, world = 1;
  std::vector<RingStep> steps;
};

/// GemmRs's ring per step (FusedWay::ring_per_step, or ring_plain_first where
/// `plain_first`, 2 ranks or more) for `rank` of `world`. `caller_ships` is
/// GemmAr's case: the last step reports its rows, which the caller sends on.
inline RingPlan ring_per_step_plan(int rank, int world, bool plain_first, bool caller_ships) {
  RingPlan plan{rank, world, {}};
  const int last = world - 1, next = schedule::wrap(rank + 1, world), prev = schedule::wrap(rank - 1, world);
  for (int s = 0; s < world; ++s) {
    RingStep step;
    step.block = schedule::ring_gemm_block(rank, s, world);
    if (s > 0) step.source_rank = prev;
    if (s < last) {
      step.gemm = s > 0 ? RingGemm::source_reporting : plain_first ? RingGemm::plain : RingGemm::reporting;
      step.send = s == 0 && plain_first ? RingSend::when_step_done : RingSend::when_stored;
      step.send_rank = next;
    } else {
      // One rank: one plain GEMM into `out`, nothing to ship.
      step.gemm = s == 0 ? RingGemm::plain : caller_ships ? RingGemm::source_reporting : RingGemm::source_any_order;
      step.send = caller_ships && s > 0 ? RingSend::shipped_by_caller : RingSend::stays;
    }
    plan.steps.push_back(step);
  }
  return plan;
}

}  // namespace weft::ops_detail
