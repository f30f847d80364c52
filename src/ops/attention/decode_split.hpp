// decode_split.hpp (private) - how distributed decode attention splits a sequence's KV cache, and how
// the partial results combine, as plain functions.
//
// Each rank holds a shard of every sequence's KV cache and attends over it;
// within a rank the shard splits again across SMs. Every part p returns its
// partial output o_p (softmax over its keys only, normalised) and its
// log-sum-exp lse_p = log(sum over its keys of exp(score)); an empty part
// returns lse = -inf and contributes nothing. The exact result over all keys is
//   lse = log(sum_p exp(lse_p)),   o = sum_p exp(lse_p - lse) x o_p,
// computed against the largest lse_p so that no exp overflows. The merge is
// associative up to rounding, so the SM splits and the ranks combine with the
// same functions: the kernels (device) and the CPU tests (host, float64
// references, world sizes 1 to 8) call these.
#pragma once

#include <cmath>
#include <cstdint>

#include "weft/device/types.cuh"

namespace weft::attention_detail {

/// Keys [lo, hi) of a sequence of `length` keys held by rank `rank` of
/// `world` when shards are contiguous: ceil(length / world) keys each, the
/// last ranks' shorter or empty (a sequence shorter than the world leaves
/// ranks with nothing).
WEFT_HD void contiguous_shard(std::int64_t length, int world, int rank, std::int64_t& lo, std::int64_t& hi) {
  const std::int64_t per = (length + world - 1) / world;
  lo = per * rank < length ? per * rank : length;
  hi = lo + per < length ? lo + per : length;
}

/// Pages of `pages` that rank `rank` holds when pages are dealt round-robin
/// (page q on rank q mod world): its i-th page is rank + i x world.
WEFT_HD std::int64_t interleaved_page_count(std::int64_t pages, int world, int rank) {
  return pages > rank ? (pages - rank + world - 1) / world : 0;
}
WEFT_HD std::int64_t interleaved_page(int world, int rank, std::int64_t i) { return rank + i * world; }

/// Keys of a sequence of `length` keys in page q of `page_size` keys (the last page may end early).
WEFT_HD std::int64_t keys_in_page(std::int64_t length, std::int64_t page_size, std::int64_t q) {
  const std::int64_t lo = q * page_size;
  const std::int64_t hi = lo + page_size < length ? lo + page_size : length;
  return hi > lo ? hi - lo : 0;
}

/// Splits per (sequence, KV head) for one GPU's decode attention: `units`
/// thread blocks per split (sequences x KV heads x head tiles) onto `slots`
/// resident blocks (SMs x blocks per SM), at most `max_splits`. One split (no
/// partials, no merge) when the last wave of units is at least 80 % full, or
/// when they make whole waves. Otherwise the fewest splits whose waves are at
/// least 95 % full, measured against the fullest any count up to max_splits
/// reaches: a bandwidth-bound kernel wants every slot busy to the end, and
/// every extra split costs a partial written and merged.
///
/// Why 80 % of the last wave, and why it counts above one wave too: a block
/// reads at most (bytes in flight) / (latency) - two 32 KB tiles over about
/// 3 us under load at head dim 128, some 21 GB/s - so about 200 blocks
/// (4.25 TB/s / 21 GB/s, 80 % of 264 slots at two blocks per SM on 132 SMs)
/// keep HBM busy, and a wave with fewer runs at their rate, not the HBM's.
/// Batch 32 at 12 KV heads (384 units) in one split ran a full wave and a
/// second of 120 blocks (45 %): 0.773 of the copy rate against 0.939 for
/// batch 32 at 8 KV heads (256 units, one 97 % wave) on one H200; the model
/// says the 384 blocks take as long as 264 + 200 = 464 at the full rate, 0.83
/// of it, as measured (0.773 / 0.939 = 0.82). Two splits make 768 blocks, two
/// full waves and one of 240 (91 %). Up to one wave this is the rule decision
/// 0053 measured; above one wave, 0064.
WEFT_HD int decode_splits(std::int64_t units, std::int64_t slots, std::int64_t max_splits) {
  if (units < 1 || slots < 1 || max_splits <= 1) return 1;
  const std::int64_t last_wave = units % slots;
  if (last_wave == 0 || 5 * last_wave >= 4 * slots) return 1;
  auto efficiency = [&](std::int64_t s) {
    const std::int64_t blocks = units * s;
    const std::int64_t waves = (blocks + slots - 1) / slots;
    return static_cast<double>(blocks) / static_cast<double>(waves * slots);
  };
  double best = 0;
  for (std::int64_t s = 1; s <= max_splits; ++s) best = efficiency(s) > best ? efficiency(s) : best;
  for (std::int64_t s = 1; s <= max_splits; ++s)
    if (efficiency(s) >= 0.95 * best) return static_cast<int>(s);
  return 1;
}

/// The attention kernel's pipeline stages when the plan leaves them open
/// (FlashDecodeOptions::stages = 0), for `units` blocks per split on
/// `sm_count` SMs [0064]. Head dim 64: 6 (96 KB, the only count built).
/// Head dim 128: 6 stages (192 KB, one block per SM, 5 tiles in flight)
/// for a contiguous cache whose units fill less than 80 % of the SMs - the
/// plan splits the keys either way, and half as many blocks that each keep
/// 2.5x the bytes in flight hold the HBM busy to a shorter end of launch:
/// 1.01-1.20x the 3-stage kernel on every batch-1 case of the sweep on one
/// H200 (docs/PERF.md, "Decode attention"). Otherwise 3 stages (96 KB, two
/// blocks per SM): paged caches ran 0.61-0.84x at 6 stages, and a plan
/// with a wave of units per split has no end-of-launch tail to shorten.
WEFT_HD int decode_default_stages(bool contiguous, int head_dim, std::int64_t units, std::int64_t sm_count) {
  if (head_dim != 128) return 6;
  return contiguous && 5 * units < 4 * sm_count ? 6 : 3;
}

/// n / d for 0 <= n < 2^31 and 2 <= d <= 256 by one multiply-high and a
/// shift (a paged tile divides key positions by the page size per row; a
/// hardware division is some 20 instructions). With s = ceil(log2 d) and
/// mul = ceil(2^(31 + s) / d) < 2^32, n / d = (n x mul) >> (32 + s - 1):
/// mul x d - 2^(31 + s) < d, so the product overshoots n / d by less than
/// n / 2^(31 + s) < 2^-s <= 1 / d, never enough to reach the next integer.
struct FastDiv {
  std::uint32_t d = 1, mul = 0;
  int shift = 0;

  WEFT_HD static FastDiv make(std::uint32_t divisor) {
    FastDiv f;
    f.d = divisor;
    int s = 0;
    while ((std::uint32_t{1} << s) < divisor) ++s;
    f.shift = s - 1;
    f.mul = static_cast<std::uint32_t>(((std::uint64_t{1} << (31 + s)) + divisor - 1) / divisor);
    return f;
  }
  WEFT_HD std::uint32_t div(std::uint32_t n) const {
#if defined(__CUDA_ARCH__)
    return __umulhi(n, mul) >> shift;
#else
    return static_cast<std::uint32_t>((std::uint64_t{n} * mul) >> 32) >> shift;
#endif
  }
};

/// A running merge of parts (output, lse): feed each part with add, read the
/// result with output_scale and lse. Scales are relative to the largest lse seen.
struct LseMerge {
  float max_lse = -INFINITY;
  float sum = 0.0f;  ///< sum of exp(lse_p - max_lse) over the parts added

  /// Adds a part's lse; returns the factor by which the running output
  /// (a sum of scaled parts) must be multiplied before this part's scaled
  /// output, exp(lse_p - new max) x o_p, is added to it. Empty parts (lse =
  /// -inf) return 1 and change nothing.
  WEFT_HD float add(float lse, float& part_scale) {
    if (lse == -INFINITY) {
      part_scale = 0.0f;
      return 1.0f;
    }
    if (lse <= max_lse) {
      part_scale = expf(lse - max_lse);
      sum += part_scale;
      return 1.0f;
    }
    const float rescale = max_lse == -INFINITY ? 0.0f : expf(max_lse - lse);
    sum = sum * rescale + 1.0f;
    max_lse = lse;
    part_scale = 1.0f;
    return rescale;
  }
  /// What the running output is multiplied by at the end: 1 / sum (0 if every part was empty).
  WEFT_HD float output_scale() const { return sum > 0.0f ? 1.0f / sum : 0.0f; }
  /// The merged log-sum-exp (-inf if every part was empty).
  WEFT_HD float lse() const { return sum > 0.0f ? max_lse + logf(sum) : -INFINITY; }
};

}  // namespace weft::attention_detail
