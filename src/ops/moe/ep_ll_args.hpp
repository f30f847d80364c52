// ep_ll_args.hpp (private) - what ExpertParallelLowLatency's kernels take
// (moe/ep_ll_kernels.cuh), host-visible so that the plan across nodes
// (ops_detail::TwoLevelEpLl, two_level.hpp) can be handed them.
#pragma once

#include <vector_types.h>  // uint4

#include <cstdint>

#include "weft/runtime/world.hpp"

namespace weft::moe_detail {

constexpr int kThreadsLl = 256;
constexpr int kWarpsLl = kThreadsLl / 32;
constexpr int kRecvThreads = 1024;
constexpr int kMaxExpertsLl = 1024;
constexpr int kMaxTokensLl = 4096;
constexpr std::uint64_t kNoErrorLl = ~std::uint64_t{0};
constexpr float kE4m3Max = 448.f;     // the largest finite e4m3 value
constexpr float kFp8MinAmax = 1e-4f;  // a block's amax floor, as DeepEP: an all-zero block gets a finite scale

struct LlArgs {
  dev::World w;
  int experts, world, k, hidden, max_tokens;
  bool fp8;                     // dispatch casts tokens to e4m3 (recv_x: bytes, recv_scales: floats)
  std::int64_t tokens;
  const std::int64_t* topk;     // [T][k]
  const float* weights;         // [T][k]
  const uint4* x;               // [T][H]
  const uint4* y;               // [per][W][M][H]
  uint4* out;                   // [T][H]
  uint4* recv_x;                // symmetric [per][W][M][H] bf16, or e4m3 bytes
  float* recv_scales;           // fp8: symmetric [per][W][M][H / 128]
  std::int32_t* recv_src;       // symmetric [per][W][M]
  std::uint64_t* count_flags;   // symmetric [per][W]
  std::int32_t* recv_count;     // local [per][W]
  uint4* comb_buf;              // symmetric [M][k][H]
  std::uint64_t* comb_flags;    // symmetric [W]
  std::uint64_t* error;         // local: min (token << 8 | slot << 2 | code)
  std::uint64_t* done;          // local counter for the last block
  dev::LaunchEpoch epoch;
  // Staging for rows bound for another node (Transport::kStaged only; null on one node):
  uint4* send_x;                // symmetric [M][H] bf16, or e4m3 bytes: this call's tokens
  float* send_scales;           // fp8: symmetric [M][H / 128]
  uint4* send_y;                // symmetric [per][W][M][H] bf16: the outputs going back
};

}  // namespace weft::moe_detail
