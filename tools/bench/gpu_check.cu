#include <chrono>

#include "gpu_check.hpp"
#include "weft/core/error.hpp"

namespace weft::bench {
namespace {

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

}  // namespace

void fill_random(void* p, std::uint64_t bytes, std::uint64_t seed, cudaStream_t stream) {
  fill_kernel<<<grid_for(bytes), 256, 0, stream>>>(static_cast<unsigned char*>(p), bytes, seed);
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

std::uint64_t fresh_seed(int rank, std::uint64_t salt) {
  static std::uint64_t counter = static_cast<std::uint64_t>(
      std::chrono::steady_clock::now().time_since_epoch().count());
  return splitmix64(++counter * 0x100000001b3ull ^ (static_cast<std::uint64_t>(rank) << 48) ^ salt);
}

}  // namespace weft::bench
