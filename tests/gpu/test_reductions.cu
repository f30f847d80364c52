// AllReduce and ReduceScatter on the GPU: every variant and element type
// against a float64 reference, bitwise agreement between variants (one fixed
// summation order), in place, 1,000 repeated calls, 10,000 CUDA-graph replays,
// and the errors for bad plans and buffers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "gpu_check.hpp"
#include "gpu_test.hpp"
#include "weft/core/error.hpp"
#include "weft/ops/all_gather.hpp"
#include "weft/ops/all_reduce.hpp"
#include "weft/ops/reduce_scatter.hpp"

using namespace weft;
using weft::test::ctx;

namespace {

constexpr DType kTypes[] = {DType::bf16, DType::fp16, DType::fp32};
constexpr AllReduceVariant kArVariants[] = {AllReduceVariant::low_latency, AllReduceVariant::one_shot,
                                            AllReduceVariant::two_shot, AllReduceVariant::copy_engine,
                                            AllReduceVariant::automatic};
constexpr ReduceScatterVariant kRsVariants[] = {ReduceScatterVariant::low_latency, ReduceScatterVariant::mesh,
                                                ReduceScatterVariant::ring, ReduceScatterVariant::copy_engine,
                                                ReduceScatterVariant::automatic};

double to_double(const unsigned char* p, DType t) {
  if (t == DType::fp32) return *reinterpret_cast<const float*>(p);
  if (t == DType::bf16) return __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(p));
  return __half2float(*reinterpret_cast<const __half*>(p));
}

// What relative_error_vs_float64 divides by: the sums (a result rounded
// once), or the summands' magnitudes (a result rounded at every step of a
// ring, whose error grows with its partial sums, not with the final sum,
// which cancellation can make arbitrarily small).
enum class Scale { sum, summands };

// ||out - ref|| / ||ref||, with ref[i] = sum over ranks q of uniform(seed_q, offset + i) in float64
// (Scale::summands: / ||sum over q of |uniform(seed_q, offset + i)| ||).
double relative_error_vs_float64(const void* device_out, std::uint64_t count, DType t,
                                 const std::vector<std::uint64_t>& seeds, std::uint64_t offset,
                                 Scale scale = Scale::sum) {
  const std::size_t size = dtype_size(t);
  std::vector<unsigned char> host(count * size);
  WEFT_CUDA(cudaMemcpy(host.data(), device_out, host.size(), cudaMemcpyDeviceToHost));
  double diff2 = 0, ref2 = 0;
  for (std::uint64_t i = 0; i < count; ++i) {
    double ref = 0, magnitude = 0;
    for (std::uint64_t s : seeds) {
      const double v = bench::uniform_value(to_string(t), s, offset + i);
      ref += v;
      magnitude += std::abs(v);
    }
    double d = to_double(&host[i * size], t) - ref;
    if (!std::isfinite(d)) return INFINITY;
    diff2 += d * d;
    ref2 += scale == Scale::sum ? ref * ref : magnitude * magnitude;
  }
  // Random values can sum to exactly zero (two ranks, one bf16 element each:
  // b = -a happened once); then only an exact result passes.
  if (ref2 == 0) return diff2 == 0 ? 0.0 : INFINITY;
  return std::sqrt(diff2 / ref2);
}

// Elements whose bits differ from the rank-order reference: fp32 sums of the
// ranks' values in order 0..W-1, rounded once to the type - what every weft
// variant promises (the ring's per-step rounding excepted).
std::uint64_t bitwise_vs_rank_order(const void* device_out, std::uint64_t count, DType t,
                                    const std::vector<std::uint64_t>& seeds, std::uint64_t offset) {
  const std::size_t size = dtype_size(t);
  std::vector<unsigned char> host(count * size);
  WEFT_CUDA(cudaMemcpy(host.data(), device_out, host.size(), cudaMemcpyDeviceToHost));
  std::uint64_t bad = 0;
  for (std::uint64_t i = 0; i < count; ++i) {
    float acc = static_cast<float>(bench::uniform_value(to_string(t), seeds[0], offset + i));
    for (std::size_t q = 1; q < seeds.size(); ++q)
      acc += static_cast<float>(bench::uniform_value(to_string(t), seeds[q], offset + i));
    unsigned char want[4];
    if (t == DType::fp32) std::memcpy(want, &acc, 4);
    else if (t == DType::bf16) {
      __nv_bfloat16 r = __float2bfloat16_rn(acc);
      std::memcpy(want, &r, 2);
    } else {
      __half r = __float2half_rn(acc);
      std::memcpy(want, &r, 2);
    }
    bad += std::memcmp(want, &host[i * size], size) != 0;
  }
  return bad;
}

double tolerance(DType t) { return t == DType::fp32 ? 1e-6 : 1e-2; }
// The ring rounds its partial sum at each of its W - 1 steps where the other
// variants round the whole sum once: each rounding errs by at most the unit
// roundoff times a partial sum, itself at most the summands' magnitudes, so
// its error is measured against those (Scale::summands) and its bound grows
// with the steps. Measured against the sum instead, one bf16 element at 8
// ranks whose summands nearly cancelled erred by 1.23e-2 once and 9.1e-2
// another time.
double ring_tolerance(DType t, int world) { return tolerance(t) * std::max(1, world - 1); }

std::vector<std::uint64_t> gathered_seeds(std::uint64_t salt) {
  std::vector<std::uint64_t> seeds;
  for (auto& s : test::gather(std::to_string(bench::fresh_seed(ctx().rank(), salt)))) seeds.push_back(std::stoull(s));
  return seeds;
}

bool fits(AllReduceVariant v, std::uint64_t bytes) {
  return (v != AllReduceVariant::low_latency || bytes <= kAllReduceLowLatencyMaxBytes) &&
         (v != AllReduceVariant::one_shot || bytes <= kAllReduceOneShotMaxBytes);
}

}  // namespace

TEST(AllReduce, EveryVariantAndTypeMatchesFloat64AndEachOther) {
  cudaStream_t s = test::stream();
  for (DType t : kTypes) {
    const std::size_t size = dtype_size(t);
    for (std::uint64_t count : {std::uint64_t{1}, std::uint64_t{7}, std::uint64_t{1000}, std::uint64_t{4099},
                                std::uint64_t{(1u << 19) + 5}}) {
      SymmetricBuffer in(ctx().heap(), count * size, to_string(t), "test.ar.in");
      SymmetricBuffer out(ctx().heap(), count * size, to_string(t), "test.ar.out");
      SymmetricBuffer first(ctx().heap(), count * size, to_string(t), "test.ar.first");
      auto seeds = gathered_seeds(count);
      bool have_first = false;
      for (AllReduceVariant v : kArVariants) {
        if (!fits(v, count * size)) continue;
        AllReduce plan(test::ctx_ptr(), {count, t, v, 0});
        for (bool in_place : {false, true}) {
          bench::fill_uniform(in.get(), count, to_string(t), seeds[ctx().rank()], s);
          void* dst = in_place ? in.get() : out.get();
          if (!in_place) bench::poison(out.get(), count * size, 0xA5, s);
          plan.run(in.get(), dst, s);
          ctx().synchronize(s);
          double err = relative_error_vs_float64(dst, count, t, seeds, 0);
          EXPECT_LE(err, tolerance(t)) << to_string(plan.variant()) << " " << to_string(t) << " count " << count
                                       << (in_place ? " in place" : "");
          EXPECT_EQ(bitwise_vs_rank_order(dst, count, t, seeds, 0), 0u)
              << to_string(plan.variant()) << " " << to_string(t) << " count " << count << ": bits differ from the "
              << "rank-order reference";
          if (!have_first) {
            WEFT_CUDA(cudaMemcpy(first.get(), dst, count * size, cudaMemcpyDeviceToDevice));
            have_first = true;
          } else {
            EXPECT_EQ(bench::count_mismatches(dst, first.get(), count * size, s), 0u)
                << to_string(plan.variant()) << " differs bitwise from the first variant, " << to_string(t)
                << " count " << count;
          }
          ctx().host_barrier("ar case checked");  // nobody refills an input a peer may still read
        }
      }
    }
  }
}

TEST(ReduceScatter, EveryVariantAndTypeMatchesFloat64AndEachOther) {
  cudaStream_t s = test::stream();
  const int world = ctx().world_size(), me = ctx().rank();
  for (DType t : kTypes) {
    const std::size_t size = dtype_size(t);
    for (std::uint64_t count : {std::uint64_t{1}, std::uint64_t{7}, std::uint64_t{1000}, std::uint64_t{4099},
                                std::uint64_t{(1u << 18) + 5}}) {
      const std::uint64_t total = count * world;
      SymmetricBuffer in(ctx().heap(), total * size, to_string(t), "test.rs.in");
      SymmetricBuffer out(ctx().heap(), count * size, to_string(t), "test.rs.out");
      SymmetricBuffer first(ctx().heap(), count * size, to_string(t), "test.rs.first");
      auto seeds = gathered_seeds(count + 1);
      bool have_first = false;
      for (ReduceScatterVariant v : kRsVariants) {
        if (v == ReduceScatterVariant::low_latency && count * size > kReduceScatterLowLatencyMaxBytes) continue;
        ReduceScatter plan(test::ctx_ptr(), {count, t, v, 0});
        for (bool in_place : {false, true}) {
          bench::fill_uniform(in.get(), total, to_string(t), seeds[me], s);
          void* dst = in_place ? static_cast<char*>(in.get()) + me * count * size : out.get();
          if (!in_place) bench::poison(out.get(), count * size, 0xA5, s);
          plan.run(in.get(), dst, s);
          ctx().synchronize(s);
          const bool ring = plan.variant() == ReduceScatterVariant::ring;
          double err =
              relative_error_vs_float64(dst, count, t, seeds, me * count, ring ? Scale::summands : Scale::sum);
          EXPECT_LE(err, ring ? ring_tolerance(t, world) : tolerance(t))
              << to_string(plan.variant()) << " " << to_string(t) << " count " << count;
          // The ring adds in ring order with a rounding per step: the same bits only at two ranks.
          bool same_order = plan.variant() != ReduceScatterVariant::ring || world <= 2;
          if (same_order)
            EXPECT_EQ(bitwise_vs_rank_order(dst, count, t, seeds, me * count), 0u)
                << to_string(plan.variant()) << " " << to_string(t) << " count " << count
                << ": bits differ from the rank-order reference";
          if (!have_first) {
            WEFT_CUDA(cudaMemcpy(first.get(), dst, count * size, cudaMemcpyDeviceToDevice));
            have_first = true;
          } else if (same_order) {
            EXPECT_EQ(bench::count_mismatches(dst, first.get(), count * size, s), 0u)
                << to_string(plan.variant()) << " differs bitwise, " << to_string(t) << " count " << count;
          }
          ctx().host_barrier("rs case checked");
        }
      }
    }
  }
}

TEST(AllReduce, ThousandRepeatedCallsAreBitwiseIdentical) {
  cudaStream_t s = test::stream();
  const std::uint64_t count = 200000;  // fp32: 800 KB, inside the LL limit
  for (DType t : {DType::bf16, DType::fp32}) {
    const std::uint64_t bytes = count * dtype_size(t);
    SymmetricBuffer in(ctx().heap(), bytes, to_string(t), "test.ar.rep.in");
    SymmetricBuffer out(ctx().heap(), bytes, to_string(t), "test.ar.rep.out");
    SymmetricBuffer first(ctx().heap(), bytes, to_string(t), "test.ar.rep.first");
    unsigned long long* bad = nullptr;
    WEFT_CUDA(cudaMalloc(&bad, sizeof(*bad)));
    for (AllReduceVariant v : {AllReduceVariant::low_latency, AllReduceVariant::one_shot, AllReduceVariant::two_shot,
                               AllReduceVariant::copy_engine}) {
      AllReduce plan(test::ctx_ptr(), {count, t, v, 0});
      bench::fill_uniform(in.get(), count, to_string(t), bench::fresh_seed(ctx().rank(), 3), s);
      plan.run(in.get(), first.get(), s);
      WEFT_CUDA(cudaMemsetAsync(bad, 0, sizeof(*bad), s));
      for (int i = 0; i < 1000; ++i) {
        plan.run(in.get(), out.get(), s);
        bench::accumulate_mismatches(out.get(), first.get(), bytes, bad, s);
      }
      ctx().synchronize(s);
      unsigned long long h = 1;
      WEFT_CUDA(cudaMemcpy(&h, bad, sizeof(h), cudaMemcpyDeviceToHost));
      EXPECT_EQ(h, 0u) << to_string(v) << " " << to_string(t);
      ctx().host_barrier("repeat checked");
    }
    WEFT_CUDA(cudaFree(bad));
  }
}

namespace {
// Captures one run of `run` plus a comparison with `expected` into a graph,
// replays it `replays` times back to back, and returns the wrong bytes seen.
template <class Run>
unsigned long long replay_and_compare(Run run, const void* out, const void* expected, std::uint64_t bytes, int replays) {
  cudaStream_t s = test::stream();
  unsigned long long* bad = nullptr;
  WEFT_CUDA(cudaMalloc(&bad, sizeof(*bad)));
  WEFT_CUDA(cudaMemsetAsync(bad, 0, sizeof(*bad), s));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  WEFT_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  run(s);
  bench::accumulate_mismatches(out, expected, bytes, bad, s);
  WEFT_CUDA(cudaStreamEndCapture(s, &graph));
  WEFT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < replays; ++i) WEFT_CUDA(cudaGraphLaunch(exec, s));
  ctx().synchronize(s);
  unsigned long long h = 1;
  WEFT_CUDA(cudaMemcpy(&h, bad, sizeof(h), cudaMemcpyDeviceToHost));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  WEFT_CUDA(cudaFree(bad));
  return h;
}
}  // namespace

TEST(Collectives, TenThousandGraphReplaysMatchEager) {
  cudaStream_t s = test::stream();
  const int world = ctx().world_size();
  const std::uint64_t count = 20000;  // elements per rank (AllGather: bytes = 2 x count)
  const std::uint64_t bytes = count * 2;
  SymmetricBuffer in(ctx().heap(), bytes * world, "bf16", "test.graph.in");
  SymmetricBuffer out(ctx().heap(), bytes * world, "bf16", "test.graph.out");
  SymmetricBuffer eager(ctx().heap(), bytes * world, "bf16", "test.graph.eager");
  bench::fill_uniform(in.get(), count * world, "bf16", bench::fresh_seed(ctx().rank(), 9), s);
  auto check = [&](const std::string& name, auto& plan, std::uint64_t out_bytes) {
    plan.run(in.get(), eager.get(), s);
    ctx().synchronize(s);
    ctx().host_barrier("eager done");
    auto bad = replay_and_compare([&](cudaStream_t st) { plan.run(in.get(), out.get(), st); }, out.get(), eager.get(),
                                  out_bytes, 10000);
    EXPECT_EQ(bad, 0u) << name << ": wrong bytes over 10,000 replays";
    ctx().host_barrier("replays done");
  };
  for (AllGatherVariant v : {AllGatherVariant::push, AllGatherVariant::pull, AllGatherVariant::low_latency,
                             AllGatherVariant::ring, AllGatherVariant::copy_engine}) {
    AllGather plan(test::ctx_ptr(), {bytes, v, 0});
    // The AllGather output must be symmetric for push/ring: eager and out both are.
    check(std::string("all_gather ") + to_string(v), plan, bytes * world);
  }
  for (AllReduceVariant v : {AllReduceVariant::low_latency, AllReduceVariant::one_shot, AllReduceVariant::two_shot,
                             AllReduceVariant::copy_engine}) {
    AllReduce plan(test::ctx_ptr(), {count, DType::bf16, v, 0});
    check(std::string("all_reduce ") + to_string(v), plan, bytes);
  }
  for (ReduceScatterVariant v : {ReduceScatterVariant::low_latency, ReduceScatterVariant::mesh,
                                 ReduceScatterVariant::ring, ReduceScatterVariant::copy_engine}) {
    ReduceScatter plan(test::ctx_ptr(), {count, DType::bf16, v, 0});
    check(std::string("reduce_scatter ") + to_string(v), plan, bytes);
  }
}

TEST(Collectives, PlansRespectTheSmCap) {
  AllReduce ar(test::ctx_ptr(), {1u << 24, DType::bf16, AllReduceVariant::two_shot, 5});
  EXPECT_LE(ar.sms_used(), 5);
  ReduceScatter rs(test::ctx_ptr(), {1u << 22, DType::bf16, ReduceScatterVariant::mesh, 3});
  EXPECT_LE(rs.sms_used(), 3);
  AllGather ag(test::ctx_ptr(), {1u << 20, AllGatherVariant::low_latency, 2});
  EXPECT_LE(ag.sms_used(), 2);
}

TEST(Collectives, BadPlansAndBuffersAreRejectedWithClearErrors) {
  auto error_of = [](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of([] { AllReduce p(test::ctx_ptr(), {0, DType::bf16, AllReduceVariant::automatic, 0}); })
                .find("count must be positive"),
            std::string::npos);
  EXPECT_NE(error_of([] { AllReduce p(test::ctx_ptr(), {1u << 22, DType::bf16, AllReduceVariant::low_latency, 0}); })
                .find("exceeds its limit"),
            std::string::npos);
  EXPECT_NE(error_of([] { ReduceScatter p(test::ctx_ptr(), {0, DType::fp32, ReduceScatterVariant::mesh, 0}); })
                .find("count must be positive"),
            std::string::npos);
  // Buffers outside the heap where peers must read them.
  void* plain = nullptr;
  WEFT_CUDA(cudaMalloc(&plain, 1u << 20));
  AllReduce two(test::ctx_ptr(), {4096, DType::bf16, AllReduceVariant::two_shot, 0});
  EXPECT_NE(error_of([&] { two.run(plain, plain, test::stream()); }).find("symmetric-heap"), std::string::npos);
  ReduceScatter mesh(test::ctx_ptr(), {1024, DType::bf16, ReduceScatterVariant::mesh, 0});
  EXPECT_NE(error_of([&] { mesh.run(plain, plain, test::stream()); }).find("must lie in one symmetric-heap"),
            std::string::npos);
  WEFT_CUDA(cudaFree(plain));
  // A count that differs between ranks is reported on every rank, naming both plans.
  if (ctx().world_size() >= 2) {
    std::string e = error_of([] {
      AllReduce p(test::ctx_ptr(), {1000u + ctx().rank(), DType::bf16, AllReduceVariant::low_latency, 0});
    });
    EXPECT_NE(e.find("ranks disagree"), std::string::npos) << e;
    EXPECT_NE(e.find("rank 0: AllReduce plan: 1000 x bf16"), std::string::npos) << e;
    EXPECT_NE(e.find("rank 1: AllReduce plan: 1001 x bf16"), std::string::npos) << e;
  }
}

TEST(Collectives, ARankThatCallsADifferentPlanIsNamedBeforeAnythingRuns) {
  WEFT_NEED_RANKS(2);
  ASSERT_TRUE(ctx().check_calls()) << "the GPU tests run with WEFT_CHECK_CALLS=1";
  SymmetricBuffer buf(ctx().heap(), 4096, "bf16", "test.check_calls.buffer");
  AllReduce small(test::ctx_ptr(), {1000, DType::bf16, AllReduceVariant::low_latency, 0});
  AllReduce large(test::ctx_ptr(), {2000, DType::bf16, AllReduceVariant::low_latency, 0});
  std::string message;
  try {
    (ctx().rank() == 0 ? small : large).run(buf.get(), buf.get(), test::stream());
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("ranks disagree on checked call"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 0: AllReduce run #1: 1000 x bf16"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 1: AllReduce run #1: 2000 x bf16"), std::string::npos) << message;
}
