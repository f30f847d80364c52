// weft/runtime/settings.hpp - every WEFT_* setting a Context's plans read,
// parsed once, when the Context is made (Context::settings()). A malformed
// value fails there, naming the variable, on every rank, before any plan runs.
//
// Settings read elsewhere, and why: WEFT_HEAP_BACKEND and WEFT_VIRTUAL_NODES
// by the ranks' agreement on them (runtime/heap_backend.cpp, team.cpp);
// launch variables by detect_launch_env, and WEFT_DEVICE as the team picks
// each rank's GPU (team.cpp); WEFT_NVSHMEM_LIBRARY as the NVSHMEM backend
// opens its library (nvshmem_heap.cpp); WEFT_TUNE_CACHE and WEFT_PDL by the
// GEMM engine and the launch helpers, which serve every Context of the
// process; WEFT_LOG_LEVEL by the logger.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>

#include "weft/core/env.hpp"

namespace weft {

struct Settings {
  /// WEFT_HEAP_SIZE: the symmetric heap's bytes per rank, unless ContextOptions sets them.
  std::uint64_t heap_bytes = std::uint64_t{1} << 30;
  /// WEFT_STORE_TIMEOUT: how long a rank waits for the others at the rendezvous.
  std::chrono::milliseconds store_timeout{std::chrono::seconds(120)};
  /// WEFT_WAIT_TIMEOUT: the bound of every device wait, unless ContextOptions sets it (0: none).
  std::chrono::milliseconds wait_timeout{std::chrono::seconds(60)};
  /// WEFT_CHECK_CALLS=1: every run of a plan checks that all ranks make the same call.
  bool check_calls = false;
  /// WEFT_PLAN_GRAPHS=0: overlapped plans enqueue every fused call directly, no graph.
  bool plan_graphs = true;
  /// WEFT_TRACE_OVERLAP=N: each overlapped plan logs the timeline of its first N fused calls.
  int trace_overlap = 0;
  /// WEFT_TILE_WAITS=1: hooked tiles' waits summed per flag, logged as a plan is destroyed.
  bool tile_waits = false;
  /// WEFT_OVERLAP_MIN_CHUNK: the overlapped plans' smallest copy chunk, in
  /// place of each plan's floor (0: no floor), for measuring chunk sizes;
  /// absent: each plan's floor.
  std::optional<std::uint64_t> overlap_min_chunk;
  /// WEFT_CE_CHUNK: the copy-engine collectives' chunk size (0: their rule).
  std::uint64_t ce_chunk = 0;

  /// Every setting above from `env`, defaults where absent. Throws
  /// weft::Error naming the variable and the forms it takes on a malformed one.
  static Settings read(const EnvMap& env);
};

}  // namespace weft
