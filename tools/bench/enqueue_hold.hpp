// enqueue_hold.hpp - holds a stream until the host has enqueued a whole timed sample.
#pragma once

#include <cuda_runtime_api.h>

namespace weft::bench {

/// Keeps a stream's GPU work from starting until the host says so, so that
/// a timed sample measures the device, not the host's enqueue latency.
///
/// Without it, a sample's start event fires as soon as the stream is idle,
/// and the GPU then waits while the host enqueues the first call: a graph
/// launch or an NCCL call costs several microseconds of host time, which
/// lands in the sample (at 0.2 ms per call and 3 calls per sample, one 10 us
/// gap is 1.7 %). A layer in a real program is enqueued ahead of the GPU.
///
/// Use: hold(stream); enqueue the start event, the calls, the end event;
/// release(). The held kernel spins on a flag in mapped host memory; it gives
/// up after `limit_ms`, and `timed_out()` then says the sample was not held
/// to the end (the host took that long to enqueue it).
class EnqueueHold {
 public:
  explicit EnqueueHold(double limit_ms = 2000.0);
  ~EnqueueHold();
  EnqueueHold(const EnqueueHold&) = delete;
  EnqueueHold& operator=(const EnqueueHold&) = delete;

  /// Enqueues the spinning kernel on `stream`; what follows waits for release().
  void hold(cudaStream_t stream);
  /// Lets the held kernel finish.
  void release();
  /// Whether a held kernel gave up before release() (read after synchronising).
  bool timed_out() const;
  /// How long a held kernel waits before it gives up.
  double limit_ms() const { return limit_ms_; }

 private:
  volatile unsigned* flags_ = nullptr;  // [0]: released, [1]: gave up (mapped host memory)
  unsigned* device_flags_ = nullptr;
  double limit_ms_;
};

}  // namespace weft::bench
