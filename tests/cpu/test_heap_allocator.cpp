// The heap's bookkeeping and the cross-rank request check: the parts of the
// symmetric heap that need no GPU.
#include <gtest/gtest.h>

#include <random>

#include "weft/core/error.hpp"
#include "weft/runtime/heap.hpp"

using namespace weft;

TEST(HeapAllocator, AlignsAndFitsFirst) {
  HeapAllocator a(1 << 20, 256);
  auto x = a.allocate(1);
  auto y = a.allocate(300);
  auto z = a.allocate(256);
  ASSERT_TRUE(x && y && z);
  EXPECT_EQ(*x, 0u);
  EXPECT_EQ(*y, 256u);
  EXPECT_EQ(*z, 768u);
  EXPECT_EQ(a.block_size(*y), 512u);
  EXPECT_EQ(a.bytes_in_use(), 1024u);
  a.release(*y);
  auto w = a.allocate(200);  // first fit reuses the hole
  ASSERT_TRUE(w);
  EXPECT_EQ(*w, 256u);
}

TEST(HeapAllocator, CoalescesNeighboursAndReportsExhaustion) {
  HeapAllocator a(4096, 1024);
  auto b0 = a.allocate(1024), b1 = a.allocate(1024), b2 = a.allocate(1024), b3 = a.allocate(1024);
  ASSERT_TRUE(b0 && b1 && b2 && b3);
  EXPECT_FALSE(a.allocate(1)) << "the heap is full";
  a.release(*b1);
  a.release(*b2);
  EXPECT_EQ(a.largest_free_block(), 2048u) << "adjacent holes merge";
  EXPECT_FALSE(a.allocate(3000));
  a.release(*b0);
  a.release(*b3);
  EXPECT_EQ(a.largest_free_block(), 4096u);
  EXPECT_EQ(a.live_blocks(), 0u);
  EXPECT_TRUE(a.allocate(4096));
}

TEST(HeapAllocator, RejectsDoubleAndForeignFrees) {
  HeapAllocator a(1 << 16, 256);
  auto x = a.allocate(100);
  ASSERT_TRUE(x);
  a.release(*x);
  try {
    a.release(*x);
    FAIL() << "double free was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no live allocation starts at offset 0"), std::string::npos) << e.what();
  }
  EXPECT_THROW(a.release(12345), Error);
  EXPECT_THROW(HeapAllocator(1 << 16, 100), Error) << "alignment must be a power of two";
}

TEST(HeapAllocator, FindsTheBlockHoldingARange) {
  HeapAllocator a(1 << 16, 256);
  auto x = a.allocate(1000);  // 1024 reserved
  ASSERT_TRUE(x);
  EXPECT_TRUE(a.find_block(*x + 10, 500));
  EXPECT_TRUE(a.find_block(*x, 1024));
  EXPECT_FALSE(a.find_block(*x + 10, 1024)) << "runs past the block";
  EXPECT_FALSE(a.find_block(5000, 1));
}

TEST(HeapAllocator, IdenticalRequestsGiveIdenticalOffsetsOnEveryRank) {
  // Two ranks' allocators fed the same random sequence must agree at every step:
  // this is what makes the heap symmetric without exchanging offsets.
  HeapAllocator r0(1 << 24, 256), r1(1 << 24, 256);
  std::mt19937_64 rng(42);
  std::vector<std::uint64_t> live;
  for (int step = 0; step < 2000; ++step) {
    if (!live.empty() && rng() % 3 == 0) {
      std::size_t i = rng() % live.size();
      r0.release(live[i]);
      r1.release(live[i]);
      live.erase(live.begin() + static_cast<long>(i));
    } else {
      std::uint64_t bytes = 1 + rng() % 100000;
      auto a = r0.allocate(bytes), b = r1.allocate(bytes);
      ASSERT_EQ(a.has_value(), b.has_value());
      if (a) {
        ASSERT_EQ(*a, *b);
        live.push_back(*a);
      }
    }
  }
}

TEST(HeapRequest, RoundTripsAndMismatchNamesBothRequests) {
  HeapRequest a{3, "alloc", 1 << 20, "bf16", "ag.output"};
  HeapRequest back = HeapRequest::deserialize(a.serialize());
  EXPECT_EQ(back.sequence, 3u);
  EXPECT_EQ(back.kind, "alloc");
  EXPECT_EQ(back.bytes, 1u << 20);
  EXPECT_EQ(back.type, "bf16");
  EXPECT_EQ(back.name, "ag.output");
  EXPECT_EQ(check_same_request({a, a, a}), "");
  HeapRequest b = a;
  b.bytes = 2 << 20;
  std::string msg = check_same_request({a, a, b});
  EXPECT_NE(msg.find("rank 0 asked for an alloc of 1048576 bytes (1M) of bf16 for 'ag.output'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 2 asked for an alloc of 2097152 bytes (2M) of bf16"), std::string::npos) << msg;
  HeapRequest c = a;
  c.type = "fp32";
  EXPECT_NE(check_same_request({a, c}).find("of fp32"), std::string::npos);
  EXPECT_THROW(HeapRequest::deserialize("short"), Error);
}
