#include "native_heap.hpp"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <exception>

#include "block_heap.hpp"
#include "ipc_socket.hpp"
#include "weft/core/driver.hpp"
#include "weft/core/env.hpp"
#include "weft/core/error.hpp"
#include "weft/core/log.hpp"

namespace weft {
namespace {

class NativeHeap final : public BlockHeap {
 public:
  NativeHeap(Store& store, const Team& team, std::uint64_t capacity);
  ~NativeHeap() override;
  HeapBackend backend() const override { return HeapBackend::native; }

 private:
  void map(CUmemGenericAllocationHandle handle, CUdeviceptr* va);

  int device_;
  CUmemGenericAllocationHandle own_ = 0;
  std::vector<CUmemGenericAllocationHandle> handles_;  // per rank (own_ at rank_)
};

CUmemAllocationProp allocation_prop(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

std::uint64_t granularity(int device) {
  CUmemAllocationProp prop = allocation_prop(device);
  size_t g = 0;
  WEFT_CU(driver().cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  return g;
}

NativeHeap::NativeHeap(Store& store, const Team& team, std::uint64_t capacity)
    : BlockHeap(store, team, capacity, granularity(team.device)), device_(team.device) {
  // The checks that make the native backend valid, each with its remedy.
  WEFT_REQUIRE(team.single_node(), "the native symmetric heap needs every rank on one node, but the job spans ",
               team.num_nodes, " nodes: use the NVSHMEM backend (WEFT_HEAP_BACKEND=nvshmem or auto)");
  WEFT_REQUIRE(team.vmm_supported && team.vmm_fd_supported, "GPU ", team.device, " (", team.gpu_name[rank_],
               ") lacks CUDA virtual memory management with POSIX file-descriptor handles, which the native heap needs");
  for (int r = 0; r < world_; ++r)
    WEFT_REQUIRE(team.links[r].peer_access, "rank ", rank_, "'s GPU (", team.pci_bus_id[rank_],
                 ") has no peer access to rank ", r, "'s GPU (", team.pci_bus_id[r], "): link ",
                 team.links[r].describe(), ". The native heap needs peer access between all GPUs.");

  check_same_capacity();

  CUmemAllocationProp prop = allocation_prop(device_);
  CUresult rc = driver().cuMemCreate(&own_, capacity_, &prop, 0);
  WEFT_REQUIRE(rc == CUDA_SUCCESS, "cannot create a symmetric heap of ", format_bytes(capacity_), " on GPU ",
               device_, ": ", driver_error_name(rc), ". Lower WEFT_HEAP_SIZE or free GPU memory.");
  handles_.assign(world_, 0);
  handles_[rank_] = own_;

  int fd = -1;
  WEFT_CU(driver().cuMemExportToShareableHandle(&fd, own_, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  std::vector<PeerHandle> peers;
  try {
    peers = exchange_fds(store_, team, fd, capacity_);
  } catch (...) {
    ::close(fd);
    driver().cuMemRelease(own_);
    throw;
  }
  ::close(fd);
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) continue;
    CUresult irc = driver().cuMemImportFromShareableHandle(
        &handles_[r], reinterpret_cast<void*>(static_cast<std::uintptr_t>(peers[r].fd)),
        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    ::close(peers[r].fd);
    WEFT_REQUIRE(irc == CUDA_SUCCESS, "cannot import rank ", r, "'s heap handle: ", driver_error_name(irc));
  }
  for (int r = 0; r < world_; ++r) {
    CUdeviceptr va = 0;
    map(handles_[r], &va);
    bases_[r] = reinterpret_cast<char*>(va);
  }
  publish_bases();
  store_.barrier("heap mapped");
  WEFT_LOG(info, "native symmetric heap: ", format_bytes(capacity_), " per rank, ", world_, " ranks mapped");
}

void NativeHeap::map(CUmemGenericAllocationHandle handle, CUdeviceptr* va) {
  WEFT_CU(driver().cuMemAddressReserve(va, capacity_, 0, 0, 0));
  WEFT_CU(driver().cuMemMap(*va, capacity_, 0, handle, 0));
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device_;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  WEFT_CU(driver().cuMemSetAccess(*va, capacity_, &access, 1));
}

NativeHeap::~NativeHeap() {
  // Meet the peers before anyone unmaps. Unmapping goes ahead even where they
  // were not met: imported handles keep a peer's memory alive until every
  // process released it, so the order below is always safe.
  meet_peers_at_teardown();
  for (int r = 0; r < world_; ++r) {
    if (!bases_[r]) continue;
    auto va = reinterpret_cast<CUdeviceptr>(bases_[r]);
    driver().cuMemUnmap(va, capacity_);
    driver().cuMemAddressFree(va, capacity_);
  }
  for (int r = 0; r < world_; ++r)
    if (handles_[r]) driver().cuMemRelease(handles_[r]);
}

}  // namespace

std::unique_ptr<SymmetricHeap> make_native_heap(Store& store, const Team& team, std::uint64_t capacity) {
  return std::make_unique<NativeHeap>(store, team, capacity);
}

}  // namespace weft
