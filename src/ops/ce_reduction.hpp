// ce_reduction.hpp (private) - reduce-scatter (and optionally all-gather) on the copy engines.
//
// The copy engines move the data, so the only SM work is the local sum:
//   1. every rank tells its peers "my scratch and output are free" (epoch e);
//   2. per peer, a side stream pushes my slice p of the input, chunk by chunk,
//      into rank p's scratch slot for me, and flags each chunk's arrival;
//   3. my stream, chunk by chunk, waits for every peer's chunk and sums the
//      slot contents with my own slice, in rank order (a short local kernel);
//   4. (all-reduce) the side streams push each summed chunk into every peer's
//      output as soon as it is ready, and my stream waits for the peers' chunks.
// Chunks pipeline the copies with the sums. Flags are set and awaited by
// one-thread kernels reading the plan's device epoch (ce_signals.hpp), so the
// whole pipeline can be captured in a CUDA graph, and every wait is bounded.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "weft/core/cuda_resources.hpp"
#include "weft/ops/collective.hpp"
#include "weft/runtime/context.hpp"

namespace weft::ops_detail {

class CopyEngineReduction {
 public:
  /// Collective. `total` elements of `dtype` split into world slices of
  /// `slice` elements (the last may be shorter); with `gather` every rank ends
  /// with all summed slices (all-reduce), else with its own (reduce-scatter).
  CopyEngineReduction(Context& ctx, std::uint64_t total, std::uint64_t slice, DType dtype, bool gather,
                      const std::string& name);
  ~CopyEngineReduction();
  CopyEngineReduction(const CopyEngineReduction&) = delete;
  CopyEngineReduction& operator=(const CopyEngineReduction&) = delete;

  /// all-reduce: `output` holds `total` elements and must be symmetric;
  /// reduce-scatter: `output` holds this rank's slice (any device memory).
  /// `input` (total elements) may be any device memory. Graph-capturable.
  void run(const void* input, void* output, cudaStream_t stream);
  /// SMs of the local sum kernel.
  int sms() const { return sum_blocks_; }

 private:
  Context& ctx_;
  std::uint64_t total_, slice_;
  DType dtype_;
  bool gather_;
  int chunks_ = 1, sum_blocks_ = 1;
  SignalArray flags_;       // ready[W], arrived[W][K], reduced[W][K]
  SymmetricBuffer scratch_; // [W][slice]
  std::vector<Stream> side_;  // one per peer
  std::vector<Event> side_done_, chunk_summed_;
  Event fork_;
};

}  // namespace weft::ops_detail
