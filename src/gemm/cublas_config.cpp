// cublas_config.cpp - cuBLAS as one more candidate of the GEMM tuner, for plain
// (unhooked) plans that allow it (GemmOptions::allow_cublas): the overlapped
// operators' sequential paths and first ring step, where weft's own kernels
// have nothing to hook and the faster engine should simply win.
#include <cublas_v2.h>

#include <map>
#include <mutex>

#include "config.hpp"
#include "weft/gemm/cublas.hpp"
#include "weft/core/error.hpp"

namespace weft {

cublasStatus_t cublas_gemm(cublasHandle_t handle, std::int64_t m, std::int64_t n, std::int64_t k, DType in, DType out,
                           BLayout layout, const void* a, const void* b, void* c, float beta) {
  auto type = [](DType t) { return t == DType::fp32 ? CUDA_R_32F : t == DType::fp16 ? CUDA_R_16F : CUDA_R_16BF; };
  const float alpha = 1.0f;
  const bool nk = layout == BLayout::nk;
  // Row-major C[m,n] = A[m,k] x op(B) is, column-major, C^T = op(B)^T x A^T.
  return cublasGemmEx(handle, nk ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                      static_cast<int>(k), &alpha, b, type(in), static_cast<int>(nk ? k : n), a, type(in),
                      static_cast<int>(k), &beta, c, type(out), static_cast<int>(n), CUBLAS_COMPUTE_32F,
                      CUBLAS_GEMM_DEFAULT);
}

namespace gemm_detail {
namespace {

constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;

struct Handle {
  cublasHandle_t handle = nullptr;
  void* workspace = nullptr;
};

// One handle (and workspace, so graph capture never allocates) per device, for the process's lifetime.
Handle& handle_for_current_device() {
  static std::mutex mutex;
  static std::map<int, Handle> handles;
  int device = 0;
  WEFT_CUDA(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  Handle& h = handles[device];
  if (!h.handle) {
    WEFT_REQUIRE(cublasCreate(&h.handle) == CUBLAS_STATUS_SUCCESS, "cublasCreate failed on device ", device);
    WEFT_CUDA(cudaMalloc(&h.workspace, kWorkspaceBytes));
  }
  return h;
}

template <DType In, DType Out, BLayout Layout>
struct CublasKernel {
  static std::size_t workspace(const Problem&) { return 0; }
  static const char* check(const Problem& p) {
    if (p.source) return "cuBLAS runs plain GEMMs only (no source)";
    return p.m < (1ll << 31) && p.n < (1ll << 31) && p.k < (1ll << 31) ? "" : "dimensions too large for cuBLAS";
  }
  static const char* run(const Problem& p, cudaStream_t stream) {
    Handle& h = handle_for_current_device();
    if (cublasSetStream(h.handle, stream) != CUBLAS_STATUS_SUCCESS) return "cublasSetStream failed";
    // cublasSetStream drops a user workspace: set it again, so capture never allocates.
    if (cublasSetWorkspace(h.handle, h.workspace, kWorkspaceBytes) != CUBLAS_STATUS_SUCCESS)
      return "cublasSetWorkspace failed";
    return cublas_gemm(h.handle, p.m, p.n, p.k, In, Out, Layout, p.a, p.b, p.c) == CUBLAS_STATUS_SUCCESS
               ? ""
               : "cublasGemmEx failed";
  }
  static const Config* config() {
    static const Config c{In,         Out,    Layout, "cuBLAS (cublasGemmEx)", 128, 256, 1, 1, false, false, false,
                          &workspace, &check, &run,   true};
    return &c;
  }
};

}  // namespace

const std::vector<const Config*>& cublas_configs() {
  static const std::vector<const Config*> configs = {
      CublasKernel<DType::bf16, DType::bf16, BLayout::nk>::config(),
      CublasKernel<DType::bf16, DType::bf16, BLayout::kn>::config(),
      CublasKernel<DType::bf16, DType::fp32, BLayout::nk>::config(),
      CublasKernel<DType::bf16, DType::fp32, BLayout::kn>::config(),
      CublasKernel<DType::fp16, DType::fp16, BLayout::nk>::config(),
      CublasKernel<DType::fp16, DType::fp16, BLayout::kn>::config(),
      CublasKernel<DType::fp16, DType::fp32, BLayout::nk>::config(),
      CublasKernel<DType::fp16, DType::fp32, BLayout::kn>::config(),
  };
  return configs;
}

}  // namespace gemm_detail
}  // namespace weft
