#include "trace.hpp"

#include <algorithm>
#include <utility>
#include <vector>

#include "weft/core/error.hpp"
#include "weft/core/log.hpp"

namespace weft::ops_detail {
namespace {

// One traced call at a time per process (the call synchronises before it
// returns).
struct Recorder {
  bool recording = false;
  std::vector<std::pair<std::string, cudaEvent_t>> marks;
  std::vector<Event> events;  // reused by every traced call: a handful
} recorder;

}  // namespace

bool trace::recording() { return recorder.recording; }

void trace::mark(cudaStream_t stream, const std::string& label) {
  if (!recorder.recording) return;
  if (recorder.marks.size() == recorder.events.size()) recorder.events.emplace_back(Event::Timing::on);
  cudaEvent_t e = recorder.events[recorder.marks.size()];
  WEFT_CUDA(cudaEventRecord(e, stream));
  recorder.marks.emplace_back(label, e);
}

void trace::start(cudaStream_t stream) {
  recorder.recording = true;
  recorder.marks.clear();
  mark(stream, "start");
}

void trace::abandon() { recorder.recording = false; }

void trace::finish(cudaStream_t stream, const std::string& what, int rank) {
  mark(stream, "end");
  recorder.recording = false;
  WEFT_CUDA(cudaStreamSynchronize(stream));
  std::vector<std::pair<float, std::string>> at;
  for (const auto& [label, e] : recorder.marks) {
    WEFT_CUDA(cudaEventSynchronize(e));
    float ms = 0;
    WEFT_CUDA(cudaEventElapsedTime(&ms, recorder.marks.front().second, e));
    at.emplace_back(ms * 1000.0f, label);
  }
  std::stable_sort(at.begin(), at.end());
  std::string line;
  for (const auto& [us, label] : at) line += str(" | ", label, " ", static_cast<int>(us + 0.5f));
  WEFT_LOG(info, what, " trace, rank ", rank, ", us:", line);
}

TileWaits::TileWaits(std::string what, int flags, bool enabled) : what_(std::move(what)) {
  if (flags <= 0 || !enabled) return;
  counters_ = DeviceBuffer(static_cast<std::size_t>(flags) * sizeof(unsigned long long));
  WEFT_CUDA(cudaMemset(counters_.get(), 0, counters_.bytes()));
  flags_ = flags;
}

TileWaits::~TileWaits() {
  if (!counters_.get()) return;
  // Diagnostics only: a failed read is not worth a throw from a destructor.
  std::vector<unsigned long long> ns(static_cast<std::size_t>(flags_));
  if (cudaMemcpy(ns.data(), counters_.get(), ns.size() * sizeof(ns[0]), cudaMemcpyDeviceToHost) != cudaSuccess)
    return;
  const double per = calls_ > 0 ? 1e3 * static_cast<double>(calls_) : 1e3;
  double total = 0;
  std::string each;
  for (std::size_t f = 0; f < ns.size(); ++f) {
    total += static_cast<double>(ns[f]) / per;
    each += str(f ? " " : "", static_cast<double>(ns[f]) / per);
  }
  if (total > 0)
    WEFT_LOG(info, what_, ": tiles waited ", total, " us ",
             calls_ > 0 ? str("per fused call (", calls_, " calls)") : std::string("in all"),
             ", summed over the waiting tiles; per flag: ", each);
}

}  // namespace weft::ops_detail
