#include "overlap.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "schedule.hpp"
#include "weft/core/driver.hpp"
#include "weft/core/env.hpp"
#include "weft/core/error.hpp"
#include "weft/core/log.hpp"
#include "weft/device.cuh"

namespace weft::ops_detail {
namespace {

// consume: each flag goes back to 0 once seen (this kernel is its only reader).
__global__ void wait_all_kernel(dev::World w, std::uint64_t* flags, int count, int per_rank, int first_rank,
                                bool consume) {
  for (int i = static_cast<int>(threadIdx.x); i < count; i += blockDim.x) {
    const int from = first_rank + i / per_rank;
    if (from == w.rank) continue;
    dev::wait_until(w, flags + i, dev::Cmp::ge, 1, dev::Scope::sys, from);
    // As RowWait::count_out(): no peer raises this flag again before our next run's "free".
    if (consume) dev::st_relaxed(flags + i, 0, dev::Scope::sys);
  }
}

// WEFT_TRACE_OVERLAP's recorder: one traced call at a time per process (the
// call synchronises before it returns), nested plans included.
struct Trace {
  bool recording = false;
  std::vector<std::pair<std::string, cudaEvent_t>> marks;
  std::vector<cudaEvent_t> events;
} trace;

}  // namespace

void max_over_ranks(Store& store, std::vector<float>& values, const char* what) {
  const std::string mine(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  const std::vector<std::string> all = store.all_gather(mine, what);
  if (std::any_of(all.begin(), all.end(), [&](const std::string& b) { return b.size() != mine.size(); })) {
    std::string counts;  // the same text on every rank
    for (std::size_t r = 0; r < all.size(); ++r)
      counts += str(r ? ", " : "", "rank ", r, " ", all[r].size() / sizeof(float));
    WEFT_FAIL(what, ": the ranks gave different numbers of values (", counts, "); they must make the same call");
  }
  for (const std::string& theirs : all)
    for (std::size_t i = 0; i < values.size(); ++i) {
      float v = 0;
      std::memcpy(&v, theirs.data() + i * sizeof(float), sizeof(float));
      values[i] = std::max(values[i], v);
    }
}

std::function<void(std::vector<float>&)> slowest_rank(std::shared_ptr<Context> ctx) {
  return [ctx](std::vector<float>& ms) { max_over_ranks(ctx->store(), ms, "GEMM tuning timings"); };
}

int sms_beside_copies(const Context& ctx) {
  if (!ctx.team().shares_gpus()) return 0;
  return std::max(2, ctx.team().sm_count / 2 / 2 * 2);  // whole clusters of 2
}

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  WEFT_CUDA(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

PlanShape require_shape(const char* who, std::int64_t m, std::int64_t n, std::int64_t k, DType dtype) {
  WEFT_REQUIRE(m > 0 && n > 0 && k > 0, who, ": M, N, K must be positive, got ", m, " x ", n, " x ", k);
  WEFT_REQUIRE(dtype == DType::bf16 || dtype == DType::fp16, who,
               ": dtype must be bf16 or fp16 (the hooked GEMM kernels' types), got ", to_string(dtype));
  return {m, n, k, dtype};
}

RowChunks plan_rows(const char* who, const PlanShape& shape, int chunks_wanted, int world, std::int64_t row_bytes,
                    std::int64_t min_chunk_bytes) {
  const std::int64_t m = shape.m;
  WEFT_REQUIRE(m % world == 0, who, ": M = ", m, " must be a multiple of the world size ", world,
               " (each rank owns M / W rows)");
  WEFT_REQUIRE(chunks_wanted >= 1, who, ": chunks per rank must be >= 1, got ", chunks_wanted);
  RowChunks r;
  r.rows_per_rank = m / world;
  // WEFT_OVERLAP_MIN_CHUNK overrides the plan's floor, for measuring chunk sizes.
  const std::int64_t min_chunk = static_cast<std::int64_t>(
      env_bytes(process_env(), "WEFT_OVERLAP_MIN_CHUNK", static_cast<std::uint64_t>(min_chunk_bytes)));
  r.chunks = schedule::copy_chunks(r.rows_per_rank, row_bytes, chunks_wanted, min_chunk);
  r.chunk_rows = r.rows_per_rank / r.chunks;
  return r;
}

std::string untileable_reason(const GemmOptions& g) {
  std::string why;
  Gemm::can_tile(g, &why);
  return why;
}

OverlapMode runnable_mode(const char* who, std::int64_t m, std::int64_t n, std::int64_t k, OverlapMode requested,
                          const std::string& why_not_fused) {
  if (why_not_fused.empty() || requested == OverlapMode::sequential) return requested;
  WEFT_LOG(info, who, " ", m, " x ", n, " x ", k, ": ", why_not_fused, "; runs the sequential path (cuBLAS and the collective)");
  return OverlapMode::sequential;
}

std::string plan_description(const char* who, std::int64_t m, std::int64_t n, std::int64_t k, DType dtype,
                             BLayout layout, OverlapMode mode) {
  return str(who, " plan: ", m, " x ", n, " x ", k, " ", to_string(dtype), ", B ",
             layout == BLayout::nk ? "[N,K]" : "[K,N]", ", ", to_string(mode));
}

void require_operands(const char* who, std::initializer_list<const void*> operands, unsigned alignment) {
  for (const void* p : operands) {
    WEFT_REQUIRE(p, who, ": every operand must be a device pointer, got a null one");
    WEFT_REQUIRE(reinterpret_cast<std::uintptr_t>(p) % alignment == 0, who, ": ", p, " is not ", alignment,
                 "-byte aligned", alignment == 16 ? " (TMA needs 16-byte aligned matrices)" : " (one element)");
  }
}

Overlap::Overlap(std::shared_ptr<Context> ctx, const std::string& name, OverlapMode mode, std::string what)
    : ctx_(std::move(ctx)),
      ready_(ctx_->heap(), static_cast<std::uint64_t>(ctx_->world_size()) * sizeof(std::uint64_t), "u64",
             name + ".ready"),
      mode_(mode),
      what_(std::move(what)) {
  use_graphs_ = env_int(process_env(), "WEFT_PLAN_GRAPHS", 1) != 0;
  const std::string reset = env_str(process_env(), "WEFT_FLAG_RESET").value_or("consume");
  WEFT_REQUIRE(reset == "consume" || reset == "memset", "WEFT_FLAG_RESET must be 'consume' or 'memset', got '", reset,
               "'");
  reset_by_memset_ = reset == "memset";
  trace_left_ = static_cast<int>(env_int(process_env(), "WEFT_TRACE_OVERLAP", 0));
  WEFT_REQUIRE(ctx_->world_size() <= 1024, "overlapped operators support up to 1024 ranks, got ",
               ctx_->world_size());
  WEFT_CUDA(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
  WEFT_CUDA(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
  WEFT_CUDA(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming));
}

void Overlap::count_tile_waits(int flags) {
  if (tile_waits_ || flags <= 0 || env_int(process_env(), "WEFT_TILE_WAITS", 0) == 0) return;
  WEFT_CUDA(cudaMalloc(&tile_waits_, static_cast<std::size_t>(flags) * sizeof(unsigned long long)));
  WEFT_CUDA(cudaMemset(tile_waits_, 0, static_cast<std::size_t>(flags) * sizeof(unsigned long long)));
  tile_wait_flags_ = flags;
}

Overlap::~Overlap() {
  if (tile_waits_) {  // diagnostics only: a failed read is not worth a throw from a destructor
    std::vector<unsigned long long> ns(static_cast<std::size_t>(tile_wait_flags_));
    if (cudaMemcpy(ns.data(), tile_waits_, ns.size() * sizeof(ns[0]), cudaMemcpyDeviceToHost) == cudaSuccess) {
      // Per call where this plan counts its calls; in all for a plan run by
      // an enclosing one (GemmAr's GemmRs), whose calls it does not count.
      const double per = fused_calls_ > 0 ? 1e3 * static_cast<double>(fused_calls_) : 1e3;
      double total = 0;
      std::string each;
      for (std::size_t f = 0; f < ns.size(); ++f) {
        total += static_cast<double>(ns[f]) / per;
        each += str(f ? " " : "", static_cast<double>(ns[f]) / per);
      }
      if (total > 0)
        WEFT_LOG(info, what_, ": tiles waited ", total, " us ",
                 fused_calls_ > 0 ? str("per fused call (", fused_calls_, " calls)") : std::string("in all"),
                 ", summed over the waiting tiles; per flag: ", each);
    }
    cudaFree(tile_waits_);
  }
  for (CachedGraph& g : graphs_) cudaGraphExecDestroy(g.exec);
  if (capture_) cudaStreamDestroy(capture_);
  if (join_) cudaEventDestroy(join_);
  if (fork_) cudaEventDestroy(fork_);
  if (side_) cudaStreamDestroy(side_);
}

cudaStream_t Overlap::begin(cudaStream_t stream, std::uint64_t* reset, int reset_count) {
  const int world = ctx_->world_size(), me = ctx_->rank();
  if (reset_count > 0) reset_flags(reset, reset_count, stream);
  auto* ready = ready_.as<std::uint64_t>();
  // "Free" goes from the side stream, forked after the reset and the caller's
  // last use of its buffers: the GEMM enqueued next on `stream` waits for
  // nothing but the reset. Flags 0: the write waits until the writes before
  // the fork are visible to the peer.
  cudaStream_t side = fork(stream);
  for (int p = 0; p < world; ++p)
    if (p != me)
      WEFT_CU(driver().cuStreamWriteValue64(
          side, reinterpret_cast<CUdeviceptr>(static_cast<std::uint64_t*>(ctx_->heap().peer_ptr(ready + me, p))), 1,
          0));
  for (int p = 0; p < world; ++p) {
    if (p == me) continue;
    const auto flag = reinterpret_cast<CUdeviceptr>(ready + p);
    WEFT_CU(driver().cuStreamWaitValue64(side, flag, 1, CU_STREAM_WAIT_VALUE_GEQ));
    WEFT_CU(driver().cuStreamWriteValue64(side, flag, 0, 0));
  }
  return side;
}

void Overlap::reset_flags(std::uint64_t* flags, int count, cudaStream_t stream) {
  // A memset (a small kernel, ~1.5 us ahead of what follows it). Front-end
  // writes (cuStreamBatchMemOp) cost ~0.8 us each (weft-launch-probe).
  WEFT_CUDA(cudaMemsetAsync(flags, 0, static_cast<std::size_t>(count) * sizeof(std::uint64_t), stream));
}

cudaStream_t Overlap::fork(cudaStream_t stream) {
  WEFT_CUDA(cudaEventRecord(fork_, stream));
  WEFT_CUDA(cudaStreamWaitEvent(side_, fork_, 0));
  return side_;
}

void Overlap::join(cudaStream_t stream) {
  WEFT_CUDA(cudaEventRecord(join_, side_));
  WEFT_CUDA(cudaStreamWaitEvent(stream, join_, 0));
}

namespace {
/// flags[c] = 1 from `side`'s front end, once the work before it on `side` is done (no SM needed).
void raise_flag(std::uint64_t* flags, std::int64_t c, cudaStream_t side) {
  if (flags) WEFT_CU(driver().cuStreamWriteValue64(side, reinterpret_cast<CUdeviceptr>(flags + c), 1, 0));
}
}  // namespace

void Overlap::push_chunk(void* dst, const void* src, std::uint64_t chunk_bytes, std::int64_t c, std::uint64_t* flags,
                         cudaStream_t side) {
  const std::uint64_t off = static_cast<std::uint64_t>(c) * chunk_bytes;
  WEFT_CUDA(cudaMemcpyAsync(static_cast<char*>(dst) + off, static_cast<const char*>(src) + off, chunk_bytes,
                            cudaMemcpyDeviceToDevice, side));
  raise_flag(flags, c, side);
}

void Overlap::push_column_band(void* dst, const void* src, std::int64_t rows, std::uint64_t row_bytes,
                               std::uint64_t band_bytes, std::int64_t c, std::uint64_t* flags, cudaStream_t side) {
  const std::uint64_t off = static_cast<std::uint64_t>(c) * band_bytes;
  WEFT_CUDA(cudaMemcpy2DAsync(static_cast<char*>(dst) + off, row_bytes, static_cast<const char*>(src) + off, row_bytes,
                              band_bytes, static_cast<std::size_t>(rows), cudaMemcpyDeviceToDevice, side));
  raise_flag(flags, c, side);
}

void Overlap::push_chunk_when_stored(void* dst, const void* src, std::uint64_t chunk_bytes, std::int64_t c,
                                     const std::uint64_t* done, std::uint64_t done_value, std::uint64_t* flags,
                                     cudaStream_t side) {
  WEFT_CU(driver().cuStreamWaitValue64(side, reinterpret_cast<CUdeviceptr>(done + c), done_value,
                                       CU_STREAM_WAIT_VALUE_GEQ));
  push_chunk(dst, src, chunk_bytes, c, flags, side);
}

void Overlap::run(cudaStream_t stream, std::initializer_list<const void*> key, const std::function<void()>& first,
                  const std::vector<Fused>& fused, const std::function<void(bool nccl)>& sequential) {
  const int nf = static_cast<int>(fused.size());
  if (path_ < 0) {
    WEFT_REQUIRE(nf >= 1 || mode_ == OverlapMode::sequential,
                 "Overlap::run: a plan that may fuse must name at least one fused path");
    fused_paths_ = nf;
    enqueued_once_.assign(nf, false);
    std::vector<Path> paths;
    for (int f = 0; f < nf; ++f) paths.push_back({fused[f].name, [&, f] { launch(stream, f, key, fused[f].enqueue); }});
    paths.push_back({"sequential", [&] { sequential(false); }});
    paths.push_back({"sequential, NCCL", [&] { sequential(true); }});
    std::vector<int> candidates;
    for (int i = 0; i < static_cast<int>(paths.size()); ++i) {
      if (i == nf + 1 && !ctx_->has_nccl()) continue;  // ranks sharing a GPU: NCCL cannot run
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
  } else if (trace_left_ > 0 && !capturing(stream)) {
    ctx_->barrier(stream);  // the ranks start together, as a layer's calls do after a collective
    trace.recording = true;
    trace.marks.clear();
    mark(stream, "start");
    try {
      fused[path_].enqueue(stream);
    } catch (...) {
      trace.recording = false;
      throw;
    }
    mark(stream, "end");
    trace.recording = false;
    print_trace(stream);
    --trace_left_;
  } else {
    launch(stream, path_, key, fused[path_].enqueue);
  }
}

bool Overlap::recording() { return trace.recording; }

void Overlap::mark(cudaStream_t stream, const std::string& label) {
  if (!trace.recording) return;
  if (trace.marks.size() == trace.events.size()) {
    cudaEvent_t e = nullptr;
    WEFT_CUDA(cudaEventCreate(&e));
    trace.events.push_back(e);  // kept for the process: a handful of events
  }
  cudaEvent_t e = trace.events[trace.marks.size()];
  WEFT_CUDA(cudaEventRecord(e, stream));
  trace.marks.emplace_back(label, e);
}

void Overlap::print_trace(cudaStream_t stream) {
  WEFT_CUDA(cudaStreamSynchronize(stream));
  std::vector<std::pair<float, std::string>> at;
  for (const auto& [label, e] : trace.marks) {
    WEFT_CUDA(cudaEventSynchronize(e));
    float ms = 0;
    WEFT_CUDA(cudaEventElapsedTime(&ms, trace.marks.front().second, e));
    at.emplace_back(ms * 1000.0f, label);
  }
  std::stable_sort(at.begin(), at.end());
  std::string line;
  for (const auto& [us, label] : at) line += str(" | ", label, " ", static_cast<int>(us + 0.5f));
  WEFT_LOG(info, what_, " trace, rank ", ctx_->rank(), ", us:", line);
}

void Overlap::launch(cudaStream_t stream, int path, std::initializer_list<const void*> key,
                     const std::function<void(cudaStream_t)>& enqueue) {
  constexpr std::size_t kMaxGraphs = 8;
  constexpr int kMaxCaptures = 16;
  ++fused_calls_;
  if (!use_graphs_ || !enqueued_once_[path] || capturing(stream)) {
    enqueue(stream);  // the first call tunes its GEMMs: that cannot happen under capture
    enqueued_once_[path] = true;
    return;
  }
  auto hit = std::find_if(graphs_.begin(), graphs_.end(), [&](const CachedGraph& g) {
    return g.path == path && std::equal(g.key.begin(), g.key.end(), key.begin(), key.end());
  });
  if (hit == graphs_.end()) {
    if (++captures_ > kMaxCaptures) {
      WEFT_LOG(info, "overlapped plan: operand pointers changed ", kMaxCaptures,
               " times; enqueueing calls directly from now on");
      use_graphs_ = false;
      for (CachedGraph& g : graphs_) WEFT_CUDA(cudaGraphExecDestroy(g.exec));
      graphs_.clear();
      enqueue(stream);
      return;
    }
    if (!capture_) WEFT_CUDA(cudaStreamCreateWithFlags(&capture_, cudaStreamNonBlocking));
    cudaGraph_t graph = nullptr;
    WEFT_CUDA(cudaStreamBeginCapture(capture_, cudaStreamCaptureModeRelaxed));
    try {
      enqueue(capture_);
    } catch (...) {
      cudaStreamEndCapture(capture_, &graph);
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    WEFT_CUDA(cudaStreamEndCapture(capture_, &graph));
    CachedGraph g{path, std::vector<const void*>(key), nullptr};
    WEFT_CUDA(cudaGraphInstantiate(&g.exec, graph, 0));
    WEFT_CUDA(cudaGraphDestroy(graph));
    if (graphs_.size() == kMaxGraphs) {
      WEFT_CUDA(cudaGraphExecDestroy(graphs_.front().exec));
      graphs_.erase(graphs_.begin());
    }
    graphs_.push_back(g);
    hit = graphs_.end() - 1;
  }
  WEFT_CUDA(cudaGraphLaunch(hit->exec, stream));
}

void Overlap::wait_all(std::uint64_t* flags, int count, int per_rank, cudaStream_t stream, bool consume) {
  wait_all_kernel<<<1, 256, 0, stream>>>(ctx_->world(), flags, count, per_rank, 0, consume);
  WEFT_CUDA(cudaGetLastError());
}

void Overlap::wait_from(std::uint64_t* flags, int count, int from_rank, cudaStream_t stream, bool consume) {
  wait_all_kernel<<<1, 256, 0, stream>>>(ctx_->world(), flags, count, count, from_rank, consume);
  WEFT_CUDA(cudaGetLastError());
}

void Overlap::choose(const std::vector<Path>& paths, const std::vector<int>& candidates, cudaStream_t stream) {
  constexpr int runs = 7;
  cudaEvent_t start, stop;
  WEFT_CUDA(cudaEventCreate(&start));
  WEFT_CUDA(cudaEventCreate(&stop));
  // A sample: a barrier, then three calls back to back (as a layer runs them),
  // so launch skew after the barrier weighs as little as in steady use.
  constexpr int kCalls = 3;
  auto time_one = [&](const std::function<void()>& fn) {
    ctx_->barrier(stream);
    WEFT_CUDA(cudaEventRecord(start, stream));
    for (int i = 0; i < kCalls; ++i) fn();
    WEFT_CUDA(cudaEventRecord(stop, stream));
    ctx_->synchronize(stream);
    float ms = 0;
    WEFT_CUDA(cudaEventElapsedTime(&ms, start, stop));
    return ms / kCalls;
  };
  for (int c : candidates) paths[c].call();  // warm-up
  ctx_->synchronize(stream);
  const std::size_t n = candidates.size();
  std::vector<std::vector<float>> samples(n);
  for (int i = 0; i < runs; ++i)  // interleaved, so drifting clocks hit all alike
    for (std::size_t c = 0; c < n; ++c) samples[c].push_back(time_one(paths[candidates[c]].call));
  std::vector<float> medians(n);
  for (std::size_t c = 0; c < n; ++c) {
    std::sort(samples[c].begin(), samples[c].end());
    medians[c] = samples[c][samples[c].size() / 2];
  }
  max_over_ranks(ctx_->store(), medians, "overlapped path timings");  // the slowest rank's, as the GEMM tuner does
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::size_t best = 0;
  std::string timings;
  for (std::size_t c = 0; c < n; ++c) {
    if (medians[c] < medians[best]) best = c;
    float& kept = candidates[c] < fused_paths_ ? fused_ms_ : sequential_ms_;
    if (kept == 0 || medians[c] < kept) kept = medians[c];
    timings += str(c ? ", " : "", paths[candidates[c]].name, " ", medians[c], " ms");
  }
  WEFT_LOG(info, what_, ": ", timings, ": runs ", paths[candidates[best]].name);
  path_ = candidates[best];
}

}  // namespace weft::ops_detail
