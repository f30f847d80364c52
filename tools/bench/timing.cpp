#include "timing.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <string>

#include "enqueue_hold.hpp"
#include "weft/core/env.hpp"
#include "weft/core/error.hpp"

namespace weft::bench {
double median(std::vector<double> values) {
  WEFT_REQUIRE(!values.empty(), "median of no samples");
  std::sort(values.begin(), values.end());
  std::size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

double time_per_call(Context& ctx, cudaStream_t stream, const std::function<void()>& fn, int calls_per_sample,
                     int samples, int warmup, bool hold) {
  return time_interleaved(ctx, stream, {fn}, calls_per_sample, samples, warmup, hold).front();
}

std::vector<double> time_interleaved(Context& ctx, cudaStream_t stream,
                                     const std::vector<std::function<void()>>& contenders, int calls_per_sample,
                                     int samples, int warmup, bool hold, SampleOrder order) {
  cudaEvent_t start, stop;
  WEFT_CUDA(cudaEventCreate(&start));
  WEFT_CUDA(cudaEventCreate(&stop));
  // A held stream must not meet a call that synchronises (a first call's
  // tuning or graph capture): one untimed call of each, unheld, first.
  for (const auto& contender : contenders) {
    ctx.barrier(stream);
    contender();
    ctx.synchronize(stream);
  }
  std::optional<EnqueueHold> held;  // --no-hold: none (no pinned word, no spinning kernel)
  if (hold) held.emplace();
  std::vector<std::vector<double>> us(contenders.size());
  // Every rank draws the same permutations (the contenders are collective):
  // one seed, one generator, and the shuffle written out here, because
  // std::shuffle's use of the generator is the library's choice.
  std::mt19937 draw(20261130u);
  std::vector<std::size_t> turn(contenders.size());
  std::iota(turn.begin(), turn.end(), std::size_t{0});
  for (int s = 0; s < warmup + samples; ++s) {
    if (order == SampleOrder::shuffled)
      for (std::size_t j = turn.size(); j > 1; --j) std::swap(turn[j - 1], turn[draw() % j]);
    for (const std::size_t i : turn) {
      if (held) held->hold(stream);
      ctx.barrier(stream);
      WEFT_CUDA(cudaEventRecord(start, stream));
      for (int c = 0; c < calls_per_sample; ++c) contenders[i]();
      WEFT_CUDA(cudaEventRecord(stop, stream));
      if (held) held->release();
      ctx.synchronize(stream);
      WEFT_REQUIRE(!held || !held->timed_out(), "weft-bench: rank ", ctx.rank(), " took over ", held->limit_ms(),
                   " ms to enqueue one sample of contender ", i, " (", calls_per_sample,
                   " calls): the stream's hold gave up, so the sample is host-bound");
      float ms = 0;
      WEFT_CUDA(cudaEventElapsedTime(&ms, start, stop));
      if (s >= warmup) us[i].push_back(1000.0 * ms / calls_per_sample);
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  // Each contender: the median on this rank, then the slowest rank's.
  std::vector<double> medians;
  for (const auto& v : us) medians.push_back(median(v));
  return slowest_over_ranks(ctx, medians, "benchmark timing");
}

std::vector<double> slowest_over_ranks(Context& ctx, const std::vector<double>& mine, const std::string& what) {
  std::string line;
  for (double v : mine) line += std::to_string(v) + " ";
  std::vector<double> slowest(mine.size(), -std::numeric_limits<double>::infinity());
  const std::vector<std::string> lines = ctx.store().all_gather(line, what);
  // WEFT_BENCH_RANKS=1: every rank's values, to see which rank is the slow one.
  if (ctx.rank() == 0 && env_int(process_env(), "WEFT_BENCH_RANKS", 0) != 0)
    for (std::size_t r = 0; r < lines.size(); ++r)
      std::fprintf(stderr, "[weft-bench] rank %zu, %s, in order: %s\n", r, what.c_str(), lines[r].c_str());
  for (const std::string& theirs : lines) {
    std::istringstream in(theirs);
    for (double& x : slowest) {
      double v = 0;
      in >> v;
      x = std::max(x, v);
    }
  }
  return slowest;
}

void soak(Context& ctx, cudaStream_t stream, const std::vector<std::function<void()>>& contenders,
          const std::vector<std::string>& names, const std::vector<double>& ms_per_call, int seconds,
          const std::string& label) {
  WEFT_REQUIRE(contenders.size() == ms_per_call.size() && contenders.size() == names.size(), "soak: ",
               contenders.size(), " contenders, ", names.size(), " names, ", ms_per_call.size(), " times");
  auto unix_ms = [] {
    return std::chrono::duration<double, std::milli>(std::chrono::system_clock::now().time_since_epoch()).count();
  };
  cudaEvent_t start, stop;
  WEFT_CUDA(cudaEventCreate(&start));
  WEFT_CUDA(cudaEventCreate(&stop));
  for (std::size_t i = 0; i < contenders.size(); ++i) {
    WEFT_REQUIRE(ms_per_call[i] > 0, "soak: ", names[i], " has no time per call (", ms_per_call[i], " ms)");
    const long long calls = std::max(16LL, static_cast<long long>(1000.0 * seconds / ms_per_call[i]));
    ctx.barrier(stream);
    ctx.synchronize(stream);
    const double t0 = unix_ms();
    WEFT_CUDA(cudaEventRecord(start, stream));
    for (long long c = 0; c < calls; ++c) {
      contenders[i]();
      if (c % 16 == 15) WEFT_CUDA(cudaStreamSynchronize(stream));
    }
    WEFT_CUDA(cudaEventRecord(stop, stream));
    ctx.synchronize(stream);
    const double t1 = unix_ms();
    float ms = 0;
    WEFT_CUDA(cudaEventElapsedTime(&ms, start, stop));
    std::fprintf(stderr, "[weft-bench] soak %s rank %d: %s | %lld calls, %.4f ms per call, unix ms %.1f to %.1f\n",
                 label.c_str(), ctx.rank(), names[i].c_str(), calls, ms / static_cast<double>(calls), t0, t1);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

}  // namespace weft::bench
