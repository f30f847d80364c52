// weft-bench: every weft operator against its baseline, measured in one run on the same GPUs.
//
//   weftrun -n 2 weft-bench all_gather --bytes 1K:256M --check
//
// Exit codes: 0 done, 1 runtime failure (no GPU, rendezvous, CUDA), 2 bad
// arguments, 3 a correctness check failed.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>

#include "bench.hpp"
#include "weft/core/error.hpp"
#include "weft/runtime/launch_env.hpp"

int main(int argc, char** argv) {
  using namespace weft;
  bench::BenchArgs args;
  try {
    args = bench::parse_bench_args(std::vector<std::string>(argv, argv + argc));
  } catch (const bench::HelpRequested& h) {
    std::fputs(h.text.c_str(), stdout);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "weft-bench: %s\n", e.what());
    return 2;
  }
  int gpus = 0;
  cudaError_t rc = cudaGetDeviceCount(&gpus);
  if (rc != cudaSuccess || gpus == 0) {
    std::fprintf(stderr, "weft-bench: no CUDA GPU is visible on this machine (%s), so there is nothing to benchmark. "
                 "Run it on a machine with NVIDIA GPUs, under weftrun -n <GPUs>.\n",
                 rc == cudaSuccess ? "0 devices" : cudaGetErrorName(rc));
    return 1;
  }
  try {
    ContextOptions opts;
    // Room for the largest input and output, plus the plans' staging and signals.
    const std::uint64_t world = detect_launch_env(process_env()).world_size;
    if (args.op == "gemm") {
      opts.heap_bytes = std::uint64_t{256} << 20;
    } else if (bench::is_overlap_op(args.op)) {
      // The plan's gathered A or staging, the bench's symmetric output and
      // comparison buffers: a few times the largest matrix.
      std::uint64_t largest = 0;
      for (const auto& s : args.shapes)
        largest = std::max<std::uint64_t>(largest, 2ull * s[0] * std::max(s[1], s[2]));
      opts.heap_bytes = 5 * largest + (std::uint64_t{256} << 20);
    } else {
      opts.heap_bytes = args.bytes.back() * (world + 3) + std::min<std::uint64_t>(args.bytes.back(), 16u << 20) * 4 * world +
                        (std::uint64_t{64} << 20);
    }
    auto ctx = Context::from_env(opts);
    if (args.op == "gemm") return bench::bench_gemm(ctx, args);
    if (bench::is_overlap_op(args.op)) return bench::bench_overlap(ctx, args);
    return bench::bench_collective(ctx, args);
  } catch (const Error& e) {
    std::fprintf(stderr, "weft-bench: %s\n", e.what());
    return 1;
  }
}
