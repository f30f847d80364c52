// block_heap.hpp (private) - what both backends of the symmetric heap share: one
// block of `capacity` bytes per rank, mapped (or not) for every peer, carved by
// a HeapAllocator that every rank runs identically, each call checked across ranks.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "weft/runtime/heap.hpp"
#include "weft/runtime/store.hpp"
#include "weft/runtime/team.hpp"

namespace weft {

class BlockHeap : public SymmetricHeap {
 public:
  ~BlockHeap() override;

  void* alloc(std::uint64_t bytes, const std::string& type, const std::string& name) override;
  void free(void* p) override;
  void* peer_ptr(const void* p, int pe) const override;
  bool contains(const void* p, std::uint64_t bytes) const override;
  std::string describe_offset(std::uint64_t offset) const override;
  bool peer_reachable(int pe) const override { return pe >= 0 && pe < world_ && bases_[pe] != nullptr; }
  const Reachability& reachability() const override { return reach_; }
  char* base() const override { return bases_[rank_]; }
  std::uint64_t capacity() const override { return capacity_; }
  char* const* peer_bases_device() const override { return d_bases_; }
  const HeapAllocator& allocator() const override { return allocator_; }

 protected:
  /// `capacity` rounded up to a multiple of `alignment` (what the backend maps in); bases_ start as nullptr.
  BlockHeap(Store& store, const Team& team, std::uint64_t capacity, std::uint64_t alignment);
  /// Checks that every rank reserves the same capacity (collective; throws naming WEFT_HEAP_SIZE).
  void check_same_capacity();
  /// Copies bases_ (this rank's at rank_, nullptr for peers not mapped here)
  /// into the device array. With `exchange`, also gathers every rank's row of
  /// mapped peers into reach_ (collective); without, reach_ stays all true
  /// (a backend that maps every peer or throws).
  void publish_bases(bool exchange = false);
  /// A backend's destructor, before it releases its block: finishes local
  /// work, then meets the peers, which may still be reading or writing it.
  /// Skipped while an exception unwinds (the peers may never arrive). False
  /// if the peers were not met (the failure is logged).
  bool meet_peers_at_teardown();

  Store& store_;
  int rank_, world_;
  std::uint64_t capacity_;
  std::vector<char*> bases_;  // per rank: where its block is mapped in this process, or nullptr
  Reachability reach_;        // [from][to]: rank `from` maps rank `to`'s block (the same on every rank)

 private:
  std::vector<HeapRequest> exchange(const HeapRequest& req, const char* what);

  char** d_bases_ = nullptr;
  HeapAllocator allocator_;
  std::map<std::uint64_t, std::string> names_;  // offset -> "name (type)"
  std::uint64_t sequence_ = 0;
};

}  // namespace weft
