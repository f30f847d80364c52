#include "enqueue_hold.hpp"

#include <atomic>

#include "weft/core/error.hpp"
#include "weft/device.cuh"

namespace weft::bench {
namespace {

// One thread polls the host's word over PCIe; the stream behind it waits.
__global__ void hold_kernel(volatile unsigned* flags, unsigned long long limit_ns) {
  const std::uint64_t t0 = dev::globaltimer_ns();
  while (flags[0] == 0) {
    if (dev::globaltimer_ns() - t0 > limit_ns) {
      flags[1] = 1;
      return;
    }
    __nanosleep(200);
  }
}

}  // namespace

EnqueueHold::EnqueueHold(double limit_ms) : limit_ms_(limit_ms) {
  void* host = nullptr;
  WEFT_CUDA(cudaHostAlloc(&host, 2 * sizeof(unsigned), cudaHostAllocMapped));
  flags_ = static_cast<volatile unsigned*>(host);
  flags_[0] = 0;
  flags_[1] = 0;
  void* dev = nullptr;
  WEFT_CUDA(cudaHostGetDevicePointer(&dev, host, 0));
  device_flags_ = static_cast<unsigned*>(dev);
}

EnqueueHold::~EnqueueHold() {
  if (flags_) cudaFreeHost(const_cast<unsigned*>(flags_));
}

void EnqueueHold::hold(cudaStream_t stream) {
  flags_[0] = 0;  // the previous sample's kernel has finished: the caller synchronised
  flags_[1] = 0;
  hold_kernel<<<1, 1, 0, stream>>>(device_flags_, static_cast<unsigned long long>(limit_ms_ * 1e6));
  WEFT_CUDA(cudaGetLastError());
}

void EnqueueHold::release() {
  std::atomic_thread_fence(std::memory_order_seq_cst);  // the enqueues before it, then the word
  flags_[0] = 1;
}

bool EnqueueHold::timed_out() const { return flags_[1] != 0; }

}  // namespace weft::bench
