// config.hpp (private) - one compiled GEMM configuration, behind a plain function pointer.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "weft/gemm/gemm.hpp"

namespace weft::gemm_detail {

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
};

/// One instantiated kernel: its types, its name, and how to run it.
struct Config {
  DType input, output;
  BLayout b_layout;
  const char* name;
  int tile_m, tile_n;  ///< for the size heuristic
  /// Bytes of global workspace the kernel needs for this problem.
  std::size_t (*workspace)(const Problem&);
  /// Returns "" if the kernel can run this problem, else why not.
  const char* (*check)(const Problem&);
  /// Launches on `stream`; returns a CUTLASS status text on failure, "" on success.
  const char* (*run)(const Problem&, cudaStream_t stream);
};

/// Every compiled configuration.
const std::vector<const Config*>& all_configs();

/// One function per compiled configuration, each in src/gemm/configs/ (called
/// by all_configs: a static library would drop self-registering objects).
const Config* config_bf16_bf16_nk_128x256x64_c2x1_cooperative();
const Config* config_bf16_bf16_nk_128x256x64_c1x2_cooperative();
const Config* config_bf16_bf16_nk_128x256x64_c2x1_cooperative_streamK();
const Config* config_bf16_bf16_nk_256x128x64_c1x2_cooperative();
const Config* config_bf16_bf16_nk_256x128x64_c2x1_cooperative();
const Config* config_bf16_bf16_nk_128x128x64_c2x1_cooperative();
const Config* config_bf16_bf16_nk_64x256x64_c1x1_pingpong();
const Config* config_bf16_bf16_kn_128x256x64_c2x1_cooperative();
const Config* config_bf16_bf16_kn_64x256x64_c1x1_pingpong();
const Config* config_bf16_fp32_nk_128x256x64_c2x1_cooperative();
const Config* config_fp16_fp16_nk_128x256x64_c2x1_cooperative();
const Config* config_fp16_fp16_nk_64x256x64_c1x1_pingpong();
const Config* config_fp16_fp16_kn_128x256x64_c2x1_cooperative();

}  // namespace weft::gemm_detail
