// overlap.hpp (private) - what the overlapped operators (AgGemm, GemmRs, GemmAr) share:
// a side stream for the copy engines, the start-of-run handshake, flags raised
// from the stream front end, and the measured choice between fused and sequential.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "weft/runtime/context.hpp"

namespace weft::ops_detail {

/// Which way an overlapped plan runs.
enum class OverlapPath { fused, sequential };

/// The machinery of one overlapped plan. Collective construction.
class Overlap {
 public:
  /// `name` prefixes the symmetric allocations ("ag_gemm").
  Overlap(std::shared_ptr<Context> ctx, const std::string& name);
  ~Overlap();
  Overlap(const Overlap&) = delete;
  Overlap& operator=(const Overlap&) = delete;

  /// Starts a run on `stream`: one small kernel advances the epoch, tells every
  /// peer "my buffers are free for this run" and waits until every peer said
  /// the same. It runs before the GEMM takes the SMs. First it zeroes
  /// reset[0, reset_count): this rank's arrival flags of the previous run,
  /// which no peer writes again before it hears "free" from us.
  void handshake(cudaStream_t stream, std::uint64_t* reset = nullptr, int reset_count = 0);
  /// The side stream starts after everything enqueued on `stream` so far.
  cudaStream_t fork(cudaStream_t stream);
  /// `stream` continues after everything enqueued on the side stream so far.
  void join(cudaStream_t stream);
  /// Sets the 64-bit flag at `flag` (this rank's or a peer's, as mapped here)
  /// to `value` from the stream's front end, after a memory barrier: no SM is
  /// needed, so it is not stuck behind a persistent kernel that waits for it.
  static void raise(std::uint64_t* flag, std::uint64_t value, cudaStream_t stream);
  /// Waits on `stream` until flags[i] >= 1 for every i in [0, count) whose
  /// rank (i / per_rank) is not this one. One small kernel, bounded by the timeout.
  void wait_all(const std::uint64_t* flags, int count, int per_rank, cudaStream_t stream);

  /// Times both ways (a warm-up, then `runs` samples of 3 calls each, interleaved), takes each
  /// way's slowest rank (all ranks then agree), and returns the faster one.
  /// Collective; not under graph capture.
  OverlapPath choose(const std::function<void()>& fused, const std::function<void()>& sequential,
                     cudaStream_t stream, float* fused_ms, float* sequential_ms, int runs = 7);

  Context& ctx() { return *ctx_; }
  const std::shared_ptr<Context>& ctx_ptr() const { return ctx_; }
  cudaStream_t side() const { return side_; }

 private:
  std::shared_ptr<Context> ctx_;
  SignalArray ready_;  // [W]: flag q = rank q's "free for run e"
  cudaStream_t side_ = nullptr;
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
};

/// The largest divisor of `rows` that is at most `want` (>= 1): chunks of equal rows.
std::int64_t even_chunks(std::int64_t rows, std::int64_t want);

/// "fused" / "sequential".
const char* to_string(OverlapPath p);

}  // namespace weft::ops_detail
