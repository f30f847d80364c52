// The symmetric heap on the GPU: mapping, peer access, symmetric offsets, errors.
#include "gpu_check.hpp"
#include "gpu_test.hpp"
#include "weft/core/error.hpp"
#include "weft/device.cuh"

using namespace weft;
using weft::test::ctx;

namespace {

// Reads rank pe's copy of a symmetric buffer through the World (NVLink loads).
__global__ void read_peer(dev::World w, const unsigned char* buf, int pe, unsigned char* out, std::uint64_t bytes) {
  const unsigned char* src = w.symm_at(buf, pe);
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < bytes; i += gridDim.x * blockDim.x)
    out[i] = src[i];
}

}  // namespace

TEST(Heap, EveryRankSeesEveryPeersBuffer) {
  const std::uint64_t bytes = (4u << 20) + 123;
  auto* buf = static_cast<unsigned char*>(ctx().heap().alloc(bytes, "bytes", "test.heap.peers"));
  std::uint64_t seed = bench::fresh_seed(ctx().rank(), 11);
  auto seeds = test::gather(std::to_string(seed));
  bench::fill_random(buf, bytes, seed, test::stream());
  ctx().synchronize(test::stream());
  ctx().host_barrier("heap test filled");
  unsigned char* local = nullptr;
  WEFT_CUDA(cudaMalloc(&local, bytes));
  std::uint64_t bad_host_path = 0, bad_device_path = 0;
  for (int p = 0; p < ctx().world_size(); ++p) {
    // Host-visible peer pointer (as copy engines use it) ...
    bad_host_path += bench::count_mismatches_random(ctx().heap().peer_ptr(buf, p), bytes, std::stoull(seeds[p]),
                                                    test::stream());
    // ... and the device-side symm_at.
    bench::poison(local, bytes, 0xEE, test::stream());
    read_peer<<<64, 256, 0, test::stream()>>>(ctx().world(), buf, p, local, bytes);
    bad_device_path += bench::count_mismatches_random(local, bytes, std::stoull(seeds[p]), test::stream());
  }
  EXPECT_EQ(bad_host_path, 0u);
  EXPECT_EQ(bad_device_path, 0u);
  WEFT_CUDA(cudaFree(local));
  ctx().host_barrier("heap test read");
  ctx().heap().free(buf);
}

TEST(Heap, AllocationsAreSymmetricAndZeroed) {
  std::vector<void*> ptrs;
  std::string offsets;
  for (std::uint64_t b : {1ull, 1000ull, 1ull << 20, 77ull}) {
    ptrs.push_back(ctx().heap().alloc(b, "bytes", "test.heap.sym"));
    offsets += std::to_string(static_cast<char*>(ptrs.back()) - ctx().heap().base()) + ",";
  }
  for (auto& o : test::gather(offsets)) EXPECT_EQ(o, offsets);
  // Dirty a buffer, free it, allocate it again: it must come back zeroed.
  bench::fill_random(ptrs[2], 1 << 20, 5, test::stream());
  ctx().synchronize(test::stream());
  ctx().heap().free(ptrs[2]);
  void* again = ctx().heap().alloc(1 << 20, "bytes", "test.heap.sym");
  EXPECT_EQ(again, ptrs[2]) << "first fit should reuse the freed block";
  std::vector<unsigned char> host(1 << 20, 0xFF);
  WEFT_CUDA(cudaMemcpy(host.data(), again, host.size(), cudaMemcpyDeviceToHost));
  EXPECT_EQ(std::count(host.begin(), host.end(), 0), static_cast<long>(host.size()));
  EXPECT_TRUE(ctx().heap().contains(again, 1 << 20));
  EXPECT_FALSE(ctx().heap().contains(again, (1 << 20) + 4096));
  ptrs[2] = again;
  for (void* p : ptrs) ctx().heap().free(p);
  EXPECT_FALSE(ctx().heap().contains(ptrs[0], 1));
}

TEST(Heap, MismatchedRequestsFailOnEveryRankNamingBoth) {
  WEFT_NEED_RANKS(2);
  std::string message;
  try {
    ctx().heap().alloc(std::uint64_t{1 << 20} * (ctx().rank() + 1), "bf16", "test.heap.mismatch");
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("rank 0 asked for an alloc of 1048576 bytes"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 1 asked for an alloc of 2097152 bytes"), std::string::npos) << message;
  // The heap is still usable and still symmetric afterwards.
  void* p = ctx().heap().alloc(4096, "bytes", "test.heap.after_mismatch");
  std::string offset = std::to_string(static_cast<char*>(p) - ctx().heap().base());
  for (auto& o : test::gather(offset)) EXPECT_EQ(o, offset);
  ctx().heap().free(p);
}

TEST(Heap, ExhaustionNamesTheHeapSizeAndTheSetting) {
  std::string message;
  try {
    ctx().heap().alloc(ctx().heap().capacity() * 2, "bytes", "test.heap.too_big");
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("exhausted"), std::string::npos) << message;
  EXPECT_NE(message.find("WEFT_HEAP_SIZE"), std::string::npos) << message;
  EXPECT_NE(message.find("test.heap.too_big"), std::string::npos) << message;
}

TEST(Heap, TeamSeesPeerAccessToEveryLocalRank) {
  const Team& t = ctx().team();
  for (int r = 0; r < t.world_size; ++r) {
    EXPECT_TRUE(t.links[r].peer_access) << "rank " << r << ": " << t.links[r].describe();
    EXPECT_TRUE(t.peer_access_matrix[t.rank][r]);
  }
  EXPECT_TRUE(t.vmm_fd_supported);
  if (t.rank == 0)
    for (int r = 0; r < t.world_size; ++r)
      std::printf("[ info ] rank 0 -> rank %d: %s; %s\n", r, t.links[r].describe().c_str(), t.nvlink_summary.c_str());
}
