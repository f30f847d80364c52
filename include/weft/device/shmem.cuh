// weft/device/shmem.cuh - the OpenSHMEM-compatible device calls, over NVLink peer pointers.
//
// Names and semantics follow OpenSHMEM 1.5 and NVSHMEM's device API, with one
// difference: each call takes the World it acts in as its first argument
// (weft keeps no global device state; see docs/decisions/0001). `pe` is a rank.
//
// Forms: plain = one thread; _warp = all 32 lanes of a warp call together with
// the same arguments; _block = every thread of the block calls together.
//
// Completion, as in OpenSHMEM: a put returns when its source may be reused;
// its data is guaranteed delivered only after quiet() (or barrier_all). Over
// NVLink a put is a stream of stores, which are locally complete once issued,
// so blocking and _nbi puts issue the same instructions; _nbi forms of the
// group calls skip the closing group sync. A get returns with the data in dest
// (blocking form); the _nbi form guarantees it only after quiet().
#pragma once

#include <cstddef>
#include <cstdint>

#include "weft/device/copy.cuh"
#include "weft/device/memory.cuh"
#include "weft/device/signal.cuh"
#include "weft/device/world.cuh"

#if defined(__CUDACC__)
namespace weft::shmem {

using dev::Cmp;
using dev::Scope;
using dev::World;

/// OpenSHMEM signal operators (shmem_signal_set / shmem_signal_add).
inline constexpr dev::SignalOp SIGNAL_SET = dev::SignalOp::set;
inline constexpr dev::SignalOp SIGNAL_ADD = dev::SignalOp::add;
/// OpenSHMEM comparison constants for signal_wait_until.
inline constexpr Cmp CMP_EQ = Cmp::eq, CMP_NE = Cmp::ne, CMP_GT = Cmp::gt, CMP_GE = Cmp::ge,
                     CMP_LT = Cmp::lt, CMP_LE = Cmp::le;

/// This PE's number. No memory access.
WEFT_DEVICE int my_pe(const World& w) { return w.rank; }
/// Number of PEs. No memory access.
WEFT_DEVICE int n_pes(const World& w) { return w.size; }
/// Address of symmetric `dest` on `pe` for direct loads/stores (every PE of a
/// node is reachable with the native backend). No memory access.
template <class T>
WEFT_DEVICE T* ptr(const World& w, T* dest, int pe) { return w.symm_at(dest, pe); }

// ---- put / get: thread, warp and block forms -------------------------------
/// Copies `bytes` from local `src` to symmetric `dest` on `pe`. One thread.
WEFT_DEVICE void putmem(const World& w, void* dest, const void* src, std::size_t bytes, int pe) {
  dev::copy_thread(w.symm_at(dest, pe), src, bytes);
}
/// Non-blocking putmem: delivery guaranteed after quiet().
WEFT_DEVICE void putmem_nbi(const World& w, void* dest, const void* src, std::size_t bytes, int pe) {
  putmem(w, dest, src, bytes, pe);
}
/// Warp-cooperative putmem; returns after the warp's stores are issued (syncs the warp).
WEFT_DEVICE void putmem_warp(const World& w, void* dest, const void* src, std::size_t bytes, int pe) {
  dev::copy_warp(w.symm_at(dest, pe), src, bytes);
  __syncwarp();
}
/// Warp-cooperative putmem_nbi: no warp sync; dest is complete on `pe` after quiet().
WEFT_DEVICE void putmem_nbi_warp(const World& w, void* dest, const void* src, std::size_t bytes, int pe) {
  dev::copy_warp(w.symm_at(dest, pe), src, bytes);
}
/// Block-cooperative putmem; syncs the block before returning.
WEFT_DEVICE void putmem_block(const World& w, void* dest, const void* src, std::size_t bytes, int pe) {
  dev::copy_block(w.symm_at(dest, pe), src, bytes);
  __syncthreads();
}
/// Block-cooperative putmem_nbi: no block sync; dest is complete on `pe` after quiet().
WEFT_DEVICE void putmem_nbi_block(const World& w, void* dest, const void* src, std::size_t bytes, int pe) {
  dev::copy_block(w.symm_at(dest, pe), src, bytes);
}

/// Copies `bytes` from symmetric `src` on `pe` into local `dest`. One thread;
/// the data is in dest on return.
WEFT_DEVICE void getmem(const World& w, void* dest, const void* src, std::size_t bytes, int pe) {
  dev::copy_thread(dest, w.symm_at(src, pe), bytes);
}
/// Non-blocking getmem: dest is guaranteed filled after quiet().
WEFT_DEVICE void getmem_nbi(const World& w, void* dest, const void* src, std::size_t bytes, int pe) {
  getmem(w, dest, src, bytes, pe);
}
/// Warp-cooperative getmem; every lane sees the whole of dest on return.
WEFT_DEVICE void getmem_warp(const World& w, void* dest, const void* src, std::size_t bytes, int pe) {
  dev::copy_warp(dest, w.symm_at(src, pe), bytes);
  __syncwarp();
}
/// Warp-cooperative getmem_nbi: no warp sync; dest is filled after quiet().
WEFT_DEVICE void getmem_nbi_warp(const World& w, void* dest, const void* src, std::size_t bytes, int pe) {
  dev::copy_warp(dest, w.symm_at(src, pe), bytes);
}
/// Block-cooperative getmem; every thread sees the whole of dest on return.
WEFT_DEVICE void getmem_block(const World& w, void* dest, const void* src, std::size_t bytes, int pe) {
  dev::copy_block(dest, w.symm_at(src, pe), bytes);
  __syncthreads();
}
/// Block-cooperative getmem_nbi: no block sync; dest is filled after quiet().
WEFT_DEVICE void getmem_nbi_block(const World& w, void* dest, const void* src, std::size_t bytes, int pe) {
  dev::copy_block(dest, w.symm_at(src, pe), bytes);
}

// ---- signals ---------------------------------------------------------------
/// Atomically sets or adds `value` to symmetric flag `sig` on `pe`. Release at
/// system scope (stronger than OpenSHMEM asks: earlier puts of this thread are
/// visible first). Does not block.
WEFT_DEVICE void signal_op(const World& w, std::uint64_t* sig, std::uint64_t value, dev::SignalOp op, int pe) {
  dev::notify(w, sig, pe, value, op, Scope::sys);
}
/// Spins until the local symmetric flag satisfies (sig CMP value); returns its
/// value. Acquire at system scope. Blocks, bounded by the World's timeout.
WEFT_DEVICE std::uint64_t signal_wait_until(const World& w, std::uint64_t* sig, Cmp cmp, std::uint64_t value) {
  return dev::wait_until(w, sig, cmp, value, Scope::sys);
}
/// Reads a local signal (relaxed, system scope). Does not block.
WEFT_DEVICE std::uint64_t signal_fetch(const World&, const std::uint64_t* sig) {
  return dev::ld_relaxed(sig, Scope::sys);
}

/// putmem, then the signal update on `pe`, ordered so that a PE that sees the
/// signal also sees the data. One thread.
WEFT_DEVICE void putmem_signal(const World& w, void* dest, const void* src, std::size_t bytes,
                               std::uint64_t* sig, std::uint64_t value, dev::SignalOp op, int pe) {
  putmem(w, dest, src, bytes, pe);
  signal_op(w, sig, value, op, pe);
}
/// putmem_signal under its OpenSHMEM non-blocking name: the signal already
/// orders the data, so it is the blocking form.
WEFT_DEVICE void putmem_signal_nbi(const World& w, void* dest, const void* src, std::size_t bytes,
                                   std::uint64_t* sig, std::uint64_t value, dev::SignalOp op, int pe) {
  putmem_signal(w, dest, src, bytes, sig, value, op, pe);
}
/// Warp form: the warp copies, syncs, and lane 0 releases the signal. The
/// release is cumulative, so it covers every lane's stores ordered before it by
/// the warp sync (PTX memory model).
WEFT_DEVICE void putmem_signal_warp(const World& w, void* dest, const void* src, std::size_t bytes,
                                    std::uint64_t* sig, std::uint64_t value, dev::SignalOp op, int pe) {
  putmem_nbi_warp(w, dest, src, bytes, pe);
  __syncwarp();
  if ((threadIdx.x & 31u) == 0) signal_op(w, sig, value, op, pe);
  __syncwarp();
}
/// putmem_signal_warp under its non-blocking name (the same ordering).
WEFT_DEVICE void putmem_signal_nbi_warp(const World& w, void* dest, const void* src, std::size_t bytes,
                                        std::uint64_t* sig, std::uint64_t value, dev::SignalOp op, int pe) {
  putmem_signal_warp(w, dest, src, bytes, sig, value, op, pe);
}
/// Block form: the block copies, syncs, and thread 0 releases the signal.
WEFT_DEVICE void putmem_signal_block(const World& w, void* dest, const void* src, std::size_t bytes,
                                     std::uint64_t* sig, std::uint64_t value, dev::SignalOp op, int pe) {
  putmem_nbi_block(w, dest, src, bytes, pe);
  __syncthreads();
  if (dev::block_thread() == 0) signal_op(w, sig, value, op, pe);
  __syncthreads();
}
/// putmem_signal_block under its non-blocking name (the same ordering).
WEFT_DEVICE void putmem_signal_nbi_block(const World& w, void* dest, const void* src, std::size_t bytes,
                                         std::uint64_t* sig, std::uint64_t value, dev::SignalOp op, int pe) {
  putmem_signal_block(w, dest, src, bytes, sig, value, op, pe);
}

// ---- ordering and completion -----------------------------------------------
/// Orders this thread's earlier puts (to any PE) before its later ones. Does not wait for delivery.
WEFT_DEVICE void fence(const World&) { dev::fence_acq_rel(Scope::sys); }
/// Waits until this thread's earlier puts and non-blocking gets are complete and visible system-wide.
WEFT_DEVICE void quiet(const World&) { dev::fence_sc(Scope::sys); }

// ---- single-element access and atomics on a PE -----------------------------
/// Stores one value into symmetric `dest` on `pe` (shmem_int_p and friends).
template <class T>
WEFT_DEVICE void p(const World& w, T* dest, T value, int pe) { *w.symm_at(dest, pe) = value; }
/// p() for int (shmem_int_p).
WEFT_DEVICE void int_p(const World& w, int* dest, int value, int pe) { p(w, dest, value, pe); }
/// Loads one value from symmetric `src` on `pe`.
template <class T>
WEFT_DEVICE T g(const World& w, const T* src, int pe) { return *w.symm_at(src, pe); }
/// g() for int (shmem_int_g).
WEFT_DEVICE int int_g(const World& w, const int* src, int pe) { return g(w, src, pe); }

/// Atomic fetch-and-add on symmetric `dest` on `pe`; relaxed, system scope.
WEFT_DEVICE std::uint64_t atomic_fetch_add(const World& w, std::uint64_t* dest, std::uint64_t value, int pe) {
  return dev::atomic_add(w.symm_at(dest, pe), value, Scope::sys, dev::Order::relaxed);
}
/// Atomic add without the fetch.
WEFT_DEVICE void atomic_add(const World& w, std::uint64_t* dest, std::uint64_t value, int pe) {
  (void)atomic_fetch_add(w, dest, value, pe);
}
/// Atomic compare-and-swap on `pe`: returns the old value; relaxed, system scope.
WEFT_DEVICE std::uint64_t atomic_compare_swap(const World& w, std::uint64_t* dest, std::uint64_t cond,
                                              std::uint64_t value, int pe) {
  return dev::atomic_cas(w.symm_at(dest, pe), cond, value, Scope::sys, dev::Order::relaxed);
}
/// Atomic read of symmetric `src` on `pe`; relaxed, system scope.
WEFT_DEVICE std::uint64_t atomic_fetch(const World& w, const std::uint64_t* src, int pe) {
  return dev::ld_relaxed(w.symm_at(src, pe), Scope::sys);
}

// ---- barriers (block form: every thread of one block per PE calls) ---------
namespace detail {
/// Every PE's block has arrived: each thread raises this PE's flag on some
/// PEs, then waits for theirs at the new epoch (system scope, acquire).
WEFT_DEVICE void block_rendezvous(const World& w) {
  __shared__ std::uint64_t epoch;
  if (dev::block_thread() == 0) epoch = ++*w.barrier_epoch;  // local counter; one block at a time
  __syncthreads();
  for (int pe = static_cast<int>(dev::block_thread()); pe < w.size; pe += static_cast<int>(dev::block_threads()))
    dev::notify(w, w.barrier_flags + w.rank, pe, epoch, dev::SignalOp::set, Scope::sys);
  for (int pe = static_cast<int>(dev::block_thread()); pe < w.size; pe += static_cast<int>(dev::block_threads()))
    dev::wait_until(w, w.barrier_flags + pe, Cmp::ge, epoch, Scope::sys);
  __syncthreads();
}
}  // namespace detail

/// Waits until every PE reached this call, after completing this block's puts
/// (quiet). Every thread of exactly one block per PE calls it; calls on a PE
/// must not overlap (the epoch counter is per PE). Blocks, bounded by the timeout.
WEFT_DEVICE void barrier_all_block(const World& w) {
  quiet(w);
  __syncthreads();
  detail::block_rendezvous(w);
}
/// Like barrier_all_block but without completing outstanding puts: a pure
/// rendezvous whose release/acquire orders only what each thread already made visible.
WEFT_DEVICE void sync_all_block(const World& w) {
  __syncthreads();
  detail::block_rendezvous(w);
}

}  // namespace weft::shmem
#endif  // __CUDACC__
