// plan_key.hpp - the key the Runtime caches a plan under: which operator, and the
// integers its plan is built for (sizes, dtype, layout, ...).
//
// Every op call looks its plan up by this key, so building, hashing and
// comparing it allocates nothing: a fixed array of integers, trivially
// copyable. Its text (str(): the plan's name in errors, and what
// dist_flash_decode compares across ranks) is only formatted when a plan is
// built or an error is raised.
#pragma once

#include <array>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

namespace weft_torch {

/// The operators whose plans the Runtime caches.
enum class PlanKind : std::uint32_t {
  all_reduce,                   // count, dtype
  all_gather,                   // bytes per rank
  reduce_scatter,               // count per rank, dtype
  ag_gemm,                      // m, n, k
  gemm_rs,                      // m, n, k
  gemm_ar,                      // m, n, k
  expert_parallel,              // experts, hidden, top_k, max_tokens, max_sms
  expert_parallel_low_latency,  // experts, hidden, top_k, max_tokens, max_sms
  flash_decode,                 // layout, batch, q_heads, kv_heads, head_dim, dtype, max_kv_len,
  dist_flash_decode,            //   max_pages_per_seq, page_size, softmax_scale's bits
  ag_moe,                       // experts, hidden, top_k, max_tokens_per_rank, dtype, max_sms, mode
  moe_rs,                       //   (the rank's slice of F differs by rank: not in the key)
};

struct PlanKindInfo {
  const char* name;
  int fields;  // how many of PlanKey::fields the kind uses
};

/// Indexed by PlanKind.
inline constexpr PlanKindInfo kPlanKinds[] = {
    {"all_reduce", 2},      {"all_gather", 1},       {"reduce_scatter", 2},
    {"ag_gemm", 3},         {"gemm_rs", 3},          {"gemm_ar", 3},
    {"expert_parallel", 5}, {"expert_parallel_low_latency", 5},
    {"flash_decode", 10},   {"dist_flash_decode", 10},
    {"ag_moe", 7},          {"moe_rs", 7},
};
inline constexpr int kPlanKindCount = static_cast<int>(sizeof(kPlanKinds) / sizeof(kPlanKinds[0]));

constexpr const PlanKindInfo& kind_info(PlanKind kind) { return kPlanKinds[static_cast<int>(kind)]; }

/// The kind named `name` (kPlanKinds' names), if any.
std::optional<PlanKind> plan_kind_named(std::string_view name);

struct PlanKey {
  static constexpr int kMaxFields = 10;

  PlanKind kind{};
  std::array<std::int64_t, kMaxFields> fields{};  // the kind's fields first, the rest 0

  /// The key of a `K` plan built for `values` (integers or enums), as many as K has fields.
  template <PlanKind K, class... V>
  static PlanKey make(V... values) {
    static_assert(sizeof...(V) == kind_info(K).fields, "a plan key takes exactly its kind's fields");
    static_assert(((std::is_integral_v<V> || std::is_enum_v<V>) && ...), "a plan key's fields are integers");
    PlanKey key;
    key.kind = K;
    int i = 0;
    ((key.fields[i++] = static_cast<std::int64_t>(values)), ...);
    return key;
  }

  friend bool operator==(const PlanKey&, const PlanKey&) = default;
  /// An order that is the same in every process (the Runtime frees plans in it).
  friend auto operator<=>(const PlanKey&, const PlanKey&) = default;

  /// Mixes the kind and its fields (the rest are 0), each step a bijection of
  /// the running value (xor, an odd multiplier, an xor-shift): keys that
  /// differ in their kind alone, or in one field alone, never share a hash.
  std::size_t hash() const noexcept {
    std::uint64_t h = 0x9e3779b97f4a7c15ull * (static_cast<std::uint64_t>(kind) + 1);
    for (int i = 0, n = kind_info(kind).fields; i < n; ++i) {
      h ^= static_cast<std::uint64_t>(fields[i]);
      h *= 0xbf58476d1ce4e5b9ull;
      h ^= h >> 31;
    }
    return static_cast<std::size_t>(h);
  }

  /// The plan's name, e.g. "all_reduce 512 x bf16", "gemm_rs m=4096 n=8192 k=1024".
  std::string str() const;
};

static_assert(std::is_trivially_copyable_v<PlanKey>, "a plan key copies without allocating");
static_assert(sizeof(std::size_t) == sizeof(std::uint64_t), "PlanKey::hash returns all 64 bits");

struct PlanKeyHash {
  std::size_t operator()(const PlanKey& key) const noexcept { return key.hash(); }
};

}  // namespace weft_torch
