// copy_pipe.hpp (private) - the copy engines' side of an overlapped plan: a
// side stream forked from the run's stream, the start-of-run "free" exchange
// with every peer, chunked copies whose flags the stream's front end raises,
// and the join back. Flags here are raised to 1 and go back to 0 by their
// one reader (a waiting GEMM or wait kernel consumes them) or by a memset at
// the start of the run that owns them: no peer raises a flag again before it
// hears "free" from the owner's next run.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "weft/core/cuda_resources.hpp"
#include "weft/runtime/context.hpp"

namespace weft::ops_detail {

/// One plan's side stream and its "free" word per peer. Collective construction.
class CopyPipe {
 public:
  /// `name` prefixes the symmetric allocation ("gemm_rs" -> "gemm_rs.ready").
  CopyPipe(std::shared_ptr<Context> ctx, const std::string& name);

  /// Starts a fused run and returns the side stream, forked from `stream`.
  /// On `stream`: zeroes reset[0, reset_count) (this rank's flags of the last
  /// run, which no peer writes again before it hears "free" from us). On the
  /// side stream, forked after that: tells every peer "my buffers are free for
  /// this run" with a write from the stream's front end, behind a memory
  /// barrier; then waits for every peer's "free" and takes it back (sets it to
  /// 0), so what is enqueued there next only writes into free buffers. No wait
  /// holds an SM and `stream` waits for no peer and no write: the GEMM
  /// enqueued next starts on its local rows right after the reset. Taking
  /// "free" back cannot erase the peer's next one: the peer says "free" again
  /// only at the start of its next run, after its GEMM of this run, which
  /// needed the pushes we enqueue after taking it back.
  cudaStream_t begin(cudaStream_t stream, std::uint64_t* reset = nullptr, int reset_count = 0);
  /// Returns the side stream, forked from `stream` with no "free" exchange:
  /// for work on it that waits for its peers by itself (a two-level
  /// AllGather's "ready" flags), or touches no peer.
  cudaStream_t fork(cudaStream_t stream);
  /// `stream` continues after everything enqueued on the side stream so far.
  void join(cudaStream_t stream);

 private:
  std::shared_ptr<Context> ctx_;
  SymmetricBuffer ready_;  // u64 [W], zeroed: word q = 1 once rank q said "free" for our next pushes
  Stream side_;
  Event fork_, join_;
};

/// On `side`: copies chunk c of `chunk_bytes` from `src` to `dst` (same
/// offset, cudaMemcpyAsync), then sets flags[c] to 1 from the stream's front
/// end (cuStreamWriteValue64, behind a memory barrier): no SM is needed, so
/// nothing queues behind a persistent kernel that waits for the flag. `dst`
/// and `flags` may be a peer's, as mapped here; null `flags`: no flag (a
/// local move). A chunk of 0 bytes copies nothing and still raises its flag.
void push_chunk(void* dst, const void* src, std::uint64_t chunk_bytes, std::int64_t c, std::uint64_t* flags,
                cudaStream_t side);
/// push_chunk, but only once done[c] >= done_value: the side stream's front
/// end waits for the GEMM's tiles to have stored the chunk (weft::RowsDone),
/// so it goes while the GEMM goes on. Enqueue it after the GEMM that stores
/// the chunk: streams may share one hardware queue, which runs in the order
/// work was enqueued (docs/decisions/0049).
void push_chunk_when_stored(void* dst, const void* src, std::uint64_t chunk_bytes, std::int64_t c,
                            const std::uint64_t* done, std::uint64_t done_value, std::uint64_t* flags,
                            cudaStream_t side);
/// push_chunk by column band: of `rows` rows of `row_bytes` bytes, copies
/// bytes [c * band_bytes, (c + 1) * band_bytes) of every row (one 2-D copy,
/// cudaMemcpy2DAsync), then sets flags[c] to 1 as push_chunk does.
void push_column_band(void* dst, const void* src, std::int64_t rows, std::uint64_t row_bytes,
                      std::uint64_t band_bytes, std::int64_t c, std::uint64_t* flags, cudaStream_t side);
/// Sets flags[c] to 1 from `stream`'s front end once the work enqueued before
/// it on `stream` is done (cuStreamWriteValue64 behind a memory barrier: what
/// that work wrote is visible to a reader that sees the flag). No SM.
void raise_flag_when_done(std::uint64_t* flags, std::int64_t c, cudaStream_t stream);
/// Zeroes flags[0, count) on `stream` (a memset: a small kernel, about 1.5 us
/// ahead of what follows it; front-end writes cost about 0.8 us each).
void reset_flags(std::uint64_t* flags, int count, cudaStream_t stream);

/// Waits on `stream` until flags[i] >= 1 for every i in [0, count) whose
/// rank (i / per_rank) is not this one, then sets each back to 0 (the wait is
/// the flags' one reader, and no peer raises them again before it hears
/// "free" from this rank's next run). One small kernel, bounded by the
/// timeout, which names the rank and the flag.
void wait_all_and_consume(const dev::World& world, std::uint64_t* flags, int count, int per_rank, cudaStream_t stream);
/// The same for flags[0, count), all raised by rank `from_rank`.
void wait_from_and_consume(const dev::World& world, std::uint64_t* flags, int count, int from_rank, cudaStream_t stream);
/// Waits on `stream` until the local word *count >= value, then sets it back
/// to 0 (its one reader). The word counts what this GPU's kernels saw arrive
/// from other ranks; a wait past the timeout names `from_rank`, the rank
/// whose data it is waiting for. One small kernel.
void wait_count_and_consume(const dev::World& world, std::uint64_t* count, std::uint64_t value, int from_rank,
                            cudaStream_t stream);

}  // namespace weft::ops_detail
