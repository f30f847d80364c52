// Distributed decode attention's split of the KV cache and its log-sum-exp
// merge (src/ops/attention/decode_split.hpp), on the CPU: every key is in
// exactly one shard at world sizes 1 to 8, contiguous or in interleaved pages,
// and partial results merged in fp32 - first over a rank's SM splits, then
// over the ranks - match a float64 attention over the whole sequence.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "ops/attention/decode_split.hpp"

namespace {

using weft::attention_detail::contiguous_shard;
using weft::attention_detail::interleaved_page;
using weft::attention_detail::interleaved_page_count;
using weft::attention_detail::keys_in_page;
using weft::attention_detail::LseMerge;

constexpr int kDim = 16;

struct Head {
  std::vector<double> q, k, v;  // q [kDim], k and v [length][kDim]
};

Head random_head(std::mt19937_64& rng, std::int64_t length) {
  std::normal_distribution<double> normal(0.0, 1.0);
  Head h;
  h.q.resize(kDim);
  h.k.resize(length * kDim);
  h.v.resize(length * kDim);
  for (auto& x : h.q) x = 2.0 * normal(rng);  // scores spread wide enough to test the max-shift
  for (auto& x : h.k) x = normal(rng);
  for (auto& x : h.v) x = normal(rng);
  return h;
}

// Attention of q over the given keys, in float64: (output [kDim], lse); lse = -inf over no keys.
struct Partial {
  std::vector<double> o = std::vector<double>(kDim, 0.0);
  double lse = -INFINITY;
};
Partial attend(const Head& h, const std::vector<std::int64_t>& keys) {
  Partial p;
  if (keys.empty()) return p;
  std::vector<double> s(keys.size());
  double mx = -INFINITY;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    double dot = 0;
    for (int d = 0; d < kDim; ++d) dot += h.q[d] * h.k[keys[i] * kDim + d];
    s[i] = dot / std::sqrt(static_cast<double>(kDim));
    mx = std::max(mx, s[i]);
  }
  double sum = 0;
  for (std::size_t i = 0; i < keys.size(); ++i) sum += std::exp(s[i] - mx);
  for (std::size_t i = 0; i < keys.size(); ++i)
    for (int d = 0; d < kDim; ++d) p.o[d] += std::exp(s[i] - mx) / sum * h.v[keys[i] * kDim + d];
  p.lse = mx + std::log(sum);
  return p;
}

// Merges parts in fp32 as a kernel does: running output rescaled per part.
struct MergedF {
  std::vector<float> o = std::vector<float>(kDim, 0.0f);
  float lse = -INFINITY;
};
MergedF merge(const std::vector<MergedF>& parts) {
  LseMerge m;
  std::vector<float> acc(kDim, 0.0f);
  for (const auto& part : parts) {
    float part_scale;
    const float rescale = m.add(part.lse, part_scale);
    for (int d = 0; d < kDim; ++d) acc[d] = acc[d] * rescale + part_scale * part.o[d];
  }
  MergedF out;
  for (int d = 0; d < kDim; ++d) out.o[d] = acc[d] * m.output_scale();
  out.lse = m.lse();
  return out;
}
MergedF to_float(const Partial& p) {
  MergedF f;
  for (int d = 0; d < kDim; ++d) f.o[d] = static_cast<float>(p.o[d]);
  f.lse = static_cast<float>(p.lse);
  return f;
}

// The keys each rank holds.
std::vector<std::vector<std::int64_t>> shards(std::int64_t length, int world, bool paged, std::int64_t page_size) {
  std::vector<std::vector<std::int64_t>> keys(world);
  for (int r = 0; r < world; ++r) {
    if (!paged) {
      std::int64_t lo, hi;
      contiguous_shard(length, world, r, lo, hi);
      for (std::int64_t i = lo; i < hi; ++i) keys[r].push_back(i);
    } else {
      const std::int64_t pages = (length + page_size - 1) / page_size;
      for (std::int64_t i = 0; i < interleaved_page_count(pages, world, r); ++i) {
        const std::int64_t q = interleaved_page(world, r, i);
        for (std::int64_t j = 0; j < keys_in_page(length, page_size, q); ++j) keys[r].push_back(q * page_size + j);
      }
    }
  }
  return keys;
}

TEST(DecodeSplit, EveryKeyIsInExactlyOneShard) {
  for (int world = 1; world <= 8; ++world) {
    for (std::int64_t length : {0, 1, 5, 17, 4097}) {
      for (bool paged : {false, true}) {
        for (std::int64_t page_size : {1, 16, 7}) {
          std::vector<int> seen(length, 0);
          for (const auto& keys : shards(length, world, paged, page_size))
            for (std::int64_t key : keys) ++seen[key];
          for (std::int64_t i = 0; i < length; ++i)
            ASSERT_EQ(seen[i], 1) << "W " << world << " length " << length << (paged ? " paged " : " contiguous ")
                                  << page_size << ": key " << i;
          if (!paged) break;
        }
      }
    }
  }
}

TEST(DecodeSplit, MergedPartsMatchAttentionOverTheWholeSequence) {
  std::mt19937_64 rng(0xdec0de);
  int checked = 0;
  for (int world = 1; world <= 8; ++world) {
    for (std::int64_t length : {1, 3, 17, 4097}) {  // 1 and 3: shorter than most worlds, so some shards are empty
      const Head h = random_head(rng, length);
      std::vector<std::int64_t> all(length);
      for (std::int64_t i = 0; i < length; ++i) all[i] = i;
      const Partial reference = attend(h, all);
      for (bool paged : {false, true}) {
        for (int splits : {1, 3, 8}) {  // SM splits within each rank
          std::vector<MergedF> per_rank;
          for (const auto& keys : shards(length, world, paged, 16)) {
            std::vector<MergedF> parts;
            for (int s = 0; s < splits; ++s) {
              std::int64_t lo, hi;
              contiguous_shard(static_cast<std::int64_t>(keys.size()), splits, s, lo, hi);
              parts.push_back(to_float(attend(h, std::vector<std::int64_t>(keys.begin() + lo, keys.begin() + hi))));
            }
            per_rank.push_back(merge(parts));
          }
          const MergedF out = merge(per_rank);
          SCOPED_TRACE(testing::Message() << "W " << world << " length " << length << (paged ? " paged" : "")
                                          << " splits " << splits);
          EXPECT_NEAR(out.lse, reference.lse, 1e-5 * std::max(1.0, std::fabs(reference.lse)));
          double err = 0, norm = 0;
          for (int d = 0; d < kDim; ++d) {
            err = std::max(err, std::fabs(out.o[d] - reference.o[d]));
            norm = std::max(norm, std::fabs(reference.o[d]));
          }
          EXPECT_LE(err, 1e-5 * std::max(1.0, norm));
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 8 * 4 * 2 * 3);
}

TEST(DecodeSplit, EmptyPartsContributeNothing) {
  MergedF empty;  // lse = -inf, o = 0
  MergedF part;
  for (int d = 0; d < kDim; ++d) part.o[d] = static_cast<float>(d) - 3.5f;
  part.lse = 2.25f;
  const MergedF out = merge({empty, part, empty});
  EXPECT_EQ(out.lse, part.lse);
  for (int d = 0; d < kDim; ++d) EXPECT_FLOAT_EQ(out.o[d], part.o[d]);
  const MergedF none = merge({empty, empty});
  EXPECT_EQ(none.lse, -INFINITY) << "no keys at all: lse -inf";
  for (int d = 0; d < kDim; ++d) EXPECT_EQ(none.o[d], 0.0f) << "and a zero output, not NaN";
}

}  // namespace

namespace {

using weft::attention_detail::decode_splits;
using weft::attention_detail::FastDiv;

TEST(DecodeSplit, SplitCountFillsTheLastWave) {
  // 132 SMs, 2 blocks each: batch 1 with 12 KV heads fills 252 of 264 slots with 21 splits, 8 heads 256 with 32.
  EXPECT_EQ(decode_splits(12, 264, 128), 21);
  EXPECT_EQ(decode_splits(8, 264, 128), 32);
  EXPECT_EQ(decode_splits(96, 264, 128), 8);  // batch 8, 12 KV heads: 768 blocks in 3 waves of 264
  // Enough (sequence, head) pairs already (80 % of the slots): one split, no merge launch.
  EXPECT_EQ(decode_splits(212, 264, 128), 1);
  EXPECT_EQ(decode_splits(256, 264, 128), 1);
  EXPECT_EQ(decode_splits(1024, 264, 128), 1);
  // Short sequences cap the count; a cap of 1 or less means one split.
  EXPECT_EQ(decode_splits(12, 264, 4), 4);
  EXPECT_EQ(decode_splits(12, 264, 1), 1);
  EXPECT_EQ(decode_splits(12, 264, 0), 1);
  // The SM count is the caller's (a rank's share under MPS), never a constant: fewer SMs, fewer splits.
  EXPECT_EQ(decode_splits(12, 66, 128), 11);
  // Above one wave, the last wave counts the same way [0064]: batch 32 at 12 KV heads (384 blocks) in one
  // split leaves a second wave of 120 (45 %); two splits make 768, two full waves and one of 240.
  EXPECT_EQ(decode_splits(384, 264, 128), 2);
  EXPECT_EQ(decode_splits(384, 264, 1), 1);     // no room to split: one
  EXPECT_EQ(decode_splits(480, 264, 128), 1);   // a last wave of 216 (82 %): one split
  EXPECT_EQ(decode_splits(528, 264, 128), 1);   // whole waves
  EXPECT_EQ(decode_splits(300, 264, 128), 6);   // 36 left over: 6 splits, 1800 blocks in 7 waves (97 %)
  // One block per SM (the 6-stage kernel): 132 slots; batch 1 at 8 KV heads takes 16 splits.
  EXPECT_EQ(decode_splits(8, 132, 128), 16);
  EXPECT_EQ(decode_splits(384, 132, 128), 1);   // 2.9 waves, the last 120 of 132 (91 %)
  // Whatever the inputs, the choice is within [1, cap] and its last wave at least 95 % as full as the best.
  for (std::int64_t units : {1, 3, 12, 96, 100, 257})
    for (std::int64_t slots : {16, 66, 132, 264})
      for (std::int64_t cap : {1, 2, 16, 128}) {
        const int s = decode_splits(units, slots, cap);
        ASSERT_GE(s, 1);
        ASSERT_LE(s, std::max<std::int64_t>(cap, 1));
      }
}

TEST(DecodeSplit, DefaultStagesAreSixOnlyWhereTheSweepWonWithThem) {
  using weft::attention_detail::decode_default_stages;
  // Head dim 128, 132 SMs: a contiguous cache below 80 % of the SMs (105.6 units) takes 6 stages - batch 1
  // at 12 and 8 KV heads, the sweep's winners [0064] - and from 106 units on, 3.
  EXPECT_EQ(decode_default_stages(true, 128, 12, 132), 6);
  EXPECT_EQ(decode_default_stages(true, 128, 8, 132), 6);
  EXPECT_EQ(decode_default_stages(true, 128, 105, 132), 6);
  EXPECT_EQ(decode_default_stages(true, 128, 106, 132), 3);
  EXPECT_EQ(decode_default_stages(true, 128, 256, 132), 3);
  // Paged caches lost at 6 stages (0.61-0.84x): 3 at any batch.
  EXPECT_EQ(decode_default_stages(false, 128, 8, 132), 3);
  EXPECT_EQ(decode_default_stages(false, 128, 384, 132), 3);
  // The SM count is the caller's (a rank's share under MPS): 66 SMs move the edge to 52.8 units.
  EXPECT_EQ(decode_default_stages(true, 128, 52, 66), 6);
  EXPECT_EQ(decode_default_stages(true, 128, 53, 66), 3);
  // Head dim 64 builds 6 stages only.
  for (bool contiguous : {true, false}) EXPECT_EQ(decode_default_stages(contiguous, 64, 1000, 132), 6);
}

TEST(DecodeSplit, FastDivisionByThePageSizeIsExact) {
  // Every page size the paged layout takes (16 to 256), against the hardware division, on key positions
  // near every multiple of the divisor up to 2^20, near 2^31 (the largest position: keys < 2^31) and at
  // random below it.
  std::mt19937_64 rng(0x5eed);
  std::uniform_int_distribution<std::uint32_t> any(0, (std::uint32_t{1} << 31) - 1);
  for (std::uint32_t d = 2; d <= 256; ++d) {
    const FastDiv f = FastDiv::make(d);
    ASSERT_EQ(f.d, d);
    auto check = [&](std::uint32_t n) { ASSERT_EQ(f.div(n), n / d) << n << " / " << d; };
    for (std::uint32_t m = 0; m <= (std::uint32_t{1} << 20); m += d)
      for (std::uint32_t n : {m, m + 1, m + d - 1}) check(n);
    for (std::uint32_t back = 0; back < 4 * d; ++back) check((std::uint32_t{1} << 31) - 1 - back);
    for (int i = 0; i < 20000; ++i) check(any(rng));
  }
}

}  // namespace
