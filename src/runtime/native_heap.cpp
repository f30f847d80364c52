#include "native_heap.hpp"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <exception>

#include "ipc_socket.hpp"
#include "weft/core/driver.hpp"
#include "weft/core/env.hpp"
#include "weft/core/error.hpp"
#include "weft/core/log.hpp"

namespace weft {
namespace {

class NativeHeap final : public SymmetricHeap {
 public:
  NativeHeap(Store& store, const Team& team, std::uint64_t capacity);
  ~NativeHeap() override;

  void* alloc(std::uint64_t bytes, const std::string& type, const std::string& name) override;
  void free(void* p) override;
  void* peer_ptr(const void* p, int pe) const override;
  bool contains(const void* p, std::uint64_t bytes) const override;
  std::string describe_offset(std::uint64_t offset) const override;
  char* base() const override { return reinterpret_cast<char*>(bases_[rank_]); }
  std::uint64_t capacity() const override { return capacity_; }
  char* const* peer_bases_device() const override { return d_bases_; }
  const HeapAllocator& allocator() const override { return allocator_; }

 private:
  std::vector<HeapRequest> exchange(const HeapRequest& req, const char* what);
  void map(CUmemGenericAllocationHandle handle, CUdeviceptr* va);

  Store& store_;
  int rank_, world_;
  int device_;
  std::uint64_t capacity_ = 0;
  CUmemGenericAllocationHandle own_ = 0;
  std::vector<CUmemGenericAllocationHandle> handles_;  // per rank (own_ at rank_)
  std::vector<CUdeviceptr> bases_;                     // per rank: mapped here
  char** d_bases_ = nullptr;
  HeapAllocator allocator_;
  std::map<std::uint64_t, std::string> names_;  // offset -> "name (type)"
  std::uint64_t sequence_ = 0;
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
    : store_(store),
      rank_(team.rank),
      world_(team.world_size),
      device_(team.device),
      capacity_((capacity + granularity(team.device) - 1) / granularity(team.device) * granularity(team.device)),
      allocator_(capacity_, 256) {
  // The checks that make the native backend valid, each with its remedy.
  WEFT_REQUIRE(team.single_node(), "the native symmetric heap needs every rank on one node, but the job spans ",
               team.num_nodes, " nodes; the NVSHMEM backend (multi-node) is not available yet");
  WEFT_REQUIRE(team.vmm_supported && team.vmm_fd_supported, "GPU ", team.device, " (", team.gpu_name[rank_],
               ") lacks CUDA virtual memory management with POSIX file-descriptor handles, which the native heap needs");
  for (int r = 0; r < world_; ++r)
    WEFT_REQUIRE(team.links[r].peer_access, "rank ", rank_, "'s GPU (", team.pci_bus_id[rank_],
                 ") has no peer access to rank ", r, "'s GPU (", team.pci_bus_id[r], "): link ",
                 team.links[r].describe(), ". The native heap needs peer access between all GPUs.");

  // Every rank must use the same heap size, or offsets would not be symmetric.
  auto sizes = store_.all_gather(std::to_string(capacity_), "heap sizes");
  for (int r = 0; r < world_; ++r)
    WEFT_REQUIRE(sizes[r] == sizes[0], "ranks disagree on the symmetric heap size: rank 0 has ", sizes[0],
                 " bytes but rank ", r, " has ", sizes[r], " bytes (set WEFT_HEAP_SIZE the same on every rank)");

  CUmemAllocationProp prop = allocation_prop(device_);
  CUresult rc = driver().cuMemCreate(&own_, capacity_, &prop, 0);
  WEFT_REQUIRE(rc == CUDA_SUCCESS, "cannot create a symmetric heap of ", format_bytes(capacity_), " on GPU ",
               device_, ": ", driver_error_name(rc), ". Lower WEFT_HEAP_SIZE or free GPU memory.");
  handles_.assign(world_, 0);
  bases_.assign(world_, 0);
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
  for (int r = 0; r < world_; ++r) map(handles_[r], &bases_[r]);

  WEFT_CUDA(cudaMalloc(reinterpret_cast<void**>(&d_bases_), sizeof(char*) * world_));
  std::vector<char*> host_bases(world_);
  for (int r = 0; r < world_; ++r) host_bases[r] = reinterpret_cast<char*>(bases_[r]);
  WEFT_CUDA(cudaMemcpy(d_bases_, host_bases.data(), sizeof(char*) * world_, cudaMemcpyHostToDevice));
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
  // Peers may still be reading or writing this heap: finish local work, then
  // meet them before anyone unmaps (skipped while an exception unwinds, when
  // the peers may never arrive). Imported handles keep a peer's memory alive
  // until every process released it, so the order below is always safe.
  cudaDeviceSynchronize();
  if (std::uncaught_exceptions() == 0) {
    try {
      store_.barrier("heap teardown");
    } catch (const std::exception& e) {
      WEFT_LOG(warn, "heap teardown without the peers: ", e.what());
    }
  }
  for (int r = 0; r < world_; ++r) {
    if (!bases_[r]) continue;
    driver().cuMemUnmap(bases_[r], capacity_);
    driver().cuMemAddressFree(bases_[r], capacity_);
  }
  for (int r = 0; r < world_; ++r)
    if (handles_[r]) driver().cuMemRelease(handles_[r]);
  if (d_bases_) cudaFree(d_bases_);
}

std::vector<HeapRequest> NativeHeap::exchange(const HeapRequest& req, const char* what) {
  auto blobs = store_.all_gather(req.serialize(), what);
  std::vector<HeapRequest> all;
  for (auto& b : blobs) all.push_back(HeapRequest::deserialize(b));
  return all;
}

void* NativeHeap::alloc(std::uint64_t bytes, const std::string& type, const std::string& name) {
  HeapRequest req{sequence_++, "alloc", bytes, type, name};
  // Every rank holds an identical allocator, so each decides alone, then they compare.
  auto offset = allocator_.allocate(bytes);
  if (offset) {  // zero before the exchange below, which every peer passes before using the buffer
    WEFT_CUDA(cudaMemset(base() + *offset, 0, allocator_.block_size(*offset)));
    WEFT_CUDA(cudaDeviceSynchronize());
  }
  std::string mismatch = check_same_request(exchange(req, "symmetric heap alloc"));
  if (!mismatch.empty()) {
    if (offset) allocator_.release(*offset);
    WEFT_FAIL(mismatch);
  }
  WEFT_REQUIRE(offset, "symmetric heap exhausted: the ", req.describe(), " does not fit (",
               format_bytes(allocator_.bytes_in_use()), " of ", format_bytes(capacity_),
               " in use, largest free block ", allocator_.largest_free_block(),
               " bytes). Raise WEFT_HEAP_SIZE (now ", format_bytes(capacity_), ") or free buffers.");
  names_[*offset] = str(name, " (", type, ")");
  return base() + *offset;
}

void NativeHeap::free(void* p) {
  auto offset = static_cast<std::uint64_t>(static_cast<char*>(p) - base());
  bool live = p >= base() && offset < capacity_ && allocator_.block_size(offset) != 0;
  HeapRequest req{sequence_++, "free", live ? offset : ~std::uint64_t{0}, "", live ? names_[offset] : "?"};
  std::string mismatch = check_same_request(exchange(req, "symmetric heap free"));
  WEFT_REQUIRE(mismatch.empty(), mismatch);
  WEFT_REQUIRE(live, "symmetric heap free: ", p, " is not the start of a live symmetric allocation");
  allocator_.release(offset);
  names_.erase(offset);
}

void* NativeHeap::peer_ptr(const void* p, int pe) const {
  WEFT_REQUIRE(pe >= 0 && pe < world_, "peer_ptr: rank ", pe, " is outside the world of ", world_);
  auto offset = static_cast<const char*>(p) - base();
  WEFT_REQUIRE(offset >= 0 && static_cast<std::uint64_t>(offset) < capacity_, "peer_ptr: ", p,
               " is not in the symmetric heap");
  return reinterpret_cast<char*>(bases_[pe]) + offset;
}

bool NativeHeap::contains(const void* p, std::uint64_t bytes) const {
  auto offset = static_cast<const char*>(p) - base();
  if (offset < 0 || static_cast<std::uint64_t>(offset) >= capacity_) return false;
  return allocator_.find_block(static_cast<std::uint64_t>(offset), bytes).has_value();
}

std::string NativeHeap::describe_offset(std::uint64_t offset) const {
  auto block = allocator_.find_block(offset);
  if (!block) return str("heap offset ", offset, " (no live allocation)");
  auto it = names_.find(block->first);
  std::string name = it == names_.end() ? "?" : it->second;
  return str("'", name, "' + ", offset - block->first, " bytes (heap offset ", offset, ")");
}

}  // namespace

std::unique_ptr<SymmetricHeap> make_native_heap(Store& store, const Team& team, std::uint64_t capacity) {
  return std::make_unique<NativeHeap>(store, team, capacity);
}

}  // namespace weft
