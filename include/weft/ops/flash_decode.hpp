// weft/ops/flash_decode.hpp - decode attention (one query token per sequence) over a KV cache, on one GPU.
//
//   out[b, h, :] = softmax(scale x q[b, h, :] . K[b, g(h), t, :] over t < len[b]) x V[b, g(h), :, :]
//   lse[b, h]    = log(sum over t < len[b] of exp(scale x q[b, h, :] . K[b, g(h), t, :]))   (natural log)
//
// with g(h) = h / (q_heads / kv_heads): grouped-query attention, every query
// head of a group reading the same KV head (multi-query attention at
// kv_heads = 1). Each sequence has its own length (ragged), read from device
// memory at run time; a sequence of no keys gives a zero output and lse = -inf.
//
// Tensors (all row-major, densely packed, device memory, 16-byte aligned):
//   q        [batch, q_heads, head_dim]                   dtype
//   out      [batch, q_heads, head_dim]                   dtype
//   lse      [batch, q_heads]                             float (optional)
//   kv_lens  [batch]                                      int32 (optional for the contiguous layout)
//   KvLayout::contiguous: k, v   [batch, kv_heads, max_kv_len, head_dim]
//     Head-major: the keys of one (sequence, KV head) are one contiguous run,
//     so the part of a sequence one thread block reads is a single stream of
//     whole 16-byte vectors, the layout that reaches the copy bound; a new
//     token is appended as kv_heads rows of head_dim, one per head.
//   KvLayout::paged: k, v        [num_pages, kv_heads, page_size, head_dim]
//     block_table [batch, max_pages_per_seq] int32: page i of sequence b is
//     block_table[b][i]; entries past a sequence's last page are never read.
//     Within a page each KV head's keys are contiguous for the same reason
//     (FlashInfer's "HND" page layout; vLLM's default puts heads innermost).
//
// How it runs: the keys of every (sequence, KV head) are split into
// `splits()` ranges, one thread block each, the split count chosen at plan
// time from the SMs this process sees (cudaDevAttrMultiProcessorCount: ranks
// sharing a GPU under MPS see their own share), the batch, the heads and
// max_kv_len. A block streams its range through a multi-stage cp.async
// pipeline of 16-byte loads; the query heads of a group (up to 16 per block,
// padded) are the M dimension of mma.sync m16n8k16 tensor-core products, so
// every head of a group shares one read of K and V. Each block keeps an
// online softmax in fp32 and writes its partial (output, lse); a second,
// tiny launch merges the partials by their log-sum-exp in a fixed order
// (attention_detail::LseMerge), or, with DecodeMerge::last_block (the
// default on a contiguous cache), the last block of each (sequence, KV head)
// to finish merges them in the same launch. With one split the first launch writes the result itself. Runs
// are bitwise repeatable, allocate nothing, never synchronise the host and
// can be captured in a CUDA graph; the workspace for the partials is
// allocated once, by the constructor. The kernel variant (stage count,
// merge, page lookup) is an option of the plan [0064].
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "weft/core/cuda_resources.hpp"
#include "weft/core/dtype.hpp"

namespace weft {

/// How the KV cache is stored (see the file comment for the shapes).
enum class KvLayout {
  contiguous,  ///< k, v [batch, kv_heads, max_kv_len, head_dim]
  paged        ///< k, v [num_pages, kv_heads, page_size, head_dim], a block table per sequence
};
/// "contiguous", "paged".
const char* to_string(KvLayout layout);

/// How the splits' partial results are merged when a plan has more than one
/// split (with one split the attention launch writes the result itself).
enum class DecodeMerge {
  automatic,  ///< the plan's choice: last_block on a contiguous cache, launch on a paged one [0064]
  launch,     ///< a second, small launch, one warp per (sequence, query head) [0053]
  last_block  ///< in the attention launch: the last block of a (sequence, KV head) to finish merges its splits [0064]
};
/// "auto", "launch", "last_block".
const char* to_string(DecodeMerge merge);

/// How a paged tile finds the physical pages of its keys.
enum class PageLookup {
  automatic,  ///< the plan's choice: per_warp (the contiguous layout has no pages) [0064]
  per_row,    ///< each thread reads the block-table entry of each key row it copies [0053]
  per_warp    ///< each warp reads the tile's entries once (a lane per page) and passes them by shuffles [0064]
};
/// "auto", "row", "warp".
const char* to_string(PageLookup lookup);

/// What a FlashDecode plan is built for.
struct FlashDecodeOptions {
  int batch = 1;          ///< sequences, 1 to 1024
  int q_heads = 32;       ///< query heads, 1 to 128
  int kv_heads = 8;       ///< KV heads, 1 to 16, dividing q_heads
  int head_dim = 128;     ///< 64 or 128
  DType dtype = DType::bf16;  ///< q, k, v and out: bf16 or fp16
  KvLayout layout = KvLayout::contiguous;
  /// contiguous: the cache's capacity per sequence (its third dimension);
  /// lengths above it are clamped to it. paged: the longest sequence runs
  /// will see, used only to choose the split count (0: max_pages_per_seq x
  /// page_size, the block table's capacity).
  std::int64_t max_kv_len = 0;
  int page_size = 0;          ///< paged: keys per page, 16 to 256
  int max_pages_per_seq = 0;  ///< paged: the block table's row length
  float softmax_scale = 0;    ///< 0: 1 / sqrt(head_dim)
  int splits = 0;             ///< KV splits per (sequence, KV head); 0: from the SM count (recommended)
  int sm_count = 0;           ///< SMs to fill; 0: this process's device attribute
  /// K and V pipeline stages of 64 keys (the kernel variant). 0: the plan's
  /// choice [0064]: at head dim 128, 6 (192 KB, one block per SM, 5 tiles in
  /// flight) for a contiguous cache whose sequences x KV heads x head tiles
  /// fill less than 80 % of the SMs, else 3 (96 KB, two blocks per SM); 6
  /// at head dim 64 (96 KB). Head dim 128 builds 3 and 6; the split count
  /// follows the occupancy.
  int stages = 0;
  DecodeMerge merge = DecodeMerge::automatic;       ///< how more than one split is merged
  PageLookup page_lookup = PageLookup::automatic;  ///< paged: how a tile finds its pages

  /// "" if a plan can be built for these options, else what is wrong, naming
  /// the field and what it must be.
  std::string check() const;
};

/// One run's tensors (see the file comment for their shapes).
struct FlashDecodeArgs {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  /// Keys of each sequence (device, int32 [batch]). Null: every sequence is
  /// max_kv_len long (contiguous layout only).
  const std::int32_t* kv_lens = nullptr;
  const std::int32_t* block_table = nullptr;  ///< paged: device, int32 [batch, max_pages_per_seq]
  void* out = nullptr;
  float* lse = nullptr;  ///< null: not written
};

class DistFlashDecode;

/// A planned decode attention for one shape. One stream at a time (the
/// partials' workspace is the plan's).
class FlashDecode {
 public:
  /// "" if `o` can run on the current device, else why not (check(), and
  /// what the device refuses, such as the shared memory the kernel needs).
  static std::string can_implement(const FlashDecodeOptions& o);

  /// Validates (weft::Error with can_implement's reason), chooses the split
  /// count and allocates the workspace on the current device.
  explicit FlashDecode(const FlashDecodeOptions& o);
  ~FlashDecode();
  FlashDecode(const FlashDecode&) = delete;
  FlashDecode& operator=(const FlashDecode&) = delete;

  /// Enqueues the attention on `stream`. Throws weft::Error naming the
  /// argument when a pointer is null where one is needed or misaligned.
  void run(const FlashDecodeArgs& args, cudaStream_t stream);

  const FlashDecodeOptions& options() const { return o_; }
  /// KV splits per (sequence, KV head): thread blocks of the first launch =
  /// splits x kv_heads x batch x ceil(group / 16).
  int splits() const { return splits_; }
  /// Pipeline stages of the attention kernel (options().stages resolved).
  int stages() const { return stages_; }
  /// How the splits are merged (options().merge resolved: launch or
  /// last_block; with one split neither runs).
  DecodeMerge merge() const { return merge_; }
  /// Paged: how a tile finds its pages (per_row or per_warp); contiguous: automatic.
  PageLookup page_lookup() const { return page_lookup_; }
  /// Bytes of the partials' workspace (0 with one split), with the last_block
  /// merge's arrival counters.
  std::uint64_t workspace_bytes() const { return workspace_bytes_; }
  /// Bytes of K and V one run reads for sequences of `total_keys` keys in
  /// all: 2 x total_keys x kv_heads x head_dim x element size.
  std::uint64_t kv_bytes(std::int64_t total_keys) const;

 private:
  friend class DistFlashDecode;
  /// DistFlashDecode's local part: every split's partial is left in the
  /// workspace (output [batch, q_heads, splits, head_dim] then lse [batch,
  /// q_heads, splits], float), even with one split, and run() launches only
  /// the attention; args.out and args.lse are not written.
  FlashDecode(const FlashDecodeOptions& o, bool partials_only);
  const float* partial_outputs() const { return workspace_.as<const float>(); }
  const float* partial_lses() const;
  /// The last_block merge runs (its arrival counters follow the partials in the workspace).
  bool uses_arrivals() const;

  FlashDecodeOptions o_;
  bool partials_only_ = false;
  int splits_ = 1;
  int stages_ = 3;
  DecodeMerge merge_ = DecodeMerge::launch;
  PageLookup page_lookup_ = PageLookup::automatic;
  int sm_count_ = 0;
  float scale_ = 0;
  DeviceBuffer workspace_;
  std::uint64_t workspace_bytes_ = 0;
  std::uint64_t arrivals_offset_ = 0;
};

}  // namespace weft
