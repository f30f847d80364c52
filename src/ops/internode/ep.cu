// ExpertParallel across nodes (throughput mode): hierarchy::ep_walk on the GPU, in
// weft::internode (docs/decisions/0072). The receiver's staging rows and meta
// records are the one-node plan's (moe/ep_layout.hpp), so the receive and the
// reduce are the one-node code (moe/ep_phases.cuh); what differs is who writes
// a row: the source on its node, the rail GPU for a source on another node.
//
// One call, on GPU (n, l) of a grid of N nodes of L GPUs:
//   count     ep_phases.cuh's count, with node columns: each token's position
//             among this rank's tokens for each node it goes to.
//   exchange  one block: this rank's counts row (the one-node row, then tokens
//             per node) into every rank's matrix, by put with signal (stores on
//             this node, NVSHMEM across); once every row is here, the one-node
//             send tables and the rail tables (where this rank's messages for
//             node d start on (d, l), where a rail peer's land here, where this
//             node's sums start in a rail peer's return rows).
//   dispatch  send: a warp per token: to each rank of this node as on one node;
//             for each remote node d, a message (the row, then its RailRecord)
//             into this rank's send rows at return_base(d) + its position. The
//             last block to finish puts each remote node's send rows, one
//             contiguous range, into (d, l)'s rail staging, contiguous there too,
//             with the rail flag [n] (one put with signal per remote node), and
//             raises dispatch flag [me] on this node's GPUs.
//             forward: once every rail peer's flag is up, a warp per rail row
//             writes the token into the staging row of each rank of this node
//             it goes to, with the meta record built from the RailRecord alone;
//             the last block raises, for each rail peer (m, l), dispatch flag
//             [(m, l)] on this node's GPUs.
//             receive: once all W dispatch flags are up, as on one node.
//   combine   reduce: as on one node; the last block raises partial flag [me]
//             on this node's GPUs.
//             return: once this node's partials are ready, a warp per rail row
//             sums the token's partials on this node (local ranks ascending,
//             fp32), rounds once, into its return send row; the last block puts
//             each rail peer's range into its return rows, with return flag [n].
//             gather: once every rail peer's sums are back, a warp per own token
//             sums over its nodes ascending: this node's partials one by one,
//             each remote node's returned row (fp32, rounded once).
//
// Every block of a kernel is resident at once (the grid is at most the rank's
// SM share), as on one node: blocks wait for flags other blocks raise.
// Buffers are reused without a reset: the exchange is a barrier per call (a
// rank's row of call n + 1 is written after its last read of call n's data,
// and every write of call n + 1 waits for every row), as ep_walk's CPU test
// (tests/cpu/test_ep_two_hop.cpp) checks call after call.
#include <algorithm>

#include "../moe/chunk_scan.cuh"
#include "../moe/ep_layout.hpp"
#include "../moe/ep_phases.cuh"
#include "../moe/row_sums.cuh"
#include "collectives.hpp"
#include "two_level.cuh"
#include "weft/core/error.hpp"

namespace weft::ops_detail {
namespace {

using hierarchy::NodeGrid;
using moe_detail::ExpertPlacement;
using moe_detail::RailRecord;

constexpr int kChunk = moe_detail::kCountChunk;
constexpr int kCountWarps = moe_detail::kCountWarps;
constexpr int kRowTail = moe_detail::kCountRowTail;
constexpr int kEpThreads = 512;  // as on one node (ep.cu says why)
constexpr int kEpWarps = kEpThreads / 32;
constexpr int kExchangeThreads = 1024;
constexpr int kMaxNodes = 32;  // nodes <= W <= 32 (the plan checks W)

// The plan's local scratch, carved from one cudaMalloc: the one-node plan's, plus node columns and rail tables.
struct Scratch {
  std::uint64_t* error;        // [1]
  std::uint64_t* done;         // [4]: blocks done: send, forward, reduce, return
  std::int32_t* chunk_counts;  // [chunks][E + W + N]
  std::int32_t* pair_local;    // [T][k]
  std::int32_t* rank_local;    // [T][W]
  std::int32_t* node_local;    // [T][N]
  std::int32_t* token_rows;    // [T][W]: the token's staging row on rank r, -1 if not sent
  std::int32_t* node_rows;     // [T][N]: the token's send (and return) row for remote node d, -1 if none
  std::int32_t* pair_base;     // [E]
  std::int32_t* token_base;    // [W]
  std::int32_t* send_base;     // [N]: this rank's send rows for node d start here (return_base)
  std::int32_t* send_count;    // [N]: its tokens for node d (0 for its own)
  std::int32_t* rail_out;      // [N]: where they land in (d, l)'s rail staging
  std::int32_t* rail_in;       // [N]: where (m, l)'s messages land in this rail staging
  std::int32_t* rail_count;    // [N]: how many
  std::int32_t* ret_out;       // [N]: where this node's sums start in (m, l)'s return rows
};

std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }

Scratch carve(void* base, std::int64_t max_tokens, int E, int W, int N, int k, std::uint64_t* bytes_out) {
  const std::uint64_t chunks = (max_tokens + kChunk - 1) / kChunk;
  std::uint64_t off = 0;
  auto take = [&](std::uint64_t n) {
    const std::uint64_t at = off;
    off = align_up(off + n, 256);
    return static_cast<char*>(base) + at;
  };
  auto ints = [&](std::uint64_t n) { return reinterpret_cast<std::int32_t*>(take(n * 4)); };
  Scratch s{};
  s.error = reinterpret_cast<std::uint64_t*>(take(8));
  s.done = reinterpret_cast<std::uint64_t*>(take(32));
  s.chunk_counts = ints(chunks * (E + W + N));
  s.pair_local = ints(max_tokens * k);
  s.rank_local = ints(max_tokens * W);
  s.node_local = ints(max_tokens * N);
  s.token_rows = ints(max_tokens * W);
  s.node_rows = ints(max_tokens * N);
  s.pair_base = ints(E);
  s.token_base = ints(W);
  s.send_base = ints(N);
  s.send_count = ints(N);
  s.rail_out = ints(N);
  s.rail_in = ints(N);
  s.rail_count = ints(N);
  s.ret_out = ints(N);
  if (bytes_out) *bytes_out = off;
  return s;
}

// ---- count and exchange -------------------------------------------------------

__global__ void __launch_bounds__(kCountWarps * 32) count_kernel(moe_detail::CountArgs a) {
  extern __shared__ int counters[];  // [warps][E + W + N]
  moe_detail::count_chunk(a, counters);
}

struct ExchangeArgs {
  dev::World w;
  NodeGrid g;
  const std::int64_t* topk;
  std::int64_t tokens;
  int experts, k, hidden;
  std::int64_t* counts;  // symmetric [2][W][row]
  int row;               // E + W + kRowTail + N
  std::uint64_t* flags;  // [W]: p's counts row is here
  dev::LaunchEpoch epoch;
  Scratch s;
};

__global__ void __launch_bounds__(kExchangeThreads) exchange_kernel(ExchangeArgs a) {
  const std::uint64_t e = dev::epoch_begin(a.epoch);
  const NodeGrid g = a.g;
  const int me = a.w.rank, W = g.world(), N = g.nodes, E = a.experts, tid = static_cast<int>(threadIdx.x);
  const int n = g.node_of(me), l = g.local_of(me), cols = E + W + N, nodes_at = E + W + kRowTail;
  std::int64_t* matrix = a.counts + static_cast<std::int64_t>(e & 1) * W * a.row;
  std::int64_t* mine = matrix + static_cast<std::int64_t>(me) * a.row;
  const std::int64_t chunks = (a.tokens + kChunk - 1) / kChunk;
  for (int c = tid; c < cols; c += blockDim.x) {
    const std::int64_t total = exclusive_scan_column(a.s.chunk_counts, chunks, cols, c);
    mine[c < E + W ? c : nodes_at + (c - E - W)] = total;
  }
  if (tid == 0) {
    std::int64_t* tail = mine + E + W;
    tail[0] = a.tokens;
    tail[1] = a.experts;
    tail[2] = a.hidden;
    tail[3] = a.k;
    const std::uint64_t err = *a.s.error;
    if (err == moe_detail::kNoRowError) {
      tail[4] = -1;
      tail[5] = tail[6] = tail[7] = 0;
    } else {
      const auto t = static_cast<std::int64_t>(err >> 8);
      const int slot = static_cast<int>((err >> 2) & 63u);
      tail[4] = t;
      tail[5] = slot;
      tail[6] = static_cast<std::int64_t>(err & 3u);
      tail[7] = a.topk[t * a.k + slot];
    }
  }
  // My row into every peer's matrix, the flag after it (stores on this node, NVSHMEM across). The
  // fence makes the block's row visible at system scope, for a transport that reads it without its loads.
  if (tid == 0) dev::fence_sc(dev::Scope::sys);
  __syncthreads();
  for (int p = 0; p < W; ++p)
    if (p != me)
      remote::put_signal_block(a.w, mine, mine, static_cast<std::size_t>(a.row) * 8, a.flags + me, e,
                               dev::SignalOp::set, p);
  if (tid < W && tid != me) remote::signal_wait_until(a.w, a.flags + tid, dev::Cmp::ge, e, tid);
  __syncthreads();
  __shared__ std::int64_t scan[2][1024];
  moe_detail::send_tables(matrix, a.row, E, W, me, scan, a.s.pair_base, a.s.token_base);
  // Rail tables, from every rank's tokens per node.
  __shared__ std::int32_t node_tokens[32 * kMaxNodes];  // [W][N]
  for (int i = tid; i < W * N; i += blockDim.x)
    node_tokens[i] = static_cast<std::int32_t>(__ldcg(matrix + static_cast<std::int64_t>(i / N) * a.row + nodes_at + i % N));
  __syncthreads();
  if (tid < N) {
    const int d = tid, peer = g.rank(d, l);
    const bool remote_node = d != n;
    a.s.send_base[d] = static_cast<std::int32_t>(moe_detail::return_base(node_tokens, g, me, d));
    a.s.send_count[d] = remote_node ? node_tokens[me * N + d] : 0;
    a.s.rail_out[d] = remote_node ? static_cast<std::int32_t>(moe_detail::rail_receive_base(node_tokens, g, peer, me)) : 0;
    a.s.rail_in[d] = remote_node ? static_cast<std::int32_t>(moe_detail::rail_receive_base(node_tokens, g, me, peer)) : 0;
    a.s.rail_count[d] = remote_node ? node_tokens[peer * N + n] : 0;
    a.s.ret_out[d] = remote_node ? static_cast<std::int32_t>(moe_detail::return_base(node_tokens, g, peer, n)) : 0;
  }
  dev::epoch_end(a.epoch, e);
}

// ---- dispatch and combine -----------------------------------------------------

struct MoveArgs {
  dev::World w;
  NodeGrid g;
  int experts, k, hidden;
  int row_vecs;  // 16-byte vectors of a token's row in x and recv_x: H / 8 (bf16), H / 16 (fp8)
  int scales;    // fp8 dispatch: floats per token (H / 128), after its row; else 0
  std::int64_t tokens;
  std::int64_t msg_bytes;  // a rail message: the staging-sized row (2H bytes), then the RailRecord
  const std::int64_t* topk;
  ops_detail::EpRun run;
  char* send;            // symmetric [send capacity][msg_bytes]: this rank's messages, by node
  char* rail;            // symmetric [rail capacity][msg_bytes]: the rail peers' messages
  uint4* returned;       // symmetric [send capacity][H] bf16: the remote nodes' sums of this rank's tokens
  uint4* return_send;    // symmetric [rail capacity][H] bf16: this GPU's node sums of its rail rows
  std::uint64_t* flags;  // dispatch: [W dispatch][N rail]; combine: [W partial][N return]
  dev::LaunchEpoch epoch;
  Scratch s;
};

// Raises flag slot `slot` to `e` on every GPU of this node (itself included). Thread 0.
__device__ void signal_node(const MoveArgs& a, int slot, std::uint64_t e) {
  if (threadIdx.x != 0) return;
  const int n = a.g.node_of(a.w.rank);
  for (int i = 0; i < a.g.local; ++i)
    remote::signal_op(a.w, a.flags + slot, e, dev::SignalOp::set, a.g.rank(n, i));
}

// Every block waits until flag slot `slot0 + i` holds e for each i with raiser(i) >= 0.
template <class Raiser>
__device__ void wait_flags(const MoveArgs& a, int slot0, int count, Raiser raiser, std::uint64_t e) {
  for (int i = static_cast<int>(threadIdx.x); i < count; i += blockDim.x) {
    const int from = raiser(i);
    if (from >= 0) remote::signal_wait_until(a.w, a.flags + slot0 + i, dev::Cmp::ge, e, from);
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kEpThreads) dispatch_kernel(MoveArgs a) {
  const std::uint64_t e = dev::epoch_begin(a.epoch);
  const NodeGrid g = a.g;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const std::int64_t warp0 = static_cast<std::int64_t>(blockIdx.x) * kEpWarps + threadIdx.x / 32;
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * kEpWarps;
  const int W = g.world(), N = g.nodes, L = g.local, E = a.experts, k = a.k, per = E / W, me = a.w.rank;
  const int n = g.node_of(me), l = g.local_of(me), cols = E + W + N, mstride = 2 + 2 * k;
  const RailRecord rec{k, L};
  const std::int64_t vecs = a.row_vecs;      // 16-byte vectors of a token's row
  const std::int64_t stride = a.hidden / 8;  // of a staging row (bf16): an fp8 row and its scales fit in one
  const ops_detail::EpRun& run = a.run;
  uint4* staging = static_cast<uint4*>(run.staging);
  const uint4* x = static_cast<const uint4*>(run.x);
  auto copy_scales = [&](float* dst, const float* src) {
    for (int c = lane; c < a.scales; c += 32) dst[c] = src[c];
  };

  // Send: each token once to each rank of this node it goes to, once to each remote node.
  for (std::int64_t t = warp0; t < a.tokens; t += warps) {
    const std::int32_t* prefix = a.s.chunk_counts + (t / kChunk) * cols;
    const std::int64_t ex = lane < k ? a.topk[t * k + lane] : -1;
    const int owner = ex >= 0 ? static_cast<int>(ex) / per : -1;
    std::int32_t pair_row = -1;
    float weight = 0.f;
    if (ex >= 0) {
      pair_row = a.s.pair_base[ex] + prefix[ex] + a.s.pair_local[t * k + lane];
      weight = run.weights[t * k + lane];
    }
    const std::int32_t rank_pos = lane < W ? a.s.rank_local[t * W + lane] : -1;
    const std::int32_t my_row = lane < W && rank_pos >= 0 ? a.s.token_base[lane] + prefix[E + lane] + rank_pos : -1;
    if (lane < W) a.s.token_rows[t * W + lane] = my_row;
    const std::int32_t node_pos = lane < N && lane != n ? a.s.node_local[t * N + lane] : -1;
    const std::int32_t node_row = node_pos >= 0 ? a.s.send_base[lane] + prefix[E + W + lane] + node_pos : -1;
    if (lane < N) a.s.node_rows[t * N + lane] = node_row;
    const uint4* src = x + t * vecs;
    for (int i = 0; i < L; ++i) {  // this node's ranks, as on one node
      const int r = g.rank(n, i);
      const std::int32_t row = __shfl_sync(0xffffffffu, my_row, r);
      if (row < 0) continue;
      const unsigned here = __ballot_sync(0xffffffffu, owner == r);
      if (r == me) {
        // This rank's own experts: straight into recv_x, one row per pair; the staging keeps the meta only.
        for (std::int64_t v0 = 0; v0 < vecs; v0 += 32 * 4) {  // every lane runs every step (the shuffles)
          const std::int64_t v = v0 + lane;
          uint4 val[4];
#pragma unroll
          for (int u = 0; u < 4; ++u)
            if (v + 32 * u < vecs) val[u] = src[v + 32 * u];
          for (unsigned left = here; left != 0; left &= left - 1) {
            uint4* dst = static_cast<uint4*>(run.recv_x) +
                         static_cast<std::int64_t>(__shfl_sync(0xffffffffu, pair_row, __ffs(left) - 1)) * vecs;
#pragma unroll
            for (int u = 0; u < 4; ++u)
              if (v + 32 * u < vecs) dst[v + 32 * u] = val[u];
          }
        }
        if (a.scales)
          for (unsigned left = here; left != 0; left &= left - 1) {
            const std::int32_t prow = __shfl_sync(0xffffffffu, pair_row, __ffs(left) - 1);
            copy_scales(run.recv_scales + static_cast<std::int64_t>(prow) * a.scales, run.x_scales + t * a.scales);
          }
      } else {
        uint4* dst = a.w.symm_at(staging, r) + static_cast<std::int64_t>(row) * stride;
        dev::copy_warp(dst, src, static_cast<std::size_t>(vecs) * 16);
        if (a.scales) copy_scales(reinterpret_cast<float*>(dst + vecs), run.x_scales + t * a.scales);
      }
      std::int32_t* m = a.w.symm_at(run.meta, r) + static_cast<std::int64_t>(row) * mstride;
      if (owner == r) {
        const int idx = __popc(here & ((1u << lane) - 1u));
        m[2 + idx] = pair_row;
        m[2 + k + idx] = __float_as_int(weight);
      }
      if (lane == 0) {
        m[0] = static_cast<std::int32_t>(t);
        m[1] = __popc(here);
      }
    }
    for (int d = 0; d < N; ++d) {  // remote nodes: the row and its record, into this rank's send rows
      const std::int32_t srow = __shfl_sync(0xffffffffu, node_row, d);
      if (srow < 0) continue;
      char* msg = a.send + static_cast<std::int64_t>(srow) * a.msg_bytes;
      dev::copy_warp(msg, src, static_cast<std::size_t>(vecs) * 16);
      if (a.scales) copy_scales(reinterpret_cast<float*>(reinterpret_cast<uint4*>(msg) + vecs), run.x_scales + t * a.scales);
      std::int32_t* words = reinterpret_cast<std::int32_t*>(msg + stride * 16);
      const bool on_d = owner >= 0 && g.node_of(owner) == d;
      if (lane < k) {
        words[rec.expert(lane)] = on_d ? static_cast<std::int32_t>(ex) : -1;
        words[rec.pair_row(lane)] = on_d ? pair_row : -1;
        words[rec.weight(lane)] = __float_as_int(on_d ? weight : 0.f);
      }
      // Lane i < L: the token's staging row on (d, i) (every lane shuffles; lanes past L read lane 0).
      const std::int32_t at_i = __shfl_sync(0xffffffffu, my_row, lane < L ? g.rank(d, lane) : 0);
      if (lane < L) words[rec.staging_row(lane)] = at_i;
      if (lane == 0) {
        words[rec.token()] = static_cast<std::int32_t>(t);
        words[rec.return_row()] = srow;
      }
    }
  }
  if (last_block(a.s.done)) {
    // One put with signal per remote node: its send rows into (d, l)'s rail staging. Every block's
    // rows are visible to this one (last_block); the fence makes them so at system scope, for a
    // transport that reads them without this block's loads.
    if (threadIdx.x == 0) dev::fence_sc(dev::Scope::sys);
    __syncthreads();
    for (int d = 0; d < N; ++d) {
      if (d == n) continue;
      const std::uint64_t bytes = static_cast<std::uint64_t>(a.s.send_count[d]) * a.msg_bytes;
      two_level::put(a.w, a.rail + static_cast<std::int64_t>(a.s.rail_out[d]) * a.msg_bytes,
                     a.send + static_cast<std::int64_t>(a.s.send_base[d]) * a.msg_bytes, bytes, a.flags + W + n, e,
                     g.rank(d, l), false);
    }
    signal_node(a, me, e);  // this rank's tokens for this node are there
  }

  // Forward: each rail peer's tokens to the ranks of this node they go to.
  wait_flags(a, W, N, [&](int m) { return m == n ? -1 : g.rank(m, l); }, e);
  std::int64_t rail_rows = 0;
  for (int m = 0; m < N; ++m) rail_rows += a.s.rail_count[m];
  for (std::int64_t i = warp0; i < rail_rows; i += warps) {
    const char* msg = a.rail + i * a.msg_bytes;
    const std::int32_t* words = reinterpret_cast<const std::int32_t*>(msg + stride * 16);
    const std::int32_t fex = lane < k ? __ldcg(words + rec.expert(lane)) : -1;
    const std::int32_t fowner = fex >= 0 ? fex / per : -1;
    const std::int32_t prow = lane < k ? __ldcg(words + rec.pair_row(lane)) : -1;
    const std::int32_t pw = lane < k ? __ldcg(words + rec.weight(lane)) : 0;
    const std::int32_t at_lane = lane < L ? __ldcg(words + rec.staging_row(lane)) : -1;
    const std::int32_t t = __ldcg(words + rec.token());
    for (int dl = 0; dl < L; ++dl) {
      const std::int32_t row = __shfl_sync(0xffffffffu, at_lane, dl);
      if (row < 0) continue;
      const int dest = g.rank(n, dl);
      const unsigned here = __ballot_sync(0xffffffffu, fowner == dest);
      uint4* dst = a.w.symm_at(staging, dest) + static_cast<std::int64_t>(row) * stride;
      const uint4* from = reinterpret_cast<const uint4*>(msg);
      for (std::int64_t v = lane; v < vecs; v += 32) dst[v] = __ldcg(from + v);
      if (a.scales) {
        const float* sc = reinterpret_cast<const float*>(from + vecs);
        float* to = reinterpret_cast<float*>(dst + vecs);
        for (int c = lane; c < a.scales; c += 32) to[c] = __ldcg(sc + c);
      }
      std::int32_t* m = a.w.symm_at(run.meta, dest) + static_cast<std::int64_t>(row) * mstride;
      if (fowner == dest) {
        const int idx = __popc(here & ((1u << lane) - 1u));
        m[2 + idx] = prow;
        m[2 + k + idx] = pw;
      }
      if (lane == 0) {
        m[0] = t;
        m[1] = __popc(here);
      }
    }
  }
  if (last_block(a.s.done + 1))
    for (int m = 0; m < N; ++m)
      if (m != n) signal_node(a, g.rank(m, l), e);  // (m, l)'s tokens for this node are there

  // Receive: once every source's tokens are here, as on one node.
  wait_flags(a, 0, W, [&](int s) { return g.node_of(s) == n ? s : g.rank(n, g.local_of(s)); }, e);
  const moe_detail::StagedRows staged{staging, run.meta, k, stride, run.recv_tokens, run.self_lo, run.self_hi};
  moe_detail::receive_rows(staged, warp0, warps, vecs, a.scales, static_cast<uint4*>(run.recv_x), run.recv_scales,
                           run.recv_weights);
  dev::epoch_end(a.epoch, e);
}

__global__ void __launch_bounds__(kEpThreads) combine_kernel(MoveArgs a) {
  const std::uint64_t e = dev::epoch_begin(a.epoch);
  const NodeGrid g = a.g;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const std::int64_t warp0 = static_cast<std::int64_t>(blockIdx.x) * kEpWarps + threadIdx.x / 32;
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * kEpWarps;
  const int W = g.world(), N = g.nodes, L = g.local, k = a.k, me = a.w.rank, n = g.node_of(me), l = g.local_of(me);
  const RailRecord rec{k, L};
  const std::int64_t vecs = a.hidden / 8;
  const ops_detail::EpRun& run = a.run;
  uint4* staging = static_cast<uint4*>(run.staging);
  uint4* out = static_cast<uint4*>(run.out);

  // Reduce, as on one node.
  const moe_detail::StagedRows staged{staging, run.meta, k, vecs, run.recv_tokens, run.self_lo, run.self_hi};
  moe_detail::reduce_partials(staged, staging, warp0, warps, static_cast<const uint4*>(run.y), out,
                              [&](std::int64_t t) {
                                const std::int32_t row_r = lane < W ? a.s.token_rows[t * W + lane] : -1;
                                return __ballot_sync(0xffffffffu, row_r >= 0) == 1u << me;
                              });
  if (last_block(a.s.done + 2)) signal_node(a, me, e);  // this rank's partials are ready

  // Return: each rail token's node sum, back to its source.
  wait_flags(a, 0, W, [&](int r) { return g.node_of(r) == n ? r : -1; }, e);
  std::int64_t rail_rows = 0;
  for (int m = 0; m < N; ++m) rail_rows += a.s.rail_count[m];
  for (std::int64_t i = warp0; i < rail_rows; i += warps) {
    const std::int32_t* words = reinterpret_cast<const std::int32_t*>(a.rail + i * a.msg_bytes + vecs * 16);
    const std::int32_t at_lane = lane < L ? __ldcg(words + rec.staging_row(lane)) : -1;
    const unsigned ranks = __ballot_sync(0xffffffffu, lane < L && at_lane >= 0);  // local ranks, ascending
    auto row_at = [&](int dl) {
      return a.w.symm_at(staging, g.rank(n, dl)) +
             static_cast<std::int64_t>(__shfl_sync(0xffffffffu, at_lane, dl)) * vecs;
    };
    auto unweighted = [](int) { return 1.f; };
    for (std::int64_t v0 = 0; v0 < vecs; v0 += 32 * moe_detail::kRowSumVecs) {  // every lane runs every step
      moe_detail::RowSumAcc acc{};  // fp32 sums, rounded once
      moe_detail::add_rows<false>(acc, ranks, row_at, unweighted, v0 + lane, vecs);
      moe_detail::store_rows(a.return_send + i * vecs, acc, v0 + lane, vecs);
    }
  }
  if (last_block(a.s.done + 3)) {
    // One put with signal per rail peer: its rows' node sums into its return rows (fenced as in dispatch).
    if (threadIdx.x == 0) dev::fence_sc(dev::Scope::sys);
    __syncthreads();
    for (int m = 0; m < N; ++m) {
      if (m == n) continue;
      const std::uint64_t bytes = static_cast<std::uint64_t>(a.s.rail_count[m]) * vecs * 16;
      two_level::put(a.w, a.returned + static_cast<std::int64_t>(a.s.ret_out[m]) * vecs,
                     a.return_send + static_cast<std::int64_t>(a.s.rail_in[m]) * vecs, bytes, a.flags + W + n, e,
                     g.rank(m, l), false);
    }
  }

  // Gather: over the token's nodes ascending, this node's partials one by one, each remote node's sum.
  wait_flags(a, W, N, [&](int m) { return m == n ? -1 : g.rank(m, l); }, e);
  for (std::int64_t t = warp0; t < a.tokens; t += warps) {
    const std::int32_t my_row = lane < W ? a.s.token_rows[t * W + lane] : -1;
    if (__ballot_sync(0xffffffffu, my_row >= 0) == 1u << me) continue;  // the reduce stored its output
    const std::int32_t node_row = lane < N ? a.s.node_rows[t * N + lane] : -1;
    // Bit r: rank r of this node it went to, or the first rank of a remote node it went to (that node's sum).
    const std::int32_t lanes_node_row = __shfl_sync(0xffffffffu, node_row, lane < W ? g.node_of(lane) : 0);
    const bool local_bit = lane < W && g.node_of(lane) == n && my_row >= 0;
    const bool node_bit = lane < W && g.node_of(lane) != n && g.local_of(lane) == 0 && lanes_node_row >= 0;
    const unsigned terms = __ballot_sync(0xffffffffu, local_bit || node_bit);
    auto row_at = [&](int r) {
      const int node = g.node_of(r);
      const std::int32_t mine = __shfl_sync(0xffffffffu, my_row, r);
      const std::int32_t back = __shfl_sync(0xffffffffu, node_row, node);
      return node == n ? a.w.symm_at(staging, r) + static_cast<std::int64_t>(mine) * vecs
                       : a.returned + static_cast<std::int64_t>(back) * vecs;
    };
    auto unweighted = [](int) { return 1.f; };
    for (std::int64_t v0 = 0; v0 < vecs; v0 += 32 * moe_detail::kRowSumVecs) {  // every lane runs every step
      moe_detail::RowSumAcc acc{};  // fp32 sums, rounded once
      moe_detail::add_rows<false>(acc, terms, row_at, unweighted, v0 + lane, vecs);
      moe_detail::store_rows(out + t * vecs, acc, v0 + lane, vecs);
    }
  }
  dev::epoch_end(a.epoch, e);
}

// ---- the plan -------------------------------------------------------------------

class EpTwoLevel final : public TwoLevelEp {
 public:
  EpTwoLevel(Context& ctx, const EpOptions& o, int blocks)
      : ctx_(ctx), grid_(two_level_grid(ctx, "ExpertParallel")), opt_(o), blocks_(blocks) {
    const int W = grid_.world(), N = grid_.nodes;
    WEFT_REQUIRE(W <= 32, "ExpertParallel across nodes: ", W, " ranks exceed 32");
    // Within a node the kernels load and store the peers' heaps (the one-node code): every pair of a
    // node must be mapped. The matrix is every rank's, so all refuse alike, naming the pairs.
    const Reachability& reach = ctx.heap().reachability();
    std::string unmapped;
    for (int a = 0; a < W; ++a)
      for (int b = 0; b < W; ++b)
        if (a != b && grid_.node_of(a) == grid_.node_of(b) && !reach[a][b])
          unmapped += str(unmapped.empty() ? "" : ", ", "rank ", a, " cannot address rank ", b);
    WEFT_REQUIRE(unmapped.empty(), "ExpertParallel across nodes needs every pair of ranks within a node mapped ",
                 "(NVLink or one GPU), as its NVLink hop loads and stores their heaps: ", unmapped);
    row_ = opt_.experts + W + kRowTail + N;
    msg_bytes_ = static_cast<std::int64_t>(opt_.hidden) * 2 +
                 static_cast<std::int64_t>(align_up(RailRecord{opt_.top_k, grid_.local}.words() * 4ull, 16));
    two_level::agree(ctx, str("ExpertParallel two-level plan: ", N, " nodes of ", grid_.local, " ranks, messages of ",
                              msg_bytes_, " bytes"));
    counts_ = SymmetricBuffer(ctx.heap(), 2ull * W * row_ * 8, "i64", "ep.two_level.counts");
    exchange_signals_ = SignalArray(ctx.heap(), W, "ep.two_level.exchange.flags");
    dispatch_signals_ = SignalArray(ctx.heap(), W + N, "ep.two_level.dispatch.flags");
    combine_signals_ = SignalArray(ctx.heap(), W + N, "ep.two_level.combine.flags");
    std::uint64_t bytes = 0;
    carve(nullptr, opt_.max_tokens, opt_.experts, W, N, opt_.top_k, &bytes);
    scratch_ = DeviceBuffer(bytes);
    WEFT_CUDA(cudaMemset(scratch_.get(), 0, bytes));
    grow(opt_.max_tokens, opt_.max_tokens);
    const int count_smem = kCountWarps * (opt_.experts + W + N) * 4;
    if (count_smem > 48 * 1024)
      WEFT_CUDA(cudaFuncSetAttribute(count_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, count_smem));
  }

  int row_words() const override { return row_; }

  const std::int64_t* layout(const std::int64_t* topk, std::int64_t tokens, cudaStream_t stream) override {
    require_remote_peers("ExpertParallel");
    const int W = grid_.world(), N = grid_.nodes, E = opt_.experts, k = opt_.top_k;
    const Scratch s = scratch();
    WEFT_CUDA(cudaMemsetAsync(s.error, 0xff, 8, stream));
    if (tokens > 0) {
      const auto chunks = (tokens + kChunk - 1) / kChunk;
      const auto grid = static_cast<unsigned>((chunks + kCountWarps - 1) / kCountWarps);
      const moe_detail::CountArgs ca{.topk = topk,
                                     .tokens = tokens,
                                     .experts = E,
                                     .world = W,
                                     .k = k,
                                     .nodes = N,
                                     .local = grid_.local,
                                     .error = s.error,
                                     .chunk_counts = s.chunk_counts,
                                     .pair_local = s.pair_local,
                                     .rank_local = s.rank_local,
                                     .node_local = s.node_local};
      count_kernel<<<grid, kCountWarps * 32, kCountWarps * (E + W + N) * 4, stream>>>(ca);
      WEFT_CUDA(cudaGetLastError());
    }
    ExchangeArgs xa{ctx_.world(), grid_, topk, tokens, E, k, opt_.hidden, counts_.as<std::int64_t>(), row_,
                    exchange_signals_.flags(), exchange_signals_.launch_epoch(), s};
    launch_pdl(exchange_kernel, 1, kExchangeThreads, stream, xa);
    WEFT_CUDA(cudaGetLastError());
    tokens_ = tokens;
    topk_ = topk;
    ++layouts_;  // the exchange's device epoch, whose parity picks the matrix
    return counts_.as<std::int64_t>() + static_cast<std::int64_t>(layouts_ & 1) * W * row_;
  }

  void prepare(const std::int64_t* host) override {
    const int W = grid_.world(), N = grid_.nodes;
    std::vector<std::int32_t> node_tokens(static_cast<std::size_t>(W) * N);
    for (int s = 0; s < W; ++s)
      for (int d = 0; d < N; ++d)
        node_tokens[static_cast<std::size_t>(s) * N + d] =
            static_cast<std::int32_t>(host[static_cast<std::int64_t>(s) * row_ + opt_.experts + W + kRowTail + d]);
    std::int64_t rail = 0, sent = 0;  // the most any GPU needs: the buffers are symmetric
    for (int gpu = 0; gpu < W; ++gpu) {
      rail = std::max(rail, moe_detail::rail_receive_rows(node_tokens.data(), grid_, gpu));
      sent = std::max(sent, moe_detail::return_rows(node_tokens.data(), grid_, gpu));
    }
    if (rail > rail_capacity_ || sent > send_capacity_)
      grow(std::max(rail, rail_capacity_ + rail_capacity_ / 2), std::max(sent, send_capacity_ + send_capacity_ / 2));
  }

  void dispatch(const EpRun& run, cudaStream_t stream) override {
    require_remote_peers("ExpertParallel");
    launch(dispatch_kernel, run, run.fp8 ? opt_.hidden / 16 : opt_.hidden / 8,
           run.fp8 ? opt_.hidden / moe_detail::kFp8ScaleChannels : 0, dispatch_signals_, stream);
  }

  void combine(const EpRun& run, cudaStream_t stream) override {
    require_remote_peers("ExpertParallel");
    launch(combine_kernel, run, opt_.hidden / 8, 0, combine_signals_, stream);
  }

 private:
  Scratch scratch() const {
    return carve(scratch_.get(), opt_.max_tokens, opt_.experts, grid_.world(), grid_.nodes, opt_.top_k, nullptr);
  }

  void launch(void (*kernel)(MoveArgs), const EpRun& run, int row_vecs, int scales, const SignalArray& signals,
              cudaStream_t stream) {
    MoveArgs a{.w = ctx_.world(),
               .g = grid_,
               .experts = opt_.experts,
               .k = opt_.top_k,
               .hidden = opt_.hidden,
               .row_vecs = row_vecs,
               .scales = scales,
               .tokens = tokens_,
               .msg_bytes = msg_bytes_,
               .topk = topk_,
               .run = run,
               .send = send_.as<char>(),
               .rail = rail_.as<char>(),
               .returned = returned_.as<uint4>(),
               .return_send = return_send_.as<uint4>(),
               .flags = signals.flags(),
               .epoch = signals.launch_epoch(),
               .s = scratch()};
    // The work: this rank's tokens, the staged ones, the rail rows (at most capacity); every block resident.
    const std::int64_t work = std::max({tokens_, run.recv_tokens, rail_capacity_});
    const int grid = static_cast<int>(std::clamp<std::int64_t>((work + kEpWarps - 1) / kEpWarps, 1, blocks_));
    launch_pdl(kernel, grid, kEpThreads, stream, a);
    WEFT_CUDA(cudaGetLastError());
  }

  // Free first, then allocate: the same sequence on every rank (they decide from the same counts).
  void grow(std::int64_t rail_rows, std::int64_t send_rows) {
    rail_rows = std::max<std::int64_t>(rail_rows, 1);
    send_rows = std::max<std::int64_t>(send_rows, 1);
    WEFT_REQUIRE(rail_rows < (std::int64_t{1} << 31) && send_rows < (std::int64_t{1} << 31),
                 "ExpertParallel across nodes: ", std::max(rail_rows, send_rows), " rows exceed the 2^31 limit");
    send_ = SymmetricBuffer();
    rail_ = SymmetricBuffer();
    returned_ = SymmetricBuffer();
    return_send_ = SymmetricBuffer();
    const auto row_bytes = static_cast<std::uint64_t>(opt_.hidden) * 2;
    send_ = SymmetricBuffer(ctx_.heap(), send_rows * msg_bytes_, "u8", "ep.two_level.send");
    rail_ = SymmetricBuffer(ctx_.heap(), rail_rows * msg_bytes_, "u8", "ep.two_level.rail");
    returned_ = SymmetricBuffer(ctx_.heap(), send_rows * row_bytes, "bf16", "ep.two_level.returned");
    return_send_ = SymmetricBuffer(ctx_.heap(), rail_rows * row_bytes, "bf16", "ep.two_level.return_send");
    rail_capacity_ = rail_rows;
    send_capacity_ = send_rows;
  }

  Context& ctx_;
  NodeGrid grid_;
  EpOptions opt_;
  int blocks_;
  int row_ = 0;
  std::int64_t msg_bytes_ = 0;
  std::int64_t rail_capacity_ = 0, send_capacity_ = 0;
  std::uint64_t layouts_ = 0;
  std::int64_t tokens_ = 0;
  const std::int64_t* topk_ = nullptr;
  SymmetricBuffer counts_, send_, rail_, returned_, return_send_;
  SignalArray exchange_signals_, dispatch_signals_, combine_signals_;
  DeviceBuffer scratch_;
};

}  // namespace

std::unique_ptr<TwoLevelEp> make_two_level_expert_parallel(Context& ctx, const EpOptions& options, int blocks) {
  return std::make_unique<EpTwoLevel>(ctx, options, blocks);
}

}  // namespace weft::ops_detail
