// weft/core/cuda_resources.hpp - owning handles for the CUDA objects a plan
// keeps: a stream, an event, a block of device memory. Each is created by its
// constructor, checked (weft::Error on failure), released by its destructor,
// and movable, not copyable: a plan holds them as plain members and needs no
// destructor of its own.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

#include "weft/core/error.hpp"

namespace weft {

namespace cuda_detail {
/// A CUDA handle that `Release` destroys when its owner goes: moves, never copies.
template <class Handle, cudaError_t (*Release)(Handle)>
class Owned {
 public:
  Owned() = default;
  ~Owned() {
    if (h_) Release(h_);
  }
  Owned(Owned&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  Owned& operator=(Owned&& o) noexcept {
    std::swap(h_, o.h_);
    return *this;
  }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  Handle get() const { return h_; }
  operator Handle() const { return h_; }

 protected:
  Handle h_ = nullptr;
};
}  // namespace cuda_detail

/// A stream that does not synchronise with the legacy default stream.
class Stream : public cuda_detail::Owned<cudaStream_t, cudaStreamDestroy> {
 public:
  Stream() { WEFT_CUDA(cudaStreamCreateWithFlags(&h_, cudaStreamNonBlocking)); }
};

/// An event; without timing (the default) it costs the least to record and wait on.
class Event : public cuda_detail::Owned<cudaEvent_t, cudaEventDestroy> {
 public:
  enum class Timing { off, on };
  explicit Event(Timing timing = Timing::off) {
    WEFT_CUDA(cudaEventCreateWithFlags(&h_, timing == Timing::on ? cudaEventDefault : cudaEventDisableTiming));
  }
};

/// `bytes` of device memory on the current device (none for 0), not initialised.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    if (bytes) WEFT_CUDA(cudaMalloc(&p_, bytes));
  }
  ~DeviceBuffer() {
    if (p_) cudaFree(p_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return p_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  std::size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace weft
