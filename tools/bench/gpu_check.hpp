// gpu_check.hpp - fresh random data, poison, and bitwise comparison on the GPU, for checks and tests.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

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

/// dst row i = src row index[i] for i < rows (rows of `row_bytes`, a multiple of 16; index int32
/// on the device): the permutation around an all-to-all, as index_select does it. Asynchronous.
void gather_rows(void* dst, const void* src, const std::int32_t* index, std::int64_t rows, std::int64_t row_bytes,
                 cudaStream_t stream);

/// Fills `count` elements of type `dtype` ("bf16", "fp16", "fp32") at `p` with
/// values k / 2^m - 1 on a grid fine enough to be random yet exact in the type
/// (m = 7, 10, 23), so a float64 reference and the GPU see the same inputs.
void fill_uniform(void* p, std::uint64_t count, const std::string& dtype, std::uint64_t seed, cudaStream_t stream);

/// Adds, to each acc[i] (i < count), the value fill_uniform(seed) writes at
/// element first + i: a float reference of a sum over ranks, built from each
/// rank's seed, that needs no communication. Asynchronous on `stream`.
void accumulate_uniform(float* acc, std::uint64_t count, const std::string& dtype, std::uint64_t seed,
                        std::uint64_t first, cudaStream_t stream);

/// The value fill_uniform writes at element i, as a double (host side).
double uniform_value(const std::string& dtype, std::uint64_t seed, std::uint64_t i);

/// How two arrays of `dtype` values differ: elements whose bits differ, and
/// ||a - b|| / ||b|| computed in float64.
struct ValueDiff {
  std::uint64_t mismatched = 0;
  double relative_error = 0;
};
ValueDiff compare_values(const void* a, const void* b, std::uint64_t count, const std::string& dtype,
                         cudaStream_t stream);

/// Adds the number of bytes where `a` and `b` differ to `*mismatches` (asynchronous).
void accumulate_mismatches(const void* a, const void* b, std::uint64_t bytes, unsigned long long* mismatches,
                           cudaStream_t stream);

/// ||a - ref|| / ||ref|| in float64, with `a` of type `dtype` and `ref` fp32
/// (synchronises `stream`). Non-finite values in `a` give infinity.
double relative_error_vs_fp32(const void* a, const std::string& dtype, const float* ref, std::uint64_t count,
                              cudaStream_t stream);

/// A seed unique to (run, rank, salt), so every check draws fresh data.
std::uint64_t fresh_seed(int rank, std::uint64_t salt);

}  // namespace weft::bench
