// grouped_config.hpp (private) - one compiled grouped GEMM configuration, and the host-side
// rules GroupedGemm follows (the size heuristic, the checks), kept free of CUDA so the CPU tests reach them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "weft/device/world.cuh"
#include "weft/gemm/grouped_gemm.hpp"

namespace weft::gemm_detail {

/// Fault bits the prologue records (GroupedGemm::check_counts).
enum GroupedFault : std::uint32_t {
  kNegativeCount = 1u,  ///< an expert's count was negative (taken as 0)
  kOverCapacity = 2u,   ///< the counts summed past max_rows (the rows past it were not computed)
  kBadFirstRow = 4u,    ///< with first rows: a range out of order, overlapping or past max_rows (computed as empty)
  kBadRowFlag = 8u,     ///< with a wait: a row's flag index outside [0, flag_count) (that row waited for nothing)
};

/// What the prologue records for check_counts (device memory, zeroed at plan time and after a report).
struct GroupedFaultRecord {
  std::uint32_t bits;         ///< GroupedFault bits
  std::uint32_t first_total;  ///< the first total of counts past max_rows (packed rows)
  /// E - the lowest expert with a bad range, 0 if none: kept by atomicMax, so
  /// the lowest such expert wins whatever order the threads record in.
  std::uint32_t bad_range_mark;
  /// With a wait: 1 + the first row whose flag index was out of range, 0 if
  /// none (kept by atomicCAS from 0: some such row, named in the message).
  std::uint32_t bad_flag_row;
};

/// The tile-level wait as the grouped kernel takes it (GroupedRowWait, with
/// the World by value). flags == nullptr: no wait.
struct GroupedWait {
  dev::World world{};
  const std::uint64_t* flags = nullptr;
  const std::int32_t* row_flag = nullptr;
  std::uint64_t value = 1;
  int flag_count = 0;
  int flags_per_rank = 1;
};

/// Arguments every grouped configuration takes.
struct GroupedProblem {
  int experts;
  std::int64_t n, k, max_rows;
  const void* a;
  const void* w;
  void* out;
  const std::int32_t* expert_rows;
  const std::int32_t* expert_first_row;  ///< [E] or null (packed)
  void* workspace;         ///< GroupedConfig::workspace bytes: the per-expert arrays, then CUTLASS's
  GroupedFaultRecord* faults;
  int sm_count;
  GroupedWait wait{};
  GroupedRowsDone report{};  ///< counters == nullptr: no report
};

/// One instantiated grouped kernel: its types, its tile, and how to run it.
struct GroupedConfig {
  DType dtype;
  BLayout w_layout;
  const char* name;
  int tile_m, tile_n, cluster_m, cluster_n;
  /// Bytes of device workspace for `experts` groups on `sm_count` SMs.
  std::size_t (*workspace)(int experts, int sm_count);
  /// Enqueues the prologue and the kernel on `stream`; "" on success, else why not.
  const char* (*run)(const GroupedProblem&, cudaStream_t stream);
};

/// Every compiled grouped configuration: the grouped rows of src/gemm/kernel_table.cmake, in its order.
const std::vector<const GroupedConfig*>& all_grouped_configs();

/// The tile of a candidate, for the size heuristic.
struct GroupedTile {
  int tile_m, tile_n, cluster_m, cluster_n;
};

/// Output tiles the grouped scheduler walks when `rows` spread evenly over
/// `experts`: per expert, its row tiles rounded up to whole clusters along M,
/// times the column tiles rounded up to whole clusters along N.
std::int64_t grouped_tiles(const GroupedTile& t, std::int64_t n, std::int64_t rows, int experts);

/// The size heuristic (docs/decisions/0056): the candidate with the least
/// estimated time, waves x a tile's cost, where waves = ceil(tiles / SMs) and
/// a tile's cost is its area over the tile's relative throughput (a
/// 128x128 cooperative tile does about 0.85 of a 128x256's work per SM-second:
/// it loads more operand bytes per flop). Ties go to the earlier candidate.
/// K scales every candidate alike and does not enter. Returns the index into `tiles`.
std::size_t choose_grouped_tile(const std::vector<GroupedTile>& tiles, std::int64_t n, std::int64_t rows, int experts,
                                int sm_count);

/// "" if `o` describes a plan GroupedGemm can build, else what was expected.
std::string grouped_options_error(const GroupedGemmOptions& o);

/// "" if `args` are operands a plan of `o` can run, else what was expected.
std::string grouped_args_error(const GroupedGemmOptions& o, const GroupedGemmArgs& args);

/// The message check_counts raises for the prologue's record, or "" if it holds no fault.
std::string grouped_fault_message(const GroupedGemmOptions& o, const GroupedFaultRecord& record);

}  // namespace weft::gemm_detail
