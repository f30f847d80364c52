// Which cuBLAS kernel runs weft's GEMM baseline at M x N x K (B as [N, K]), and how long it takes.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
int main(int argc, char** argv) {
  int m = atoi(argv[1]), n = atoi(argv[2]), k = atoi(argv[3]);
  __nv_bfloat16 *a, *b, *c;
  cudaMalloc(&a, (size_t)m * k * 2); cudaMalloc(&b, (size_t)n * k * 2); cudaMalloc(&c, (size_t)m * n * 2);
  cudaMemset(a, 0x3c, (size_t)m * k * 2); cudaMemset(b, 0x3c, (size_t)n * k * 2);
  cublasHandle_t h; cublasCreate(&h);
  void* ws; cudaMalloc(&ws, 32 << 20); cublasSetWorkspace(h, ws, 32 << 20);
  float alpha = 1, beta = 0;
  auto run = [&] { return cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, b, CUDA_R_16BF, k, a, CUDA_R_16BF, k,
                                      &beta, c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT); };
  if (run() != CUBLAS_STATUS_SUCCESS) { printf("gemm failed\n"); return 1; }
  cudaDeviceSynchronize();
  setenv("CUBLASLT_LOG_LEVEL", "0", 1);
  for (int i = 0; i < 20; ++i) run();
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  std::vector<float> t;
  for (int i = 0; i < 50; ++i) { cudaEventRecord(e0); run(); cudaEventRecord(e1); cudaEventSynchronize(e1); float ms; cudaEventElapsedTime(&ms, e0, e1); t.push_back(ms); }
  std::sort(t.begin(), t.end());
  printf("%d x %d x %d: median %.4f ms, min %.4f, max %.4f, %.1f TFLOP/s at median\n", m, n, k, t[25], t[0], t[49], 2.0 * m * n * k / t[25] / 1e9);
}
