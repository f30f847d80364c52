// weft's pingpong 128x128 c1x2 GEMM with and without its hooked scheduler and its source visitor (fifteenth session).
#include <cuda_bf16.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#include "config.hpp"
using weft::gemm_detail::Problem;
using RunFn = const char* (*)(const Problem&, cudaStream_t);
RunFn run_plain(); RunFn run_evt(); RunFn run_hooked(); RunFn run_hooked_evt();
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { std::printf("CUDA %s at %d\n", cudaGetErrorString(e), __LINE__); std::exit(1); } } while (0)
__global__ void fill(__nv_bfloat16* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned x = (unsigned)i * 2654435761u ^ seed; x ^= x >> 13; x *= 0x5bd1e995u; x ^= x >> 15;
    p[i] = __float2bfloat16(((x & 0xffff) / 65535.0f - 0.5f));
  }
}
int main() {
  cudaStream_t s; CK(cudaStreamCreate(&s));
  void* ws; CK(cudaMalloc(&ws, 64u << 20));
  int shapes[][3] = {{2048, 8192, 4096}, {1024, 8192, 4096}};
  for (auto& sh : shapes) {
    const int m = sh[0], n = sh[1], k = sh[2];
    __nv_bfloat16 *a, *b, *src, *d;
    CK(cudaMalloc(&a, (size_t)m * k * 2)); CK(cudaMalloc(&b, (size_t)n * k * 2));
    CK(cudaMalloc(&src, (size_t)m * n * 2)); CK(cudaMalloc(&d, (size_t)m * n * 2));
    fill<<<1024, 256, 0, s>>>(a, (size_t)m * k, 1 + m); fill<<<1024, 256, 0, s>>>(b, (size_t)n * k, 2 + m);
    fill<<<1024, 256, 0, s>>>(src, (size_t)m * n, 3 + m);
    struct C { std::string name; RunFn fn; bool source; long nsb, nse; };
    std::vector<C> cs = {{"plain", run_plain(), false, 0, 0},
                         {"source visitor, every row", run_evt(), true, 0, 0},
                         {"source visitor, no row", run_evt(), true, 0, m},
                         {"hooked", run_hooked(), false, 0, 0},
                         {"hooked + source visitor, every row", run_hooked_evt(), true, 0, 0},
                         {"hooked + source visitor, no row", run_hooked_evt(), true, 0, m}};
    auto call = [&](const C& c) {
      Problem p{m, n, k, a, b, d, ws, 132, 1, 1};
      if (c.source) { p.source = src; p.no_source_begin = c.nsb; p.no_source_end = c.nse; }
      if (const char* e = c.fn(p, s); *e) { std::printf("%s: %s\n", c.name.c_str(), e); std::exit(1); }
    };
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    std::vector<std::vector<float>> t(cs.size());
    const int calls = 10, rounds = 15;
    for (int r = 0; r < rounds + 2; ++r)
      for (size_t i = 0; i < cs.size(); ++i) {
        size_t j = r % 2 ? cs.size() - 1 - i : i;
        cudaEventRecord(e0, s);
        for (int c = 0; c < calls; ++c) call(cs[j]);
        cudaEventRecord(e1, s);
        CK(cudaEventSynchronize(e1));
        float ms; cudaEventElapsedTime(&ms, e0, e1);
        if (r >= 2) t[j].push_back(ms / calls);
      }
    std::vector<float> med(cs.size());
    for (size_t i = 0; i < cs.size(); ++i) { std::sort(t[i].begin(), t[i].end()); med[i] = t[i][t[i].size() / 2]; }
    for (size_t i = 0; i < cs.size(); ++i)
      std::printf("%d x %d x %d  pingpong 128x128 c1x2, swizzle 1 along M, %-36s %.4f ms  %6.1f TFLOP/s  x plain %.3f\n", m, n,
                  k, cs[i].name.c_str(), med[i], 2.0 * m * n * k / med[i] / 1e9, med[i] / med[0]);
  }
  return 0;
}
