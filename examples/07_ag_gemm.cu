// Tutorial 07: AllGather + GEMM, overlapped - the first half of a tensor-parallel MLP.
//
//   weftrun -n 2 build/example_07_ag_gemm      (any number of ranks; 1 runs too)
//
// Each of W ranks holds a row shard of the activations, A_r [M/W, K], and its
// column block of the weight, B_r [N, K] (as PyTorch's Linear stores it).
// Every rank computes C_r = allgather(A) x B_r^T, [M, N]: it needs every
// rank's rows of A. The plain way gathers all of A, then multiplies, so the
// GEMM waits for the slowest shard. weft::AgGemm (fused path) overlaps them:
//   1. the stream's front end tells every peer "my gathered A is free for this
//      run" (cuStreamWriteValue64 into the peer's word);
//   2. once every peer said the same, the copy engines push this rank's shard
//      into every peer's gathered A, in chunks; after each chunk the stream's
//      front end raises a flag on the peer: no SM is spent on communication;
//   3. one persistent GEMM starts at this rank's own rows (already local),
//      then walks the shards in the order they arrive (r+1, r+2, ...). Before
//      loading a tile's rows of A, its producer warp waits on the flags of just
//      those rows; the other warps are fed through shared memory by it.
// So the first tiles need no communication, and later tiles find their rows
// already landed. We check the result against cuBLAS on the whole A, which
// every rank rebuilds from the ranks' seeds (no communication in the check),
// then time the fused plan against the sequential one (weft's AllGather, then
// weft's GEMM). Runs with ranks sharing a GPU too (weftrun --share-gpu), where
// the times are no performance figures.
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "weft/core/error.hpp"
#include "weft/gemm/cublas.hpp"
#include "weft/ops/ag_gemm.hpp"
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

void* device_alloc(std::size_t bytes) {
  void* p = nullptr;
  WEFT_CUDA(cudaMalloc(&p, bytes));
  return p;
}

int run() {
  auto ctx = Context::from_env();
  const int me = ctx->rank(), world = ctx->world_size();
  if (world == 1 && me == 0) std::printf("one rank: nothing to overlap (try weftrun -n 2)\n");
  const std::int64_t m = 4096 / world * world;  // rows of the gathered A: every rank holds M/W of them
  const std::int64_t n = 4096, k = 4096, rows = m / world;
  cudaStream_t stream;
  WEFT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // Plans are built collectively, by every rank in the same order. The mode is
  // explicit: `automatic` would time both ways on the first run and keep the faster.
  AgGemm fused(ctx, AgGemmOptions{.m = m, .n = n, .k = k, .mode = OverlapMode::fused});
  AgGemm sequential(ctx, AgGemmOptions{.m = m, .n = n, .k = k, .mode = OverlapMode::sequential});

  // Zero-copy input: local_shard() is this rank's slot of the plan's symmetric
  // gathered A. Writing the shard there means the GEMM reads its own rows and
  // the copy engines push them to peers straight from where they are; any
  // other pointer passed to run() first costs a device copy into this slot, on
  // the critical path. (The sequential plan gets the same bytes in its slot.)
  const auto host_a = random_bf16(rows * k, 1 + me);
  const auto host_b = random_bf16(n * k, 1000 + me);
  WEFT_CUDA(cudaMemcpy(fused.local_shard(), host_a.data(), rows * k * 2, cudaMemcpyHostToDevice));
  WEFT_CUDA(cudaMemcpy(sequential.local_shard(), host_a.data(), rows * k * 2, cudaMemcpyHostToDevice));
  void* b = device_alloc(n * k * 2);
  WEFT_CUDA(cudaMemcpy(b, host_b.data(), n * k * 2, cudaMemcpyHostToDevice));
  void* c = device_alloc(m * n * 2);
  WEFT_CUDA(cudaMemset(c, 0xFF, m * n * 2));  // poison: bf16 NaNs unless overwritten

  // ---- one run, checked against cuBLAS on the whole A ------------------------
  fused.run(fused.local_shard(), b, c, stream);
  void* gathered = device_alloc(m * k * 2);
  float* ref = static_cast<float*>(device_alloc(m * n * 4));
  for (int p = 0; p < world; ++p) {  // rank p's shard is random_bf16(rows * k, 1 + p): rebuilt here
    const auto shard = random_bf16(rows * k, 1 + p);
    WEFT_CUDA(cudaMemcpy(static_cast<char*>(gathered) + p * rows * k * 2, shard.data(), rows * k * 2,
                         cudaMemcpyHostToDevice));
  }
  cublasHandle_t blas;
  WEFT_REQUIRE(cublasCreate(&blas) == CUBLAS_STATUS_SUCCESS, "cublasCreate failed");
  cublasSetStream(blas, stream);
  // fp32 output, so the reference is not rounded to bf16.
  WEFT_REQUIRE(cublas_gemm(blas, m, n, k, DType::bf16, DType::fp32, BLayout::nk, gathered, b, ref) ==
                   CUBLAS_STATUS_SUCCESS,
               "cublasGemmEx failed");
  ctx->synchronize(stream);  // turns a hung flag wait into an error naming it

  std::vector<__nv_bfloat16> host_c(m * n);
  std::vector<float> host_ref(m * n);
  std::vector<char> ours(m * k * 2), whole(m * k * 2);
  WEFT_CUDA(cudaMemcpy(host_c.data(), c, m * n * 2, cudaMemcpyDeviceToHost));
  WEFT_CUDA(cudaMemcpy(host_ref.data(), ref, m * n * 4, cudaMemcpyDeviceToHost));
  WEFT_CUDA(cudaMemcpy(ours.data(), fused.gathered(), m * k * 2, cudaMemcpyDeviceToHost));
  WEFT_CUDA(cudaMemcpy(whole.data(), gathered, m * k * 2, cudaMemcpyDeviceToHost));
  double diff = 0, norm = 0;  // ||C - ref|| / ||ref||, in float64
  for (std::int64_t i = 0; i < m * n; ++i) {
    const double d = static_cast<double>(__bfloat162float(host_c[i])) - host_ref[i];
    diff += d * d;
    norm += static_cast<double>(host_ref[i]) * host_ref[i];
  }
  const double err = std::sqrt(diff / norm);
  const bool same_gather = std::memcmp(ours.data(), whole.data(), ours.size()) == 0;
  const bool ok = err < 1e-2 && same_gather;  // false for NaN too
  std::printf("rank %d: relative error vs cuBLAS %.2e, gathered A %s: %s\n", me, err,
              same_gather ? "bitwise equal to every rank's shard" : "DIFFERS", ok ? "ok" : "WRONG");

  // ---- fused vs sequential --------------------------------------------------
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  const int runs = 20;
  auto time_ms = [&](AgGemm& plan) {
    for (int i = 0; i < 3; ++i) plan.run(plan.local_shard(), b, c, stream);  // warm-up (the first run tunes)
    ctx->barrier(stream);  // start together...
    cudaEventRecord(start, stream);
    for (int i = 0; i < runs; ++i) plan.run(plan.local_shard(), b, c, stream);  // no host sync in between
    ctx->barrier(stream);  // ...and stop when the slowest rank is done
    cudaEventRecord(stop, stream);
    ctx->synchronize(stream);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    return ms / runs;
  };
  const float fused_ms = time_ms(fused), sequential_ms = time_ms(sequential);
  if (me == 0) {
    const double tflop = 2.0 * m * n * k * 1e-12;  // per rank
    std::printf("AgGemm %lld x %lld x %lld bf16 on %d ranks (per rank: A shard %lld x %lld, C %lld x %lld)\n",
                (long long)m, (long long)n, (long long)k, world, (long long)rows, (long long)k, (long long)m,
                (long long)n);
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
  for (void* p : {b, c, gathered, static_cast<void*>(ref)}) cudaFree(p);
  cudaStreamDestroy(stream);
  return ok ? 0 : 1;  // the plans free their symmetric buffers, collectively, as they go out of scope
}

int main() {
  try {
    return run();
  } catch (const Error& e) {  // no GPU, a peer that went away, bad input: said plainly
    std::fprintf(stderr, "example 07: %s\n", e.what());
    return 1;
  }
}
