// AllGather plans on the GPU: every variant bitwise against each rank's own
// input (rebuilt from its seed) and, where the job has NCCL, against NCCL's;
// back to back with fresh data, in place, in a CUDA graph, and the errors for
// buffers that are not symmetric.
#include <nccl.h>

#include "gpu_check.hpp"
#include "gpu_test.hpp"
#include "weft/core/error.hpp"
#include "weft/ops/all_gather.hpp"

using namespace weft;
using weft::test::ctx;

namespace {

constexpr AllGatherVariant kVariants[] = {AllGatherVariant::push, AllGatherVariant::pull,
                                          AllGatherVariant::copy_engine, AllGatherVariant::low_latency,
                                          AllGatherVariant::automatic};
bool fits(AllGatherVariant v, std::uint64_t bytes) {
  return v != AllGatherVariant::low_latency || bytes <= kAllGatherLowLatencyMaxBytes;
}

// Fills the input with fresh data, poisons both outputs, runs weft and (where
// the job has it) NCCL, and returns the number of wrong bytes (against the
// seeds, and against NCCL).
std::uint64_t gather_and_check(AllGather& plan, char* input, char* output, char* nccl_out, bool in_place) {
  const std::uint64_t bytes = plan.bytes_per_rank();
  const int world = ctx().world_size();
  cudaStream_t s = test::stream();
  std::uint64_t seed = bench::fresh_seed(ctx().rank(), bytes);
  auto seeds = test::gather(std::to_string(seed));
  char* in = in_place ? output + ctx().rank() * bytes : input;
  bench::poison(output, bytes * world, 0xA5, s);
  bench::poison(nccl_out, bytes * world, 0x5A, s);
  bench::fill_random(in, bytes, seed, s);
  plan.run(in, output, s);
  std::uint64_t bad = 0;
  if (ctx().has_nccl()) {
    WEFT_NCCL(ncclAllGather(in, nccl_out, bytes, ncclUint8, ctx().nccl(), s));
    ctx().synchronize(s);
    bad += bench::count_mismatches(output, nccl_out, bytes * world, s);
  }
  for (int p = 0; p < world; ++p)
    bad += bench::count_mismatches_random(output + p * bytes, bytes, std::stoull(seeds[p]), s);
  return bad;
}

struct Buffers {
  SymmetricBuffer input, output;
  char* nccl_out = nullptr;
  explicit Buffers(std::uint64_t bytes)
      : input(ctx().heap(), bytes, "bytes", "test.ag.input"),
        output(ctx().heap(), bytes * ctx().world_size(), "bytes", "test.ag.output") {
    WEFT_CUDA(cudaMalloc(&nccl_out, bytes * ctx().world_size()));
  }
  ~Buffers() { cudaFree(nccl_out); }
};

}  // namespace

TEST(AllGather, EveryVariantGathersEveryRanksBytesBitwise) {
  for (std::uint64_t bytes : {std::uint64_t{2}, std::uint64_t{1002}, std::uint64_t{4096}, std::uint64_t{(1u << 20) + 6},
                              std::uint64_t{16u << 20}}) {
    Buffers b(bytes);
    for (AllGatherVariant v : kVariants) {
      if (!fits(v, bytes)) continue;
      AllGather plan(test::ctx_ptr(), {bytes, v, 0});
      EXPECT_EQ(gather_and_check(plan, b.input.as<char>(), b.output.as<char>(), b.nccl_out, false), 0u)
          << to_string(v) << " at " << bytes << " bytes";
      EXPECT_EQ(gather_and_check(plan, b.input.as<char>(), b.output.as<char>(), b.nccl_out, true), 0u)
          << to_string(v) << " in place at " << bytes << " bytes";
    }
  }
}

TEST(AllGather, BackToBackRunsWithFreshDataNeedNoReset) {
  const std::uint64_t bytes = 256u << 10;
  Buffers b(bytes);
  for (AllGatherVariant v : kVariants) {
    AllGather plan(test::ctx_ptr(), {bytes, v, 3});
    std::uint64_t bad = 0;
    for (int i = 0; i < 30; ++i) bad += gather_and_check(plan, b.input.as<char>(), b.output.as<char>(), b.nccl_out, false);
    EXPECT_EQ(bad, 0u) << to_string(v);
  }
}

TEST(AllGather, HundredsOfRunsWithoutHostSyncStayCorrect) {
  // Fill, gather, verify - all enqueued, no host synchronisation in between: a
  // missing handshake or a reused LL buffer shows up as wrong bytes here.
  const int world = ctx().world_size(), runs = 300;
  for (std::uint64_t bytes : {std::uint64_t{4096}, std::uint64_t{200u << 10}}) {
    Buffers b(bytes);
    unsigned long long* bad = nullptr;
    WEFT_CUDA(cudaMalloc(&bad, sizeof(*bad)));
    for (AllGatherVariant v : kVariants) {
      if (!fits(v, bytes)) continue;
      AllGather plan(test::ctx_ptr(), {bytes, v, 0});
      const std::uint64_t base = std::stoull(test::gather(std::to_string(bench::fresh_seed(0, bytes)))[0]);
      auto seed_of = [&](int run, int rank) { return base * 1000003 + run * 131 + rank; };
      WEFT_CUDA(cudaMemsetAsync(bad, 0, sizeof(*bad), test::stream()));
      for (int i = 0; i < runs; ++i) {
        bench::fill_random(b.input.get(), bytes, seed_of(i, ctx().rank()), test::stream());
        plan.run(b.input.get(), b.output.get(), test::stream());
        for (int p = 0; p < world; ++p)
          bench::accumulate_mismatches_random(b.output.as<char>() + p * bytes, bytes, seed_of(i, p), bad,
                                              test::stream());
      }
      ctx().synchronize(test::stream());
      unsigned long long h = 0;
      WEFT_CUDA(cudaMemcpy(&h, bad, sizeof(h), cudaMemcpyDeviceToHost));
      EXPECT_EQ(h, 0u) << to_string(v) << " at " << bytes << " bytes, " << runs << " runs";
      ctx().host_barrier("no-sync runs checked");
    }
    WEFT_CUDA(cudaFree(bad));
  }
}

TEST(AllGather, GraphReplayMatchesEager) {
  const std::uint64_t bytes = 64u << 10;
  const int world = ctx().world_size();
  Buffers b(bytes);
  for (AllGatherVariant v : {AllGatherVariant::push, AllGatherVariant::pull, AllGatherVariant::low_latency,
                             AllGatherVariant::ring, AllGatherVariant::copy_engine}) {
    AllGather plan(test::ctx_ptr(), {bytes, v, 0});
    cudaStream_t s = test::stream();
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    WEFT_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    plan.run(b.input.get(), b.output.get(), s);
    WEFT_CUDA(cudaStreamEndCapture(s, &graph));
    WEFT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    std::uint64_t bad = 0;
    for (int i = 0; i < 50; ++i) {
      std::uint64_t seed = bench::fresh_seed(ctx().rank(), i);
      auto seeds = test::gather(std::to_string(seed));
      bench::fill_random(b.input.get(), bytes, seed, s);
      bench::poison(b.output.get(), bytes * world, 0xA5, s);
      WEFT_CUDA(cudaGraphLaunch(exec, s));
      ctx().synchronize(s);
      for (int p = 0; p < world; ++p)
        bad += bench::count_mismatches_random(b.output.as<char>() + p * bytes, bytes, std::stoull(seeds[p]), s);
      ctx().host_barrier("graph replay checked");  // the next poison must not hit a peer still reading
    }
    EXPECT_EQ(bad, 0u) << to_string(v);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
}

TEST(AllGather, RejectsBuffersOutsideTheHeapNamingTheRequirement) {
  const std::uint64_t bytes = 4096;
  Buffers b(bytes);
  char* plain = nullptr;
  WEFT_CUDA(cudaMalloc(&plain, bytes * ctx().world_size()));
  AllGather push(test::ctx_ptr(), {bytes, AllGatherVariant::push, 0});
  AllGather pull(test::ctx_ptr(), {bytes, AllGatherVariant::pull, 0});
  std::string push_error, pull_error, options_error, ll_error;
  try {
    AllGather too_big(test::ctx_ptr(), {2 * kAllGatherLowLatencyMaxBytes, AllGatherVariant::low_latency, 0});
  } catch (const Error& e) {
    ll_error = e.what();
  }
  EXPECT_NE(ll_error.find("exceeds the low-latency limit"), std::string::npos) << ll_error;
  try {
    push.run(b.input.get(), plain, test::stream());
  } catch (const Error& e) {
    push_error = e.what();
  }
  try {
    pull.run(plain, b.output.get(), test::stream());
  } catch (const Error& e) {
    pull_error = e.what();
  }
  try {
    AllGather bad(test::ctx_ptr(), {0, AllGatherVariant::push, 0});
  } catch (const Error& e) {
    options_error = e.what();
  }
  EXPECT_NE(push_error.find("output"), std::string::npos) << push_error;
  EXPECT_NE(push_error.find("symmetric"), std::string::npos) << push_error;
  EXPECT_NE(pull_error.find("input"), std::string::npos) << pull_error;
  EXPECT_NE(options_error.find("bytes_per_rank must be positive"), std::string::npos) << options_error;
  WEFT_CUDA(cudaFree(plain));
}
