#include "timing.hpp"

#include <algorithm>
#include <string>

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
  cudaEvent_t start, stop;
  WEFT_CUDA(cudaEventCreate(&start));
  WEFT_CUDA(cudaEventCreate(&stop));
  std::vector<double> us;
  for (int s = 0; s < warmup + samples; ++s) {
    ctx.barrier(stream);
    WEFT_CUDA(cudaEventRecord(start, stream));
    for (int c = 0; c < calls_per_sample; ++c) fn();
    WEFT_CUDA(cudaEventRecord(stop, stream));
    ctx.synchronize(stream);
    float ms = 0;
    WEFT_CUDA(cudaEventElapsedTime(&ms, start, stop));
    if (s >= warmup) us.push_back(1000.0 * ms / calls_per_sample);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  double mine = median(us);
  double slowest = mine;
  for (const std::string& v : ctx.store().all_gather(std::to_string(mine), "benchmark timing"))
    slowest = std::max(slowest, std::stod(v));
  return slowest;
}

}  // namespace weft::bench
