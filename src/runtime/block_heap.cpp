#include "block_heap.hpp"

#include <cuda_runtime_api.h>

#include <exception>

#include "weft/core/env.hpp"
#include "weft/core/error.hpp"
#include "weft/core/log.hpp"

namespace weft {

BlockHeap::BlockHeap(Store& store, const Team& team, std::uint64_t capacity, std::uint64_t alignment)
    : store_(store),
      rank_(team.rank),
      world_(team.world_size),
      capacity_((capacity + alignment - 1) / alignment * alignment),
      bases_(team.world_size, nullptr),
      reach_(team.world_size, std::vector<bool>(team.world_size, true)),
      allocator_(capacity_, 256) {}

bool BlockHeap::meet_peers_at_teardown() {
  cudaDeviceSynchronize();
  if (std::uncaught_exceptions() != 0) return false;
  try {
    store_.barrier("heap teardown");
  } catch (const std::exception& e) {
    WEFT_LOG(warn, to_string(backend()), " heap teardown without the peers: ", e.what());
    return false;
  }
  return true;
}

BlockHeap::~BlockHeap() {
  if (d_bases_) cudaFree(d_bases_);
}

void BlockHeap::check_same_capacity() {
  // Every rank must use the same heap size, or offsets would not be symmetric.
  auto sizes = store_.all_gather(std::to_string(capacity_), "heap sizes");
  for (int r = 0; r < world_; ++r)
    WEFT_REQUIRE(sizes[r] == sizes[0], "ranks disagree on the symmetric heap size: rank 0 has ", sizes[0],
                 " bytes but rank ", r, " has ", sizes[r], " bytes (set WEFT_HEAP_SIZE the same on every rank)");
}

void BlockHeap::publish_bases(bool exchange) {
  if (!d_bases_) WEFT_CUDA(cudaMalloc(reinterpret_cast<void**>(&d_bases_), sizeof(char*) * world_));
  WEFT_CUDA(cudaMemcpy(d_bases_, bases_.data(), sizeof(char*) * world_, cudaMemcpyHostToDevice));
  if (!exchange) return;
  std::string row;
  for (int pe = 0; pe < world_; ++pe) row += bases_[pe] ? '1' : '0';
  auto rows = store_.all_gather(row, "heap reachability");
  for (int from = 0; from < world_; ++from) {
    WEFT_REQUIRE(static_cast<int>(rows[from].size()) == world_, "corrupt reachability row from rank ", from);
    for (int to = 0; to < world_; ++to) reach_[from][to] = rows[from][to] == '1';
  }
}

std::vector<HeapRequest> BlockHeap::exchange(const HeapRequest& req, const char* what) {
  auto blobs = store_.all_gather(req.serialize(), what);
  std::vector<HeapRequest> all;
  for (auto& b : blobs) all.push_back(HeapRequest::deserialize(b));
  return all;
}

void* BlockHeap::alloc(std::uint64_t bytes, const std::string& type, const std::string& name) {
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

void BlockHeap::free(void* p) {
  auto offset = static_cast<std::uint64_t>(static_cast<char*>(p) - base());
  bool live = p >= base() && offset < capacity_ && allocator_.block_size(offset) != 0;
  HeapRequest req{sequence_++, "free", live ? offset : ~std::uint64_t{0}, "", live ? names_[offset] : "?"};
  std::string mismatch = check_same_request(exchange(req, "symmetric heap free"));
  WEFT_REQUIRE(mismatch.empty(), mismatch);
  WEFT_REQUIRE(live, "symmetric heap free: ", p, " is not the start of a live symmetric allocation");
  allocator_.release(offset);
  names_.erase(offset);
}

void* BlockHeap::peer_ptr(const void* p, int pe) const {
  WEFT_REQUIRE(pe >= 0 && pe < world_, "peer_ptr: rank ", pe, " is outside the world of ", world_);
  auto offset = static_cast<const char*>(p) - base();
  WEFT_REQUIRE(offset >= 0 && static_cast<std::uint64_t>(offset) < capacity_, "peer_ptr: ", p,
               " is not in the symmetric heap");
  WEFT_REQUIRE(bases_[pe], "peer_ptr: rank ", pe, "'s ", to_string(backend()), " heap is not mapped into rank ", rank_,
               " (no direct path: another node, another virtual node, or no peer access); such peers are reached ",
               "through NVSHMEM's put/get (weft/device/remote.cuh), not by address");
  return bases_[pe] + offset;
}

bool BlockHeap::contains(const void* p, std::uint64_t bytes) const {
  auto offset = static_cast<const char*>(p) - base();
  if (offset < 0 || static_cast<std::uint64_t>(offset) >= capacity_) return false;
  return allocator_.find_block(static_cast<std::uint64_t>(offset), bytes).has_value();
}

std::string BlockHeap::describe_offset(std::uint64_t offset) const {
  auto block = allocator_.find_block(offset);
  if (!block) return str("heap offset ", offset, " (no live allocation)");
  auto it = names_.find(block->first);
  std::string name = it == names_.end() ? "?" : it->second;
  return str("'", name, "' + ", offset - block->first, " bytes (heap offset ", offset, ")");
}

}  // namespace weft
