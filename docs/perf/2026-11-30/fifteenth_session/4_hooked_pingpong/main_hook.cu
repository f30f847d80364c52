// weft's pingpong 128x128 c1x2 GEMM, plain against hooked (whichever tile_hooks.cuh variant this build took).
#include <cuda_bf16.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#include "config.hpp"
using weft::gemm_detail::Problem;
using RunFn = const char* (*)(const Problem&, cudaStream_t);
RunFn run_plain(); RunFn run_hooked();
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { std::printf("CUDA %s at %d\n", cudaGetErrorString(e), __LINE__); std::exit(1); } } while (0)
__global__ void fill(__nv_bfloat16* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned x = (unsigned)i * 2654435761u ^ seed; x ^= x >> 13; x *= 0x5bd1e995u; x ^= x >> 15;
    p[i] = __float2bfloat16(((x & 0xffff) / 65535.0f - 0.5f));
  }
}
int main(int argc, char** argv) {
  const char* tag = argc > 1 ? argv[1] : "";
  cudaStream_t s; CK(cudaStreamCreate(&s));
  void* ws; CK(cudaMalloc(&ws, 64u << 20));
  int shapes[][3] = {{2048, 8192, 4096}, {1024, 8192, 4096}};
  for (auto& sh : shapes) {
    const int m = sh[0], n = sh[1], k = sh[2];
    __nv_bfloat16 *a, *b, *d;
    CK(cudaMalloc(&a, (size_t)m * k * 2)); CK(cudaMalloc(&b, (size_t)n * k * 2)); CK(cudaMalloc(&d, (size_t)m * n * 2));
    fill<<<1024, 256, 0, s>>>(a, (size_t)m * k, 1 + m); fill<<<1024, 256, 0, s>>>(b, (size_t)n * k, 2 + m);
    RunFn fns[2] = {run_plain(), run_hooked()};
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    std::vector<float> t[2];
    for (int r = 0; r < 22; ++r)
      for (int i = 0; i < 2; ++i) {
        int j = r % 2 ? 1 - i : i;
        Problem p{m, n, k, a, b, d, ws, 132, 1, 1};
        cudaEventRecord(e0, s);
        for (int c = 0; c < 10; ++c) if (const char* e = fns[j](p, s); *e) { std::printf("%s\n", e); return 1; }
        cudaEventRecord(e1, s);
        CK(cudaEventSynchronize(e1));
        float ms; cudaEventElapsedTime(&ms, e0, e1);
        if (r >= 2) t[j].push_back(ms / 10);
      }
    for (auto& v : t) std::sort(v.begin(), v.end());
    std::printf("%s %d x %d x %d  plain %.4f ms  hooked %.4f ms  x plain %.3f\n", tag, m, n, k, t[0][10], t[1][10], t[1][10] / t[0][10]);
  }
  return 0;
}
