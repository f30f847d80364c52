#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "gpu_check.hpp"
#include "weft/core/error.hpp"
#include "weft/device/copy.cuh"

namespace weft::bench {
namespace {

template <class T>
__device__ unsigned long long memcmp_bits(const T* x, const T* y) {
  const unsigned char *a = reinterpret_cast<const unsigned char*>(x), *b = reinterpret_cast<const unsigned char*>(y);
  for (unsigned k = 0; k < sizeof(T); ++k)
    if (a[k] != b[k]) return 1;
  return 0;
}

__host__ __device__ std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__device__ unsigned char random_byte(std::uint64_t seed, std::uint64_t i) {
  return static_cast<unsigned char>(splitmix64(seed ^ (i / 8)) >> (8 * (i % 8)));
}

__global__ void fill_kernel(unsigned char* p, std::uint64_t bytes, std::uint64_t seed) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < bytes;
       i += std::uint64_t{gridDim.x} * blockDim.x)
    p[i] = random_byte(seed, i);
}

__global__ void compare_kernel(const unsigned char* a, const unsigned char* b, std::uint64_t bytes,
                               std::uint64_t seed, bool against_seed, unsigned long long* mismatches) {
  unsigned long long local = 0;
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < bytes;
       i += std::uint64_t{gridDim.x} * blockDim.x)
    local += a[i] != (against_seed ? random_byte(seed, i) : b[i]);
  if (local) atomicAdd(mismatches, local);
}

int grid_for(std::uint64_t bytes) {
  return static_cast<int>(std::min<std::uint64_t>(1024, (bytes + 255) / 256 + 1));
}

std::uint64_t run_compare(const void* a, const void* b, std::uint64_t bytes, std::uint64_t seed, bool against_seed,
                          cudaStream_t stream) {
  unsigned long long* d = nullptr;
  WEFT_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&d), sizeof(*d), stream));
  WEFT_CUDA(cudaMemsetAsync(d, 0, sizeof(*d), stream));
  compare_kernel<<<grid_for(bytes), 256, 0, stream>>>(static_cast<const unsigned char*>(a),
                                                      static_cast<const unsigned char*>(b), bytes, seed,
                                                      against_seed, d);
  WEFT_CUDA(cudaGetLastError());
  unsigned long long h = 0;
  WEFT_CUDA(cudaMemcpyAsync(&h, d, sizeof(h), cudaMemcpyDeviceToHost, stream));
  WEFT_CUDA(cudaFreeAsync(d, stream));
  WEFT_CUDA(cudaStreamSynchronize(stream));
  return h;
}

int mantissa_bits(const std::string& dtype) {
  if (dtype == "bf16") return 7;
  if (dtype == "fp16") return 10;
  if (dtype == "fp32") return 23;
  WEFT_FAIL("unknown dtype '", dtype, "': expected bf16, fp16 or fp32");
}

// k / 2^m - 1 with k < 2^(m+1): exactly representable in the type.
__host__ __device__ double grid_value(int m, std::uint64_t seed, std::uint64_t i) {
  std::uint64_t k = splitmix64(seed ^ (i * 0x2545f4914f6cdd1dull)) >> (63 - m);
  return static_cast<double>(k) / static_cast<double>(1ull << m) - 1.0;
}

template <class T>
__global__ void fill_uniform_kernel(T* p, std::uint64_t count, int m, std::uint64_t seed) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < count;
       i += std::uint64_t{gridDim.x} * blockDim.x)
    p[i] = static_cast<T>(static_cast<float>(grid_value(m, seed, i)));
}

__global__ void accumulate_uniform_kernel(float* acc, std::uint64_t count, int m, std::uint64_t seed,
                                          std::uint64_t first) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < count;
       i += std::uint64_t{gridDim.x} * blockDim.x)
    acc[i] += static_cast<float>(grid_value(m, seed, first + i));
}

template <class T>
__device__ double as_double(T x) { return static_cast<double>(static_cast<float>(x)); }

template <class T>
__global__ void compare_values_kernel(const T* a, const T* b, std::uint64_t count, unsigned long long* mismatched,
                                      double* sums) {
  unsigned long long bad = 0;
  double diff2 = 0, ref2 = 0;
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < count;
       i += std::uint64_t{gridDim.x} * blockDim.x) {
    bad += memcmp_bits(a + i, b + i);
    double d = as_double(a[i]) - as_double(b[i]);
    diff2 += d * d;
    ref2 += as_double(b[i]) * as_double(b[i]);
  }
  if (bad) atomicAdd(mismatched, bad);
  atomicAdd(sums, diff2);
  atomicAdd(sums + 1, ref2);
}

template <class T>
__global__ void error_vs_fp32_kernel(const T* a, const float* ref, std::uint64_t count, double* sums) {
  double diff2 = 0, ref2 = 0;
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < count;
       i += std::uint64_t{gridDim.x} * blockDim.x) {
    double x = as_double(a[i]), r = ref[i];
    double d = isfinite(x) ? x - r : INFINITY;
    diff2 += d * d;
    ref2 += r * r;
  }
  atomicAdd(sums, diff2);
  atomicAdd(sums + 1, ref2);
}

}  // namespace

void fill_random(void* p, std::uint64_t bytes, std::uint64_t seed, cudaStream_t stream) {
  fill_kernel<<<grid_for(bytes), 256, 0, stream>>>(static_cast<unsigned char*>(p), bytes, seed);
  WEFT_CUDA(cudaGetLastError());
}

namespace {
__global__ void gather_rows_kernel(uint4* dst, const uint4* src, const std::int32_t* index, std::int64_t rows,
                                   std::int64_t vecs) {
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (blockDim.x / 32);
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; r < rows;
       r += warps)
    dev::copy_warp(dst + r * vecs, src + static_cast<std::int64_t>(index[r]) * vecs, static_cast<std::size_t>(vecs) * 16);
}
}  // namespace

void gather_rows(void* dst, const void* src, const std::int32_t* index, std::int64_t rows, std::int64_t row_bytes,
                 cudaStream_t stream) {
  if (rows <= 0) return;
  WEFT_REQUIRE(row_bytes % 16 == 0, "gather_rows: row_bytes = ", row_bytes, " must be a multiple of 16");
  int sms = 0, device = 0;
  WEFT_CUDA(cudaGetDevice(&device));
  WEFT_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const auto blocks = static_cast<unsigned>(std::min<std::int64_t>((rows + 7) / 8, 4 * sms));
  gather_rows_kernel<<<blocks, 256, 0, stream>>>(static_cast<uint4*>(dst), static_cast<const uint4*>(src), index,
                                                 rows, row_bytes / 16);
  WEFT_CUDA(cudaGetLastError());
}

void poison(void* p, std::uint64_t bytes, unsigned char pattern, cudaStream_t stream) {
  WEFT_CUDA(cudaMemsetAsync(p, pattern, bytes, stream));
}

std::uint64_t count_mismatches(const void* a, const void* b, std::uint64_t bytes, cudaStream_t stream) {
  return run_compare(a, b, bytes, 0, false, stream);
}

std::uint64_t count_mismatches_random(const void* p, std::uint64_t bytes, std::uint64_t seed, cudaStream_t stream) {
  return run_compare(p, nullptr, bytes, seed, true, stream);
}

void accumulate_mismatches_random(const void* p, std::uint64_t bytes, std::uint64_t seed,
                                  unsigned long long* mismatches, cudaStream_t stream) {
  compare_kernel<<<grid_for(bytes), 256, 0, stream>>>(static_cast<const unsigned char*>(p), nullptr, bytes, seed, true,
                                                      mismatches);
  WEFT_CUDA(cudaGetLastError());
}

void accumulate_mismatches(const void* a, const void* b, std::uint64_t bytes, unsigned long long* mismatches,
                           cudaStream_t stream) {
  compare_kernel<<<grid_for(bytes), 256, 0, stream>>>(static_cast<const unsigned char*>(a),
                                                      static_cast<const unsigned char*>(b), bytes, 0, false, mismatches);
  WEFT_CUDA(cudaGetLastError());
}

template <class Fn>
void by_dtype(const std::string& dtype, Fn&& fn) {
  if (dtype == "bf16") fn(__nv_bfloat16{});
  else if (dtype == "fp16") fn(__half{});
  else if (dtype == "fp32") fn(float{});
  else WEFT_FAIL("unknown dtype '", dtype, "': expected bf16, fp16 or fp32");
}

void fill_uniform(void* p, std::uint64_t count, const std::string& dtype, std::uint64_t seed, cudaStream_t stream) {
  const int m = mantissa_bits(dtype);
  by_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    fill_uniform_kernel<T><<<grid_for(count), 256, 0, stream>>>(static_cast<T*>(p), count, m, seed);
  });
  WEFT_CUDA(cudaGetLastError());
}

void accumulate_uniform(float* acc, std::uint64_t count, const std::string& dtype, std::uint64_t seed,
                        std::uint64_t first, cudaStream_t stream) {
  accumulate_uniform_kernel<<<grid_for(count), 256, 0, stream>>>(acc, count, mantissa_bits(dtype), seed, first);
  WEFT_CUDA(cudaGetLastError());
}

double uniform_value(const std::string& dtype, std::uint64_t seed, std::uint64_t i) {
  return grid_value(mantissa_bits(dtype), seed, i);
}

ValueDiff compare_values(const void* a, const void* b, std::uint64_t count, const std::string& dtype,
                         cudaStream_t stream) {
  struct Out {
    unsigned long long mismatched;
    double sums[2];
  };
  Out* d = nullptr;
  WEFT_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&d), sizeof(Out), stream));
  WEFT_CUDA(cudaMemsetAsync(d, 0, sizeof(Out), stream));
  by_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    compare_values_kernel<T><<<grid_for(count), 256, 0, stream>>>(static_cast<const T*>(a), static_cast<const T*>(b),
                                                                   count, &d->mismatched, d->sums);
  });
  WEFT_CUDA(cudaGetLastError());
  Out h{};
  WEFT_CUDA(cudaMemcpyAsync(&h, d, sizeof(Out), cudaMemcpyDeviceToHost, stream));
  WEFT_CUDA(cudaFreeAsync(d, stream));
  WEFT_CUDA(cudaStreamSynchronize(stream));
  ValueDiff out;
  out.mismatched = h.mismatched;
  out.relative_error = h.sums[1] > 0 ? std::sqrt(h.sums[0] / h.sums[1]) : std::sqrt(h.sums[0]);
  return out;
}

double relative_error_vs_fp32(const void* a, const std::string& dtype, const float* ref, std::uint64_t count,
                              cudaStream_t stream) {
  double* d = nullptr;
  WEFT_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&d), 2 * sizeof(double), stream));
  WEFT_CUDA(cudaMemsetAsync(d, 0, 2 * sizeof(double), stream));
  by_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    error_vs_fp32_kernel<T><<<grid_for(count), 256, 0, stream>>>(static_cast<const T*>(a), ref, count, d);
  });
  WEFT_CUDA(cudaGetLastError());
  double h[2] = {0, 0};
  WEFT_CUDA(cudaMemcpyAsync(h, d, sizeof(h), cudaMemcpyDeviceToHost, stream));
  WEFT_CUDA(cudaFreeAsync(d, stream));
  WEFT_CUDA(cudaStreamSynchronize(stream));
  return h[1] > 0 ? std::sqrt(h[0] / h[1]) : std::sqrt(h[0]);
}

std::uint64_t fresh_seed(int rank, std::uint64_t salt) {
  static std::uint64_t counter = static_cast<std::uint64_t>(
      std::chrono::steady_clock::now().time_since_epoch().count());
  return splitmix64(++counter * 0x100000001b3ull ^ (static_cast<std::uint64_t>(rank) << 48) ^ salt);
}

}  // namespace weft::bench
