// EP dispatch and combine across nodes (hierarchy.hpp's ep_walk, moe/ep_layout.hpp's rail
// and return rows), simulated with integers and sum expressions on grids of 1 to 8 nodes
// of 1 to 8 GPUs, call after call in random interleavings (cpu/helpers/step_driver.hpp):
//   - every receiver's staging rows and meta records are the one-node plan's, bit for
//     bit, though a remote source's tokens reach it through its rail GPU, which builds
//     them from the token's RailRecord alone;
//   - each token crosses the NIC once per remote node it goes to, each way;
//   - combine's output is the documented sum: nodes ascending, the own node's partials
//     one by one, each remote node's partials summed in rank order and rounded once;
//   - no buffer row is overwritten before it is read, none read twice, none left unread.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cpu/helpers/step_driver.hpp"
#include "ops/hierarchy.hpp"
#include "ops/moe/ep_layout.hpp"

namespace {

using namespace weft::hierarchy;
using namespace weft::moe_detail;
using namespace step_driver;

/// One call's routing on every source, and the counts the exchange gives every rank.
struct Call {
  int k = 0;
  ExpertPlacement place;
  std::vector<std::int64_t> tokens;                    // [W]
  std::vector<std::vector<std::int64_t>> topk;         // [W][T x k]
  std::vector<SourceLayout> src;                       // [W]
  std::vector<NodeLayout> by_node;                     // [W]
  std::vector<std::int32_t> pairs, sent, node_tokens;  // [W][E], [W][W], [W][nodes]
};

/// Draws a call: T per source from 0 to 40 (source 1 none on the first call), k distinct experts a
/// token, some slots -1, every 7th token to the last expert only, every 11th routed nowhere.
Call draw_call(NodeGrid g, int experts, int k, int call, std::mt19937_64& rng) {
  const int W = g.world();
  Call c;
  c.k = k;
  c.place = ExpertPlacement{experts, W};
  c.tokens.resize(W);
  c.topk.resize(W);
  c.pairs.assign(static_cast<std::size_t>(W) * experts, 0);
  c.sent.assign(static_cast<std::size_t>(W) * W, 0);
  c.node_tokens.assign(static_cast<std::size_t>(W) * g.nodes, 0);
  std::vector<int> all(experts);
  for (int e = 0; e < experts; ++e) all[e] = e;
  for (int s = 0; s < W; ++s) {
    const std::int64_t T = call == 1 && s == 1 ? 0 : static_cast<std::int64_t>(rng() % 41);
    c.tokens[s] = T;
    auto& topk = c.topk[s];
    topk.assign(static_cast<std::size_t>(T) * k, -1);
    for (std::int64_t t = 0; t < T; ++t) {
      std::int64_t* row = &topk[t * k];
      if (t % 11 == 10) continue;
      if (t % 7 == 6) {
        row[rng() % k] = experts - 1;
        continue;
      }
      std::shuffle(all.begin(), all.end(), rng);
      for (int j = 0; j < k; ++j) row[j] = rng() % 6 == 0 ? -1 : all[j];
    }
    c.src.push_back(source_layout(topk.data(), T, k, c.place));
    c.by_node.push_back(node_layout(topk.data(), T, k, c.place, g));
    std::copy(c.src[s].pairs_per_expert.begin(), c.src[s].pairs_per_expert.end(), c.pairs.begin() + s * experts);
    std::copy(c.src[s].tokens_per_rank.begin(), c.src[s].tokens_per_rank.end(), c.sent.begin() + s * W);
    std::copy(c.by_node[s].tokens_per_node.begin(), c.by_node[s].tokens_per_node.end(),
              c.node_tokens.begin() + s * g.nodes);
  }
  return c;
}

/// The distinct ranks of token t of source s, ascending.
std::vector<int> destinations(const Call& c, int s, std::int64_t t) {
  std::vector<int> ranks(c.k);
  RowError error;
  ranks.resize(token_destinations(&c.topk[s][t * c.k], c.k, c.place, ranks.data(), error));
  return ranks;
}

/// Rank r's staging row of token t of source s: the one-node map.
std::int64_t staging_row(const Call& c, int s, std::int64_t t, int r) {
  const int W = c.place.world;
  return receive_token_base(c.sent.data(), W, r, s) + c.src[s].rank_position[t * W + r];
}

/// The one-node meta record of token t of source s on rank r: token, pairs, their recv_x rows, weights.
std::vector<std::int32_t> one_node_meta(const Call& c, int s, std::int64_t t, int r) {
  std::vector<std::int32_t> rows, weights;
  for (int j = 0; j < c.k; ++j) {
    const std::int64_t e = c.topk[s][t * c.k + j];
    if (e < 0 || c.place.owner(static_cast<int>(e)) != r) continue;
    rows.push_back(
        static_cast<std::int32_t>(receive_pair_base(c.pairs.data(), c.place, r, c.place.local(static_cast<int>(e)), s) +
                                  c.src[s].pair_position[t * c.k + j]));
    weights.push_back(static_cast<std::int32_t>(1000 * s + 10 * t + j));  // stands for the float's bits
  }
  std::vector<std::int32_t> m = {static_cast<std::int32_t>(t), static_cast<std::int32_t>(rows.size())};
  m.insert(m.end(), rows.begin(), rows.end());
  m.insert(m.end(), weights.begin(), weights.end());
  return m;
}

/// Appends `term` to the sum expression `sum` (which starts after `open` characters), with a "+" between terms.
void add_term(std::string& sum, const std::string& term, std::size_t open = 0) {
  if (sum.size() > open) sum += '+';
  sum += term;
}

std::string partial(int s, std::int64_t t, int r) {
  return "P[" + std::to_string(s) + "," + std::to_string(t) + "," + std::to_string(r) + "]";
}

/// The documented output of token t of source s: over its nodes ascending, the own node's
/// partials one by one, a remote node's as one rounded sum; fp32, rounded once.
std::string documented_output(NodeGrid g, const Call& c, int s, std::int64_t t) {
  const std::vector<int> ranks = destinations(c, s, t);
  if (ranks.empty()) return "0";
  if (ranks.size() == 1 && ranks[0] == s) return partial(s, t, s);  // stored by the reduce
  std::string out = "round(";
  for (std::size_t i = 0; i < ranks.size();) {
    const int node = g.node_of(ranks[i]);
    std::string node_sum;
    for (; i < ranks.size() && g.node_of(ranks[i]) == node; ++i)
      add_term(node_sum, partial(s, t, ranks[i]));
    add_term(out, node == g.node_of(s) ? node_sum : "round(" + node_sum + ")", 6);
  }
  return out + ")";
}

/// A buffer row: what it holds, of which call, and how many reads of it are still to come.
struct Row {
  int epoch = 0;
  int unread = 0;
  std::string what;
  std::vector<std::int32_t> words;
};
using Buffer = std::map<std::int64_t, Row>;  // by row

/// Writes a row, refusing one whose reads are still to come; a row is written once a call,
/// except by the reduce, which overwrites its token with the partial (`in_place`).
std::string write_row(Buffer& b, std::int64_t row, int e, int readers, std::string what,
                      std::vector<std::int32_t> words, const std::string& where, bool in_place = false) {
  if (row < 0) return where + ": a negative row";
  Row& r = b[row];
  if (r.unread > 0)
    return where + " row " + std::to_string(row) + " still holds call " + std::to_string(r.epoch) + "'s " + r.what +
           ", not yet read: overwritten by call " + std::to_string(e);
  if (r.epoch == e && !in_place)
    return where + " row " + std::to_string(row) + " written twice in call " + std::to_string(e);
  r = Row{e, readers, std::move(what), std::move(words)};
  return "";
}

std::string read_row(Buffer& b, std::int64_t row, int e, const std::string& want, const std::string& where,
                     Row* out = nullptr) {
  auto it = b.find(row);
  if (it == b.end() || it->second.epoch != e || it->second.unread == 0)
    return where + " row " + std::to_string(row) + " read in call " + std::to_string(e) + " holds " +
           (it == b.end() ? std::string("nothing")
                          : "call " + std::to_string(it->second.epoch) + "'s " + it->second.what + " (" +
                                std::to_string(it->second.unread) + " reads left)");
  if (!want.empty() && it->second.what != want)
    return where + " row " + std::to_string(row) + " holds " + it->second.what + ", not " + want;
  --it->second.unread;
  if (out) *out = it->second;
  return "";
}

class EpSemantics final : public Semantics {
 public:
  EpSemantics(NodeGrid g, std::vector<Call> calls)
      : g_(g), calls_(std::move(calls)), staging_(g.world()), rail_(g.world()), ret_(g.world()), out_(g.world()) {}
  int flag_slots() const override { return ep_flag_slots(g_); }
  bool parity_flags() const override { return false; }
  std::string start(int, int) override { return ""; }

  std::string apply(int gpu, int e, const Step& s) override {
    if (s.act == Act::signal || s.act == Act::wait) return "";  // the flags carry no data here
    if (s.peer != gpu) return "a data step names another GPU";
    const Call& c = calls_.at(e - 1);
    switch (s.act) {
      case Act::ep_send: return send(gpu, e, c);
      case Act::ep_forward: return forward(gpu, e, c);
      case Act::ep_receive: return receive(gpu, e, c);
      case Act::ep_reduce: return reduce(gpu, e, c);
      case Act::ep_return: return give_back(gpu, e, c);
      case Act::ep_gather: return gather(gpu, e, c);
      default: return "not an EP step";
    }
  }

  std::string finish(int gpu, int e) override {
    const Call& c = calls_.at(e - 1);
    for (std::int64_t t = 0; t < c.tokens[gpu]; ++t) {
      auto it = out_[gpu].find(t);
      if (it == out_[gpu].end() || it->second.epoch != e) return "token " + std::to_string(t) + " has no output";
      const std::string want = documented_output(g_, c, gpu, t);
      if (it->second.what != want)
        return "token " + std::to_string(t) + ": output " + it->second.what + ", documented " + want;
    }
    for (const Buffer* b : {&rail_[gpu], &ret_[gpu]})
      for (const auto& [row, r] : *b)
        if (r.epoch == e && r.unread != 0)
          return "row " + std::to_string(row) + " (" + r.what + ") left with " + std::to_string(r.unread) + " reads";
    return "";
  }

  /// After the last call: every row read as often as its writer said.
  std::string all_read() const {
    for (int gpu = 0; gpu < g_.world(); ++gpu)
      for (const std::vector<Buffer>* v : {&staging_, &rail_, &ret_})
        for (const auto& [row, r] : (*v)[gpu])
          if (r.unread != 0) return "GPU " + std::to_string(gpu) + " row " + std::to_string(row) + " unread: " + r.what;
    return "";
  }
  long nic_puts() const { return nic_puts_; }
  long nic_returns() const { return nic_returns_; }

 private:
  std::string where(const char* buffer, int gpu) const {
    return std::string(buffer) + " of GPU " + std::to_string(gpu);
  }

  std::string send(int s, int e, const Call& c) {
    const RailRecord rec{c.k, g_.local};
    for (std::int64_t t = 0; t < c.tokens[s]; ++t) {
      const std::vector<int> ranks = destinations(c, s, t);
      std::vector<EpHop> hops(ranks.size());
      const int h = ep_two_hop(g_, s, ranks.data(), static_cast<int>(ranks.size()), hops.data());
      const std::string token = "token " + std::to_string(s) + "," + std::to_string(t);
      for (int i = 0; i < h; ++i) {
        const EpHop& hop = hops[i];
        if (hop.rail_target == s) {  // its own node: straight into each receiver's staging
          for (int j = hop.begin; j < hop.end; ++j) {
            const int r = ranks[j];
            if (auto err = write_row(staging_[r], staging_row(c, s, t, r), e, 1, token, one_node_meta(c, s, t, r),
                                     where("staging", r));
                !err.empty())
              return err;
          }
          continue;
        }
        // A remote node: once over the NIC, with the record its rail GPU needs.
        const std::int32_t pos = c.by_node[s].node_position[t * g_.nodes + hop.node];
        std::vector<std::int32_t> words(rec.words(), -1);
        words[rec.token()] = static_cast<std::int32_t>(t);
        words[rec.return_row()] = static_cast<std::int32_t>(return_base(c.node_tokens.data(), g_, s, hop.node) + pos);
        for (int j = 0; j < c.k; ++j) {
          const std::int64_t ex = c.topk[s][t * c.k + j];
          if (ex < 0 || g_.node_of(c.place.owner(static_cast<int>(ex))) != hop.node) continue;
          const int owner = c.place.owner(static_cast<int>(ex));
          words[rec.expert(j)] = static_cast<std::int32_t>(ex);
          words[rec.pair_row(j)] = static_cast<std::int32_t>(
              receive_pair_base(c.pairs.data(), c.place, owner, c.place.local(static_cast<int>(ex)), s) +
              c.src[s].pair_position[t * c.k + j]);
          words[rec.weight(j)] = static_cast<std::int32_t>(1000 * s + 10 * t + j);
        }
        for (int j = hop.begin; j < hop.end; ++j)
          words[rec.staging_row(g_.local_of(ranks[j]))] = static_cast<std::int32_t>(staging_row(c, s, t, ranks[j]));
        const std::int64_t row = rail_receive_base(c.node_tokens.data(), g_, hop.rail_target, s) + pos;
        if (auto err = write_row(rail_[hop.rail_target], row, e, 2, "rail " + token, std::move(words),
                                 where("rail staging", hop.rail_target));
            !err.empty())
          return err;
        ++nic_puts_;
      }
    }
    return "";
  }

  /// Reads each row of `gpu`'s rail staging, rail peer by rail peer (the counts give the rows'
  /// ranges), and calls f(source, its token, the row): "" or what went wrong.
  template <class F>
  std::string for_each_rail_row(int gpu, int e, const Call& c, F f) {
    const RailRecord rec{c.k, g_.local};
    const int n = g_.node_of(gpu), l = g_.local_of(gpu);
    for (int m = 0; m < g_.nodes; ++m) {
      if (m == n) continue;
      const int from = g_.rank(m, l);
      const std::int64_t base = rail_receive_base(c.node_tokens.data(), g_, gpu, from);
      for (std::int64_t i = 0; i < c.node_tokens[static_cast<std::size_t>(from) * g_.nodes + n]; ++i) {
        Row r;
        if (auto err = read_row(rail_[gpu], base + i, e, "", where("rail staging", gpu), &r); !err.empty()) return err;
        const std::int32_t t = r.words[rec.token()];
        if (r.what != "rail token " + std::to_string(from) + "," + std::to_string(t))
          return "rail row " + std::to_string(base + i) + " holds " + r.what;
        if (auto err = f(from, t, r); !err.empty()) return err;
      }
    }
    return "";
  }

  /// The rail GPU places each rail token from its record alone (and the counts, for the rows' range).
  std::string forward(int gpu, int e, const Call& c) {
    const RailRecord rec{c.k, g_.local};
    const int n = g_.node_of(gpu);
    return for_each_rail_row(gpu, e, c, [&](int from, std::int32_t t, const Row& r) -> std::string {
      const std::string token = "token " + std::to_string(from) + "," + std::to_string(t);
      for (int dl = 0; dl < g_.local; ++dl) {
        const std::int32_t row = r.words[rec.staging_row(dl)];
        if (row < 0) continue;
        const int dest = g_.rank(n, dl);
        std::vector<std::int32_t> rows, weights;
        for (int j = 0; j < c.k; ++j) {
          const std::int32_t ex = r.words[rec.expert(j)];
          if (ex < 0 || c.place.owner(ex) != dest) continue;
          rows.push_back(r.words[rec.pair_row(j)]);
          weights.push_back(r.words[rec.weight(j)]);
        }
        std::vector<std::int32_t> meta = {t, static_cast<std::int32_t>(rows.size())};
        meta.insert(meta.end(), rows.begin(), rows.end());
        meta.insert(meta.end(), weights.begin(), weights.end());
        if (auto err = write_row(staging_[dest], row, e, 1, token, std::move(meta), where("staging", dest));
            !err.empty())
          return err;
      }
      return "";
    });
  }

  /// Calls f(source, token) for each token rank r receives, by source, then token: "" or what went wrong.
  template <class F>
  std::string for_each_staged(int r, const Call& c, F f) const {
    const int W = g_.world();
    for (int s = 0; s < W; ++s)
      for (std::int64_t t = 0; t < c.tokens[s]; ++t)
        if (c.src[s].rank_position[t * W + r] >= 0)
          if (auto err = f(s, t); !err.empty()) return err;
    return "";
  }

  /// Every row the one-node maps give this receiver holds its token and the one-node meta record.
  std::string receive(int r, int e, const Call& c) {
    const int W = g_.world();
    auto err = for_each_staged(r, c, [&](int s, std::int64_t t) -> std::string {
      Row got;
      const std::string token = "token " + std::to_string(s) + "," + std::to_string(t);
      if (auto err = read_row(staging_[r], staging_row(c, s, t, r), e, token, where("staging", r), &got); !err.empty())
        return err;
      if (got.words != one_node_meta(c, s, t, r)) return token + ": its meta record differs from the one-node plan's";
      return "";
    });
    if (!err.empty()) return err;
    std::int64_t rows = 0;
    for (int s = 0; s < W; ++s) rows += c.sent[static_cast<std::size_t>(s) * W + r];
    for (const auto& [row, x] : staging_[r])
      if (x.epoch == e && row >= rows) return "a token written past the receive rows: row " + std::to_string(row);
    return "";
  }

  /// Each staged token's partial, in place; a token that went to its own source alone is its output.
  std::string reduce(int r, int e, const Call& c) {
    return for_each_staged(r, c, [&](int s, std::int64_t t) -> std::string {
      if (s == r && destinations(c, s, t).size() == 1) {
        out_[r][t] = Row{e, 0, partial(s, t, r), {}};
        return "";
      }
      return write_row(staging_[r], staging_row(c, s, t, r), e, 1, partial(s, t, r), {}, where("staging", r), true);
    });
  }

  /// The rail GPU's node sums, from the records in its rail staging, to the sources' return rows.
  std::string give_back(int gpu, int e, const Call& c) {
    const RailRecord rec{c.k, g_.local};
    const int n = g_.node_of(gpu);
    return for_each_rail_row(gpu, e, c, [&](int from, std::int32_t t, const Row& r) -> std::string {
      std::string sum;
      for (int dl = 0; dl < g_.local; ++dl) {  // local ranks ascending
        const std::int32_t row = r.words[rec.staging_row(dl)];
        if (row < 0) continue;
        const int dest = g_.rank(n, dl);
        if (auto err = read_row(staging_[dest], row, e, partial(from, t, dest), where("staging", dest)); !err.empty())
          return err;
        add_term(sum, partial(from, t, dest));
      }
      if (auto err = write_row(ret_[from], r.words[rec.return_row()], e, 1, "round(" + sum + ")", {},
                               where("return rows", from));
          !err.empty())
        return err;
      ++nic_returns_;
      return "";
    });
  }

  /// Each own token's output: its nodes ascending, the own node's partials one by one, the returned sums.
  std::string gather(int s, int e, const Call& c) {
    for (std::int64_t t = 0; t < c.tokens[s]; ++t) {
      const std::vector<int> ranks = destinations(c, s, t);
      if (ranks.empty()) {
        out_[s][t] = Row{e, 0, "0", {}};
        continue;
      }
      if (ranks.size() == 1 && ranks[0] == s) continue;  // the reduce stored it
      std::string out = "round(";
      std::vector<EpHop> hops(ranks.size());
      const int h = ep_two_hop(g_, s, ranks.data(), static_cast<int>(ranks.size()), hops.data());
      for (int i = 0; i < h; ++i) {
        const EpHop& hop = hops[i];
        if (hop.rail_target == s) {
          for (int j = hop.begin; j < hop.end; ++j) {
            Row p;
            if (auto err =
                    read_row(staging_[ranks[j]], staging_row(c, s, t, ranks[j]), e, "", where("staging", ranks[j]), &p);
                !err.empty())
              return err;
            add_term(out, p.what, 6);
          }
          continue;
        }
        const std::int64_t row =
            return_base(c.node_tokens.data(), g_, s, hop.node) + c.by_node[s].node_position[t * g_.nodes + hop.node];
        Row sum;
        if (auto err = read_row(ret_[s], row, e, "", where("return rows", s), &sum); !err.empty()) return err;
        add_term(out, sum.what, 6);
      }
      out_[s][t] = Row{e, 0, out + ")", {}};
    }
    return "";
  }

  NodeGrid g_;
  std::vector<Call> calls_;
  std::vector<Buffer> staging_, rail_, ret_;  // [gpu]: receive staging (tokens, then partials), rail staging, returns
  std::vector<Buffer> out_;                   // [gpu]: each own token's output, by token
  long nic_puts_ = 0, nic_returns_ = 0;
};

constexpr int kCalls = 3;
constexpr int kInterleavings = 2;

std::vector<Call> draw_calls(NodeGrid g, int experts, int k, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Call> calls;
  for (int call = 1; call <= kCalls; ++call) calls.push_back(draw_call(g, experts, k, call, rng));
  return calls;
}

/// Experts for a grid: 4 a rank up to 64 ranks (at most 256 over all), k 8 (fewer where there are fewer experts).
int experts_for(NodeGrid g) { return 4 * g.world(); }

long expected_crossings(NodeGrid g, const std::vector<Call>& calls) {
  long n = 0;
  for (const Call& c : calls)
    for (int s = 0; s < g.world(); ++s)
      for (std::int64_t t = 0; t < c.tokens[s]; ++t) {
        const std::vector<int> ranks = destinations(c, s, t);
        n += ep_nic_crossings(g, s, ranks.data(), static_cast<int>(ranks.size()));
      }
  return n;
}

TEST(EpTwoHop, EveryCallDeliversTheOneNodeLayoutAndTheDocumentedSumsInAnyInterleaving) {
  for (NodeGrid g : every_grid()) {
    const int experts = experts_for(g), k = std::min(8, experts);
    const auto steps = step_lists(g, [](NodeGrid gg, int r, auto&& f) { ep_walk(gg, r, f); });
    for (int seed = 0; seed < kInterleavings; ++seed) {
      const std::vector<Call> calls = draw_calls(g, experts, k, 77 * g.world() + seed);
      EpSemantics sem(g, calls);
      ASSERT_EQ(run_launches(g, steps, sem, kCalls, 4000 * g.world() + seed), "") << name(g) << ", seed " << seed;
      EXPECT_EQ(sem.all_read(), "") << name(g);
      // Once over the NIC per (token, remote node), each way: ep_two_hop's count, the model's.
      const long crossings = expected_crossings(g, calls);
      EXPECT_EQ(sem.nic_puts(), crossings) << name(g);
      EXPECT_EQ(sem.nic_returns(), crossings) << name(g);
      if (g.nodes > 1) {
        EXPECT_GT(crossings, 0) << name(g) << ": the draw never left a node";
      }
    }
  }
}

TEST(EpTwoHop, OnOneNodeTheOutputIsTheOneNodeCombinesSum) {
  // The one-node combine: sum over the token's ranks ascending, fp32, rounded once.
  for (int local = 1; local <= 8; ++local) {
    const NodeGrid g{1, local};
    std::mt19937_64 rng(local);
    const Call c = draw_call(g, 4 * local, std::min(8, 4 * local), 2, rng);
    for (int s = 0; s < local; ++s)
      for (std::int64_t t = 0; t < c.tokens[s]; ++t) {
        const std::vector<int> ranks = destinations(c, s, t);
        std::string one_node = ranks.empty() ? "0" : ranks.size() == 1 && ranks[0] == s ? partial(s, t, s) : "round(";
        if (one_node == "round(") {
          for (std::size_t i = 0; i < ranks.size(); ++i) add_term(one_node, partial(s, t, ranks[i]), 6);
          one_node += ")";
        }
        EXPECT_EQ(documented_output(g, c, s, t), one_node) << name(g);
      }
  }
}

TEST(EpTwoHop, RailAndReturnRowsTileTheirBuffers) {
  for (NodeGrid g : every_grid()) {
    std::mt19937_64 rng(g.world());
    const Call c = draw_call(g, experts_for(g), std::min(8, experts_for(g)), 2, rng);
    const int W = g.world();
    for (int gpu = 0; gpu < W; ++gpu) {
      // Rail staging: each rail peer's tokens for this node, contiguous, by node.
      std::vector<int> hits(rail_receive_rows(c.node_tokens.data(), g, gpu), 0);
      for (int m = 0; m < g.nodes; ++m) {
        if (m == g.node_of(gpu)) continue;
        const int from = g.rank(m, g.local_of(gpu));
        for (std::int64_t t = 0; t < c.tokens[from]; ++t) {
          const std::int32_t pos = c.by_node[from].node_position[t * g.nodes + g.node_of(gpu)];
          if (pos < 0) continue;
          const std::int64_t row = rail_receive_base(c.node_tokens.data(), g, gpu, from) + pos;
          ASSERT_TRUE(row >= 0 && row < static_cast<std::int64_t>(hits.size())) << name(g);
          ++hits[row];
        }
      }
      for (std::size_t i = 0; i < hits.size(); ++i) EXPECT_EQ(hits[i], 1) << name(g) << " GPU " << gpu << " row " << i;
      // Return rows: the GPU's tokens once per remote node.
      std::vector<int> back(return_rows(c.node_tokens.data(), g, gpu), 0);
      for (std::int64_t t = 0; t < c.tokens[gpu]; ++t)
        for (int m = 0; m < g.nodes; ++m) {
          const std::int32_t pos = c.by_node[gpu].node_position[t * g.nodes + m];
          if (pos < 0 || m == g.node_of(gpu)) continue;
          const std::int64_t row = return_base(c.node_tokens.data(), g, gpu, m) + pos;
          ASSERT_TRUE(row >= 0 && row < static_cast<std::int64_t>(back.size())) << name(g);
          ++back[row];
        }
      for (std::size_t i = 0; i < back.size(); ++i) EXPECT_EQ(back[i], 1) << name(g) << " GPU " << gpu << " row " << i;
    }
  }
}

TEST(EpTwoHop, TheSimulationCatchesAMissingWaitAndAMissingBarrier) {
  const NodeGrid g{2, 2};
  const int experts = experts_for(g), k = 8;
  auto drop = [&](auto keep) {
    auto steps = step_lists(g, [](NodeGrid gg, int r, auto&& f) { ep_walk(gg, r, f); });
    for (auto& list : steps) list.erase(std::remove_if(list.begin(), list.end(), keep), list.end());
    return steps;
  };
  auto caught = [&](const std::vector<std::vector<Step>>& steps, const std::string& what) {
    std::string last;
    for (int seed = 0; seed < 50; ++seed) {
      EpSemantics sem(g, draw_calls(g, experts, k, seed));
      last = run_launches(g, steps, sem, kCalls, seed);
      if (last.find(what) != std::string::npos) return std::string();
    }
    return "never caught; last run: " + (last.empty() ? std::string("passed") : last);
  };
  // The rail GPU forwarding before its rail peers' tokens are all there: it reads rows not yet written.
  const int rail0 = ep_rail_flag(g, 0), rail_end = ep_rail_flag(g, g.nodes);
  EXPECT_EQ(caught(drop([&](const Step& s) { return s.act == Act::wait && s.flag >= rail0 && s.flag < rail_end; }),
                   "read in call"),
            "");
  // Returning node sums before the node's partials are ready.
  const int part0 = ep_partial_flag(g, 0), part_end = ep_partial_flag(g, g.local);
  EXPECT_EQ(caught(drop([&](const Step& s) { return s.act == Act::wait && s.flag >= part0 && s.flag < part_end; }),
                   "read in call"),
            "");
  // Without the counts exchange, a GPU a call ahead overwrites rows its peers have not read.
  EXPECT_EQ(caught(drop([&](const Step& s) { return s.flag >= 0 && s.flag < g.world(); }), "not yet read"), "");
}

TEST(EpTwoHop, FlagSlotsArePartitioned) {
  for (NodeGrid g : every_grid()) {
    std::vector<int> used(ep_flag_slots(g), 0);
    for (int p = 0; p < g.world(); ++p) ++used[ep_counts_flag(g, p)], ++used[ep_dispatch_flag(g, p)];
    for (int m = 0; m < g.nodes; ++m) ++used[ep_rail_flag(g, m)], ++used[ep_return_flag(g, m)];
    for (int i = 0; i < g.local; ++i) ++used[ep_partial_flag(g, i)];
    for (int u : used) EXPECT_EQ(u, 1) << name(g);
  }
}

}  // namespace
