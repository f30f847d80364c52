// weft/ops/reduce_scatter.hpp - sum across ranks, each rank keeping one slice, as a reusable plan.
//
// Every rank gives world x `count` elements; rank r receives the element-wise
// sum over all ranks of their slice r ([r x count, (r+1) x count)). Sums
// accumulate in fp32 and round once (ring: once per step, as the partial sums
// travel), in a fixed order, so results repeat bit for bit.
//   ll          - slice p of my input travels to rank p as 8-byte {4 data bytes,
//                 flag} lines; one NVLink trip, no handshake. Small messages.
//   mesh        - rank r reads slice r of every peer's input (SM loads) and sums
//                 in rank order 0..W-1.
//   ring        - partial sums travel rank -> rank + 1 for W - 1 steps (SM
//                 stores into double-buffered staging); order: rank r+1, r+2, ..., r.
//   copy_engine - the copy engines push slice p of every input into rank p's
//                 scratch, chunk by chunk, while a short local kernel sums each
//                 chunk that has arrived, in rank order (bulk messages, few SMs).
//   two_level   - across nodes: each GPU pushes every block of another rail to
//                 that rail's GPU of its node over NVLink; the rail's GPU sums
//                 its node's contributions (local rank order, fp32) and puts the
//                 node sum (fp32) to the block's owner through NVSHMEM; the owner
//                 sums the nodes' sums in node order and rounds once
//                 (src/ops/hierarchy.hpp; docs/decisions/0066). The order differs
//                 from rank order where nodes hold several ranks, so the bits may
//                 differ from the one-node variants'; they repeat exactly. Its
//                 kernel lives in weft::internode, ready while a weft::RemotePeers is alive.
// automatic picks by size from the 2 x H200 measurements in docs/PERF.md (docs/decisions/0008)
// where every peer is mapped (one node), and two_level where some are not.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "weft/ops/collective.hpp"
#include "weft/runtime/context.hpp"

namespace weft {
namespace ops_detail {
class CopyEngineReduction;
class TwoLevelRun;
}

enum class ReduceScatterVariant { automatic, low_latency, mesh, ring, copy_engine, two_level };

/// "auto", "ll", "mesh", "ring", "ce", "two_level".
const char* to_string(ReduceScatterVariant v);
/// Parses those names; throws naming the accepted ones.
ReduceScatterVariant parse_reduce_scatter_variant(const std::string& name);

/// Largest output slice (bytes per rank) of the ll variant.
inline constexpr std::uint64_t kReduceScatterLowLatencyMaxBytes = std::uint64_t{1} << 20;

/// What a ReduceScatter plan is built for.
struct ReduceScatterOptions {
  std::uint64_t count = 0;  ///< output elements per rank; the input holds world x count
  DType dtype = DType::bf16;
  ReduceScatterVariant variant = ReduceScatterVariant::automatic;
  int max_sms = 0;          ///< cap on the SMs (thread blocks) it occupies; 0 = the plan chooses
};

/// A planned ReduceScatter (sum). Collective to build; runs many times.
class ReduceScatter {
 public:
  /// Collective. Validates the options (and that every rank asked for the same
  /// plan), picks the variant and allocates its signals and staging once.
  ReduceScatter(std::shared_ptr<Context> ctx, const ReduceScatterOptions& options);
  ~ReduceScatter();
  ReduceScatter(const ReduceScatter&) = delete;
  ReduceScatter& operator=(const ReduceScatter&) = delete;

  /// Reduces `input` (world x count elements) into `output` (count elements)
  /// on `stream`. `output` may be this rank's slice of `input` (in place).
  /// Buffers: mesh reads peers' inputs, so `input` must be in the symmetric
  /// heap; ll, ring, copy_engine and two_level take any device memory. Every variant can
  /// be captured in a CUDA graph and replayed.
  void run(const void* input, void* output, cudaStream_t stream);

  ReduceScatterVariant variant() const { return variant_; }
  /// SMs (thread blocks) the plan occupies while it runs (copy_engine: its local sum kernel).
  int sms_used() const { return blocks_; }
  std::uint64_t count() const { return count_; }
  DType dtype() const { return dtype_; }

 private:
  void run_copy_engine(const void* input, void* output, cudaStream_t stream);

  std::shared_ptr<Context> ctx_;
  std::uint64_t count_;
  DType dtype_;
  ReduceScatterVariant variant_;
  int blocks_ = 1;
  SignalArray signals_;
  SymmetricBuffer staging_;
  std::unique_ptr<ops_detail::CopyEngineReduction> ce_;
  std::unique_ptr<ops_detail::TwoLevelRun> two_level_;  // two_level: weft::internode's plan
  std::uint64_t runs_ = 0;
};

}  // namespace weft
