// The two-level (multi-node) schedules' index maps (src/ops/hierarchy.hpp), simulated with
// integers on the CPU for grids of 1 to 8 nodes of 1 to 8 GPUs: AllGather delivers every
// shard once over the right links, in an order its GEMM can walk; ReduceScatter and
// AllReduce (on both rail ways, direct and halving-doubling) sum every contribution exactly
// once, at the NIC bytes and latencies the cost model (tools/model/scale_model.py) assumes;
// the EP two-hop route delivers every (token, rank) pair once, crossing the NIC at most once
// per remote node.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "cpu/helpers/step_driver.hpp"
#include "ops/hierarchy.hpp"
#include "ops/moe/ep_layout.hpp"

namespace {

using namespace weft::hierarchy;
using namespace step_driver;

const std::vector<NodeGrid> kGrids = {{1, 1}, {1, 2}, {1, 8}, {2, 1}, {2, 2}, {2, 4},
                                      {4, 2}, {8, 1}, {3, 2}, {2, 3}, {4, 4}};

bool same_node(NodeGrid g, int a, int b) { return g.node_of(a) == g.node_of(b); }
/// A rail link: the same local rank, another node.
bool rail_link(NodeGrid g, int a, int b) { return g.local_of(a) == g.local_of(b) && !same_node(g, a, b); }

// ---- the grid ----

TEST(Hierarchy, GridNumbersRanksNodeMajor) {
  for (NodeGrid g : kGrids) {
    ASSERT_TRUE(g.valid()) << name(g);
    EXPECT_EQ(g.world(), g.nodes * g.local) << name(g);
    for (int r = 0; r < g.world(); ++r) {
      EXPECT_EQ(g.rank(g.node_of(r), g.local_of(r)), r) << name(g) << " rank " << r;
      EXPECT_EQ(g.node_of(r), r / g.local) << name(g) << " rank " << r;
      EXPECT_LT(g.local_of(r), g.local) << name(g) << " rank " << r;
    }
  }
  EXPECT_FALSE((NodeGrid{0, 8}.valid()));
  EXPECT_FALSE((NodeGrid{2, 0}.valid()));
}

TEST(Hierarchy, GridFromNodeIdsTakesEqualContiguousNodes) {
  for (NodeGrid want : kGrids) {
    std::vector<int> node_of;
    for (int r = 0; r < want.world(); ++r) node_of.push_back(r / want.local);
    NodeGrid got{0, 0};
    EXPECT_EQ(grid_from_nodes(node_of, got), "") << name(want);
    EXPECT_EQ(got.nodes, want.nodes) << name(want);
    EXPECT_EQ(got.local, want.local) << name(want);
  }
}

TEST(Hierarchy, GridFromNodeIdsSaysWhyOtherLayoutsAreNoGrid) {
  const std::vector<std::pair<std::vector<int>, std::string>> bad = {
      {{}, "no ranks"},
      {{0, 1, 0, 1}, "not contiguous"},
      {{0, 0, 1, 1, 0, 0}, "not contiguous"},
      {{0, 0, 0, 1}, "equal size"},
      {{0, 1, 1}, "equal size"},
      {{1, 1, 0, 0}, "order of first appearance"},
      {{0, 2, 1}, "order of first appearance"},
      {{0, -1}, "order of first appearance"},
  };
  for (const auto& [node_of, why] : bad) {
    NodeGrid g{7, 7};
    const std::string error = grid_from_nodes(node_of, g);
    std::string ids;
    for (int n : node_of) ids += std::to_string(n) + " ";
    EXPECT_NE(error.find(why), std::string::npos) << "node ids [ " << ids << "]: got \"" << error << "\"";
    EXPECT_EQ(g.nodes, 7) << "the grid is left alone on an error";
  }
}

// ---- AllGather ----

// Hop by hop: hop 0 is every GPU's own shard pushed to its local peers; hop h
// (1..nodes-1) is rail step h, then the pushes of what it brought. Each step's
// sends read what the sender held before the step.
TEST(Hierarchy, AllGatherDeliversEveryShardOnceOverTheRightLinks) {
  for (NodeGrid g : kGrids) {
    const int W = g.world(), L = g.local;
    std::vector<std::vector<int>> held(W, std::vector<int>(W, 0));  // [gpu][shard]: times present
    std::vector<int> nic_sends(W, 0);
    std::vector<std::map<int, AgDelivery>> seen(W);  // [gpu]: shard -> how it came
    for (int r = 0; r < W; ++r) {
      held[r][r] = 1;
      seen[r][r] = AgDelivery{Via::self, r, 0, 0};
    }
    for (int hop = 0; hop < g.nodes; ++hop) {
      if (hop > 0) {                            // rail step `hop`
        std::vector<std::pair<int, int>> sent;  // (receiver, shard)
        for (int r = 0; r < W; ++r) {
          const int shard = ag_rail_send_shard(g, r, hop), to = ag_rail_to(g, r);
          ASSERT_EQ(held[r][shard], 1) << name(g) << ": GPU " << r << " sends shard " << shard << " at rail step "
                                       << hop << " before it holds it";
          ASSERT_TRUE(rail_link(g, r, to)) << name(g) << ": rail step " << hop << " from " << r << " to " << to;
          EXPECT_EQ(ag_rail_from(g, to), r) << name(g);
          EXPECT_EQ(ag_rail_recv_shard(g, to, hop), shard) << name(g) << ": GPU " << to << " step " << hop;
          sent.push_back({to, shard});
          ++nic_sends[r];
        }
        for (auto [to, shard] : sent) {
          ++held[to][shard];
          seen[to][shard] = AgDelivery{Via::rail, ag_rail_from(g, to), hop, 0};
        }
      }
      // NVLink pushes of hop `hop`, turn by turn: each GPU takes one push a turn.
      for (int turn = 1; turn < L; ++turn) {
        std::vector<int> taken(W, 0);
        std::vector<std::pair<int, int>> sent;
        for (int r = 0; r < W; ++r) {
          const int shard = ag_push_shard(g, r, hop), to = ag_push_to(g, r, turn);
          ASSERT_EQ(held[r][shard], 1) << name(g) << ": GPU " << r << " pushes shard " << shard << " at hop " << hop
                                       << " before it holds it";
          ASSERT_TRUE(same_node(g, r, to) && to != r) << name(g) << ": NVLink push from " << r << " to " << to;
          EXPECT_EQ(++taken[to], 1) << name(g) << ": GPU " << to << " takes two pushes at hop " << hop << " turn "
                                    << turn;
          sent.push_back({to, shard});
          seen[to][shard] = AgDelivery{Via::nvlink, r, hop, turn};
        }
        for (auto [to, shard] : sent) ++held[to][shard];
      }
      // After hop h a GPU holds exactly the first (h+1) L shards of its arrival order.
      for (int r = 0; r < W; ++r)
        for (int i = 0; i < W; ++i)
          EXPECT_EQ(held[r][ag_arrival(g, r, i)], i < (hop + 1) * L ? 1 : 0)
              << name(g) << ": GPU " << r << " after hop " << hop << ", arrival " << i;
    }
    for (int r = 0; r < W; ++r) {
      EXPECT_EQ(nic_sends[r], g.nodes - 1) << name(g) << ": shards GPU " << r << " puts on its NIC";
      for (int s = 0; s < W; ++s) {
        ASSERT_EQ(held[r][s], 1) << name(g) << ": GPU " << r << " holds shard " << s << " " << held[r][s] << " times";
        const AgDelivery want = seen[r][s], got = ag_delivery(g, r, s);
        EXPECT_EQ(got.via, want.via) << name(g) << ": shard " << s << " at GPU " << r;
        EXPECT_EQ(got.from, want.from) << name(g) << ": shard " << s << " at GPU " << r;
        EXPECT_EQ(got.hop, want.hop) << name(g) << ": shard " << s << " at GPU " << r;
        EXPECT_EQ(got.turn, want.turn) << name(g) << ": shard " << s << " at GPU " << r;
      }
    }
  }
}

TEST(Hierarchy, AllGatherTileOrderIsAPermutationOwnShardFirst) {
  for (NodeGrid g : kGrids) {
    const int W = g.world();
    for (int r = 0; r < W; ++r) {
      EXPECT_EQ(ag_tile_order(g, r, 0), r) << name(g) << ": GPU " << r << " computes its own rows first";
      std::set<int> shards;
      int last_hop = 0;
      for (int i = 0; i < W; ++i) {
        const int s = ag_tile_order(g, r, i);
        ASSERT_GE(s, 0) << name(g);
        ASSERT_LT(s, W) << name(g);
        shards.insert(s);
        EXPECT_EQ(ag_arrival_index(g, r, s), i) << name(g) << ": GPU " << r << " shard " << s;
        // Never a shard whose delivery comes after a later one's: hops do not decrease.
        const int hop = ag_delivery(g, r, s).hop;
        EXPECT_GE(hop, last_hop) << name(g) << ": GPU " << r << " tile " << i;
        last_hop = hop;
      }
      EXPECT_EQ(shards.size(), static_cast<std::size_t>(W)) << name(g) << ": GPU " << r;
    }
  }
}

// The model's times (scale_model.py, ag_arrivals): rail step h lands at h x T;
// a hop's NVLink pushes are ready when it lands and are taken one after the
// other. With NVLink keeping up (L-1 pushes within one rail step) the arrival
// order is the order in which the shards land.
TEST(Hierarchy, AllGatherArrivalOrderIsTheModelsWhenNvlinkKeepsUp) {
  for (NodeGrid g : kGrids) {
    const int W = g.world(), L = g.local;
    const int T = 10 * L, push = 3;  // (L-1) x 3 + 1 < T
    for (int r = 0; r < W; ++r) {
      int busy = 0, last = -1;
      for (int i = 0; i < W; ++i) {
        const AgDelivery d = ag_delivery(g, r, ag_arrival(g, r, i));
        int at = 0;
        if (d.via == Via::rail) at = d.hop * T;
        if (d.via == Via::nvlink) at = busy = std::max(busy, d.hop * T) + push;
        EXPECT_GT(at, last) << name(g) << ": GPU " << r << " arrival " << i << " lands no later than arrival " << i - 1;
        last = at;
      }
    }
  }
}

// ---- ReduceScatter ----

// Rank r's partial of block b: (b+1) in the high half, bit r in the low: a
// sum names its block (high half = (b+1) x contributors) and every contributor.
using Partial = std::uint64_t;
Partial contribution(int rank, int block) { return (std::uint64_t(block + 1) << 32) | (std::uint64_t{1} << rank); }
Partial full_sum(int block, int world) {
  return (std::uint64_t(block + 1) * world << 32) | ((std::uint64_t{1} << world) - 1);
}
/// a + b, after checking that no contributor is in both (no partial added twice).
::testing::AssertionResult add_once(Partial& a, Partial b) {
  if ((a & b & 0xffffffffu) != 0) return ::testing::AssertionFailure() << "contributors added twice";
  a += b;
  return ::testing::AssertionSuccess();
}

TEST(Hierarchy, ReduceScatterSumsEveryContributionOnceAtItsOwner) {
  for (NodeGrid g : kGrids) {
    const int W = g.world(), L = g.local;
    ASSERT_LE(W, 16);
    struct Arrived {
      int from, block, step;
      Partial value;
      bool used = false;
    };
    std::vector<std::vector<Arrived>> nvl(W),
        rail(W);  // what arrived at each GPU
    std::vector<Partial> own_block(W, 0);
    std::vector<int> nic_sends(W, 0), waits(W, 0);
    std::vector<std::set<int>> computed(W);
    // Takes the partials of `block` from `inbox` that the named senders sent, each once, before `step`.
    auto take = [&](std::vector<Arrived>& inbox, int block, int from, int step, Partial& sum, const std::string& what) {
      int found = 0;
      for (Arrived& a : inbox)
        if (a.block == block && a.from == from) {
          ++found;
          EXPECT_FALSE(a.used) << name(g) << ": " << what;
          EXPECT_LT(a.step, step) << name(g) << ": " << what << " is summed before it was sent";
          EXPECT_TRUE(add_once(sum, a.value)) << name(g) << ": " << what;
          a.used = true;
        }
      EXPECT_EQ(found, 1) << name(g) << ": " << what;
    };
    for (int t = 0; t < W; ++t) {
      std::vector<int> nvl_taken(W, 0), nic_taken(W, 0);
      for (int r = 0; r < W; ++r) {
        const int b = rs_block(g, r, t);
        ASSERT_TRUE(computed[r].insert(b).second) << name(g) << ": GPU " << r << " computes block " << b << " twice";
        EXPECT_EQ(rs_step(g, r, b), t) << name(g) << ": GPU " << r;
        const RsRoute route = rs_route(g, r, b);
        Partial mine = contribution(r, b);
        const std::string at =
            "GPU " + std::to_string(r) + ", step " + std::to_string(t) + ", block " + std::to_string(b);
        if (route.via == Via::nvlink) {
          ASSERT_TRUE(same_node(g, r, route.to) && route.to != r) << name(g) << ": " << at << " to " << route.to;
          EXPECT_EQ(g.local_of(route.to), g.local_of(b)) << name(g) << ": " << at << " goes to its rail's GPU";
          EXPECT_EQ(++nvl_taken[route.to], 1) << name(g) << ": " << at << ": GPU " << route.to << " takes two";
          nvl[route.to].push_back({r, b, t, mine});
        } else {
          // Its rail's block (own or remote): sum the peers' partials, in arrival order.
          EXPECT_EQ(g.local_of(b), g.local_of(r)) << name(g) << ": " << at;
          EXPECT_EQ(t % L, L - 1) << name(g) << ": " << at << ": the rail's block ends its group";
          for (int i = 1; i <= rs_rail_waits(g); ++i) {
            const int from = rs_peer_partial_from(g, r, i);
            EXPECT_EQ(rs_step(g, from, b), t - L + i) << name(g) << ": " << at << ", peer " << from;
            take(nvl[r], b, from, t, mine, at + ", peer partial " + std::to_string(i));
            ++waits[r];
          }
          if (route.via == Via::rail) {
            ASSERT_EQ(route.to, b) << name(g) << ": " << at;
            ASSERT_TRUE(rail_link(g, r, b)) << name(g) << ": " << at;
            EXPECT_EQ(++nic_taken[b], 1) << name(g) << ": " << at << ": GPU " << b << " takes two node partials";
            rail[b].push_back({r, b, t, mine});
            ++nic_sends[r];
          } else {
            ASSERT_EQ(route.via, Via::self) << name(g) << ": " << at;
            ASSERT_EQ(b, r) << name(g) << ": " << at;
            EXPECT_EQ(t, W - 1) << name(g) << ": the own block comes last";
            own_block[r] = mine;
          }
        }
      }
    }
    // The final sums: the own node's partial (above), then the other nodes'.
    for (int r = 0; r < W; ++r) {
      EXPECT_EQ(computed[r].size(), static_cast<std::size_t>(W)) << name(g) << ": GPU " << r;
      Partial sum = own_block[r];
      for (int i = 1; i < g.nodes; ++i) {
        take(rail[r], r, rs_node_partial_from(g, r, i), W, sum,
             "GPU " + std::to_string(r) + ", node partial " + std::to_string(i));
        ++waits[r];
      }
      EXPECT_EQ(sum, full_sum(r, W)) << name(g) << ": GPU " << r << "'s block";
      EXPECT_EQ(nic_sends[r], g.nodes - 1) << name(g) << ": blocks GPU " << r << " puts on its NIC";
      // Every partial that arrived was waited for, once: (nodes-1) rail puts x rs_rail_waits, then rs_final_waits.
      EXPECT_EQ(waits[r], (g.nodes - 1) * rs_rail_waits(g) + rs_final_waits(g)) << name(g) << ": GPU " << r;
      EXPECT_EQ(static_cast<int>(nvl[r].size() + rail[r].size()), waits[r]) << name(g) << ": GPU " << r;
      for (const auto* inbox : {&nvl[r], &rail[r]})
        for (const Arrived& a : *inbox)
          EXPECT_TRUE(a.used) << name(g) << ": GPU " << r << " never sums block " << a.block << " from " << a.from;
    }
  }
}

// ---- AllReduce ----

// Element e of rank r: e in the high half, bit r in the low: the sum is
// W x e in the high half and every rank's bit in the low.
std::uint64_t element(int rank, std::uint64_t e) { return (e << 32) | (std::uint64_t{1} << rank); }
std::uint64_t element_sum(std::uint64_t e, int world) { return (e * world << 32) | ((std::uint64_t{1} << world) - 1); }

struct ArResult {
  std::vector<std::vector<std::uint64_t>> data;  // [gpu][element]
  std::vector<std::uint64_t> nic_elements;       // [gpu]
  bool ok = true;
};

/// Runs the three phases with integers; `way` as ar_rail_way gives it.
ArResult all_reduce(NodeGrid g, std::uint64_t count, std::uint64_t grain, RailWay way, const std::string& what) {
  const int W = g.world(), L = g.local, Nn = g.nodes;
  ArResult res;
  res.nic_elements.assign(W, 0);
  std::vector<std::vector<std::uint64_t>> in(W, std::vector<std::uint64_t>(count));
  for (int r = 0; r < W; ++r)
    for (std::uint64_t e = 0; e < count; ++e) in[r][e] = element(r, e);
  auto slice = [&](int q, std::uint64_t& lo, std::uint64_t& hi) { ar_slice(count, L, grain, q, lo, hi); };
  auto add = [&](std::uint64_t& a, std::uint64_t b, const std::string& at) {
    const bool once = add_once(a, b);
    EXPECT_TRUE(once) << what << ": " << at;
    res.ok = res.ok && once;
  };
  // 1. ReduceScatter in the node: acc[r] = the node's sum of slice l (elements of the slice, in order).
  std::vector<std::vector<std::uint64_t>> acc(W);
  for (int r = 0; r < W; ++r) {
    std::uint64_t lo, hi;
    slice(g.local_of(r), lo, hi);
    acc[r].assign(in[r].begin() + lo, in[r].begin() + hi);
  }
  for (int turn = 1; turn < L; ++turn)
    for (int r = 0; r < W; ++r) {
      const int to = ar_node_to(g, r, turn), q = ar_rs_slice(g, r, turn);
      EXPECT_TRUE(same_node(g, r, to) && to != r) << what << ": GPU " << r << " turn " << turn;
      EXPECT_EQ(q, g.local_of(to)) << what << ": a slice goes to its owner";
      EXPECT_EQ(ar_node_from(g, to, turn), r) << what;
      std::uint64_t lo, hi;
      slice(q, lo, hi);
      for (std::uint64_t e = lo; e < hi; ++e) add(acc[to][e - lo], in[r][e], "in-node ReduceScatter");
    }
  // 2. AllReduce of each slice along its rail.
  std::vector<std::vector<std::uint64_t>> sum(W);
  if (way == RailWay::direct) {
    std::vector<std::vector<std::vector<std::uint64_t>>> got(W, std::vector<std::vector<std::uint64_t>>(Nn));
    std::vector<std::vector<int>> times(W, std::vector<int>(Nn, 0));  // [gpu][node]: slices received
    for (int r = 0; r < W; ++r) got[r][g.node_of(r)] = acc[r], times[r][g.node_of(r)] = 1;
    for (int turn = 1; turn < Nn; ++turn)
      for (int r = 0; r < W; ++r) {
        const int to = ar_direct_to(g, r, turn);
        EXPECT_TRUE(rail_link(g, r, to)) << what << ": GPU " << r << " turn " << turn;
        EXPECT_EQ(ar_direct_from(g, to, turn), r) << what;
        got[to][g.node_of(r)] = acc[r];
        ++times[to][g.node_of(r)];
        res.nic_elements[r] += acc[r].size();
      }
    for (int r = 0; r < W; ++r) {  // ascending nodes, the same on every GPU of the rail
      sum[r].assign(acc[r].size(), 0);
      for (int m = 0; m < Nn; ++m) {
        EXPECT_EQ(times[r][m], 1) << what << ": GPU " << r << " gets node " << m << "'s slice";
        if (times[r][m] != 1) res.ok = false;
        for (std::size_t e = 0; e < got[r][m].size(); ++e) add(sum[r][e], got[r][m][e], "rail sum");
      }
    }
  } else {
    const int rounds = hd_rounds(Nn);
    auto sub = [&](int r, int c, std::uint64_t& lo,
                   std::uint64_t& hi) {  // sub-chunk c of r's slice, slice-relative
      weft::schedule::split(0, acc[r].size(), grain, Nn, c, lo, hi);
    };
    auto range = [&](int r, int c_lo, int c_hi, std::uint64_t& lo, std::uint64_t& hi) {
      std::uint64_t a, b;
      sub(r, c_lo, lo, a);
      sub(r, c_hi - 1, b, hi);
    };
    sum = acc;
    for (int round = 0; round < rounds; ++round) {
      std::vector<std::vector<std::uint64_t>> before = sum;
      for (int r = 0; r < W; ++r) {
        const int n = g.node_of(r), p = hd_halving_partner(n, round, Nn), from = g.rank(p, g.local_of(r));
        EXPECT_EQ(hd_halving_partner(p, round, Nn), n) << what << ": halving round " << round;
        int k_lo, k_hi, s_lo, s_hi, h_lo, h_hi;
        hd_held(n, round + 1, Nn, k_lo,
                k_hi);                          // what r keeps, and the partner sends it
        hd_held(p, round, Nn, h_lo, h_hi);      // what the partner held
        hd_held(p, round + 1, Nn, s_lo, s_hi);  // what r sends
        EXPECT_TRUE(k_lo >= h_lo && k_hi <= h_hi) << what << ": the partner sends from what it holds";
        EXPECT_TRUE(s_hi <= k_lo || s_lo >= k_hi) << what << ": a GPU keeps and sends disjoint halves";
        std::uint64_t lo, hi, slo, shi;
        range(r, k_lo, k_hi, lo, hi);
        range(r, s_lo, s_hi, slo, shi);
        res.nic_elements[r] += shi - slo;
        for (std::uint64_t e = lo; e < hi; ++e)
          add(sum[r][e], before[from][e], "halving round " + std::to_string(round));
      }
    }
    // Sub-chunks not held are stale: clear them, so that doubling must bring each.
    for (int r = 0; r < W; ++r) {
      std::uint64_t lo, hi;
      range(r, g.node_of(r), g.node_of(r) + 1, lo, hi);
      for (std::uint64_t e = 0; e < sum[r].size(); ++e)
        if (e < lo || e >= hi) sum[r][e] = 0;
    }
    for (int round = 0; round < rounds; ++round) {
      std::vector<std::vector<std::uint64_t>> before = sum;
      for (int r = 0; r < W; ++r) {
        const int n = g.node_of(r), p = hd_doubling_partner(n, round), from = g.rank(p, g.local_of(r));
        int c_lo, c_hi, o_lo, o_hi;
        hd_held(p, rounds - round, Nn, c_lo, c_hi);
        hd_held(n, rounds - round, Nn, o_lo, o_hi);
        EXPECT_TRUE(c_hi <= o_lo || c_lo >= o_hi) << what << ": doubling brings what a GPU lacks";
        std::uint64_t lo, hi;
        range(r, c_lo, c_hi, lo, hi);
        res.nic_elements[from] += hi - lo;
        for (std::uint64_t e = lo; e < hi; ++e)
          add(sum[r][e], before[from][e], "doubling round " + std::to_string(round));
      }
    }
  }
  // 3. AllGather in the node.
  res.data.assign(W, std::vector<std::uint64_t>(count, 0));
  for (int r = 0; r < W; ++r) {
    std::uint64_t lo, hi;
    slice(g.local_of(r), lo, hi);
    for (std::uint64_t e = lo; e < hi; ++e) res.data[r][e] = sum[r][e - lo];
  }
  for (int turn = 1; turn < L; ++turn)
    for (int r = 0; r < W; ++r) {
      const int to = ar_node_to(g, r, turn);
      EXPECT_TRUE(same_node(g, r, to) && to != r) << what;
      std::uint64_t lo, hi;
      slice(g.local_of(r), lo, hi);
      for (std::uint64_t e = lo; e < hi; ++e) add(res.data[to][e], sum[r][e - lo], "in-node AllGather");
    }
  return res;
}

TEST(Hierarchy, AllReduceSumsEveryElementOnBothRailWays) {
  for (NodeGrid g : kGrids) {
    const int W = g.world();
    // An even count (every slice and sub-chunk equal) and two that leave short and empty tails.
    for (std::uint64_t grain : {std::uint64_t{1}, std::uint64_t{8}})
      for (std::uint64_t count : {std::uint64_t(W) * g.nodes * grain * 6, std::uint64_t{1001}, std::uint64_t{5}}) {
        const std::string what = name(g) + ", " + std::to_string(count) + " elements, grain " + std::to_string(grain);
        const ArResult direct = all_reduce(g, count, grain, RailWay::direct, what + ", direct");
        const RailWay way = ar_rail_way(g.nodes, RailWay::halving_doubling);
        EXPECT_EQ(way == RailWay::halving_doubling, g.nodes == 2 || g.nodes == 4 || g.nodes == 8) << what;
        const ArResult hd = all_reduce(g, count, grain, way, what + ", halving-doubling");
        ASSERT_TRUE(direct.ok && hd.ok) << what;
        for (int r = 0; r < W; ++r) {
          for (std::uint64_t e = 0; e < count; ++e) {
            ASSERT_EQ(direct.data[r][e], element_sum(e, W)) << what << ": GPU " << r << " element " << e;
            ASSERT_EQ(hd.data[r][e], direct.data[r][e]) << what << ": the rail ways differ at GPU " << r;
          }
          // The model's NIC bytes (scale_model.py, ar_weft), for an even count.
          if (count == std::uint64_t(W) * g.nodes * grain * 6) {
            const std::uint64_t slice = count / g.local;
            EXPECT_EQ(direct.nic_elements[r], (g.nodes - 1) * slice) << what << ": GPU " << r << ", direct";
            if (way == RailWay::halving_doubling) {
              EXPECT_EQ(hd.nic_elements[r], 2 * (g.nodes - 1) * slice / g.nodes) << what << ": GPU " << r;
            }
          }
        }
      }
  }
}

TEST(Hierarchy, HalvingDoublingEndsWithSubChunkNOnNodeN) {
  for (int nodes : {2, 4, 8, 16}) {
    ASSERT_TRUE(hd_applies(nodes));
    const int rounds = hd_rounds(nodes);
    EXPECT_EQ(1 << rounds, nodes);
    for (int n = 0; n < nodes; ++n) {
      int lo, hi;
      hd_held(n, 0, nodes, lo, hi);
      EXPECT_TRUE(lo == 0 && hi == nodes) << nodes << " nodes";
      hd_held(n, rounds, nodes, lo, hi);
      EXPECT_TRUE(lo == n && hi == n + 1) << nodes << " nodes, node " << n;
    }
  }
  for (int nodes : {1, 3, 5, 6, 12}) {
    EXPECT_FALSE(hd_applies(nodes)) << nodes << " nodes";
    EXPECT_EQ(ar_rail_way(nodes, RailWay::halving_doubling), RailWay::direct) << nodes << " nodes fall back";
  }
}

// ---- the collectives' kernels, step by step: launch after launch, in any interleaving ----
//
// ag_walk, rs_walk and ar_walk are the step lists the two-level kernels execute
// (src/ops/internode/). cpu/helpers/step_driver.hpp runs every GPU's list for
// several launches in random interleavings and checks the flags; the Semantics
// here move the buffers as integers: no put overwrites what its receiver has
// not read yet; every sum gets each contribution once and every GPU ends each
// launch with the whole result.

/// A partial sum of one block (or slice): which ranks' contributions it holds (up to 64 ranks).
struct Sum {
  int block = -1;
  std::uint64_t ranks = 0;
  bool operator==(const Sum& o) const { return block == o.block && ranks == o.ranks; }
  bool operator!=(const Sum& o) const { return !(*this == o); }
};
Sum one(int rank, int block) { return Sum{block, std::uint64_t{1} << rank}; }
Sum whole(int block, int world) { return Sum{block, world == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << world) - 1}; }
/// a += b, unless they are of different blocks or share a contributor.
bool add_once(Sum& a, const Sum& b) {
  if (a.block >= 0 && a.block != b.block) return false;
  if ((a.ranks & b.ranks) != 0) return false;
  a.block = b.block;
  a.ranks |= b.ranks;
  return true;
}

/// A buffer slot: what it holds (of which launch) and how many reads of it are still to come; where the
/// order of a sum matters (AllReduce's node sums), the expression that computed it: fp32 additions in
/// that order, so two GPUs whose expressions are equal hold equal bits.
struct Slot {
  int epoch = 0;
  Sum value;
  int unread = 0;
  std::string expr = {};
};
/// Writes a slot, refusing to overwrite one whose reads are still to come.
std::string write_slot(Slot& slot, int e, Sum value, int readers, const std::string& what,
                       const std::string& expr = "") {
  if (slot.unread > 0)
    return what + " still holds launch " + std::to_string(slot.epoch) + "'s data, not yet read: overwritten by launch " +
           std::to_string(e);
  slot = Slot{e, value, readers, expr};
  return "";
}
/// Reads a slot that must hold launch e's data and a read still to come.
std::string read_slot(Slot& slot, int e, Sum& value, const std::string& what, std::string* expr = nullptr) {
  if (slot.epoch != e || slot.unread == 0)
    return what + " holds launch " + std::to_string(slot.epoch) + "'s data (" + std::to_string(slot.unread) +
           " reads left), read in launch " + std::to_string(e);
  --slot.unread;
  value = slot.value;
  if (expr) *expr = slot.expr;
  return "";
}

class AllGatherSemantics final : public Semantics {
 public:
  explicit AllGatherSemantics(NodeGrid g)
      : g_(g), held_(g.world(), std::vector<int>(g.world(), 0)), writes_(g.world(), std::vector<int>(g.world(), 0)),
        epoch_(g.world(), 0) {}
  int flag_slots() const override { return ag_flag_slots(g_); }
  bool parity_flags() const override { return false; }
  std::string start(int gpu, int e) override {
    epoch_[gpu] = e;
    std::fill(writes_[gpu].begin(), writes_[gpu].end(), 0);
    held_[gpu][gpu] = e;  // the own shard, copied into the output
    return "";
  }
  std::string apply(int gpu, int e, const Step& s) override {
    if (s.act == Act::signal) return s.index == -1 && s.buffer == -1 ? "" : "a ready signal carries no data";
    if (s.act == Act::wait) {
      if (s.buffer < 0) return "";
      return held_[gpu][s.buffer] == e ? "" : "the flag announces a shard that has not landed";
    }
    if (s.act != Act::put) return "AllGather takes only signals, waits and puts";
    if (s.buffer != s.index) return "a shard goes to its own slot";
    if (!rail_link(g_, gpu, s.peer) && !same_node(g_, gpu, s.peer)) return "neither a rail nor an NVLink peer";
    if (held_[gpu][s.index] != e) return "sends a shard it does not hold yet";
    // The receiver's output is the caller's: written only while the receiver runs this launch.
    if (epoch_[s.peer] != e)
      return "writes GPU " + std::to_string(s.peer) + "'s output while it runs launch " + std::to_string(epoch_[s.peer]);
    if (++writes_[s.peer][s.index] != 1) return "shard written twice into GPU " + std::to_string(s.peer);
    held_[s.peer][s.index] = e;
    return "";
  }
  std::string finish(int gpu, int e) override {
    for (int shard = 0; shard < g_.world(); ++shard) {
      if (held_[gpu][shard] != e) return "shard " + std::to_string(shard) + " missing";
      if (shard != gpu && writes_[gpu][shard] != 1) return "shard " + std::to_string(shard) + " not written once";
    }
    return "";
  }

 private:
  NodeGrid g_;
  std::vector<std::vector<int>> held_, writes_;  // [gpu][shard]: the launch it holds; writes this launch
  std::vector<int> epoch_;
};

class ReduceScatterSemantics final : public Semantics {
 public:
  /// single_buffer: one set of flags and slots for every launch, not one per epoch parity (the
  /// unguarded schedule the kernels avoid; the driver must catch it).
  explicit ReduceScatterSemantics(NodeGrid g, bool single_buffer = false)
      : single_(single_buffer),
        g_(g),
        peer_(g.world(), std::vector<Slot>(2 * g.nodes * g.local)),
        node_(g.world(), std::vector<Slot>(2 * g.nodes)),
        send_(g.world(), std::vector<Slot>(g.nodes)),
        done_(g.world(), 0) {}
  int flag_slots() const override { return rs_slots(g_); }
  bool parity_flags() const override { return !single_; }
  std::string start(int, int) override { return ""; }
  std::string apply(int gpu, int e, const Step& s) override {
    const int NL = g_.nodes * g_.local, par = single_ ? 0 : e & 1, n = g_.node_of(gpu), l = g_.local_of(gpu);
    switch (s.act) {
      case Act::put:
        if (!same_node(g_, gpu, s.peer) || g_.local_of(s.peer) != g_.local_of(s.index))
          return "a block goes to its rail's GPU of this node";
        if (s.buffer != rs_peer_buffer(g_, g_.node_of(s.index), l) || s.flag != s.buffer) return "wrong slot";
        return write_slot(peer_[s.peer][par * NL + s.buffer], e, one(gpu, s.index), 1,
                          "GPU " + std::to_string(s.peer) + "'s peer slot " + std::to_string(s.buffer));
      case Act::wait: {
        if (s.buffer < 0 || s.buffer >= rs_slots(g_) || s.flag != s.buffer) return "wrong slot";
        const Slot& slot = s.buffer < NL ? peer_[gpu][par * NL + s.buffer] : node_[gpu][par * g_.nodes + s.buffer - NL];
        return slot.epoch == e && slot.unread == 1 ? "" : "the flag announces data that is not there";
      }
      case Act::sum_node: {
        const int b = s.index, j = g_.node_of(b);
        if (g_.local_of(b) != l) return "sums a block of another rail";
        Sum sum = one(gpu, b);
        for (int q = 0; q < g_.local; ++q) {
          if (q == l) continue;
          Sum v;
          if (auto err = read_slot(peer_[gpu][par * NL + rs_peer_buffer(g_, j, q)], e, v, "peer slot"); !err.empty())
            return err;
          if (!add_once(sum, v)) return "a contribution added twice";
        }
        if (b == gpu) return write_slot(node_[gpu][par * g_.nodes + n], e, sum, 1, "the own node sum");
        send_[gpu][j] = Slot{e, sum, 0};
        return "";
      }
      case Act::put_sum: {
        const int j = g_.node_of(s.index);
        if (s.peer != s.index || !rail_link(g_, gpu, s.peer)) return "a node sum goes over the rail to its owner";
        if (s.buffer != rs_node_buffer(g_, n) || s.flag != s.buffer) return "wrong slot";
        if (send_[gpu][j].epoch != e) return "puts a node sum not computed in this launch";
        return write_slot(node_[s.peer][par * g_.nodes + n], e, send_[gpu][j].value, 1,
                          "GPU " + std::to_string(s.peer) + "'s node slot " + std::to_string(n));
      }
      case Act::sum_final: {
        if (s.index != gpu) return "the final sum is of the own block";
        Sum sum;
        for (int m = 0; m < g_.nodes; ++m) {
          Sum v;
          if (auto err = read_slot(node_[gpu][par * g_.nodes + m], e, v, "node slot " + std::to_string(m));
              !err.empty())
            return err;
          if (!add_once(sum, v)) return "a contribution added twice";
        }
        if (sum != whole(gpu, g_.world())) return "the final sum is not the whole block's";
        done_[gpu] = e;
        return "";
      }
      default: return "ReduceScatter takes no " + act_name(s.act);
    }
  }
  std::string finish(int gpu, int e) override { return done_[gpu] == e ? "" : "no final sum"; }

 private:
  bool single_;
  NodeGrid g_;
  std::vector<std::vector<Slot>> peer_, node_, send_;  // [gpu][parity x slots] (send_: [gpu][node], single)
  std::vector<int> done_;
};

/// AllReduce, on either rail way. The node-sum slots are tracked sub-chunk by
/// sub-chunk (halving-doubling moves sub-chunks; the direct way moves all of
/// them at once), sub-chunk c of slice q as block q x nodes + c, each with its
/// expression; every GPU of a rail must end with the same expression for
/// each sub-chunk (the same bits), and under halving-doubling each sub-chunk's
/// whole sum must be formed at exactly one GPU of the rail (rail_results).
class AllReduceSemantics final : public Semantics {
 public:
  explicit AllReduceSemantics(NodeGrid g, RailWay way = RailWay::direct)
      : g_(g),
        way_(ar_rail_way(g.nodes, way)),
        peer_(g.world(), std::vector<Slot>(2 * g.local)),
        node_(g.world(), std::vector<Slot>(2 * g.nodes * g.nodes)),
        result_(g.world(), std::vector<Slot>(2)),
        have_(g.world(), std::vector<int>(g.local, 0)) {}
  int flag_slots() const override { return ar_flag_slots(g_, way_); }
  bool parity_flags() const override { return true; }
  std::string start(int, int) override { return ""; }
  std::string apply(int gpu, int e, const Step& s) override {
    const int L = g_.local, N = g_.nodes, W = g_.world(), par = e & 1, n = g_.node_of(gpu), l = g_.local_of(gpu);
    const bool hd = way_ == RailWay::halving_doubling;
    if (s.first < 0 || s.first > s.last || s.last > N) return "sub-chunks out of range";
    const bool parted = s.last > s.first;
    // The sub-chunks a step moves: [first, last), or all of them where it moves whole data.
    const int first = parted ? s.first : 0, last = parted ? s.last : N;
    // Sub-chunk c of node-sum buffer `slot` (ar_node_buffer) on GPU `at`, this launch's parity.
    auto part = [&](int at, int slot, int c) -> Slot& { return node_[at][(par * N + slot - L) * N + c]; };
    auto node_slot = [&](int at, int slot) {
      return "GPU " + std::to_string(at) + "'s node slot " + std::to_string(slot - L);
    };
    switch (s.act) {
      case Act::put:
        if (!same_node(g_, gpu, s.peer) || g_.local_of(s.peer) != s.index) return "a slice goes to its owner";
        if (s.buffer != ar_peer_buffer(g_, l) || s.flag != s.buffer) return "wrong slot";
        return write_slot(peer_[s.peer][par * L + s.buffer], e, one(gpu, s.index), 1,
                          "GPU " + std::to_string(s.peer) + "'s peer slot");
      case Act::wait: {
        if (s.flag >= L + N && s.flag < 2 * L + N) {  // a local peer's result, in its staging
          if (s.flag != ar_result_flag(g_, g_.local_of(s.peer)) || s.buffer != ar_result_buffer(g_)) return "wrong slot";
          const Slot& slot = result_[s.peer][par];
          return slot.epoch == e ? "" : "the flag announces a result that is not there";
        }
        if (s.buffer < L) {
          if (s.buffer != s.flag || parted) return "wrong slot";
          const Slot& slot = peer_[gpu][par * L + s.buffer];
          return slot.epoch == e && slot.unread == 1 ? "" : "the flag announces data that is not there";
        }
        if (s.flag >= 2 * L + N) {  // a doubling round's sub-chunks, in the own node sum
          if (!hd || !parted || s.flag != ar_doubling_flag(g_, g_.node_of(s.peer)) || s.buffer != ar_node_buffer(g_, n))
            return "wrong slot";
        } else if (s.buffer != s.flag || s.buffer >= L + N || parted != hd) {
          return "wrong slot";
        }
        for (int c = first; c < last; ++c) {
          const Slot& slot = part(gpu, s.buffer, c);
          if (slot.epoch != e || slot.unread != 1)
            return "the flag announces data that is not there (sub-chunk " + std::to_string(c) + ")";
        }
        return "";
      }
      case Act::sum_node: {
        if (s.index != l) return "sums another slice";
        Sum sum = one(gpu, l);
        for (int q = 0; q < L; ++q) {
          if (q == l) continue;
          Sum v;
          if (auto err = read_slot(peer_[gpu][par * L + q], e, v, "peer slot"); !err.empty()) return err;
          if (!add_once(sum, v)) return "a contribution added twice";
        }
        for (int c = 0; c < N; ++c)
          if (auto err = write_slot(part(gpu, L + n, c), e, Sum{l * N + c, sum.ranks}, 1, "the own node sum",
                                    "node" + std::to_string(n));
              !err.empty())
            return err;
        return "";
      }
      case Act::put_sum: {
        if (hd) return "halving-doubling puts no whole node sum";
        if (!rail_link(g_, gpu, s.peer)) return "a node sum goes over the rail";
        if (s.buffer != ar_node_buffer(g_, n) || s.flag != s.buffer || s.index != l || parted) return "wrong slot";
        for (int c = 0; c < N; ++c) {
          const Slot& own = part(gpu, L + n, c);
          if (own.epoch != e || own.unread == 0) return "puts a node sum not computed in this launch";
          if (auto err = write_slot(part(s.peer, L + n, c), e, own.value, 1, node_slot(s.peer, L + n), own.expr);
              !err.empty())
            return err;
        }
        return "";
      }
      case Act::sum_final: {
        if (hd) return "halving-doubling sums in its rounds, not at the end";
        for (int c = 0; c < N; ++c) {
          Sum sum;
          std::string expr;
          for (int m = 0; m < N; ++m) {
            Sum v;
            std::string x;
            if (auto err = read_slot(part(gpu, L + m, c), e, v, node_slot(gpu, L + m), &x); !err.empty()) return err;
            if (!add_once(sum, v)) return "a contribution added twice";
            expr = m == 0 ? x : "(" + expr + " + " + x + ")";
          }
          if (sum != whole(l * N + c, W)) return "the result is not the whole slice's sum";
          if (auto err = record(e, l, c, expr); !err.empty()) return err;
        }
        have_[gpu][l] = e;
        return write_slot(result_[gpu][par], e, whole(l, W), L - 1, "the result staging");
      }
      case Act::put_part: {
        if (!hd) return "the direct way puts no sub-chunks";
        if (!rail_link(g_, gpu, s.peer) || s.index != l || !parted) return "sub-chunks of the own slice, over the rail";
        const bool halving = s.flag == ar_node_buffer(g_, n);
        if (halving ? s.buffer != s.flag
                    : s.flag != ar_doubling_flag(g_, n) || s.buffer != ar_node_buffer(g_, g_.node_of(s.peer)))
          return "wrong slot";
        for (int c = first; c < last; ++c) {
          Slot& own = part(gpu, L + n, c);
          if (own.epoch != e || own.unread == 0)
            return "puts sub-chunk " + std::to_string(c) + ", which it does not hold in this launch";
          // Halving sends a sub-chunk away for good: its range is free for the partner's doubling put.
          if (halving) --own.unread;
          if (auto err = write_slot(part(s.peer, s.buffer, c), e, own.value, 1, node_slot(s.peer, s.buffer), own.expr);
              !err.empty())
            return err + " (sub-chunk " + std::to_string(c) + ")";
        }
        return "";
      }
      case Act::add_part: {
        if (!hd) return "the direct way adds no sub-chunks";
        const int m = s.buffer - L;
        if (s.peer != gpu || s.index != l || !parted || m < 0 || m >= N || m == n || s.flag != -1)
          return "adds a rail peer's sub-chunks of the own slice into the own node sum";
        for (int c = first; c < last; ++c) {
          Sum own, staged;
          std::string own_expr, staged_expr;
          if (auto err = read_slot(part(gpu, s.buffer, c), e, staged, node_slot(gpu, s.buffer), &staged_expr);
              !err.empty())
            return err;
          if (auto err = read_slot(part(gpu, L + n, c), e, own, "the own node sum", &own_expr); !err.empty())
            return err;
          if (!add_once(own, staged)) return "a contribution added twice";
          if (own == whole(l * N + c, W)) ++formed_[{e, l, c}];
          if (auto err = write_slot(part(gpu, L + n, c), e, own, 1, "the own node sum",
                                    "(" + own_expr + " + " + staged_expr + ")");
              !err.empty())
            return err;
        }
        return "";
      }
      case Act::round_result: {
        if (!hd) return "the direct way rounds in its final sum";
        if (s.peer != gpu || s.index != l || parted) return "rounds another slice";
        for (int c = 0; c < N; ++c) {
          Sum v;
          std::string expr;
          if (auto err = read_slot(part(gpu, L + n, c), e, v, "the own node sum", &expr); !err.empty()) return err;
          if (v != whole(l * N + c, W)) return "sub-chunk " + std::to_string(c) + " of the result is not its whole sum";
          if (auto err = record(e, l, c, expr); !err.empty()) return err;
        }
        have_[gpu][l] = e;
        return write_slot(result_[gpu][par], e, whole(l, W), L - 1, "the result staging");
      }
      case Act::signal:
        if (!same_node(g_, gpu, s.peer) || s.flag != ar_result_flag(g_, l)) return "wrong result signal";
        return "";
      case Act::get: {
        if (!same_node(g_, gpu, s.peer) || s.index != g_.local_of(s.peer)) return "fetches a slice from its non-owner";
        Sum v;
        if (auto err = read_slot(result_[s.peer][par], e, v, "GPU " + std::to_string(s.peer) + "'s result");
            !err.empty())
          return err;
        if (v != whole(s.index, g_.world())) return "fetched a wrong result";
        have_[gpu][s.index] = e;
        return "";
      }
      default: return "not an AllReduce step";
    }
  }
  std::string finish(int gpu, int e) override {
    for (int q = 0; q < g_.local; ++q)
      if (have_[gpu][q] != e) return "slice " + std::to_string(q) + " missing";
    return "";
  }
  /// After `launches` launches: "" when every GPU of each rail rounded every sub-chunk of its slice
  /// from the same expression and, under halving-doubling, each whole sum was formed at one GPU.
  std::string rail_results(int launches) const {
    for (int e = 1; e <= launches; ++e)
      for (int q = 0; q < g_.local; ++q)
        for (int c = 0; c < g_.nodes; ++c) {
          const std::string at =
              "launch " + std::to_string(e) + ", slice " + std::to_string(q) + ", sub-chunk " + std::to_string(c);
          const auto result = results_.find({e, q, c});
          if (result == results_.end() || result->second.second != g_.nodes)
            return at + ": not rounded once by every GPU of its rail";
          if (way_ != RailWay::halving_doubling) continue;
          const auto formed = formed_.find({e, q, c});
          const int places = formed == formed_.end() ? 0 : formed->second;
          if (places != 1) return at + ": its whole sum is formed at " + std::to_string(places) + " GPUs, not one";
        }
    return "";
  }

 private:
  using Key = std::tuple<int, int, int>;  // (launch, slice, sub-chunk)
  /// A rail GPU's result of a sub-chunk: the same expression as its rail's others, or what differs.
  std::string record(int e, int q, int c, const std::string& expr) {
    auto [it, first] = results_.try_emplace(Key{e, q, c}, expr, 0);
    ++it->second.second;
    if (!first && it->second.first != expr)
      return "sub-chunk " + std::to_string(c) + " is " + expr + " here, " + it->second.first +
             " on another GPU of the rail: not the same bits";
    return "";
  }

  NodeGrid g_;
  RailWay way_;
  std::vector<std::vector<Slot>> peer_, node_, result_;  // [gpu][parity x slots] (node_: x sub-chunks)
  std::vector<std::vector<int>> have_;                   // [gpu][slice]: the launch whose result it holds
  std::map<Key, std::pair<std::string, int>> results_;   // the rail's expression, and how many GPUs rounded it
  std::map<Key, int> formed_;                            // GPUs where the whole sum was formed (halving-doubling)
};

constexpr int kLaunches = 5;     // the parities wrap twice
constexpr int kInterleavings = 3;

TEST(HierarchyKernels, AllGatherStepsCompleteEveryLaunchInAnyInterleaving) {
  for (NodeGrid g : every_grid()) {
    const auto steps = step_lists(g, [](NodeGrid gg, int r, auto&& f) { ag_walk(gg, r, f); });
    for (int seed = 0; seed < kInterleavings; ++seed) {
      AllGatherSemantics sem(g);
      EXPECT_EQ(run_launches(g, steps, sem, kLaunches, 1000 * g.world() + seed), "") << name(g) << ", seed " << seed;
    }
    // What each GPU sends over its NIC: nodes-1 shards; it raises ready to the GPUs that write into it.
    for (int r = 0; r < g.world(); ++r) {
      int rail_puts = 0, pushes = 0;
      for (const Step& s : steps[r])
        if (s.act == Act::put) (rail_link(g, r, s.peer) ? rail_puts : pushes) += 1;
      EXPECT_EQ(rail_puts, g.nodes - 1) << name(g) << ": GPU " << r;
      EXPECT_EQ(pushes, g.nodes * (g.local - 1)) << name(g) << ": GPU " << r;
    }
  }
}

// With the push waits hop by hop (what AllGather+GEMM across nodes needs), the
// same checks hold, and a GPU waits for the shards in ag_arrival order: a GEMM
// walking its tiles in that order reads each shard right after its wait.
TEST(HierarchyKernels, AllGatherWithPushWaitsPerHopWaitsInArrivalOrderInAnyInterleaving) {
  for (NodeGrid g : every_grid()) {
    const auto steps =
        step_lists(g, [](NodeGrid gg, int r, auto&& f) { ag_walk(gg, r, f, AgPushWaits::per_hop); });
    for (int seed = 0; seed < kInterleavings; ++seed) {
      AllGatherSemantics sem(g);
      EXPECT_EQ(run_launches(g, steps, sem, kLaunches, 5000 * g.world() + seed), "") << name(g) << ", seed " << seed;
    }
    const auto at_end = step_lists(g, [](NodeGrid gg, int r, auto&& f) { ag_walk(gg, r, f); });
    for (int r = 0; r < g.world(); ++r) {
      std::vector<int> waited;
      for (const Step& s : steps[r])
        if (s.act == Act::wait && s.buffer >= 0) waited.push_back(s.buffer);
      ASSERT_EQ(static_cast<int>(waited.size()), g.world() - 1) << name(g) << ": GPU " << r;
      for (int i = 1; i < g.world(); ++i)
        EXPECT_EQ(waited[i - 1], ag_arrival(g, r, i)) << name(g) << ": GPU " << r << ", wait " << i;
      // The same steps as the kernel's walk, only the push waits moved.
      auto sorted = [](const std::vector<Step>& list) {
        std::vector<std::tuple<int, int, int, int, int>> v;
        for (const Step& s : list) v.emplace_back(static_cast<int>(s.act), s.peer, s.index, s.flag, s.buffer);
        std::sort(v.begin(), v.end());
        return v;
      };
      EXPECT_EQ(sorted(steps[r]), sorted(at_end[r])) << name(g) << ": GPU " << r;
    }
  }
}

TEST(HierarchyKernels, ReduceScatterStepsSumEveryBlockEveryLaunchInAnyInterleaving) {
  for (NodeGrid g : every_grid()) {
    const auto steps = step_lists(g, [](NodeGrid gg, int r, auto&& f) { rs_walk(gg, r, f); });
    for (int seed = 0; seed < kInterleavings; ++seed) {
      ReduceScatterSemantics sem(g);
      EXPECT_EQ(run_launches(g, steps, sem, kLaunches, 2000 * g.world() + seed), "") << name(g) << ", seed " << seed;
    }
    for (int r = 0; r < g.world(); ++r) {
      int rail_puts = 0;
      for (const Step& s : steps[r]) rail_puts += s.act == Act::put_sum;
      EXPECT_EQ(rail_puts, g.nodes - 1) << name(g) << ": node sums GPU " << r << " puts on its NIC";
    }
  }
}

// GEMM+ReduceScatter across nodes (docs/decisions/0075): the ReduceScatter
// kernel waits for this GPU's partial of a block right before its one read of
// it (an NVLink put, or the node sum), and the operator's GEMMs store the
// blocks in rs_block order. The kernel must read them in that same order,
// each once, or a thread block would wait on a GEMM still queued behind
// others while the block it could use sits ready.
TEST(HierarchyKernels, ReduceScatterReadsEachOwnPartialOnceInTheOrderTheGemmsStoreThem) {
  for (NodeGrid g : every_grid()) {
    for (int r = 0; r < g.world(); ++r) {
      std::vector<int> reads;
      rs_walk(g, r, [&](const Step& s) {
        if (s.act == Act::put || s.act == Act::sum_node) reads.push_back(s.index);
      });
      ASSERT_EQ(static_cast<int>(reads.size()), g.world()) << name(g) << ", GPU " << r;
      for (int t = 0; t < g.world(); ++t)
        EXPECT_EQ(reads[t], rs_block(g, r, t)) << name(g) << ", GPU " << r << ", step " << t;
      EXPECT_EQ(reads.back(), r) << name(g) << ": its own block last";
    }
  }
}

TEST(HierarchyKernels, AllReduceStepsSumEverySliceEveryLaunchInAnyInterleaving) {
  for (NodeGrid g : every_grid()) {
    const auto steps = step_lists(g, [](NodeGrid gg, int r, auto&& f) { ar_walk(gg, r, f); });
    for (int seed = 0; seed < kInterleavings; ++seed) {
      AllReduceSemantics sem(g);
      EXPECT_EQ(run_launches(g, steps, sem, kLaunches, 3000 * g.world() + seed), "") << name(g) << ", seed " << seed;
      EXPECT_EQ(sem.rail_results(kLaunches), "") << name(g) << ", seed " << seed;
    }
  }
}

// scale_model.py's ar_weft, the halving-doubling way: 2 ceil(log2 Nn) NIC latencies and
// 2 (Nn - 1) / Nn x S / L on each GPU's NIC (S / L: the rail's slice).
double model_hd_latencies(int nodes) { return 2 * std::ceil(std::log2(nodes)); }
double model_hd_nic(int nodes, double slice) { return 2.0 * (nodes - 1) / nodes * slice; }

TEST(HierarchyKernels, AllReduceHalvingDoublingStepsSumEverySubChunkOnceEveryLaunchInAnyInterleaving) {
  int grids = 0;
  for (NodeGrid g : every_grid()) {
    if (!hd_applies(g.nodes)) continue;
    ++grids;
    const int N = g.nodes;
    const auto steps =
        step_lists(g, [](NodeGrid gg, int r, auto&& f) { ar_walk(gg, r, f, RailWay::halving_doubling); });
    for (int seed = 0; seed < kInterleavings; ++seed) {
      AllReduceSemantics sem(g, RailWay::halving_doubling);
      EXPECT_EQ(run_launches(g, steps, sem, kLaunches, 4000 * g.world() + seed), "") << name(g) << ", seed " << seed;
      EXPECT_EQ(sem.rail_results(kLaunches), "") << name(g) << ", seed " << seed;
    }
    // What crosses each NIC, in elements of a slice cut as the kernels cut it (grain 8: bf16's 16
    // bytes) into equal sub-chunks; and how many NIC latencies deep the rail is: one per rail wait.
    const std::uint64_t slice = std::uint64_t(N) * 8 * 5;
    for (int r = 0; r < g.world(); ++r) {
      int sub_chunks = 0, rail_waits = 0;
      std::uint64_t elements = 0;
      for (const Step& s : steps[r]) {
        if (s.act == Act::put_part) {
          ASSERT_TRUE(rail_link(g, r, s.peer)) << name(g) << ": GPU " << r;
          std::uint64_t lo, hi;
          hd_sub_range(0, slice, 8, N, s.first, s.last, lo, hi);
          sub_chunks += s.last - s.first;
          elements += hi - lo;
        }
        if (s.act == Act::wait && rail_link(g, r, s.peer)) ++rail_waits;
        EXPECT_TRUE(s.act != Act::put_sum && s.act != Act::sum_final) << name(g) << ": a direct step";
      }
      EXPECT_EQ(sub_chunks, 2 * (N - 1)) << name(g) << ": GPU " << r;
      EXPECT_EQ(rail_waits, 2 * hd_rounds(N)) << name(g) << ": GPU " << r;
      EXPECT_EQ(rail_waits, model_hd_latencies(N)) << name(g) << ": GPU " << r;
      EXPECT_EQ(static_cast<double>(elements), model_hd_nic(N, static_cast<double>(slice))) << name(g) << ": GPU " << r;
    }
  }
  EXPECT_EQ(grids, 3 * 8) << "2, 4 and 8 nodes of 1 to 8 GPUs";
}

// The way falls back to direct where halving-doubling does not apply, step for step; and the
// sub-chunk ranges of hd_sub_range tile a slice in order.
TEST(HierarchyKernels, AllReduceHalvingDoublingFallsBackToDirectAndItsSubChunksTileTheSlice) {
  auto same = [](const Step& a, const Step& b) {
    return a.act == b.act && a.peer == b.peer && a.index == b.index && a.flag == b.flag && a.buffer == b.buffer &&
           a.first == b.first && a.last == b.last;
  };
  for (NodeGrid g : every_grid()) {
    const auto direct = step_lists(g, [](NodeGrid gg, int r, auto&& f) { ar_walk(gg, r, f); });
    const auto asked =
        step_lists(g, [](NodeGrid gg, int r, auto&& f) { ar_walk(gg, r, f, RailWay::halving_doubling); });
    EXPECT_EQ(ar_flag_slots(g, RailWay::halving_doubling), ar_flag_slots(g) + (hd_applies(g.nodes) ? g.nodes : 0))
        << name(g);
    if (hd_applies(g.nodes)) continue;
    for (int r = 0; r < g.world(); ++r) {
      ASSERT_EQ(asked[r].size(), direct[r].size()) << name(g) << ": GPU " << r;
      for (std::size_t i = 0; i < direct[r].size(); ++i)
        EXPECT_TRUE(same(asked[r][i], direct[r][i])) << name(g) << ": GPU " << r << ", step " << i;
    }
  }
  for (int nodes : {2, 4, 8})
    for (std::uint64_t begin : {std::uint64_t{0}, std::uint64_t{24}})
      for (std::uint64_t len : {std::uint64_t{0}, std::uint64_t{5}, std::uint64_t{64}, std::uint64_t{1001}}) {
        std::uint64_t at = begin;
        for (int c = 0; c < nodes; ++c) {
          std::uint64_t lo, hi;
          hd_sub_range(begin, begin + len, 8, nodes, c, c + 1, lo, hi);
          EXPECT_EQ(lo, at) << nodes << " nodes, " << len << " elements, sub-chunk " << c;
          EXPECT_LE(lo, hi);
          at = hi;
        }
        EXPECT_EQ(at, begin + len) << nodes << " nodes, " << len << " elements";
        std::uint64_t lo, hi;
        hd_sub_range(begin, begin + len, 8, nodes, 0, nodes, lo, hi);
        EXPECT_TRUE(lo == begin && hi == begin + len) << nodes << " nodes, " << len << " elements";
      }
}

// The driver itself catches what it is there to catch: a wait dropped from a
// schedule reads data that is not there; a schedule in single buffers
// overwrites what a slower receiver has not read.
TEST(HierarchyKernels, TheSimulationCatchesAMissingWaitAndAnUnguardedBuffer) {
  const NodeGrid g{2, 2};
  auto steps = step_lists(g, [](NodeGrid gg, int r, auto&& f) { rs_walk(gg, r, f); });
  auto without_first_wait = steps;
  for (auto& list : without_first_wait)
    for (auto it = list.begin(); it != list.end(); ++it)
      if (it->act == Act::wait) {
        list.erase(it);
        break;
      }
  // Caught as data read before it is there: by the wait that follows the dropped one, or by the sum.
  auto reads_early = [](const std::string& err) {
    return err.find("announces data that is not there") != std::string::npos ||
           err.find("reads left), read in launch") != std::string::npos;
  };
  bool caught = false;
  std::string last;
  for (int seed = 0; seed < 20 && !caught; ++seed) {
    ReduceScatterSemantics sem(g);
    last = run_launches(g, without_first_wait, sem, kLaunches, seed);
    caught = reads_early(last);
  }
  EXPECT_TRUE(caught) << "a ReduceScatter without its first wait passed every interleaving (or failed otherwise: "
                      << last << ")";

  // The same schedule over single buffers: a GPU a launch ahead overwrites a slot (or raises a flag)
  // its slower peer has not yet read (or waited on).
  caught = false;
  for (int seed = 0; seed < 50 && !caught; ++seed) {
    ReduceScatterSemantics sem(g, true);
    last = run_launches(g, steps, sem, kLaunches, seed);
    caught = last.find("not yet read: overwritten by launch") != std::string::npos ||
             last.find("'s epoch, not this one's") != std::string::npos;
  }
  EXPECT_TRUE(caught) << "a ReduceScatter over single buffers passed every interleaving (or failed otherwise: "
                      << last << ")";

  // AllGather without the ready handshake: a fast GPU writes a slow one's output early.
  auto no_ready = step_lists(g, [](NodeGrid gg, int r, auto&& f) { ag_walk(gg, r, f); });
  for (auto& list : no_ready)
    list.erase(std::remove_if(list.begin(), list.end(),
                              [](const Step& s) {
                                return (s.act == Act::signal || s.act == Act::wait) && s.index == -1;
                              }),
               list.end());
  caught = false;
  for (int seed = 0; seed < 50 && !caught; ++seed) {
    AllGatherSemantics sem(g);
    caught = run_launches(g, no_ready, sem, kLaunches, seed).find("output while it runs launch") != std::string::npos;
  }
  EXPECT_TRUE(caught) << "an AllGather without its ready handshake passed every interleaving";

  // Halving-doubling with its doubling rounds raising the halving flags (the same pairs, so the
  // same slots): raised twice in one launch, or a wait that passes before its data is there.
  const NodeGrid g4{4, 2};
  auto shared_flags =
      step_lists(g4, [](NodeGrid gg, int r, auto&& f) { ar_walk(gg, r, f, RailWay::halving_doubling); });
  for (int r = 0; r < g4.world(); ++r)
    for (Step& s : shared_flags[r])
      if (s.flag >= ar_doubling_flag(g4, 0)) s.flag = ar_node_buffer(g4, s.flag - ar_doubling_flag(g4, 0));
  AllReduceSemantics shared_sem(g4, RailWay::halving_doubling);
  last = run_launches(g4, shared_flags, shared_sem, kLaunches, 7);
  EXPECT_TRUE(last.find("raised twice for launch") != std::string::npos) << last;

  // ... and without the wait before its first add: the add reads a partial not there yet.
  auto no_halving_wait =
      step_lists(g4, [](NodeGrid gg, int r, auto&& f) { ar_walk(gg, r, f, RailWay::halving_doubling); });
  for (auto& list : no_halving_wait)
    for (auto it = list.begin(); it != list.end(); ++it)
      if (it->act == Act::wait && it->last > it->first) {
        list.erase(it);
        break;
      }
  caught = false;
  for (int seed = 0; seed < 50 && !caught; ++seed) {
    AllReduceSemantics sem(g4, RailWay::halving_doubling);
    last = run_launches(g4, no_halving_wait, sem, kLaunches, seed);
    caught = reads_early(last);
  }
  EXPECT_TRUE(caught) << "a halving-doubling AllReduce without its first rail wait passed every interleaving (or "
                         "failed otherwise: "
                      << last << ")";
}

TEST(HierarchyKernels, StepSlotsStayInTheirRanges) {
  for (NodeGrid g : every_grid())
    for (int r = 0; r < g.world(); ++r) {
      ag_walk(g, r, [&](const Step& s) {
        EXPECT_LT(s.flag, ag_flag_slots(g)) << name(g);
        EXPECT_LT(s.buffer, g.world()) << name(g);
      });
      rs_walk(g, r, [&](const Step& s) {
        EXPECT_LT(s.flag, rs_slots(g)) << name(g);
        EXPECT_TRUE(s.act != Act::put || s.buffer < g.nodes * g.local) << name(g);
        EXPECT_TRUE(s.act != Act::put_sum || s.buffer >= g.nodes * g.local) << name(g);
      });
      ar_walk(g, r, [&](const Step& s) {
        EXPECT_LT(s.flag, ar_flag_slots(g)) << name(g);
        EXPECT_LT(s.buffer, ar_buffer_slots(g)) << name(g);
      });
      ar_walk(
          g, r,
          [&](const Step& s) {
            EXPECT_LT(s.flag, ar_flag_slots(g, RailWay::halving_doubling)) << name(g);
            EXPECT_LT(s.buffer, ar_buffer_slots(g)) << name(g);
            EXPECT_TRUE(0 <= s.first && s.first <= s.last && s.last <= g.nodes) << name(g);
          },
          RailWay::halving_doubling);
    }
}

// ---- EP, two hops ----

TEST(Hierarchy, EpTwoHopDeliversEveryTokenRankPairOnce) {
  using weft::moe_detail::ExpertPlacement;
  using weft::moe_detail::RowError;
  using weft::moe_detail::token_destinations;
  const int k = 8, tokens = 300;
  for (NodeGrid g : kGrids)
    for (int experts : {256, 64}) {
      const int W = g.world();
      // E / W experts a rank: where W does not divide E (6 ranks), the largest E that it does.
      const ExpertPlacement place{experts - experts % W, W};
      const std::string what = name(g) + ", " + std::to_string(place.experts) + " experts";
      ASSERT_STREQ(weft::moe_detail::placement_error(place.experts, W), "") << what;
      std::mt19937_64 rng(1234 + W * 1000 + experts);
      long nic_total = 0, pairs_total = 0;
      for (int src = 0; src < W; ++src)
        for (int t = 0; t < tokens; ++t) {
          // k distinct experts, each slot -1 ("no expert") with probability 1/8; every 50th token has none.
          std::vector<std::int64_t> topk;
          std::set<int> picked;
          while (static_cast<int>(topk.size()) < k) {
            if (t % 50 == 0 || rng() % 8 == 0) {
              topk.push_back(-1);
              continue;
            }
            const int e = static_cast<int>(rng() % place.experts);
            if (picked.insert(e).second) topk.push_back(e);
          }
          int ranks[8];
          RowError error;
          const int n = token_destinations(topk.data(), k, place, ranks, error);
          ASSERT_EQ(error, RowError::none) << what;
          std::set<int> want, remote_nodes;
          for (int e : picked) want.insert(place.owner(e));
          for (int r : want)
            if (!same_node(g, r, src)) remote_nodes.insert(g.node_of(r));
          ASSERT_EQ(n, static_cast<int>(want.size())) << what;

          EpHop hops[8];
          const int h = ep_two_hop(g, src, ranks, n, hops);
          std::map<int, int> delivered,
              crossings;  // rank -> times; node -> NIC crossings
          std::set<int> hop_nodes;
          for (int i = 0; i < h; ++i) {
            const EpHop& hop = hops[i];
            EXPECT_TRUE(hop_nodes.insert(hop.node).second) << what << ": two hops to node " << hop.node;
            EXPECT_EQ(g.node_of(hop.rail_target), hop.node) << what;
            if (hop.node == g.node_of(src)) {
              EXPECT_EQ(hop.rail_target, src) << what << ": its own node over NVLink only";
            } else {
              EXPECT_TRUE(rail_link(g, src, hop.rail_target))
                  << what << ": source " << src << " to " << hop.rail_target;
              ++crossings[hop.node];
            }
            ASSERT_TRUE(hop.begin < hop.end && hop.end <= n) << what;
            for (int j = hop.begin; j < hop.end; ++j) {
              const int r = ranks[j];
              EXPECT_TRUE(same_node(g, hop.rail_target, r))
                  << what << ": NVLink from " << hop.rail_target << " to " << r;
              ++delivered[r];
            }
          }
          EXPECT_EQ(static_cast<int>(crossings.size()), static_cast<int>(remote_nodes.size())) << what;
          for (auto [node, c] : crossings) {
            EXPECT_EQ(c, 1) << what << ": token " << t << " of " << src << " crosses to node " << node << " " << c
                            << " times";
            EXPECT_TRUE(remote_nodes.count(node)) << what << ": a crossing to a node without its experts";
          }
          EXPECT_EQ(ep_nic_crossings(g, src, ranks, n), static_cast<int>(remote_nodes.size())) << what;
          for (int r = 0; r < W; ++r)
            EXPECT_EQ(delivered[r], want.count(r) ? 1 : 0) << what << ": token " << t << " of " << src << " at " << r;
          nic_total += static_cast<long>(crossings.size());
          pairs_total += n;
        }
      // The draw reaches remote nodes wherever there are some, and no token crosses more than there are.
      EXPECT_EQ(nic_total > 0, g.nodes > 1) << what;
      EXPECT_LE(nic_total, pairs_total) << what;
    }
}

}  // namespace
