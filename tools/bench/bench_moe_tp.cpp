// weft-bench moe_tp: MoE under tensor parallelism: AgMoe (AllGather of the
// tokens + the sort by expert + the up-projection's grouped GEMM) on its
// sequential and on its overlapped path (mode fused: the routing heads
// gathered first, the rows on the copy engines, a GEMM per source rank's
// regions), and MoeRs (the down-projection's grouped GEMM + the top-k weighted
// sum + ReduceScatter) on its sequential and on its overlapped path (mode
// fused: a GEMM per destination rank's regions, each slice of partial sums
// on the copy engines while the next computes), each against its own grouped
// GEMM alone on the same counts and configuration (the overlapped paths where
// every peer is mapped, one node; elsewhere their columns read "-"): the GEMM is the bound a perfectly overlapped
// operator would reach, so the ratio is what the gather, the sort and the
// scatter cost.
//
// Each case is the layer's: T tokens over all ranks (rank r holds a contiguous
// T / W of them), hidden H, F the experts' intermediate size (each rank holds
// F / W of every expert's W_up rows and W_down columns), E experts, top-k. The
// pairs per expert are routing_counts(--routing, T x k, E), as weft-bench
// grouped_gemm and tools/bench/grouped_mm_torch.py count them: the pairs,
// sorted by expert, are dealt to the slots column by column (slot j of token t
// takes pair j x T + t), so a token names one expert twice only where that
// expert holds more than T pairs. MoeRs takes AgMoe's output as its input
// (no activation between them: a bench, not a model).
//
// --check: a few tokens of every rank against a float64 layer computed on the
// host from every rank's seeds (fill_uniform's values, uniform_value here),
// once through the sequential paths and once through the overlapped ones;
// the larger error is reported.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "bench.hpp"
#include "gpu_check.hpp"
#include "routing.hpp"
#include "timing.hpp"
#include "weft/core/error.hpp"
#include "weft/gemm/grouped_gemm.hpp"
#include "weft/ops/moe_tp.hpp"

namespace weft::bench {
namespace {

// Rank r's tokens: [first, first + count) of the T, the first T % W ranks one more.
std::int64_t tokens_of(std::int64_t T, int world, int r) { return T / world + (r < T % world ? 1 : 0); }
std::int64_t first_token(std::int64_t T, int world, int r) {
  return static_cast<std::int64_t>(r) * (T / world) + std::min<std::int64_t>(r, T % world);
}
// Rank r's slice of F: [first, first + count), the first F % W ranks 8 more where F / W rounds
// to multiples of 8 (16-byte rows): every slice a positive multiple of 8.
std::int64_t slice_of(std::int64_t F, int world, int r) { return 8 * tokens_of(F / 8, world, r); }

// The layer's routing over all T tokens: expert ids [T][k] and weights [T][k].
void make_routing(Routing routing, std::int64_t T, int k, int E, std::vector<std::int64_t>& topk,
                  std::vector<float>& weights) {
  const std::vector<std::int32_t> counts = routing_counts(routing, T * k, E);
  std::vector<std::int64_t> sorted;
  sorted.reserve(static_cast<std::size_t>(T) * k);
  for (int e = 0; e < E; ++e) sorted.insert(sorted.end(), counts[e], e);
  topk.assign(static_cast<std::size_t>(T) * k, -1);
  weights.assign(topk.size(), 0.f);
  for (std::int64_t t = 0; t < T; ++t) {
    float sum = 0;
    for (int j = 0; j < k; ++j) {
      topk[t * k + j] = sorted[static_cast<std::size_t>(j) * T + t];
      weights[t * k + j] = 1.f + static_cast<float>((t * 7 + j * 3) % 5);
      sum += weights[t * k + j];
    }
    for (int j = 0; j < k; ++j) weights[t * k + j] /= sum;  // a softmax's shape: positive, summing to 1
  }
}

// A fused path's time where it could not run (some peer not mapped): -1 in JSON, "-" in the table.
constexpr double kNotRun = -1;

struct Seeds {
  std::uint64_t x, up, down;
};

}  // namespace

int bench_moe_tp(const std::shared_ptr<Context>& ctx_ptr, const BenchArgs& args) {
  Context& ctx = *ctx_ptr;
  const int W = ctx.world_size(), me = ctx.rank();
  cudaStream_t stream;
  WEFT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const DType t = parse_dtype(args.dtype);
  const Routing routing = parse_routing(args.routing);
  const std::uint64_t es = dtype_size(t);
  struct Row {
    MoeTpCase c;
    std::string up_config, down_config;
    double ag_us, ag_fused_us, up_us, rs_us, rs_fused_us, down_us, rel_err;
    std::int64_t pairs;
    bool ok;  // this case's check (true when unchecked)
  };
  std::vector<Row> rows;
  bool ok = true;
  for (const MoeTpCase& c : args.moe_tp_cases) {
    if (me == 0)
      std::fprintf(stderr, "[weft-bench] moe_tp T %lld, H %lld, F %lld, %d experts, top-%d, %s ...\n",
                   static_cast<long long>(c.tokens), static_cast<long long>(c.hidden), static_cast<long long>(c.ffn),
                   c.experts, c.top_k, routing_name(routing));
    const std::int64_t H = c.hidden, T = c.tokens, cap = tokens_of(T, W, 0);
    const std::int64_t T_me = tokens_of(T, W, me), t0 = first_token(T, W, me);
    const std::int64_t F_me = slice_of(c.ffn, W, me);
    std::vector<std::int64_t> topk_all;
    std::vector<float> weights_all;
    make_routing(routing, T, c.top_k, c.experts, topk_all, weights_all);
    AgMoe up(ctx_ptr, {.experts = c.experts, .hidden = H, .n_local = F_me, .top_k = c.top_k,
                       .max_tokens_per_rank = cap, .dtype = t, .max_sms = args.max_sms,
                       .mode = OverlapMode::sequential});
    MoeRs down(ctx_ptr, {.experts = c.experts, .hidden = H, .k_local = F_me, .top_k = c.top_k,
                         .max_tokens_per_rank = cap, .dtype = t, .max_sms = args.max_sms,
                         .mode = OverlapMode::sequential});
    // The overlapped paths need every peer mapped (one node): elsewhere only the sequential ones run.
    const bool fused_paths = ctx.all_peers_direct();
    std::unique_ptr<AgMoe> up_fused;
    std::unique_ptr<MoeRs> down_fused;
    if (fused_paths) {
      up_fused = std::make_unique<AgMoe>(
          ctx_ptr, AgMoeOptions{.experts = c.experts, .hidden = H, .n_local = F_me, .top_k = c.top_k,
                                .max_tokens_per_rank = cap, .dtype = t, .max_sms = args.max_sms,
                                .mode = OverlapMode::fused});
      down_fused = std::make_unique<MoeRs>(
          ctx_ptr, MoeRsOptions{.experts = c.experts, .hidden = H, .k_local = F_me, .top_k = c.top_k,
                                .max_tokens_per_rank = cap, .dtype = t, .max_sms = args.max_sms,
                                .mode = OverlapMode::fused});
    }
    const std::int64_t max_rows = up.max_rows();
    // Every rank's seeds, so the check can rebuild any rank's inputs on the host.
    const Seeds mine{fresh_seed(me, 31), fresh_seed(me, 32), fresh_seed(me, 33)};
    std::vector<Seeds> seeds(W);
    const auto all = ctx.store().all_gather(
        std::string_view(reinterpret_cast<const char*>(&mine), sizeof mine), "moe_tp seeds");
    for (int r = 0; r < W; ++r) std::memcpy(&seeds[r], all[r].data(), sizeof(Seeds));

    void *x = nullptr, *w_up = nullptr, *w_down = nullptr, *h = nullptr, *out = nullptr, *a = nullptr,
         *y = nullptr;
    std::int64_t* d_topk = nullptr;
    float* d_w = nullptr;
    const std::uint64_t up_n = std::uint64_t(c.experts) * F_me * H;
    WEFT_CUDA(cudaMalloc(&x, std::max<std::int64_t>(T_me, 1) * H * es));
    WEFT_CUDA(cudaMalloc(&w_up, up_n * es));
    WEFT_CUDA(cudaMalloc(&w_down, up_n * es));
    WEFT_CUDA(cudaMalloc(&h, max_rows * F_me * es));
    WEFT_CUDA(cudaMalloc(&out, std::max<std::int64_t>(T_me, 1) * H * es));
    WEFT_CUDA(cudaMalloc(&a, max_rows * H * es));  // the up GEMM alone: any rows of A
    WEFT_CUDA(cudaMalloc(&y, max_rows * H * es));  // the down GEMM alone: its output
    WEFT_CUDA(cudaMalloc(&d_topk, std::max<std::int64_t>(T_me, 1) * c.top_k * 8));
    WEFT_CUDA(cudaMalloc(&d_w, std::max<std::int64_t>(T_me, 1) * c.top_k * 4));
    if (T_me > 0) {
      WEFT_CUDA(cudaMemcpy(d_topk, topk_all.data() + t0 * c.top_k, T_me * c.top_k * 8, cudaMemcpyHostToDevice));
      WEFT_CUDA(cudaMemcpy(d_w, weights_all.data() + t0 * c.top_k, T_me * c.top_k * 4, cudaMemcpyHostToDevice));
    }
    fill_uniform(x, std::max<std::int64_t>(T_me, 1) * H, args.dtype, mine.x, stream);
    fill_uniform(w_up, up_n, args.dtype, mine.up, stream);
    fill_uniform(w_down, up_n, args.dtype, mine.down, stream);
    fill_uniform(a, max_rows * H, args.dtype, fresh_seed(me, 34), stream);
    poison(h, max_rows * F_me * es, 0xFF, stream);
    poison(out, std::max<std::int64_t>(T_me, 1) * H * es, 0xFF, stream);
    up.run(x, d_topk, d_w, T_me, w_up, h, stream);
    down.run(h, up.routing(), w_down, out, stream);
    up.check_errors(stream);

    // Each grouped GEMM alone, on the run's counts (the routing does not change) and in its configuration.
    GroupedGemmOptions go{.experts = c.experts, .n = F_me, .k = H, .max_rows = max_rows, .dtype = t,
                          .config = up.gemm_config(), .max_sms = args.max_sms};
    GroupedGemm up_alone(go);
    go.n = H;
    go.k = F_me;
    go.config = down.gemm_config();
    GroupedGemm down_alone(go);
    const std::int32_t* counts = up.routing().expert_rows;

    double rel_err = 0;
    bool row_ok = true;
    // This rank's out against float64 on up to 4 of its tokens, the slowest rank's relative error.
    auto out_error = [&]() -> double {
      const std::int64_t step = std::max<std::int64_t>(1, T_me / 4);
      std::vector<std::int64_t> picked;
      for (std::int64_t i = 0; i < T_me && picked.size() < 4; i += step) picked.push_back(i);
      const std::int64_t n = static_cast<std::int64_t>(picked.size());
      std::vector<float> ref(static_cast<std::size_t>(std::max<std::int64_t>(n, 1)) * H, 0.f);
      for (std::int64_t p = 0; p < n; ++p) {
        const std::int64_t i = picked[p], g = t0 + i;  // this rank's token i is the layer's token g
        std::vector<double> acc(H, 0.0), xs(H);
        for (std::int64_t ch = 0; ch < H; ++ch) xs[ch] = uniform_value(args.dtype, mine.x, i * H + ch);
        for (int j = 0; j < c.top_k; ++j) {
          const std::int64_t e = topk_all[g * c.top_k + j];
          if (e < 0) continue;
          const double wj = weights_all[g * c.top_k + j];
          for (int r = 0; r < W; ++r) {  // rank r's slice of F: its W_up rows and W_down columns
            const std::int64_t n_r = slice_of(c.ffn, W, r);
            for (std::int64_t f = 0; f < n_r; ++f) {
              double u = 0;
              const std::uint64_t row = (static_cast<std::uint64_t>(e) * n_r + f) * H;
              for (std::int64_t ch = 0; ch < H; ++ch) u += xs[ch] * uniform_value(args.dtype, seeds[r].up, row + ch);
              for (std::int64_t ch = 0; ch < H; ++ch)
                acc[ch] += wj * u *
                           uniform_value(args.dtype, seeds[r].down, (static_cast<std::uint64_t>(e) * H + ch) * n_r + f);
            }
          }
        }
        for (std::int64_t ch = 0; ch < H; ++ch) ref[p * H + ch] = static_cast<float>(acc[ch]);
      }
      void* got = nullptr;
      float* d_ref = nullptr;
      WEFT_CUDA(cudaMalloc(&got, std::max<std::int64_t>(n, 1) * H * es));
      WEFT_CUDA(cudaMalloc(&d_ref, ref.size() * 4));
      WEFT_CUDA(cudaMemcpyAsync(d_ref, ref.data(), ref.size() * 4, cudaMemcpyHostToDevice, stream));
      for (std::int64_t p = 0; p < n; ++p)
        WEFT_CUDA(cudaMemcpyAsync(static_cast<char*>(got) + p * H * es, static_cast<const char*>(out) + picked[p] * H * es,
                                  H * es, cudaMemcpyDeviceToDevice, stream));
      double err = n > 0 ? relative_error_vs_fp32(got, args.dtype, d_ref, n * H, stream) : 0.0;
      ctx.synchronize(stream);
      cudaFree(got);
      cudaFree(d_ref);
      return slowest_over_ranks(ctx, {err}, "moe_tp relative errors")[0];
    };
    if (args.check) {
      rel_err = out_error();  // the sequential path's layer, run above
      if (fused_paths) {
        poison(h, max_rows * F_me * es, 0xFF, stream);
        poison(out, std::max<std::int64_t>(T_me, 1) * H * es, 0xFF, stream);
        up_fused->run(x, d_topk, d_w, T_me, w_up, h, stream);
        down_fused->run(h, up_fused->routing(), w_down, out, stream);
        rel_err = std::max(rel_err, out_error());
      }
      row_ok = rel_err <= 2e-2;  // two roundings to the input type (h, then out) over sums of thousands of terms
      ok &= row_ok;
    }

    auto run_ag = [&] { up.run(x, d_topk, d_w, T_me, w_up, h, stream); };
    auto run_ag_fused = [&] { up_fused->run(x, d_topk, d_w, T_me, w_up, h, stream); };
    auto run_up = [&] { up_alone.run({.a = a, .w = w_up, .out = h, .expert_rows = counts}, stream); };
    auto run_rs = [&] { down.run(h, up.routing(), w_down, out, stream); };
    auto run_rs_fused = [&] { down_fused->run(h, up.routing(), w_down, out, stream); };
    auto run_down = [&] { down_alone.run({.a = h, .w = w_down, .out = y, .expert_rows = counts}, stream); };
    std::vector<std::function<void()>> contenders{run_ag, run_up, run_rs, run_down};
    if (fused_paths) contenders.insert(contenders.end(), {run_ag_fused, run_rs_fused});
    const std::vector<double> us =
        time_interleaved(ctx, stream, contenders, 1, args.samples, args.warmup, args.hold, args.order);
    const double ag_fused_us = fused_paths ? us[4] : kNotRun, rs_fused_us = fused_paths ? us[5] : kNotRun;
    std::int64_t pairs = 0;
    for (std::int64_t i = 0; i < T * c.top_k; ++i) pairs += topk_all[i] >= 0;
    rows.push_back({c, up.gemm_config(), down.gemm_config(), us[0], ag_fused_us, us[1], us[2], rs_fused_us, us[3],
                    rel_err, pairs, row_ok});
    ctx.synchronize(stream);
    for (void* p : {x, w_up, w_down, h, out, a, y, static_cast<void*>(d_topk), static_cast<void*>(d_w)}) cudaFree(p);
  }
  WEFT_CUDA(cudaStreamDestroy(stream));
  if (me == 0) {
    // Per rank: every pair's row times its F / W slice, twice (up and down).
    auto tflops = [&](const Row& r, double us) {
      return 2.0 * r.pairs * (r.c.ffn / static_cast<double>(W)) * r.c.hidden / (us * 1e-6) / 1e12;
    };
    const bool shared = ctx.team().shares_gpus();
    if (args.json) {
      for (const Row& r : rows)
        std::printf("{\"op\":\"moe_tp\",\"world\":%d,\"tokens\":%lld,\"hidden\":%lld,\"ffn\":%lld,\"experts\":%d,"
                    "\"topk\":%d,\"routing\":\"%s\",\"dtype\":\"%s\",\"pairs\":%lld,\"ag_moe_us\":%.2f,"
                    "\"ag_moe_fused_us\":%.2f,\"up_gemm_us\":%.2f,\"moe_rs_us\":%.2f,\"moe_rs_fused_us\":%.2f,"
                    "\"down_gemm_us\":%.2f,\"up_config\":\"%s\","
                    "\"down_config\":\"%s\",\"rel_err\":%.2e,\"shared_gpu\":%s,\"check\":\"%s\"}\n",
                    W, static_cast<long long>(r.c.tokens), static_cast<long long>(r.c.hidden),
                    static_cast<long long>(r.c.ffn), r.c.experts, r.c.top_k, routing_name(routing),
                    args.dtype.c_str(), static_cast<long long>(r.pairs), r.ag_us, r.ag_fused_us, r.up_us, r.rs_us,
                    r.rs_fused_us, r.down_us,
                    r.up_config.c_str(), r.down_config.c_str(), r.rel_err, shared ? "true" : "false",
                    args.check ? (r.ok ? "ok" : "FAIL") : "skipped");
    } else {
      std::printf("moe_tp %s, %d ranks, routing %s; us per call (median of %d samples, each contender in turn, max "
                  "over ranks);\nag_moe = AgMoe::run (AllGather, sort, up GEMM); fused = AgMoe's overlapped path "
                  "(seq/fused: above 1, it is faster); up = its grouped GEMM alone, same counts and configuration;\nmoe_rs = MoeRs::run (down GEMM, weighted sum, ReduceScatter); fused = "
                  "MoeRs's overlapped path; down = its grouped GEMM alone; ratio = operator (sequential) / its GEMM\n",
                  args.dtype.c_str(), W, routing_name(routing), args.samples);
      if (shared) std::printf("Ranks share a GPU: times are not performance figures (a record of the run only).\n");
      std::printf("%6s %5s %6s %4s %2s | %9s %9s %9s %6s %6s %7s | %9s %9s %9s %6s %6s %7s | %s\n", "T", "H", "F",
                  "E", "k", "ag_moe", "fused", "up", "ratio", "seq/fu", "TFLOP/s", "moe_rs", "fused", "down", "ratio",
                  "seq/fu", "TFLOP/s", "rel err (check)");
      // "-" for a fused path that did not run (and for its ratio).
      auto num = [](double v, int digits) {
        if (v < 0) return std::string("-");
        char text[32];
        std::snprintf(text, sizeof text, "%.*f", digits, v);
        return std::string(text);
      };
      for (const Row& r : rows) {
        const bool ag_fused = r.ag_fused_us >= 0, rs_fused = r.rs_fused_us >= 0;
        std::printf(
            "%6lld %5lld %6lld %4d %2d | %9.1f %9s %9.1f %6.3f %6s %7.1f | %9.1f %9s %9.1f %6.3f %6s %7.1f | %s\n",
            static_cast<long long>(r.c.tokens), static_cast<long long>(r.c.hidden), static_cast<long long>(r.c.ffn),
            r.c.experts, r.c.top_k, r.ag_us, num(r.ag_fused_us, 1).c_str(), r.up_us, r.ag_us / r.up_us,
            num(ag_fused ? r.ag_us / r.ag_fused_us : kNotRun, 3).c_str(),
            tflops(r, ag_fused ? std::min(r.ag_us, r.ag_fused_us) : r.ag_us), r.rs_us,
            num(r.rs_fused_us, 1).c_str(), r.down_us, r.rs_us / r.down_us,
            num(rs_fused ? r.rs_us / r.rs_fused_us : kNotRun, 3).c_str(),
            tflops(r, rs_fused ? std::min(r.rs_us, r.rs_fused_us) : r.rs_us),
            args.check ? str(r.rel_err).c_str() : "not checked");
      }
      std::printf("configs: %s\n", [&] {
        std::string s;
        for (const Row& r : rows) s += str(s.empty() ? "" : "; ", "up ", r.up_config, ", down ", r.down_config);
        return s;
      }().c_str());
    }
    std::fflush(stdout);
  }
  return ok ? 0 : 3;
}

}  // namespace weft::bench
