// weft/device/remote.cuh on the GPU, under virtual nodes (WEFT_VIRTUAL_NODES):
// one kernel per round puts a fresh random block to a peer with a signal and
// checks, bitwise, the block its own peer put, for many rounds; over the ring
// of every rank (which crosses nodes: both branches run), within each node
// (the direct path alone) and along each rail (NVSHMEM alone); the same data
// fetched with get; and the plain operators refusing peers they cannot
// address. docs/decisions/0061. The collectives' two-level schedules are
// tested in test_collectives.cu.
//
// Its own binary (weft_internode_tests): its kernels are relocatable device
// code, device-linked with weft::internode and libnvshmem_device.a. Runs under
// weftrun with WEFT_HEAP_BACKEND=nvshmem and WEFT_VIRTUAL_NODES=N; elsewhere
// every case skips, saying what it needs.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "internode_test.hpp"
#include "weft/core/error.hpp"
#include "weft/device/remote.cuh"
#include "weft/internode/remote_peers.hpp"
#include "weft/ops/all_gather.hpp"

using namespace weft;
using weft::test::ctx;

namespace {

constexpr int kBlocks = 4;                                      // chunks, one block and one signal each
constexpr int kThreads = 512;
constexpr std::size_t kChunk = (std::size_t{1} << 20) + 48;     // 16-byte multiple: the direct path's vector copy
constexpr std::size_t kBytes = kBlocks * kChunk - 5;            // the last chunk is odd: byte tails on both paths
constexpr std::uint64_t kRounds = 48;

WEFT_HD std::uint64_t mix(std::uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
/// Byte i of the block a rank sends in a round: fresh bits per (test, rank, round).
WEFT_HD std::uint64_t seed_of(std::uint64_t test, int rank, std::uint64_t round) {
  return mix(mix(test * 1000003ull + static_cast<std::uint64_t>(rank)) ^ (round << 20));
}
WEFT_DEVICE unsigned char byte_of(std::uint64_t seed, std::size_t i) {
  return static_cast<unsigned char>(mix(seed ^ (i / 8)) >> (8 * (i % 8)));
}

__global__ void fill(unsigned char* p, std::size_t bytes, std::uint64_t seed) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < bytes;
       i += std::size_t{gridDim.x} * blockDim.x)
    p[i] = byte_of(seed, i);
}

/// Bytes of [p + begin, p + end) that differ from `seed`'s block, added to *wrong. Every thread of the block.
WEFT_DEVICE void count_wrong(const unsigned char* p, std::size_t begin, std::size_t end, std::uint64_t seed,
                             unsigned long long* wrong) {
  unsigned long long n = 0;
  for (std::size_t i = begin + threadIdx.x; i < end; i += blockDim.x) n += p[i] != byte_of(seed, i) ? 1 : 0;
  if (n) atomicAdd(wrong, n);
}

struct Ring {
  unsigned char* send;     // symmetric: this rank's fresh block
  unsigned char* recv;     // symmetric: where `from` puts its block
  std::uint64_t* arrived;  // symmetric [kBlocks]: raised on this rank by `from`'s puts
  std::uint64_t* freed;    // symmetric [kBlocks]: raised on this rank by `to` once it checked our block
  int to, from;
  std::uint64_t test;
  unsigned long long* wrong;  // device memory: bytes that differed
};

/// One round: block b waits until `to` checked round - 1's chunk b, puts this
/// round's chunk b to `to` with a signal, waits for `from`'s chunk b, checks
/// it bitwise, and tells `from` its chunk b may be overwritten.
__global__ void __launch_bounds__(kThreads) ring_round(dev::World w, Ring r, std::uint64_t round, bool nbi) {
  const int b = static_cast<int>(blockIdx.x);
  const std::size_t begin = b * kChunk, end = begin + kChunk < kBytes ? begin + kChunk : kBytes;
  if (threadIdx.x == 0) remote::signal_wait_until(w, r.freed + b, dev::Cmp::ge, round - 1, r.to);
  __syncthreads();
  if (nbi) {
    remote::put_signal_nbi_block(w, r.recv + begin, r.send + begin, end - begin, r.arrived + b, round,
                                 dev::SignalOp::set, r.to);
    remote::quiet_block(w);  // r.send is refilled by the next round
  } else {
    remote::put_signal_block(w, r.recv + begin, r.send + begin, end - begin, r.arrived + b, round,
                             dev::SignalOp::set, r.to);
  }
  if (threadIdx.x == 0) remote::signal_wait_until(w, r.arrived + b, dev::Cmp::ge, round, r.from);
  __syncthreads();
  count_wrong(r.recv, begin, end, seed_of(r.test, r.from, round), r.wrong);
  __syncthreads();
  if (threadIdx.x == 0) remote::signal_op(w, r.freed + b, round, dev::SignalOp::set, r.from);
  remote::quiet_block(w);  // the signal is delivered before the kernel ends (a NIC transport may still hold it)
}

/// Fetches `from`'s whole block into `into` (block b its chunk b) and checks it.
__global__ void __launch_bounds__(kThreads) get_round(dev::World w, Ring r, unsigned char* into, std::uint64_t round) {
  const int b = static_cast<int>(blockIdx.x);
  const std::size_t begin = b * kChunk, end = begin + kChunk < kBytes ? begin + kChunk : kBytes;
  remote::get_block(w, into + begin, r.send + begin, end - begin, r.from);
  count_wrong(into, begin, end, seed_of(r.test, r.from, round), r.wrong);
}

__global__ void count_direct(dev::World w, int* out) {
  int n = 0;
  for (int pe = 0; pe < w.world_size(); ++pe) n += remote::direct(w, pe) ? 1 : 0;
  *out = n;
}


/// The exchange of one ring (this rank puts to `to`, receives from `from`) for kRounds rounds,
/// alternating the blocking and the non-blocking put. Returns the bytes that differed, on all ranks.
unsigned long long run_ring(std::uint64_t test, int to, int from) {
  auto remote = std::make_unique<RemotePeers>(test::ctx_ptr());
  cudaStream_t s = test::stream();
  SymmetricBuffer send(ctx().heap(), kBytes, "bytes", "test.remote.send");
  SymmetricBuffer recv(ctx().heap(), kBytes, "bytes", "test.remote.recv");
  SymmetricBuffer flags(ctx().heap(), 2 * kBlocks * sizeof(std::uint64_t), "u64", "test.remote.flags");
  unsigned long long* wrong = nullptr;
  WEFT_CUDA(cudaMalloc(&wrong, sizeof *wrong));
  WEFT_CUDA(cudaMemset(wrong, 0, sizeof *wrong));
  Ring r{send.as<unsigned char>(), recv.as<unsigned char>(), flags.as<std::uint64_t>(),
         flags.as<std::uint64_t>() + kBlocks, to, from, test, wrong};
  for (std::uint64_t round = 1; round <= kRounds; ++round) {
    fill<<<64, 256, 0, s>>>(r.send, kBytes, seed_of(test, ctx().rank(), round));
    ring_round<<<kBlocks, kThreads, 0, s>>>(ctx().world(), r, round, round % 2 == 0);
  }
  ctx().synchronize(s);
  unsigned long long n = 0;
  WEFT_CUDA(cudaMemcpy(&n, wrong, sizeof n, cudaMemcpyDeviceToHost));
  WEFT_CUDA(cudaFree(wrong));
  ctx().host_barrier("remote ring done");  // no rank frees the buffers while a peer may still put
  return n;
}

int hops_through_nvshmem(int to) {
  int mine = ctx().heap().peer_reachable(to) ? 0 : 1, all = 0;
  for (auto& v : test::gather(std::to_string(mine))) all += std::stoi(v);
  return all;
}

}  // namespace

TEST(Remote, DeviceStateIsSetAndTheDeviceSeesTheNodes) {
  NEED_VIRTUAL_NODES();
  RemotePeers remote(test::ctx_ptr());
  EXPECT_TRUE(remote.active());
  const Team& team = ctx().team();
  std::vector<int> expected;
  for (int pe = 0; pe < ctx().world_size(); ++pe)
    if (team.node_of[pe] != team.node_id) expected.push_back(pe);
  EXPECT_EQ(remote.remote_ranks(), expected);
  int* d = nullptr;
  WEFT_CUDA(cudaMalloc(&d, sizeof(int)));
  count_direct<<<1, 1, 0, test::stream()>>>(ctx().world(), d);
  ctx().synchronize(test::stream());
  int direct = -1;
  WEFT_CUDA(cudaMemcpy(&direct, d, sizeof direct, cudaMemcpyDeviceToHost));
  WEFT_CUDA(cudaFree(d));
  EXPECT_EQ(direct, team.local_world_size);
  if (ctx().rank() == 0) std::printf("[ info ] %s\n", remote.describe().c_str());
}

TEST(Remote, RingOfEveryRankCrossesNodesAndEveryByteArrives) {
  NEED_VIRTUAL_NODES();
  const int w = ctx().world_size(), me = ctx().rank();
  const int to = (me + 1) % w, from = (me + w - 1) % w;
  const int crossing = hops_through_nvshmem(to);
  EXPECT_EQ(crossing, ctx().team().num_nodes);  // one hop out of each node: the NVSHMEM branch runs
  const unsigned long long wrong = run_ring(1, to, from);
  EXPECT_EQ(wrong, 0u) << "bytes from rank " << from << " that differ, over " << kRounds << " rounds";
  EXPECT_TRUE(test::all_ranks(wrong == 0));
  if (me == 0)
    std::printf("[ info ] ring of %d ranks, %d of its hops through NVSHMEM, %llu rounds of %zu bytes\n", w, crossing,
                static_cast<unsigned long long>(kRounds), kBytes);
}

TEST(Remote, RingWithinEachNodeTakesTheDirectPath) {
  NEED_VIRTUAL_NODES();
  const Team& team = ctx().team();
  const int l = team.local_world_size;
  if (l < 2) GTEST_SKIP() << "needs nodes of 2 ranks or more; this split has 1 rank per node";
  const int to = team.local_ranks[(team.local_rank + 1) % l], from = team.local_ranks[(team.local_rank + l - 1) % l];
  EXPECT_EQ(hops_through_nvshmem(to), 0);
  const unsigned long long wrong = run_ring(2, to, from);
  EXPECT_EQ(wrong, 0u) << "bytes from rank " << from << " that differ";
  EXPECT_TRUE(test::all_ranks(wrong == 0));
}

TEST(Remote, RingAlongEachRailTakesNvshmemOnly) {
  NEED_VIRTUAL_NODES();
  const Team& team = ctx().team();
  const int n = team.num_nodes, l = team.local_world_size;
  const int to = (team.node_id + 1) % n * l + team.local_rank, from = (team.node_id + n - 1) % n * l + team.local_rank;
  EXPECT_EQ(hops_through_nvshmem(to), ctx().world_size());
  const unsigned long long wrong = run_ring(3, to, from);
  EXPECT_EQ(wrong, 0u) << "bytes from rank " << from << " that differ";
  EXPECT_TRUE(test::all_ranks(wrong == 0));
}

TEST(Remote, GetFetchesThePreviousRanksBlockOnEitherPath) {
  NEED_VIRTUAL_NODES();
  RemotePeers remote(test::ctx_ptr());
  const int w = ctx().world_size(), me = ctx().rank();
  cudaStream_t s = test::stream();
  SymmetricBuffer send(ctx().heap(), kBytes, "bytes", "test.remote.get_send");
  SymmetricBuffer into(ctx().heap(), kBytes, "bytes", "test.remote.get_into");
  unsigned long long* wrong = nullptr;
  WEFT_CUDA(cudaMalloc(&wrong, sizeof *wrong));
  WEFT_CUDA(cudaMemset(wrong, 0, sizeof *wrong));
  Ring r{send.as<unsigned char>(), nullptr, nullptr, nullptr, (me + 1) % w, (me + w - 1) % w, 4, wrong};
  for (std::uint64_t round = 1; round <= kRounds / 4; ++round) {
    fill<<<64, 256, 0, s>>>(r.send, kBytes, seed_of(r.test, me, round));
    ctx().synchronize(s);
    ctx().host_barrier("remote get: blocks written");
    get_round<<<kBlocks, kThreads, 0, s>>>(ctx().world(), r, into.as<unsigned char>(), round);
    ctx().synchronize(s);
    ctx().host_barrier("remote get: blocks read");
  }
  unsigned long long n = 0;
  WEFT_CUDA(cudaMemcpy(&n, wrong, sizeof n, cudaMemcpyDeviceToHost));
  WEFT_CUDA(cudaFree(wrong));
  EXPECT_EQ(n, 0u) << "bytes fetched from rank " << r.from << " that differ";
  EXPECT_TRUE(test::all_ranks(n == 0));
}

TEST(Remote, OperatorsThatNeedEveryPeerMappedRefuseNamingThePairs) {
  NEED_VIRTUAL_NODES();
  EXPECT_FALSE(ctx().all_peers_direct());
  // No RemotePeers is alive here, so AllGather's two-level schedule (weft::internode's) is not at hand either.
  std::string e;
  try {
    AllGather plan(test::ctx_ptr(), {std::uint64_t{1} << 20, AllGatherVariant::automatic, 0});
  } catch (const Error& err) {
    e = err.what();
  }
  EXPECT_NE(e.find("AllGather reaches every peer by load and store"), std::string::npos) << e;
  EXPECT_NE(e.find(str("rank ", ctx().rank(), " cannot address rank(s) ")), std::string::npos) << e;
  EXPECT_NE(e.find("construct a weft::RemotePeers"), std::string::npos) << e;
  e.clear();
  try {
    ctx().barrier(test::stream());
  } catch (const Error& err) {
    e = err.what();
  }
  EXPECT_NE(e.find("Context::barrier"), std::string::npos) << e;
}
