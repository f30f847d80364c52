#include "graph_cache.hpp"

#include <algorithm>

#include "weft/core/error.hpp"
#include "weft/core/log.hpp"

namespace weft::ops_detail {

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  WEFT_CUDA(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

GraphCache::GraphCache(bool use_graphs) : use_graphs_(use_graphs) {}

GraphCache::~GraphCache() {
  for (Cached& g : graphs_) cudaGraphExecDestroy(g.exec);
}

void GraphCache::launch(cudaStream_t stream, int path, std::initializer_list<const void*> key,
                        const std::function<void(cudaStream_t)>& enqueue) {
  constexpr std::size_t kMaxGraphs = 8;
  constexpr int kMaxCaptures = 16;
  if (static_cast<int>(enqueued_once_.size()) <= path) enqueued_once_.resize(static_cast<std::size_t>(path) + 1);
  if (!use_graphs_ || !enqueued_once_[path] || capturing(stream)) {
    enqueue(stream);  // the first call tunes its GEMMs: that cannot happen under capture
    enqueued_once_[path] = true;
    return;
  }
  auto hit = std::find_if(graphs_.begin(), graphs_.end(), [&](const Cached& g) {
    return g.path == path && std::equal(g.key.begin(), g.key.end(), key.begin(), key.end());
  });
  if (hit == graphs_.end()) {
    if (++captures_ > kMaxCaptures) {
      WEFT_LOG(info, "overlapped plan: operand pointers changed ", kMaxCaptures,
               " times; enqueueing calls directly from now on");
      use_graphs_ = false;
      for (Cached& g : graphs_) WEFT_CUDA(cudaGraphExecDestroy(g.exec));
      graphs_.clear();
      enqueue(stream);
      return;
    }
    if (!capture_) capture_.emplace();
    cudaGraph_t graph = nullptr;
    WEFT_CUDA(cudaStreamBeginCapture(*capture_, cudaStreamCaptureModeRelaxed));
    try {
      enqueue(*capture_);
    } catch (...) {
      cudaStreamEndCapture(*capture_, &graph);
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    WEFT_CUDA(cudaStreamEndCapture(*capture_, &graph));
    Cached g{path, std::vector<const void*>(key), nullptr};
    const cudaError_t instantiated = cudaGraphInstantiate(&g.exec, graph, 0);
    cudaGraphDestroy(graph);
    WEFT_CUDA(instantiated);
    if (graphs_.size() == kMaxGraphs) {
      WEFT_CUDA(cudaGraphExecDestroy(graphs_.front().exec));
      graphs_.erase(graphs_.begin());
    }
    graphs_.push_back(g);
    hit = graphs_.end() - 1;
  }
  WEFT_CUDA(cudaGraphLaunch(hit->exec, stream));
}

}  // namespace weft::ops_detail
