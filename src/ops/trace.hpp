// trace.hpp (private) - the overlapped plans' two diagnostics, both off by
// default and costing nothing then.
//
// WEFT_TRACE_OVERLAP=N: a plan's first N fused calls after its path choice run
// traced (PathChoice runs them): each logs its timeline at info level, every
// mark's time since the call started, in us. Plans mark where their streams
// reach a step (trace::mark(stream, "step 0 GEMM")).
//
// WEFT_TILE_WAITS=1: device counters, one per flag of a plan, that its hooked
// GEMMs add their tiles' waiting time to (RowSignals::waited_ns), logged when
// the plan is destroyed: how long tiles stalled on each chunk.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "weft/core/cuda_resources.hpp"

namespace weft::ops_detail {

namespace trace {
/// True inside a traced call: label-building code can skip its formatting otherwise.
bool recording();
/// Records where `stream` has reached, under `label`; nothing outside a traced call.
void mark(cudaStream_t stream, const std::string& label);
/// Starts a traced call: later marks are recorded, the first being "start".
void start(cudaStream_t stream);
/// Ends the traced call started last (marks "end" on `stream`, waits for it)
/// and logs its timeline at info level: "<what> trace, rank <rank>, us: | start 0 | ..."
/// (scripts/gpu_session.sh's trace stage reads that form).
void finish(cudaStream_t stream, const std::string& what, int rank);
/// Ends the traced call without a log (the call threw).
void abandon();
}  // namespace trace

/// WEFT_TILE_WAITS's counters for one plan: `flags` of them, indexed as its
/// flags; empty (null counter, nothing measured) unless `enabled`
/// (Settings::tile_waits).
class TileWaits {
 public:
  TileWaits(std::string what, int flags, bool enabled);
  ~TileWaits();  // logs the waits per fused call
  TileWaits(const TileWaits&) = delete;
  TileWaits& operator=(const TileWaits&) = delete;
  /// The counters (RowSignals::waited_ns), or null.
  unsigned long long* counters() const { return counters_.as<unsigned long long>(); }
  /// One more fused call ran (the log divides by their number).
  void count_call() { ++calls_; }

 private:
  std::string what_;
  int flags_ = 0;
  DeviceBuffer counters_;
  long long calls_ = 0;
};

}  // namespace weft::ops_detail
