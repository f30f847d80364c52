#include "overlap.hpp"

#include <algorithm>
#include <vector>

#include "weft/core/driver.hpp"
#include "weft/core/error.hpp"
#include "weft/device.cuh"

namespace weft::ops_detail {
namespace {

__global__ void handshake_kernel(dev::World w, std::uint64_t* flags, dev::LaunchEpoch e, std::uint64_t* reset,
                                 int reset_count) {
  __shared__ std::uint64_t epoch;
  for (int i = static_cast<int>(threadIdx.x); i < reset_count; i += blockDim.x) reset[i] = 0;
  if (threadIdx.x == 0) {
    epoch = *e.value + 1;
    *e.value = epoch;
  }
  __syncthreads();
  dev::fence_sc(dev::Scope::sys);  // this stream's earlier work is done and visible before peers hear of it
  const int p = static_cast<int>(threadIdx.x);
  if (p < w.size && p != w.rank) {
    dev::notify(w, flags + w.rank, p, epoch, dev::SignalOp::set, dev::Scope::sys);
    dev::wait_until(w, flags + p, dev::Cmp::ge, epoch, dev::Scope::sys, p);
  }
}

__global__ void wait_all_kernel(dev::World w, const std::uint64_t* flags, int count, int per_rank) {
  for (int i = static_cast<int>(threadIdx.x); i < count; i += blockDim.x) {
    const int from = i / per_rank;
    if (from != w.rank) dev::wait_until(w, flags + i, dev::Cmp::ge, 1, dev::Scope::sys, from);
  }
}

}  // namespace

const char* to_string(OverlapPath p) { return p == OverlapPath::fused ? "fused" : "sequential"; }

std::int64_t even_chunks(std::int64_t rows, std::int64_t want) {
  for (std::int64_t c = std::max<std::int64_t>(1, std::min(want, rows)); c > 1; --c)
    if (rows % c == 0) return c;
  return 1;
}

Overlap::Overlap(std::shared_ptr<Context> ctx, const std::string& name)
    : ctx_(std::move(ctx)), ready_(ctx_->heap(), ctx_->world_size(), name + ".ready") {
  WEFT_REQUIRE(ctx_->world_size() <= 1024, "overlapped operators support up to 1024 ranks, got ",
               ctx_->world_size());
  WEFT_CUDA(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
  WEFT_CUDA(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
  WEFT_CUDA(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming));
}

Overlap::~Overlap() {
  if (join_) cudaEventDestroy(join_);
  if (fork_) cudaEventDestroy(fork_);
  if (side_) cudaStreamDestroy(side_);
}

void Overlap::handshake(cudaStream_t stream, std::uint64_t* reset, int reset_count) {
  const int threads = std::max(128, ((ctx_->world_size() + 31) / 32) * 32);
  handshake_kernel<<<1, threads, 0, stream>>>(ctx_->world(), ready_.flags(), ready_.launch_epoch(), reset,
                                              reset_count);
  WEFT_CUDA(cudaGetLastError());
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

void Overlap::raise(std::uint64_t* flag, std::uint64_t value, cudaStream_t stream) {
  WEFT_CU(driver().cuStreamWriteValue64(stream, reinterpret_cast<CUdeviceptr>(flag), value, 0));
}

void Overlap::wait_all(const std::uint64_t* flags, int count, int per_rank, cudaStream_t stream) {
  wait_all_kernel<<<1, 256, 0, stream>>>(ctx_->world(), flags, count, per_rank);
  WEFT_CUDA(cudaGetLastError());
}

OverlapPath Overlap::choose(const std::function<void()>& fused, const std::function<void()>& sequential,
                            cudaStream_t stream, float* fused_ms, float* sequential_ms, int runs) {
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
  fused();
  sequential();
  ctx_->synchronize(stream);
  std::vector<float> f, s;
  for (int i = 0; i < runs; ++i) {  // interleaved, so drifting clocks hit both alike
    f.push_back(time_one(fused));
    s.push_back(time_one(sequential));
  }
  std::sort(f.begin(), f.end());
  std::sort(s.begin(), s.end());
  float* both = nullptr;
  WEFT_CUDA(cudaMalloc(&both, 2 * sizeof(float)));
  const float host[2] = {f[f.size() / 2], s[s.size() / 2]};
  WEFT_CUDA(cudaMemcpyAsync(both, host, sizeof host, cudaMemcpyHostToDevice, stream));
  WEFT_NCCL(ncclAllReduce(both, both, 2, ncclFloat, ncclMax, ctx_->nccl(), stream));
  float agreed[2];
  WEFT_CUDA(cudaMemcpyAsync(agreed, both, sizeof agreed, cudaMemcpyDeviceToHost, stream));
  ctx_->synchronize(stream);
  WEFT_CUDA(cudaFree(both));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (fused_ms) *fused_ms = agreed[0];
  if (sequential_ms) *sequential_ms = agreed[1];
  return agreed[0] <= agreed[1] ? OverlapPath::fused : OverlapPath::sequential;
}

}  // namespace weft::ops_detail
