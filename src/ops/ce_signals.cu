#include "ce_signals.hpp"

#include "weft/core/error.hpp"
#include "weft/device.cuh"

namespace weft::ops_detail {
namespace {

__global__ void begin_kernel(dev::LaunchEpoch e) { *e.value += 1; }

__global__ void signal_kernel(dev::World w, std::uint64_t* flag, int pe, dev::LaunchEpoch e) {
  const std::uint64_t epoch = *e.value;
  dev::fence_sc(dev::Scope::sys);  // the copies before this kernel are visible system-wide first
  for (int p = static_cast<int>(threadIdx.x); p < w.size; p += blockDim.x)
    if (pe >= 0 ? p == pe : p != w.rank) dev::notify(w, flag, p, epoch, dev::SignalOp::set, dev::Scope::sys);
}

__global__ void wait_kernel(dev::World w, const std::uint64_t* flags, std::uint64_t stride, int only,
                            dev::LaunchEpoch e) {
  const std::uint64_t epoch = *e.value;
  for (int q = static_cast<int>(threadIdx.x); q < w.size; q += blockDim.x)
    if (only >= 0 ? q == only : q != w.rank)
      dev::wait_until(w, flags + q * stride, dev::Cmp::ge, epoch, dev::Scope::sys, q);
}

}  // namespace

void ce_begin(const dev::LaunchEpoch& epoch, cudaStream_t stream) {
  begin_kernel<<<1, 1, 0, stream>>>(epoch);
  WEFT_CUDA(cudaGetLastError());
}

void ce_signal_peers(const dev::World& w, std::uint64_t* flag, const dev::LaunchEpoch& epoch, cudaStream_t stream) {
  signal_kernel<<<1, 32, 0, stream>>>(w, flag, -1, epoch);
  WEFT_CUDA(cudaGetLastError());
}

void ce_signal(const dev::World& w, std::uint64_t* flag, int pe, const dev::LaunchEpoch& epoch, cudaStream_t stream) {
  signal_kernel<<<1, 32, 0, stream>>>(w, flag, pe, epoch);
  WEFT_CUDA(cudaGetLastError());
}

void ce_wait(const dev::World& w, const std::uint64_t* flags, std::uint64_t stride, int only,
             const dev::LaunchEpoch& epoch, cudaStream_t stream) {
  wait_kernel<<<1, 32, 0, stream>>>(w, flags, stride, only, epoch);
  WEFT_CUDA(cudaGetLastError());
}

}  // namespace weft::ops_detail
