#include "weft/core/timing.hpp"

#include <algorithm>

#include "weft/core/cuda_resources.hpp"
#include "weft/core/error.hpp"

namespace weft {

std::vector<float> median_per_candidate(const std::vector<std::vector<float>>& samples) {
  WEFT_REQUIRE(!samples.empty(), "median_per_candidate: expected the samples of at least one candidate, got none");
  const std::size_t count = samples.front().size();
  WEFT_REQUIRE(count > 0, "median_per_candidate: expected at least one sample per candidate, candidate 0 has none");
  std::vector<float> medians;
  medians.reserve(samples.size());
  for (std::size_t c = 0; c < samples.size(); ++c) {
    WEFT_REQUIRE(samples[c].size() == count, "median_per_candidate: expected ", count,
                 " samples per candidate (as candidate 0 has), candidate ", c, " has ", samples[c].size());
    std::vector<float> sorted = samples[c];
    std::sort(sorted.begin(), sorted.end());
    medians.push_back(count % 2 ? sorted[count / 2] : 0.5f * (sorted[count / 2 - 1] + sorted[count / 2]));
  }
  return medians;
}

std::size_t fastest_candidate(const std::vector<float>& times) {
  WEFT_REQUIRE(!times.empty(), "fastest_candidate: expected the times of at least one candidate, got none");
  return static_cast<std::size_t>(std::min_element(times.begin(), times.end()) - times.begin());
}

std::size_t candidate_in_pass(int pass, std::size_t position, std::size_t candidates) {
  return pass % 2 ? candidates - 1 - position : position;
}

std::vector<float> time_interleaved(std::size_t candidates, const std::function<void(std::size_t)>& call,
                                    int samples, int calls_per_sample, cudaStream_t stream,
                                    const std::function<void()>& before_sample) {
  WEFT_REQUIRE(candidates > 0, "time_interleaved: expected at least one candidate, got none");
  WEFT_REQUIRE(samples > 0 && samples % 2 == 0,
               "time_interleaved: expected a positive, even number of samples (as many backward passes as forward "
               "ones, so a linear clock drift cancels out of the median), got ",
               samples);
  WEFT_REQUIRE(calls_per_sample > 0, "time_interleaved: expected at least one call per sample, got ",
               calls_per_sample);
  std::vector<Event> starts, stops;  // one pair per candidate, reused by every pass
  for (std::size_t c = 0; c < candidates; ++c) {
    starts.emplace_back(Event::Timing::on);
    stops.emplace_back(Event::Timing::on);
  }
  std::vector<std::vector<float>> ms(candidates);
  for (int pass = 0; pass < samples; ++pass) {
    // No host wait inside a pass: the GPU goes from one candidate to the next
    // without idling, and the host enqueues ahead of it.
    for (std::size_t position = 0; position < candidates; ++position) {
      const std::size_t c = candidate_in_pass(pass, position, candidates);
      if (before_sample) before_sample();
      WEFT_CUDA(cudaEventRecord(starts[c], stream));
      for (int i = 0; i < calls_per_sample; ++i) call(c);
      WEFT_CUDA(cudaEventRecord(stops[c], stream));
    }
    WEFT_CUDA(cudaEventSynchronize(stops[candidate_in_pass(pass, candidates - 1, candidates)]));
    for (std::size_t c = 0; c < candidates; ++c) {
      float elapsed = 0;
      WEFT_CUDA(cudaEventElapsedTime(&elapsed, starts[c], stops[c]));
      ms[c].push_back(elapsed / static_cast<float>(calls_per_sample));
    }
  }
  return median_per_candidate(ms);
}

}  // namespace weft
