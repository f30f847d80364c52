// MoE under tensor parallelism, the sequential path (AgMoe, MoeRs) on the CPU:
// the options' checks name the field and what was expected; the gathered
// shards' layout and the capacity math at world sizes 1 to 8; and the device
// sort's three passes (count, scan, place over chunks of gathered tokens),
// run on the host, give exactly moe_detail::expert_rows() of the gathered
// routing - ragged token counts (a rank with none, 1001 in all), uniform,
// Zipf, one-expert, -1 and repeated-expert routings, bad ids left out.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "ops/moe/moe_tp_layout.hpp"
#include "weft/ops/moe_tp.hpp"

namespace {

using namespace weft;
using namespace weft::moe_detail;

AgMoeOptions good_ag() {
  return {.experts = 8, .hidden = 1024, .n_local = 512, .top_k = 2, .max_tokens_per_rank = 256};
}
MoeRsOptions good_rs() {
  return {.experts = 8, .hidden = 1024, .k_local = 512, .top_k = 2, .max_tokens_per_rank = 256};
}

// The message contains every one of `parts`.
void expect_names(const std::string& why, const std::vector<std::string>& parts) {
  EXPECT_FALSE(why.empty());
  for (const auto& p : parts) EXPECT_NE(why.find(p), std::string::npos) << "'" << p << "' not in: " << why;
}

TEST(MoeTpOptions, ValidOptionsPassAtEveryWorldSize) {
  for (int w = 1; w <= 8; ++w) {
    EXPECT_EQ(AgMoe::can_implement(good_ag(), w), "") << w;
    EXPECT_EQ(MoeRs::can_implement(good_rs(), w), "") << w;
    const AgMoeOptions qwen{.experts = 128, .hidden = 2048, .n_local = 96, .top_k = 8,
                            .max_tokens_per_rank = 4096, .dtype = DType::fp16};
    EXPECT_EQ(AgMoe::can_implement(qwen, w), "") << w;
  }
  AgMoeOptions edge = good_ag();
  edge.experts = 1024;
  edge.top_k = 32;
  EXPECT_EQ(AgMoe::can_implement(edge, 8), "");
  edge.experts = 1;
  edge.top_k = 1;
  edge.max_tokens_per_rank = 1;
  edge.hidden = 8;
  edge.n_local = 8;
  EXPECT_EQ(AgMoe::can_implement(edge, 1), "");
}

TEST(MoeTpOptions, AgMoeErrorsNameTheFieldAndWhatWasExpected) {
  auto with = [](auto change) {
    AgMoeOptions o = good_ag();
    change(o);
    return AgMoe::can_implement(o, 4);
  };
  expect_names(with([](AgMoeOptions& o) { o.experts = 0; }), {"experts = 0", "[1, 1024]"});
  expect_names(with([](AgMoeOptions& o) { o.experts = 1025; }), {"experts = 1025", "[1, 1024]"});
  expect_names(with([](AgMoeOptions& o) { o.hidden = 0; }), {"hidden = 0", "multiple of 8"});
  expect_names(with([](AgMoeOptions& o) { o.hidden = 1020; }), {"hidden = 1020", "multiple of 8"});
  expect_names(with([](AgMoeOptions& o) { o.n_local = -8; }), {"n_local = -8", "multiple of 8"});
  expect_names(with([](AgMoeOptions& o) { o.n_local = 100; }), {"n_local = 100", "multiple of 8"});
  expect_names(with([](AgMoeOptions& o) { o.top_k = 0; }), {"top_k = 0", "[1, 32]"});
  expect_names(with([](AgMoeOptions& o) { o.top_k = 33; }), {"top_k = 33", "[1, 32]"});
  expect_names(with([](AgMoeOptions& o) { o.max_tokens_per_rank = 0; }), {"max_tokens_per_rank = 0", "positive"});
  expect_names(with([](AgMoeOptions& o) { o.dtype = DType::fp32; }), {"dtype = fp32", "bf16 or fp16"});
  expect_names(with([](AgMoeOptions& o) { o.max_sms = -1; }), {"max_sms = -1", ">= 0"});
  expect_names(with([](AgMoeOptions& o) {
                 o.max_tokens_per_rank = std::int64_t{1} << 27;
                 o.top_k = 8;
               }),
               {"max_tokens_per_rank = 134217728", "world 4", "top_k 8", "2^31"});
  expect_names(with([](AgMoeOptions& o) {
                 o.gather = AllGatherVariant::low_latency;
                 o.max_tokens_per_rank = 1024;  // 1024 x 1024 bf16 = 2 MiB of rows alone
               }),
               {"gather = ll", "max_tokens_per_rank = 1024", "1048576"});
  EXPECT_EQ(with([](AgMoeOptions& o) {
              o.gather = AllGatherVariant::low_latency;
              o.max_tokens_per_rank = 64;
            }),
            "");
  // Overlapped, the AllGather moves the routing heads alone (16 + 12 k bytes a token): 1024 tokens fit ll...
  EXPECT_EQ(with([](AgMoeOptions& o) {
              o.gather = AllGatherVariant::low_latency;
              o.max_tokens_per_rank = 1024;
              o.mode = OverlapMode::fused;
            }),
            "");
  // ... and 65536 tokens of top-8 (7 MiB of heads) do not, named as heads.
  expect_names(with([](AgMoeOptions& o) {
                 o.gather = AllGatherVariant::low_latency;
                 o.max_tokens_per_rank = 65536;
                 o.top_k = 8;
                 o.mode = OverlapMode::fused;
               }),
               {"gather = ll moves routing heads", "max_tokens_per_rank = 65536", "1048576"});
  expect_names(AgMoe::can_implement(good_ag(), 0), {"world_size = 0"});
}

TEST(MoeTpOptions, MoeRsErrorsNameTheFieldAndWhatWasExpected) {
  auto with = [](auto change) {
    MoeRsOptions o = good_rs();
    change(o);
    return MoeRs::can_implement(o, 8);
  };
  expect_names(with([](MoeRsOptions& o) { o.experts = -1; }), {"experts = -1"});
  expect_names(with([](MoeRsOptions& o) { o.hidden = 4; }), {"hidden = 4", "multiple of 8"});
  expect_names(with([](MoeRsOptions& o) { o.k_local = 0; }), {"k_local = 0", "multiple of 8"});
  expect_names(with([](MoeRsOptions& o) { o.k_local = 36; }), {"k_local = 36", "multiple of 8"});
  expect_names(with([](MoeRsOptions& o) { o.top_k = 40; }), {"top_k = 40", "[1, 32]"});
  expect_names(with([](MoeRsOptions& o) { o.max_tokens_per_rank = -5; }), {"max_tokens_per_rank = -5"});
  expect_names(with([](MoeRsOptions& o) { o.dtype = DType::fp32; }), {"dtype = fp32"});
  expect_names(with([](MoeRsOptions& o) {
                 o.scatter = ReduceScatterVariant::low_latency;
                 o.max_tokens_per_rank = 1025;  // 1025 x 1024 x 2 bytes > 1 MiB
               }),
               {"scatter = ll", "max_tokens_per_rank = 1025", "1048576"});
  EXPECT_EQ(with([](MoeRsOptions& o) {
              o.scatter = ReduceScatterVariant::low_latency;
              o.max_tokens_per_rank = 512;  // exactly 1 MiB
            }),
            "");
}

TEST(MoeTpLayout, ShardRegionsAreAlignedDisjointAndLargeEnough) {
  for (std::int64_t cap : {1, 7, 128, 1001, 4096})
    for (int k : {1, 2, 7, 8, 32})
      for (std::int64_t hidden : {8, 24, 1024, 7168})
        for (int es : {2}) {
          const ShardLayout l = shard_layout(cap, k, hidden, es);
          for (std::uint64_t off : {l.count, l.topk, l.weights, l.x, l.bytes}) EXPECT_EQ(off % 16, 0u);
          EXPECT_GE(l.topk, l.count + 8);
          EXPECT_GE(l.weights, l.topk + static_cast<std::uint64_t>(cap * k * 8));
          EXPECT_GE(l.x, l.weights + static_cast<std::uint64_t>(cap * k * 4));
          EXPECT_GE(l.bytes, l.x + static_cast<std::uint64_t>(cap * hidden * es));
          EXPECT_LT(l.bytes, l.x + static_cast<std::uint64_t>(cap * hidden * es) + 16);  // no slack past alignment
        }
}

TEST(MoeTpLayout, AHeadIsAShardWithoutItsTokenRows) {
  // The overlapped path's sort reads heads with the shards' offsets: count, ids and weights must sit alike.
  for (std::int64_t cap : {1, 7, 128, 1001, 4096})
    for (int k : {1, 2, 7, 8, 32}) {
      const ShardLayout h = head_layout(cap, k), l = shard_layout(cap, k, 1024, 2);
      EXPECT_EQ(h.count, l.count);
      EXPECT_EQ(h.topk, l.topk);
      EXPECT_EQ(h.weights, l.weights);
      EXPECT_EQ(h.x, l.x);
      EXPECT_EQ(h.bytes, h.x);  // no room for rows
      EXPECT_EQ(h.bytes % 16, 0u);
    }
}

TEST(MoeTpLayout, CapacityAndChunksAtWorldSizesOneToEight) {
  for (int w = 1; w <= 8; ++w)
    for (std::int64_t cap : {1, 127, 128, 129, 1001, 4096})
      for (int k : {1, 2, 8}) {
        const std::int64_t g = gathered_tokens(w, cap);
        EXPECT_EQ(g, w * cap);
        EXPECT_EQ(max_pair_rows(w, cap, k), w * cap * k);
        const std::int64_t chunks = sort_chunks(w, cap);
        EXPECT_GE(chunks * kSortChunk, g);  // every gathered token in a chunk
        EXPECT_LT((chunks - 1) * kSortChunk, g);  // and no empty chunk
        for (int s = 0; s < w; ++s)
          for (std::int64_t t : {std::int64_t{0}, cap / 2, cap - 1}) {
            const std::int64_t tok = s * cap + t;
            EXPECT_EQ(gathered_rank(tok, cap), s);
            EXPECT_EQ(gathered_index(tok, cap), t);
          }
      }
}

enum class Routing { uniform, zipf, rank_to_one_expert, with_none_and_repeats, bad_ids };

// Rank s's routing of its `tokens` tokens.
std::vector<std::int64_t> route(std::mt19937_64& rng, int s, std::int64_t tokens, int k, int experts, Routing how) {
  std::vector<double> weight(experts, 1.0);
  if (how == Routing::zipf)
    for (int e = 0; e < experts; ++e) weight[e] = 1.0 / std::pow(e + 1.0, 1.2);
  std::vector<std::int64_t> topk(static_cast<std::size_t>(tokens) * k, -1);
  for (std::int64_t t = 0; t < tokens; ++t) {
    std::int64_t* row = &topk[t * k];
    if (how == Routing::rank_to_one_expert && s == 0) {  // every token of rank 0 to the last expert
      row[0] = experts - 1;
      continue;
    }
    std::vector<double> w = weight;
    for (int j = 0; j < k && j < experts; ++j) {
      std::discrete_distribution<int> pick(w.begin(), w.end());
      row[j] = pick(rng);
      w[row[j]] = 0;
    }
    if (how == Routing::with_none_and_repeats) {
      for (int j = 0; j < k; ++j)
        if (rng() % 3 == 0) row[j] = -1;
      if (k > 1 && t % 5 == 0) row[k - 1] = row[0];  // a repeated expert (or a repeated -1)
    }
    if (how == Routing::bad_ids && t % 7 == 3) row[t % k] = (t % 2) ? experts + static_cast<std::int64_t>(t) : -2;
  }
  return topk;
}

// 1001 tokens over `w` ranks, ragged: rank 1 none (w > 2), the rest by weight s + 1.
std::vector<std::int64_t> ragged(int w, std::int64_t total) {
  std::vector<std::int64_t> n(w, 0);
  std::int64_t weights = 0;
  for (int s = 0; s < w; ++s) weights += (w > 2 && s == 1) ? 0 : s + 1;
  std::int64_t given = 0;
  for (int s = 0; s < w; ++s) {
    n[s] = (w > 2 && s == 1) ? 0 : total * (s + 1) / weights;
    given += n[s];
  }
  n[0] += total - given;
  return n;
}

TEST(MoeTpSort, ChunkedPassesEqualExpertRowsOnTheGatheredRouting) {
  std::mt19937_64 rng(33);
  for (int w = 1; w <= 8; ++w)
    for (Routing how : {Routing::uniform, Routing::zipf, Routing::rank_to_one_expert, Routing::with_none_and_repeats,
                        Routing::bad_ids})
      for (auto [experts, k] : {std::pair{8, 2}, std::pair{128, 8}, std::pair{3, 1}}) {
        const std::vector<std::int64_t> counts = ragged(w, 1001);
        const std::int64_t cap = *std::max_element(counts.begin(), counts.end()) + (w % 3);  // some padding too
        std::vector<std::vector<std::int64_t>> topk;
        std::int64_t total = 0;
        for (int s = 0; s < w; ++s) {
          topk.push_back(route(rng, s, counts[s], k, experts, how));
          total += counts[s];
        }
        EXPECT_EQ(total, 1001);
        const std::vector<std::int64_t> gathered = gathered_routing(topk, counts, cap, k);
        const std::int64_t tokens = gathered_tokens(w, cap);
        ASSERT_EQ(gathered.size(), static_cast<std::size_t>(tokens * k));
        std::vector<std::int64_t> cleaned = gathered;  // bad ids count as none
        std::int64_t bad = 0;
        for (auto& e : cleaned)
          if (e < -1 || e >= experts) {
            e = -1;
            ++bad;
          }
        EXPECT_EQ(bad > 0, how == Routing::bad_ids);
        const ExpertRows want = expert_rows(cleaned.data(), tokens, k, experts);
        const ExpertRows got = chunked_expert_rows(gathered.data(), tokens, k, experts);
        const std::string what = "world " + std::to_string(w) + " routing " + std::to_string(static_cast<int>(how)) +
                                 " E " + std::to_string(experts);
        EXPECT_EQ(got.offset, want.offset) << what;
        EXPECT_EQ(got.token, want.token) << what;
        EXPECT_EQ(got.slot, want.slot) << what;
        // Padding tokens have no pairs, and each sorted row names a pair of its expert.
        for (std::size_t e = 0; e + 1 < want.offset.size(); ++e)
          for (std::int64_t i = want.offset[e]; i < want.offset[e + 1]; ++i) {
            const std::int64_t g = got.token[i];
            EXPECT_LT(gathered_index(g, cap), counts[gathered_rank(g, cap)]) << what;
            EXPECT_EQ(gathered[g * k + got.slot[i]], static_cast<std::int64_t>(e)) << what;
          }
        if (how == Routing::rank_to_one_expert) {  // rank 0's tokens are the first rows of the last expert
          for (std::int64_t t = 0; t < counts[0]; ++t) EXPECT_EQ(got.token[want.offset[experts - 1] + t], t) << what;
        }
      }
}

}  // namespace
