// 100,000 notify/wait round trips between ranks 0 and 1 in one kernel: no hang,
// every round trip seen, and the one-way signal latency reported (NVLink, or
// the same GPU where ranks share one).
#include <cstdio>

#include "gpu_test.hpp"
#include "weft/core/error.hpp"
#include "weft/device.cuh"

using namespace weft;
using weft::test::ctx;

namespace {

__global__ void pingpong(dev::World w, std::uint64_t* flag, int rounds) {
  if (w.rank > 1) return;
  const int peer = 1 - w.rank;
  for (int i = 1; i <= rounds; ++i) {
    if (w.rank == 0) {
      dev::notify(w, flag, peer, i, dev::SignalOp::set, dev::Scope::sys);
      dev::wait_until(w, flag, dev::Cmp::ge, i, dev::Scope::sys);
    } else {
      dev::wait_until(w, flag, dev::Cmp::ge, i, dev::Scope::sys);
      dev::notify(w, flag, peer, i, dev::SignalOp::set, dev::Scope::sys);
    }
  }
}

}  // namespace

TEST(PingPong, HundredThousandRoundTripsWithoutAHang) {
  WEFT_NEED_RANKS(2);
  const int rounds = 100000;
  SymmetricBuffer flag(ctx().heap(), sizeof(std::uint64_t), "u64", "test.pingpong.flag");
  cudaEvent_t start, stop;
  WEFT_CUDA(cudaEventCreate(&start));
  WEFT_CUDA(cudaEventCreate(&stop));
  ctx().barrier(test::stream());
  WEFT_CUDA(cudaEventRecord(start, test::stream()));
  pingpong<<<1, 1, 0, test::stream()>>>(ctx().world(), flag.as<std::uint64_t>(), rounds);
  WEFT_CUDA(cudaEventRecord(stop, test::stream()));
  ctx().synchronize(test::stream());
  float ms = 0;
  WEFT_CUDA(cudaEventElapsedTime(&ms, start, stop));
  std::uint64_t last = 0;
  WEFT_CUDA(cudaMemcpy(&last, flag.get(), sizeof(last), cudaMemcpyDeviceToHost));
  if (ctx().rank() < 2) EXPECT_EQ(last, static_cast<std::uint64_t>(rounds));
  if (ctx().rank() == 0)
    std::printf("[ info ] ping-pong between ranks 0 and 1 (%s): %d round trips in %.1f ms, one-way latency %.3f us%s\n",
                ctx().team().links[1].describe().c_str(), rounds, ms, 1000.0 * ms / (2.0 * rounds),
                ctx().team().shares_gpus() ? " (ranks share a GPU: not a performance figure)" : "");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  ctx().host_barrier("pingpong done");
}
