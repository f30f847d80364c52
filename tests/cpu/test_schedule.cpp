// The collectives' index maps at world sizes 1 to 8, on the CPU: every byte
// copied once, every ring step consistent with its neighbour's, every flag
// index inside its allocation. (The kernels call these same functions.)
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <utility>
#include <vector>

#include "gemm/row_bands.hpp"
#include "ops/schedule.hpp"

using namespace weft::schedule;

TEST(Schedule, SplitTilesTheRangeInOrderWithAlignedStarts) {
  for (std::uint64_t grain : {1u, 4u, 8u, 16u})
    for (std::uint64_t n : {1ull, 7ull, 16ull, 1000ull, 4099ull, 1ull << 20})
      for (std::uint64_t parts = 1; parts <= 70; parts += (parts < 10 ? 1 : 13)) {
        std::uint64_t expect = 5;  // the range starts at 5: parts start at 5 + k x per
        for (std::uint64_t i = 0; i < parts; ++i) {
          std::uint64_t lo, hi;
          split(5, 5 + n, grain, parts, i, lo, hi);
          ASSERT_EQ(lo, expect) << "grain " << grain << " n " << n << " parts " << parts << " part " << i;
          ASSERT_LE(lo, hi);
          if (hi > lo && hi < 5 + n) {
            EXPECT_EQ((hi - 5) % grain, 0u) << "interior cuts fall on the grain";
          }
          expect = hi;
        }
        EXPECT_EQ(expect, 5 + n) << "the parts cover the whole range";
      }
}

TEST(Schedule, SlicesCoverEveryElementOnce) {
  for (int world = 1; world <= 8; ++world)
    for (std::uint64_t count : {1ull, 7ull, 1000ull, 4099ull, 524293ull}) {
      const std::uint64_t slice = slice_size(count, world, 8);
      EXPECT_EQ(slice % 8, 0u);
      std::uint64_t covered = 0;
      for (int q = 0; q < world; ++q) {
        std::uint64_t b = std::min(count, q * slice), e = std::min(count, (q + 1) * slice);
        covered += e - b;
      }
      EXPECT_EQ(covered, count) << "world " << world << " count " << count;
    }
}

TEST(Schedule, RingReduceScatterVisitsEveryRankOnceAndEndsAtTheOwner) {
  for (int world = 1; world <= 8; ++world) {
    for (int r = 0; r < world; ++r) {
      const int prev = wrap(r - 1, world);
      // What I send at step s + 1 is what I received at step s (plus my part).
      for (int s = 1; s + 1 < world; ++s)
        EXPECT_EQ(ring_reduce_scatter_slice(prev, s, world), ring_reduce_scatter_slice(r, s + 1, world));
      // The last partial I receive is my own slice.
      if (world > 1) {
        EXPECT_EQ(ring_reduce_scatter_slice(prev, world - 1, world), r);
      }
    }
    // Every slice's partial passes through every rank but its owner once, then the owner.
    for (int c = 0; c < world; ++c) {
      std::set<int> senders;
      for (int s = 1; s < world; ++s)
        for (int r = 0; r < world; ++r)
          if (ring_reduce_scatter_slice(r, s, world) == c) senders.insert(r);
      EXPECT_EQ(static_cast<int>(senders.size()), world - 1);
      EXPECT_EQ(senders.count(c), 0u) << "the owner adds last and sends nothing";
    }
  }
}

TEST(Schedule, RingAllGatherDeliversEveryShardOnce) {
  for (int world = 1; world <= 8; ++world)
    for (int r = 0; r < world; ++r) {
      const int prev = wrap(r - 1, world);
      EXPECT_EQ(ring_all_gather_shard(r, 1, world), r) << "step 1 sends my own shard";
      std::multiset<int> received;
      for (int s = 1; s < world; ++s) {
        received.insert(ring_all_gather_shard(prev, s, world));
        if (s + 1 < world) {  // I forward at s + 1 what arrived at s
          EXPECT_EQ(ring_all_gather_shard(prev, s, world), ring_all_gather_shard(r, s + 1, world));
        }
      }
      EXPECT_EQ(static_cast<int>(received.size()), world - 1);
      for (int q = 0; q < world; ++q) EXPECT_EQ(received.count(q), q == r ? 0u : 1u) << "world " << world;
    }
}

TEST(Schedule, FlagIndicesStayInsideTheirAllocations) {
  for (int world = 1; world <= 8; ++world)
    for (int blocks : {1, 2, 7, 32, 66}) {
      const std::uint64_t one_shot = all_reduce_one_shot_flags(world, blocks);
      std::set<std::uint64_t> seen;
      for (int parity = 0; parity < 2; ++parity)
        for (int q = 0; q < world; ++q)
          for (int b = 0; b < blocks; ++b) {
            auto i = all_reduce_one_shot_flag(parity, q, b, world, blocks);
            EXPECT_LT(i, one_shot);
            EXPECT_TRUE(seen.insert(i).second) << "two (parity, sender, block) share a flag";
          }
      const std::uint64_t ring = reduce_scatter_ring_flags(world, blocks);
      seen.clear();
      for (int parity = 0; parity < 2; ++parity)
        for (int s = 1; s < world; ++s)
          for (int b = 0; b < blocks; ++b) {
            auto i = reduce_scatter_ring_flag(parity, s, b, world, blocks);
            EXPECT_LT(i, ring);
            EXPECT_TRUE(seen.insert(i).second);
          }
      // AllGather ring: arrived steps start after ready[W] and arrived[W].
      const std::uint64_t ag = all_gather_flags(world, blocks);
      if (world > 1) {  // the last ring flag is the allocation's last
        EXPECT_EQ(2 * static_cast<std::uint64_t>(world) + (world - 2) * blocks + blocks - 1, ag - 1);
      }
    }
}

// ---- the overlapped operators' maps (AgGemm, GemmRs, GemmAr), world sizes 1 to 8 ----

TEST(Schedule, EvenChunksDivideTheRowsAndStayWithinTheRequest) {
  for (std::int64_t rows : {1, 7, 125, 500, 1024, 4096, 4099})
    for (std::int64_t want : {1, 2, 4, 8, 16}) {
      const std::int64_t c = even_chunks(rows, want);
      EXPECT_GE(c, 1);
      EXPECT_LE(c, want);
      EXPECT_EQ(rows % c, 0) << rows << " rows, " << want << " wanted";
      for (std::int64_t larger = c + 1; larger <= std::min(want, rows); ++larger)
        EXPECT_NE(rows % larger, 0) << "a larger divisor within the request exists: " << larger;
    }
}

TEST(Schedule, ShardPushesReachEveryPeerOnceInTheOrderTheyNeedThem) {
  for (int world = 1; world <= 8; ++world)
    for (int rank = 0; rank < world; ++rank) {
      std::set<int> peers;
      for (int turn = 1; turn < world; ++turn) {
        const int peer = shard_push_peer(rank, turn, world);
        EXPECT_NE(peer, rank);
        peers.insert(peer);
        // Peer p's GEMM walks shards p, p+1, ...: ours is its turn-th remote shard.
        EXPECT_EQ(wrap(rank - peer, world), turn) << "world " << world << " rank " << rank;
      }
      EXPECT_EQ(peers.size(), static_cast<std::size_t>(world - 1));
    }
}

TEST(Schedule, RingGemmBlocksAccumulateAlongTheRingAndEndAtTheirOwner) {
  for (int world = 1; world <= 8; ++world) {
    for (int step = 0; step < world; ++step) {
      std::set<int> blocks;  // at every step the ranks work on distinct blocks
      for (int rank = 0; rank < world; ++rank) {
        const int b = ring_gemm_block(rank, step, world);
        ASSERT_GE(b, 0);
        ASSERT_LT(b, world);
        blocks.insert(b);
        // The partial sum added at this step is the one rank - 1 computed a step earlier.
        if (step > 0) {
          EXPECT_EQ(b, ring_gemm_block(wrap(rank - 1, world), step - 1, world));
        }
      }
      EXPECT_EQ(blocks.size(), static_cast<std::size_t>(world));
    }
    for (int rank = 0; rank < world; ++rank) {
      EXPECT_EQ(ring_gemm_block(rank, world - 1, world), rank) << "the last step is the rank's own block";
      std::set<int> seen;  // each rank computes every block exactly once
      for (int step = 0; step < world; ++step) seen.insert(ring_gemm_block(rank, step, world));
      EXPECT_EQ(seen.size(), static_cast<std::size_t>(world));
    }
  }
}

TEST(Schedule, CopyChunksDivideTheRowsAndStayAboveTheMinimum) {
  for (std::int64_t rows : {1, 500, 1024, 2048, 4096, 4097})
    for (std::int64_t row_bytes : {2048, 16384, 57344})
      for (std::int64_t want : {1, 4, 8, 16}) {
        const std::int64_t c = copy_chunks(rows, row_bytes, want);
        EXPECT_GE(c, 1);
        EXPECT_LE(c, want);
        EXPECT_EQ(rows % c, 0);
        if (c > 1) {
          EXPECT_GE(rows / c * row_bytes, kMinChunkBytes) << rows << " rows of " << row_bytes << " B";
        }
      }
  EXPECT_EQ(copy_chunks(4096, 16384, 8), 4);  // a 64 MB block: four 16 MB chunks
  EXPECT_EQ(copy_chunks(1024, 16384, 8), 1);  // 16 MB: one
}

TEST(RowBands, OnlyTheWarpThatIssuesTheTmaStoresReports) {
  // CUTLASS's sm90 epilogue issues a tile's TMA stores from the threads whose
  // MMA index (threadIdx.x % MMA threads) is in warp 0; a report waits for
  // those stores' bulk groups, which only the issuing warp's lanes hold.
  // Cooperative: one load warpgroup, two consumer warpgroups of 256 MMA
  // threads; pingpong: each consumer warpgroup its own 128.
  struct Kernel {
    const char* name;
    int mma_threads;
    std::vector<int> store_warps;
  };
  for (const Kernel& k : {Kernel{"cooperative", 256, {8}}, Kernel{"pingpong", 128, {4, 8}}}) {
    std::vector<int> issuing;
    for (int thread = 128; thread < 128 + 256; ++thread)
      if ((thread % k.mma_threads) / 32 == 0 && (issuing.empty() || issuing.back() != thread / 32))
        issuing.push_back(thread / 32);
    EXPECT_EQ(issuing, k.store_warps) << k.name;
    std::vector<int> reporting;
    for (int warp = 0; warp < 12; ++warp)
      if (weft::gemm_detail::issues_tma_stores(warp, 128, k.mma_threads)) reporting.push_back(warp);
    EXPECT_EQ(reporting, k.store_warps) << k.name << ": the warps that report";
    EXPECT_EQ(weft::gemm_detail::first_tma_store_warp(128, k.mma_threads), k.store_warps.front()) << k.name;
  }
}

TEST(RowBands, EveryBandCountsExactlyItsElementsWhateverTheTiles) {
  // The hooked GEMM's stored-row reports: each tile adds its share to every
  // band it touches; the copy engine waits for band_stored_value.
  for (std::int64_t m : {1000, 1024, 2048, 4096, 4100})
    for (std::int64_t n : {4096, 8200})
      for (auto [tile_m, tile_n] : {std::pair<int, int>{128, 256}, {256, 128}, {64, 256}})
        for (std::int64_t per : {m, m / 8, std::int64_t{100}, std::int64_t{128}, std::int64_t{1}}) {
          const std::int64_t bands = (m + per - 1) / per;
          std::vector<std::uint64_t> counter(bands + 1, 0);  // one past the end: must stay 0
          const std::int64_t tiles_m = (m + tile_m - 1) / tile_m + 1;  // + a padding tile past M (clusters)
          for (std::int64_t tm = 0; tm < tiles_m; ++tm)
            for (std::int64_t col0 = 0; col0 < n; col0 += tile_n) {
              const std::int64_t row0 = tm * tile_m, row1 = std::min(row0 + tile_m, m);
              const std::int64_t cols = std::min<std::int64_t>(tile_n, n - col0);
              if (row0 >= row1) continue;  // as the kernel: a tile past M stores nothing
              for (std::int64_t b = row0 / per; b * per < row1; ++b)
                counter[b] += static_cast<std::uint64_t>(weft::gemm_detail::rows_in_band(row0, row1, b, per) * cols);
            }
          std::uint64_t total = 0;
          for (std::int64_t b = 0; b < bands; ++b) {
            ASSERT_EQ(counter[b], weft::gemm_detail::band_stored_value(b, per, m, n))
                << "M " << m << " N " << n << " tile " << tile_m << "x" << tile_n << " band " << b << " of " << per;
            total += counter[b];
          }
          EXPECT_EQ(counter[bands], 0u);
          EXPECT_EQ(total, static_cast<std::uint64_t>(m * n));
        }
}
