// weft-wait-probe: what does a wait on a flag that is already set cost?
//
//   weft-wait-probe          (one GPU; no ranks needed)
//
// The hooked GEMMs wait, per tile, on a flag that has mostly been raised long
// before. With the fence dev::wait_until used until 92f555a, WEFT_TILE_WAITS
// counted ~2 us per tile in AllGather + GEMM and ~5 us in GEMM +
// ReduceScatter's source loads; with the acquire load, ~0.8 and ~2. This
// probe times one waiting warp per SM doing 64 such waits in a row, in each
// of the ways a wait can be written, first on an idle SM, then while the
// other warps of the block stream stores to global memory (as a GEMM's
// epilogue does). It prints the median, over SMs, of nanoseconds per wait
// (%globaltimer).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "weft/core/gpu_diagnosis.hpp"
#include "weft/core/error.hpp"
#include "weft/device/memory.cuh"

namespace {

using weft::dev::Scope;

enum Way : int {
  relaxed_sys_then_fence_sys,  // dev::wait_until(..., Scope::sys) until 92f555a
  acquire_sys,                 // one ld.acquire.sys
  relaxed_sys_then_acquire_sys,  // dev::wait_until's slow path since 92f555a (its fast path: one acquire)
  relaxed_gpu_then_fence_gpu,
  acquire_gpu,
  fence_sys_alone,
  proxy_fence_alone,
  kWays
};
const char* kWayNames[kWays] = {"ld.relaxed.sys + fence.acq_rel.sys", "ld.acquire.sys",
                                "ld.relaxed.sys + ld.acquire.sys", "ld.relaxed.gpu + fence.acq_rel.gpu",
                                "ld.acquire.gpu", "fence.acq_rel.sys alone", "fence.proxy.async.global alone"};

constexpr int kWaits = 64;

__global__ void probe(const std::uint64_t* flags, int way, bool busy, std::uint64_t* ns_per_block, float* sink,
                      std::int64_t sink_elems) {
  const int warp = threadIdx.x / 32;
  if (warp == 0) {
    if ((threadIdx.x & 31) != 0) return;
    std::uint64_t acc = 0;
    const std::uint64_t t0 = weft::dev::globaltimer_ns();
    for (int i = 0; i < kWaits; ++i) {
      const std::uint64_t* f = flags + (blockIdx.x * kWaits + i) % 4096;
      switch (way) {
        case relaxed_sys_then_fence_sys:
          acc += weft::dev::ld_relaxed(f, Scope::sys);
          weft::dev::fence_acq_rel(Scope::sys);
          break;
        case acquire_sys: acc += weft::dev::ld_acquire(f, Scope::sys); break;
        case relaxed_sys_then_acquire_sys:
          acc += weft::dev::ld_relaxed(f, Scope::sys);
          acc += weft::dev::ld_acquire(f, Scope::sys);
          break;
        case relaxed_gpu_then_fence_gpu:
          acc += weft::dev::ld_relaxed(f, Scope::gpu);
          weft::dev::fence_acq_rel(Scope::gpu);
          break;
        case acquire_gpu: acc += weft::dev::ld_acquire(f, Scope::gpu); break;
        case fence_sys_alone: weft::dev::fence_acq_rel(Scope::sys); break;
        case proxy_fence_alone: weft::dev::fence_proxy_async_global(); break;
        default: break;
      }
    }
    const std::uint64_t t1 = weft::dev::globaltimer_ns();
    ns_per_block[blockIdx.x] = (t1 - t0) + (acc == 0xdeadbeefull ? 1 : 0);  // keeps the loads
    return;
  }
  if (!busy) return;
  // The other warps: a store stream, as an epilogue's, for ~200 us.
  const std::int64_t per_block = sink_elems / gridDim.x;
  float* mine = sink + blockIdx.x * per_block;
  for (int rep = 0; rep < 40; ++rep)
    for (std::int64_t i = threadIdx.x - 32; i < per_block; i += blockDim.x - 32) mine[i] = static_cast<float>(rep + i);
}

}  // namespace

int main() {
  try {
    const weft::GpuDiagnosis gpus = weft::diagnose_gpus();  // names a missing GPU, an old driver, a GPU that is not Hopper
    WEFT_REQUIRE(gpus.verdict == weft::GpuVerdict::ready, gpus.message);
    int device = 0, sms = 0;
    WEFT_CUDA(cudaGetDevice(&device));
    WEFT_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    std::uint64_t *flags = nullptr, *ns = nullptr;
    float* sink = nullptr;
    const std::int64_t sink_elems = std::int64_t{64} << 20;  // 256 MB: past L2
    WEFT_CUDA(cudaMalloc(&flags, 4096 * 8));
    WEFT_CUDA(cudaMemset(flags, 1, 4096 * 8));  // every flag is set
    WEFT_CUDA(cudaMalloc(&ns, sms * 8));
    WEFT_CUDA(cudaMalloc(&sink, sink_elems * 4));
    std::vector<std::uint64_t> host(sms);
    std::printf("wait probe: %d SMs, one waiting lane per SM, %d waits on set flags; ns per wait (median over SMs, max)\n",
                sms, kWaits);
    for (bool busy : {false, true})
      for (int way = 0; way < kWays; ++way) {
        std::vector<double> med;
        double worst = 0;
        for (int rep = 0; rep < 6; ++rep) {  // the first is a warm-up
          probe<<<sms, busy ? 512 : 32>>>(flags, way, busy, ns, sink, sink_elems);
          WEFT_CUDA(cudaGetLastError());
          WEFT_CUDA(cudaMemcpy(host.data(), ns, sms * 8, cudaMemcpyDeviceToHost));
          if (rep == 0) continue;
          std::sort(host.begin(), host.end());
          med.push_back(static_cast<double>(host[sms / 2]) / kWaits);
          worst = std::max(worst, static_cast<double>(host.back()) / kWaits);
        }
        std::sort(med.begin(), med.end());
        std::printf("probe: %-6s %-36s %8.1f ns (max %8.1f)\n", busy ? "busy" : "idle", kWayNames[way],
                    med[med.size() / 2], worst);
      }
    cudaFree(flags);
    cudaFree(ns);
    cudaFree(sink);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft-wait-probe: %s\n", e.what());
    return 1;
  }
}
