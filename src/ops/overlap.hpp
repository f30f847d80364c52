// overlap.hpp (private) - what the overlapped operators (AgGemm, GemmRs, GemmAr) share:
// their construction checks, a side stream for the copy engines, the
// start-of-run handshake, chunked pushes whose flags the stream front end
// raises, and the measured choice between fused and sequential.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>

#include "weft/gemm/gemm.hpp"
#include "weft/ops/collective.hpp"
#include "weft/runtime/context.hpp"

namespace weft::ops_detail {

/// How a plan's rows split: rows per rank, and those rows in equal chunks
/// (the copy and signal unit).
struct RowChunks {
  std::int64_t rows_per_rank, chunks, chunk_rows;
};

/// The checks every overlapped plan makes at construction: positive M, N, K;
/// M a multiple of the world size; bf16 (the hooked kernels' type);
/// chunks_wanted >= 1. Throws naming `who`. Returns the row split, with the
/// largest chunk count <= chunks_wanted that divides the rows per rank
/// (schedule::even_chunks).
RowChunks plan_rows(const char* who, std::int64_t m, std::int64_t n, std::int64_t k, DType dtype, int chunks_wanted,
                    int world);

/// "AgGemm plan: 8192 x 14336 x 8192 bf16, B [N,K], auto": what the ranks compare (verify_same_call).
std::string plan_description(const char* who, std::int64_t m, std::int64_t n, std::int64_t k, DType dtype,
                             BLayout layout, OverlapMode mode);

/// Every operand non-null and 16-byte aligned (TMA's requirement), checked
/// before a run starts any collective work; throws naming `who` and the pointer.
void require_operands(const char* who, std::initializer_list<const void*> operands);

/// The machinery of one overlapped plan, and which way it runs. Collective construction.
class Overlap {
 public:
  /// `name` prefixes the symmetric allocations ("ag_gemm"); `mode` fixes the
  /// path now (fused, sequential) or on the first run (automatic).
  Overlap(std::shared_ptr<Context> ctx, const std::string& name, OverlapMode mode);
  ~Overlap();
  Overlap(const Overlap&) = delete;
  Overlap& operator=(const Overlap&) = delete;

  /// Runs one call the chosen way. On the first automatic call outside graph
  /// capture, `first` runs before anything else (a sequential run that fills
  /// the buffers, and tuning), then both ways are timed: 7 interleaved samples
  /// of 3 back-to-back calls each, each way's slowest rank (so all ranks
  /// agree), the faster kept and logged as `what`. Under capture the first
  /// automatic call takes the fused path untimed.
  void run(cudaStream_t stream, const std::function<void()>& first, const std::function<void()>& fused,
           const std::function<void()>& sequential, const std::string& what);
  /// True once the path is the fused one.
  bool fused() const { return path_ == 1; }
  /// "fused", "sequential", or "" before the first automatic run.
  std::string path() const { return path_ < 0 ? "" : path_ == 1 ? "fused" : "sequential"; }
  /// The first automatic run's medians (ms, slowest rank); 0 otherwise.
  float fused_ms() const { return fused_ms_; }
  float sequential_ms() const { return sequential_ms_; }

  /// Starts a fused run on `stream`: one small kernel zeroes reset[0,
  /// reset_count) (this rank's arrival flags of the previous run, which no
  /// peer writes again before it hears "free" from us), advances the epoch,
  /// tells every peer "my buffers are free for this run" and waits until every
  /// peer said the same. It runs before the GEMM takes the SMs.
  void handshake(cudaStream_t stream, std::uint64_t* reset = nullptr, int reset_count = 0);
  /// The side stream starts after everything enqueued on `stream` so far.
  cudaStream_t fork(cudaStream_t stream);
  /// `stream` continues after everything enqueued on the side stream so far.
  void join(cudaStream_t stream);
  /// On `side`: copies chunks [first, first + count) of `chunk_bytes` each
  /// from `src` to `dst` (same offsets), and after each chunk sets
  /// flags[chunk] to 1 from the stream's front end (cuStreamWriteValue64,
  /// behind a memory barrier): no SM is needed, so nothing queues behind a
  /// persistent kernel that waits for the flag. `dst` and `flags` may be a
  /// peer's, as mapped here.
  static void push_chunks(void* dst, const void* src, std::uint64_t chunk_bytes, std::int64_t first,
                          std::int64_t count, std::uint64_t* flags, cudaStream_t side);
  /// Waits on `stream` until flags[i] >= 1 for every i in [0, count) whose
  /// rank (i / per_rank) is not this one. One small kernel, bounded by the timeout.
  void wait_all(const std::uint64_t* flags, int count, int per_rank, cudaStream_t stream);

 private:
  void choose(const std::function<void()>& fused, const std::function<void()>& sequential, cudaStream_t stream);

  std::shared_ptr<Context> ctx_;
  SignalArray ready_;  // [W]: flag q = rank q's "free for run e"
  cudaStream_t side_ = nullptr;
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
  int path_ = -1;  // -1 undecided, 0 sequential, 1 fused
  float fused_ms_ = 0, sequential_ms_ = 0;
};

}  // namespace weft::ops_detail
