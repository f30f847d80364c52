#include <cstring>

#include "weft/core/env.hpp"
#include "weft/core/error.hpp"
#include "weft/runtime/heap.hpp"

namespace weft {

HeapAllocator::HeapAllocator(std::uint64_t capacity, std::uint64_t alignment)
    : capacity_(capacity), alignment_(alignment) {
  WEFT_REQUIRE(alignment > 0 && (alignment & (alignment - 1)) == 0, "heap alignment ", alignment,
               " must be a power of two");
  WEFT_REQUIRE(capacity >= alignment, "heap capacity ", capacity, " is smaller than its alignment ",
               alignment);
  capacity_ = capacity / alignment * alignment;
  free_[0] = capacity_;
}

std::optional<std::uint64_t> HeapAllocator::allocate(std::uint64_t bytes) {
  std::uint64_t size = (std::max<std::uint64_t>(bytes, 1) + alignment_ - 1) / alignment_ * alignment_;
  if (size < bytes) return std::nullopt;  // overflow
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < size) continue;
    std::uint64_t offset = it->first, left = it->second - size;
    free_.erase(it);
    if (left) free_[offset + size] = left;
    used_[offset] = size;
    in_use_ += size;
    return offset;
  }
  return std::nullopt;
}

void HeapAllocator::release(std::uint64_t offset) {
  auto it = used_.find(offset);
  WEFT_REQUIRE(it != used_.end(), "symmetric heap: no live allocation starts at offset ", offset,
               " (freed twice, or not from this heap)");
  std::uint64_t size = it->second;
  used_.erase(it);
  in_use_ -= size;
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && offset + size == next->first) {  // merge with the following block
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {  // merge with the preceding block
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += size;
      return;
    }
  }
  free_[offset] = size;
}

std::uint64_t HeapAllocator::block_size(std::uint64_t offset) const {
  auto it = used_.find(offset);
  return it == used_.end() ? 0 : it->second;
}

std::optional<std::pair<std::uint64_t, std::uint64_t>> HeapAllocator::find_block(std::uint64_t offset,
                                                                                std::uint64_t bytes) const {
  auto it = used_.upper_bound(offset);
  if (it == used_.begin()) return std::nullopt;
  --it;
  if (offset + bytes < offset || offset + bytes > it->first + it->second) return std::nullopt;
  return *it;
}

std::uint64_t HeapAllocator::largest_free_block() const {
  std::uint64_t best = 0;
  for (auto& [offset, size] : free_) best = std::max(best, size);
  return best;
}

namespace {
void put_u64(std::string& out, std::uint64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); }
void put_str(std::string& out, const std::string& s) {
  put_u64(out, s.size());
  out += s;
}
std::uint64_t get_u64(const std::string& in, std::size_t& pos) {
  WEFT_REQUIRE(pos + 8 <= in.size(), "corrupt heap request from a peer (", in.size(), " bytes)");
  std::uint64_t v;
  std::memcpy(&v, in.data() + pos, 8);
  pos += 8;
  return v;
}
std::string get_str(const std::string& in, std::size_t& pos) {
  std::uint64_t n = get_u64(in, pos);
  WEFT_REQUIRE(pos + n <= in.size(), "corrupt heap request from a peer (", in.size(), " bytes)");
  std::string s = in.substr(pos, n);
  pos += n;
  return s;
}
}  // namespace

std::string HeapRequest::serialize() const {
  std::string out;
  put_u64(out, sequence);
  put_str(out, kind);
  put_u64(out, bytes);
  put_str(out, type);
  put_str(out, name);
  return out;
}

HeapRequest HeapRequest::deserialize(const std::string& blob) {
  HeapRequest r;
  std::size_t pos = 0;
  r.sequence = get_u64(blob, pos);
  r.kind = get_str(blob, pos);
  r.bytes = get_u64(blob, pos);
  r.type = get_str(blob, pos);
  r.name = get_str(blob, pos);
  return r;
}

std::string HeapRequest::describe() const {
  if (kind == "free") return str("free of the buffer at heap offset ", bytes, " ('", name, "')");
  return str("alloc of ", bytes, " bytes (", format_bytes(bytes), ") of ", type, " for '", name, "'");
}

std::string check_same_request(const std::vector<HeapRequest>& per_rank) {
  for (std::size_t r = 1; r < per_rank.size(); ++r) {
    const HeapRequest &a = per_rank[0], &b = per_rank[r];
    if (a.sequence != b.sequence || a.kind != b.kind || a.bytes != b.bytes || a.type != b.type ||
        a.name != b.name) {
      return str("symmetric heap call #", a.sequence, " differs between ranks: rank 0 asked for an ",
                 a.describe(), " (its call #", a.sequence, "), but rank ", r, " asked for an ",
                 b.describe(), " (its call #", b.sequence,
                 "). Every rank must make the same symmetric allocations in the same order.");
    }
  }
  return {};
}

}  // namespace weft
