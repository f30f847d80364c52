#include "decode_reference.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "weft/core/error.hpp"

namespace weft::bench {
namespace {

constexpr int kThreads = 256;

__device__ float block_reduce(float x, bool is_max, float* red) {
  red[threadIdx.x] = x;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half)
      red[threadIdx.x] = is_max ? fmaxf(red[threadIdx.x], red[threadIdx.x + half]) : red[threadIdx.x] + red[threadIdx.x + half];
    __syncthreads();
  }
  const float r = red[0];
  __syncthreads();
  return r;
}

template <class T>
__global__ void __launch_bounds__(kThreads) reference_kernel(const DecodeProblem p, float* scratch, float* out, float* lse) {
  __shared__ float red[kThreads];
  __shared__ float qs[256];
  const int row = blockIdx.x, b = row / p.q_heads, hq = row % p.q_heads;
  const int h = hq / (p.q_heads / p.kv_heads), D = p.head_dim;
  const T* q = static_cast<const T*>(p.q) + std::int64_t{row} * D;
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  const std::int64_t cap = p.block_table ? std::int64_t{p.page_size} * p.max_pages : p.max_kv_len;
  std::int64_t len = p.kv_lens[b];
  len = len < 0 ? 0 : len > cap ? cap : len;
  len = len > p.max_kv_len ? p.max_kv_len : len;  // the scratch's row length
  auto offset = [&](std::int64_t t) -> std::int64_t {
    if (!p.block_table) return ((std::int64_t{b} * p.kv_heads + h) * p.max_kv_len + t) * D;
    const std::int64_t page = p.block_table[std::int64_t{b} * p.max_pages + t / p.page_size];
    return ((page * p.kv_heads + h) * p.page_size + t % p.page_size) * D;
  };
  for (int d = threadIdx.x; d < D; d += kThreads) qs[d] = static_cast<float>(q[d]);
  __syncthreads();
  float* s = scratch + std::int64_t{row} * p.max_kv_len;
  float mx = -INFINITY;
  for (std::int64_t t = threadIdx.x; t < len; t += kThreads) {
    const T* kr = k + offset(t);
    float dot = 0.f;
    for (int d = 0; d < D; ++d) dot += qs[d] * static_cast<float>(kr[d]);
    s[t] = dot * p.scale;
    mx = fmaxf(mx, s[t]);
  }
  mx = block_reduce(mx, true, red);
  float sum = 0.f;
  for (std::int64_t t = threadIdx.x; t < len; t += kThreads) sum += expf(s[t] - mx);
  sum = block_reduce(sum, false, red);
  for (int d = threadIdx.x; d < D; d += kThreads) {
    float acc = 0.f;
    for (std::int64_t t = 0; t < len; ++t) acc += expf(s[t] - mx) * static_cast<float>(v[offset(t) + d]);
    out[std::int64_t{row} * D + d] = len > 0 ? acc / sum : 0.f;
  }
  if (threadIdx.x == 0) lse[row] = len > 0 ? mx + logf(sum) : -INFINITY;
}

}  // namespace

void decode_reference(const DecodeProblem& p, float* scratch, float* out, float* lse, cudaStream_t stream) {
  WEFT_REQUIRE(p.head_dim <= 256, "decode_reference: head_dim ", p.head_dim, " above 256");
  const unsigned blocks = static_cast<unsigned>(p.batch * p.q_heads);
  if (p.dtype == DType::fp16)
    reference_kernel<__half><<<blocks, kThreads, 0, stream>>>(p, scratch, out, lse);
  else
    reference_kernel<__nv_bfloat16><<<blocks, kThreads, 0, stream>>>(p, scratch, out, lse);
  WEFT_CUDA(cudaGetLastError());
}

}  // namespace weft::bench
