// The statistic that ranks timed candidates (weft/core/timing.hpp), for the
// GEMM tuner and the overlapped plans' path choice: each candidate's median
// sample, the first of the fastest, and why the loop takes even sample counts.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "cpu/error_text.hpp"
#include "weft/core/timing.hpp"

namespace {

using weft::candidate_in_pass;
using weft::fastest_candidate;
using weft::median_per_candidate;
using weft::test::error_of;
using weft::test::has;

using Samples = std::vector<std::vector<float>>;

std::vector<float> means(const Samples& samples) {
  std::vector<float> out;
  for (const auto& s : samples) out.push_back(std::accumulate(s.begin(), s.end(), 0.0f) / s.size());
  return out;
}

/// The samples the timing loop takes of candidates with these true times
/// when the clock drifts linearly: each sample reads its true time plus
/// `drift_per_sample` for every sample the GPU ran before it, in the order
/// the loop runs them (candidate_in_pass).
Samples drifting_samples(const std::vector<float>& true_ms, int passes, float drift_per_sample) {
  const std::size_t n = true_ms.size();
  Samples samples(n);
  for (int pass = 0; pass < passes; ++pass)
    for (std::size_t position = 0; position < n; ++position) {
      const std::size_t c = candidate_in_pass(pass, position, n);
      const float samples_before = static_cast<float>(pass * n + position);
      samples[c].push_back(true_ms[c] + drift_per_sample * samples_before);
    }
  return samples;
}

TEST(Timing, MedianOfAnOddCountIsTheMiddleSample) {
  const std::vector<float> medians = median_per_candidate({{0.30f, 0.10f, 0.20f}, {5.0f, 1.0f, 3.0f}});
  EXPECT_EQ(medians, (std::vector<float>{0.20f, 3.0f}));
}

TEST(Timing, MedianOfAnEvenCountIsTheMeanOfTheMiddleTwo) {
  const std::vector<float> medians = median_per_candidate({{4.0f, 1.0f, 3.0f, 2.0f}, {1.0f, 1.0f, 9.0f, 9.0f}});
  EXPECT_FLOAT_EQ(medians[0], 2.5f);
  EXPECT_FLOAT_EQ(medians[1], 5.0f);
}

TEST(Timing, OneOutlierSampleDoesNotChangeThePickWhereAMeanWould) {
  // Candidate 0 is faster in every sample but one, which something else on
  // the GPU disturbed.
  const Samples samples = {{1.00f, 1.01f, 0.99f, 3.00f}, {1.10f, 1.10f, 1.11f, 1.09f}};
  EXPECT_EQ(fastest_candidate(median_per_candidate(samples)), 0u);
  EXPECT_EQ(fastest_candidate(means(samples)), 1u) << "the mean would pick the slower candidate";
  // With an odd count too.
  const Samples odd = {{1.00f, 3.00f, 0.99f}, {1.10f, 1.10f, 1.11f}};
  EXPECT_EQ(fastest_candidate(median_per_candidate(odd)), 0u);
  EXPECT_EQ(fastest_candidate(means(odd)), 1u);
}

TEST(Timing, TiesPickTheFirstCandidate) {
  EXPECT_EQ(fastest_candidate({1.0f, 1.0f}), 0u);
  EXPECT_EQ(fastest_candidate({2.0f, 1.0f, 1.0f, 3.0f}), 1u);
  // Equal medians from different samples: the first still.
  EXPECT_EQ(fastest_candidate(median_per_candidate({{3.0f, 1.0f, 2.0f, 2.0f}, {2.0f, 2.0f, 2.0f, 2.0f}})), 0u);
}

TEST(Timing, OneCandidateIsItsOwnFastest) {
  const std::vector<float> medians = median_per_candidate({{0.7f, 0.5f, 0.9f, 0.6f}});
  ASSERT_EQ(medians.size(), 1u);
  EXPECT_FLOAT_EQ(medians[0], 0.65f);
  EXPECT_EQ(fastest_candidate(medians), 0u);
}

TEST(Timing, EmptyOrMismatchedSamplesAreRefusedSayingWhatWasExpected) {
  std::string e = error_of([] { median_per_candidate({}); });
  EXPECT_TRUE(has(e, "expected the samples of at least one candidate")) << e;
  e = error_of([] { median_per_candidate({{}, {}}); });
  EXPECT_TRUE(has(e, "expected at least one sample per candidate")) << e;
  e = error_of([] { median_per_candidate({{1.0f, 2.0f}, {1.0f, 2.0f, 3.0f}}); });
  EXPECT_TRUE(has(e, "expected 2 samples per candidate")) << e;
  EXPECT_TRUE(has(e, "candidate 1 has 3")) << e;
  e = error_of([] { median_per_candidate({{1.0f, 2.0f}, {}}); });
  EXPECT_TRUE(has(e, "candidate 1 has 0")) << e;
  e = error_of([] { fastest_candidate({}); });
  EXPECT_TRUE(has(e, "expected the times of at least one candidate")) << e;
}

TEST(Timing, PassesAlternateDirection) {
  EXPECT_EQ(candidate_in_pass(0, 0, 3), 0u);
  EXPECT_EQ(candidate_in_pass(0, 2, 3), 2u);
  EXPECT_EQ(candidate_in_pass(1, 0, 3), 2u);
  EXPECT_EQ(candidate_in_pass(1, 2, 3), 0u);
  EXPECT_EQ(candidate_in_pass(2, 1, 3), 1u);
  EXPECT_EQ(candidate_in_pass(5, 0, 1), 0u);
}

TEST(Timing, ALinearDriftDoesNotFlipTwoCandidatesOverEvenPassCounts) {
  // Candidate 0 is 0.02 ms faster; the clock slows by 0.1 ms per sample, five
  // times that difference. Either candidate listed first, over the tuner's 4
  // passes and the path choice's 8, and with more candidates around them.
  for (int passes : {2, 4, 8})
    for (float drift : {0.1f, -0.1f}) {
      const std::vector<float> medians = median_per_candidate(drifting_samples({1.00f, 1.02f}, passes, drift));
      EXPECT_EQ(fastest_candidate(medians), 0u) << passes << " passes, drift " << drift;
      const std::vector<float> swapped = median_per_candidate(drifting_samples({1.02f, 1.00f}, passes, drift));
      EXPECT_EQ(fastest_candidate(swapped), 1u) << passes << " passes, drift " << drift;
      // Five candidates, the two close ones at either end and in the middle.
      const std::vector<float> five =
          median_per_candidate(drifting_samples({1.02f, 1.50f, 1.00f, 1.40f, 1.01f}, passes, drift));
      EXPECT_EQ(fastest_candidate(five), 2u) << passes << " passes, drift " << drift;
      // The drift cancels: every median is its true time plus the same offset.
      EXPECT_NEAR(five[0] - five[2], 0.02f, 1e-4f);
      EXPECT_NEAR(five[4] - five[2], 0.01f, 1e-4f);
    }
}

TEST(Timing, AnOddPassCountLetsTheDriftFlipThePick) {
  // Why the loop refuses odd counts: the median of 7 passes is the middle
  // pass alone, where the candidate timed later reads the drift's extra.
  const std::vector<float> medians = median_per_candidate(drifting_samples({1.00f, 1.02f}, 7, 0.1f));
  EXPECT_EQ(fastest_candidate(medians), 1u) << "the slower candidate, timed earlier in the middle pass";
}

TEST(Timing, TheLoopRefusesAnOddOrEmptySampleCountBeforeTouchingTheGpu) {
  auto call = [](std::size_t) {};
  std::string e = error_of([&] { weft::time_interleaved(2, call, 7, 3, nullptr); });
  EXPECT_TRUE(has(e, "expected a positive, even number of samples")) << e;
  EXPECT_TRUE(has(e, "got 7")) << e;
  e = error_of([&] { weft::time_interleaved(2, call, 0, 3, nullptr); });
  EXPECT_TRUE(has(e, "got 0")) << e;
  e = error_of([&] { weft::time_interleaved(0, call, 4, 3, nullptr); });
  EXPECT_TRUE(has(e, "expected at least one candidate")) << e;
  e = error_of([&] { weft::time_interleaved(2, call, 4, 0, nullptr); });
  EXPECT_TRUE(has(e, "expected at least one call per sample")) << e;
}

}  // namespace
