// The GEMM engine on one GPU: every configuration, both B layouts, bf16/fp16,
// fp32 output, M not a multiple of the tile, against cuBLAS's fp32-accumulated
// fp32 result; and the errors for shapes it cannot take.
#include <cublas_v2.h>

#include "gpu_check.hpp"
#include "gpu_test.hpp"
#include "weft/core/error.hpp"
#include "weft/gemm/cublas.hpp"
#include "weft/gemm/gemm.hpp"

using namespace weft;
using weft::test::ctx;

namespace {

// fp32 reference: row-major C[M,N] = A[M,K] x op(B), fp32 accumulation and output.
void reference(cublasHandle_t h, const GemmOptions& o, const void* a, const void* b, float* c) {
  ASSERT_EQ(cublas_gemm(h, o.m, o.n, o.k, o.input, DType::fp32, o.b_layout, a, b, c), CUBLAS_STATUS_SUCCESS);
}

double gemm_error(GemmOptions o, cublasHandle_t h) {
  cudaStream_t s = test::stream();
  const std::uint64_t a_n = o.m * o.k, b_n = o.n * o.k, c_n = o.m * o.n;
  void *a, *b, *c;
  float* ref;
  WEFT_CUDA(cudaMalloc(&a, a_n * dtype_size(o.input)));
  WEFT_CUDA(cudaMalloc(&b, b_n * dtype_size(o.input)));
  WEFT_CUDA(cudaMalloc(&c, c_n * dtype_size(o.output)));
  WEFT_CUDA(cudaMalloc(&ref, c_n * 4));
  bench::fill_uniform(a, a_n, to_string(o.input), bench::fresh_seed(ctx().rank(), o.m), s);
  bench::fill_uniform(b, b_n, to_string(o.input), bench::fresh_seed(ctx().rank(), o.n), s);
  bench::poison(c, c_n * dtype_size(o.output), 0xFF, s);  // NaNs where nothing was written
  Gemm gemm(o);
  gemm.run(a, b, c, s);
  cublasSetStream(h, s);
  reference(h, o, a, b, ref);
  double err = bench::relative_error_vs_fp32(c, to_string(o.output), ref, c_n, s);
  for (void* p : {a, b, c, static_cast<void*>(ref)}) cudaFree(p);
  return err;
}

struct Cublas {
  cublasHandle_t h = nullptr;
  Cublas() { cublasCreate(&h); }
  ~Cublas() { cublasDestroy(h); }
};

}  // namespace

TEST(Gemm, EveryConfigurationMatchesTheFp32Reference) {
  Cublas cb;
  for (DType in : {DType::bf16, DType::fp16})
    for (BLayout layout : {BLayout::nk, BLayout::kn}) {
      GemmOptions o{1000, 1024, 512, in, in, layout};
      Gemm probe(o);
      for (const std::string& name : probe.configurations()) {
        o.config = name;
        EXPECT_LT(gemm_error(o, cb.h), 1e-2) << to_string(in) << (layout == BLayout::nk ? " nk " : " kn ") << name;
      }
    }
}

TEST(Gemm, ShapesOfTheTensorParallelBenchmarksAreRight) {
  Cublas cb;
  for (std::int64_t m : {1000, 2048, 4096, 8192}) {
    EXPECT_LT(gemm_error({m, 4096, 8192}, cb.h), 1e-2) << "M = " << m;
  }
  EXPECT_LT(gemm_error({1, 8, 8}, cb.h), 1e-2) << "the smallest shape";
  EXPECT_LT(gemm_error({777, 1000, 136}, cb.h), 1e-2) << "nothing a multiple of the tile";
  GemmOptions f32{512, 512, 512, DType::bf16, DType::fp32};
  EXPECT_LT(gemm_error(f32, cb.h), 1e-5) << "fp32 output";
}

TEST(Gemm, RejectsShapesItCannotTakeNamingWhy) {
  auto error_of = [](GemmOptions o) {
    try {
      Gemm g(o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of({64, 64, 100}).find("K = 100 must be a multiple of 8"), std::string::npos);
  EXPECT_NE(error_of({64, 100, 64, DType::bf16, DType::bf16, BLayout::kn}).find("N = 100 must be a multiple of 8"),
            std::string::npos);
  EXPECT_NE(error_of({0, 64, 64}).find("must be positive"), std::string::npos);
  EXPECT_NE(error_of({64, 64, 64, DType::fp32}).find("inputs must be bf16 or fp16"), std::string::npos);
  GemmOptions named{64, 64, 64};
  named.config = "no such tile";
  EXPECT_NE(error_of(named).find("available:"), std::string::npos);
}
