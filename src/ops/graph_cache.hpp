// graph_cache.hpp (private) - a fused call enqueued through a CUDA graph.
//
// A fused call is dozens of API calls (the "free" exchange, GEMM launches,
// copies, stream waits and writes per chunk); at small shapes enqueueing them
// takes as long as running them. So the first call of each path runs its
// enqueue directly (it may tune), and later calls capture it once per key (the
// call's operand pointers) on a private stream and launch the graph: one API
// call. Up to 8 graphs are kept; a plan whose pointers keep changing (16
// captures) goes back to enqueueing directly, as does a call made under the
// caller's own capture, or when graphs are off (WEFT_PLAN_GRAPHS=0). A plan with consumed flags runs
// on one stream at a time (docs/decisions/0023, 0024).
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <initializer_list>
#include <optional>
#include <vector>

#include "weft/core/cuda_resources.hpp"

namespace weft::ops_detail {

/// True while `stream` is being captured into a CUDA graph.
bool capturing(cudaStream_t stream);

class GraphCache {
 public:
  /// `use_graphs`: Settings::plan_graphs (WEFT_PLAN_GRAPHS=0: never).
  explicit GraphCache(bool use_graphs);
  ~GraphCache();
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;

  /// Enqueues one call of path `path` on `stream`: `enqueue(s)` puts the call
  /// on stream `s`. Directly on the path's first call, under the caller's
  /// capture, or once graphs are off; else through the graph captured for
  /// (`path`, `key`), captured now if there is none.
  void launch(cudaStream_t stream, int path, std::initializer_list<const void*> key,
              const std::function<void(cudaStream_t)>& enqueue);

 private:
  struct Cached {
    int path;
    std::vector<const void*> key;
    cudaGraphExec_t exec = nullptr;
  };
  bool use_graphs_ = true;
  int captures_ = 0;
  std::vector<bool> enqueued_once_;  // per path: its first call runs directly (it may tune)
  std::optional<Stream> capture_;    // made on the first capture
  std::vector<Cached> graphs_;
};

}  // namespace weft::ops_detail
