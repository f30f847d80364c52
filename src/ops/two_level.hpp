// two_level.hpp (private) - how AllGather, ReduceScatter, AllReduce and
// ExpertParallel reach their two-level (multi-node) schedules, which live in
// weft::internode.
//
// The two-level kernels reach peers of other nodes through NVSHMEM's device
// API (weft/device/remote.cuh), so they are relocatable device code, built
// into the weft::internode target (src/ops/internode/), not into libweft,
// whose units stay whole-program (docs/decisions/0061). libweft's plans must
// still choose them, without pointing up at that target: weft::internode
// registers its factories here while a weft::RemotePeers is alive (the object
// that sets NVSHMEM's device state, which those kernels need), and a plan
// asks for them. Where none is registered, the plans keep their refusal,
// naming the operator, the ranks without a direct path and how to get the
// two-level schedule. docs/decisions/0066.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "hierarchy.hpp"
#include "moe/ep_ll_args.hpp"
#include "weft/core/dtype.hpp"
#include "weft/ops/ep.hpp"
#include "weft/runtime/context.hpp"

namespace weft::ops_detail {

/// A collective's two-level plan, built collectively by weft::internode.
class TwoLevelRun {
 public:
  virtual ~TwoLevelRun() = default;
  /// Enqueues one launch on `stream` (graph-capturable; epochs on the device, no reset).
  virtual void run(const void* input, void* output, cudaStream_t stream) = 0;
  /// Thread blocks of its kernel (the SMs it occupies while it runs).
  virtual int blocks() const = 0;
};

/// AllGather+GEMM's two-level AllGather, built collectively by weft::internode:
/// the AllGather kernel walking its waits in hierarchy::ag_arrival order and
/// counting, per shard, the blocks whose slice has landed (docs/decisions/0074).
class TwoLevelAgArrivals {
 public:
  virtual ~TwoLevelAgArrivals() = default;
  /// Enqueues one launch on `stream`: gathers every rank's `input` into the
  /// symmetric `output` (shard q at q x bytes per rank), and adds 1 to the local
  /// word arrived[q] (release, GPU scope) as each block's slice of a peer's
  /// shard q lands; a shard is whole once its word reaches blocks(). The own
  /// shard is not counted. The caller consumes the words (sets them back to 0)
  /// before the next launch.
  virtual void run(const void* input, void* output, std::uint64_t* arrived, cudaStream_t stream) = 0;
  /// Thread blocks of its kernel: the value every arrived word reaches.
  virtual int blocks() const = 0;
};

/// GEMM+ReduceScatter's two-level ReduceScatter, built collectively by
/// weft::internode: the ReduceScatter kernel, each of its blocks waiting,
/// before its one read of this GPU's partial of block b, for the local word
/// stored[b] to reach 1 (docs/decisions/0075).
class TwoLevelRsAfterStores {
 public:
  virtual ~TwoLevelRsAfterStores() = default;
  /// Enqueues one launch on `stream`: reduce-scatters `input` ([W][count], this
  /// GPU's partials of every block) into `output` ([count]) as two_level's
  /// ReduceScatter does, reading block b's partial only once stored[b] >= 1.
  /// The caller raises stored[b] (from another stream, after the GEMM that
  /// writes block b) and zeroes the words before the next launch.
  virtual void run(const void* input, void* output, const std::uint64_t* stored, cudaStream_t stream) = 0;
  /// Thread blocks of its kernel (the SMs it holds while it runs).
  virtual int blocks() const = 0;
};

/// What ExpertParallel (moe/ep.cu) hands its kernels across nodes for one
/// dispatch or combine, checked there: the caller's tensors, the plan's receive
/// staging and meta records (the one-node plan's rows: docs/decisions/0072),
/// and which of the staged rows hold this rank's own tokens.
struct EpRun {
  bool fp8 = false;
  const void* x = nullptr;           ///< dispatch: [T][H] bf16, or fp8 e4m3
  const float* x_scales = nullptr;   ///< fp8 dispatch: [T][H / 128]
  const float* weights = nullptr;    ///< dispatch: [T][k]
  void* recv_x = nullptr;            ///< dispatch: [recv_rows][H]
  float* recv_scales = nullptr;      ///< fp8 dispatch: [recv_rows][H / 128]
  float* recv_weights = nullptr;     ///< dispatch: [recv_rows] or null
  const void* y = nullptr;           ///< combine: [recv_rows][H] bf16
  void* out = nullptr;               ///< combine: [T][H] bf16
  void* staging = nullptr;           ///< symmetric [capacity][H] bf16: tokens received, then partial sums
  std::int32_t* meta = nullptr;      ///< symmetric [capacity][2 + 2k]
  std::int64_t recv_tokens = 0;      ///< staged tokens this call
  std::int64_t self_lo = 0, self_hi = 0;  ///< staged rows of this rank's own tokens
};

/// ExpertParallel's kernels across nodes, built collectively by weft::internode.
/// The plan keeps its checks, its handle and its host read of the counts; this
/// counts, exchanges and moves.
class TwoLevelEp {
 public:
  virtual ~TwoLevelEp() = default;
  /// Words of a counts row: the one-node plan's [E pairs][W tokens][8 tail], then [nodes] tokens per node.
  virtual int row_words() const = 0;
  /// Enqueues the count and the exchange of `tokens` rows of `topk` ([tokens, k]
  /// int64) on `stream`; returns the device matrix ([W][row_words()] int64) this
  /// call's counts land in, every rank's row.
  virtual const std::int64_t* layout(const std::int64_t* topk, std::int64_t tokens, cudaStream_t stream) = 0;
  /// Collective, after the host read of that matrix (`host`, the same on every
  /// rank): grows the rail staging and the return rows where this call needs more.
  virtual void prepare(const std::int64_t* host) = 0;
  /// Enqueues dispatch (the sends, the rail GPU's forward, the receive), then
  /// combine (the reduce, the rail GPU's return of node sums, the gather).
  virtual void dispatch(const EpRun& run, cudaStream_t stream) = 0;
  virtual void combine(const EpRun& run, cudaStream_t stream) = 0;
};

/// ExpertParallelLowLatency's send and combine across nodes, built collectively
/// by weft::internode: the one-node plan's kernels (moe/ep_ll_kernels.cuh) with
/// NVSHMEM's puts to the peers of other nodes, and the symmetric staging rows
/// those leave from. The plan keeps its buffers, checks and receive kernel.
class TwoLevelEpLl {
 public:
  virtual ~TwoLevelEpLl() = default;
  /// Enqueues the send kernel on `stream` with `grid` blocks: `a` as the plan
  /// fills it, with this object's staging added.
  virtual void send(moe_detail::LlArgs a, int grid, cudaStream_t stream) = 0;
  /// The same for the combine kernel.
  virtual void combine(moe_detail::LlArgs a, int grid, cudaStream_t stream) = 0;
};

/// The factories weft::internode registers. Each is collective, validates
/// nothing the calling plan already did, and throws weft::Error on every rank
/// alike (the grid is the team's, the same everywhere).
struct TwoLevelCollectives {
  /// ExpertParallel across nodes: `options` checked and agreed by the plan, `blocks` its SM budget.
  std::unique_ptr<TwoLevelEp> (*expert_parallel)(Context& ctx, const EpOptions& options, int blocks);
  /// ExpertParallelLowLatency across nodes: `options` checked and agreed by the plan.
  std::unique_ptr<TwoLevelEpLl> (*expert_parallel_low_latency)(Context& ctx, const EpLowLatencyOptions& options);
  std::unique_ptr<TwoLevelRun> (*all_gather)(Context& ctx, std::uint64_t bytes_per_rank, int max_sms);
  std::unique_ptr<TwoLevelRun> (*reduce_scatter)(Context& ctx, std::uint64_t count, DType dtype, int max_sms);
  std::unique_ptr<TwoLevelRun> (*all_reduce)(Context& ctx, std::uint64_t count, DType dtype, int max_sms,
                                             hierarchy::RailWay way);
  /// AllGather+GEMM's counting AllGather of `bytes_per_rank` (AgGemm across nodes).
  std::unique_ptr<TwoLevelAgArrivals> (*ag_arrivals)(Context& ctx, std::uint64_t bytes_per_rank, int max_sms);
  /// GEMM+ReduceScatter's ReduceScatter after stores, of `count` elements per rank (GemmRs across nodes).
  std::unique_ptr<TwoLevelRsAfterStores> (*rs_after_stores)(Context& ctx, std::uint64_t count, DType dtype,
                                                            int max_sms);
};

/// Registers `table` (weft::RemotePeers' constructor) or, with nullptr, drops
/// one registration (its destructor). Registrations are counted: the table
/// stays while any RemotePeers is alive. Thread-safe.
void register_two_level(const TwoLevelCollectives* table);
/// The registered table, or nullptr where weft::internode is not linked or no
/// weft::RemotePeers is alive.
const TwoLevelCollectives* two_level_collectives();

/// The node grid of the context's team (ranks node-major, nodes of equal
/// size); throws weft::Error, naming `who` and why, where the ranks form none.
hierarchy::NodeGrid two_level_grid(const Context& ctx, const std::string& who);

/// How a plan that refuses peers without an address says where its two-level schedule is.
std::string two_level_remedy(const std::string& who);

/// The table, where `who`'s plan takes its two-level path; else throws on
/// every rank alike (call it after the ranks agreed on the plan): naming the
/// ranks without a direct path where there are some (Context::require_direct_peers),
/// else saying that the two_level variant needs weft::internode.
const TwoLevelCollectives& two_level_or_refuse(const Context& ctx, const std::string& who);

/// " (before a weft::RemotePeers)" where no table is registered: a plan's
/// description carries it, so ranks that differ are named by verify_same_call.
std::string two_level_readiness();

}  // namespace weft::ops_detail
