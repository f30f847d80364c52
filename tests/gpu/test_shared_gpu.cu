// Ranks that share a GPU (weftrun --share-gpu): the team names them as peers
// on the same GPU, and kernels that wait on one another finish. The second is
// the rule of gpu_share.hpp: a kernel that spins until another rank writes
// sizes its grid from its rank's share of the SMs (Team::sm_count). Grids of
// that size, one block per SM, in a ring where every block waits for the
// previous rank's block, complete only if every rank's grid is resident at
// once. The third: a rank that comes late to a collective still finds SMs,
// however large the kernels queued behind the other ranks' waits (weft
// launches without programmatic dependent launch on a shared GPU). On GPUs of
// their own the same tests hold trivially.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "gpu_check.hpp"
#include "gpu_test.hpp"
#include "weft/core/error.hpp"
#include "weft/device.cuh"
#include "weft/ops/all_gather.hpp"
#include "weft/ops/flash_decode.hpp"

using namespace weft;
using weft::test::ctx;

namespace {

// Block b signals block b of the next rank, then waits for the previous rank's
// block b. Its shared memory keeps every other block off its SM.
__global__ void ring_of_full_grids(dev::World w, std::uint64_t* flags, std::uint64_t epoch) {
  extern __shared__ unsigned char hold_the_sm[];
  if (threadIdx.x == 0) {
    hold_the_sm[0] = 1;
    const int next = (w.rank + 1) % w.size, prev = (w.rank + w.size - 1) % w.size;
    dev::notify(w, flags + blockIdx.x, next, epoch, dev::SignalOp::set, dev::Scope::sys);
    dev::wait_until(w, flags + blockIdx.x, dev::Cmp::ge, epoch, dev::Scope::sys, prev);
  }
}

// Keeps one small block busy for `ns`: the rank that enqueues it comes late to what follows.
__global__ void hold_back(std::uint64_t ns) {
  const std::uint64_t t0 = dev::globaltimer_ns();
  while (dev::globaltimer_ns() - t0 < ns) {
  }
}

}  // namespace

TEST(SharedGpu, TheTeamNamesRanksOnTheSameGpu) {
  const Team& t = ctx().team();
  for (int r = 0; r < t.world_size; ++r) {
    const bool same = std::find(t.same_gpu_ranks.begin(), t.same_gpu_ranks.end(), r) != t.same_gpu_ranks.end();
    EXPECT_EQ(t.links[r].same_gpu, same) << "rank " << r;
    if (same && r != t.rank) EXPECT_EQ(t.links[r].describe(), "same GPU") << "rank " << r;
  }
  EXPECT_EQ(t.shares_gpus(), t.ranks_per_gpu > 1);
  if (t.shares_gpus()) {
    EXPECT_FALSE(ctx().has_nccl()) << "NCCL refuses ranks on one GPU: the Context must not create it";
    EXPECT_NE(t.sharing, GpuSharing::off);
  }
  if (t.same_gpu_ranks.size() > 1 && t.sharing == GpuSharing::mps) EXPECT_TRUE(t.mps_client);
  // The shares of the ranks on this GPU fit in it.
  EXPECT_LE(t.sm_count * static_cast<int>(t.same_gpu_ranks.size()), t.gpu_sm_count);
  EXPECT_GE(t.sm_count, 1);
  if (t.rank == 0)
    std::printf("[ info ] %d ranks, up to %d on one GPU (%s); rank 0's share: %d of %d SMs%s\n", t.world_size,
                t.ranks_per_gpu, to_string(t.sharing), t.sm_count, t.gpu_sm_count, t.mps_client ? " under MPS" : "");
}

TEST(SharedGpu, FullGridsThatWaitOnEachOtherAllFinish) {
  const int sms = ctx().team().sm_count;
  constexpr int kHold = 200 << 10;  // one block per SM (228 KB of shared memory per SM on Hopper)
  WEFT_CUDA(cudaFuncSetAttribute(ring_of_full_grids, cudaFuncAttributeMaxDynamicSharedMemorySize, kHold));
  // The ring pairs block b of each rank with block b of the next: every rank
  // must see the same SM count (ranks on one GPU, or GPUs of one kind).
  bool same_grids = true;
  for (const std::string& c : test::gather(std::to_string(sms))) same_grids &= std::stoi(c) == sms;
  ASSERT_TRUE(test::all_ranks(same_grids)) << "ranks see different SM counts";
  SymmetricBuffer flags(ctx().heap(), sms * sizeof(std::uint64_t), "u64", "test.shared_gpu.ring");
  for (std::uint64_t epoch = 1; epoch <= 3; ++epoch) {
    ctx().barrier(test::stream());
    ring_of_full_grids<<<sms, 32, kHold, test::stream()>>>(ctx().world(), flags.as<std::uint64_t>(), epoch);
    WEFT_CUDA(cudaGetLastError());
    ctx().synchronize(test::stream());
  }
  std::vector<std::uint64_t> seen(sms);
  WEFT_CUDA(cudaMemcpy(seen.data(), flags.get(), sms * sizeof(std::uint64_t), cudaMemcpyDeviceToHost));
  for (int b = 0; b < sms; ++b) EXPECT_EQ(seen[b], 3u) << "block " << b;
  if (ctx().rank() == 0)
    std::printf("[ info ] %d ranks x %d blocks of %d KB shared memory, each waiting on another rank: all finished\n",
                ctx().world_size(), sms, kHold >> 10);
}

// Every rank's AllGather spins until all ranks have joined it, and a FlashDecode
// grid that alone fills the GPU follows it on each rank's stream; rank 0 joins
// 100 ms late. Were a successor scheduled while the kernel before it still
// runs (programmatic dependent launch), the other ranks' decode blocks would
// sit on every SM waiting for their AllGathers to end, and rank 0's AllGather
// would find none: a deadlock, reported by the wait bound. weft leaves it out
// where ranks share a GPU (gpu_share.hpp); WEFT_PDL=1 forces it on and so
// provokes the deadlock. The gathered bytes are checked bitwise; the decode,
// over keys and values that are all one bf16 value, must return that value.
TEST(SharedGpu, ALateRankFindsRoomBehindEveryRanksSpinningKernel) {
  EXPECT_EQ(gpu_shared_in_process(), ctx().team().shares_gpus());
  const int world = ctx().world_size(), rank = ctx().rank();
  cudaStream_t s = test::stream();
  const std::uint64_t bytes = 64u << 10;
  SymmetricBuffer input(ctx().heap(), bytes, "bytes", "test.shared_gpu.ag_input");
  SymmetricBuffer output(ctx().heap(), bytes * world, "bytes", "test.shared_gpu.ag_output");
  AllGather gather(test::ctx_ptr(), {bytes, AllGatherVariant::push, 0});

  const FlashDecodeOptions o{.batch = 32, .q_heads = 32, .kv_heads = 8, .head_dim = 128, .max_kv_len = 2048};
  FlashDecode decode(o);  // sized for the whole GPU: its grid alone fills it
  const std::uint64_t cache_elems = std::uint64_t(o.batch) * o.kv_heads * o.max_kv_len * o.head_dim;
  const std::uint64_t q_elems = std::uint64_t(o.batch) * o.q_heads * o.head_dim;
  constexpr std::uint16_t kValue = 0x3C3C;  // bf16 0.01147; every byte 0x3C, so cudaMemset writes it
  void *q = nullptr, *kv = nullptr, *out = nullptr;
  WEFT_CUDA(cudaMalloc(&q, q_elems * 2));
  WEFT_CUDA(cudaMalloc(&kv, 2 * cache_elems * 2));
  WEFT_CUDA(cudaMalloc(&out, q_elems * 2));
  WEFT_CUDA(cudaMemsetAsync(q, 0x3C, q_elems * 2, s));
  WEFT_CUDA(cudaMemsetAsync(kv, 0x3C, 2 * cache_elems * 2, s));
  const FlashDecodeArgs args{.q = q, .k = kv, .v = static_cast<char*>(kv) + cache_elems * 2, .out = out};

  std::uint64_t wrong_bytes = 0, wrong_outputs = 0;
  std::vector<std::uint16_t> got(q_elems);
  for (int run = 0; run < 3; ++run) {
    const std::uint64_t seed = bench::fresh_seed(rank, 7000 + run);
    const std::vector<std::string> seeds = test::gather(std::to_string(seed));
    bench::poison(output.get(), bytes * world, 0xA5, s);
    bench::poison(out, q_elems * 2, 0xFF, s);
    bench::fill_random(input.get(), bytes, seed, s);
    ctx().barrier(s);
    if (rank == 0) hold_back<<<1, 32, 0, s>>>(100'000'000);
    WEFT_CUDA(cudaGetLastError());
    gather.run(input.get(), output.get(), s);
    decode.run(args, s);
    ctx().synchronize(s);
    for (int p = 0; p < world; ++p)
      wrong_bytes += bench::count_mismatches_random(output.as<char>() + p * bytes, bytes, std::stoull(seeds[p]), s);
    WEFT_CUDA(cudaMemcpy(got.data(), out, q_elems * 2, cudaMemcpyDeviceToHost));
    wrong_outputs += std::count_if(got.begin(), got.end(), [](std::uint16_t v) { return v != kValue; });
  }
  cudaFree(q);
  cudaFree(kv);
  cudaFree(out);
  EXPECT_EQ(wrong_bytes, 0u) << "gathered bytes differ from the ranks' inputs";
  EXPECT_EQ(wrong_outputs, 0u) << "decode outputs differ from the one value every key and value holds";
  if (rank == 0)
    std::printf("[ info ] %d ranks, rank 0 late by 100 ms to an AllGather with a %d-split FlashDecode behind it on "
                "every rank: all finished%s\n",
                world, decode.splits(), gpu_shared_in_process() ? " (ranks share a GPU: no programmatic launch, unless WEFT_PDL=1)" : "");
}
