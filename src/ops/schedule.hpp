// schedule.hpp (private) - the index maps of the collective kernels, as plain functions.
//
// Which block copies which bytes, which chunk a ring step carries, how a
// message splits into slices and chunks, how many flags a plan needs: the
// kernels (device) and the CPU tests (host, world sizes 1 to 8) call the same
// functions, so a map that leaves a gap or overlaps fails on a machine without
// a GPU.
#pragma once

#include <cstdint>

#include "weft/device/types.cuh"

namespace weft::schedule {

/// Part `index` of `parts` of [begin, end), cut in `grain` units: [lo, hi).
/// The parts tile the range in order; trailing parts may be empty.
WEFT_HD void split(std::uint64_t begin, std::uint64_t end, std::uint64_t grain, std::uint64_t parts,
                   std::uint64_t index, std::uint64_t& lo, std::uint64_t& hi) {
  const std::uint64_t n = end - begin;
  std::uint64_t per = (n + parts - 1) / parts;
  per = (per + grain - 1) / grain * grain;
  lo = begin + per * index < end ? begin + per * index : end;
  hi = lo + per < end ? lo + per : end;
}

/// Elements per slice when `count` elements are shared by `world` ranks,
/// rounded up to `grain` (slice q = [q x slice, min((q+1) x slice, count))).
WEFT_HD std::uint64_t slice_size(std::uint64_t count, int world, std::uint64_t grain) {
  return ((count + world - 1) / world + grain - 1) / grain * grain;
}

/// (a mod m) for a possibly negative a.
WEFT_HD int wrap(int a, int m) { return ((a % m) + m) % m; }

/// Ring ReduceScatter: the slice rank `rank` sends at step s (1..W-1). The
/// partial sum of slice c starts at rank c+1 and ends, complete, at rank c.
WEFT_HD int ring_reduce_scatter_slice(int rank, int step, int world) { return wrap(rank - step, world); }

/// Ring AllGather: the shard rank `rank` forwards at step s (1..W-1): its own
/// at step 1, then each one it received at the step before.
WEFT_HD int ring_all_gather_shard(int rank, int step, int world) { return wrap(rank - step + 1, world); }

/// Flags of an AllGather plan: ready[W], arrived[W], and the ring's
/// [(W-1) steps][blocks] after them.
WEFT_HD std::uint64_t all_gather_flags(int world, int blocks) {
  return 2 * static_cast<std::uint64_t>(world) + static_cast<std::uint64_t>(world - 1) * blocks;
}

/// Flags of a one-shot AllReduce: [2 parities][W senders][blocks].
WEFT_HD std::uint64_t all_reduce_one_shot_flags(int world, int blocks) {
  return 2 * static_cast<std::uint64_t>(world) * blocks;
}
/// Where sender q's block b flags its slice for parity `parity`.
WEFT_HD std::uint64_t all_reduce_one_shot_flag(int parity, int sender, int block, int world, int blocks) {
  return (static_cast<std::uint64_t>(parity) * world + sender) * blocks + block;
}

/// Flags of a ring ReduceScatter: [2 parities][W - 1 steps][blocks], at least one.
WEFT_HD std::uint64_t reduce_scatter_ring_flags(int world, int blocks) {
  return 2 * static_cast<std::uint64_t>(world - 1) * blocks + 1;
}
/// Where step s's (1-based) partial of block b is flagged, for parity `parity`.
WEFT_HD std::uint64_t reduce_scatter_ring_flag(int parity, int step, int block, int world, int blocks) {
  return (static_cast<std::uint64_t>(parity) * (world - 1) + (step - 1)) * blocks + block;
}

// ---- the overlapped operators (host code; the CPU tests check them too) ----

/// The largest divisor of `rows` that is at most `want` (>= 1): chunks of equal rows.
inline std::int64_t even_chunks(std::int64_t rows, std::int64_t want) {
  for (std::int64_t c = want < rows ? want : rows; c > 1; --c)
    if (rows % c == 0) return c;
  return 1;
}

/// The smallest chunk worth its own copy and signal: each chunk costs a copy
/// engine launch and a stream wait or write (5 to 13 us measured on H200,
/// docs/decisions/0026), so a 16 MB chunk spends under a tenth of its transfer on them.
constexpr std::int64_t kMinChunkBytes = std::int64_t{16} << 20;

/// GEMM+ReduceScatter's and GEMM+AllReduce's chunks are sent as the GEMM
/// stores them, so the last chunk of a step is its tail: half the floor, so a
/// 16 MB block (2048 x 8192 bf16 on two ranks) travels in two chunks.
constexpr std::int64_t kMinStoredChunkBytes = std::int64_t{8} << 20;

/// How many chunks a rank's `rows` rows of `row_bytes` bytes travel in: at
/// most `want`, no chunk under min_chunk_bytes (but at least one), and equal
/// rows in each (even_chunks).
inline std::int64_t copy_chunks(std::int64_t rows, std::int64_t row_bytes, std::int64_t want,
                                std::int64_t min_chunk_bytes = kMinChunkBytes) {
  const std::int64_t by_size = rows * row_bytes / (min_chunk_bytes > 0 ? min_chunk_bytes : 1);
  return even_chunks(rows, by_size < 1 ? 1 : by_size < want ? by_size : want);
}

/// AllGather+GEMM: the peer rank `rank` pushes its shard to at turn i (1..W-1).
/// Peer p's GEMM walks shards p, p+1, ..., so it reaches ours after
/// (rank - p) mod W turns: the peer that needs it soonest comes first.
inline int shard_push_peer(int rank, int turn, int world) { return wrap(rank - turn, world); }

/// GEMM+ReduceScatter ring: the block of rows rank `rank` computes at step s
/// (0..W-1). Block b starts at rank b+1 and travels to b+2, ..., ending,
/// complete, at its owner b at the last step; each step adds the partial
/// received from rank - 1, who computed the same block a step earlier.
inline int ring_gemm_block(int rank, int step, int world) { return wrap(rank - 1 - step, world); }

}  // namespace weft::schedule
