// weft-copy-probe: does a copy into a peer's mapping run while every SM is busy?
//
//   weftrun -n 2 weft-copy-probe
//
// The overlapped plans copy chunks to the next rank while a persistent GEMM
// holds every SM. If the driver runs such a copy as a kernel rather than on a
// copy engine, the copy waits for the GEMM. This probe fills every SM (two
// 1024-thread blocks each, spinning until a flag is set or 2 s pass), then on
// another stream copies 64 MB into the peer's symmetric heap and sets the flag
// from that stream's front end (cuStreamWriteValue64). A copy engine finishes
// in well under a millisecond and releases the spinners; a copy kernel can only
// start once they give up. Each copy method is tried in turn, five times
// (the first a warm-up), and its median bandwidth printed: the methods
// include one copy split over several streams, which asks whether parallel
// copies reach more copy engines than one.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "weft/core/driver.hpp"
#include "weft/core/error.hpp"
#include "weft/runtime/context.hpp"

namespace {

constexpr double kHoldSeconds = 2.0;

// Two of these fill an SM's 2048 thread slots (and, at 32 registers, its register file).
__global__ void __launch_bounds__(1024, 2)
    hold_every_sm(const volatile unsigned long long* release, unsigned long long* started, long long budget_cycles,
                  unsigned long long* gave_up) {
  if (threadIdx.x == 0) {
    atomicAdd(started, 1ull);
    const long long t0 = clock64();
    while (*release == 0) {
      if (clock64() - t0 > budget_cycles) {
        atomicAdd(gave_up, 1ull);
        break;
      }
      __nanosleep(200);
    }
  }
  __syncthreads();  // every thread stays resident until thread 0 is released
}

}  // namespace

int main() {
  using namespace weft;
  try {
    ContextOptions opts;
    opts.heap_bytes = 256ull << 20;
    auto ctx = Context::from_env(opts);
    const int me = ctx->rank(), world = ctx->world_size();
    WEFT_REQUIRE(world >= 2, "weft-copy-probe needs 2 ranks (weftrun -n 2 weft-copy-probe), got ", world);
    const int peer = (me + 1) % world;
    constexpr std::size_t kBytes = 64ull << 20;
    SymmetricBuffer buf(ctx->heap(), kBytes, "u8", "copy_probe.buf");
    void* local = nullptr;
    WEFT_CUDA(cudaMalloc(&local, kBytes));
    WEFT_CUDA(cudaMemset(local, 0x5A, kBytes));
    void* remote = ctx->heap().peer_ptr(buf.get(), peer);

    // Every SM this rank may hold: the GPU's, or its share where ranks share the GPU.
    int device = 0, clock_khz = 0;
    const int sms = ctx->team().sm_count;
    WEFT_CUDA(cudaGetDevice(&device));
    WEFT_CUDA(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device));
    unsigned long long* flags = nullptr;  // [0] release, [1] blocks started, [2] blocks that gave up
    WEFT_CUDA(cudaMalloc(&flags, 3 * sizeof(*flags)));
    cudaStream_t hold, copy;
    WEFT_CUDA(cudaStreamCreateWithFlags(&hold, cudaStreamNonBlocking));
    WEFT_CUDA(cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking));
    constexpr int kMaxLanes = 4;  // extra streams, to ask whether parallel copies find more copy engines
    cudaStream_t lanes[kMaxLanes];
    cudaEvent_t lane_done[kMaxLanes];
    for (int l = 0; l < kMaxLanes; ++l) {
      WEFT_CUDA(cudaStreamCreateWithFlags(&lanes[l], cudaStreamNonBlocking));
      WEFT_CUDA(cudaEventCreateWithFlags(&lane_done[l], cudaEventDisableTiming));
    }
    cudaEvent_t issued, start, stop, forked;
    WEFT_CUDA(cudaEventCreate(&issued));
    WEFT_CUDA(cudaEventCreate(&start));
    WEFT_CUDA(cudaEventCreate(&stop));
    WEFT_CUDA(cudaEventCreateWithFlags(&forked, cudaEventDisableTiming));

    // kBytes split into `n` slices, slice i copied by enqueue(i, dst, src, bytes, stream) on its own stream.
    auto split = [&](int n, const std::function<void(void*, const void*, std::size_t, cudaStream_t)>& enqueue) {
      const std::size_t slice = kBytes / n;
      WEFT_CUDA(cudaEventRecord(forked, copy));
      for (int i = 1; i < n; ++i) {
        WEFT_CUDA(cudaStreamWaitEvent(lanes[i], forked, 0));
        enqueue(static_cast<char*>(remote) + i * slice, static_cast<char*>(local) + i * slice, slice, lanes[i]);
        WEFT_CUDA(cudaEventRecord(lane_done[i], lanes[i]));
      }
      enqueue(remote, local, slice, copy);
      for (int i = 1; i < n; ++i) WEFT_CUDA(cudaStreamWaitEvent(copy, lane_done[i], 0));
    };
    auto memcpy_async = [](void* dst, const void* src, std::size_t bytes, cudaStream_t s) {
      WEFT_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
    };
    auto batch = [&](int entries) {
      std::vector<void*> dsts(entries);
      std::vector<const void*> srcs(entries);
      std::vector<std::size_t> sizes(entries, kBytes / entries);
      for (int i = 0; i < entries; ++i) {
        dsts[i] = static_cast<char*>(remote) + i * (kBytes / entries);
        srcs[i] = static_cast<char*>(local) + i * (kBytes / entries);
      }
      cudaMemcpyAttributes attrs{};
      attrs.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      attrs.flags = cudaMemcpyFlagPreferOverlapWithCompute;
      std::size_t first = 0;
      WEFT_CUDA(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), entries, &attrs, &first, 1, copy));
    };
    const std::vector<std::pair<std::string, std::function<void()>>> methods = {
        {"cudaMemcpyAsync", [&] { split(1, memcpy_async); }},
        {"cudaMemcpyAsync, 2 slices on 2 streams", [&] { split(2, memcpy_async); }},
        {"cudaMemcpyAsync, 4 slices on 4 streams", [&] { split(4, memcpy_async); }},
        {"cudaMemcpyAsync, 4 slices on 1 stream",
         [&] {
           for (int i = 0; i < 4; ++i)
             memcpy_async(static_cast<char*>(remote) + i * (kBytes / 4), static_cast<char*>(local) + i * (kBytes / 4),
                          kBytes / 4, copy);
         }},
        {"cudaMemcpyBatchAsync, prefer overlap with compute", [&] { batch(1); }},
        {"cudaMemcpyBatchAsync, 4 entries, prefer overlap with compute", [&] { batch(4); }},
    };
    const int blocks = 2 * sms;
    constexpr int kRepeats = 5;  // the first is a warm-up (first touch of the peer mapping)
    for (const auto& [name, enqueue_copy] : methods) {
      std::vector<float> times;
      float resident_ms = 0;
      unsigned long long gave_up = 0;
      for (int rep = 0; rep < kRepeats; ++rep) {
        WEFT_CUDA(cudaMemset(flags, 0, 3 * sizeof(*flags)));
        WEFT_CUDA(cudaDeviceSynchronize());
        ctx->host_barrier("copy probe: " + name);
        hold_every_sm<<<blocks, 1024, 0, hold>>>(flags, flags + 1,
                                                 static_cast<long long>(kHoldSeconds * clock_khz * 1e3), flags + 2);
        WEFT_CUDA(cudaGetLastError());
        // The copy starts only once every block holds its SM.
        WEFT_CUDA(cudaEventRecord(issued, copy));
        WEFT_CU(driver().cuStreamWaitValue64(copy, reinterpret_cast<CUdeviceptr>(flags + 1),
                                             static_cast<cuuint64_t>(blocks), CU_STREAM_WAIT_VALUE_GEQ));
        WEFT_CUDA(cudaEventRecord(start, copy));
        enqueue_copy();
        WEFT_CUDA(cudaEventRecord(stop, copy));
        WEFT_CU(driver().cuStreamWriteValue64(copy, reinterpret_cast<CUdeviceptr>(flags), 1, 0));
        WEFT_CUDA(cudaStreamSynchronize(copy));
        WEFT_CUDA(cudaStreamSynchronize(hold));
        float ms = 0, resident = 0;
        WEFT_CUDA(cudaEventElapsedTime(&ms, start, stop));
        WEFT_CUDA(cudaEventElapsedTime(&resident, issued, start));
        unsigned long long gave = 0;
        WEFT_CUDA(cudaMemcpy(&gave, flags + 2, sizeof(gave), cudaMemcpyDeviceToHost));
        if (rep > 0) times.push_back(ms);
        resident_ms = std::max(resident_ms, resident);
        gave_up += gave;
      }
      std::sort(times.begin(), times.end());
      const float ms = times[times.size() / 2];
      const char* verdict = resident_ms > 0.5e3 * kHoldSeconds ? "inconclusive: the blocks were not all resident at once"
                            : gave_up == 0                   ? "the copy ran beside them (a copy engine)"
                                                             : "the copy waited for the SMs";
      std::printf("rank %d, %s: 64 MB to rank %d in %.3f ms (%.0f GB/s; median of %d) while %d blocks held all %d SMs "
                  "(all resident after %.3f ms); %llu gave up after %.0f s: %s\n",
                  me, name.c_str(), peer, ms, kBytes / (ms * 1e6), kRepeats - 1, blocks, sms, resident_ms, gave_up,
                  kHoldSeconds, verdict);
      std::fflush(stdout);
    }
    ctx->host_barrier("copy probe done");
    cudaFree(flags);
    cudaFree(local);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft-copy-probe: %s\n", e.what());
    return 1;
  }
}
