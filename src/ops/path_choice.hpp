// path_choice.hpp (private) - which way an overlapped plan runs a call: one of
// its fused paths, its sequential path on weft's collective, or on NCCL's.
// OverlapMode::automatic times every candidate on the first call and keeps the
// fastest, the same on every rank; fused calls go through a GraphCache, and
// WEFT_TRACE_OVERLAP's traced calls through trace::.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "graph_cache.hpp"
#include "trace.hpp"
#include "weft/ops/collective.hpp"
#include "weft/runtime/context.hpp"

namespace weft::ops_detail {

/// One way to run the call fused: its path name ("fused", "fused, one
/// launch") and `enqueue(s)`, which puts the overlapped call on stream s.
struct FusedPath {
  std::string name;
  std::function<void(cudaStream_t)> enqueue;
};

class PathChoice {
 public:
  /// `mode` fixes the path now (fused, sequential) or on the first run
  /// (automatic); `what` names the plan in logs ("AgGemm 8192 x 14336 x
  /// 8192"); `tile_waits`, where given, counts the fused calls;
  /// `nccl_path`: whether the plan has a sequential path on NCCL (a
  /// candidate where the Context has NCCL).
  PathChoice(std::shared_ptr<Context> ctx, OverlapMode mode, std::string what, TileWaits* tile_waits = nullptr,
             bool nccl_path = true);

  /// Runs one call the chosen way, of these paths: each of `fused` (in order;
  /// each through the graph cache with `key`), "sequential"
  /// (`sequential(false)`: a plain GEMM, then weft's collective) and
  /// "sequential, NCCL" (where the plan has it and the Context has NCCL) (`sequential(true)`). The
  /// candidates: automatic, all of them; fused, the fused ones; sequential,
  /// the two sequential ones. On the first call outside graph capture with
  /// more than one candidate, `first` runs before anything else where a fused
  /// path is a candidate (a sequential run that fills the buffers, and
  /// tuning), then each candidate is warmed up once and timed by
  /// time_interleaved (weft/core/timing.hpp): 8 passes, alternating direction,
  /// each taking a sample of every candidate (a barrier across ranks, then 3
  /// calls back to back); each candidate's median, then its slowest rank's (so
  /// all ranks agree), the fastest kept and logged. Under capture the first
  /// call takes the first candidate untimed.
  void run(cudaStream_t stream, std::initializer_list<const void*> key, const std::function<void()>& first,
           const std::vector<FusedPath>& fused, const std::function<void(bool nccl)>& sequential);
  /// True once the path is a fused one.
  bool fused() const { return path_ >= 0 && path_ < fused_paths_; }
  /// The chosen path's name ("fused", "sequential", "sequential, NCCL", ...), or "" before the first run.
  const std::string& path() const { return path_name_; }
  /// The first automatic run's medians (ms, slowest rank): the fastest fused
  /// path, and the fastest sequential one; 0 where not timed.
  float fused_ms() const { return fused_ms_; }
  float sequential_ms() const { return sequential_ms_; }

 private:
  struct Path {
    std::string name;
    std::function<void()> call;
  };
  void choose(const std::vector<Path>& paths, std::vector<int> candidates, cudaStream_t stream);

  std::shared_ptr<Context> ctx_;
  OverlapMode mode_;
  std::string what_;
  TileWaits* tile_waits_;
  bool nccl_path_;
  GraphCache graphs_;
  int trace_left_;  // WEFT_TRACE_OVERLAP: fused calls still to trace
  int path_ = -1;   // [0, fused_paths_): fused; then sequential, sequential with NCCL; -1: undecided
  int fused_paths_ = 0;
  std::string path_name_;
  float fused_ms_ = 0, sequential_ms_ = 0;
};

}  // namespace weft::ops_detail
