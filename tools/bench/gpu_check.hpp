// gpu_check.hpp - fresh random data, poison, and bitwise comparison on the GPU, for checks and tests.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace weft::bench {

/// Fills `bytes` at `p` with pseudo-random bits from `seed` (splitmix64 per
/// 8-byte word; the same seed gives the same bytes). Asynchronous on `stream`.
void fill_random(void* p, std::uint64_t bytes, std::uint64_t seed, cudaStream_t stream);

/// Fills `bytes` at `p` with the repeated byte `pattern` (poison before a run).
void poison(void* p, std::uint64_t bytes, unsigned char pattern, cudaStream_t stream);

/// Number of bytes that differ between `a` and `b` (synchronises `stream`).
std::uint64_t count_mismatches(const void* a, const void* b, std::uint64_t bytes, cudaStream_t stream);

/// Number of bytes of `p` that differ from fill_random(seed) output (synchronises `stream`).
std::uint64_t count_mismatches_random(const void* p, std::uint64_t bytes, std::uint64_t seed, cudaStream_t stream);

/// Adds the number of bytes of `p` that differ from fill_random(seed) to the
/// device counter `*mismatches`. Asynchronous: lets a test check many
/// back-to-back runs without synchronising between them.
void accumulate_mismatches_random(const void* p, std::uint64_t bytes, std::uint64_t seed,
                                  unsigned long long* mismatches, cudaStream_t stream);

/// A seed unique to (run, rank, salt), so every check draws fresh data.
std::uint64_t fresh_seed(int rank, std::uint64_t salt);

}  // namespace weft::bench
