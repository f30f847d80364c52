// weft/ops/all_reduce.hpp - sum across the ranks, as a reusable plan.
//
// Every rank gives `count` elements; every rank receives their element-wise
// sum. Sums accumulate in fp32 in rank order and round once, so every variant
// gives the same bits on every rank and in every run.
//   ll        - each 4-byte word travels with its flag in one 8-byte store to
//               every peer's staging; one NVLink trip, no handshake. Small messages.
//   one_shot  - every rank pushes its whole input into every peer's staging
//               (double-buffered by epoch parity, so no handshake), then sums W inputs.
//   two_shot  - reduce-scatter then all-gather on SMs, pulling from the peers'
//               buffers: rank r sums chunk r of every input, then every rank reads
//               every other chunk from its owner. Bulk messages; moves the fewest bytes.
//   ce        - the same two phases on the copy engines: slices pushed into the
//               owners' scratch, summed chunk by chunk by a short local kernel,
//               each summed chunk pushed to every peer. Bulk messages, few SMs.
//   two_level - across nodes: ReduceScatter in the node over NVLink (slice l to
//               local rank l, summed in local rank order, fp32), the node sums of
//               each slice put to every GPU of its rail through NVSHMEM and summed
//               in node order, rounding once (every GPU of the rail gets the same
//               bits), then AllGather in the node (src/ops/hierarchy.hpp;
//               docs/decisions/0066). The order differs from rank order where nodes
//               hold several ranks; results repeat exactly and agree on every rank.
//               Its kernel lives in weft::internode, ready while a weft::RemotePeers is alive.
//               The rail AllReduce runs direct (one NIC latency) unless the options ask
//               for halving_doubling (rail_way), which moves 2 / nodes of the direct
//               way's bytes per NIC in 2 log2(nodes) latencies; it sums each rail's
//               nodes in butterfly order, so its bits can differ from direct's.
// automatic picks by size from the 2 x H200 measurements in docs/PERF.md (docs/decisions/0008)
// where every peer is mapped (one node), and two_level where some are not.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "weft/ops/collective.hpp"
#include "weft/runtime/context.hpp"

namespace weft {

namespace ops_detail {
class CopyEngineReduction;
class TwoLevelRun;
}

enum class AllReduceVariant { automatic, low_latency, one_shot, two_shot, copy_engine, two_level };

/// How the two_level variant sums each rail's node sums across the nodes.
enum class AllReduceRailWay {
  direct,           ///< every node's sum put to every node of the rail, summed in node order
  halving_doubling  ///< recursive halving then doubling; where the node count is a power of two (2, 4,
                    ///< 8, ...), else direct
};

/// "auto", "ll", "one_shot", "two_shot", "ce", "two_level".
const char* to_string(AllReduceVariant v);
/// Parses those names; throws naming the accepted ones.
AllReduceVariant parse_all_reduce_variant(const std::string& name);
/// "direct", "halving_doubling".
const char* to_string(AllReduceRailWay w);

/// Largest message (bytes per rank) of the ll and one_shot variants: their
/// staging holds 2 x world x (2 x, for ll) the message on every rank.
inline constexpr std::uint64_t kAllReduceLowLatencyMaxBytes = std::uint64_t{1} << 20;
inline constexpr std::uint64_t kAllReduceOneShotMaxBytes = std::uint64_t{16} << 20;

/// What an AllReduce plan is built for.
struct AllReduceOptions {
  std::uint64_t count = 0;  ///< elements per rank, any positive number
  DType dtype = DType::bf16;
  AllReduceVariant variant = AllReduceVariant::automatic;
  int max_sms = 0;          ///< cap on the SMs (thread blocks) it occupies; 0 = the plan chooses
  AllReduceRailWay rail_way = AllReduceRailWay::direct;  ///< two_level only: its rail AllReduce across nodes
};

/// A planned AllReduce (sum). Collective to build; runs many times.
class AllReduce {
 public:
  /// Collective. Validates the options (and that every rank asked for the same
  /// plan), picks the variant and allocates its signals and staging once.
  AllReduce(std::shared_ptr<Context> ctx, const AllReduceOptions& options);
  ~AllReduce();
  AllReduce(const AllReduce&) = delete;
  AllReduce& operator=(const AllReduce&) = delete;

  /// Sums `input` over the ranks into `output` on `stream` (output == input is
  /// allowed: in place). Every rank calls it in the same order. Buffers: for
  /// ll, one_shot and two_level any device memory; for two_shot both in the symmetric heap
  /// (peers read them); for ce the output in the heap (peers write into it).
  /// Every variant can be captured in a CUDA graph. Throws
  /// weft::Error naming the violated requirement.
  void run(const void* input, void* output, cudaStream_t stream);

  AllReduceVariant variant() const { return variant_; }
  /// The rail way that runs: halving_doubling where it was asked, the variant is
  /// two_level and the node count a power of two; direct otherwise.
  AllReduceRailWay rail_way() const { return rail_way_; }
  /// SMs (thread blocks) the plan occupies while it runs.
  int sms_used() const { return blocks_; }
  /// Elements per rank, their type, and their size in bytes, as planned.
  std::uint64_t count() const { return count_; }
  DType dtype() const { return dtype_; }
  std::uint64_t bytes() const { return count_ * dtype_size(dtype_); }

 private:
  std::shared_ptr<Context> ctx_;
  std::uint64_t count_;
  DType dtype_;
  AllReduceVariant variant_;
  AllReduceRailWay rail_way_ = AllReduceRailWay::direct;
  int blocks_ = 1;
  SignalArray signals_;
  SymmetricBuffer staging_;
  std::unique_ptr<ops_detail::CopyEngineReduction> ce_;
  std::unique_ptr<ops_detail::TwoLevelRun> two_level_;  // two_level: weft::internode's plan
  std::uint64_t runs_ = 0;
};

}  // namespace weft
