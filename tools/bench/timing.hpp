// timing.hpp - how weft-bench times anything: CUDA events, warm-up excluded, ranks started together.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <string>
#include <vector>

#include "weft/runtime/context.hpp"

namespace weft::bench {

/// Median of a sample (copied, not modified).
double median(std::vector<double> values);

/// Times `fn` (which enqueues one call on `stream`) on every rank together.
/// `fn` runs once untimed first (a first call may tune or capture, and
/// synchronise). Each sample, with `hold` (the default): the stream is held
/// (EnqueueHold) while the host enqueues a device barrier (so every rank
/// starts at the same moment), a start event, `calls_per_sample` calls back
/// to back and an end event, then released, so the events time the GPU and
/// not the host's enqueue latency; without `hold` the stream runs as the host
/// enqueues (the earlier method, docs/decisions/0020). Returns
/// microseconds per call: the median over `samples` samples on this rank,
/// then the maximum of those medians over all ranks (the job is as slow as
/// its slowest rank). Collective. WEFT_BENCH_RANKS=1: rank 0 also prints
/// every rank's medians. Throws if a held sample outlasted the hold's limit
/// (the host took over 2 s to enqueue it: the sample would be host-bound).
double time_per_call(Context& ctx, cudaStream_t stream, const std::function<void()>& fn, int calls_per_sample,
                     int samples, int warmup, bool hold = true);

/// The order of the contenders within each round of time_interleaved.
enum class SampleOrder {
  fixed,     ///< the order given, every round: each contender always follows the same one
  shuffled,  ///< a fresh permutation each round, the same on every rank (a fixed seed)
};

/// Each value's largest over the ranks (a job is as slow as its slowest rank):
/// `mine` as this rank measured it, the same length on every rank. Collective.
/// WEFT_BENCH_RANKS=1: rank 0 also prints every rank's values, labelled `what`.
std::vector<double> slowest_over_ranks(Context& ctx, const std::vector<double>& mine, const std::string& what);
/// time_per_call for several contenders, interleaved: each round takes one
/// sample of every contender, so a drift of the clocks (power, heat) over the
/// run falls on all of them alike instead of on whichever ran last. Under the
/// power cap a sample's clock might also depend on what ran just before it (a
/// light contender, a collective, leaving headroom that the next sample
/// spends): the fixed order gives each contender the same predecessor every
/// round, SampleOrder::shuffled every other about equally often. An A/B of
/// the two found no effect above the noise (docs/decisions/0020).
/// Returns microseconds per call for each, in the order given. Collective.
std::vector<double> time_interleaved(Context& ctx, cudaStream_t stream,
                                     const std::vector<std::function<void()>>& contenders, int calls_per_sample,
                                     int samples, int warmup, bool hold = true,
                                     SampleOrder order = SampleOrder::fixed);

/// Runs each contender alone for about `seconds`, one after the other, every
/// rank together (a device barrier and a host synchronisation before each),
/// so a clock log taken meanwhile can be read per contender. The number of
/// calls comes from `ms_per_call` (the same on every rank: the interleaved
/// timing's maximum over ranks), so collective contenders make the same
/// calls on every rank. The stream is synchronised every 16 calls, so the
/// host never runs far ahead. Each rank prints, per contender, to stderr:
/// "[weft-bench] soak LABEL rank R: NAME | C calls, X ms per call, unix ms
/// T0 to T1" (its GPU time per call by CUDA events, its wall-clock window),
/// the line gpu_session.sh's soak stage reads. Collective.
void soak(Context& ctx, cudaStream_t stream, const std::vector<std::function<void()>>& contenders,
          const std::vector<std::string>& names, const std::vector<double>& ms_per_call, int seconds,
          const std::string& label);

}  // namespace weft::bench
