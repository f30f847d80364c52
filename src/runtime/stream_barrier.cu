// The stream-ordered barrier behind Context::barrier: one block per rank meets
// the others through the World's barrier flags.
#include "weft/core/error.hpp"
#include "weft/device/shmem.cuh"

namespace weft {
namespace {
__global__ void barrier_kernel(dev::World world) { shmem::barrier_all_block(world); }
}  // namespace

void launch_barrier_kernel(const dev::World& world, cudaStream_t stream) {
  barrier_kernel<<<1, 32, 0, stream>>>(world);
  WEFT_CUDA(cudaGetLastError());
}

}  // namespace weft
