// The heap backend on the GPU (docs/decisions/0057): the one asked for is the
// one running, on every rank; every peer is mapped and the device's peer bases
// are the heap's; and a digest of each collective's result on fixed inputs,
// which scripts/gpu_tests.sh compares between a run on the native heap and one
// on NVSHMEM's (WEFT_HEAP_BACKEND=nvshmem) at the same world size: bitwise equal.
// The AllGather results are checked here too, bitwise against every rank's input.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "gpu_check.hpp"
#include "gpu_test.hpp"
#include "weft/core/error.hpp"
#include "weft/device.cuh"
#include "weft/ops/all_gather.hpp"
#include "weft/ops/all_reduce.hpp"
#include "weft/ops/reduce_scatter.hpp"

using namespace weft;
using weft::test::ctx;

namespace {

__global__ void count_unreachable(dev::World w, int* out) {
  int n = 0;
  for (int pe = 0; pe < w.world_size(); ++pe) n += w.reachable(pe) ? 0 : 1;
  *out = n;
}

// FNV-1a over the bytes of a device buffer: equal digests, equal bits.
std::string digest(const void* device, std::uint64_t bytes) {
  std::vector<unsigned char> host(bytes);
  WEFT_CUDA(cudaMemcpy(host.data(), device, bytes, cudaMemcpyDeviceToHost));
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : host) h = (h ^ c) * 1099511628211ull;
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(h));
  return text;
}

// Seeds that depend on the rank only: the same inputs under either backend.
std::uint64_t fixed_seed(int rank, std::uint64_t salt) { return 0x5eed0000ull + 131 * salt + rank; }

void print_digest(const std::string& what, const std::string& d) {
  if (ctx().rank() == 0) std::printf("[ digest ] world %d %s %s\n", ctx().world_size(), what.c_str(), d.c_str());
}

}  // namespace

TEST(HeapBackend, TheOneAskedForRunsOnEveryRank) {
  const std::string mine = to_string(ctx().heap().backend());
  for (auto& b : test::gather(mine)) EXPECT_EQ(b, mine);
  const char* asked = std::getenv("WEFT_HEAP_BACKEND");
  if (asked && parse_heap_backend(asked) != HeapBackend::automatic)
    EXPECT_EQ(mine, to_string(parse_heap_backend(asked))) << "WEFT_HEAP_BACKEND=" << asked;
  if (ctx().rank() == 0)
    std::printf("[ info ] heap backend: %s (NVSHMEM %s)\n", mine.c_str(),
                nvshmem_built() ? "built in" : "not built in");
}

TEST(HeapBackend, PeersOfTheNodeAreMappedAndTheDeviceSeesTheHeapsBases) {
  // Every peer of this rank's node is mapped; peers of other nodes (virtual
  // ones too, WEFT_VIRTUAL_NODES) only through NVSHMEM, so not by address.
  const int w = ctx().world_size();
  const Team& team = ctx().team();
  std::vector<char*> device_bases(w);
  WEFT_CUDA(cudaMemcpy(device_bases.data(), ctx().heap().peer_bases_device(), sizeof(char*) * w,
                       cudaMemcpyDeviceToHost));
  int others = 0;
  for (int pe = 0; pe < w; ++pe) {
    const bool same_node = team.node_of[pe] == team.node_id;
    others += same_node ? 0 : 1;
    EXPECT_EQ(ctx().heap().peer_reachable(pe), same_node) << "rank " << pe;
    EXPECT_EQ(ctx().heap().reachability()[ctx().rank()][pe], same_node) << "rank " << pe;
    if (same_node) EXPECT_EQ(device_bases[pe], ctx().heap().peer_ptr(ctx().heap().base(), pe)) << "rank " << pe;
    else EXPECT_EQ(device_bases[pe], nullptr) << "rank " << pe;
  }
  EXPECT_EQ(device_bases[ctx().rank()], ctx().heap().base());
  EXPECT_EQ(ctx().all_peers_direct(), team.num_nodes == 1);
  // The device side's view of the same (World::reachable, where weft/device/remote.cuh branches).
  int* unreachable = nullptr;
  WEFT_CUDA(cudaMalloc(&unreachable, sizeof(int)));
  count_unreachable<<<1, 1, 0, test::stream()>>>(ctx().world(), unreachable);
  ctx().synchronize(test::stream());
  int n = -1;
  WEFT_CUDA(cudaMemcpy(&n, unreachable, sizeof(int), cudaMemcpyDeviceToHost));
  WEFT_CUDA(cudaFree(unreachable));
  EXPECT_EQ(n, others);
}

TEST(HeapBackend, CollectiveDigestsOnFixedInputs) {
  cudaStream_t s = test::stream();
  const int w = ctx().world_size();
  const std::uint64_t count = (1u << 18) + 3;  // elements per rank: every variant takes it
  for (DType t : {DType::bf16, DType::fp32}) {
    const std::size_t size = dtype_size(t);
    SymmetricBuffer in(ctx().heap(), count * size * w, to_string(t), "test.backend.in");
    SymmetricBuffer out(ctx().heap(), count * size * w, to_string(t), "test.backend.out");
    for (AllReduceVariant v : {AllReduceVariant::low_latency, AllReduceVariant::one_shot, AllReduceVariant::two_shot,
                               AllReduceVariant::copy_engine}) {
      if (v == AllReduceVariant::low_latency && count * size > kAllReduceLowLatencyMaxBytes) continue;
      AllReduce plan(test::ctx_ptr(), {count, t, v, 0});
      bench::fill_uniform(in.get(), count, to_string(t), fixed_seed(ctx().rank(), 1), s);
      plan.run(in.get(), out.get(), s);
      ctx().synchronize(s);
      print_digest(str("all_reduce.", to_string(v), ".", to_string(t)), digest(out.get(), count * size));
      ctx().host_barrier("backend digest");
    }
    for (ReduceScatterVariant v : {ReduceScatterVariant::low_latency, ReduceScatterVariant::mesh,
                                   ReduceScatterVariant::ring, ReduceScatterVariant::copy_engine}) {
      if (v == ReduceScatterVariant::low_latency && count * size > kReduceScatterLowLatencyMaxBytes) continue;
      ReduceScatter plan(test::ctx_ptr(), {count, t, v, 0});
      bench::fill_uniform(in.get(), count * w, to_string(t), fixed_seed(ctx().rank(), 2), s);
      plan.run(in.get(), out.get(), s);
      ctx().synchronize(s);
      // Every rank's block, gathered, so rank 0's line covers the whole result.
      std::string all;
      for (auto& d : test::gather(digest(out.get(), count * size))) all += d.substr(0, 8);
      print_digest(str("reduce_scatter.", to_string(v), ".", to_string(t)), all);
      ctx().host_barrier("backend digest");
    }
  }
  const std::uint64_t bytes = (1u << 20) - 16;
  SymmetricBuffer in(ctx().heap(), bytes, "bytes", "test.backend.ag_in");
  SymmetricBuffer out(ctx().heap(), bytes * w, "bytes", "test.backend.ag_out");
  for (AllGatherVariant v : {AllGatherVariant::push, AllGatherVariant::pull, AllGatherVariant::copy_engine,
                             AllGatherVariant::low_latency, AllGatherVariant::ring}) {
    AllGather plan(test::ctx_ptr(), {bytes, v, 0});
    bench::fill_random(in.get(), bytes, fixed_seed(ctx().rank(), 3), s);
    bench::poison(out.get(), bytes * w, 0xA5, s);
    plan.run(in.get(), out.get(), s);
    ctx().synchronize(s);
    std::uint64_t wrong = 0;
    for (int p = 0; p < w; ++p)
      wrong += bench::count_mismatches_random(out.as<char>() + p * bytes, bytes, fixed_seed(p, 3), s);
    EXPECT_EQ(wrong, 0u) << "all_gather " << to_string(v) << ": bytes differing from the ranks' inputs";
    print_digest(str("all_gather.", to_string(v)), digest(out.get(), bytes * w));
    ctx().host_barrier("backend digest");
  }
}
