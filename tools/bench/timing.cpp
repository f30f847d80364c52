#include "timing.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>

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
                     int samples, int warmup) {
  return time_interleaved(ctx, stream, {fn}, calls_per_sample, samples, warmup).front();
}

std::vector<double> time_interleaved(Context& ctx, cudaStream_t stream,
                                     const std::vector<std::function<void()>>& contenders, int calls_per_sample,
                                     int samples, int warmup) {
  cudaEvent_t start, stop;
  WEFT_CUDA(cudaEventCreate(&start));
  WEFT_CUDA(cudaEventCreate(&stop));
  std::vector<std::vector<double>> us(contenders.size());
  for (int s = 0; s < warmup + samples; ++s)
    for (std::size_t i = 0; i < contenders.size(); ++i) {
      ctx.barrier(stream);
      WEFT_CUDA(cudaEventRecord(start, stream));
      for (int c = 0; c < calls_per_sample; ++c) contenders[i]();
      WEFT_CUDA(cudaEventRecord(stop, stream));
      ctx.synchronize(stream);
      float ms = 0;
      WEFT_CUDA(cudaEventElapsedTime(&ms, start, stop));
      if (s >= warmup) us[i].push_back(1000.0 * ms / calls_per_sample);
    }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  // Each contender: the median on this rank, then the slowest rank's.
  std::string mine;
  for (const auto& v : us) mine += std::to_string(median(v)) + " ";
  std::vector<double> slowest(contenders.size(), 0.0);
  const std::vector<std::string> lines = ctx.store().all_gather(mine, "benchmark timing");
  // WEFT_BENCH_RANKS=1: every rank's medians, to see which rank is the slow one.
  if (ctx.rank() == 0 && env_int(process_env(), "WEFT_BENCH_RANKS", 0) != 0)
    for (std::size_t r = 0; r < lines.size(); ++r)
      std::fprintf(stderr, "[weft-bench] rank %zu medians, us, contenders in order: %s\n", r, lines[r].c_str());
  for (const std::string& line : lines) {
    std::istringstream in(line);
    for (double& x : slowest) {
      double v = 0;
      in >> v;
      x = std::max(x, v);
    }
  }
  return slowest;
}

}  // namespace weft::bench
