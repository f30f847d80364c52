// weft-bench ag_gemm | gemm_rs | gemm_ar: weft's overlapped tensor-parallel
// operators against sequential NCCL + cuBLAS, in one run, on the same inputs.
//
// Shapes are PyTorch's: (M, N, K) of the whole layer. ag_gemm: each rank holds
// M/W rows of A and N/W columns of the weight. gemm_rs / gemm_ar: each rank
// holds K/W of the depth. For each shape it times, with the same buffers:
//   weft          the plan (its path: fused or sequential, chosen or forced)
//   sequential    NCCL collective + cuBLAS GEMM, one after the other
//   GEMM alone    weft's and cuBLAS's, this rank's GEMM
//   comm alone    NCCL's and weft's collective
//   ideal         max(faster GEMM alone, faster comm alone)
// --check compares with a float64-free but fp32-accumulated, fp32-output
// reference (cuBLAS fp32 output, NCCL in fp32) by relative error, on fresh
// random inputs and poisoned outputs; ag_gemm also checks the gathered A bitwise.
// Where ranks share a GPU (no NCCL), the reference is built on each rank from
// every rank's inputs, regenerated from their seeds (the gathered A; the sum
// of every rank's GEMM, by cuBLAS), and weft's collective stands in for NCCL's
// in the timed contenders, whose times are then no performance figures.
#include <cublas_v2.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <iterator>

#include "bench.hpp"
#include "gpu_check.hpp"
#include "timing.hpp"
#include "weft/core/error.hpp"
#include "weft/core/nccl_type.hpp"
#include "weft/gemm/cublas.hpp"
#include "weft/ops/ag_gemm.hpp"
#include "weft/ops/all_gather.hpp"
#include "weft/ops/all_reduce.hpp"
#include "weft/ops/gemm_ar.hpp"
#include "weft/ops/gemm_rs.hpp"
#include "weft/ops/reduce_scatter.hpp"

namespace weft::bench {
namespace {

// Row-major C[m,n] (type t or fp32) = A[m,k] x B^T, B [n,k], inputs of type t.
void cublas_nk(cublasHandle_t h, DType t, std::int64_t m, std::int64_t n, std::int64_t k, const void* a, const void* b,
               void* c, bool fp32_out) {
  require_cublas(cublas_gemm(h, m, n, k, t, fp32_out ? DType::fp32 : t, BLayout::nk, a, b, c),
                 "cublasGemmEx");
}

struct Row {
  std::string op, mode, path, config;
  std::int64_t m, n, k;
  double weft = 0, seq = 0, gemm_weft = 0, gemm_cublas = 0, comm_nccl = 0, comm_weft = 0, ideal = 0;
  double gemm_hooked = 0;  // the fused path's GEMMs alone, with nothing to wait for or send
  double plan_fused = 0, plan_seq = 0;
  double rel_err = -1;
  long long gathered_mismatch = -1;
};

void* device_alloc(std::uint64_t bytes) {
  void* p = nullptr;
  WEFT_CUDA(cudaMalloc(&p, bytes));
  return p;
}

}  // namespace

int bench_overlap(const std::shared_ptr<Context>& ctx_ptr, const BenchArgs& args) {
  Context& ctx = *ctx_ptr;
  const int world = ctx.world_size(), me = ctx.rank();
  WEFT_REQUIRE(args.dtype == "bf16" || args.dtype == "fp16", "weft-bench ", args.op,
               ": --dtype must be bf16 or fp16 (the hooked GEMMs' types), got '", args.dtype, "'");
  const DType dt = parse_dtype(args.dtype);
  const char* const ts = args.dtype.c_str();  // the type's name, as fill_uniform and the checks take it
  const ncclDataType_t nccl_dt = nccl_type(dt);
  WEFT_REQUIRE(args.b_layout == "nk", "weft-bench ", args.op, ": --b-layout must be nk (weights as PyTorch stores them)");
  cudaStream_t stream;
  WEFT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasHandle_t blas;
  require_cublas(cublasCreate(&blas), "cublasCreate");
  require_cublas(cublasSetStream(blas, stream), "cublasSetStream");
  ncclComm_t nccl = ctx.has_nccl() ? ctx.nccl() : nullptr;
  // Every rank's seed for one input, in rank order (the reference without NCCL).
  auto seeds_of = [&](std::uint64_t mine) {
    std::vector<std::uint64_t> seeds;
    for (const std::string& v : ctx.store().all_gather(std::to_string(mine), "bench seeds")) seeds.push_back(std::stoull(v));
    return seeds;
  };
  const int calls = 3;  // back to back per sample, as a layer runs them
  // weft, the baselines and the parts, sampled in turn (ms per call), in
  // this order; with --soak, then each alone for a while (clock studies).
  static const char* const kContenders[] = {"weft",           "sequential",      "weft GEMM",         "cuBLAS GEMM",
                                            "NCCL collective", "weft collective", "fused GEMMs alone"};
  auto timed = [&](const Row& row, const std::vector<std::function<void()>>& contenders) {
    WEFT_REQUIRE(contenders.size() == std::size(kContenders), "weft-bench: ", contenders.size(), " contenders, ",
                 std::size(kContenders), " names");
    std::vector<double> ms =
        time_interleaved(ctx, stream, contenders, calls, args.samples, args.warmup, args.hold, args.order);
    for (double& x : ms) x /= 1000.0;
    if (args.soak_s > 0)
      soak(ctx, stream, contenders, std::vector<std::string>(std::begin(kContenders), std::end(kContenders)), ms,
           args.soak_s, str(row.op, " ", row.m, "x", row.n, "x", row.k));
    return ms;
  };
  std::vector<Row> rows;
  bool ok = true;
  std::uint64_t salt = 100;
  for (const auto& s : args.shapes) {
    const std::int64_t M = s[0], N = s[1], K = s[2];
    const bool ag = args.op == "ag_gemm";
    WEFT_REQUIRE(M % world == 0, args.op, ": M = ", M, " must be a multiple of the world size ", world);
    WEFT_REQUIRE((ag ? N : K) % world == 0, args.op, ": ", ag ? "N = " : "K = ", ag ? N : K,
                 " must be a multiple of the world size ", world);
    const std::int64_t n = ag ? N / world : N, k = ag ? K : K / world, rows_per_rank = M / world;
    for (const std::string& mode_name : args.variants) {
      const OverlapMode mode = parse_overlap_mode(mode_name);
      if (me == 0)
        std::fprintf(stderr, "[weft-bench] %s %lldx%lldx%lld (%s) ...\n", args.op.c_str(), static_cast<long long>(M),
                     static_cast<long long>(N), static_cast<long long>(K), mode_name.c_str());
      Row row{args.op, mode_name, "", "", M, N, K};
      // This rank's GEMM shape and the collective's, for the baselines.
      const std::int64_t gm = M, gn = n, gk = k;
      Gemm weft_gemm(gemm_options(gm, gn, gk, dt));
      void* b = device_alloc(gn * gk * 2);
      const std::uint64_t b_seed = fresh_seed(me, ++salt);
      fill_uniform(b, gn * gk, ts, b_seed, stream);
      void* c32 = device_alloc(gm * gn * 4);  // fp32 GEMM output (reference)
      void* c_ref = device_alloc(gm * gn * 2);
      if (ag) {
        AgGemmOptions plan_options{.m = M, .n = n, .k = K, .dtype = dt, .mode = mode, .way = args.ag_way};
        if (args.chunks) plan_options.chunks_per_shard = args.chunks;
        AgGemm plan(ctx_ptr, plan_options);
        void* a_shard = plan.local_shard();
        void* a_nccl = device_alloc(rows_per_rank * K * 2);
        void* gathered_nccl = device_alloc(M * K * 2);
        void* c = device_alloc(M * n * 2);
        SymmetricBuffer weft_gathered(ctx.heap(), M * K * 2, ts, "bench.gathered");
        AllGather weft_ag(ctx_ptr, AllGatherOptions{.bytes_per_rank = static_cast<std::uint64_t>(rows_per_rank * K * 2)});
        const std::uint64_t seed = fresh_seed(me, ++salt);
        fill_uniform(a_shard, rows_per_rank * K, ts, seed, stream);
        WEFT_CUDA(cudaMemcpyAsync(a_nccl, a_shard, rows_per_rank * K * 2, cudaMemcpyDeviceToDevice, stream));
        // Without NCCL the reference gathered A is every rank's shard from its
        // seed, and the baseline's collective is weft's.
        auto nccl_ag = [&] {
          if (nccl) WEFT_NCCL(ncclAllGather(a_nccl, gathered_nccl, rows_per_rank * K, nccl_dt, nccl, stream));
          else weft_ag.run(a_nccl, weft_gathered.get(), stream);
        };
        if (nccl) {
          nccl_ag();
        } else {
          const std::vector<std::uint64_t> seeds = seeds_of(seed);
          for (int p = 0; p < world; ++p)
            fill_uniform(static_cast<char*>(gathered_nccl) + p * rows_per_rank * K * 2, rows_per_rank * K, ts,
                         seeds[p], stream);
        }
        poison(c, M * n * 2, 0xFF, stream);
        plan.run(a_shard, b, c, stream);  // first run: chooses the path (automatic)
        // The fused GEMM alone, in the configuration the plan runs it in.
        GemmOptions hooked_options = gemm_options(gm, gn, gk, dt);
        hooked_options.hook = GemmHook::wait_a_rows;
        if (plan.path() == path_name(AgWay::one_gemm)) hooked_options.config = plan.gemm_config();
        Gemm hooked(hooked_options);
        // Or, with plain steps, one plain GEMM per shard (cuBLAS's, where the plan took it).
        const bool plain_steps = plan.path() == path_name(AgWay::plain_steps);
        GemmOptions step_options = gemm_options(rows_per_rank, gn, gk, dt);
        step_options.allow_cublas = true;
        if (plain_steps) step_options.config = plan.gemm_config();
        Gemm step(step_options);
        auto fused_gemms = [&] {
          if (!plain_steps) {
            hooked.run(GemmArgs{.a = gathered_nccl, .b = b, .c = c_ref}, stream);
            return;
          }
          for (int q = 0; q < world; ++q)
            step.run(GemmArgs{.a = static_cast<const char*>(gathered_nccl) + q * rows_per_rank * K * 2,
                              .b = b,
                              .c = static_cast<char*>(c_ref) + q * rows_per_rank * n * 2},
                     stream);
        };
        poison(c, M * n * 2, 0xFF, stream);
        {  // the peers' slots of the gathered A, so the check sees this run's copies
          char* g = static_cast<char*>(const_cast<void*>(plan.gathered()));
          const std::uint64_t slot = rows_per_rank * K * 2;
          if (me > 0) poison(g, me * slot, 0xFF, stream);
          if (me + 1 < world) poison(g + (me + 1) * slot, (world - me - 1) * slot, 0xFF, stream);
        }
        plan.run(a_shard, b, c, stream);
        if (args.check) {
          cublas_nk(blas, dt, M, n, K, gathered_nccl, b, c32, true);
          row.rel_err = relative_error_vs_fp32(c, ts, static_cast<const float*>(c32), M * n, stream);
          row.gathered_mismatch = static_cast<long long>(count_mismatches(plan.gathered(), gathered_nccl, M * K * 2, stream));
          ok &= row.rel_err < 1e-2 && row.gathered_mismatch == 0;
        }
        const std::vector<double> t = timed(row, {
            [&] { plan.run(a_shard, b, c, stream); },
            [&] {
              nccl_ag();
              cublas_nk(blas, dt, M, n, K, gathered_nccl, b, c_ref, false);
            },
            [&] { weft_gemm.run(gathered_nccl, b, c_ref, stream); },
            [&] { cublas_nk(blas, dt, M, n, K, gathered_nccl, b, c_ref, false); },
            nccl_ag,
            [&] { weft_ag.run(a_nccl, weft_gathered.get(), stream); },
            fused_gemms,
        });
        row.weft = t[0], row.seq = t[1], row.gemm_weft = t[2], row.gemm_cublas = t[3], row.comm_nccl = t[4],
        row.comm_weft = t[5], row.gemm_hooked = t[6];
        row.path = plan.path();
        row.config = plan.gemm_config();
        row.plan_fused = plan.measured_fused_ms();
        row.plan_seq = plan.measured_sequential_ms();
        for (void* p : {a_nccl, gathered_nccl, c}) cudaFree(p);
      } else {
        const bool ar = args.op == "gemm_ar";
        void* a = device_alloc(M * k * 2);
        const std::uint64_t a_seed = fresh_seed(me, ++salt);
        fill_uniform(a, M * k, ts, a_seed, stream);
        const std::int64_t out_elems = ar ? M * N : rows_per_rank * N;
        SymmetricBuffer out(ctx.heap(), out_elems * 2, ts, "bench.out");
        void* ref32 = device_alloc(out_elems * 4);
        void* out_ref = device_alloc(out_elems * 2);
        void* comm_out = device_alloc(out_elems * 2);
        SymmetricBuffer comm_buf(ctx.heap(), M * N * 2, ts, "bench.comm");
        std::unique_ptr<GemmRs> rs;
        std::unique_ptr<GemmAr> arp;
        std::unique_ptr<ReduceScatter> weft_rs;
        std::unique_ptr<AllReduce> weft_ar;
        if (ar) {
          GemmArOptions plan_options{.m = M, .n = N, .k = k, .dtype = dt, .mode = mode};
          if (args.chunks) plan_options.chunks_per_block = args.chunks;
          plan_options.way = args.way;
          arp = std::make_unique<GemmAr>(ctx_ptr, plan_options);
          weft_ar = std::make_unique<AllReduce>(ctx_ptr, AllReduceOptions{.count = static_cast<std::uint64_t>(M * N), .dtype = dt});
        } else {
          GemmRsOptions plan_options{.m = M, .n = N, .k = k, .dtype = dt, .mode = mode};
          if (args.chunks) plan_options.chunks_per_block = args.chunks;
          plan_options.way = args.way;
          rs = std::make_unique<GemmRs>(ctx_ptr, plan_options);
          weft_rs = std::make_unique<ReduceScatter>(
              ctx_ptr, ReduceScatterOptions{.count = static_cast<std::uint64_t>(rows_per_rank * N), .dtype = dt});
        }
        auto run_weft = [&] {
          if (ar) arp->run(a, b, out.get(), stream);
          else rs->run(a, b, out.get(), stream);
        };
        poison(out.get(), out_elems * 2, 0xFF, stream);
        run_weft();  // first run: chooses the path (automatic)
        // The ring's GEMMs alone, in the configurations the plan runs them in:
        // W blocks of M/W rows, each after the first adding the previous one's output.
        const std::string plan_path = ar ? arp->path() : rs->path();
        const std::string plan_configs = ar ? arp->gemm_config() : rs->gemm_config();
        // With one launch: one GEMM over all M rows adding a source.
        const std::size_t then = plan_configs.find("; then ");
        const bool one_launch = plan_path == path_name(FusedWay::ring_one_launch);
        // A plain first step runs an unhooked GEMM (cuBLAS's, where the plan took it).
        const bool plain_first = plan_path == path_name(FusedWay::ring_plain_first);
        const bool per_step = plan_path == path_name(FusedWay::ring_per_step) || plain_first;
        GemmOptions ring_options = gemm_options(rows_per_rank, N, k, dt);
        ring_options.hook = plain_first ? GemmHook::none : GemmHook::report_rows;
        ring_options.allow_cublas = plain_first;
        if (per_step && then != std::string::npos) ring_options.config = plan_configs.substr(0, then);
        Gemm ring_first(ring_options);
        ring_options.hook = GemmHook::wait_source_rows;
        ring_options.allow_cublas = false;
        if (per_step && then != std::string::npos) {
          // "Y" or, with more than 2 ranks, "Y; last Z": the steps run Y here, the last one too.
          const std::string steps = plan_configs.substr(then + 7);
          ring_options.config = steps.substr(0, steps.find("; last "));
        }
        // The steps here report nothing and start at their block's first row,
        // as the plan's last step, which may walk its tiles in any order.
        ring_options.any_tile_order = true;
        Gemm ring_step(ring_options);
        std::unique_ptr<Gemm> whole;
        void* whole_source = nullptr;
        // Adding in one launch: its GEMM over all M rows, our block added onto C's own rows.
        const bool adding = plan_path == path_name(FusedWay::one_launch_add);
        if (adding) {
          GemmOptions adding_options = gemm_options(M, N, k, dt);
          adding_options.hook = GemmHook::add_rows;
          adding_options.config = plan_configs;
          whole = std::make_unique<Gemm>(adding_options);
        }
        if (one_launch) {
          GemmOptions whole_options = ring_options;
          whole_options.m = M;
          whole_options.config = plan_configs;
          whole = std::make_unique<Gemm>(whole_options);
          whole_source = device_alloc(M * N * 2);
          fill_uniform(whole_source, M * N, ts, fresh_seed(me, ++salt), stream);
        }
        auto ring_gemms = [&] {
          if (adding) {
            const int peer = (me + 1) % world;
            whole->run(GemmArgs{.a = a,
                                .b = b,
                                .c = c_ref,
                                .epilogue = ReduceAddRows{.into = static_cast<char*>(c_ref) + me * rows_per_rank * N * 2,
                                                          .begin = me * rows_per_rank,
                                                          .end = (me + 1) * rows_per_rank},
                                .first_row = peer * rows_per_rank},
                       stream);
            return;
          }
          if (one_launch) {
            whole->run(GemmArgs{.a = a, .b = b, .c = c_ref, .epilogue = AddSource{.source = whole_source}}, stream);
            return;
          }
          auto a_block = [&](int s) { return static_cast<const char*>(a) + s * rows_per_rank * k * 2; };
          auto c_block = [&](int s) { return static_cast<char*>(c_ref) + s * rows_per_rank * N * 2; };
          ring_first.run(GemmArgs{.a = a_block(0), .b = b, .c = c_block(0)}, stream);
          for (int s = 1; s < world; ++s)
            ring_step.run(GemmArgs{.a = a_block(s), .b = b, .c = c_block(s), .epilogue = AddSource{.source = c_block(s - 1)}},
                          stream);
        };
        auto weft_coll = [&] {
          if (ar) weft_ar->run(comm_buf.get(), comm_buf.get(), stream);
          else weft_rs->run(c_ref, comm_out, stream);
        };
        // Without NCCL (ranks sharing a GPU), weft's collective stands in for the baseline's.
        auto nccl_coll = [&](const void* in, void* o, ncclDataType_t t) {
          if (!nccl) weft_coll();
          else if (ar) WEFT_NCCL(ncclAllReduce(in, o, M * N, t, ncclSum, nccl, stream));
          else WEFT_NCCL(ncclReduceScatter(in, o, rows_per_rank * N, t, ncclSum, nccl, stream));
        };
        poison(out.get(), out_elems * 2, 0xFF, stream);
        run_weft();
        if (args.check) {
          const float* ref = static_cast<const float*>(ref32);
          if (nccl) {
            cublas_nk(blas, dt, M, N, k, a, b, c32, true);
            nccl_coll(c32, ref32, nccl_type(DType::fp32));
          } else {  // the sum of every rank's GEMM, each rank's A and B rebuilt from their seeds
            const std::vector<std::uint64_t> a_seeds = seeds_of(a_seed), b_seeds = seeds_of(b_seed);
            void* a_p = device_alloc(M * k * 2);
            void* b_p = device_alloc(N * k * 2);
            for (int p = 0; p < world; ++p) {
              fill_uniform(a_p, M * k, ts, a_seeds[p], stream);
              fill_uniform(b_p, N * k, ts, b_seeds[p], stream);
              require_cublas(cublas_gemm(blas, M, N, k, dt, DType::fp32, BLayout::nk, a_p, b_p, c32,
                                         p == 0 ? 0.0f : 1.0f),
                             "cublasGemmEx");
            }
            ctx.synchronize(stream);
            for (void* q : {a_p, b_p}) cudaFree(q);
            ref = static_cast<const float*>(c32) + (ar ? 0 : me * rows_per_rank * N);
          }
          row.rel_err = relative_error_vs_fp32(out.get(), ts, ref, out_elems, stream);
          ok &= row.rel_err < 1e-2;
        }
        const std::vector<double> t = timed(row, {
            run_weft,
            [&] {
              cublas_nk(blas, dt, M, N, k, a, b, c_ref, false);
              nccl_coll(c_ref, out_ref, nccl_dt);
            },
            [&] { weft_gemm.run(a, b, c_ref, stream); },
            [&] { cublas_nk(blas, dt, M, N, k, a, b, c_ref, false); },
            [&] { nccl_coll(c_ref, out_ref, nccl_dt); },
            weft_coll,
            ring_gemms,
        });
        row.weft = t[0], row.seq = t[1], row.gemm_weft = t[2], row.gemm_cublas = t[3], row.comm_nccl = t[4],
        row.comm_weft = t[5], row.gemm_hooked = t[6];
        row.path = ar ? arp->path() : rs->path();
        row.config = ar ? arp->gemm_config() : rs->gemm_config();
        row.plan_fused = ar ? arp->measured_fused_ms() : rs->measured_fused_ms();
        row.plan_seq = ar ? arp->measured_sequential_ms() : rs->measured_sequential_ms();
        for (void* p : {a, ref32, out_ref, comm_out, whole_source}) cudaFree(p);
      }
      row.ideal = std::max(std::min(row.gemm_weft, row.gemm_cublas), std::min(row.comm_nccl, row.comm_weft));
      for (void* p : {b, c32, c_ref}) cudaFree(p);
      ctx.synchronize(stream);
      rows.push_back(row);
      if (me == 0 && !args.json)
        std::fprintf(stderr, "[weft-bench]   weft %.3f ms (%s), the fused GEMMs alone %.3f, sequential %.3f, ideal %.3f\n",
                     row.weft, row.path.c_str(), row.gemm_hooked, row.seq, row.ideal);
    }
  }
  cublasDestroy(blas);
  WEFT_CUDA(cudaStreamDestroy(stream));
  if (me == 0 && !nccl) {
    // Ranks share a GPU: weft's time and the check, as a record of the run, not as figures.
    std::printf("%s, %d ranks sharing GPUs, %s. Times on a shared GPU are not performance figures; no NCCL "
                "baseline (NCCL refuses ranks that share a GPU).\n",
                args.op.c_str(), world, ts);
    for (const Row& r : rows)
      std::printf("%6lld %6lld %6lld %-10s %-24s | weft %8.3f ms | rel err %s\n", static_cast<long long>(r.m),
                  static_cast<long long>(r.n), static_cast<long long>(r.k), r.mode.c_str(), r.path.c_str(), r.weft,
                  r.rel_err < 0 ? "unchecked" : ((r.rel_err < 1e-2 ? "ok " : "FAIL ") + std::to_string(r.rel_err)).c_str());
    std::fflush(stdout);
  } else if (me == 0) {
    if (args.json) {
      for (const Row& r : rows)
        std::printf("{\"op\":\"%s\",\"m\":%lld,\"n\":%lld,\"k\":%lld,\"world\":%d,\"mode\":\"%s\",\"path\":\"%s\","
                    "\"config\":\"%s\",\"weft_ms\":%.4f,\"seq_ms\":%.4f,\"gemm_weft_ms\":%.4f,\"gemm_cublas_ms\":%.4f,"
                    "\"comm_nccl_ms\":%.4f,\"comm_weft_ms\":%.4f,\"ideal_ms\":%.4f,\"vs_ideal\":%.4f,"
                    "\"speedup_vs_seq\":%.4f,\"plan_fused_ms\":%.4f,\"plan_seq_ms\":%.4f,\"gemm_hooked_ms\":%.4f,"
                    "\"rel_err\":%.3e,"
                    "\"gathered_mismatch\":%lld,\"order\":\"%s\"}\n",
                    r.op.c_str(), static_cast<long long>(r.m), static_cast<long long>(r.n),
                    static_cast<long long>(r.k), world, r.mode.c_str(), r.path.c_str(), r.config.c_str(), r.weft,
                    r.seq, r.gemm_weft, r.gemm_cublas, r.comm_nccl, r.comm_weft, r.ideal, r.weft / r.ideal,
                    r.seq / r.weft, r.plan_fused, r.plan_seq, r.gemm_hooked, r.rel_err, r.gathered_mismatch,
                    sample_order_name(args.order));
    } else {
      std::printf("%s on %d GPUs, %s, ms per call (median of %d samples of %d back-to-back calls, all contenders in turn, %s order, max over ranks).\n"
                  "seq = NCCL + cuBLAS one after the other; ideal = max(faster GEMM alone, faster comm alone);\n"
                  "x seq = seq / weft (> 1: weft faster); x ideal = weft / ideal\n",
                  args.op.c_str(), world, ts, args.samples, calls, sample_order_name(args.order));
      std::printf("%6s %6s %6s %-10s %-10s | %8s %8s %8s %8s %8s %8s %8s | %6s %7s | %s\n", "M", "N", "K", "mode", "path",
                  "weft", "seq", "gemm", "cuBLAS", "NCCL", "weft cc", "ideal", "x seq", "x ideal", "rel err");
      for (const Row& r : rows) {
        const std::string check =
            r.rel_err < 0 ? "unchecked" : (r.rel_err < 1e-2 ? "ok " : "FAIL ") + std::to_string(r.rel_err);
        std::printf("%6lld %6lld %6lld %-10s %-10s | %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f | %6.3f %7.3f | %s\n",
                    static_cast<long long>(r.m), static_cast<long long>(r.n), static_cast<long long>(r.k),
                    r.mode.c_str(), r.path.c_str(), r.weft, r.seq, r.gemm_weft, r.gemm_cublas, r.comm_nccl,
                    r.comm_weft, r.ideal, r.seq / r.weft, r.weft / r.ideal, check.c_str());
      }
    }
    std::fflush(stdout);
  }
  return ok ? 0 : 3;
}

}  // namespace weft::bench
