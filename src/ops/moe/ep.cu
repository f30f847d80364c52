// Expert-parallel dispatch and combine, throughput mode: the plan (host) and its four kernels.
//
// One call is layout -> dispatch -> combine:
//
//   count     (local; grid over 128-token chunks, a warp per chunk)
//             validates each token's row, counts per chunk the pairs of each
//             expert and the tokens for each rank, and records each pair's and
//             each token-rank's position within its chunk (token order).
//   exchange  (one block, waits on every rank)
//             scans the chunk counts into prefixes, writes this rank's counts
//             row (pairs per expert, tokens per rank, T, E, H, k, the first bad
//             token) into every rank's matrix, waits for every rank's row, and
//             derives the send tables: where this rank's pairs of expert e
//             start on e's owner, where its tokens start on each rank.
//             The host reads the matrix once: receive sizes, errors.
//   dispatch  (the rank's SM share, waits on every rank)
//             send: a warp per token writes its row once into each
//             destination rank's staging (token-major: source, then token
//             order), with a meta record: source token, the pairs' rows in
//             the receiver's expert-major recv_x, and their weights (for
//             this rank's own experts it writes recv_x's rows directly and
//             stages the meta record only);
//             receive: once every source's last block has signalled, a warp
//             per staged token copies it to each of its recv_x rows.
//             fp8 dispatch moves e4m3 rows (H bytes) and their H / 128 float
//             scales, which follow the row inside its bf16-sized staging row.
//   combine   (the rank's SM share, waits on every rank)
//             reduce: a warp per staged token sums w x y over its pairs in
//             slot order (fp32; row_sums.cuh keeps the next pair's loads in
//             flight) and stores the partial, bf16, over the staged token;
//             gather: once every rank's partials are ready, a warp per
//             own token sums its partials from the ranks it went to, in rank
//             order (fp32), and rounds once.
//
// Flags (three SignalArrays of W, one device epoch each): on rank r, slot p
// is set to the epoch by rank p: "p's counts row is here" (exchange), "all of
// p's tokens for r are here" (dispatch), "p's partials are ready" (combine).
// A kernel's last block (a local acq_rel counter) raises them, so the flag's
// release covers every block's stores.
//
// Buffer reuse across calls, without a reset: a rank writes into a peer's
// staging only in dispatch, after the exchange of the same call, which every
// rank enters only after its previous combine finished reading peers'
// staging (stream order). The counts matrix is double-buffered by epoch
// parity: a rank writing call n + 2's row has seen every rank's row of
// n + 1, written after that rank's host read of call n.
#include <algorithm>
#include <cstring>
#include <utility>

#include "../kernel_util.cuh"
#include "chunk_scan.cuh"
#include "ep_phases.cuh"
#include "ep_layout.hpp"
#include "row_sums.cuh"
#include "weft/core/error.hpp"
#include "weft/device.cuh"
#include "weft/ops/ep.hpp"
#include "../two_level.hpp"

namespace weft {
namespace {

using namespace ops_detail;
using moe_detail::ExpertPlacement;

constexpr int kChunk = moe_detail::kCountChunk;  // tokens per warp in the count kernel
using moe_detail::kCountWarps;                     // warps per count block
// Threads per dispatch / combine block, one block per SM of the budget (so a
// grid of max_sms blocks stays on max_sms SMs). A warp keeps about 2 KiB of
// loads in flight (row_sums.cuh); covering HBM's latency at 4.8 TB/s over 132
// SMs takes some 25 KiB per SM, so 16 warps (8 leave the combine's reads
// latency-bound). Both kernels fit 128 registers a thread, a whole SM's file.
constexpr int kEpThreads = 512;
constexpr int kEpWarps = kEpThreads / 32;
constexpr int kExchangeThreads = 1024;
constexpr int kMaxExperts = 1024;  // at most kExchangeThreads: the exchange scans one expert a thread
static_assert(kMaxExperts <= kExchangeThreads, "the exchange scans one expert a thread");
constexpr int kMaxTopK = 32;
constexpr int kMaxWorld = 32;
using moe_detail::kFp8ScaleChannels;
constexpr int kRowTail = moe_detail::kCountRowTail;  // after [E pairs][W tokens]: T, E, H, k, bad token, slot, code, value
constexpr std::uint64_t kNoError = moe_detail::kNoRowError;

// Error codes in the counts row (RowError's values).
constexpr int kTwice = static_cast<int>(moe_detail::RowError::expert_twice);

// The plan's local scratch, carved from one cudaMalloc.
struct Scratch {
  std::uint64_t* error;        // [1]: min over bad pairs of (token << 8 | slot << 2 | code)
  std::uint64_t* done;         // [2]: blocks done, dispatch / combine
  std::int32_t* chunk_counts;  // [chunks][E + W]: counts, then exclusive prefixes over chunks
  std::int32_t* pair_local;    // [T][k]: the pair's position among its chunk's pairs of its expert
  std::int32_t* rank_local;    // [T][W]: the token's position among its chunk's tokens for rank r, -1 if not sent
  std::int32_t* token_rows;    // [T][W]: the token's staging row on rank r, -1 if not sent (combine reads)
  std::int32_t* pair_base;     // [E]: where this rank's pairs of expert e start in e's owner's recv_x
  std::int32_t* token_base;    // [W]: where this rank's tokens start in rank r's staging
};

std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }

Scratch carve(void* base, std::int64_t max_tokens, int E, int W, int k, std::uint64_t* bytes_out) {
  const std::uint64_t chunks = (max_tokens + kChunk - 1) / kChunk;
  std::uint64_t off = 0;
  auto take = [&](std::uint64_t n) {
    const std::uint64_t at = off;
    off = align_up(off + n, 256);
    return static_cast<char*>(base) + at;
  };
  Scratch s{};
  s.error = reinterpret_cast<std::uint64_t*>(take(8));
  s.done = reinterpret_cast<std::uint64_t*>(take(16));
  s.chunk_counts = reinterpret_cast<std::int32_t*>(take(chunks * (E + W) * 4));
  s.pair_local = reinterpret_cast<std::int32_t*>(take(max_tokens * k * 4));
  s.rank_local = reinterpret_cast<std::int32_t*>(take(max_tokens * W * 4));
  s.token_rows = reinterpret_cast<std::int32_t*>(take(max_tokens * W * 4));
  s.pair_base = reinterpret_cast<std::int32_t*>(take(E * 4));
  s.token_base = reinterpret_cast<std::int32_t*>(take(W * 4));
  if (bytes_out) *bytes_out = off;
  return s;
}

// ---- count ------------------------------------------------------------------

__global__ void __launch_bounds__(kCountWarps * 32) count_kernel(moe_detail::CountArgs a) {
  extern __shared__ int counters[];  // [warps][E + W]
  moe_detail::count_chunk(a, counters);
}

// ---- exchange ---------------------------------------------------------------

struct ExchangeArgs {
  dev::World w;
  const std::int64_t* topk;
  std::int64_t tokens;
  int experts, world, k, hidden;
  std::int64_t* counts;  // symmetric [2][W][row]
  int row;               // E + W + kRowTail
  std::uint64_t* flags;  // [W]
  dev::LaunchEpoch epoch;
  Scratch s;
};

__global__ void __launch_bounds__(kExchangeThreads) exchange_kernel(ExchangeArgs a) {
  const std::uint64_t e = dev::epoch_begin(a.epoch);
  const int me = a.w.rank, W = a.world, E = a.experts, cols = E + W, tid = static_cast<int>(threadIdx.x);
  std::int64_t* matrix = a.counts + static_cast<std::int64_t>(e & 1) * W * a.row;
  std::int64_t* mine = matrix + static_cast<std::int64_t>(me) * a.row;
  const std::int64_t chunks = (a.tokens + kChunk - 1) / kChunk;
  for (int c = tid; c < cols; c += blockDim.x) mine[c] = exclusive_scan_column(a.s.chunk_counts, chunks, cols, c);
  if (tid == 0) {
    std::int64_t* tail = mine + cols;
    tail[0] = a.tokens;
    tail[1] = a.experts;
    tail[2] = a.hidden;
    tail[3] = a.k;
    const std::uint64_t err = *a.s.error;
    if (err == kNoError) {
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
  __syncthreads();
  // My row into every peer's matrix (plain stores; the release below covers them).
  for (int p = 0; p < W; ++p) {
    if (p == me) continue;
    std::int64_t* theirs = a.w.symm_at(mine, p);
    for (int c = tid; c < a.row; c += blockDim.x) theirs[c] = mine[c];
  }
  __syncthreads();
  if (tid < W) {
    dev::notify(a.w, a.flags + me, tid, e, dev::SignalOp::set, dev::Scope::sys);
    dev::wait_until(a.w, a.flags + tid, dev::Cmp::ge, e, dev::Scope::sys, tid);
  }
  __syncthreads();
  // Send tables: where this rank's pairs and tokens start on their receivers.
  __shared__ std::int64_t scan[2][kMaxExperts];
  moe_detail::send_tables(matrix, a.row, E, W, me, scan, a.s.pair_base, a.s.token_base);
  dev::epoch_end(a.epoch, e);
}

// ---- dispatch and combine -----------------------------------------------------

struct MoveArgs {
  dev::World w;
  int experts, world, k, hidden;  // hidden sets the staging row: H bf16, 2H bytes
  int row_vecs;                   // 16-byte vectors of a token's row in x and recv_x: H / 8 (bf16), H / 16 (fp8)
  int scales;                     // fp8 dispatch: floats per token (H / 128), staged after its row; else 0
  std::int64_t tokens;       // this rank's T
  std::int64_t recv_tokens;  // tokens staged here
  std::int64_t self_lo, self_hi;  // staged rows of this rank's own tokens: meta only, data already in recv_x
  const std::int64_t* topk;  // [T][k]
  const float* weights;      // [T][k]
  const uint4* x;            // [T][H] bf16, or fp8 e4m3
  const float* x_scales;     // fp8: [T][H / 128]
  uint4* recv_x;             // [recv_rows][H] bf16, or fp8 e4m3
  float* recv_scales;        // fp8: [recv_rows][H / 128]
  float* recv_weights;       // [recv_rows] or null
  const uint4* y;            // combine: [recv_rows][H] bf16
  uint4* out;                // combine: [T][H] bf16
  uint4* staging;            // symmetric [capacity][H] bf16
  std::int32_t* meta;        // symmetric [capacity][2 + 2k]
  std::uint64_t* flags;      // [W]
  dev::LaunchEpoch epoch;
  Scratch s;
};

// The last block of the grid to get here raises flags[me] to `e` on every
// rank: every block's stores precede it (bar.sync, then a release chain
// through the acq_rel counter to the release store).
__device__ void last_block_signals(const MoveArgs& a, std::uint64_t* done, std::uint64_t e) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const std::uint64_t before = dev::atomic_add(done, 1, dev::Scope::sys, dev::Order::acq_rel);
    if (before == gridDim.x - 1) {
      *done = 0;  // every block has counted; the next launch starts after this one
      for (int p = 0; p < a.world; ++p) dev::notify(a.w, a.flags + a.w.rank, p, e, dev::SignalOp::set, dev::Scope::sys);
    }
  }
}

// Every block waits until every rank raised flags[p] to `e`.
__device__ void wait_all(const MoveArgs& a, std::uint64_t e) {
  if (static_cast<int>(threadIdx.x) < a.world)
    dev::wait_until(a.w, a.flags + threadIdx.x, dev::Cmp::ge, e, dev::Scope::sys, static_cast<int>(threadIdx.x));
  __syncthreads();
}

__global__ void __launch_bounds__(kEpThreads) dispatch_kernel(MoveArgs a) {
  const std::uint64_t e = dev::epoch_begin(a.epoch);
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const std::int64_t warp0 = static_cast<std::int64_t>(blockIdx.x) * kEpWarps + threadIdx.x / 32;
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * kEpWarps;
  const int W = a.world, E = a.experts, k = a.k, per = E / W, cols = E + W, mstride = 2 + 2 * k, me = a.w.rank;
  const std::int64_t vecs = a.row_vecs;     // 16-byte vectors of a token's row
  const std::int64_t stride = a.hidden / 8;  // of a staging row (bf16): an fp8 row and its scales fit in one
  // The fp8 scales of a token: a float per lane, after the row in its staging row.
  auto copy_scales = [&](float* dst, const float* src) {
    for (int c = lane; c < a.scales; c += 32) dst[c] = src[c];
  };

  // Send: each token once to each of its ranks, ascending.
  for (std::int64_t t = warp0; t < a.tokens; t += warps) {
    const std::int64_t chunk = t / kChunk;
    const std::int32_t* prefix = a.s.chunk_counts + chunk * cols;
    const std::int64_t ex = lane < k ? a.topk[t * k + lane] : -1;
    const int owner = ex >= 0 ? static_cast<int>(ex) / per : -1;
    std::int32_t pair_row = -1;
    float weight = 0.f;
    if (ex >= 0) {
      pair_row = a.s.pair_base[ex] + prefix[ex] + a.s.pair_local[t * k + lane];
      weight = a.weights[t * k + lane];
    }
    const std::int32_t my_rank_pos = lane < W ? a.s.rank_local[t * W + lane] : -1;
    std::int32_t my_row = -1;
    if (lane < W && my_rank_pos >= 0) my_row = a.s.token_base[lane] + prefix[E + lane] + my_rank_pos;
    if (lane < W) a.s.token_rows[t * W + lane] = my_row;
    const uint4* src = a.x + t * vecs;
    for (int r = 0; r < W; ++r) {
      const std::int32_t row = __shfl_sync(0xffffffffu, my_row, r);
      if (row < 0) continue;
      const unsigned here = __ballot_sync(0xffffffffu, owner == r);
      if (r == me) {
        // This rank's own experts: straight into recv_x, one row per pair; the staging keeps the meta only.
        // The token's row is read once, four vectors a lane at a time, and stored to each pair's row.
        for (std::int64_t v0 = 0; v0 < vecs; v0 += 32 * 4) {  // every lane runs every step (the shuffles)
          const std::int64_t v = v0 + lane;
          uint4 val[4];
#pragma unroll
          for (int u = 0; u < 4; ++u)
            if (v + 32 * u < vecs) val[u] = src[v + 32 * u];
          for (unsigned left = here; left != 0; left &= left - 1) {
            uint4* dst = a.recv_x + static_cast<std::int64_t>(__shfl_sync(0xffffffffu, pair_row, __ffs(left) - 1)) * vecs;
#pragma unroll
            for (int u = 0; u < 4; ++u)
              if (v + 32 * u < vecs) dst[v + 32 * u] = val[u];
          }
        }
        if (a.scales)
          for (unsigned left = here; left != 0; left &= left - 1) {
            const std::int32_t prow = __shfl_sync(0xffffffffu, pair_row, __ffs(left) - 1);
            copy_scales(a.recv_scales + static_cast<std::int64_t>(prow) * a.scales, a.x_scales + t * a.scales);
          }
      } else {
        uint4* dst = a.w.symm_at(a.staging, r) + static_cast<std::int64_t>(row) * stride;
        dev::copy_warp(dst, src, static_cast<std::size_t>(vecs) * 16);
        if (a.scales) copy_scales(reinterpret_cast<float*>(dst + vecs), a.x_scales + t * a.scales);
      }
      std::int32_t* m = a.w.symm_at(a.meta, r) + static_cast<std::int64_t>(row) * mstride;
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
  }
  last_block_signals(a, a.s.done, e);
  wait_all(a, e);

  // Receive: each staged token to its rows of recv_x.
  const moe_detail::StagedRows staged{a.staging, a.meta, k, stride, a.recv_tokens, a.self_lo, a.self_hi};
  moe_detail::receive_rows(staged, warp0, warps, vecs, a.scales, a.recv_x, a.recv_scales, a.recv_weights);
  dev::epoch_end(a.epoch, e);
}

__global__ void __launch_bounds__(kEpThreads) combine_kernel(MoveArgs a) {
  const std::uint64_t e = dev::epoch_begin(a.epoch);
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const std::int64_t warp0 = static_cast<std::int64_t>(blockIdx.x) * kEpWarps + threadIdx.x / 32;
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * kEpWarps;
  const int W = a.world, k = a.k, me = a.w.rank;
  const std::int64_t vecs = a.hidden / 8;

  // Reduce: partial = sum over the staged token's pairs, in slot order, of w x y. An own token that
  // went to this rank alone is its output: stored there, and the gather skips it.
  const moe_detail::StagedRows staged{a.staging, a.meta, k, vecs, a.recv_tokens, a.self_lo, a.self_hi};
  moe_detail::reduce_partials(staged, a.staging, warp0, warps, a.y, a.out, [&](std::int64_t t) {
    const std::int32_t row_r = lane < W ? a.s.token_rows[t * W + lane] : -1;
    return __ballot_sync(0xffffffffu, row_r >= 0) == 1u << me;
  });
  last_block_signals(a, a.s.done + 1, e);
  wait_all(a, e);

  // Gather: out[t] = sum over the ranks t went to, ascending, of their partials.
  for (std::int64_t t = warp0; t < a.tokens; t += warps) {
    const std::int32_t my_row = lane < W ? a.s.token_rows[t * W + lane] : -1;
    const unsigned sent = __ballot_sync(0xffffffffu, my_row >= 0);
    if (sent == 1u << me) continue;  // went to this rank only: the reduce stored its output
    auto row_at = [&](int r) {
      return a.w.symm_at(a.staging, r) + static_cast<std::int64_t>(__shfl_sync(0xffffffffu, my_row, r)) * vecs;
    };
    auto unweighted = [](int) { return 1.f; };
    for (std::int64_t v0 = 0; v0 < vecs; v0 += 32 * moe_detail::kRowSumVecs) {  // every lane runs every step
      moe_detail::RowSumAcc acc{};  // fp32 sums, rounded once
      moe_detail::add_rows<false>(acc, sent, row_at, unweighted, v0 + lane, vecs);
      moe_detail::store_rows(a.out + t * vecs, acc, v0 + lane, vecs);
    }
  }
  dev::epoch_end(a.epoch, e);
}

const char* row_error_name(std::int64_t code) {
  return code == kTwice ? "lists an expert twice" : "has an expert id out of range";
}

}  // namespace

// ---- the plan -------------------------------------------------------------------
//
// Across nodes (some peer without an address) the plan keeps its checks, its
// handle and its host read, and weft::internode's kernels (internode/ep.cu,
// found through two_level.hpp's registry) count, exchange and move: the same
// receive rows and meta records, two hops (docs/decisions/0072).

ExpertParallel::ExpertParallel(std::shared_ptr<Context> ctx, const EpOptions& options)
    : ctx_(std::move(ctx)), opt_(options) {
  WEFT_REQUIRE(ctx_, "ExpertParallel needs a Context");
  // Where some peer has no address (another node), weft::internode's kernels run: the same rows, two hops.
  const bool across = !ctx_->all_peers_direct();
  const int W = ctx_->world_size();
  const char* placement = moe_detail::placement_error(opt_.experts, W);
  WEFT_REQUIRE(*placement == 0, "ExpertParallel: experts = ", opt_.experts, " on ", W, " ranks: ", placement);
  WEFT_REQUIRE(opt_.experts <= kMaxExperts, "ExpertParallel: experts = ", opt_.experts, " exceeds ", kMaxExperts);
  WEFT_REQUIRE(W <= kMaxWorld, "ExpertParallel: world size ", W, " exceeds ", kMaxWorld);
  WEFT_REQUIRE(opt_.hidden > 0 && opt_.hidden % 8 == 0, "ExpertParallel: hidden = ", opt_.hidden,
               " must be a positive multiple of 8: tokens move as 16-byte vectors of 8 bf16");
  WEFT_REQUIRE(opt_.top_k >= 1 && opt_.top_k <= kMaxTopK, "ExpertParallel: top_k = ", opt_.top_k,
               " must be in [1, ", kMaxTopK, "]");
  WEFT_REQUIRE(opt_.max_tokens > 0, "ExpertParallel: max_tokens = ", opt_.max_tokens, " must be positive");
  WEFT_REQUIRE(opt_.max_sms >= 0, "ExpertParallel: max_sms = ", opt_.max_sms, " must be >= 0 (0: no cap)");
  WEFT_REQUIRE(opt_.recv_capacity >= 0, "ExpertParallel: recv_capacity = ", opt_.recv_capacity, " must be >= 0");
  // Every rank must describe the same plan; the error names each differing rank's values and rank 0's.
  ctx_->verify_same_call(str("ExpertParallel plan: experts ", opt_.experts, ", hidden ", opt_.hidden, ", top_k ",
                             opt_.top_k, ", max_tokens ", opt_.max_tokens, ", recv_capacity ", opt_.recv_capacity,
                             across ? str(", across nodes", ops_detail::two_level_readiness()) : std::string()));
  const int sms = std::max(1, ctx_->team().sm_count);
  blocks_ = opt_.max_sms > 0 ? std::min(opt_.max_sms, sms) : sms;

  if (across) {
    across_ = ops_detail::two_level_or_refuse(*ctx_, "ExpertParallel").expert_parallel(*ctx_, opt_, blocks_);
    row_ = across_->row_words();
  } else {
    row_ = opt_.experts + W + kRowTail;
    counts_ = SymmetricBuffer(ctx_->heap(), 2ull * W * row_ * 8, "i64", "ep.counts");
    exchange_signals_ = SignalArray(ctx_->heap(), W, "ep.exchange.flags");
    dispatch_signals_ = SignalArray(ctx_->heap(), W, "ep.dispatch.flags");
    combine_signals_ = SignalArray(ctx_->heap(), W, "ep.combine.flags");
    std::uint64_t bytes = 0;
    carve(nullptr, opt_.max_tokens, opt_.experts, W, opt_.top_k, &bytes);
    scratch_ = DeviceBuffer(bytes);
    WEFT_CUDA(cudaMemset(scratch_.get(), 0, bytes));
    const int count_smem = kCountWarps * (opt_.experts + W) * 4;
    if (count_smem > 48 * 1024)
      WEFT_CUDA(cudaFuncSetAttribute(count_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, count_smem));
  }
  grow_staging(opt_.recv_capacity > 0 ? opt_.recv_capacity : 2 * opt_.max_tokens);
  WEFT_CUDA(cudaMallocHost(&host_counts_, static_cast<std::size_t>(W) * row_ * 8));
}

ExpertParallel::~ExpertParallel() {
  if (host_counts_) cudaFreeHost(host_counts_);
}

namespace {
// The staged rows of rank `rank`'s own tokens, [lo, hi): after those of the lower ranks.
std::pair<std::int64_t, std::int64_t> own_staged_rows(const EpHandle& h, int rank) {
  std::int64_t lo = 0;
  for (int src = 0; src < rank; ++src) lo += h.tokens_from[src];
  return {lo, lo + h.tokens_from[rank]};
}
}  // namespace

void ExpertParallel::grow_staging(std::int64_t rows) {
  WEFT_REQUIRE(rows < (std::int64_t{1} << 31), "ExpertParallel: ", rows, " receive rows exceed the 2^31 limit");
  rows = std::max<std::int64_t>(rows, 1);
  // Free first, then allocate: the same sequence on every rank (they decide from the same counts).
  staging_ = SymmetricBuffer();
  meta_ = SymmetricBuffer();
  staging_ = SymmetricBuffer(ctx_->heap(), static_cast<std::uint64_t>(rows) * opt_.hidden * 2, "bf16", "ep.staging");
  meta_ = SymmetricBuffer(ctx_->heap(), static_cast<std::uint64_t>(rows) * (2 + 2 * opt_.top_k) * 4, "i32",
                          "ep.meta");
  capacity_ = rows;
}

// One node: the count and exchange kernels; returns the device counts matrix of this layout.
const std::int64_t* ExpertParallel::count_and_exchange(const std::int64_t* topk_idx, std::int64_t num_tokens,
                                                       cudaStream_t stream) {
  const int W = ctx_->world_size(), E = opt_.experts, k = opt_.top_k;
  const Scratch s = carve(scratch_.get(), opt_.max_tokens, E, W, k, nullptr);
  WEFT_CUDA(cudaMemsetAsync(s.error, 0xff, 8, stream));
  if (num_tokens > 0) {
    const auto chunks = (num_tokens + kChunk - 1) / kChunk;
    const auto grid = static_cast<unsigned>((chunks + kCountWarps - 1) / kCountWarps);
    const int smem = kCountWarps * (E + W) * 4;
    const moe_detail::CountArgs ca{.topk = topk_idx,
                                   .tokens = num_tokens,
                                   .experts = E,
                                   .world = W,
                                   .k = k,
                                   .nodes = 1,
                                   .local = W,
                                   .error = s.error,
                                   .chunk_counts = s.chunk_counts,
                                   .pair_local = s.pair_local,
                                   .rank_local = s.rank_local,
                                   .node_local = nullptr};
    count_kernel<<<grid, kCountWarps * 32, smem, stream>>>(ca);
    WEFT_CUDA(cudaGetLastError());
  }
  ExchangeArgs xa{ctx_->world(), topk_idx, num_tokens, E, W, k, opt_.hidden, counts_.as<std::int64_t>(), row_,
                  exchange_signals_.flags(), exchange_signals_.launch_epoch(), s};
  launch_pdl(exchange_kernel, 1, kExchangeThreads, stream, xa);
  WEFT_CUDA(cudaGetLastError());
  // The exchange's device epoch counts layouts: this one is layouts_ + 1, whose parity picks the matrix.
  return counts_.as<std::int64_t>() + static_cast<std::int64_t>((layouts_ + 1) & 1) * W * row_;
}

EpHandle ExpertParallel::layout(const std::int64_t* topk_idx, std::int64_t num_tokens, cudaStream_t stream) {
  const int W = ctx_->world_size(), me = ctx_->rank(), E = opt_.experts, k = opt_.top_k, per = E / W;
  stage_ = 0;
  WEFT_REQUIRE(num_tokens >= 0 && num_tokens <= opt_.max_tokens, "ExpertParallel::layout: num_tokens = ", num_tokens,
               " must be in [0, max_tokens = ", opt_.max_tokens, "]");
  WEFT_REQUIRE(num_tokens == 0 || topk_idx, "ExpertParallel::layout: topk_idx is null for ", num_tokens, " tokens");
  if (ctx_->check_calls()) ctx_->verify_same_call(str("ExpertParallel layout #", layouts_ + 1));
  const int row = row_;
  const std::int64_t* matrix = across_ ? across_->layout(topk_idx, num_tokens, stream)
                                       : count_and_exchange(topk_idx, num_tokens, stream);
  ++layouts_;
  WEFT_CUDA(cudaMemcpyAsync(host_counts_, matrix, static_cast<std::size_t>(W) * row * 8, cudaMemcpyDeviceToHost,
                            stream));
  ctx_->synchronize(stream);

  // Every rank checks every row, so all raise the same error.
  auto at = [&](int src, int col) { return host_counts_[static_cast<std::int64_t>(src) * row + col]; };
  const int tail = E + W;
  const char* names[] = {"experts", "hidden", "top_k"};
  const std::int64_t mine[] = {E, opt_.hidden, k};
  for (int src = 0; src < W; ++src)
    for (int i = 0; i < 3; ++i)
      WEFT_REQUIRE(at(src, tail + 1 + i) == mine[i], "ExpertParallel::layout: ranks disagree on ", names[i],
                   ": rank ", me, " has ", mine[i], ", rank ", src, " has ", at(src, tail + 1 + i));
  for (int src = 0; src < W; ++src)
    WEFT_REQUIRE(at(src, tail + 4) < 0, "ExpertParallel::layout: rank ", src, "'s token ", at(src, tail + 4),
                 " (slot ", at(src, tail + 5), ", expert id ", at(src, tail + 7), ") ", row_error_name(at(src, tail + 6)),
                 ": ids must be in [-1, ", E, ") and distinct within a token");

  EpHandle h;
  h.id = layouts_;
  h.num_tokens = num_tokens;
  h.expert_rows.assign(per, 0);
  h.expert_offset.assign(per, 0);
  h.tokens_from.assign(W, 0);
  h.tokens_to.assign(W, 0);
  std::int64_t most = 0;
  for (int r = 0; r < W; ++r) {
    std::int64_t into_r = 0;
    for (int src = 0; src < W; ++src) into_r += at(src, E + r);
    most = std::max(most, into_r);
  }
  for (int src = 0; src < W; ++src) h.tokens_from[src] = at(src, E + me);
  for (int r = 0; r < W; ++r) h.tokens_to[r] = at(me, E + r);
  for (int l = 0; l < per; ++l) {
    for (int src = 0; src < W; ++src) h.expert_rows[l] += at(src, me * per + l);
    h.expert_offset[l] = h.recv_rows;
    h.recv_rows += h.expert_rows[l];
  }
  for (int src = 0; src < W; ++src) h.recv_tokens += h.tokens_from[src];
  WEFT_REQUIRE(h.recv_rows < (std::int64_t{1} << 31), "ExpertParallel::layout: ", h.recv_rows,
               " receive rows exceed the 2^31 limit");
  if (most > capacity_) grow_staging(std::max(most, capacity_ + capacity_ / 2));  // every rank alike
  if (across_) across_->prepare(host_counts_);
  topk_ = topk_idx;
  tokens_ = num_tokens;
  current_ = h;
  stage_ = 1;
  return h;
}

void ExpertParallel::check_handle(const EpHandle& h, const char* call, int stage) const {
  WEFT_REQUIRE(h.id == current_.id && h.id != 0, "ExpertParallel::", call, ": the handle is from layout #", h.id,
               ", but the plan holds layout #", current_.id, "'s routing; call ", call, " on the latest layout's handle");
  WEFT_REQUIRE(stage_ == stage, "ExpertParallel::", call, ": calls go layout, dispatch, combine, once each per layout (",
               stage_ == 1   ? "dispatch has not run"
               : stage_ == 2 ? "dispatch has run"
               : stage_ == 3 ? "combine has run"
                             : "no valid layout",
               ")");
}

void ExpertParallel::dispatch(const EpHandle& h, const void* x, const float* topk_weights, void* recv_x,
                              float* recv_weights, cudaStream_t stream) {
  dispatch_rows(h, false, x, nullptr, topk_weights, recv_x, nullptr, recv_weights, stream);
}

void ExpertParallel::dispatch_fp8(const EpHandle& h, const void* x, const float* x_scales, const float* topk_weights,
                                  void* recv_x, float* recv_scales, float* recv_weights, cudaStream_t stream) {
  WEFT_REQUIRE(opt_.hidden % kFp8ScaleChannels == 0, "ExpertParallel::dispatch_fp8: hidden = ", opt_.hidden,
               " must be a multiple of ", kFp8ScaleChannels, ": one scale per ", kFp8ScaleChannels, " channels");
  WEFT_REQUIRE(tokens_ == 0 || x_scales, "ExpertParallel::dispatch_fp8: x_scales is null for ", tokens_, " tokens");
  WEFT_REQUIRE(h.recv_rows == 0 || recv_scales, "ExpertParallel::dispatch_fp8: recv_scales is null for ", h.recv_rows,
               " rows");
  WEFT_REQUIRE((reinterpret_cast<std::uintptr_t>(x_scales) | reinterpret_cast<std::uintptr_t>(recv_scales)) % 4 == 0,
               "ExpertParallel::dispatch_fp8: x_scales and recv_scales must be 4-byte aligned floats");
  dispatch_rows(h, true, x, x_scales, topk_weights, recv_x, recv_scales, recv_weights, stream);
}

void ExpertParallel::dispatch_rows(const EpHandle& h, bool fp8, const void* x, const float* x_scales,
                                   const float* topk_weights, void* recv_x, float* recv_scales, float* recv_weights,
                                   cudaStream_t stream) {
  const char* call = fp8 ? "dispatch_fp8" : "dispatch";
  check_handle(h, call, 1);
  WEFT_REQUIRE(tokens_ == 0 || (x && topk_weights), "ExpertParallel::", call, ": x and topk_weights are needed for ",
               tokens_, " tokens");
  WEFT_REQUIRE(h.recv_rows == 0 || recv_x, "ExpertParallel::", call, ": recv_x is null for ", h.recv_rows, " rows");
  WEFT_REQUIRE((reinterpret_cast<std::uintptr_t>(x) | reinterpret_cast<std::uintptr_t>(recv_x)) % 16 == 0,
               "ExpertParallel::", call, ": x and recv_x must be 16-byte aligned");
  if (ctx_->check_calls()) ctx_->verify_same_call(str("ExpertParallel ", call, " #", h.id));
  const auto [self_lo, self_hi] = own_staged_rows(h, ctx_->rank());
  if (across_) {
    across_->dispatch(ops_detail::EpRun{.fp8 = fp8,
                                        .x = x,
                                        .x_scales = x_scales,
                                        .weights = topk_weights,
                                        .recv_x = recv_x,
                                        .recv_scales = recv_scales,
                                        .recv_weights = recv_weights,
                                        .staging = staging_.get(),
                                        .meta = meta_.as<std::int32_t>(),
                                        .recv_tokens = h.recv_tokens,
                                        .self_lo = self_lo,
                                        .self_hi = self_hi},
                      stream);
    stage_ = 2;
    return;
  }
  const Scratch s = carve(scratch_.get(), opt_.max_tokens, opt_.experts, ctx_->world_size(), opt_.top_k, nullptr);
  MoveArgs a{.w = ctx_->world(),
             .experts = opt_.experts,
             .world = ctx_->world_size(),
             .k = opt_.top_k,
             .hidden = opt_.hidden,
             .row_vecs = fp8 ? opt_.hidden / 16 : opt_.hidden / 8,
             .scales = fp8 ? opt_.hidden / kFp8ScaleChannels : 0,
             .tokens = tokens_,
             .recv_tokens = h.recv_tokens,
             .self_lo = self_lo,
             .self_hi = self_hi,
             .topk = topk_,
             .weights = topk_weights,
             .x = static_cast<const uint4*>(x),
             .x_scales = x_scales,
             .recv_x = static_cast<uint4*>(recv_x),
             .recv_scales = recv_scales,
             .recv_weights = recv_weights,
             .y = nullptr,
             .out = nullptr,
             .staging = staging_.as<uint4>(),
             .meta = meta_.as<std::int32_t>(),
             .flags = dispatch_signals_.flags(),
             .epoch = dispatch_signals_.launch_epoch(),
             .s = s};
  const std::int64_t work = std::max(tokens_, h.recv_tokens);
  const int grid = static_cast<int>(std::clamp<std::int64_t>((work + kEpWarps - 1) / kEpWarps, 1, blocks_));
  launch_pdl(dispatch_kernel, grid, kEpThreads, stream, a);
  WEFT_CUDA(cudaGetLastError());
  stage_ = 2;
}

void ExpertParallel::combine(const EpHandle& h, const void* y, void* out, cudaStream_t stream) {
  check_handle(h, "combine", 2);
  WEFT_REQUIRE(h.recv_rows == 0 || y, "ExpertParallel::combine: y is null for ", h.recv_rows, " rows");
  WEFT_REQUIRE(tokens_ == 0 || out, "ExpertParallel::combine: out is null for ", tokens_, " tokens");
  WEFT_REQUIRE((reinterpret_cast<std::uintptr_t>(y) | reinterpret_cast<std::uintptr_t>(out)) % 16 == 0,
               "ExpertParallel::combine: y and out must be 16-byte aligned");
  if (ctx_->check_calls()) ctx_->verify_same_call(str("ExpertParallel combine #", h.id));
  const auto [self_lo, self_hi] = own_staged_rows(h, ctx_->rank());
  if (across_) {
    across_->combine(ops_detail::EpRun{.y = y,
                                       .out = out,
                                       .staging = staging_.get(),
                                       .meta = meta_.as<std::int32_t>(),
                                       .recv_tokens = h.recv_tokens,
                                       .self_lo = self_lo,
                                       .self_hi = self_hi},
                     stream);
    stage_ = 3;
    return;
  }
  const Scratch s = carve(scratch_.get(), opt_.max_tokens, opt_.experts, ctx_->world_size(), opt_.top_k, nullptr);
  MoveArgs a{.w = ctx_->world(),
             .experts = opt_.experts,
             .world = ctx_->world_size(),
             .k = opt_.top_k,
             .hidden = opt_.hidden,
             .row_vecs = opt_.hidden / 8,
             .scales = 0,
             .tokens = tokens_,
             .recv_tokens = h.recv_tokens,
             .self_lo = self_lo,
             .self_hi = self_hi,
             .topk = topk_,
             .weights = nullptr,
             .x = nullptr,
             .x_scales = nullptr,
             .recv_x = nullptr,
             .recv_scales = nullptr,
             .recv_weights = nullptr,
             .y = static_cast<const uint4*>(y),
             .out = static_cast<uint4*>(out),
             .staging = staging_.as<uint4>(),
             .meta = meta_.as<std::int32_t>(),
             .flags = combine_signals_.flags(),
             .epoch = combine_signals_.launch_epoch(),
             .s = s};
  const std::int64_t work = std::max(tokens_, h.recv_tokens);
  const int grid = static_cast<int>(std::clamp<std::int64_t>((work + kEpWarps - 1) / kEpWarps, 1, blocks_));
  launch_pdl(combine_kernel, grid, kEpThreads, stream, a);
  WEFT_CUDA(cudaGetLastError());
  stage_ = 3;
}

}  // namespace weft
