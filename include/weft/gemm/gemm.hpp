// weft/gemm/gemm.hpp - the Hopper GEMM engine: C = A x B^T (or A x B) on one GPU, as a reusable plan.
//
// A is row-major [M, K]. B is [N, K] ("weights as PyTorch Linear stores them",
// BLayout::nk) or [K, N] (BLayout::kn). C is row-major [M, N]. Inputs bf16 or
// fp16, accumulation fp32, output bf16/fp16 (the input type) or fp32. Any M, N,
// K whose rows are 16-byte aligned (K and, for kn, N multiples of 8 elements).
//
// The kernels are CUTLASS 3 (CuTe) persistent, warp-specialised sm_90a GEMMs:
// TMA loads into a multi-stage shared-memory pipeline on mbarriers, wgmma from
// warpgroups, TMA-store epilogue. A plan holds several tile configurations of
// its type/layout and picks one per shape, with the tile scheduler's swizzle
// and raster order: by timing them on the first run (outside graph capture),
// or by a size heuristic.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "weft/ops/collective.hpp"

namespace weft {

/// How B is stored.
enum class BLayout {
  nk,  ///< [N, K] row-major: C = A x B^T (PyTorch Linear weight)
  kn   ///< [K, N] row-major: C = A x B
};

/// What a Gemm plan is built for.
struct GemmOptions {
  std::int64_t m = 0, n = 0, k = 0;
  DType input = DType::bf16;   ///< bf16 or fp16 (A and B)
  DType output = DType::bf16;  ///< the input type or fp32
  BLayout b_layout = BLayout::nk;
  /// Pick the configuration by timing each on the first run (true), or by a
  /// size heuristic only (false). Graph capture always uses the heuristic.
  bool autotune = true;
  /// Force a configuration by name (see Gemm::configurations); empty = choose.
  std::string config;
};

namespace gemm_detail {
struct Config;
}

/// A planned GEMM for one shape. Not thread-safe; one stream at a time.
class Gemm {
 public:
  /// Validates the shape, types and alignment (errors say what was expected).
  explicit Gemm(const GemmOptions& options);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  /// C = A x B^T (nk) or A x B (kn) on `stream`. Device pointers, 16-byte aligned.
  void run(const void* a, const void* b, void* c, cudaStream_t stream);

  /// The configuration in use ("128x256x64 c2x1 cooperative, swizzle 4 along N"), or "" before the first
  /// run if autotuning.
  std::string config() const;
  /// Names of the configurations available for these types and layout.
  std::vector<std::string> configurations() const;
  const GemmOptions& options() const { return options_; }
  /// 2 x M x N x K.
  double flops() const { return 2.0 * options_.m * options_.n * options_.k; }

 private:
  void tune(const void* a, const void* b, void* c, cudaStream_t stream);
  void reserve_workspace(std::size_t bytes);

  GemmOptions options_;
  std::vector<const gemm_detail::Config*> candidates_;
  const gemm_detail::Config* chosen_ = nullptr;
  int swizzle_ = 1, raster_ = 0;  // the tile scheduler's settings for chosen_
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 0;
  int sm_count_ = 0;
};

}  // namespace weft
