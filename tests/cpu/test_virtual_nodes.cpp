// Virtual nodes (WEFT_VIRTUAL_NODES): one machine's ranks split into nodes of
// contiguous ranks, so the inter-node paths run on one machine; and the
// refusal of operators that need every peer mapped, naming each pair without
// a direct path. Pure logic: no GPU.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "cpu/error_text.hpp"
#include "weft/core/error.hpp"
#include "weft/runtime/heap.hpp"
#include "weft/runtime/team.hpp"

using namespace weft;
using weft::test::error_of;
using weft::test::has;

namespace {

// A team as Team::discover leaves it on one machine before any split: every rank on node 0.
Team one_machine(int rank, int world) {
  Team t;
  t.rank = rank;
  t.world_size = world;
  t.local_rank = rank;
  t.local_world_size = world;
  t.node_of.assign(world, 0);
  for (int r = 0; r < world; ++r) t.local_ranks.push_back(r);
  return t;
}

// Rank r reaches rank q iff both are in the same block of `per_node` ranks (the NVSHMEM heap under virtual nodes).
Reachability blocks(int world, int per_node) {
  Reachability reach(world, std::vector<bool>(world));
  for (int a = 0; a < world; ++a)
    for (int b = 0; b < world; ++b) reach[a][b] = a / per_node == b / per_node;
  return reach;
}

}  // namespace

TEST(VirtualNodes, SplitIntoContiguousBlocks) {
  EXPECT_EQ(virtual_node_of(4, 2, 1), (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(virtual_node_of(8, 2, 1), (std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1}));
  EXPECT_EQ(virtual_node_of(8, 4, 1), (std::vector<int>{0, 0, 1, 1, 2, 2, 3, 3}));
  EXPECT_EQ(virtual_node_of(8, 8, 1), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(virtual_node_of(3, 1, 1), (std::vector<int>{0, 0, 0}));
}

TEST(VirtualNodes, RefuseACountThatDoesNotDivideTheRanksNamingTheDivisors) {
  std::string e = error_of([] { virtual_node_of(4, 3, 1); });
  EXPECT_TRUE(has(e, "WEFT_VIRTUAL_NODES=3") && has(e, "4 ranks") && has(e, "one of 1, 2, 4")) << e;
  e = error_of([] { virtual_node_of(6, 4, 1); });
  EXPECT_TRUE(has(e, "one of 1, 2, 3, 6")) << e;
  e = error_of([] { virtual_node_of(4, 8, 1); });
  EXPECT_TRUE(has(e, "WEFT_VIRTUAL_NODES=8") && has(e, "one of 1, 2, 4")) << e;
  e = error_of([] { virtual_node_of(4, 0, 1); });
  EXPECT_TRUE(has(e, "expected 1 or more")) << e;
}

TEST(VirtualNodes, RefuseAJobThatAlreadySpansMachines) {
  std::string e = error_of([] { virtual_node_of(8, 2, 2); });
  EXPECT_TRUE(has(e, "WEFT_VIRTUAL_NODES=2") && has(e, "2 machines") && has(e, "unset WEFT_VIRTUAL_NODES")) << e;
}

TEST(VirtualNodes, TheOptionOverridesTheEnvironmentAndBadValuesAreNamed) {
  EXPECT_EQ(parse_virtual_nodes(std::nullopt, {}), 1);
  EXPECT_EQ(parse_virtual_nodes(std::nullopt, {{"WEFT_VIRTUAL_NODES", ""}}), 1);
  EXPECT_EQ(parse_virtual_nodes(std::nullopt, {{"WEFT_VIRTUAL_NODES", "2"}}), 2);
  EXPECT_EQ(parse_virtual_nodes(4, {{"WEFT_VIRTUAL_NODES", "2"}}), 4);
  EXPECT_EQ(parse_virtual_nodes(1, {{"WEFT_VIRTUAL_NODES", "2"}}), 1);
  std::string e = error_of([] { parse_virtual_nodes(std::nullopt, {{"WEFT_VIRTUAL_NODES", "two"}}); });
  EXPECT_TRUE(has(e, "WEFT_VIRTUAL_NODES='two'")) << e;
  e = error_of([] { parse_virtual_nodes(std::nullopt, {{"WEFT_VIRTUAL_NODES", "0"}}); });
  EXPECT_TRUE(has(e, "WEFT_VIRTUAL_NODES=0") && has(e, "not a node count")) << e;
  e = error_of([] { parse_virtual_nodes(std::nullopt, {{"WEFT_VIRTUAL_NODES", "-2"}}); });
  EXPECT_TRUE(has(e, "WEFT_VIRTUAL_NODES=-2")) << e;
  e = error_of([] { parse_virtual_nodes(0, {}); });
  EXPECT_TRUE(has(e, "ContextOptions::virtual_nodes=0")) << e;
}

TEST(VirtualNodes, TheTeamReportsTheSplitNodes) {
  // World 8 as 2 nodes of 4: rank 5 is local rank 1 of node 1.
  Team t = one_machine(5, 8);
  split_into_virtual_nodes(t, 2);
  EXPECT_EQ(t.node_of, (std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1}));
  EXPECT_EQ(t.num_nodes, 2);
  EXPECT_EQ(t.node_id, 1);
  EXPECT_EQ(t.local_ranks, (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(t.local_rank, 1);
  EXPECT_EQ(t.local_world_size, 4);
  EXPECT_EQ(t.virtual_nodes, 2);
  EXPECT_FALSE(t.single_node());
  EXPECT_TRUE(t.single_host());
  // World 8 as 4 nodes of 2: rank 5 is local rank 1 of node 2.
  t = one_machine(5, 8);
  split_into_virtual_nodes(t, 4);
  EXPECT_EQ(t.node_id, 2);
  EXPECT_EQ(t.local_ranks, (std::vector<int>{4, 5}));
  EXPECT_EQ(t.local_rank, 1);
  EXPECT_EQ(t.local_world_size, 2);
  // World 4 as 2 nodes of 2, every rank.
  for (int r = 0; r < 4; ++r) {
    t = one_machine(r, 4);
    split_into_virtual_nodes(t, 2);
    EXPECT_EQ(t.node_id, r / 2);
    EXPECT_EQ(t.local_rank, r % 2);
    EXPECT_EQ(t.local_ranks, (std::vector<int>{r / 2 * 2, r / 2 * 2 + 1}));
  }
  // No split: the team is as it was.
  t = one_machine(3, 4);
  split_into_virtual_nodes(t, 1);
  EXPECT_EQ(t.num_nodes, 1);
  EXPECT_EQ(t.local_world_size, 4);
  EXPECT_EQ(t.local_rank, 3);
  EXPECT_TRUE(t.single_node());
  // No split asked for on a job over two machines: it keeps its real nodes.
  t = one_machine(2, 4);
  t.node_of = {0, 0, 1, 1};
  t.num_nodes = t.hosts = 2;
  t.node_id = 1;
  t.local_ranks = {2, 3};
  t.local_rank = 0;
  t.local_world_size = 2;
  split_into_virtual_nodes(t, 1);
  EXPECT_EQ(t.node_of, (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(t.num_nodes, 2);
  EXPECT_EQ(t.node_id, 1);
  EXPECT_EQ(t.local_ranks, (std::vector<int>{2, 3}));
  EXPECT_EQ(t.local_rank, 0);
  EXPECT_EQ(t.local_world_size, 2);
  EXPECT_FALSE(t.single_node());
  // A refused split leaves an error naming the setting.
  t = one_machine(0, 6);
  std::string e = error_of([&] { split_into_virtual_nodes(t, 4); });
  EXPECT_TRUE(has(e, "WEFT_VIRTUAL_NODES=4") && has(e, "6 ranks")) << e;
}

TEST(VirtualNodes, LinksNameTheVirtualNodeAndThePhysicalLinkBeneath) {
  PeerLink l;
  l.same_host = true;
  l.same_node = false;
  l.same_gpu = true;
  EXPECT_EQ(l.describe(), "other virtual node (same GPU)");
  l.same_gpu = false;
  l.nvlinks = 18;
  EXPECT_EQ(l.describe(), "other virtual node (NV18)");
  l.same_node = true;
  EXPECT_EQ(l.describe(), "NV18");
  l.same_host = false;
  l.same_node = false;
  EXPECT_EQ(l.describe(), "other node");
}

TEST(VirtualNodes, NeedTheNvshmemHeap) {
  EXPECT_EQ(choose_heap_backend(HeapBackend::automatic, 2, true, 2), HeapBackend::nvshmem);
  EXPECT_EQ(choose_heap_backend(HeapBackend::nvshmem, 4, true, 4), HeapBackend::nvshmem);
  // The native heap maps every peer: it cannot serve virtual nodes.
  std::string e = error_of([] { choose_heap_backend(HeapBackend::native, 2, true, 2); });
  EXPECT_TRUE(has(e, "WEFT_VIRTUAL_NODES=2") && has(e, "WEFT_HEAP_BACKEND=native") &&
              has(e, "WEFT_HEAP_BACKEND=nvshmem"))
      << e;
  EXPECT_FALSE(has(e, "-DWEFT_NVSHMEM")) << e;
  e = error_of([] { choose_heap_backend(HeapBackend::native, 2, false, 2); });
  EXPECT_TRUE(has(e, "WEFT_VIRTUAL_NODES=2") && has(e, "-DWEFT_NVSHMEM=ON")) << e;
  // A build without NVSHMEM: the setting is named with how to build it.
  for (HeapBackend b : {HeapBackend::automatic, HeapBackend::nvshmem}) {
    e = error_of([b] { choose_heap_backend(b, 2, false, 2); });
    EXPECT_TRUE(has(e, "WEFT_VIRTUAL_NODES=2") && has(e, "built without NVSHMEM") && has(e, "-DWEFT_NVSHMEM=ON"))
        << e;
  }
}

TEST(DirectPeers, EveryPairWithoutAnAddressIsNamed) {
  EXPECT_EQ(unreachable_pairs(blocks(4, 4)), "");
  EXPECT_EQ(unreachable_pairs(blocks(4, 2)),
            "rank 0 cannot address rank(s) 2, 3\nrank 1 cannot address rank(s) 2, 3\n"
            "rank 2 cannot address rank(s) 0, 1\nrank 3 cannot address rank(s) 0, 1");
  Reachability one_way = blocks(3, 3);
  one_way[2][0] = false;
  EXPECT_EQ(unreachable_pairs(one_way), "rank 2 cannot address rank(s) 0");
}

TEST(DirectPeers, OperatorsThatLoadAndStorePeersRefuseUnmappedOnes) {
  EXPECT_EQ(error_of([] { require_direct_peers("AllGather", blocks(8, 8), HeapBackend::nvshmem); }), "");
  EXPECT_EQ(error_of([] { require_direct_peers("AllGather", blocks(1, 1), HeapBackend::native); }), "");
  std::string e = error_of([] { require_direct_peers("AllReduce", blocks(8, 2), HeapBackend::nvshmem); });
  EXPECT_TRUE(has(e, "AllReduce reaches every peer by load and store")) << e;
  EXPECT_TRUE(has(e, "nvshmem heap")) << e;
  EXPECT_TRUE(has(e, "\n  rank 0 cannot address rank(s) 2, 3, 4, 5, 6, 7\n")) << e;
  EXPECT_TRUE(has(e, "\n  rank 7 cannot address rank(s) 0, 1, 2, 3, 4, 5\n")) << e;
  EXPECT_TRUE(has(e, "weft/device/remote.cuh") && has(e, "WEFT_VIRTUAL_NODES")) << e;
}
