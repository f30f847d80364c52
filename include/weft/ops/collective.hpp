// weft/ops/collective.hpp - what every collective plan shares: variant and mode names (element types: core/dtype.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "weft/core/dtype.hpp"

namespace weft {

/// Throws weft::Error: "unknown WHAT 'TEXT': expected one of NAMES" (used by parse_name).
[[noreturn]] void throw_unknown_name(const std::string& what, const std::string& text, const std::string& names);

/// One entry of an operation's variant table: the enum value, its name, and
/// an optional longer alias accepted when parsing.
template <class E>
struct VariantName {
  E value;
  const char* name;
  const char* alias = nullptr;
};

/// The name of `v` in `table` ("?" if absent).
template <class E, std::size_t N>
const char* variant_name(const VariantName<E> (&table)[N], E v) {
  for (const auto& entry : table)
    if (entry.value == v) return entry.name;
  return "?";
}

/// Parses a name (or alias) of `table`; throws weft::Error "unknown <what>
/// '<text>': expected one of <every name>".
template <class E, std::size_t N>
E parse_name(const VariantName<E> (&table)[N], const std::string& text, const std::string& what) {
  std::string names;
  for (const auto& entry : table) {
    if (text == entry.name || (entry.alias && text == entry.alias)) return entry.value;
    names += names.empty() ? entry.name : std::string(", ") + entry.name;
  }
  throw_unknown_name(what, text, names);
}

/// Parses a variant name (or alias) of operation `op` ("unknown <op> variant
/// '<text>'", listing every accepted name).
template <class E, std::size_t N>
E parse_variant(const VariantName<E> (&table)[N], const std::string& text, const char* op) {
  return parse_name(table, text, std::string(op) + " variant");
}

/// How an overlapped operator (AgGemm, GemmRs, GemmAr) runs.
enum class OverlapMode {
  automatic,   ///< time every path on the first run, keep the fastest
  fused,       ///< always the overlapped kernels
  sequential   ///< always a plain GEMM and a plain collective, one after the other: weft's
               ///< collective or NCCL's, whichever the first run measures faster
};
/// "auto", "fused", "sequential".
const char* to_string(OverlapMode m);
/// Parses those names ("automatic" and "seq" too); throws naming the accepted ones.
OverlapMode parse_overlap_mode(const std::string& name);

}  // namespace weft
