// weft-bench: every weft operator against its baseline, measured in one run on the same GPUs.
//
//   weftrun -n 2 weft-bench all_gather --bytes 1K:256M --check
//
// Exit codes: 0 done, 1 runtime failure (no GPU, rendezvous, CUDA), 2 bad
// arguments, 3 a correctness check failed.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <memory>

#include "bench.hpp"
#include "timing.hpp"
#include "weft/core/env.hpp"
#include "weft/core/error.hpp"
#include "weft/core/gpu_diagnosis.hpp"
#include "weft/runtime/launch_env.hpp"
#include "weft/runtime/team.hpp"
#ifdef WEFT_BENCH_INTERNODE  // CMake: weft-bench links weft::internode (NVSHMEM's device path)
#include "weft/internode/remote_peers.hpp"
#include "weft/ops/all_gather.hpp"
#endif

namespace {
using namespace weft;

bool is_collective(const std::string& op) {
  return op == "all_gather" || op == "all_reduce" || op == "reduce_scatter";
}

bool names(const std::vector<std::string>& variants, const char* v) {
  return std::find(variants.begin(), variants.end(), v) != variants.end();
}

// Heap room for a collective's two-level plan where weft-bench may time it
// (two_level named, or auto across nodes). Every rank's heap must be the same
// size, and a launcher's ranks per node may differ by node, so across nodes
// the room is that of nodes of one rank each, the most any node grid of the
// world needs (the staging of node sums grows with the nodes); on one node,
// that of one node of every rank.
std::uint64_t two_level_room(const bench::BenchArgs& args, const LaunchEnv& launch, const EnvMap& env) {
  const int world = launch.world_size;
  const bool spans = env_int(env, "WEFT_VIRTUAL_NODES", 1) > 1 || launch.local_world_size < world;
  const auto& variants = spans ? args.variants_across_nodes : args.variants;
  if (!names(variants, "two_level") && !(spans && names(variants, "auto"))) return 0;
  return bench::two_level_heap_bytes(args.op, args.bytes.back(), bench::dtype_bytes(args.dtype), world,
                                     spans ? 1 : world);
}


}  // namespace

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
    const EnvMap env = process_env();
    const LaunchEnv launch = detect_launch_env(env);
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
                        (std::uint64_t{64} << 20) + two_level_room(args, launch, env);
    }
    auto ctx = Context::from_env(opts);
    // Peers without an address (ranks on several nodes, or WEFT_VIRTUAL_NODES):
    // only the collectives' two-level schedules reach them, and their kernels
    // are weft::internode's, found while a weft::RemotePeers lives
    // (docs/decisions/0066). Also made on one node where two_level is named.
    const bool unmapped = !ctx->all_peers_direct();
    const bool two_level_named = is_collective(args.op) && names(args.variants, "two_level");
#ifdef WEFT_BENCH_INTERNODE
    // Before every plan, destroyed after them; across nodes it also installs Context::barrier's.
    std::unique_ptr<RemotePeers> remote;
    if (unmapped || two_level_named) {
      remote = std::make_unique<RemotePeers>(ctx);
      if (ctx->rank() == 0)
        std::fprintf(stderr, "[weft-bench] two-level collectives ready (weft::RemotePeers): %s\n",
                     remote->describe().c_str());
    }
#else
    if ((unmapped || two_level_named) && ctx->rank() == 0)
      std::fprintf(stderr,
                   "[weft-bench] %s, and this weft-bench was built without them: they need weft built with "
                   "NVSHMEM (bash scripts/setup.sh fetches it into .deps-nvshmem/; then bash scripts/build.sh builds "
                   "weft::internode and links it into weft-bench). The two-level plans refuse, naming what they lack\n",
                   unmapped ? "some peers are on other nodes (or virtual nodes), which only the two-level collectives "
                              "(variant two_level, or auto) reach"
                            : "two_level is the collectives' two-level schedule, in weft::internode");
#endif
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
