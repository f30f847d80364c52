// two_level.cuh (private) - what the two-level collective kernels share: a block's
// put, wait and signal on weft/device/remote.cuh, and the fp32 sums.
//
// Compiled only into weft::internode (relocatable device code, NVSHMEM's
// device library in the program's device link; docs/decisions/0061, 0066).
// Every call acts for one thread block on its slice of the data; its team is
// the world (weft's ranks are NVSHMEM's PEs), its flags are the block's own.
#pragma once

#include <cstdint>
#include <string>

#include "../hierarchy.hpp"
#include "../kernel_util.cuh"
#include "../two_level.hpp"
#include "weft/device/reduce.cuh"
#include "weft/device/remote.cuh"

namespace weft::ops_detail::two_level {

/// Waits until this rank's flag holds the launch's epoch or more, then syncs
/// the block. Thread 0 spins (acquire, system scope: the data a put ordered
/// before the flag is visible to the block after the sync); bounded by the
/// World's timeout, naming `from`, the rank that raises the flag
/// (docs/decisions/0006). Team: world. Scope: block; every thread calls.
__device__ __forceinline__ void wait(const dev::World& w, std::uint64_t* flag, std::uint64_t epoch, int from) {
  if (threadIdx.x == 0) remote::signal_wait_until(w, flag, dev::Cmp::ge, epoch, from);
  __syncthreads();
}

/// Sets `flag` on rank `pe` to the epoch, after everything the block wrote
/// before (the caller synced the block: thread 0's release, or its fence and
/// NVSHMEM's, is cumulative over the block's writes). Team: world. Scope:
/// block; every thread calls; thread 0 signals. Does not block.
__device__ __forceinline__ void signal(const dev::World& w, std::uint64_t* flag, std::uint64_t epoch, int pe) {
  if (threadIdx.x == 0) remote::signal_op(w, flag, epoch, dev::SignalOp::set, pe);
}

/// Puts `bytes` from local `src` to symmetric `dest` on rank `pe`, then sets
/// its `flag` to the epoch (released after the data at system scope: an
/// acquire that sees the flag sees the data). An empty slice raises the flag
/// alone. Blocking: `src` may be rewritten on return (for a source that stays
/// as it is until the kernel's quiet, `nbi` skips that wait on NVSHMEM's
/// path). Team: world. Scope: block; every thread calls; syncs the block.
__device__ __forceinline__ void put(const dev::World& w, void* dest, const void* src, std::uint64_t bytes,
                                    std::uint64_t* flag, std::uint64_t epoch, int pe, bool nbi) {
  if (bytes == 0) {
    __syncthreads();
    signal(w, flag, epoch, pe);
    __syncthreads();
  } else if (nbi) {
    remote::put_signal_nbi_block(w, dest, src, bytes, flag, epoch, dev::SignalOp::set, pe);
  } else {
    remote::put_signal_block(w, dest, src, bytes, flag, epoch, dev::SignalOp::set, pe);
  }
}

/// out[k] = fp32 sum over q = 0..n-1, in that order, of src(q)[k], k in [0, len),
/// by the block's threads. Sources are T (bf16, fp16, fp32); loads bypass L1
/// (peers and NVSHMEM wrote them). No ordering: the caller waited and syncs after.
template <class T, class Src>
__device__ __forceinline__ void sum_to_f32(float* out, Src src, int n, std::uint64_t len) {
  for (std::uint64_t k = threadIdx.x; k < len; k += blockDim.x) {
    float s = dev::Elem<T>::to_float(__ldcg(src(0) + k));
    for (int q = 1; q < n; ++q) s += dev::Elem<T>::to_float(__ldcg(src(q) + k));
    out[k] = s;
  }
}

/// acc[k] = acc[k] + add[k] in fp32, k in [0, len), by the block's threads; loads
/// bypass L1 (peers and NVSHMEM wrote both). No ordering: the caller waited and syncs after.
__device__ __forceinline__ void add_f32(float* acc, const float* add, std::uint64_t len) {
  for (std::uint64_t k = threadIdx.x; k < len; k += blockDim.x) acc[k] = __ldcg(acc + k) + __ldcg(add + k);
}

/// out[k] = the fp32 sum over q = 0..n-1, in that order, of src(q)[k] (fp32),
/// rounded once to T; also into `copy` where it is not null. By the block's
/// threads; no ordering.
template <class T, class Src>
__device__ __forceinline__ void sum_f32_to(T* out, T* copy, Src src, int n, std::uint64_t len) {
  for (std::uint64_t k = threadIdx.x; k < len; k += blockDim.x) {
    float s = __ldcg(src(0) + k);
    for (int q = 1; q < n; ++q) s += __ldcg(src(q) + k);
    const T v = dev::Elem<T>::from_float(s);
    out[k] = v;
    if (copy) copy[k] = v;
  }
}

/// The blocks of a two-level kernel: about 32 KB of the message each, at most
/// 32 and the room in the rank's SM share. Every block waits on other ranks'
/// blocks, so all of them, on every rank, must be resident at once
/// (docs/decisions/0012). A launch triggers its successor at once
/// (dev::epoch_begin), whose blocks then sit resident in griddepcontrol.wait
/// beside it; at 82 registers a block of 512 threads fills an SM. On a GPU of
/// its own a rank has room for both (2 x 32 of 132 SMs); where ranks share a
/// GPU, two launches of every rank fill it, so each takes half the share (at
/// 4 ranks the whole share, 32 blocks, deadlocked back-to-back launches).
/// weft launches without PDL where ranks share a GPU (gpu_share.hpp); the
/// half share stays for WEFT_PDL=1, which turns it back on there.
inline int blocks_for(const Context& ctx, std::uint64_t bytes, int max_sms) {
  const Team& team = ctx.team();
  const int room = team.shares_gpus() ? std::max(1, team.sm_count / 2) : team.sm_count;
  return bulk_blocks(bytes, 32u << 10, room, max_sms);
}

/// Every rank builds the same plan: the grid, the blocks, the sizes.
inline void agree(Context& ctx, const std::string& what) { ctx.verify_same_call(what); }

}  // namespace weft::ops_detail::two_level
