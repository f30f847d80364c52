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
#include "weft/core/gpu_diagnosis.hpp"
#include "weft/runtime/launch_env.hpp"
#include "weft/runtime/team.hpp"

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
  try {
    const LaunchEnv launch = detect_launch_env(process_env());
    const GpuDiagnosis gpus = diagnose_gpus();
    if (gpus.verdict != GpuVerdict::ready) {
      std::fprintf(stderr, "weft-bench: nothing to benchmark here: %s. Run it on a machine with NVIDIA Hopper GPUs, "
                   "under weftrun -n <ranks>.\n", gpus.message.c_str());
      return 1;
    }
    ContextOptions opts;
    // Room for the largest input and output, plus the plans' staging and signals.
    const std::uint64_t world = launch.world_size;
    if (args.op == "gemm" || args.op == "decode" || args.op == "grouped_gemm") {
      opts.heap_bytes = std::uint64_t{256} << 20;
    } else if (args.op == "ep") {
      // The plan's staging at most every rank's tokens (rows and their meta records), the copy bound's sink.
      // The low-latency plans (bf16 and fp8): receive rows for every expert's M tokens, their
      // sources and scales, and each plan's combine buffer.
      const std::uint64_t t = args.ep_tokens, h = args.ep_hidden, k = args.ep_topk;
      const std::uint64_t m = args.ep_ll_tokens, e = args.ep_experts;
      opts.heap_bytes = world * t * (2 * h + 4 * (2 + 2 * k)) + t * 2 * h + e * m * (3 * h + h / 32 + 8) +
                        2 * m * k * h * 2 + (std::uint64_t{256} << 20);
    } else if (args.op == "moe_tp") {
      // AgMoe's gathered shards (each token's row, routing and weights), MoeRs's token-order
      // partial sums, and the collectives' staging: a few times W shards of the largest layer.
      std::uint64_t largest = 0;
      for (const auto& c : args.moe_tp_cases) {
        const std::uint64_t cap = (c.tokens + world - 1) / world;
        largest = std::max<std::uint64_t>(largest, world * cap * (2 * c.hidden + 12 * c.top_k + 64));
      }
      opts.heap_bytes = 4 * largest + (std::uint64_t{256} << 20);
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
    if (ctx->team().shares_gpus()) {
      // Ranks on one GPU: a correctness run. Every result is checked; no time is a figure.
      args.check = true;
      if (ctx->rank() == 0)
        std::fprintf(stderr,
                     "weft-bench: %d ranks share a GPU (%s): results are checked (--check is on), times are not "
                     "performance figures, and NCCL baselines and ratios are left out (NCCL refuses ranks that "
                     "share a GPU)\n",
                     ctx->team().ranks_per_gpu, to_string(ctx->team().sharing));
    }
    if (args.op == "gemm") return bench::bench_gemm(ctx, args);
    if (args.op == "ep") return bench::bench_ep(ctx, args);
    if (args.op == "decode") return bench::bench_decode(ctx, args);
    if (args.op == "grouped_gemm") return bench::bench_grouped_gemm(ctx, args);
    if (args.op == "moe_tp") return bench::bench_moe_tp(ctx, args);
    if (bench::is_overlap_op(args.op)) return bench::bench_overlap(ctx, args);
    return bench::bench_collective(ctx, args);
  } catch (const Error& e) {
    std::fprintf(stderr, "weft-bench: %s\n", e.what());
    return 1;
  }
}
