// Tutorial 01: notify and wait - the smallest conversation between two GPUs.
//
//   weftrun -n 2 build/example_01_notify_wait
//
// Rank 0 sends a number to rank 1 by storing it straight into rank 1's
// symmetric buffer, then raises a flag there (notify = release store). Rank 1
// spins on its flag (wait = acquire load); once it sees the flag, the number
// is guaranteed visible. Rank 1 answers the same way. Repeat: a ping-pong.
#include <cstdio>

#include "weft/core/error.hpp"
#include "weft/device.cuh"
#include "weft/runtime/context.hpp"

using namespace weft;

// Both ranks run this kernel with one thread. `box` and `flag` are symmetric:
// the same offset in every rank's heap, reachable on rank p via symm_at(., p).
__global__ void ping_pong(dev::World w, std::uint64_t* box, std::uint64_t* flag, int rounds, int* wrong) {
  const int peer = 1 - w.rank;
  for (int i = 1; i <= rounds; ++i) {
    const bool my_turn = (w.rank == 0);
    if (!my_turn) dev::wait_until(w, flag, dev::Cmp::ge, i, dev::Scope::sys);   // 1. wait for the ping
    *w.symm_at(box, peer) = 1000 * i + w.rank;                                  // 2. a plain store over NVLink
    dev::notify(w, flag, peer, i, dev::SignalOp::set, dev::Scope::sys);         // 3. release: box before flag
    if (my_turn) dev::wait_until(w, flag, dev::Cmp::ge, i, dev::Scope::sys);    // 4. wait for the pong
    // After the acquire in wait_until, the peer's store to our box is visible.
    if (*box != 1000u * i + peer) {
      if (*wrong < 5) printf("rank %d: round %d saw %llu\n", w.rank, i, (unsigned long long)*box);
      ++*wrong;
    }
  }
}

int run() {
  auto ctx = Context::from_env();  // rendezvous, GPU, symmetric heap
  if (ctx->world_size() != 2) {
    std::fprintf(stderr, "run with two ranks: weftrun -n 2 %s\n", "example_01_notify_wait");
    return 2;
  }
  // Collective allocations: every rank gets the same offsets, zero-filled.
  auto* box = ctx->heap().alloc<std::uint64_t>(1, "u64", "tutorial.box");
  auto* flag = ctx->heap().alloc<std::uint64_t>(1, "u64", "tutorial.flag");

  const int rounds = 10000;
  int* wrong = nullptr;  // rounds whose number was not the one sent (pinned host memory the kernel writes)
  WEFT_CUDA(cudaMallocHost(&wrong, sizeof(int)));
  *wrong = 0;
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  ctx->barrier(nullptr);  // start together
  cudaEventRecord(start);
  ping_pong<<<1, 1>>>(ctx->world(), box, flag, rounds, wrong);
  cudaEventRecord(stop);
  ctx->synchronize(nullptr);  // turns a hung wait into an error naming the flag
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  if (ctx->rank() == 0)
    std::printf("%d round trips in %.2f ms: %.2f us one way (%s)%s\n", rounds, ms, 1000.0 * ms / (2 * rounds),
                ctx->team().links[1].describe().c_str(),
                ctx->team().shares_gpus() ? "; ranks share a GPU: not a performance figure" : "");
  std::printf("rank %d: %s\n", ctx->rank(), *wrong ? "WRONG numbers received" : "every number received right");
  const bool ok = *wrong == 0;
  cudaFreeHost(wrong);
  ctx->heap().free(flag);
  ctx->heap().free(box);
  return ok ? 0 : 1;
}

int main() {
  try {
    return run();
  } catch (const Error& e) {  // no GPU, a peer that went away: said plainly
    std::fprintf(stderr, "example 01: %s\n", e.what());
    return 1;
  }
}
