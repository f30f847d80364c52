// weft/core/timing.hpp - how weft picks the fastest of several candidates by
// timing them on the GPU: the GEMM tuner's configurations and an overlapped
// plan's paths are timed by one loop and ranked by one statistic.
//
// The loop times in passes: a pass takes one sample of every candidate (its
// calls back to back, between two CUDA events), in order on even passes and
// reversed on odd ones, and the host waits once, at the end of the pass, so
// launch latency stays out of the samples. Under the power cap the clocks
// drift as the GPU heats, so a candidate always timed early would look faster
// than one timed late. The statistic is each candidate's median sample (the
// mean of the middle two for an even count), not the mean, so one disturbed
// sample (another process's kernel, a clock step) does not decide. Over an
// even number of passes, a linear drift puts the middle two samples on a
// forward and a backward pass, where the drift cancels: the loop takes even
// sample counts only (an odd count's median is one pass, whose order biases
// it by up to the drift over the whole pass).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>
#include <vector>

namespace weft {

/// Each candidate's median sample (the mean of the middle two for an even
/// count). Every candidate must have the same number of samples, at least one.
std::vector<float> median_per_candidate(const std::vector<std::vector<float>>& samples);

/// The index of the smallest time, the first of equal ones. Callers whose
/// ranks must agree replace each time by its maximum over the ranks first.
std::size_t fastest_candidate(const std::vector<float>& times);

/// The candidate that takes place `position` in pass `pass`, of `candidates`:
/// in order on even passes, reversed on odd ones.
std::size_t candidate_in_pass(int pass, std::size_t position, std::size_t candidates);

/// Times `candidates` candidates on `stream`: `samples` passes (a positive,
/// even number), each running `calls_per_sample` calls of `call(c)` for every
/// candidate c in candidate_in_pass's order, with `before_sample` (where
/// given: a barrier across ranks) enqueued ahead of each sample, outside its
/// events. Returns median_per_candidate of the samples: ms per call.
std::vector<float> time_interleaved(std::size_t candidates, const std::function<void(std::size_t)>& call,
                                    int samples, int calls_per_sample, cudaStream_t stream,
                                    const std::function<void()>& before_sample = {});

}  // namespace weft
