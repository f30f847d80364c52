// The GEMM engine on one GPU: every configuration, both B layouts, bf16/fp16,
// fp32 output, M not a multiple of the tile, SM budgets of 1, 3 and 63, against cuBLAS's fp32-accumulated
// fp32 result; the hooked configurations' waits and reports; and the errors
// for shapes it cannot take.
#include <cublas_v2.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "gpu_check.hpp"
#include "gpu_test.hpp"
#include "ops/overlap.hpp"
#include "weft/core/error.hpp"
#include "weft/gemm/cublas.hpp"
#include "weft/gemm/gemm.hpp"

using namespace weft;
using weft::test::ctx;

namespace {

// fp32 reference: row-major C[M,N] = A[M,K] x op(B), fp32 accumulation and output.
void reference(cublasHandle_t h, const GemmOptions& o, const void* a, const void* b, float* c) {
  ASSERT_EQ(cublas_gemm(h, o.m, o.n, o.k, o.input, DType::fp32, o.b_layout, a, b, c), CUBLAS_STATUS_SUCCESS);
}

double gemm_error(GemmOptions o, cublasHandle_t h) {
  cudaStream_t s = test::stream();
  const std::uint64_t a_n = o.m * o.k, b_n = o.n * o.k, c_n = o.m * o.n;
  void *a, *b, *c;
  float* ref;
  WEFT_CUDA(cudaMalloc(&a, a_n * dtype_size(o.input)));
  WEFT_CUDA(cudaMalloc(&b, b_n * dtype_size(o.input)));
  WEFT_CUDA(cudaMalloc(&c, c_n * dtype_size(o.output)));
  WEFT_CUDA(cudaMalloc(&ref, c_n * 4));
  bench::fill_uniform(a, a_n, to_string(o.input), bench::fresh_seed(ctx().rank(), o.m), s);
  bench::fill_uniform(b, b_n, to_string(o.input), bench::fresh_seed(ctx().rank(), o.n), s);
  bench::poison(c, c_n * dtype_size(o.output), 0xFF, s);  // NaNs where nothing was written
  Gemm gemm(o);
  gemm.run(a, b, c, s);
  cublasSetStream(h, s);
  reference(h, o, a, b, ref);
  double err = bench::relative_error_vs_fp32(c, to_string(o.output), ref, c_n, s);
  for (void* p : {a, b, c, static_cast<void*>(ref)}) cudaFree(p);
  return err;
}

struct Cublas {
  cublasHandle_t h = nullptr;
  Cublas() { cublasCreate(&h); }
  ~Cublas() { cublasDestroy(h); }
};

}  // namespace

TEST(Gemm, EveryConfigurationMatchesTheFp32Reference) {
  Cublas cb;
  for (DType in : {DType::bf16, DType::fp16})
    for (BLayout layout : {BLayout::nk, BLayout::kn}) {
      GemmOptions o{1000, 1024, 512, in, in, layout};
      Gemm probe(o);
      for (const std::string& name : probe.configurations()) {
        o.config = name;
        EXPECT_LT(gemm_error(o, cb.h), 1e-2) << to_string(in) << (layout == BLayout::nk ? " nk " : " kn ") << name;
      }
    }
}

TEST(Gemm, EveryConfigurationRunsOnAnSmBudgetOfAnySize) {
  // Odd budgets and one below a cluster: each configuration runs whole clusters
  // (a 2x1-cluster kernel on a grid of 3 blocks along M does not launch).
  Cublas cb;
  for (int sms : {1, 3, 63}) {
    GemmOptions o{1000, 1024, 512};
    o.max_sms = sms;
    for (const std::string& name : Gemm(o).configurations()) {
      o.config = name + ", swizzle 1 along M";
      EXPECT_LT(gemm_error(o, cb.h), 1e-2) << "max_sms " << sms << ", " << o.config;
    }
  }
}

TEST(Gemm, ShapesOfTheTensorParallelBenchmarksAreRight) {
  Cublas cb;
  for (std::int64_t m : {1000, 2048, 4096, 8192}) {
    EXPECT_LT(gemm_error({m, 4096, 8192}, cb.h), 1e-2) << "M = " << m;
  }
  EXPECT_LT(gemm_error({1, 8, 8}, cb.h), 1e-2) << "the smallest shape";
  EXPECT_LT(gemm_error({777, 1000, 136}, cb.h), 1e-2) << "nothing a multiple of the tile";
  for (DType in : {DType::bf16, DType::fp16}) {
    GemmOptions f32{512, 512, 512, in, DType::fp32};
    EXPECT_LT(gemm_error(f32, cb.h), 1e-5) << to_string(in) << " in, fp32 out";
  }
}

TEST(Gemm, RejectsShapesItCannotTakeNamingWhy) {
  auto error_of = [](GemmOptions o) {
    try {
      Gemm g(o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of({64, 64, 100}).find("K = 100 must be a multiple of 8"), std::string::npos);
  EXPECT_NE(error_of({64, 100, 64, DType::bf16, DType::bf16, BLayout::kn}).find("N = 100 must be a multiple of 8"),
            std::string::npos);
  EXPECT_NE(error_of({0, 64, 64}).find("must be positive"), std::string::npos);
  EXPECT_NE(error_of({64, 64, 64, DType::fp32}).find("inputs must be bf16 or fp16"), std::string::npos);
  GemmOptions named{64, 64, 64};
  named.config = "no such tile";
  EXPECT_NE(error_of(named).find("available:"), std::string::npos);
  // Any tile order is for plans that only wait; a plan's layout fits its
  // hook (the constructor throws hook_layout_error's answer: GemmChecks.*).
  GemmOptions reporting{1024, 1024, 512};
  reporting.hook = GemmHook::report_rows;
  reporting.any_tile_order = true;
  EXPECT_NE(error_of(reporting).find("any_tile_order is for plans that wait"), std::string::npos);
  GemmOptions waiting{1024, 1024, 512};
  waiting.hook = GemmHook::wait_a_rows;
  waiting.any_tile_order = true;
  GemmOptions reporting_in_any_order = waiting;
  reporting_in_any_order.hook_layout.rows_per_report = 128;
  EXPECT_NE(error_of(reporting_in_any_order).find("can neither report stored rows"), std::string::npos);
  GemmOptions plain_with_layout{1024, 1024, 512};
  plain_with_layout.hook_layout.rows_per_flag = 128;
  EXPECT_NE(error_of(plain_with_layout).find("takes no HookLayout"), std::string::npos);

  // Runs: a plan refuses, before anything is launched, what can_implement
  // refuses (every refusal is CPU-tested: GemmChecks.*), one of each kind
  // here: the tile walk, the wait, the epilogue. Fake pointers: aligned, never used.
  Gemm any_order(waiting);
  GemmOptions adding{1024, 1024, 512};
  adding.hook = GemmHook::wait_source_rows;
  adding.hook_layout.rows_per_flag = 128;
  Gemm with_source(adding);
  void* fake = reinterpret_cast<void*>(std::uintptr_t{1} << 20);
  std::uint64_t counters[8] = {};
  const RowSignals signals{.world = &ctx().world(), .flags = counters, .ready_begin = 256, .ready_end = 1024};
  const std::pair<Gemm*, GemmArgs> refused[] = {
      {&any_order, GemmArgs{.a = fake, .b = fake, .c = fake, .first_row = 512}},
      {&any_order, GemmArgs{.a = fake, .b = fake, .c = fake, .wait = signals}},
      {&with_source, GemmArgs{.a = fake, .b = fake, .c = fake}}};
  const char* expected[] = {"rotates the tile order", "HookLayout::rows_per_flag", "expected the epilogue AddSource"};
  EXPECT_EQ(with_source.can_implement(GemmArgs{.a = fake, .b = fake, .c = fake, .epilogue = AddSource{.source = fake}}), "");
  for (int i = 0; i < 3; ++i) {
    const auto& [plan, args] = refused[i];
    const std::string why = plan->can_implement(args);
    EXPECT_NE(why.find(expected[i]), std::string::npos) << why;
    try {
      plan->run(args, test::stream());
      ADD_FAILURE() << "refused by can_implement (" << why << "), but run accepted it";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what() << " | " << why;
    }
  }
}

TEST(Gemm, AConfigStringForcesTheConfigurationAndItsSchedulerSettings) {
  // GemmOptions::config = "NAME, swizzle S along M|N" (what config() prints):
  // no tuning, exactly that kernel and tile order, and the product right.
  // prepare() launches the chosen kernel once (CUDA's lazy loading must not
  // happen behind a plan's waits), so C holds the product after it alone;
  // the same for the size heuristic (autotune off).
  Cublas cb;
  cudaStream_t s = test::stream();
  GemmOptions o{1000, 1032, 512};
  void *a, *b, *c;
  float* ref;
  WEFT_CUDA(cudaMalloc(&a, o.m * o.k * 2));
  WEFT_CUDA(cudaMalloc(&b, o.n * o.k * 2));
  WEFT_CUDA(cudaMalloc(&c, o.m * o.n * 2));
  WEFT_CUDA(cudaMalloc(&ref, o.m * o.n * 4));
  cublasSetStream(cb.h, s);
  int ran = 0;
  for (const std::string& name : Gemm(o).configurations())
    for (const char* order : {", swizzle 2 along M", ", swizzle 4 along N"}) {
      o.config = name + order;
      Gemm gemm(o);
      EXPECT_EQ(gemm.config(), o.config) << "chosen at construction, before any run";
      bench::fill_uniform(a, o.m * o.k, "bf16", bench::fresh_seed(ctx().rank(), 41 + ran), s);
      bench::fill_uniform(b, o.n * o.k, "bf16", bench::fresh_seed(ctx().rank(), 61 + ran), s);
      reference(cb.h, o, a, b, ref);
      bench::poison(c, o.m * o.n * 2, 0xFF, s);
      gemm.prepare(GemmArgs{.a = a, .b = b, .c = c}, s);
      EXPECT_LT(bench::relative_error_vs_fp32(c, "bf16", ref, o.m * o.n, s), 1e-2) << o.config << ", by prepare()";
      bench::poison(c, o.m * o.n * 2, 0xFF, s);
      gemm.run(a, b, c, s);
      EXPECT_LT(bench::relative_error_vs_fp32(c, "bf16", ref, o.m * o.n, s), 1e-2) << o.config;
      ++ran;
    }
  EXPECT_GE(ran, 2);
  {
    GemmOptions heuristic{1000, 1032, 512};
    heuristic.autotune = false;
    Gemm gemm(heuristic);
    EXPECT_TRUE(gemm.prepared()) << "the size heuristic chooses at construction";
    bench::fill_uniform(a, o.m * o.k, "bf16", bench::fresh_seed(ctx().rank(), 97), s);
    bench::fill_uniform(b, o.n * o.k, "bf16", bench::fresh_seed(ctx().rank(), 98), s);
    reference(cb.h, heuristic, a, b, ref);
    bench::poison(c, o.m * o.n * 2, 0xFF, s);
    gemm.prepare(GemmArgs{.a = a, .b = b, .c = c}, s);
    EXPECT_LT(bench::relative_error_vs_fp32(c, "bf16", ref, o.m * o.n, s), 1e-2) << gemm.config() << ", by prepare()";
  }
  o.config = Gemm(GemmOptions{1000, 1032, 512}).configurations().front() + ", swizzle 3 along M";
  try {
    Gemm bad(o);
    ADD_FAILURE() << "swizzle 3 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("S in 1, 2, 4, 8"), std::string::npos) << e.what();
  }
  for (void* p : {a, b, c, static_cast<void*>(ref)}) cudaFree(p);
}

TEST(Gemm, ASecondGemmWithTheSameOptionsTakesTheTunedChoiceFromTheCache) {
  // The tuner's choice is kept by key (in this process; across processes in
  // WEFT_TUNE_CACHE's file): a second Gemm of the same options takes it
  // without timing, runs the same kernel and settings, and gives the same
  // product bitwise. The ranks agree as the overlapped plans' GEMMs do, so
  // at world 2 they take the cached choice together.
  cudaStream_t s = test::stream();
  const std::int64_t m = 1536, n = 2056, k = 1024;  // a shape no other test tunes
  const std::int64_t wide = n + 8;                   // another shape (below): B and C sized for it
  void *a, *b, *c1, *c2;
  WEFT_CUDA(cudaMalloc(&a, m * k * 2));
  WEFT_CUDA(cudaMalloc(&b, wide * k * 2));
  WEFT_CUDA(cudaMalloc(&c1, m * wide * 2));
  WEFT_CUDA(cudaMalloc(&c2, m * wide * 2));
  bench::fill_uniform(a, m * k, "bf16", bench::fresh_seed(ctx().rank(), 131), s);
  bench::fill_uniform(b, n * k, "bf16", bench::fresh_seed(ctx().rank(), 151), s);
  bench::poison(c1, m * n * 2, 0xFF, s);
  bench::poison(c2, m * n * 2, 0x7F, s);
  GemmOptions o{m, n, k};
  o.agree = [](std::vector<float>& ms) { ops_detail::max_over_ranks(ctx().store(), ms, "test tuning timings"); };
  Gemm first(o);
  first.prepare(GemmArgs{.a = a, .b = b, .c = c1}, s);
  first.run(a, b, c1, s);
  Gemm second(o);
  second.prepare(GemmArgs{.a = a, .b = b, .c = c2}, s);
  EXPECT_TRUE(second.from_cache());
  EXPECT_EQ(second.config(), first.config());
  second.run(a, b, c2, s);
  EXPECT_EQ(bench::count_mismatches(c1, c2, m * n * 2, s), 0u) << first.config();
  if (!std::getenv("WEFT_TUNE_CACHE")) {  // a file may hold it from an earlier run
    GemmOptions other = o;
    other.n = wide;  // another shape is another key: tuned, then cached in its turn
    bench::fill_uniform(b, wide * k, "bf16", bench::fresh_seed(ctx().rank(), 171), s);
    Gemm third(other);
    third.prepare(GemmArgs{.a = a, .b = b, .c = c1}, s);
    EXPECT_FALSE(third.from_cache());
    Gemm fourth(other);
    fourth.prepare(GemmArgs{.a = a, .b = b, .c = c2}, s);
    EXPECT_TRUE(fourth.from_cache());
    EXPECT_EQ(fourth.config(), third.config());
  }
  for (void* p : {a, b, c1, c2}) cudaFree(p);
}

TEST(Gemm, HookedConfigurationsReportEveryStoredRowOnce) {
  // GemmArgs::report: after the run, band b's counter holds exactly its rows x N
  // (a copy engine waits for that value); and the product is still right.
  // A run unlike the validated ones is validated again: refused after good runs.
  Cublas cb;
  cudaStream_t s = test::stream();
  GemmOptions o{1000, 1032, 512};  // neither M nor N a multiple of any tile
  o.hook = GemmHook::report_rows;
  const std::int64_t per = 100, bands = (o.m + per - 1) / per;
  o.hook_layout.rows_per_report = per;
  void *a, *b, *c;
  float* ref;
  std::uint64_t* counters;
  WEFT_CUDA(cudaMalloc(&a, o.m * o.k * 2));
  WEFT_CUDA(cudaMalloc(&b, o.n * o.k * 2));
  WEFT_CUDA(cudaMalloc(&c, o.m * o.n * 2));
  WEFT_CUDA(cudaMalloc(&ref, o.m * o.n * 4));
  WEFT_CUDA(cudaMalloc(&counters, bands * 8));
  cublasSetStream(cb.h, s);
  Gemm probe(o);
  ASSERT_FALSE(probe.configurations().empty());
  for (const std::string& name : probe.configurations()) {
    o.config = name;
    Gemm gemm(o);
    bench::fill_uniform(a, o.m * o.k, "bf16", bench::fresh_seed(ctx().rank(), 31), s);
    bench::fill_uniform(b, o.n * o.k, "bf16", bench::fresh_seed(ctx().rank(), 32), s);
    GemmArgs args{.a = a, .b = b, .c = c};
    gemm.prepare(args, s);  // tuning runs report nothing
    for (int run = 0; run < 3; ++run) {
      bench::poison(c, o.m * o.n * 2, 0xFF, s);
      WEFT_CUDA(cudaMemsetAsync(counters, 0, bands * 8, s));
      args.report = RowsDone{.counters = counters};
      gemm.run(args, s);
      std::vector<std::uint64_t> got(bands);
      WEFT_CUDA(cudaMemcpyAsync(got.data(), counters, bands * 8, cudaMemcpyDeviceToHost, s));
      WEFT_CUDA(cudaStreamSynchronize(s));
      for (std::int64_t band = 0; band < bands; ++band)
        EXPECT_EQ(got[band], static_cast<std::uint64_t>(std::min(per, o.m - band * per) * o.n))
            << name << ", run " << run << ", band " << band;
    }
    reference(cb.h, o, a, b, ref);
    EXPECT_LT(bench::relative_error_vs_fp32(c, "bf16", ref, o.m * o.n, s), 1e-2) << name;
    GemmArgs outside = args;
    outside.first_row = o.m;
    try {
      gemm.run(outside, s);
      ADD_FAILURE() << name << ": a run starting outside M was accepted after validated runs";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("must be in [0, M"), std::string::npos) << e.what();
    }
  }
  for (void* p : {a, b, c, static_cast<void*>(ref), static_cast<void*>(counters)}) cudaFree(p);
}

TEST(Gemm, ADescendingBlockWalkComputesAndReportsEveryTileOnce) {
  // HookLayout::descending_block_rows (GEMM+ReduceScatter's ring in one
  // launch): 4 blocks of 512 rows walked from block 1 down (1, 0, 3, 2). Each
  // reporting configuration, at each swizzle whose bands fit in a block:
  // every band's counter ends at its rows x N, and the product is right.
  Cublas cb;
  cudaStream_t s = test::stream();
  GemmOptions o{2048, 1032, 512};  // N not a multiple of any tile
  o.hook = GemmHook::report_rows;
  const std::int64_t block_rows = 512, per = 128, bands = o.m / per;
  o.hook_layout = HookLayout{.rows_per_report = per, .descending_block_rows = block_rows};
  void *a, *b, *c;
  float* ref;
  std::uint64_t* counters;
  WEFT_CUDA(cudaMalloc(&a, o.m * o.k * 2));
  WEFT_CUDA(cudaMalloc(&b, o.n * o.k * 2));
  WEFT_CUDA(cudaMalloc(&c, o.m * o.n * 2));
  WEFT_CUDA(cudaMalloc(&ref, o.m * o.n * 4));
  WEFT_CUDA(cudaMalloc(&counters, bands * 8));
  cublasSetStream(cb.h, s);
  bench::fill_uniform(a, o.m * o.k, "bf16", bench::fresh_seed(ctx().rank(), 41), s);
  bench::fill_uniform(b, o.n * o.k, "bf16", bench::fresh_seed(ctx().rank(), 42), s);
  reference(cb.h, o, a, b, ref);
  Gemm probe(o);
  int ran = 0;
  for (const std::string& name : probe.configurations())
    for (int swizzle : {1, 2}) {
      if (name.find("pingpong") != std::string::npos) continue;  // they wait, but do not report
      o.config = str(name, ", swizzle ", swizzle, " along N");
      const GemmArgs args{.a = a, .b = b, .c = c, .report = RowsDone{.counters = counters}, .first_row = block_rows};
      auto gemm = std::make_unique<Gemm>(o);
      try {
        gemm->prepare(args, s);
      } catch (const Error& e) {  // a swizzle band taller than a block is refused, naming why
        EXPECT_NE(std::string(e.what()).find("a walk by descending blocks"), std::string::npos) << e.what();
        continue;
      }
      ++ran;
      bench::poison(c, o.m * o.n * 2, 0xFF, s);
      WEFT_CUDA(cudaMemsetAsync(counters, 0, bands * 8, s));
      gemm->run(args, s);
      std::vector<std::uint64_t> got(bands);
      WEFT_CUDA(cudaMemcpyAsync(got.data(), counters, bands * 8, cudaMemcpyDeviceToHost, s));
      WEFT_CUDA(cudaStreamSynchronize(s));
      for (std::int64_t band = 0; band < bands; ++band)
        EXPECT_EQ(got[band], static_cast<std::uint64_t>(per * o.n)) << o.config << ", band " << band;
      EXPECT_LT(bench::relative_error_vs_fp32(c, "bf16", ref, o.m * o.n, s), 1e-2) << o.config;
    }
  EXPECT_GT(ran, 0) << "no reporting configuration walked descending blocks";
  for (void* p : {a, b, c, static_cast<void*>(ref), static_cast<void*>(counters)}) cudaFree(p);
}

TEST(Gemm, HookedConfigurationsWaitForTheirRowsThenReadThem) {
  // Every waiting configuration (cooperative and pingpong), with the tile
  // order rotated, and again walking along M in a plan that allows any tile
  // order (GemmOptions::any_tile_order): the rows of the first band start as NaNs with their flags
  // at 0; the GEMM starts; 20 ms later a copy engine writes the real rows and
  // then raises the flags. A tile that read before its flag would carry the
  // NaNs into C. wait_a_rows waits for rows of A; wait_source_rows for rows of
  // the source S, which it adds (C = A x B + S), except on its last 256 rows,
  // which take none (AddSource::plain_*): NaNs there too, never to be read.
  Cublas cb;
  cudaStream_t s = test::stream(), late;
  WEFT_CUDA(cudaStreamCreateWithFlags(&late, cudaStreamNonBlocking));
  const std::int64_t m = 1024, n = 1032, k = 512, rows_per_flag = 128, late_rows = 512, flags_n = m / rows_per_flag;
  const std::int64_t no_source_begin = 768;  // wait_source_rows: rows [768, m) add no source (AddSource::plain_*)
  void *a, *b, *c, *src;
  float* ref;
  std::uint64_t* flags;
  unsigned long long* wait_ns = nullptr;  // RowSignals::waited_ns, per flag
  WEFT_CUDA(cudaMalloc(&wait_ns, flags_n * 8));
  WEFT_CUDA(cudaMalloc(&a, m * k * 2));
  WEFT_CUDA(cudaMalloc(&b, n * k * 2));
  WEFT_CUDA(cudaMalloc(&c, m * n * 2));
  WEFT_CUDA(cudaMalloc(&src, m * n * 2));
  WEFT_CUDA(cudaMalloc(&ref, m * n * 4));
  WEFT_CUDA(cudaMalloc(&flags, flags_n * 8));
  char* real_rows = nullptr;  // pinned, so the late copy is a copy engine's
  std::uint64_t* ones = nullptr;
  WEFT_CUDA(cudaMallocHost(&real_rows, late_rows * std::max(k, n) * 2));
  WEFT_CUDA(cudaMallocHost(&ones, flags_n * 8));
  for (std::int64_t i = 0; i < flags_n; ++i) ones[i] = 1;
  cublasSetStream(cb.h, s);
  int tried = 0;
  int tried_kn_source = 0;
  for (BLayout layout : {BLayout::nk, BLayout::kn})
  for (GemmHook hook : {GemmHook::wait_a_rows, GemmHook::wait_source_rows}) {
    const bool source = hook == GemmHook::wait_source_rows;
    GemmOptions o{m, n, k};
    o.hook = hook;
    o.b_layout = layout;
    o.hook_layout.rows_per_flag = rows_per_flag;
    std::vector<std::string> configs;
    try {
      configs = Gemm(o).configurations();
    } catch (const Error&) {
      // B [K, N] has waiting kernels for sources only; any other miss is a failure, not a skip.
      if (layout != BLayout::kn || source) throw;
    }
    if (layout == BLayout::kn && source) tried_kn_source += static_cast<int>(configs.size());
    for (const std::string& config : configs)
    for (bool any_order : {false, true}) {
      o.config = any_order ? config + ", swizzle 2 along M" : config;
      o.any_tile_order = any_order;
      const std::string name = o.config + (layout == BLayout::kn ? " (B [K, N])" : "");
      Gemm gemm(o);
      bench::fill_uniform(a, m * k, "bf16", bench::fresh_seed(ctx().rank(), 71 + tried), s);
      bench::fill_uniform(b, n * k, "bf16", bench::fresh_seed(ctx().rank(), 91 + tried), s);
      bench::fill_uniform(src, m * n, "bf16", bench::fresh_seed(ctx().rank(), 111 + tried), s);
      // The reference, on the real operands: A x B (+ S, added on the host).
      reference(cb.h, o, a, b, ref);
      if (source) {
        std::vector<float> r(m * n);
        std::vector<std::uint16_t> sv(m * n);
        WEFT_CUDA(cudaMemcpyAsync(r.data(), ref, m * n * 4, cudaMemcpyDeviceToHost, s));
        WEFT_CUDA(cudaMemcpyAsync(sv.data(), src, m * n * 2, cudaMemcpyDeviceToHost, s));
        WEFT_CUDA(cudaStreamSynchronize(s));
        for (std::int64_t i = 0; i < no_source_begin * n; ++i) {  // the last rows take no source
          const std::uint32_t bits = static_cast<std::uint32_t>(sv[i]) << 16;
          float v;
          std::memcpy(&v, &bits, 4);
          r[i] += v;
        }
        WEFT_CUDA(cudaMemcpyAsync(ref, r.data(), m * n * 4, cudaMemcpyHostToDevice, s));
      }
      // Rows that take no source must not read it either: NaNs there too.
      if (source) bench::poison(static_cast<char*>(src) + no_source_begin * n * 2, (m - no_source_begin) * n * 2, 0xFF, s);
      void* waited = source ? src : a;  // the matrix whose first rows arrive late
      const std::int64_t row_bytes = (source ? n : k) * 2;
      WEFT_CUDA(cudaMemcpyAsync(real_rows, waited, late_rows * row_bytes, cudaMemcpyDeviceToHost, s));
      bench::poison(waited, late_rows * row_bytes, 0xFF, s);  // NaNs until the flags say otherwise
      WEFT_CUDA(cudaMemsetAsync(flags, 0, flags_n * 8, s));
      bench::poison(c, m * n * 2, 0xFF, s);
      GemmArgs args{.a = a, .b = b, .c = c};
      if (source) args.epilogue = AddSource{.source = src, .plain_begin = no_source_begin, .plain_end = m};
      args.wait = RowSignals{.world = &ctx().world(),
                             .flags = flags,
                             .value = 1,
                             .ready_begin = late_rows,  // the rest is present from the start
                             .ready_end = m,
                             .from_rank = ctx().rank(),
                             .waited_ns = wait_ns};
      // Every other configuration consumes its flags (RowSignals::consume),
      // in both tile orders across the configurations.
      const bool consume = ((tried / 2) % 2 == 0) != any_order;
      args.wait.consume = consume;
      WEFT_CUDA(cudaMemsetAsync(wait_ns, 0, flags_n * 8, s));
      if (!any_order) args.first_row = late_rows;  // the present rows first, as AllGather + GEMM starts on its own shard
      gemm.prepare(args, s);        // tuning never waits
      WEFT_CUDA(cudaStreamSynchronize(s));
      gemm.run(args, s);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      WEFT_CUDA(cudaMemcpyAsync(waited, real_rows, late_rows * row_bytes, cudaMemcpyHostToDevice, late));
      WEFT_CUDA(cudaMemcpyAsync(flags, ones, late_rows / rows_per_flag * 8, cudaMemcpyHostToDevice, late));
      WEFT_CUDA(cudaStreamSynchronize(late));
      EXPECT_LT(bench::relative_error_vs_fp32(c, "bf16", ref, m * n, s), 1e-2) << name;
      // The tiles' waiting time, per flag. Flag 0 begins a tile, whose wait
      // took about 20 ms. Every late flag was waited on, but a tile that
      // spans two flags (256 rows here) finds its second raised by the same
      // copy, so only the poll's time goes there. The present flags were
      // never waited on.
      std::vector<unsigned long long> ns(flags_n);
      WEFT_CUDA(cudaMemcpy(ns.data(), wait_ns, flags_n * 8, cudaMemcpyDeviceToHost));
      // Consumed: every flag back at 0 after the run; else the late ones still up.
      std::vector<std::uint64_t> after(flags_n);
      WEFT_CUDA(cudaMemcpy(after.data(), flags, flags_n * 8, cudaMemcpyDeviceToHost));
      for (std::int64_t f = 0; f < flags_n; ++f)
        EXPECT_EQ(after[f], !consume && f < late_rows / rows_per_flag ? 1u : 0u)
            << name << (consume ? ", consuming" : "") << ", flag " << f << " after the run";
      // Flag 0 is raised 20 ms after the launch. On a GPU of its own the
      // kernel starts at once, so its first tile waits most of that. Where 8
      // ranks share the GPU, other ranks' kernels may hold the SMs past those
      // 20 ms (once seen at world 8: 0.12 ms of wait): the tile then only
      // proves that it waited at all.
      if (ctx().team().shares_gpus()) EXPECT_GT(ns[0], 0ull) << name << ", flag 0";
      else EXPECT_GE(ns[0], 10'000'000ull) << name << ", flag 0";
      for (std::int64_t f = 0; f < flags_n; ++f) {
        if (f < late_rows / rows_per_flag) EXPECT_GT(ns[f], 0ull) << name << ", flag " << f;
        else EXPECT_EQ(ns[f], 0ull) << name << ", flag " << f;
      }
      ++tried;
    }
  }
  EXPECT_GE(tried, 8) << "cooperative and pingpong, for both waits, in both orders";
  EXPECT_GE(tried_kn_source, 1) << "hooked+source configurations with B as [K, N] (GemmRs's ring steps)";
  WEFT_CUDA(cudaStreamSynchronize(s));
  cudaFreeHost(real_rows);
  cudaFreeHost(ones);
  cudaStreamDestroy(late);
  for (void* p : {a, b, c, src, static_cast<void*>(ref), static_cast<void*>(flags), static_cast<void*>(wait_ns)})
    cudaFree(p);
}

namespace {
float bf16_to_float(std::uint16_t h) {
  const std::uint32_t bits = static_cast<std::uint32_t>(h) << 16;
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}
std::uint16_t float_to_bf16_rn(float v) {  // round to nearest even (finite values)
  std::uint32_t bits;
  std::memcpy(&bits, &v, 4);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>(bits >> 16);
}
}  // namespace

TEST(Gemm, AddedRowsWaitForTheirPartialSumThenAddOntoItInOneRounding) {
  // GemmHook::add_rows, as GemmRs's one-launch way runs it at 2 ranks: the
  // stored rows go to C, the added rows wait for their flags, then add onto
  // the partial sum a copy engine wrote into ReduceAddRows::into meanwhile. The partial
  // sum starts as NaNs with its flags at 0 and arrives 20 ms after the GEMM
  // started: a tile that added before its flag would carry the NaNs. The sum
  // must be bf16(P + bf16(A x B)), one rounding, bit for bit, where bf16(A x B)
  // is the plain kernel's output (the same tile, the same accumulation order).
  // Both B layouts; the added rows last (first_row 0) and first (rotated, as rank 0 runs it).
  cudaStream_t s = test::stream(), late;
  WEFT_CUDA(cudaStreamCreateWithFlags(&late, cudaStreamNonBlocking));
  const std::int64_t m = 1024, n = 1032, k = 512, half = 512, rows_per_flag = 128, flags_n = m / rows_per_flag;
  void *a, *b, *c, *d, *into;
  std::uint64_t *flags, *done;
  unsigned long long* wait_ns;
  WEFT_CUDA(cudaMalloc(&a, m * k * 2));
  WEFT_CUDA(cudaMalloc(&b, n * k * 2));
  WEFT_CUDA(cudaMalloc(&c, m * n * 2));
  WEFT_CUDA(cudaMalloc(&d, m * n * 2));
  WEFT_CUDA(cudaMalloc(&into, half * n * 2));
  WEFT_CUDA(cudaMalloc(&flags, flags_n * 8));
  WEFT_CUDA(cudaMalloc(&done, flags_n * 8));
  WEFT_CUDA(cudaMalloc(&wait_ns, flags_n * 8));
  std::uint16_t* partial = nullptr;  // pinned, so the late copy is a copy engine's
  std::uint64_t* ones = nullptr;
  WEFT_CUDA(cudaMallocHost(&partial, half * n * 2));
  WEFT_CUDA(cudaMallocHost(&ones, flags_n * 8));
  for (std::int64_t i = 0; i < flags_n; ++i) ones[i] = 1;
  int tried = 0;
  for (BLayout layout : {BLayout::nk, BLayout::kn})
    for (bool added_first : {false, true}) {
      const std::string name = str(layout == BLayout::nk ? "B [N, K]" : "B [K, N]", added_first ? ", added rows first" : "");
      const std::int64_t add_begin = added_first ? 0 : half, stored_begin = added_first ? half : 0;
      GemmOptions plain_o{m, n, k, DType::bf16, DType::bf16, layout};
      plain_o.config = "128x256x64 c2x1 cooperative, swizzle 1 along N";
      Gemm plain(plain_o);
      GemmOptions o{m, n, k, DType::bf16, DType::bf16, layout};
      o.hook = GemmHook::add_rows;
      o.hook_layout = HookLayout{.rows_per_flag = rows_per_flag, .rows_per_report = rows_per_flag};
      Gemm gemm(o);
      EXPECT_NE(gemm.configurations().at(0).find("hooked+add"), std::string::npos) << name;
      bench::fill_uniform(a, m * k, "bf16", bench::fresh_seed(ctx().rank(), 201 + tried), s);
      bench::fill_uniform(b, n * k, "bf16", bench::fresh_seed(ctx().rank(), 211 + tried), s);
      bench::fill_uniform(into, half * n, "bf16", bench::fresh_seed(ctx().rank(), 221 + tried), s);
      WEFT_CUDA(cudaMemcpyAsync(partial, into, half * n * 2, cudaMemcpyDeviceToHost, s));
      plain.run(a, b, d, s);  // bf16(A x B), the same tile's accumulation
      GemmArgs args{.a = a,
                    .b = b,
                    .c = c,
                    .wait = RowSignals{.world = &ctx().world(),
                                       .flags = flags,
                                       .value = 1,
                                       .ready_begin = stored_begin,
                                       .ready_end = stored_begin + half,
                                       .from_rank = ctx().rank(),
                                       .waited_ns = wait_ns},
                    .epilogue = ReduceAddRows{.into = into, .begin = add_begin, .end = add_begin + half},
                    .report = RowsDone{.counters = done},
                    .first_row = stored_begin};
      gemm.prepare(args, s);  // tuning never waits and writes only into C
      bench::poison(into, half * n * 2, 0xFF, s);  // NaNs until the flags say otherwise
      bench::poison(c, m * n * 2, 0xFF, s);
      WEFT_CUDA(cudaMemsetAsync(flags, 0, flags_n * 8, s));
      WEFT_CUDA(cudaMemsetAsync(done, 0, flags_n * 8, s));
      WEFT_CUDA(cudaMemsetAsync(wait_ns, 0, flags_n * 8, s));
      WEFT_CUDA(cudaStreamSynchronize(s));
      gemm.run(args, s);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      WEFT_CUDA(cudaMemcpyAsync(into, partial, half * n * 2, cudaMemcpyHostToDevice, late));
      WEFT_CUDA(cudaMemcpyAsync(flags + add_begin / rows_per_flag, ones, half / rows_per_flag * 8,
                                cudaMemcpyHostToDevice, late));
      WEFT_CUDA(cudaStreamSynchronize(late));
      WEFT_CUDA(cudaStreamSynchronize(s));
      std::vector<std::uint16_t> got_c(m * n), got_d(m * n), got_into(half * n);
      WEFT_CUDA(cudaMemcpy(got_c.data(), c, m * n * 2, cudaMemcpyDeviceToHost));
      WEFT_CUDA(cudaMemcpy(got_d.data(), d, m * n * 2, cudaMemcpyDeviceToHost));
      WEFT_CUDA(cudaMemcpy(got_into.data(), into, half * n * 2, cudaMemcpyDeviceToHost));
      long long stored_wrong = 0, untouched_wrong = 0, sum_wrong = 0;
      for (std::int64_t r = 0; r < m; ++r)
        for (std::int64_t j = 0; j < n; ++j) {
          const std::int64_t i = r * n + j;
          if (r >= add_begin && r < add_begin + half) {
            untouched_wrong += got_c[i] != 0xFFFF;  // C's added rows are never written
            const std::int64_t q = (r - add_begin) * n + j;
            sum_wrong += got_into[q] != float_to_bf16_rn(bf16_to_float(partial[q]) + bf16_to_float(got_d[i]));
          } else {
            stored_wrong += got_c[i] != got_d[i];
          }
        }
      EXPECT_EQ(stored_wrong, 0) << name << ": stored rows that differ from the plain kernel's";
      EXPECT_EQ(untouched_wrong, 0) << name << ": elements of C's added rows that were written";
      EXPECT_EQ(sum_wrong, 0) << name << ": sums that are not bf16(partial + bf16(A x B))";
      std::vector<std::uint64_t> counted(flags_n);
      std::vector<unsigned long long> ns(flags_n);
      WEFT_CUDA(cudaMemcpy(counted.data(), done, flags_n * 8, cudaMemcpyDeviceToHost));
      WEFT_CUDA(cudaMemcpy(ns.data(), wait_ns, flags_n * 8, cudaMemcpyDeviceToHost));
      for (std::int64_t f = 0; f < flags_n; ++f)
        EXPECT_EQ(counted[f], static_cast<std::uint64_t>(rows_per_flag * n)) << name << ": band " << f << "'s report";
      EXPECT_GE(ns[add_begin / rows_per_flag], 10'000'000ull) << name << ": the first added rows' wait";
      ++tried;
    }
  EXPECT_EQ(tried, 4);
  // A plan that adds refuses rows that wait without being added onto, and bounds inside a tile.
  GemmOptions o{m, n, k};
  o.hook = GemmHook::add_rows;
  o.hook_layout.rows_per_flag = 128;
  Gemm gemm(o);
  GemmArgs bad{.a = a, .b = b, .c = c, .epilogue = ReduceAddRows{.into = into, .begin = 512, .end = 1024}};
  bad.wait = RowSignals{.world = &ctx().world(), .flags = flags, .ready_begin = 256, .ready_end = 512};
  GemmArgs part_tile{.a = a, .b = b, .c = c, .epilogue = ReduceAddRows{.into = into, .begin = 128, .end = 1024}};
  const std::pair<GemmArgs, const char*> refused[] = {{bad, "must be among the added rows"},
                                                      {part_tile, "must be whole row tiles"}};
  for (const auto& [args, why] : refused) {
    try {
      gemm.run(args, s);
      ADD_FAILURE() << "accepted: " << why;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  }
  WEFT_CUDA(cudaStreamSynchronize(s));
  cudaFreeHost(partial);
  cudaFreeHost(ones);
  cudaStreamDestroy(late);
  for (void* p : {a, b, c, d, into, static_cast<void*>(flags), static_cast<void*>(done), static_cast<void*>(wait_ns)})
    cudaFree(p);
}
