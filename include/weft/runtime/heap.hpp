// weft/runtime/heap.hpp - the symmetric heap: the same buffers on every rank, reachable from every peer.
//
// Every rank reserves a heap of the same size; collective allocations return
// the same offset on every rank, so a pointer into this rank's heap names the
// same object everywhere (World::symm_at turns it into a peer's address).
// SymmetricHeap is the interface, with two backends: the native heap (CUDA VMM
// + POSIX-fd IPC, one node) and the NVSHMEM heap (one nvshmem_align block per rank,
// optional at build time; many nodes). heap_backend.cpp chooses between them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "weft/core/env.hpp"

namespace weft {

class Store;

/// Which implementation backs the symmetric heap (docs/decisions/0057).
enum class HeapBackend {
  automatic,  ///< nvshmem where the job spans nodes and weft was built with NVSHMEM; native otherwise
  native,     ///< CUDA VMM memory shared by file descriptors: one node
  nvshmem,    ///< NVSHMEM's symmetric heap: any number of nodes (needs a build with WEFT_NVSHMEM)
};

/// "auto", "native", "nvshmem".
const char* to_string(HeapBackend b);
/// Parses WEFT_HEAP_BACKEND's forms: "auto" (or "automatic"), "native",
/// "nvshmem"; case-insensitive, surrounding blanks ignored. Throws weft::Error
/// naming `what` and the accepted values otherwise.
HeapBackend parse_heap_backend(const std::string& text, const std::string& what = "WEFT_HEAP_BACKEND");
/// True when this libweft was built with the NVSHMEM backend (CMake found NVSHMEM;
/// WEFT_NVSHMEM=AUTO or ON). The library itself is opened at run time.
bool nvshmem_built();
/// The backend a job runs: `requested` resolved (automatic: nvshmem iff
/// num_nodes > 1 and `built_with_nvshmem`), then checked. Pure logic, the same
/// on every rank for the same inputs. Throws weft::Error, saying how to get
/// what was asked for: nvshmem without a build that has it (how to build one),
/// native for a job that spans nodes, or a job that spans nodes with no NVSHMEM.
/// `virtual_nodes` > 1 (WEFT_VIRTUAL_NODES: one machine's ranks split into
/// nodes, Team::virtual_nodes) needs NVSHMEM: automatic takes it, and native,
/// or a build without NVSHMEM, throws naming the setting.
HeapBackend choose_heap_backend(HeapBackend requested, int num_nodes, bool built_with_nvshmem, int virtual_nodes = 1);
/// Collective (through `store`): the backend of the job. Each rank's request
/// is `option` if set, else WEFT_HEAP_BACKEND from `env`, else automatic; the
/// ranks' requests are compared first, so ranks that disagree all throw,
/// naming each request, instead of building different heaps; then
/// choose_heap_backend decides, identically on every rank. Context::create calls it.
HeapBackend agree_heap_backend(std::optional<HeapBackend> option, const EnvMap& env, int num_nodes,
                               bool built_with_nvshmem, Store& store, int virtual_nodes = 1);

/// Which rank maps which rank's heap: [from][to], true where rank `from` may
/// load and store rank `to`'s heap (SymmetricHeap::peer_reachable as `from`
/// sees it). Every rank holds the same matrix.
using Reachability = std::vector<std::vector<bool>>;
/// "" when every pair is mapped, else one line per rank that misses peers:
/// "rank 0 cannot address rank(s) 2, 3". Pure.
std::string unreachable_pairs(const Reachability& reach);
/// Throws weft::Error unless every rank maps every peer, naming `who` (the
/// operator that needs it), the backend and each pair without a direct path,
/// and ending with `remedy` (what would serve those peers; by default, that
/// `who` has no path through NVSHMEM yet and must run on one node). Pure:
/// every rank, holding the same matrix, reaches the same verdict.
/// Context::require_direct_peers calls it.
void require_direct_peers(const std::string& who, const Reachability& reach, HeapBackend backend,
                          const std::string& remedy = "");

/// The offset bookkeeping of a heap: first-fit over a sorted free list with
/// coalescing. Pure CPU logic; every rank runs an identical copy, so identical
/// requests give identical offsets.
class HeapAllocator {
 public:
  /// A heap of `capacity` bytes whose blocks start at multiples of `alignment` (a power of two).
  HeapAllocator(std::uint64_t capacity, std::uint64_t alignment);
  /// Reserves `bytes` (rounded up to the alignment; 0 is treated as 1). Returns
  /// the offset, or nullopt when no free block is large enough.
  std::optional<std::uint64_t> allocate(std::uint64_t bytes);
  /// Returns the block at `offset` to the free list. Throws weft::Error if no
  /// block starts there (double free, foreign pointer).
  void release(std::uint64_t offset);
  /// Size reserved for the block at `offset` (after rounding), or 0 if none.
  std::uint64_t block_size(std::uint64_t offset) const;
  /// The live block containing [offset, offset + bytes), as (start, size), if any.
  std::optional<std::pair<std::uint64_t, std::uint64_t>> find_block(std::uint64_t offset,
                                                                     std::uint64_t bytes = 1) const;
  /// Bookkeeping, for reports and tests: the heap's size, its block
  /// alignment, bytes held by live blocks, the largest block alloc() could
  /// still return, and how many blocks are live.
  std::uint64_t capacity() const { return capacity_; }
  std::uint64_t alignment() const { return alignment_; }
  std::uint64_t bytes_in_use() const { return in_use_; }
  std::uint64_t largest_free_block() const;
  std::size_t live_blocks() const { return used_.size(); }

 private:
  std::uint64_t capacity_, alignment_, in_use_ = 0;
  std::map<std::uint64_t, std::uint64_t> free_;  // offset -> size
  std::map<std::uint64_t, std::uint64_t> used_;  // offset -> size
};

/// What one rank asked of a collective heap call, as exchanged between ranks.
struct HeapRequest {
  std::uint64_t sequence = 0;  ///< n-th collective heap call on this rank
  std::string kind;            ///< "alloc" or "free"
  std::uint64_t bytes = 0;     ///< alloc: requested size; free: offset
  std::string type;            ///< element type name ("bf16", "u64", "bytes")
  std::string name;            ///< what the buffer is for ("all_gather.output")

  /// A length-prefixed binary blob for the store, and back; deserialize throws
  /// weft::Error on a truncated blob.
  std::string serialize() const;
  static HeapRequest deserialize(const std::string& blob);
  std::string describe() const;  ///< "alloc of 1048576 bytes of bf16 for 'x'"
};

/// Checks that every rank made the same request. Returns the empty string if
/// they agree, else a message naming the first disagreeing rank and both
/// requests. Each rank evaluates it on the same all-gathered data, so all
/// ranks reach the same verdict.
std::string check_same_request(const std::vector<HeapRequest>& per_rank);

/// The interface every symmetric heap backend offers.
class SymmetricHeap {
 public:
  virtual ~SymmetricHeap() = default;

  /// Collective: every rank calls with the same size, type and name, in the
  /// same order. Returns this rank's address of the new buffer, zero-filled.
  /// Throws weft::Error on every rank if the ranks' requests differ (naming
  /// both) or the heap is exhausted (naming the heap size and WEFT_HEAP_SIZE).
  virtual void* alloc(std::uint64_t bytes, const std::string& type, const std::string& name) = 0;
  /// Typed convenience: `count` elements of T.
  template <class T>
  T* alloc(std::uint64_t count, const std::string& type, const std::string& name) {
    return static_cast<T*>(alloc(count * sizeof(T), type, name));
  }
  /// Collective: every rank frees the same buffer. Throws if ranks disagree or
  /// the pointer is not the start of a live block.
  virtual void free(void* p) = 0;

  /// Host-visible address of symmetric object `p` on rank `pe`, mapped into
  /// this process (for copy-engine transfers and tests). Throws if `pe` is
  /// not peer_reachable, naming the backend and the peer.
  virtual void* peer_ptr(const void* p, int pe) const = 0;
  /// True if [p, p + bytes) lies inside one live allocation of this heap.
  virtual bool contains(const void* p, std::uint64_t bytes) const = 0;
  /// Name and offset of the allocation holding heap offset `offset`, for reports.
  virtual std::string describe_offset(std::uint64_t offset) const = 0;

  /// Which backend this is (never automatic).
  virtual HeapBackend backend() const = 0;
  /// True when rank `pe`'s heap is mapped into this process, so peer_ptr and
  /// World::symm_at give addresses loads and stores can use: every peer under
  /// the native heap; under NVSHMEM, the peers nvshmem_ptr reaches (NVLink,
  /// the same GPU) of this rank's node. The device array peer_bases_device() holds nullptr for the others.
  virtual bool peer_reachable(int pe) const = 0;
  /// peer_reachable for every pair of ranks, exchanged when the heap was built
  /// (the same on every rank): all true under the native heap; under NVSHMEM,
  /// false for peers on another node, or another virtual node (Team::virtual_nodes).
  virtual const Reachability& reachability() const = 0;

  virtual char* base() const = 0;                 ///< this rank's heap
  virtual std::uint64_t capacity() const = 0;     ///< bytes per rank
  /// Device array [world] of mapped bases; nullptr where !peer_reachable(pe).
  virtual char* const* peer_bases_device() const = 0;
  virtual const HeapAllocator& allocator() const = 0;  ///< the offsets' bookkeeping (same on every rank)
};

}  // namespace weft
