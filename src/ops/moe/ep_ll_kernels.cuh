// ep_ll_kernels.cuh (private) - ExpertParallelLowLatency's three kernels, for
// the one-node plan (moe/ep_ll.cu) and the plan across nodes
// (internode/ep_ll.cu), which differ only in how a row, a source entry and a
// flag reach a peer: the Transport.
//
//   send     (grid from the rank's SM share; waits for nobody)
//            a warp per token validates its row, finds each pair's position
//            among this rank's earlier pairs of the same expert (a scan of
//            the earlier rows: M x k entries at most), and writes the token
//            into row (local expert, this rank, position) of each expert's
//            owner, with its (token, slot) in recv_src. With fp8_dispatch it
//            writes the token cast to e4m3 and a scale per 128 channels. The
//            grid's last block counts this rank's pairs per expert and sets
//            each owner's flag (local expert, this rank) to (epoch << 32) | pairs.
//   recv     (one block) waits for every (local expert, source) flag of this
//            epoch and writes the counts.
//   combine  (grid from the SM share) send half: each received row's output
//            goes back to its source, to row (token, slot) of the source's
//            combine buffer; the last block sets each source's flag to the
//            epoch. Receive half: once every rank's flag is set, a warp per
//            token sums w x y over its slots in order (fp32), rounds once.
//
// Transports (static device functions; the kernels call nothing else to reach a peer):
//   - DirectPeers (below): every peer's heap is mapped here; stores.
//   - across nodes (internode/ep_ll.cu): stores where the peer is reachable,
//     NVSHMEM's warp puts elsewhere. A NIC reads only registered memory, so a
//     row bound for another node is first staged in this rank's symmetric
//     heap (kStaged: LlArgs::send_x / send_scales, one row per token, cast
//     once under fp8; LlArgs::send_y, one row per received row), and each
//     block completes its puts (complete_block) before the grid's last block
//     raises the flags, which therefore cover every row.
//
// No host synchronisation: the counts travel in the flags, positions are
// computed on the device, every buffer has a fixed size. Reuse across calls
// without a reset: a source writes into a rank's receive buffer in send
// n + 1 only after its combine n has seen that rank's combine flag, set
// after the rank's combine n had read recv_src (and after its experts, which
// precede combine on its stream, had read recv_x); a rank writes into a
// source's combine buffer in combine n + 1 only after its recv n + 1 saw the
// source's counts of n + 1, sent after the source's combine n had read the
// buffer. A staging row is rewritten one call later, after the puts that
// read it were completed. Flags carry the epoch, so nothing is reset.
#pragma once

#include <cuda_fp8.h>

#include <cstring>

#include "../kernel_util.cuh"
#include "ep_layout.hpp"
#include "ep_ll_args.hpp"
#include "row_sums.cuh"
#include "weft/device.cuh"

namespace weft::moe_detail {

using ops_detail::last_block;

/// The one-node transport: every peer's heap is mapped here, reached by stores.
struct DirectPeers {
  static constexpr bool kStaged = false;
  __device__ static bool direct(const dev::World&, int) { return true; }
  /// The calling warp copies `bytes` from `src` (any memory) to symmetric `dst` on rank `pe`.
  __device__ static void row_warp(const dev::World& w, void* dst, const void* src, const void* /*staged*/,
                                  std::size_t bytes, int pe) {
    dev::copy_warp(w.symm_at(dst, pe), src, bytes);
  }
  /// One thread writes `v` to symmetric `dst` on rank `pe`.
  __device__ static void put_i32(const dev::World& w, std::int32_t* dst, std::int32_t v, int pe) {
    *w.symm_at(dst, pe) = v;
  }
  /// One thread sets symmetric flag `sig` on rank `pe` to `v`, after everything the grid wrote before
  /// (release at system scope; the grid's rows precede it through last_block's chain).
  __device__ static void signal(const dev::World& w, std::uint64_t* sig, std::uint64_t v, int pe) {
    dev::notify(w, sig, pe, v, dev::SignalOp::set, dev::Scope::sys);
  }
  /// Every thread of the block: nothing to complete (stores are complete once issued).
  __device__ static void complete_block(const dev::World&) {}
};

// fp8 dispatch: a warp casts one token's row (src, `vecs` 16-byte vectors of 8 bf16) to e4m3
// once and stores it to each of its destinations: lane j of `sends` holds slot j's row
// (dst_x: H bytes) and scales (dst_scales: one float per 128 channels). scale = amax / 448
// over the block (amax at least kFp8MinAmax), each channel x * (448 / amax) rounded to
// nearest, saturated to the finite range. A step covers 256 channels: two blocks, one per
// half-warp; each lane stores its own 8 bytes to every destination, so nothing is staged.
inline __device__ void cast_row_to_fp8(const uint4* src, std::int64_t vecs, int lane, unsigned sends, std::uint8_t* dst_x,
                                float* dst_scales) {
  const auto x_at = reinterpret_cast<unsigned long long>(dst_x);
  const auto scales_at = reinterpret_cast<unsigned long long>(dst_scales);
  for (std::int64_t v0 = 0; v0 < vecs; v0 += 32) {  // every lane runs every step (the shuffles)
    const std::int64_t v = v0 + lane;
    const bool here = v < vecs;  // the same for a whole half-warp: vecs is a multiple of 16
    uint4 raw = make_uint4(0, 0, 0, 0);
    if (here) raw = src[v];
    const __nv_bfloat16* e = reinterpret_cast<const __nv_bfloat16*>(&raw);
    float f[8], amax = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      f[i] = __bfloat162float(e[i]);
      amax = fmaxf(amax, fabsf(f[i]));
    }
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));  // the half-warp's
    amax = fmaxf(amax, kFp8MinAmax);
    const float inv = kE4m3Max / amax;
    std::uint8_t q[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] = __nv_cvt_float_to_fp8(f[i] * inv, __NV_SATFINITE, __NV_E4M3);
    uint2 packed;
    std::memcpy(&packed, q, 8);
    for (unsigned left = sends; left != 0; left &= left - 1) {
      const int j = __ffs(left) - 1;
      auto* x = reinterpret_cast<uint2*>(__shfl_sync(0xffffffffu, x_at, j));
      auto* scales = reinterpret_cast<float*>(__shfl_sync(0xffffffffu, scales_at, j));
      if (!here) continue;
      x[v] = packed;
      if ((lane & 15) == 0) scales[v / 16] = amax / kE4m3Max;
    }
  }
}

/// What every thread of a low-latency kernel derives from LlArgs: its lane, its warp's
/// first item and the stride of a grid-stride loop by warps, and the plan's sizes.
struct LlWarp {
  int lane;
  std::int64_t warp0, warps;
  int W, E, k, me, M;
  std::int64_t vecs;  ///< 16-byte vectors per bf16 row
};
inline __device__ LlWarp ll_warp(const LlArgs& a) {
  return {static_cast<int>(threadIdx.x) & 31,
          static_cast<std::int64_t>(blockIdx.x) * kWarpsLl + threadIdx.x / 32,
          static_cast<std::int64_t>(gridDim.x) * kWarpsLl,
          a.world,
          a.experts,
          a.k,
          a.w.rank,
          a.max_tokens,
          a.hidden / 8};
}

/// Lane j < k's entry of token t, and what dispatch makes of the token: an id
/// outside [-1, E) (bad) or one the token lists twice (repeat) refuses the whole
/// token. send and combine both ask, so they refuse the same tokens.
struct LlEntry {
  std::int64_t ex;  ///< the expert id, -1 past slot k
  bool in_range;    ///< an id in [0, E): a pair the counts hold
  unsigned same;    ///< the lanes whose in-range id equals this one's
  bool bad, repeat;
};
inline __device__ LlEntry ll_entry(const LlArgs& a, std::int64_t t, int lane) {
  const bool in = lane < a.k;
  const std::int64_t ex = in ? a.topk[t * a.k + lane] : -1;
  const bool in_range = in && ex >= 0 && ex < a.experts;
  const unsigned same = __match_any_sync(0xffffffffu, in_range ? static_cast<unsigned long long>(ex)
                                                                : ~static_cast<unsigned long long>(lane) - 1);
  return {ex, in_range, same, in && (ex < -1 || ex >= a.experts), in_range && static_cast<int>(__ffs(same)) - 1 != lane};
}

/// After the calling warp wrote a row into this rank's staging buffer: the row in
/// memory, at system scope, before any lane hands it to a transport (a NIC reads it).
inline __device__ void staged_row_visible_warp() {
  __syncwarp();
  __threadfence_system();
}

template <class Transport>
__global__ void __launch_bounds__(kThreadsLl) ll_send_kernel(LlArgs a) {
  const std::uint64_t e = dev::epoch_begin(a.epoch);
  const auto [lane, warp0, warps, W, E, k, me, M, vecs] = ll_warp(a);
  const ExpertPlacement pl{E, W};

  for (std::int64_t t = warp0; t < a.tokens; t += warps) {
    // in_range: an entry the counts hold (the last block counts these)
    const auto [ex, in_range, same, bad, repeat] = ll_entry(a, t, lane);
    const unsigned errors = __ballot_sync(0xffffffffu, bad || repeat);
    // Position of each pair among this rank's pairs of its expert: entries equal to it in earlier
    // rows, then in earlier slots of this row (only a token that repeats an expert has any).
    int pos = __popc(same & ((1u << lane) - 1u));
    const std::int64_t earlier = t * k;
    for (std::int64_t base = 0; base < earlier; base += 32) {
      const std::int64_t idx = base + lane;
      const std::int64_t v = idx < earlier ? a.topk[idx] : -2;
      for (int j = 0; j < k; ++j) {
        const std::int64_t ej = __shfl_sync(0xffffffffu, ex, j);
        const int c = __popc(__ballot_sync(0xffffffffu, ej >= 0 && v == ej));
        if (lane == j) pos += c;
      }
    }
    if (errors != 0) {
      if (lane == __ffs(errors) - 1)
        atomicMin(reinterpret_cast<unsigned long long*>(a.error),
                  static_cast<unsigned long long>((static_cast<std::uint64_t>(t) << 8) |
                                                  (static_cast<std::uint64_t>(lane) << 2) | (bad ? 1u : 2u)));
      // The token is not sent, but its in-range entries hold rows in the counts: each such row is
      // marked as no token's, so the owner's combine sends nothing back from it.
      if (in_range && pos < M)
        Transport::put_i32(a.w, a.recv_src + moe_detail::low_latency_row(pl, M, pl.local(static_cast<int>(ex)), me, pos),
                           -1, pl.owner(static_cast<int>(ex)));
      continue;  // warp-uniform
    }
    const bool valid = in_range;  // no entry of this token is bad or repeated
    const uint4* src = a.x + t * vecs;
    // Lane j's destination: row pos of (its expert's local index, this rank) at the expert's owner.
    // pos >= M only where the pairs of that expert outgrew the plan's max_tokens (earlier bad rows).
    const bool send = valid && pos < M;
    const int owner = send ? pl.owner(static_cast<int>(ex)) : 0;
    const std::int64_t row = send ? moe_detail::low_latency_row(pl, M, pl.local(static_cast<int>(ex)), me, pos) : 0;
    const unsigned sends = __ballot_sync(0xffffffffu, send);
    if (send) Transport::put_i32(a.w, a.recv_src + row, static_cast<std::int32_t>(t * 32 + lane), owner);
    // A token with a destination on another node leaves from this rank's heap: staged once (cast once under fp8).
    bool staged = false;
    if constexpr (Transport::kStaged) staged = __ballot_sync(0xffffffffu, send && !Transport::direct(a.w, owner)) != 0;
    if (a.fp8 && !staged) {  // cast once, store to every destination
      cast_row_to_fp8(src, vecs, lane, sends,
                      send ? reinterpret_cast<std::uint8_t*>(a.w.symm_at(a.recv_x, owner)) + row * a.hidden : nullptr,
                      send ? a.w.symm_at(a.recv_scales, owner) + row * (a.hidden / kFp8ScaleChannels) : nullptr);
      continue;
    }
    const std::size_t row_bytes = a.fp8 ? static_cast<std::size_t>(a.hidden) : static_cast<std::size_t>(vecs) * 16;
    const std::int64_t scales_per_row = a.hidden / kFp8ScaleChannels;
    const void* from = src;  // where a row bound for another node leaves from: src, or its staged copy
    const float* from_scales = nullptr;
    if (staged) {
      auto* sx = reinterpret_cast<std::uint8_t*>(a.send_x) + t * static_cast<std::int64_t>(row_bytes);
      if (a.fp8) {
        float* ss = a.send_scales + t * scales_per_row;
        cast_row_to_fp8(src, vecs, lane, 1u, lane == 0 ? sx : nullptr, lane == 0 ? ss : nullptr);
        from_scales = ss;
      } else {
        dev::copy_warp(sx, src, row_bytes);
      }
      staged_row_visible_warp();
      from = sx;
    }
    for (unsigned left = sends; left != 0; left &= left - 1) {
      const int j = __ffs(left) - 1;
      const int r = __shfl_sync(0xffffffffu, owner, j);
      const std::int64_t rj = __shfl_sync(0xffffffffu, row, j);
      auto* dst = reinterpret_cast<std::uint8_t*>(a.recv_x) + rj * static_cast<std::int64_t>(row_bytes);
      // bf16: x's row where the owner is reachable, else the staged copy; fp8 (staged): the cast row either way.
      Transport::row_warp(a.w, dst, a.fp8 ? from : src, from, row_bytes, r);
      if (a.fp8)
        Transport::row_warp(a.w, a.recv_scales + rj * scales_per_row, from_scales, from_scales,
                            static_cast<std::size_t>(scales_per_row) * 4, r);
    }
  }
  Transport::complete_block(a.w);  // this block's puts delivered before the grid's last block raises the flags
  if (last_block(a.done)) {
    // This rank's pairs per expert, then each owner's flag: the release covers
    // every block's rows (the counter chain, then the barrier).
    __shared__ int pairs[kMaxExpertsLl];
    for (int x = static_cast<int>(threadIdx.x); x < E; x += blockDim.x) pairs[x] = 0;
    __syncthreads();
    for (std::int64_t i = threadIdx.x; i < a.tokens * k; i += blockDim.x) {
      const std::int64_t v = a.topk[i];
      if (v >= 0 && v < E) atomicAdd(&pairs[v], 1);
    }
    __syncthreads();
    for (int x = static_cast<int>(threadIdx.x); x < E; x += blockDim.x) {
      const std::uint64_t rows = static_cast<std::uint64_t>(min(pairs[x], M));
      Transport::signal(a.w, a.count_flags + static_cast<std::int64_t>(pl.local(x)) * W + me, (e << 32) | rows,
                        pl.owner(x));
    }
  }
  dev::epoch_end(a.epoch, e);
}

// static: each unit that includes this header (one per transport) launches its own.
static __global__ void __launch_bounds__(kRecvThreads) ll_recv_kernel(LlArgs a) {
  const std::uint64_t e = dev::epoch_begin(a.epoch);
  const int W = a.world, per = a.experts / W;
  for (int i = static_cast<int>(threadIdx.x); i < per * W; i += blockDim.x) {
    const std::uint64_t v = dev::wait_until(a.w, a.count_flags + i, dev::Cmp::ge, e << 32, dev::Scope::sys, i % W);
    a.recv_count[i] = static_cast<std::int32_t>(v & 0xffffffffu);
  }
  dev::epoch_end(a.epoch, e);
}

template <class Transport>
__global__ void __launch_bounds__(kThreadsLl) ll_combine_kernel(LlArgs a) {
  const std::uint64_t e = dev::epoch_begin(a.epoch);
  const auto [lane, warp0, warps, W, E, k, me, M, vecs] = ll_warp(a);
  const int per = E / W;

  // Send half: every received row's output back to its source's (token, slot) row.
  const std::int64_t slots = static_cast<std::int64_t>(per) * W * M;
  for (std::int64_t i = warp0; i < slots; i += warps) {
    const std::int64_t block = i / M;  // (local expert, source)
    const int src = static_cast<int>(block % W);
    if (i % M >= a.recv_count[block]) continue;
    const std::int32_t sid = __ldcg(a.recv_src + i);
    if (sid < 0) continue;  // a row a bad token held: nothing to send back (warp-uniform)
    const std::int64_t t = sid / 32, j = sid % 32;
    const std::size_t bytes = static_cast<std::size_t>(vecs) * 16;
    const uint4* y_row = a.y + i * vecs;
    const uint4* from = y_row;  // a row for another node leaves from this rank's heap: staged
    if constexpr (Transport::kStaged) {
      if (!Transport::direct(a.w, src)) {  // warp-uniform: one row per warp
        dev::copy_warp(a.send_y + i * vecs, y_row, bytes);
        staged_row_visible_warp();
        from = a.send_y + i * vecs;
      }
    }
    Transport::row_warp(a.w, a.comb_buf + (t * k + j) * vecs, y_row, from, bytes, src);
  }
  Transport::complete_block(a.w);
  if (last_block(a.done)) {
    for (int p = static_cast<int>(threadIdx.x); p < W; p += blockDim.x) Transport::signal(a.w, a.comb_flags + me, e, p);
  }
  for (int p = static_cast<int>(threadIdx.x); p < W; p += blockDim.x)  // W may exceed the block across nodes
    dev::wait_until(a.w, a.comb_flags + p, dev::Cmp::ge, e, dev::Scope::sys, p);
  __syncthreads();

  // Receive half: out[t] = sum over slots j ascending of w[t][j] x y(t, j); zeros for a
  // token dispatch refused (an id out of range or repeated: none of its rows went out).
  for (std::int64_t t = warp0; t < a.tokens; t += warps) {
    const LlEntry entry = ll_entry(a, t, lane);
    const bool in_range = entry.in_range;
    const float w = lane < k ? a.weights[t * k + lane] : 0.f;
    if (__ballot_sync(0xffffffffu, entry.bad || entry.repeat) != 0) {
      for (std::int64_t v = lane; v < vecs; v += 32) a.out[t * vecs + v] = make_uint4(0, 0, 0, 0);
      continue;  // warp-uniform
    }
    const unsigned valid = __ballot_sync(0xffffffffu, in_range);
    auto row_at = [&](int j) { return a.comb_buf + (t * k + j) * vecs; };
    auto weight = [&](int j) { return __shfl_sync(0xffffffffu, w, j); };
    for (std::int64_t v0 = 0; v0 < vecs; v0 += 32 * moe_detail::kRowSumVecs) {  // every lane runs every step
      moe_detail::RowSumAcc acc{};  // fp32 sums, rounded once
      moe_detail::add_rows<true>(acc, valid, row_at, weight, v0 + lane, vecs);
      moe_detail::store_rows(a.out + t * vecs, acc, v0 + lane, vecs);
    }
  }
  dev::epoch_end(a.epoch, e);
}

}  // namespace weft::moe_detail
