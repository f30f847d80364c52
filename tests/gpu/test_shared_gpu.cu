// Ranks that share a GPU (weftrun --share-gpu): the team names them as peers
// on the same GPU, and kernels that wait on one another finish. The second is
// the rule of gpu_share.hpp: a kernel that spins until another rank writes
// sizes its grid from its rank's share of the SMs (Team::sm_count). Grids of
// that size, one block per SM, in a ring where every block waits for the
// previous rank's block, complete only if every rank's grid is resident at
// once. On GPUs of their own the same test holds trivially.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>

#include "gpu_test.hpp"
#include "weft/core/error.hpp"
#include "weft/device.cuh"

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
