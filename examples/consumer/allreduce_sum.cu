// Sums a buffer across every rank with weft::AllReduce and checks the result:
//   weftrun -n 2 -- ./weft_consumer      (any number of ranks; alone, a world of one)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <vector>

#include "weft/core/error.hpp"
#include "weft/ops/all_reduce.hpp"
#include "weft/runtime/context.hpp"

__global__ void fill(float* x, std::uint64_t n, float v) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    x[i] = v;
}

int main() try {
  auto ctx = weft::Context::from_env();  // meets the other ranks (weftrun, torchrun, mpirun, srun), picks a GPU
  const std::uint64_t count = 1 << 20;
  cudaStream_t stream;
  WEFT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  weft::SymmetricBuffer x(ctx->heap(), count * sizeof(float), "fp32", "x");  // collective: one per rank, same offset
  weft::AllReduce sum(ctx, {.count = count, .dtype = weft::DType::fp32});     // variant chosen by size
  fill<<<256, 256, 0, stream>>>(x.as<float>(), count, ctx->rank() + 1.0f);
  WEFT_CUDA(cudaGetLastError());
  sum.run(x.get(), x.get(), stream);  // in place; graph-capturable, no reset between calls
  ctx->synchronize(stream);           // a wait that timed out becomes an error naming rank and flag
  std::vector<float> host(count);
  WEFT_CUDA(cudaMemcpy(host.data(), x.get(), count * sizeof(float), cudaMemcpyDeviceToHost));
  const int w = ctx->world_size();
  const float expected = w * (w + 1) / 2.0f;
  const bool ok = std::all_of(host.begin(), host.end(), [&](float v) { return v == expected; });
  std::printf("rank %d of %d: AllReduce (%s) of %llu floats: sum %g, expected %g: %s\n", ctx->rank(), w,
              weft::to_string(sum.variant()), static_cast<unsigned long long>(count), host[0], expected,
              ok ? "correct" : "WRONG");
  cudaStreamDestroy(stream);
  return ok ? 0 : 1;
} catch (const std::exception& e) {  // no GPU, a peer that went away, bad input: said plainly
  std::fprintf(stderr, "weft_consumer: %s\n", e.what());
  return 1;
}
