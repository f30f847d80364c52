// Source-epilogue probe: times D = A x B against D = A x B + S (TMA pipeline, or direct loads) and cuBLAS (beta 0 / 1).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <algorithm>
#include <functional>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#include "probe_kernel.cuh"
probe::RunFn pp_0(); probe::RunFn pp_1(); probe::RunFn pp_2();
probe::RunFn co_0(); probe::RunFn co_1(); probe::RunFn co_2();
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { std::printf("CUDA %s at %d\n", cudaGetErrorString(e), __LINE__); std::exit(1); } } while (0)
__global__ void fill(__nv_bfloat16* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned x = (unsigned)i * 2654435761u ^ seed; x ^= x >> 13; x *= 0x5bd1e995u; x ^= x >> 15;
    p[i] = __float2bfloat16(((x & 0xffff) / 65535.0f - 0.5f));
  }
}
__global__ void diff(const unsigned short* a, const unsigned short* b, size_t n, unsigned long long* bad) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    if (a[i] != b[i]) atomicAdd(bad, 1ull);
}
int main() {
  cudaStream_t s; CK(cudaStreamCreate(&s));
  cublasHandle_t h; cublasCreate(&h); cublasSetStream(h, s);
  void* ws; CK(cudaMalloc(&ws, 64u << 20));
  unsigned long long* bad; CK(cudaMallocManaged(&bad, 8));
  int shapes[][3] = {{2048, 8192, 4096}, {1024, 8192, 4096}, {4096, 8192, 4096}};
  for (auto& sh : shapes) {
    const int m = sh[0], n = sh[1], k = sh[2];
    __nv_bfloat16 *a, *b, *src, *d, *d2;
    CK(cudaMalloc(&a, (size_t)m * k * 2)); CK(cudaMalloc(&b, (size_t)n * k * 2));
    CK(cudaMalloc(&src, (size_t)m * n * 2)); CK(cudaMalloc(&d, (size_t)m * n * 2)); CK(cudaMalloc(&d2, (size_t)m * n * 2));
    fill<<<1024, 256, 0, s>>>(a, (size_t)m * k, 1 + m); fill<<<1024, 256, 0, s>>>(b, (size_t)n * k, 2 + m);
    fill<<<1024, 256, 0, s>>>(src, (size_t)m * n, 3 + m);
    struct C { std::string name; std::function<const char*()> f; };
    auto ours = [&](probe::RunFn fn, int sw, int ra) { return [=] { return fn(m, n, k, a, b, src, d, sw, ra, ws, s); }; };
    const float one = 1, zero = 0;
    std::vector<C> cs = {
        {"pingpong 128x128 c1x2, no source", ours(pp_0(), 1, 1)},
        {"pingpong 128x128 c1x2, source by TMA", ours(pp_1(), 1, 1)},
        {"pingpong 128x128 c1x2, source direct", ours(pp_2(), 1, 1)},
        {"coop 128x256 c2x1, no source", ours(co_0(), 2, 2)},
        {"coop 128x256 c2x1, source by TMA", ours(co_1(), 2, 2)},
        {"coop 128x256 c2x1, source direct", ours(co_2(), 2, 2)},
        {"cuBLAS beta 0", [&]() -> const char* { return cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, b, CUDA_R_16BF, k, a, CUDA_R_16BF, k, &zero, d2, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) ? "cublas" : ""; }},
        {"cuBLAS beta 1 (in place)", [&]() -> const char* { return cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, b, CUDA_R_16BF, k, a, CUDA_R_16BF, k, &one, d2, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) ? "cublas" : ""; }},
    };
    // Bits: TMA source and direct source give the same D, per kernel.
    for (int pair = 0; pair < 2; ++pair) {
      CK(cudaMemsetAsync(d, 0xff, (size_t)m * n * 2, s));
      if (const char* e = cs[3 * pair + 1].f(); *e) { std::printf("%s: %s\n", cs[3 * pair + 1].name.c_str(), e); return 1; }
      CK(cudaMemcpyAsync(d2, d, (size_t)m * n * 2, cudaMemcpyDeviceToDevice, s));
      CK(cudaMemsetAsync(d, 0xff, (size_t)m * n * 2, s));
      if (const char* e = cs[3 * pair + 2].f(); *e) { std::printf("%s: %s\n", cs[3 * pair + 2].name.c_str(), e); return 1; }
      *bad = 0;
      diff<<<1024, 256, 0, s>>>((const unsigned short*)d, (const unsigned short*)d2, (size_t)m * n, bad);
      CK(cudaStreamSynchronize(s));
      std::printf("%d x %d x %d: %s vs %s: %llu elements differ\n", m, n, k, cs[3 * pair + 2].name.c_str(),
                  cs[3 * pair + 1].name.c_str(), *bad);
    }
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    std::vector<std::vector<float>> t(cs.size());
    const int calls = 10, rounds = 15;
    for (int r = 0; r < rounds + 2; ++r)
      for (size_t i = 0; i < cs.size(); ++i) {
        size_t j = r % 2 ? cs.size() - 1 - i : i;  // alternate direction
        cudaEventRecord(e0, s);
        for (int c = 0; c < calls; ++c) cs[j].f();
        cudaEventRecord(e1, s);
        CK(cudaEventSynchronize(e1));
        float ms; cudaEventElapsedTime(&ms, e0, e1);
        if (r >= 2) t[j].push_back(ms / calls);
      }
    const double flop = 2.0 * m * n * k;
    std::vector<float> med(cs.size());
    for (size_t i = 0; i < cs.size(); ++i) { std::sort(t[i].begin(), t[i].end()); med[i] = t[i][t[i].size() / 2]; }
    for (size_t i = 0; i < cs.size(); ++i)
      std::printf("%d x %d x %d  %-40s %.4f ms  %6.1f TFLOP/s  x no-source %.3f\n", m, n, k, cs[i].name.c_str(), med[i],
                  flop / med[i] / 1e9, med[i] / med[i < 3 ? 0 : i < 6 ? 3 : 6]);
    cudaFree(a); cudaFree(b); cudaFree(src); cudaFree(d); cudaFree(d2);
  }
  return 0;
}
