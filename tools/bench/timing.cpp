#include "timing.hpp"

#include <algorithm>
#include <chrono>
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

std::vector<Soak> soak(Context& ctx, cudaStream_t stream, const std::vector<std::function<void()>>& contenders,
                       const std::vector<double>& ms_per_call, int seconds) {
  WEFT_REQUIRE(contenders.size() == ms_per_call.size(), "soak: ", contenders.size(), " contenders but ",
               ms_per_call.size(), " times");
  auto unix_ms = [] {
    return std::chrono::duration<double, std::milli>(std::chrono::system_clock::now().time_since_epoch()).count();
  };
  cudaEvent_t start, stop;
  WEFT_CUDA(cudaEventCreate(&start));
  WEFT_CUDA(cudaEventCreate(&stop));
  std::vector<Soak> out(contenders.size());
  for (std::size_t i = 0; i < contenders.size(); ++i) {
    WEFT_REQUIRE(ms_per_call[i] > 0, "soak: contender ", i, " has no time per call (", ms_per_call[i], " ms)");
    const long long calls = std::max(16LL, static_cast<long long>(1000.0 * seconds / ms_per_call[i]));
    ctx.barrier(stream);
    ctx.synchronize(stream);
    Soak& s = out[i];
    s.calls = calls;
    s.start_unix_ms = unix_ms();
    WEFT_CUDA(cudaEventRecord(start, stream));
    for (long long c = 0; c < calls; ++c) {
      contenders[i]();
      if (c % 16 == 15) WEFT_CUDA(cudaStreamSynchronize(stream));
    }
    WEFT_CUDA(cudaEventRecord(stop, stream));
    ctx.synchronize(stream);
    s.end_unix_ms = unix_ms();
    float ms = 0;
    WEFT_CUDA(cudaEventElapsedTime(&ms, start, stop));
    s.ms_per_call = ms / static_cast<double>(calls);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return out;
}

}  // namespace weft::bench
