// weft-launch-probe: what do a fused call's wrappings cost on the GPU's timeline?
//
//   weft-launch-probe          (one GPU; no ranks needed)
//
// An overlapped plan's call is, on its stream, a memset of its flags, then the
// GEMM, with a side stream forked after the memset (copies, front-end flag
// writes) and joined after the GEMM; the benchmarked calls replay it as a
// CUDA graph. The ideal it is held to is the GEMM alone, launched the plain
// way. This probe times back-to-back calls of a kernel that keeps every SM
// busy for a fixed time, wrapped each of those ways, and prints what each
// wrapping adds per call (median of 7 rounds of 100 calls, CUDA events),
// against the bare kernel.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "weft/core/gpu_diagnosis.hpp"
#include "weft/core/driver.hpp"
#include "weft/core/error.hpp"
#include "weft/device/memory.cuh"

namespace {

using weft::driver;

/// Every block spins until `ns` have passed since it started: a stand-in for
/// a GEMM that fills the GPU for a known time.
__global__ void busy_for(std::uint64_t ns) {
  if (threadIdx.x != 0) return;
  const std::uint64_t t0 = weft::dev::globaltimer_ns();
  while (weft::dev::globaltimer_ns() - t0 < ns) {
  }
}

constexpr int kCalls = 100, kRounds = 7, kFlags = 16;

struct Probe {
  cudaStream_t stream = nullptr, side = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr, start = nullptr, stop = nullptr;
  std::uint64_t* flags = nullptr;  // [0, kFlags): reset each call; [kFlags]: stays 1 (a peer's "free")
  char *copy_src = nullptr, *copy_dst = nullptr;
  std::size_t copy_bytes = 16u << 20;  // a 2048 x 8192 AllGather shard's half
  int sms = 0;
  std::uint64_t kernel_ns = 0;

  void kernel(cudaStream_t s) const { busy_for<<<sms, 128, 0, s>>>(kernel_ns); }
  void reset_memset(cudaStream_t s) const { WEFT_CUDA(cudaMemsetAsync(flags, 0, kFlags * 8, s)); }
  void reset_memops(cudaStream_t s) const {
    CUstreamBatchMemOpParams ops[kFlags] = {};
    for (int i = 0; i < kFlags; ++i) {
      ops[i].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
      ops[i].writeValue.address = reinterpret_cast<CUdeviceptr>(flags + i);
      ops[i].writeValue.value64 = 0;
    }
    WEFT_CU(driver().cuStreamBatchMemOp(s, kFlags, ops, 0));
  }
  /// The side stream's work of a fused call: "free", the peer's "free"
  /// (already up), a copy, its flag.
  void side_work(cudaStream_t s) const {
    WEFT_CU(driver().cuStreamWriteValue64(s, reinterpret_cast<CUdeviceptr>(flags + 1), 1, 0));
    WEFT_CU(driver().cuStreamWaitValue64(s, reinterpret_cast<CUdeviceptr>(flags + kFlags), 1,
                                         CU_STREAM_WAIT_VALUE_GEQ));
    WEFT_CUDA(cudaMemcpyAsync(copy_dst, copy_src, copy_bytes, cudaMemcpyDeviceToDevice, s));
    WEFT_CU(driver().cuStreamWriteValue64(s, reinterpret_cast<CUdeviceptr>(flags + 2), 1, 0));
  }
  void fused_shape(cudaStream_t s) const {
    reset_memset(s);
    WEFT_CUDA(cudaEventRecord(fork, s));
    WEFT_CUDA(cudaStreamWaitEvent(side, fork, 0));
    side_work(side);
    kernel(s);
    WEFT_CUDA(cudaEventRecord(join, side));
    WEFT_CUDA(cudaStreamWaitEvent(s, join, 0));
  }

  /// One call of `enqueue`, captured (as GraphCache::launch captures a fused call).
  cudaGraphExec_t capture(const std::function<void(cudaStream_t)>& enqueue) const {
    cudaStream_t cap = nullptr;
    WEFT_CUDA(cudaStreamCreateWithFlags(&cap, cudaStreamNonBlocking));
    cudaGraph_t graph = nullptr;
    WEFT_CUDA(cudaStreamBeginCapture(cap, cudaStreamCaptureModeRelaxed));
    enqueue(cap);
    WEFT_CUDA(cudaStreamEndCapture(cap, &graph));
    cudaGraphExec_t exec = nullptr;
    WEFT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    WEFT_CUDA(cudaGraphDestroy(graph));
    WEFT_CUDA(cudaStreamDestroy(cap));
    return exec;
  }

  /// Median over rounds of microseconds per call.
  double time(const std::function<void()>& call) const {
    std::vector<double> us;
    for (int r = 0; r < kRounds + 1; ++r) {
      WEFT_CUDA(cudaStreamSynchronize(stream));
      busy_for<<<1, 32, 0, stream>>>(30000000);  // 30 ms: the host enqueues every call while this runs
      WEFT_CUDA(cudaEventRecord(start, stream));
      for (int c = 0; c < kCalls; ++c) call();
      WEFT_CUDA(cudaEventRecord(stop, stream));
      WEFT_CUDA(cudaEventSynchronize(stop));
      float ms = 0;
      WEFT_CUDA(cudaEventElapsedTime(&ms, start, stop));
      if (r > 0) us.push_back(1000.0 * ms / kCalls);
    }
    std::sort(us.begin(), us.end());
    return us[us.size() / 2];
  }
};

}  // namespace

int main() {
  try {
    const weft::GpuDiagnosis gpus = weft::diagnose_gpus();  // names a missing GPU, an old driver, a GPU that is not Hopper
    WEFT_REQUIRE(gpus.verdict == weft::GpuVerdict::ready, gpus.message);
    Probe p;
    int device = 0;
    WEFT_CUDA(cudaGetDevice(&device));
    WEFT_CUDA(cudaDeviceGetAttribute(&p.sms, cudaDevAttrMultiProcessorCount, device));
    WEFT_CUDA(cudaStreamCreateWithFlags(&p.stream, cudaStreamNonBlocking));
    WEFT_CUDA(cudaStreamCreateWithFlags(&p.side, cudaStreamNonBlocking));
    for (cudaEvent_t* e : {&p.fork, &p.join}) WEFT_CUDA(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
    for (cudaEvent_t* e : {&p.start, &p.stop}) WEFT_CUDA(cudaEventCreate(e));
    WEFT_CUDA(cudaMalloc(&p.flags, (kFlags + 1) * 8));
    WEFT_CUDA(cudaMemset(p.flags, 0, kFlags * 8));
    const std::uint64_t one = 1;
    WEFT_CUDA(cudaMemcpy(p.flags + kFlags, &one, 8, cudaMemcpyHostToDevice));
    WEFT_CUDA(cudaMalloc(&p.copy_src, p.copy_bytes));
    WEFT_CUDA(cudaMalloc(&p.copy_dst, p.copy_bytes));
    WEFT_CUDA(cudaMemset(p.copy_src, 7, p.copy_bytes));

    std::printf("launch probe: %d SMs, a kernel busy on every SM for a fixed time; us per call added to the bare "
                "kernel's (median of %d rounds of %d calls)\n",
                p.sms, kRounds, kCalls);
    for (std::uint64_t kernel_us : {50, 190}) {
      p.kernel_ns = kernel_us * 1000;
      cudaGraphExec_t g_kernel = p.capture([&](cudaStream_t s) { p.kernel(s); });
      cudaGraphExec_t g_memset = p.capture([&](cudaStream_t s) {
        p.reset_memset(s);
        p.kernel(s);
      });
      cudaGraphExec_t g_memops = p.capture([&](cudaStream_t s) {
        p.reset_memops(s);
        p.kernel(s);
      });
      cudaGraphExec_t g_fused = p.capture([&](cudaStream_t s) { p.fused_shape(s); });
      struct Way {
        std::string name;
        std::function<void()> call;
      };
      const std::vector<Way> ways = {
          {"kernel, launched", [&] { p.kernel(p.stream); }},
          {"kernel, graph", [&] { WEFT_CUDA(cudaGraphLaunch(g_kernel, p.stream)); }},
          {"memset + kernel, launched", [&] {
             p.reset_memset(p.stream);
             p.kernel(p.stream);
           }},
          {"memset + kernel, graph", [&] { WEFT_CUDA(cudaGraphLaunch(g_memset, p.stream)); }},
          {"16 memop writes + kernel, launched", [&] {
             p.reset_memops(p.stream);
             p.kernel(p.stream);
           }},
          {"16 memop writes + kernel, graph", [&] { WEFT_CUDA(cudaGraphLaunch(g_memops, p.stream)); }},
          {"fused shape (memset, fork, side copy, join), launched", [&] { p.fused_shape(p.stream); }},
          {"fused shape, graph", [&] { WEFT_CUDA(cudaGraphLaunch(g_fused, p.stream)); }},
      };
      double bare = 0;
      for (const Way& w : ways) {
        const double us = p.time(w.call);
        if (bare == 0) bare = us;
        std::printf("probe: kernel %3llu us | %-55s %8.2f us per call, +%6.2f\n",
                    static_cast<unsigned long long>(kernel_us), w.name.c_str(), us, us - bare);
      }
      for (cudaGraphExec_t g : {g_kernel, g_memset, g_memops, g_fused}) WEFT_CUDA(cudaGraphExecDestroy(g));
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft-launch-probe: %s\n", e.what());
    return 1;
  }
}
