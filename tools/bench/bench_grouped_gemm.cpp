// weft-bench grouped_gemm: GroupedGemm on this rank's GPU against one dense
// cuBLAS GEMM of the same FLOPs ([rows, K] x [K, N], cublasGemmEx, fp32
// compute), the two timed in turn with CUDA events (timing.hpp), warm-up
// excluded. The rows per expert follow --routing (routing.hpp), the same
// counts tools/bench/grouped_mm_torch.py gives torch._grouped_mm. Every case is
// checked first: expert by expert against cuBLAS's fp32 output.
#include <cublas_v2.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench.hpp"
#include "gpu_check.hpp"
#include "routing.hpp"
#include "timing.hpp"
#include "weft/core/error.hpp"
#include "weft/gemm/cublas.hpp"
#include "weft/gemm/grouped_gemm.hpp"

namespace weft::bench {

int bench_grouped_gemm(const std::shared_ptr<Context>& ctx_ptr, const BenchArgs& args) {
  Context& ctx = *ctx_ptr;
  cudaStream_t stream;
  WEFT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasHandle_t handle;
  require_cublas(cublasCreate(&handle), "cublasCreate");
  require_cublas(cublasSetStream(handle, stream), "cublasSetStream");
  const DType t = parse_dtype(args.dtype);
  const BLayout layout = args.b_layout == "kn" ? BLayout::kn : BLayout::nk;
  const Routing routing = parse_routing(args.routing);
  const std::uint64_t elem = dtype_size(t);
  struct Row {
    GroupedCase c;
    std::string config, chosen_by;  // the configuration, and how GroupedGemm chose it
    double weft_us, dense_us, rel_err;
    std::int32_t most_rows;
    int empty;
  };
  std::vector<Row> rows;
  bool ok = true;
  for (const GroupedCase& c : args.grouped_cases) {
    if (ctx.rank() == 0)
      std::fprintf(stderr, "[weft-bench] grouped_gemm rows %lld, N %lld, K %lld, %d experts, %s ...\n",
                   static_cast<long long>(c.rows), static_cast<long long>(c.n), static_cast<long long>(c.k), c.experts,
                   routing_name(routing));
    const std::vector<std::int32_t> counts = routing_counts(routing, c.rows, c.experts);
    GroupedGemmOptions o;
    o.experts = c.experts;
    o.n = c.n;
    o.k = c.k;
    o.max_rows = c.rows;
    o.dtype = t;
    o.w_layout = layout;
    o.config = args.config;
    o.autotune = args.grouped_tune;
    GroupedGemm grouped(o);
    const std::uint64_t a_n = c.rows * c.k, w_n = std::uint64_t(c.experts) * c.n * c.k, out_n = c.rows * c.n;
    void *a, *w, *out, *dense_out;
    float* ref;
    std::int32_t* dcounts;
    WEFT_CUDA(cudaMalloc(&a, a_n * elem));
    WEFT_CUDA(cudaMalloc(&w, w_n * elem));
    WEFT_CUDA(cudaMalloc(&out, out_n * elem));
    WEFT_CUDA(cudaMalloc(&dense_out, out_n * elem));
    WEFT_CUDA(cudaMalloc(&ref, out_n * 4));
    WEFT_CUDA(cudaMalloc(&dcounts, counts.size() * 4));
    WEFT_CUDA(cudaMemcpy(dcounts, counts.data(), counts.size() * 4, cudaMemcpyHostToDevice));
    fill_uniform(a, a_n, args.dtype, fresh_seed(ctx.rank(), 1), stream);
    fill_uniform(w, w_n, args.dtype, fresh_seed(ctx.rank(), 2), stream);
    const GroupedGemmArgs run_args{.a = a, .w = w, .out = out, .expert_rows = dcounts};
    poison(out, out_n * elem, 0xFF, stream);  // NaNs where nothing was written
    grouped.run(run_args, stream);  // with --tune, this first run times every configuration on these counts
    grouped.check_counts(stream);
    // The reference: each expert's rows by cuBLAS, fp32 accumulation and output.
    std::int64_t first = 0;
    for (int e = 0; e < c.experts; ++e) {
      if (counts[e] > 0)
        require_cublas(cublas_gemm(handle, counts[e], c.n, c.k, t, DType::fp32, layout,
                                   static_cast<const char*>(a) + first * c.k * elem,
                                   static_cast<const char*>(w) + std::uint64_t(e) * c.n * c.k * elem, ref + first * c.n),
                       "cublasGemmEx (reference)");
      first += counts[e];
    }
    const double err = relative_error_vs_fp32(out, args.dtype, ref, out_n, stream);
    ok &= err <= 1e-2;
    // The same FLOPs as one dense GEMM: [rows, K] x expert 0's weight.
    auto run_dense = [&] {
      require_cublas(cublas_gemm(handle, c.rows, c.n, c.k, t, t, layout, a, w, dense_out), "cublasGemmEx");
    };
    const int calls = 5;
    const std::vector<double> us = time_interleaved(ctx, stream, {[&] { grouped.run(run_args, stream); }, run_dense},
                                                    calls, args.samples, args.warmup, args.hold, args.order);
    rows.push_back({c, grouped.config(), grouped.chosen_by(), us[0], us[1], err, *std::max_element(counts.begin(), counts.end()),
                    static_cast<int>(std::count(counts.begin(), counts.end(), 0))});
    for (void* p : {a, w, out, dense_out, static_cast<void*>(ref), static_cast<void*>(dcounts)}) cudaFree(p);
  }
  cublasDestroy(handle);
  WEFT_CUDA(cudaStreamDestroy(stream));
  if (ctx.rank() == 0) {
    auto tflops = [](const GroupedCase& c, double us) { return 2.0 * c.rows * c.n * c.k / (us * 1e-6) / 1e12; };
    if (args.json) {
      for (const Row& r : rows)
        std::printf("{\"op\":\"grouped_gemm\",\"rows\":%lld,\"n\":%lld,\"k\":%lld,\"experts\":%d,\"routing\":\"%s\","
                    "\"layout\":\"%s\",\"dtype\":\"%s\",\"config\":\"%s\",\"chosen_by\":\"%s\",\"weft_us\":%.2f,\"weft_tflops\":%.1f,"
                    "\"dense_us\":%.2f,\"dense_tflops\":%.1f,\"vs_dense\":%.3f,\"most_rows\":%d,\"empty_experts\":%d,"
                    "\"rel_err\":%.2e}\n",
                    static_cast<long long>(r.c.rows), static_cast<long long>(r.c.n), static_cast<long long>(r.c.k),
                    r.c.experts, routing_name(routing), args.b_layout.c_str(), args.dtype.c_str(), r.config.c_str(),
                    r.chosen_by.c_str(), r.weft_us, tflops(r.c, r.weft_us), r.dense_us, tflops(r.c, r.dense_us), r.dense_us / r.weft_us,
                    r.most_rows, r.empty, r.rel_err);
    } else {
      std::printf("grouped_gemm %s, W %s, routing %s; us per call (median of %d samples of 5 back-to-back calls, weft "
                  "and cuBLAS in turn, %s order, max over ranks);\nTFLOP/s = 2 x rows x N x K / time; dense = one "
                  "cuBLAS GEMM [rows, K] x [K, N] of the same FLOPs; ratio = weft TFLOP/s / dense TFLOP/s;\nrel err = "
                  "||weft - ref|| / ||ref||, ref = cuBLAS fp32 output per expert\n",
                  args.dtype.c_str(), layout == BLayout::nk ? "[E, N, K]" : "[E, K, N]", routing_name(routing),
                  args.samples, sample_order_name(args.order));
      std::printf("%6s %6s %6s %5s | %9s %5s | %-28s %-12s | %9s %7s | %9s %7s | %6s | %s\n", "rows", "N", "K", "E",
                  "most rows", "empty", "weft config", "chosen by", "weft us", "TFLOP/s", "dense us", "TFLOP/s", "ratio",
                  "rel err");
      for (const Row& r : rows)
        std::printf("%6lld %6lld %6lld %5d | %9d %5d | %-28s %-12s | %9.1f %7.1f | %9.1f %7.1f | %6.3f | %.1e\n",
                    static_cast<long long>(r.c.rows), static_cast<long long>(r.c.n), static_cast<long long>(r.c.k),
                    r.c.experts, r.most_rows, r.empty, r.config.c_str(), r.chosen_by.c_str(), r.weft_us,
                    tflops(r.c, r.weft_us),
                    r.dense_us, tflops(r.c, r.dense_us), r.dense_us / r.weft_us, r.rel_err);
    }
    std::fflush(stdout);
  }
  return ok ? 0 : 3;
}

}  // namespace weft::bench
