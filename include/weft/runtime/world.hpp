// weft/runtime/world.hpp - a kernel's view of the job, as plain data: its rank, the peers' heaps, the hang guard.
//
// A World is a small struct passed to kernels by value. The runtime builds it
// (Context::world()), kernels read it: it is a plain aggregate, usable from
// host code, and carries no global state. Every device call takes the World
// it acts in, as NCCL's device API takes its team, so a kernel reads like the
// communication it does. The device language's free functions on it are in
// weft/device/world.cuh.
#pragma once

#include <cstdint>

#include "weft/core/signal_types.hpp"

namespace weft::dev {

/// What a spin-wait that ran past its bound leaves for the host to print.
/// Lives in mapped pinned host memory, so it survives the kernel's trap.
struct WaitReport {
  std::int32_t hit;           ///< 0 until a wait times out; then 1 (first reporter wins)
  std::int32_t rank;          ///< the rank that gave up waiting
  std::uint64_t flag_offset;  ///< the flag's byte offset in the symmetric heap (~0 if not in it)
  std::uint64_t expected;     ///< the value the wait compared against
  std::uint64_t observed;     ///< the flag's last value
  std::uint32_t cmp;          ///< the comparison (Cmp)
  std::uint32_t block;        ///< linear block index of the waiter
  std::uint64_t waited_ns;    ///< how long it spun
  std::int32_t peer;          ///< the rank that should have signalled, or -1 if the caller did not say
  std::int32_t pad;
};

/// A per-operation epoch kept in device memory, so repeated launches (and
/// CUDA-graph replays) each see the next value without the host: every block
/// reads it with epoch_begin and the last block to finish advances it in epoch_end.
struct LaunchEpoch {
  std::uint64_t* value;    ///< the epoch of the last completed launch
  unsigned* arrivals;      ///< blocks of the current launch that have finished
};

/// The device-side handle of a job: the same under either heap backend (with
/// NVSHMEM, peer_base holds nvshmem_ptr's addresses; nullptr for peers it does
/// not reach and for peers of another node).
struct World {
  std::int32_t rank;                 ///< this process's rank
  std::int32_t size;                 ///< number of ranks
  char* heap_base;                   ///< this rank's symmetric heap (device address)
  std::uint64_t heap_bytes;          ///< its size
  char* const* peer_base;            ///< device array [size]: where each rank's heap is mapped here (nullptr: not mapped)
  std::uint64_t* barrier_flags;      ///< symmetric uint64[size], for barrier_all / sync_all
  std::uint64_t* barrier_epoch;      ///< this rank's barrier counter (local device memory)
  std::uint64_t wait_timeout_ns;     ///< spin bound; 0 = wait forever
  WaitReport* wait_report;           ///< where a timed-out wait reports (mapped host memory)

#if defined(__CUDACC__)
  /// Rank of this process. Scope: none; does not block.
  WEFT_DEVICE int my_rank() const { return rank; }
  /// Number of ranks. Scope: none; does not block.
  WEFT_DEVICE int world_size() const { return size; }

  /// The address, valid in this kernel, of symmetric object `p` on rank `pe`
  /// (p must point into this rank's heap). Plain address arithmetic: no memory
  /// access, no ordering, does not block. Loads/stores through the result go
  /// over NVLink when pe != rank.
  template <class T>
  WEFT_DEVICE T* symm_at(T* p, int pe) const {
    auto offset = reinterpret_cast<const char*>(p) - heap_base;
    return reinterpret_cast<T*>(peer_base[pe] + offset);
  }

  /// True when rank pe's heap is mapped here, so symm_at(p, pe) may be
  /// dereferenced: every peer under the native heap; under NVSHMEM, the peers
  /// of this rank's node that nvshmem_ptr reaches (NVLink, the same GPU; not
  /// another virtual node's, WEFT_VIRTUAL_NODES). weft/device/remote.cuh
  /// branches here: loads and stores where true, NVSHMEM's device API where
  /// false (docs/decisions/0061). Reads peer_base[pe]; does not block.
  WEFT_DEVICE bool reachable(int pe) const { return peer_base[pe] != nullptr; }

  /// The heap offset of `p` for reports, or ~0 if p is outside this rank's heap.
  WEFT_DEVICE std::uint64_t offset_of(const void* p) const {
    auto d = reinterpret_cast<const char*>(p) - heap_base;
    return (d >= 0 && static_cast<std::uint64_t>(d) < heap_bytes) ? static_cast<std::uint64_t>(d)
                                                                    : ~std::uint64_t{0};
  }
#endif
};

}  // namespace weft::dev
