// Tutorial 08: GEMM + ReduceScatter, overlapped - the second half of a tensor-parallel MLP.
//
//   weftrun -n 2 build/example_08_gemm_rs      (any number of ranks; 1 runs too)
//
// Each of W ranks holds A_q [M, K/W] (its slice of the inner dimension, e.g.
// the output of tutorial 07's layer) and B_q [N, K/W]. The product A x B^T is
// the sum over ranks of the partial products A_q x B_q^T, and rank r keeps
// only rows block r of that sum: out_r [M/W, N]. The plain way computes the
// whole [M, N] partial product, then reduce-scatters it: the network idles
// during the GEMM and the SMs during the reduction. weft::GemmRs (fused path)
// runs a ring of W GEMM steps over the W blocks of rows instead:
//   - at step s, rank r computes block b = (r - 1 - s) mod W. Step 0 is a plain
//     GEMM; the copy engines then push its result to rank r+1's staging buffer,
//     chunk by chunk, each chunk followed by a flag raised from the stream's
//     front end (no SM involved), while step 1 already computes;
//   - steps 1..W-1 compute D = A_b x B^T + S, where S is the partial sum of
//     block b just received from rank r-1: the GEMM's epilogue reads S as its
//     C source. Only the epilogue's producer warp waits, per tile, for the
//     flags of the rows it adds, so the tile's mainloop runs meanwhile;
//   - at the last step the block is rank r's own, and D is the output.
// Block b is thus always summed in the same order (b+1, b+2, ..., b), whatever
// the timing: repeated runs are bitwise identical, which this program checks.
// The result is checked against the sum of every rank's cuBLAS GEMM, each
// rank's inputs rebuilt here from its seeds. Runs with ranks sharing a GPU too
// (weftrun --share-gpu), where the times are no performance figures.
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "weft/core/error.hpp"
#include "weft/gemm/cublas.hpp"
#include "weft/ops/gemm_rs.hpp"
#include "weft/runtime/context.hpp"

using namespace weft;

// Values k/128 - 1 (k < 256): random enough, and exact in bf16, so the GPU
// and the fp32 reference see the same inputs. A simple LCG, seeded per rank.
std::vector<__nv_bfloat16> random_bf16(std::size_t count, std::uint64_t seed) {
  std::vector<__nv_bfloat16> v(count);
  for (auto& x : v) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    x = __float2bfloat16(static_cast<float>(seed >> 56) / 128.0f - 1.0f);
  }
  return v;
}

void* upload(const std::vector<__nv_bfloat16>& host) {
  void* p = nullptr;
  WEFT_CUDA(cudaMalloc(&p, host.size() * 2));
  WEFT_CUDA(cudaMemcpy(p, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
  return p;
}

void* device_alloc(std::size_t bytes) {
  void* p = nullptr;
  WEFT_CUDA(cudaMalloc(&p, bytes));
  WEFT_CUDA(cudaMemset(p, 0xFF, bytes));  // poison: bf16 NaNs unless overwritten
  return p;
}

int run() {
  auto ctx = Context::from_env();
  const int me = ctx->rank(), world = ctx->world_size();
  if (world == 1 && me == 0) std::printf("one rank: nothing to overlap (try weftrun -n 2)\n");
  const std::int64_t m = 4096 / world * world;  // rows of the sum: rank r keeps block r, M/W rows
  const std::int64_t n = 4096;
  const std::int64_t k = 4096 / world / 8 * 8;   // this rank's slice of K = 4096 (a multiple of 8)
  const std::int64_t rows = m / world;
  cudaStream_t stream;
  WEFT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // Collective construction, same order on every rank; the mode is explicit
  // (`automatic` would time both ways on the first run and keep the faster).
  GemmRs fused(ctx, GemmRsOptions{.m = m, .n = n, .k = k, .mode = OverlapMode::fused});
  GemmRs sequential(ctx, GemmRsOptions{.m = m, .n = n, .k = k, .mode = OverlapMode::sequential});

  // Inputs and output may be any device memory: the plan owns the symmetric
  // staging buffers the ring writes into, so nothing here has to be symmetric.
  void* a = upload(random_bf16(m * k, 1 + me));
  void* b = upload(random_bf16(n * k, 1000 + me));
  void* out = device_alloc(rows * n * 2);
  void* out_sequential = device_alloc(rows * n * 2);

  // ---- one run, checked against the sum of every rank's GEMM -----------------
  fused.run(a, b, out, stream);
  float* partial = static_cast<float*>(device_alloc(m * n * 4));
  cublasHandle_t blas;
  WEFT_REQUIRE(cublasCreate(&blas) == CUBLAS_STATUS_SUCCESS, "cublasCreate failed");
  cublasSetStream(blas, stream);
  // Every rank's A and B rebuilt here from its seeds, their products summed by
  // cuBLAS in fp32 (beta = 1): no bf16 rounding and no communication in the reference.
  for (int p = 0; p < world; ++p) {
    void* a_p = upload(random_bf16(m * k, 1 + p));
    void* b_p = upload(random_bf16(n * k, 1000 + p));
    WEFT_REQUIRE(cublas_gemm(blas, m, n, k, DType::bf16, DType::fp32, BLayout::nk, a_p, b_p, partial,
                             p == 0 ? 0.0f : 1.0f) == CUBLAS_STATUS_SUCCESS,
                 "cublasGemmEx failed");
    ctx->synchronize(stream);
    for (void* q : {a_p, b_p}) cudaFree(q);
  }
  const float* ref = partial + me * rows * n;  // this rank's block of the sum
  ctx->synchronize(stream);  // turns a hung flag wait into an error naming it

  std::vector<__nv_bfloat16> first(rows * n), again(rows * n);
  std::vector<float> host_ref(rows * n);
  WEFT_CUDA(cudaMemcpy(first.data(), out, rows * n * 2, cudaMemcpyDeviceToHost));
  WEFT_CUDA(cudaMemcpy(host_ref.data(), ref, rows * n * 4, cudaMemcpyDeviceToHost));
  double diff = 0, norm = 0;  // ||out - ref|| / ||ref||, in float64
  for (std::int64_t i = 0; i < rows * n; ++i) {
    const double d = static_cast<double>(__bfloat162float(first[i])) - host_ref[i];
    diff += d * d;
    norm += static_cast<double>(host_ref[i]) * host_ref[i];
  }
  const double err = std::sqrt(diff / norm);
  bool ok = err < 1e-2;  // false for NaN too
  std::printf("rank %d: relative error vs the sum of every rank's cuBLAS GEMM %.2e: %s\n", me, err,
              ok ? "ok" : "WRONG");

  // ---- fused vs sequential --------------------------------------------------
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  const int runs = 20;
  auto time_ms = [&](GemmRs& plan, void* dst) {
    for (int i = 0; i < 3; ++i) plan.run(a, b, dst, stream);  // warm-up (the first run tunes)
    ctx->barrier(stream);  // start together...
    cudaEventRecord(start, stream);
    for (int i = 0; i < runs; ++i) plan.run(a, b, dst, stream);  // no host sync in between
    ctx->barrier(stream);  // ...and stop when the slowest rank is done
    cudaEventRecord(stop, stream);
    ctx->synchronize(stream);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    return ms / runs;
  };
  const float fused_ms = time_ms(fused, out), sequential_ms = time_ms(sequential, out_sequential);

  // The fixed ring order makes the 23 fused runs since the check bitwise equal to it.
  WEFT_CUDA(cudaMemcpy(again.data(), out, rows * n * 2, cudaMemcpyDeviceToHost));
  const bool deterministic = std::memcmp(first.data(), again.data(), rows * n * 2) == 0;
  ok = ok && deterministic;
  std::printf("rank %d: fused output after %d more runs %s\n", me, runs + 3,
              deterministic ? "bitwise identical" : "DIFFERS");
  if (me == 0) {
    const double tflop = 2.0 * m * n * k * 1e-12;  // per rank
    std::printf("GemmRs %lld x %lld x %lld bf16 on %d ranks (per rank: A %lld x %lld, out %lld x %lld)\n",
                (long long)m, (long long)n, (long long)(k * world), world, (long long)m, (long long)k,
                (long long)rows, (long long)n);
    std::printf("  %-10s %7.3f ms  %6.1f TFLOP/s  gemm: %s\n", fused.path().c_str(), fused_ms,
                tflop / (fused_ms * 1e-3), fused.gemm_config().c_str());
    std::printf("  %-10s %7.3f ms  %6.1f TFLOP/s  gemm: %s\n", sequential.path().c_str(), sequential_ms,
                tflop / (sequential_ms * 1e-3), sequential.gemm_config().c_str());
    std::printf("  fused is %.2fx the sequential speed%s\n", sequential_ms / fused_ms,
                ctx->team().shares_gpus() ? " (ranks share a GPU: times are not performance figures)" : "");
  }

  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cublasDestroy(blas);
  for (void* p : {a, b, out, out_sequential, static_cast<void*>(partial)}) cudaFree(p);
  cudaStreamDestroy(stream);
  return ok ? 0 : 1;  // the plans free their symmetric buffers, collectively, as they go out of scope
}

int main() {
  try {
    return run();
  } catch (const Error& e) {  // no GPU, a peer that went away, bad input: said plainly
    std::fprintf(stderr, "example 08: %s\n", e.what());
    return 1;
  }
}
