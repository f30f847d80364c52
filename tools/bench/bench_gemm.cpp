// weft-bench gemm: weft's GEMM engine against cuBLAS (cublasGemmEx, fp32
// compute, default algorithm) on the same inputs, in one run.
#include <cublas_v2.h>

#include <cstdio>
#include <functional>
#include <string>

#include "bench.hpp"
#include "gpu_check.hpp"
#include "timing.hpp"
#include "weft/core/error.hpp"
#include "weft/gemm/cublas.hpp"
#include "weft/gemm/gemm.hpp"

namespace weft::bench {

void require_cublas(cublasStatus_t status, const char* what) {
  WEFT_REQUIRE(status == CUBLAS_STATUS_SUCCESS, what, " failed: cuBLAS status ", static_cast<int>(status));
}

int bench_gemm(const std::shared_ptr<Context>& ctx_ptr, const BenchArgs& args) {
  Context& ctx = *ctx_ptr;
  cudaStream_t stream;
  WEFT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasHandle_t handle;
  require_cublas(cublasCreate(&handle), "cublasCreate");
  require_cublas(cublasSetStream(handle, stream), "cublasSetStream");
  const DType in = parse_dtype(args.dtype);
  const DType out = args.out_dtype.empty() ? in : parse_dtype(args.out_dtype);
  struct Row {
    std::int64_t m, n, k;
    std::string config;
    double weft_ms, cublas_ms, rel_err;
  };
  std::vector<Row> rows;
  bool ok = true;
  for (const auto& s : args.shapes) {
    GemmOptions o;
    o.m = s[0];
    o.n = s[1];
    o.k = s[2];
    o.input = in;
    o.output = out;
    o.b_layout = args.b_layout == "kn" ? BLayout::kn : BLayout::nk;
    o.config = args.config;
    o.hook = args.hook;
    o.any_tile_order = args.any_order;
    if (ctx.rank() == 0)
      std::fprintf(stderr, "[weft-bench] gemm %lldx%lldx%lld ...\n", static_cast<long long>(o.m),
                   static_cast<long long>(o.n), static_cast<long long>(o.k));
    Gemm gemm(o);
    const std::uint64_t a_n = o.m * o.k, b_n = o.n * o.k, c_n = o.m * o.n;
    void *a, *b, *c, *c_ref, *c32;
    WEFT_CUDA(cudaMalloc(&a, a_n * dtype_size(in)));
    WEFT_CUDA(cudaMalloc(&b, b_n * dtype_size(in)));
    WEFT_CUDA(cudaMalloc(&c, c_n * dtype_size(out)));
    WEFT_CUDA(cudaMalloc(&c_ref, c_n * dtype_size(out)));
    WEFT_CUDA(cudaMalloc(&c32, c_n * 4));
    fill_uniform(a, a_n, to_string(in), fresh_seed(ctx.rank(), 1), stream);
    fill_uniform(b, b_n, to_string(in), fresh_seed(ctx.rank(), 2), stream);
    // wait_source_rows: D = A x B + S with S = 0, so the reference stays A x B
    // and the timing includes the source's load (its sum is checked by the
    // GPU tests); nothing is waited for.
    void* source = nullptr;
    if (o.hook == GemmHook::wait_source_rows) {
      WEFT_CUDA(cudaMalloc(&source, c_n * dtype_size(out)));
      WEFT_CUDA(cudaMemsetAsync(source, 0, c_n * dtype_size(out), stream));
    }
    // add_rows: the lower half of the rows (whole 256-row tiles) is added
    // into C's own rows there, zeroed before the checked run, so the
    // reference stays A x B; the timed runs keep adding (nothing waited for).
    const std::int64_t add_begin = o.hook == GemmHook::add_rows ? o.m / 2 / 256 * 256 : 0;
    const std::int64_t add_end = o.hook == GemmHook::add_rows ? o.m : 0;
    char* add_into = o.hook == GemmHook::add_rows ? static_cast<char*>(c) + add_begin * o.n * dtype_size(out) : nullptr;
    GemmArgs run_args{.a = a, .b = b, .c = c};
    if (o.hook == GemmHook::wait_source_rows)
      run_args.epilogue = AddSource{.source = source, .plain_begin = args.no_source_begin, .plain_end = args.no_source_end};
    else if (o.hook == GemmHook::add_rows)
      run_args.epilogue = ReduceAddRows{.into = add_into, .begin = add_begin, .end = add_end};
    auto run_weft = [&] { gemm.run(run_args, stream); };
    auto poison_c = [&] {  // NaN pattern: unwritten elements fail the check; added rows start at 0
      poison(c, c_n * dtype_size(out), 0xFF, stream);
      if (add_into) WEFT_CUDA(cudaMemsetAsync(add_into, 0, (add_end - add_begin) * o.n * dtype_size(out), stream));
    };
    poison_c();
    run_weft();  // first run tunes
    poison_c();
    run_weft();
    // fp32-output reference (fp32 accumulation)
    require_cublas(cublas_gemm(handle, o.m, o.n, o.k, o.input, DType::fp32, o.b_layout, a, b, c32), "cublasGemmEx");
    require_cublas(cublas_gemm(handle, o.m, o.n, o.k, o.input, out, o.b_layout, a, b, c_ref), "cublasGemmEx");
    WEFT_CUDA(cudaStreamSynchronize(stream));
    // weft's result against the fp32-accumulated, fp32-output reference.
    const double err = relative_error_vs_fp32(c, to_string(out), static_cast<const float*>(c32), c_n, stream);
    const int calls = 5;
    const std::vector<std::function<void()>> contenders = {run_weft, [&] {
      require_cublas(cublas_gemm(handle, o.m, o.n, o.k, o.input, out, o.b_layout, a, b, c_ref), "cublasGemmEx");
    }};
    const std::vector<double> us =
        time_interleaved(ctx, stream, contenders, calls, args.samples, args.warmup, args.hold, args.order);
    const double weft_us = us[0], cublas_us = us[1];
    if (args.soak_s > 0)  // each alone for a while: the clock and power each runs at (gpu_session.sh soak)
      soak(ctx, stream, contenders, {"weft " + gemm.config(), "cuBLAS"}, {weft_us / 1000, cublas_us / 1000},
           args.soak_s, str("gemm ", o.m, "x", o.n, "x", o.k));
    rows.push_back({o.m, o.n, o.k, gemm.config(), weft_us / 1000, cublas_us / 1000, err});
    ok &= err < 1e-2;
    for (void* p : {a, b, c, c_ref, c32, source}) cudaFree(p);
  }
  cublasDestroy(handle);
  WEFT_CUDA(cudaStreamDestroy(stream));
  if (ctx.rank() == 0) {
    auto tflops = [](const Row& r, double ms) { return 2.0 * r.m * r.n * r.k / (ms * 1e-3) / 1e12; };
    if (args.json) {
      for (auto& r : rows)
        std::printf("{\"op\":\"gemm\",\"m\":%lld,\"n\":%lld,\"k\":%lld,\"dtype\":\"%s\",\"b_layout\":\"%s\","
                    "\"config\":\"%s\",\"weft_ms\":%.4f,\"cublas_ms\":%.4f,\"weft_tflops\":%.1f,"
                    "\"cublas_tflops\":%.1f,\"rel_err\":%.2e,\"order\":\"%s\"}\n",
                    static_cast<long long>(r.m), static_cast<long long>(r.n), static_cast<long long>(r.k),
                    args.dtype.c_str(), args.b_layout.c_str(), r.config.c_str(), r.weft_ms, r.cublas_ms,
                    tflops(r, r.weft_ms), tflops(r, r.cublas_ms), r.rel_err, sample_order_name(args.order));
    } else {
      std::printf("gemm %s, B %s; ms per call (median of %d samples of 5 back-to-back calls, weft and cuBLAS in turn, %s order, max over ranks);\n"
                  "ratio = weft TFLOP/s / cuBLAS TFLOP/s; rel err = ||weft - ref|| / ||ref||, ref = cuBLAS fp32 output\n",
                  args.dtype.c_str(), args.b_layout == "kn" ? "[K,N]" : "[N,K]", args.samples,
                  sample_order_name(args.order));
      std::printf("%6s %6s %6s | %-30s | %8s %8s | %7s %7s | %6s | %s\n", "M", "N", "K", "weft config", "weft", "cuBLAS",
                  "TFLOP/s", "cuBLAS", "ratio", "rel err");
      for (auto& r : rows)
        std::printf("%6lld %6lld %6lld | %-30s | %8.3f %8.3f | %7.1f %7.1f | %6.3f | %.1e\n", static_cast<long long>(r.m),
                    static_cast<long long>(r.n), static_cast<long long>(r.k), r.config.c_str(), r.weft_ms, r.cublas_ms,
                    tflops(r, r.weft_ms), tflops(r, r.cublas_ms), r.cublas_ms / r.weft_ms, r.rel_err);
    }
    std::fflush(stdout);
  }
  return ok ? 0 : 3;
}

}  // namespace weft::bench
