// weft-bench ep: MoE expert-parallel dispatch and combine (throughput mode), timed alone and
// together, against a copy bound measured in the same run.
//
// Each rank routes --tokens tokens, uniformly at random, to --topk distinct experts of
// --experts. Contenders, interleaved (timing.hpp):
//   layout            the device count, the exchange of counts, the host read;
//   layout+dispatch   what a caller of dispatch waits for (DeepEP's normal mode also reads
//                     the counts on the host before it moves tokens);
//   full call         layout, dispatch, combine (identity experts: y = recv_x);
//   copy bound        each rank's token-rank pairs pushed into the ranks' heaps by the copy
//                     engines (cudaMemcpyAsync, one stream per destination, all at once):
//                     the same bytes over the same links, with no routing;
//   expanded write    the received rows written once (cudaMemsetAsync over recv_x): dispatch
//                     ends by expanding each token-rank pair into one row per local expert
//                     (top-8 of 256 experts: 32768 rows, 470 MB, from 58.7 MB of pairs), and
//                     combine reads those rows back. The bound beside both calls is the copy
//                     bound plus the expanded write: the two moves one after the other.
// dispatch = (layout+dispatch) - layout and combine = full - (layout+dispatch), since a
// plan runs its calls in that order (each once per layout).
// Bandwidth, DeepEP's convention: bytes of the valid token-rank pairs (H x 2 per token and
// destination rank, this rank's own included) over the time; remote: the pairs that leave
// the rank. Times are the slowest rank's medians; bytes are the slowest rank's too.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "bench.hpp"
#include "gpu_check.hpp"
#include "timing.hpp"
#include "weft/core/error.hpp"
#include "weft/ops/ep.hpp"

namespace weft::bench {
namespace {

float bf16_to_float(std::uint16_t b) {
  const std::uint32_t u = std::uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Uniform random routing: topk distinct experts per token; weights in (0, 1).
void make_routing(std::int64_t T, int k, int E, std::uint64_t seed, std::vector<std::int64_t>& topk,
                  std::vector<float>& weights) {
  std::mt19937_64 rng(seed);
  topk.assign(static_cast<std::size_t>(T) * k, -1);
  weights.assign(static_cast<std::size_t>(T) * k, 0.f);
  std::uniform_real_distribution<float> w(0.05f, 1.f);
  std::vector<int> pick;
  for (std::int64_t t = 0; t < T; ++t) {
    pick.clear();
    while (static_cast<int>(pick.size()) < k) {
      const int e = static_cast<int>(rng() % static_cast<std::uint64_t>(E));
      if (std::find(pick.begin(), pick.end(), e) == pick.end()) pick.push_back(e);
    }
    for (int j = 0; j < k; ++j) {
      topk[t * k + j] = pick[j];
      weights[t * k + j] = w(rng);
    }
  }
}

}  // namespace

int bench_ep(const std::shared_ptr<Context>& ctx_ptr, const BenchArgs& args) {
  Context& ctx = *ctx_ptr;
  const int world = ctx.world_size(), me = ctx.rank();
  const std::int64_t T = args.ep_tokens;
  const int H = args.ep_hidden, k = args.ep_topk, E = args.ep_experts;
  WEFT_REQUIRE(E % world == 0, "weft-bench ep: --experts ", E, " is not a multiple of the world size ", world);
  const bool shared = ctx.team().shares_gpus();
  cudaStream_t stream;
  WEFT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  bool ok = true;
  std::string check = "skipped";
  double t_layout = 0, t_ld = 0, t_full = 0, t_copy = 0, t_expand = 0;
  std::int64_t pairs_bytes = 0, remote_bytes = 0, recv_rows = 0;  // recv_rows: this rank's expanded rows
  int blocks = 0;
  {
    ExpertParallel plan(ctx_ptr, {.experts = E, .hidden = H, .top_k = k, .max_tokens = T, .max_sms = args.max_sms});
    blocks = plan.blocks();
    std::vector<std::int64_t> topk;
    std::vector<float> weights;
    make_routing(T, k, E, fresh_seed(me, 0xe9), topk, weights);
    std::int64_t* d_topk = nullptr;
    float* d_w = nullptr;
    void *d_x = nullptr, *d_out = nullptr;
    WEFT_CUDA(cudaMalloc(&d_topk, topk.size() * 8));
    WEFT_CUDA(cudaMalloc(&d_w, weights.size() * 4));
    WEFT_CUDA(cudaMalloc(&d_x, static_cast<std::size_t>(T) * H * 2));
    WEFT_CUDA(cudaMalloc(&d_out, static_cast<std::size_t>(T) * H * 2));
    WEFT_CUDA(cudaMemcpy(d_topk, topk.data(), topk.size() * 8, cudaMemcpyHostToDevice));
    WEFT_CUDA(cudaMemcpy(d_w, weights.data(), weights.size() * 4, cudaMemcpyHostToDevice));
    fill_uniform(d_x, static_cast<std::uint64_t>(T) * H, "bf16", fresh_seed(me, 0x5e), stream);
    EpHandle h = plan.layout(d_topk, T, stream);
    recv_rows = h.recv_rows;
    void* d_recv = nullptr;
    WEFT_CUDA(cudaMalloc(&d_recv, std::max<std::int64_t>(h.recv_rows, 1) * H * 2));
    for (int p = 0; p < world; ++p) {
      pairs_bytes += h.tokens_to[p] * H * 2;
      if (p != me) remote_bytes += h.tokens_to[p] * H * 2;
    }

    // Check: identity experts (y = recv_x), so out[t] = x[t] x (sum of its weights).
    plan.dispatch(h, d_x, d_w, d_recv, nullptr, stream);
    if (args.check) {
      poison(d_out, static_cast<std::uint64_t>(T) * H * 2, 0x5A, stream);
      plan.combine(h, d_recv, d_out, stream);
      std::vector<std::uint16_t> x(static_cast<std::size_t>(T) * H), out(x.size());
      ctx.synchronize(stream);
      WEFT_CUDA(cudaMemcpy(x.data(), d_x, x.size() * 2, cudaMemcpyDeviceToHost));
      WEFT_CUDA(cudaMemcpy(out.data(), d_out, out.size() * 2, cudaMemcpyDeviceToHost));
      std::int64_t bad = 0;
      for (std::int64_t t = 0; t < T; ++t) {
        double sw = 0;
        for (int j = 0; j < k; ++j) sw += weights[t * k + j];
        for (int c = 0; c < H; ++c) {
          const double xv = bf16_to_float(x[t * H + c]), ref = xv * sw, got = bf16_to_float(out[t * H + c]);
          if (!(std::fabs(got - ref) <= std::fabs(xv) * sw / 128 + 1e-37)) ++bad;
        }
      }
      check = bad ? str("FAIL(", bad, " values)") : "ok";
    } else {
      plan.combine(h, d_recv, d_out, stream);
    }
    for (auto& verdict : ctx.store().all_gather(check, "ep check verdicts"))
      if (verdict != "ok" && verdict != "skipped") check = verdict;
    ok = check == "ok" || check == "skipped";

    // The copy bound: this rank's token-rank pairs into a symmetric buffer of each rank, at once.
    SymmetricBuffer sink(ctx.heap(), static_cast<std::uint64_t>(std::max<std::int64_t>(T, 1)) * H * 2, "bf16",
                         "bench.ep.copy_bound");
    std::vector<cudaStream_t> sides(world);
    std::vector<cudaEvent_t> done(world);
    cudaEvent_t fork;
    WEFT_CUDA(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    for (int p = 0; p < world; ++p) {
      WEFT_CUDA(cudaStreamCreateWithFlags(&sides[p], cudaStreamNonBlocking));
      WEFT_CUDA(cudaEventCreateWithFlags(&done[p], cudaEventDisableTiming));
    }
    const std::vector<std::int64_t> to = h.tokens_to;
    auto copy_bound = [&] {
      WEFT_CUDA(cudaEventRecord(fork, stream));
      for (int p = 0; p < world; ++p) {
        WEFT_CUDA(cudaStreamWaitEvent(sides[p], fork));
        if (to[p] > 0)
          WEFT_CUDA(cudaMemcpyAsync(ctx.heap().peer_ptr(sink.get(), p), d_x, static_cast<std::size_t>(to[p]) * H * 2,
                                    cudaMemcpyDeviceToDevice, sides[p]));
        WEFT_CUDA(cudaEventRecord(done[p], sides[p]));
        WEFT_CUDA(cudaStreamWaitEvent(stream, done[p]));
      }
    };
    // Every contender below runs whole calls in the plan's order. layout reads the counts on
    // the host, so these samples cannot hold the stream (--no-hold's method, timing.hpp).
    auto layout_only = [&] { plan.layout(d_topk, T, stream); };
    auto layout_dispatch = [&] {
      const EpHandle hh = plan.layout(d_topk, T, stream);
      plan.dispatch(hh, d_x, d_w, d_recv, nullptr, stream);
    };
    auto full = [&] {
      const EpHandle hh = plan.layout(d_topk, T, stream);
      plan.dispatch(hh, d_x, d_w, d_recv, nullptr, stream);
      plan.combine(hh, d_recv, d_out, stream);
    };
    if (me == 0) std::fprintf(stderr, "[weft-bench] ep %lld tokens, hidden %d, top-%d of %d experts ...\n",
                              static_cast<long long>(T), H, k, E);
    const std::vector<double> t = time_interleaved(ctx, stream, {layout_only, layout_dispatch, full}, 1, args.samples,
                                                   args.warmup, false);
    t_layout = t[0];
    t_ld = t[1];
    t_full = t[2];
    t_copy = time_per_call(ctx, stream, copy_bound, 1, args.samples, args.warmup, args.hold);
    const std::size_t recv_bytes = static_cast<std::size_t>(std::max<std::int64_t>(h.recv_rows, 1)) * H * 2;
    auto expand_write = [&] { WEFT_CUDA(cudaMemsetAsync(d_recv, 0x3c, recv_bytes, stream)); };
    t_expand = time_per_call(ctx, stream, expand_write, 1, args.samples, args.warmup, args.hold);
    ctx.synchronize(stream);
    for (int p = 0; p < world; ++p) {
      cudaStreamDestroy(sides[p]);
      cudaEventDestroy(done[p]);
    }
    cudaEventDestroy(fork);
    cudaFree(d_topk);
    cudaFree(d_w);
    cudaFree(d_x);
    cudaFree(d_out);
    cudaFree(d_recv);
  }
  WEFT_CUDA(cudaStreamDestroy(stream));
  // The slowest rank's bytes (its time is already the slowest's).
  std::int64_t max_pairs = 0, max_remote = 0;
  for (auto& v : ctx.store().all_gather(str(pairs_bytes, " ", remote_bytes), "ep bytes")) {
    long long a = 0, b = 0;
    std::sscanf(v.c_str(), "%lld %lld", &a, &b);
    max_pairs = std::max<std::int64_t>(max_pairs, a);
    max_remote = std::max<std::int64_t>(max_remote, b);
  }
  const double t_dispatch = t_ld - t_layout, t_combine = t_full - t_ld;
  const double t_bound = t_copy + t_expand;  // pairs over the links, then the expanded rows written
  auto gbs = [](std::int64_t bytes, double us) { return us > 0 ? bytes / us / 1e3 : 0.0; };
  if (me == 0) {
    if (args.json) {
      std::printf("{\"op\":\"ep\",\"world\":%d,\"tokens\":%lld,\"hidden\":%d,\"topk\":%d,\"experts\":%d,\"sms\":%d,"
                  "\"layout_us\":%.3f,\"layout_dispatch_us\":%.3f,\"full_us\":%.3f,\"dispatch_us\":%.3f,"
                  "\"combine_us\":%.3f,\"copy_bound_us\":%.3f,\"expand_write_us\":%.3f,\"bound_us\":%.3f,"
                  "\"recv_rows\":%lld,\"pair_bytes\":%lld,\"remote_bytes\":%lld,"
                  "\"dispatch_gbs\":%.2f,\"combine_gbs\":%.2f,\"copy_bound_gbs\":%.2f,\"shared_gpu\":%s,"
                  "\"check\":\"%s\"}\n",
                  world, static_cast<long long>(T), H, k, E, blocks, t_layout, t_ld, t_full, t_dispatch, t_combine,
                  t_copy, t_expand, t_bound, static_cast<long long>(recv_rows), static_cast<long long>(max_pairs),
                  static_cast<long long>(max_remote),
                  gbs(max_pairs, t_dispatch), gbs(max_pairs, t_combine), gbs(max_pairs, t_copy),
                  shared ? "true" : "false", check.c_str());
    } else {
      std::printf("ep, %d ranks, %lld tokens per rank, hidden %d, top-%d of %d experts, %d SMs; us per call "
                  "(median of %d samples, max over ranks)\n",
                  world, static_cast<long long>(T), H, k, E, blocks, args.samples);
      if (shared)
        std::printf("Ranks share a GPU: times are not performance figures (a record of the run only).\n");
      std::printf("bytes per rank (slowest): %.1f MB of token-rank pairs, %.1f MB of them remote; %lld rows received "
                  "on rank 0\n",
                  max_pairs / 1e6, max_remote / 1e6, static_cast<long long>(recv_rows));
      std::printf("%-18s %10s %10s %12s\n", "", "us", "GB/s", "remote GB/s");
      std::printf("%-18s %10.2f %10s %12s\n", "layout", t_layout, "", "");
      std::printf("%-18s %10.2f %10.1f %12.1f\n", "dispatch", t_dispatch, gbs(max_pairs, t_dispatch),
                  gbs(max_remote, t_dispatch));
      std::printf("%-18s %10.2f %10.1f %12.1f\n", "combine", t_combine, gbs(max_pairs, t_combine),
                  gbs(max_remote, t_combine));
      std::printf("%-18s %10.2f %10.1f %12.1f\n", "layout+dispatch", t_ld, gbs(max_pairs, t_ld), gbs(max_remote, t_ld));
      std::printf("%-18s %10.2f %10s %12s\n", "all three", t_full, "", "");
      std::printf("%-18s %10.2f %10.1f %12.1f   (copy engines, same bytes)\n", "copy bound", t_copy,
                  gbs(max_pairs, t_copy), gbs(max_remote, t_copy));
      std::printf("%-18s %10.2f %10.1f %12s   (memset of rank 0's %.1f MB of expanded rows)\n", "expanded write",
                  t_expand, gbs(recv_rows * H * 2, t_expand), "", recv_rows * H * 2 / 1e6);
      std::printf("%-18s %10.2f %10s %12s   (copy bound + expanded write)\n", "bound", t_bound, "", "");
      std::printf("dispatch / bound: %.3f, combine / bound: %.3f, dispatch / copy bound: %.3f, combine / copy bound: "
                  "%.3f (time ratios); check: %s\n",
                  t_dispatch / t_bound, t_combine / t_bound, t_dispatch / t_copy, t_combine / t_copy, check.c_str());
    }
    std::fflush(stdout);
  }
  return ok ? 0 : 3;
}

}  // namespace weft::bench
