// weft/device/remote.cuh - device calls that reach any peer: by load and store
// where its heap is mapped here, through NVSHMEM's device API where it is not.
//
// A kernel written on these calls runs unchanged on one node and across
// nodes: each call branches on World::reachable(pe) (the peer's heap mapped
// into this process: NVLink or the same GPU, within this rank's node) and
// takes weft's direct path (weft/device/shmem.cuh, plain loads and stores) or
// NVSHMEM's put / put-with-signal / get, which reach a peer on another node
// over its transports (and, between virtual nodes on one machine,
// WEFT_VIRTUAL_NODES, over NVSHMEM's P2P transport).
//
// Every call takes the World it acts in, as every weft device call does
// (docs/decisions/0001). Its team is the world: `pe` is a weft rank, which is
// NVSHMEM's PE of NVSHMEM_TEAM_WORLD (the NVSHMEM heap checks that they agree).
// Forms: plain = one thread; _block = every thread of the block calls, with
// the same arguments, and the call syncs the block (__syncthreads) as it says.
// Symmetric addresses are this rank's pointers into the symmetric heap (the
// NVSHMEM heap's block is NVSHMEM's symmetric memory, at the same offset on
// every rank, so weft's pointers are NVSHMEM's symmetric addresses).
//
// Building: NVSHMEM's device API needs relocatable device code. A unit that
// includes this header is compiled with -rdc=true and device-linked with
// libnvshmem_device.a: link the CMake target weft::internode (built where
// NVSHMEM is found) and set CUDA_SEPARABLE_COMPILATION on the target that
// holds the kernels (weft_use_internode(<target>) does both). libweft itself
// has no relocatable device code. At run time, create a weft::RemotePeers
// (weft/internode/remote_peers.hpp) once before launching such kernels: it
// sets NVSHMEM's device state in the program's device code. Under the native
// heap every peer is reachable, the NVSHMEM branch is never taken, and none of
// this is needed at run time. docs/decisions/0061.
#pragma once

#include <cstddef>
#include <cstdint>

#include "weft/device/memory.cuh"
#include "weft/device/shmem.cuh"
#include "weft/device/signal.cuh"
#include "weft/device/world.cuh"

#if defined(__CUDACC__)
#if !defined(__CUDACC_RDC__)
#error "weft/device/remote.cuh calls NVSHMEM's device API, which needs relocatable device code: compile this unit with -rdc=true (CMake: weft_use_internode(<target>), docs/decisions/0061)"
#endif
#include <nvshmem.h>
#include <nvshmemx.h>

namespace weft::remote {

using dev::Cmp;
using dev::Scope;
using dev::SignalOp;
using dev::World;

namespace detail {
WEFT_DEVICE int nvshmem_signal_op(SignalOp op) { return op == SignalOp::set ? NVSHMEM_SIGNAL_SET : NVSHMEM_SIGNAL_ADD; }
/// True when some rank's heap is not mapped here (so NVSHMEM may have carried a put). Reads peer_base.
WEFT_DEVICE bool any_unmapped(const World& w) {
  for (int pe = 0; pe < w.size; ++pe)
    if (!w.reachable(pe)) return true;
  return false;
}
}  // namespace detail

/// True when rank `pe`'s heap is mapped here, so the direct path serves it.
/// Reads World::peer_base[pe]; no other memory access; does not block. Team:
/// world. Scope: thread.
WEFT_DEVICE bool direct(const World& w, int pe) { return w.reachable(pe); }

// ---- put with signal --------------------------------------------------------

/// Copies `bytes` from local `src` to symmetric `dest` on rank `pe`, then
/// updates the 64-bit symmetric flag `sig` on `pe` (SignalOp::set: sig =
/// value; add: sig += value, atomically). Team: world. Scope: block: every
/// thread calls with the same arguments. Memory order: the data, then the
/// signal with release semantics at system scope: a thread of `pe` that
/// observes the signal with an acquire (signal_wait_until) sees every byte of
/// the data. Blocking: on return `src` may be overwritten. Syncs the block.
/// Direct: the block stores to the peer, syncs, and thread 0 releases the
/// flag (shmem::putmem_signal_block). Otherwise NVSHMEM's
/// nvshmemx_putmem_signal_block (NVSHMEM orders the signal after the data on
/// every transport); for transports through a NIC, `src` must be in the
/// symmetric heap (registered memory).
WEFT_DEVICE void put_signal_block(const World& w, void* dest, const void* src, std::size_t bytes, std::uint64_t* sig,
                                  std::uint64_t value, SignalOp op, int pe) {
  if (w.reachable(pe)) {
    shmem::putmem_signal_block(w, dest, src, bytes, sig, value, op, pe);
  } else {
    nvshmemx_putmem_signal_block(dest, src, bytes, sig, value, detail::nvshmem_signal_op(op), pe);
    __syncthreads();
  }
}

/// put_signal_block without waiting for the source: the data and the signal
/// are ordered as in put_signal_block (the signal, observed with an acquire,
/// covers the data), but `src` may be overwritten only after quiet_block (or
/// the kernel's end). Team: world. Scope: block. Syncs the block. Direct: the
/// same stores as put_signal_block (stores are complete once issued).
/// Otherwise NVSHMEM's nvshmemx_putmem_signal_nbi_block.
WEFT_DEVICE void put_signal_nbi_block(const World& w, void* dest, const void* src, std::size_t bytes,
                                      std::uint64_t* sig, std::uint64_t value, SignalOp op, int pe) {
  if (w.reachable(pe)) {
    shmem::putmem_signal_block(w, dest, src, bytes, sig, value, op, pe);
  } else {
    nvshmemx_putmem_signal_nbi_block(dest, src, bytes, sig, value, detail::nvshmem_signal_op(op), pe);
    __syncthreads();
  }
}

// ---- signals ----------------------------------------------------------------

/// Sets or adds `value` to the 64-bit symmetric flag `sig` on rank `pe`, after
/// everything this thread wrote or put before: release at system scope on
/// the direct path (dev::notify); otherwise a system fence and nvshmem_fence
/// (this thread's earlier puts to `pe` are delivered first), then NVSHMEM's
/// nvshmemx_signal_op. Team: world. Scope: thread (one thread calls). Does not
/// block.
WEFT_DEVICE void signal_op(const World& w, std::uint64_t* sig, std::uint64_t value, SignalOp op, int pe) {
  if (w.reachable(pe)) {
    dev::notify(w, sig, pe, value, op, Scope::sys);
  } else {
    dev::fence_sc(Scope::sys);
    nvshmem_fence();
    nvshmemx_signal_op(sig, value, detail::nvshmem_signal_op(op), pe);
  }
}

/// Spins until this rank's 64-bit symmetric flag `sig` satisfies (sig CMP
/// value); returns the value seen. Team: world (`from`, the rank expected to
/// signal, or -1, is named in the timeout report). Scope: thread. Memory
/// order: acquire at system scope: the data a put_signal ordered before the
/// signal is visible to this thread after the return (to the block after a
/// __syncthreads). Blocks, bounded by the World's timeout (WEFT_WAIT_TIMEOUT),
/// then reports and traps (docs/decisions/0006).
///
/// Both paths wait alike: the flag is local whichever way it was written, by a
/// peer's stores or by NVSHMEM's transport, and NVSHMEM's own
/// nvshmem_signal_wait_until is an unbounded volatile spin on it, which weft's
/// bounded acquire spin (dev::wait_until) covers. The branch is in the writer.
WEFT_DEVICE std::uint64_t signal_wait_until(const World& w, std::uint64_t* sig, Cmp cmp, std::uint64_t value,
                                            int from = -1) {
  return dev::wait_until(w, sig, cmp, value, Scope::sys, from);
}

// ---- get --------------------------------------------------------------------

/// Copies `bytes` from symmetric `src` on rank `pe` into local `dest`. Team:
/// world. Scope: block: every thread calls with the same arguments. Blocking:
/// on return every thread sees the whole of dest (syncs the block). Memory
/// order: none beyond that: pair it with a signal the owner released after
/// writing src (signal_wait_until first). Direct: loads from the peer
/// (shmem::getmem_block). Otherwise NVSHMEM's nvshmemx_getmem_block; for
/// transports through a NIC, `dest` must be in the symmetric heap.
WEFT_DEVICE void get_block(const World& w, void* dest, const void* src, std::size_t bytes, int pe) {
  if (w.reachable(pe)) {
    shmem::getmem_block(w, dest, src, bytes, pe);
  } else {
    nvshmemx_getmem_block(dest, src, bytes, pe);
    __syncthreads();
  }
}

// ---- completion -------------------------------------------------------------

/// Completes every put this block issued before (put_signal_nbi_block's
/// sources may then be overwritten) and makes it visible at system scope, on
/// both paths: a system fence, then, where some peer is reached through
/// NVSHMEM, NVSHMEM's nvshmem_quiet (which completes the PE's outstanding
/// transfers on its transports). Team: world. Scope: block: every thread
/// calls; syncs the block before and after. Blocks until the transports
/// report completion.
WEFT_DEVICE void quiet_block(const World& w) {
  __syncthreads();
  if (dev::block_thread() == 0) {
    dev::fence_sc(Scope::sys);
    if (detail::any_unmapped(w)) nvshmem_quiet();
  }
  __syncthreads();
}

}  // namespace weft::remote
#endif  // __CUDACC__
