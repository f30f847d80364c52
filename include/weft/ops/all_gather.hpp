// weft/ops/all_gather.hpp - AllGather among the ranks, as a reusable plan.
//
// Every rank contributes `bytes_per_rank` bytes; every rank ends with all
// contributions concatenated in rank order (world_size x bytes_per_rank).
// Three ways to move the data, as in the paper's tutorial:
//   push        - SMs store this rank's shard into every peer's output (NVLink stores);
//   pull        - SMs load every peer's shard from its input (NVLink loads);
//   copy_engine - cudaMemcpyAsync to each peer's output, arrival published by
//                 one-thread signal kernels (the copy engines move the data);
//   ll          - low-latency protocol for small messages: each 4 bytes travel
//                 with their flag in one 8-byte store into the peers' staging
//                 buffers, one NVLink trip and no handshake;
//   ring        - SM push in ring order: each shard travels rank -> rank + 1
//                 for W - 1 steps (for links between neighbours only).
//   two_level   - across nodes: a ring of puts along each rail (the GPUs of one
//                 local rank, one per node) through NVSHMEM, and NVLink pushes
//                 of every shard that lands to the node's other GPUs
//                 (src/ops/hierarchy.hpp; docs/decisions/0066). Its kernel lives in
//                 weft::internode, ready while a weft::RemotePeers is alive.
// automatic picks by size from measurements on 2 x H200 (docs/PERF.md; docs/decisions/0008)
// where every peer is mapped (one node), and two_level where some are not
// (other nodes, or virtual nodes: WEFT_VIRTUAL_NODES). The one-node variants
// load and store every peer, so across nodes they are refused, naming the
// ranks without a direct path; so is two_level without weft::internode.
// Every variant is epoch-tagged: back-to-back runs need no reset and no extra barrier.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "weft/core/cuda_resources.hpp"
#include "weft/runtime/context.hpp"

namespace weft {
namespace ops_detail {
class TwoLevelRun;
}

enum class AllGatherVariant { automatic, push, pull, copy_engine, low_latency, ring, two_level };

/// "auto", "push", "pull", "ce", "ll", "ring", "two_level".
const char* to_string(AllGatherVariant v);
/// Parses the names above ("copy_engine" too); throws naming the accepted names.
AllGatherVariant parse_all_gather_variant(const std::string& name);

/// What an AllGather plan is built for.
struct AllGatherOptions {
  std::uint64_t bytes_per_rank = 0;  ///< each rank's contribution (> 0)
  AllGatherVariant variant = AllGatherVariant::automatic;
  /// Cap on the SMs (thread blocks) the SM variants occupy; 0 = the plan chooses.
  int max_sms = 0;
};

/// Largest bytes_per_rank the ll variant accepts (its staging doubles the bytes).
inline constexpr std::uint64_t kAllGatherLowLatencyMaxBytes = std::uint64_t{1} << 20;

/// A planned AllGather: allocates its signals once (collective), runs many times.
class AllGather {
 public:
  /// Collective. Validates the options and picks the variant and block count.
  AllGather(std::shared_ptr<Context> ctx, const AllGatherOptions& options);

  /// Gathers `input` (bytes_per_rank on this rank) into `output`
  /// (world_size x bytes_per_rank) on `stream`. Every rank calls it, in the same
  /// order. Where the buffers must live:
  ///   push, ring, copy_engine, two_level: `output` in the symmetric heap (peers write into it);
  ///   pull:              `input` in the symmetric heap (peers read from it);
  ///   ll:                anywhere (the plan owns its symmetric staging).
  /// The other buffer may be any device memory. `input` may alias this rank's
  /// slot of `output`. Throws weft::Error naming the violated requirement.
  /// Every variant can be captured in a CUDA graph and replayed.
  void run(const void* input, void* output, cudaStream_t stream);

  AllGatherVariant variant() const { return variant_; }
  int blocks() const { return blocks_; }
  std::uint64_t bytes_per_rank() const { return bytes_; }
  /// SMs the plan occupies while it runs (0 for copy_engine).
  int sms_used() const { return variant_ == AllGatherVariant::copy_engine ? 0 : blocks_; }

 private:
  void validate(const void* input, const void* output) const;
  void run_copy_engine(const void* input, void* output, cudaStream_t stream);

  std::shared_ptr<Context> ctx_;
  std::uint64_t bytes_;
  AllGatherVariant variant_;
  int blocks_;
  std::uint64_t runs_ = 0;
  SignalArray signals_;  // [0, W): ready; [W, 2W): arrived / done-reading; ring: [2W, 2W + (W-1) x blocks) per step
  SymmetricBuffer staging_;  // ll: [2 parities][W senders][words] 8-byte lines
  std::vector<Stream> side_streams_;  // copy_engine: one per peer
  std::vector<Event> side_events_;
  Event fork_event_;
  std::unique_ptr<ops_detail::TwoLevelRun> two_level_;  // two_level: weft::internode's plan

 public:
  ~AllGather();
  AllGather(const AllGather&) = delete;
  AllGather& operator=(const AllGather&) = delete;
};

}  // namespace weft
