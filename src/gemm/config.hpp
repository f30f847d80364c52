// config.hpp (private) - one compiled GEMM configuration, behind a plain function pointer.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "weft/device/world.cuh"
#include "weft/core/dtype.hpp"
#include "weft/gemm/gemm_types.hpp"

namespace weft::gemm_detail {

/// The SM count a persistent kernel of `cluster_size`-CTA clusters is given:
/// `sm_count` rounded down to whole clusters, and at least one cluster.
/// CUTLASS's SM90 tile schedulers size the grid from this count, and along M
/// they do not round it to the cluster: 3 SMs with 2x1 clusters give a grid of
/// 3, which does not launch ("Error Internal"). A budget smaller than one
/// cluster runs one cluster: a kernel of clusters cannot run on fewer SMs.
constexpr int whole_cluster_sms(int sm_count, int cluster_size) {
  const int clusters = sm_count / cluster_size;
  return (clusters > 0 ? clusters : 1) * cluster_size;
}

/// Which load collective's producer warp waits for the flags (tile_hooks.cuh).
enum class WaitIn : int {
  none,      ///< no wait
  mainloop,  ///< before the TMA loads of a tile's A rows (AllGather + GEMM)
  epilogue,  ///< before the TMA load of a tile's source rows (GEMM + ReduceScatter)
};

/// A hooked configuration's run-time settings (see tile_hooks.cuh): what
/// tiles wait for, the tile order's rotation, and where tiles report their
/// stored rows. A plain aggregate: kernel parameter and host value alike.
struct TileWaitParams {
  dev::World world{};                    ///< for the wait's timeout report
  const std::uint64_t* flags = nullptr;  ///< flags[i] covers rows [i*rows_per_flag, (i+1)*rows_per_flag)
  std::int64_t rows_per_flag = 1;
  std::int64_t cols_per_flag = 0;        ///< > 0: flags[i] covers columns [i*cols_per_flag, (i+1)*cols_per_flag) instead
  std::uint64_t value = 1;               ///< ready when flag >= value
  std::int64_t ready_begin = 0;          ///< rows [ready_begin, ready_end) are present already: no wait
  std::int64_t ready_end = 0;
  std::int64_t rotate_rows = 0;          ///< start the tile order at the tile holding this row
  /// > 0: walk whole blocks of this many rows instead, from rotate_rows's
  /// block down (tile_walk.hpp: GEMM+ReduceScatter's ring in one launch)
  std::int64_t descending_block_rows = 0;
  int flags_per_rank = 0;                ///< > 0: flag i is signalled by rank i / flags_per_rank
  int from_rank = -1;                    ///< else: the rank that signals every flag (for the report)
  WaitIn wait_in = WaitIn::none;         ///< the collective whose producer warp waits
  unsigned long long* waited_ns = nullptr;  ///< optional: per flag, nanoseconds spent waiting on it, summed over tiles (RowSignals)
  std::uint64_t* exits = nullptr;        ///< RowSignals::consume: CTAs past their last wait (the last zeroes the flags)
  std::uint64_t* done = nullptr;         ///< rows stored: see weft::RowsDone
  std::int64_t rows_per_done = 1;
};

/// Arguments every configuration takes.
struct Problem {
  std::int64_t m, n, k;
  const void* a;
  const void* b;
  void* c;
  void* workspace;
  int sm_count;
  int swizzle = 1;  ///< tile-scheduler swizzle (1, 2, 4, 8): groups of tiles that share A or B in L2
  int raster = 0;   ///< 0: the scheduler decides, 1: along M, 2: along N
  const void* source = nullptr;  ///< configurations with a source: D = A x B + source ([M, N], output type)
  std::int64_t no_source_begin = 0;  ///< ... except on rows [no_source_begin, no_source_end): D = A x B (GemmArgs)
  std::int64_t no_source_end = 0;
  void* add_into = nullptr;      ///< configurations that add rows: rows [add_begin, add_end) of A x B are added
  std::int64_t add_begin = 0;    ///< into add_into (its row 0 is row add_begin), the others stored into c
  std::int64_t add_end = 0;
  TileWaitParams wait{};         ///< hooked configurations only
};

/// One instantiated kernel: its types, its name, and how to run it.
struct Config {
  DType input, output;
  BLayout b_layout;
  const char* name;
  int tile_m, tile_n;  ///< for the size heuristic
  int cluster_m;       ///< CTAs per cluster along M: a swizzle band is swizzle x cluster_m x tile_m rows
  int cluster_n;       ///< ... along N: walking along M, a band is swizzle x cluster_n x tile_n columns
  bool hooked;         ///< its tile scheduler rotates and waits (TileWaitParams)
  bool with_source;    ///< D = A x B + source
  bool reports;        ///< hooked, and can report stored rows (RowsDone): the cooperative kernel's store warp
  /// Bytes of global workspace the kernel needs for this problem.
  std::size_t (*workspace)(const Problem&);
  /// Returns "" if the kernel can run this problem, else why not.
  const char* (*check)(const Problem&);
  /// Launches on `stream`; returns a CUTLASS status text on failure, "" on success.
  const char* (*run)(const Problem&, cudaStream_t stream);
  bool cublas = false;  ///< cuBLAS, not a weft kernel (only where GemmOptions::allow_cublas)
  bool adds_rows = false;  ///< GemmHook::add_rows: some rows are added into another matrix (add_rows.cuh)
};

/// cuBLAS as tuner candidates, one per type and layout (cublas_config.cpp).
const std::vector<const Config*>& cublas_configs();

/// Every compiled configuration: the rows of src/gemm/kernel_table.cmake, in its order.
const std::vector<const Config*>& all_configs();

}  // namespace weft::gemm_detail
