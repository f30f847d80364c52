// weft/ops/dist_flash_decode.hpp - decode attention over a KV cache sharded across the ranks (decode context parallelism).
//
// Every rank holds a shard of every sequence's KV cache and the whole query
// (q is replicated: a tensor-parallel attention layer has it on every rank).
// One call gives every rank the exact attention over all ranks' keys:
//   1. FlashDecode's kernel over the local shard (its own split-KV launch),
//      leaving each split's partial (output, log-sum-exp);
//   2. one exchange kernel: each block merges its rows' local splits, stores
//      the rank's partial into every rank's staging on the symmetric heap,
//      raises a flag per (sender, block) to the launch's epoch, waits for the
//      same block's flags of every rank, and merges the ranks' partials in
//      rank order (attention_detail::LseMerge), writing out and lse.
// The merge is associative, so any assignment of keys to ranks gives the
// attention of the whole sequence; the tests and the CPU model
// (attention_detail::contiguous_shard, interleaved pages) use contiguous
// ranges of ceil(length / world) keys per rank. A rank whose shard of a
// sequence is empty (length 0 there) contributes lse = -inf and nothing else.
// Staging is double-buffered by the epoch's parity, so a run needs no
// handshake with the previous one; flags only grow, so repeated runs and
// CUDA-graph replays need no reset. The exchange kernel waits on other ranks,
// so its grid is at most this rank's share of the SMs (Team::sm_count).
//
// Across nodes (or virtual nodes), where the exchange kernel cannot store into
// peers it has no address for, step 2 is three launches: this rank's partial
// staged locally (the same bits step 2 stores), weft's two-level AllGather of
// every rank's partial (weft::internode, while a weft::RemotePeers is alive;
// refused, naming the remedy, without one), and the same merge in rank order:
// every rank gets the same bits the one-node exchange gives.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>

#include "weft/ops/all_gather.hpp"
#include "weft/ops/flash_decode.hpp"
#include "weft/runtime/context.hpp"

namespace weft {

/// A planned distributed decode attention. Collective to build and to run.
class DistFlashDecode {
 public:
  /// Collective. `local` describes this rank's shard: the same batch, heads,
  /// head dim, type and layout on every rank (checked across ranks); its
  /// max_kv_len (or block table) bounds the local shard's keys. Allocates the
  /// staging and flags on the symmetric heap.
  DistFlashDecode(std::shared_ptr<Context> ctx, const FlashDecodeOptions& local);
  ~DistFlashDecode();
  DistFlashDecode(const DistFlashDecode&) = delete;
  DistFlashDecode& operator=(const DistFlashDecode&) = delete;

  /// Collective. `local` holds this rank's shard (kv_lens: each sequence's
  /// keys on this rank, 0 where it holds none), the whole q, and where the
  /// result goes: out [batch, q_heads, head_dim] and lse [batch, q_heads]
  /// (optional), the attention over every rank's keys, on every rank.
  void run(const FlashDecodeArgs& local, cudaStream_t stream);

  /// Collective. Step 2 alone: the exchange and merge over the partials the
  /// last run() left in the local plan's workspace (the same q, shard and
  /// lengths), writing out and lse as that run did - the same bits. What the
  /// combine step costs on its own (weft-bench decode --dist); run() first.
  void combine(const FlashDecodeArgs& local, cudaStream_t stream);

  /// The local attention's plan (its split count).
  const FlashDecode& local() const { return *local_; }
  /// Thread blocks of the exchange kernel.
  int exchange_blocks() const { return blocks_; }

 private:
  void launch_exchange(const FlashDecodeArgs& local, cudaStream_t stream);

  std::shared_ptr<Context> ctx_;
  std::unique_ptr<FlashDecode> local_;
  int blocks_ = 1;
  bool across_nodes_ = false;
  SymmetricBuffer staging_;
  SignalArray signals_;               // one node: the exchange kernel's flags
  std::unique_ptr<AllGather> gather_;  // across nodes: the partials' two-level AllGather
  std::uint64_t runs_ = 0;
  bool ran_ = false;  // run() has filled the local partials once
};

}  // namespace weft
