// decode_reference.hpp - a plain fp32 decode attention on the GPU, the check of weft-bench decode.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "weft/core/dtype.hpp"

namespace weft::bench {

/// The tensors and shape of one decode attention, in FlashDecode's layouts
/// (weft/ops/flash_decode.hpp): contiguous K, V [batch, kv_heads, max_kv_len,
/// head_dim], or paged [pages, kv_heads, page_size, head_dim] with a block table.
struct DecodeProblem {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const std::int32_t* kv_lens = nullptr;      ///< device [batch]
  const std::int32_t* block_table = nullptr;  ///< paged: device [batch, max_pages]; null: contiguous
  int batch = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
  DType dtype = DType::bf16;
  std::int64_t max_kv_len = 0;  ///< contiguous: keys per sequence in the cache; paged: the longest sequence
  int page_size = 0, max_pages = 0;
  float scale = 0;
};

/// out [batch, q_heads, head_dim] and lse [batch, q_heads] (natural log) in
/// fp32, one block per (sequence, query head), scores kept in `scratch`
/// (batch x q_heads x max_kv_len floats). Asynchronous on `stream`.
void decode_reference(const DecodeProblem& p, float* scratch, float* out, float* lse, cudaStream_t stream);

}  // namespace weft::bench
