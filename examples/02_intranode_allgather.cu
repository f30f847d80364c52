// Tutorial 02: AllGather inside one node, three ways.
//
//   weftrun -n 2 build/example_02_intranode_allgather
//
// Each rank owns `n` bytes; everyone wants all of them, in rank order. The
// output buffer is symmetric, so rank r's slot on every rank is at the same
// offset r * n. A one-shot version of each idea (weft::AllGather is the tuned,
// reusable plan):
//   push - every rank stores its slot into every peer's output, then flags it;
//   pull - every rank loads every peer's slot from the peer's output;
//   copy engine - cudaMemcpyAsync to each peer, the flag written by the stream.
#include <cstdio>
#include <vector>

#include "weft/core/driver.hpp"
#include "weft/core/error.hpp"
#include "weft/device.cuh"
#include "weft/runtime/context.hpp"

using namespace weft;

// push: one block per peer. Copy my slot into peer p's output, then one thread
// releases p's flag for me (the block barrier orders all threads' stores first).
__global__ void push(dev::World w, char* out, std::uint64_t n, std::uint64_t* arrived, std::uint64_t epoch) {
  const int p = blockIdx.x;
  char* my_slot = out + w.rank * n;
  shmem::putmem_signal_block(w, my_slot, my_slot, n, arrived + w.rank, epoch, shmem::SIGNAL_SET, p);
  // Then wait until every rank's slot has landed here.
  if (threadIdx.x < w.size) dev::wait_until(w, arrived + threadIdx.x, dev::Cmp::ge, epoch, dev::Scope::sys);
}

// pull: rank r's slot is ready on rank r once r said so (ready flags); block p
// then reads p's slot from p's output into ours.
__global__ void pull(dev::World w, char* out, std::uint64_t n, std::uint64_t* ready, std::uint64_t epoch) {
  const int p = blockIdx.x;
  if (threadIdx.x == 0) {
    dev::notify(w, ready + w.rank, p, epoch, dev::SignalOp::set, dev::Scope::sys);  // "my slot is ready"
    dev::wait_until(w, ready + p, dev::Cmp::ge, epoch, dev::Scope::sys);            // "so is p's"
  }
  __syncthreads();
  shmem::getmem_block(w, out + p * n, out + p * n, n, p);
}

int run() {
  auto ctx = Context::from_env();
  const int me = ctx->rank(), world = ctx->world_size();
  const std::uint64_t n = 1 << 20;
  char* out = static_cast<char*>(ctx->heap().alloc(n * world, "bytes", "tutorial.out"));
  auto* flags = ctx->heap().alloc<std::uint64_t>(world, "u64", "tutorial.flags");
  std::vector<char> host(n * world);

  bool all_ok = true;
  auto check = [&](const char* name) {
    WEFT_CUDA(cudaMemcpy(host.data(), out, host.size(), cudaMemcpyDeviceToHost));
    int wrong = 0;
    for (int r = 0; r < world; ++r)
      for (std::uint64_t i = 0; i < n; ++i) wrong += host[r * n + i] != static_cast<char>(r * 7 + i % 251);
    std::printf("rank %d, %s: %s\n", me, name, wrong ? "WRONG" : "all slots correct");
    all_ok &= wrong == 0;
  };
  auto reset = [&] {  // my slot holds my data, the others garbage
    for (std::uint64_t i = 0; i < n; ++i) host[me * n + i] = static_cast<char>(me * 7 + i % 251);
    cudaMemset(out, 0xEE, n * world);
    cudaMemcpy(out + me * n, host.data() + me * n, n, cudaMemcpyHostToDevice);
    ctx->barrier(nullptr);  // nobody reads or writes a slot before its owner reset it
  };

  reset();
  push<<<world, 256>>>(ctx->world(), out, n, flags, /*epoch=*/1);
  ctx->synchronize(nullptr);
  check("push");

  reset();
  pull<<<world, 256>>>(ctx->world(), out, n, flags, /*epoch=*/2);  // flags only grow: epoch 2
  ctx->synchronize(nullptr);
  ctx->barrier(nullptr);  // peers may still be reading my slot: wait before the next reset
  check("pull");

  // Copy engine: no SMs. The stream copies my slot to each peer, then writes
  // the peer's flag (with a memory barrier before it), then waits for mine.
  reset();
  const Driver& cu = driver();
  for (int p = 0; p < world; ++p) {
    if (p == me) continue;
    cudaMemcpyAsync(ctx->heap().peer_ptr(out + me * n, p), out + me * n, n, cudaMemcpyDeviceToDevice, nullptr);
    cu.cuStreamWriteValue64(nullptr, reinterpret_cast<CUdeviceptr>(ctx->heap().peer_ptr(flags + me, p)), 3, 0);
  }
  for (int p = 0; p < world; ++p)
    if (p != me) cu.cuStreamWaitValue64(nullptr, reinterpret_cast<CUdeviceptr>(flags + p), 3, CU_STREAM_WAIT_VALUE_GEQ);
  ctx->synchronize(nullptr);
  check("copy engine");

  ctx->barrier(nullptr);
  ctx->synchronize(nullptr);
  ctx->heap().free(flags);
  ctx->heap().free(out);
  return all_ok ? 0 : 1;
}

int main() {
  try {
    return run();
  } catch (const Error& e) {  // no GPU, a peer that went away: said plainly
    std::fprintf(stderr, "example 02: %s\n", e.what());
    return 1;
  }
}
