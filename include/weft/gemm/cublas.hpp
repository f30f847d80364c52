// weft/gemm/cublas.hpp - cuBLAS's GEMM in weft's terms (row-major, B as [N,K] or [K,N]).
//
// One call site for cublasGemmEx: the baseline weft-bench measures weft's
// kernels against, the engine Gemm's tuner may pick for plain plans
// (GemmOptions::allow_cublas), and the fp32 reference of the tests.
#pragma once

#include <cublas_v2.h>

#include <cstdint>

#include "weft/gemm/gemm.hpp"

namespace weft {

/// C [m, n] (row-major, type `out`) = A [m, k] x B^T (B [n, k], BLayout::nk) or
/// A x B (B [k, n], BLayout::kn), plus beta x C, inputs of type `in`, through
/// cublasGemmEx with fp32 accumulation and the default algorithm, on the
/// handle's stream. Returns cuBLAS's status; does not synchronise.
cublasStatus_t cublas_gemm(cublasHandle_t handle, std::int64_t m, std::int64_t n, std::int64_t k, DType in, DType out,
                           BLayout layout, const void* a, const void* b, void* c, float beta = 0.0f);

}  // namespace weft
