#include "path_choice.hpp"

#include "overlap.hpp"
#include "weft/core/error.hpp"
#include "weft/core/log.hpp"
#include "weft/core/timing.hpp"

namespace weft::ops_detail {

PathChoice::PathChoice(std::shared_ptr<Context> ctx, OverlapMode mode, std::string what, TileWaits* tile_waits,
                       bool nccl_path)
    : ctx_(std::move(ctx)),
      mode_(mode),
      what_(std::move(what)),
      tile_waits_(tile_waits),
      nccl_path_(nccl_path),
      graphs_(ctx_->settings().plan_graphs),
      trace_left_(ctx_->settings().trace_overlap) {}

void PathChoice::run(cudaStream_t stream, std::initializer_list<const void*> key, const std::function<void()>& first,
                     const std::vector<FusedPath>& fused, const std::function<void(bool nccl)>& sequential) {
  const int nf = static_cast<int>(fused.size());
  if (path_ < 0) {
    WEFT_REQUIRE(nf >= 1 || mode_ == OverlapMode::sequential,
                 what_, ": a plan that may fuse must name at least one fused path");
    fused_paths_ = nf;
    std::vector<Path> paths;
    for (int f = 0; f < nf; ++f)
      paths.push_back({fused[f].name, [&, f] {
                         if (tile_waits_) tile_waits_->count_call();
                         graphs_.launch(stream, f, key, fused[f].enqueue);
                       }});
    paths.push_back({"sequential", [&] { sequential(false); }});
    paths.push_back({"sequential, NCCL", [&] { sequential(true); }});
    std::vector<int> candidates;
    for (int i = 0; i < static_cast<int>(paths.size()); ++i) {
      // No NCCL path in the plan, or ranks sharing a GPU (NCCL cannot run there).
      if (i == nf + 1 && !(nccl_path_ && ctx_->has_nccl())) continue;
      if (mode_ == OverlapMode::automatic || (mode_ == OverlapMode::fused) == (i < nf)) candidates.push_back(i);
    }
    if (candidates.size() == 1 || capturing(stream)) {
      path_ = candidates.front();  // nothing to time, or no timing under capture: the first candidate
    } else {
      if (candidates.front() < nf) first();  // it may tune the fused paths' GEMMs: not built for sequential plans
      choose(paths, candidates, stream);
    }
    path_name_ = paths[path_].name;
  }
  if (path_ >= nf) {
    sequential(path_ == nf + 1);
    return;
  }
  if (tile_waits_) tile_waits_->count_call();
  if (trace_left_ > 0 && !capturing(stream)) {
    ctx_->barrier(stream);  // the ranks start together, as a layer's calls do after a collective
    trace::start(stream);
    try {
      fused[path_].enqueue(stream);
    } catch (...) {
      trace::abandon();
      throw;
    }
    trace::finish(stream, what_, ctx_->rank());
    --trace_left_;
    return;
  }
  graphs_.launch(stream, path_, key, fused[path_].enqueue);
}

void PathChoice::choose(const std::vector<Path>& paths, std::vector<int> candidates, cudaStream_t stream) {
  // A sample: a barrier, then three calls back to back (as a layer runs them),
  // so launch skew after the barrier weighs as little as in steady use.
  constexpr int kSamples = 8, kCallsPerSample = 3;
  for (int c : candidates) paths[c].call();  // warm-up
  ctx_->synchronize(stream);
  const std::size_t n = candidates.size();
  // Across nodes Context::barrier is weft::RemotePeers' (alive wherever a fused path runs there).
  auto barrier = [&] { ctx_->barrier(stream); };
  std::vector<float> medians = time_interleaved(
      n, [&](std::size_t c) { paths[candidates[c]].call(); }, kSamples, kCallsPerSample, stream, barrier);
  max_over_ranks(ctx_->store(), medians, "overlapped path timings");  // the slowest rank's, as the GEMM tuner does
  const std::size_t best = fastest_candidate(medians);
  std::string timings;
  for (std::size_t c = 0; c < n; ++c) {
    float& kept = candidates[c] < fused_paths_ ? fused_ms_ : sequential_ms_;
    if (kept == 0 || medians[c] < kept) kept = medians[c];
    timings += str(c ? ", " : "", paths[candidates[c]].name, " ", medians[c], " ms");
  }
  WEFT_LOG(info, what_, ": ", timings, ": runs ", paths[candidates[best]].name);
  path_ = candidates[best];
}

}  // namespace weft::ops_detail
