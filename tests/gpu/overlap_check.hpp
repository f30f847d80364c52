// overlap_check.hpp - the checks of the overlapped tensor-parallel operators
// (AgGemm, GemmRs, GemmAr) that test_overlap.cu runs on one node and
// internode/test_operators.cu across nodes: one plan, two runs on fresh
// inputs and poisoned outputs, against a cuBLAS reference with fp32
// accumulation and output, built on each rank from every rank's inputs
// (regenerated from their seeds: the reference needs no communication).
#pragma once

#include <cublas_v2.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpu_check.hpp"
#include "gpu_test.hpp"
#include "weft/gemm/cublas.hpp"
#include "weft/ops/ag_gemm.hpp"
#include "weft/ops/gemm_ar.hpp"
#include "weft/ops/gemm_rs.hpp"

namespace weft::test::overlap {

struct Cublas {
  cublasHandle_t h = nullptr;
  Cublas() {
    cublasCreate(&h);
    cublasSetStream(h, test::stream());
  }
  ~Cublas() { cublasDestroy(h); }
};

// fp32 C[m,n] (+)= A[m,k] x B^T, B [n,k], inputs of type t.
inline void reference(cublasHandle_t h, DType t, std::int64_t m, std::int64_t n, std::int64_t k, const void* a,
                      const void* b, float* c, bool add = false) {
  ASSERT_EQ(cublas_gemm(h, m, n, k, t, DType::fp32, BLayout::nk, a, b, c, add ? 1.0f : 0.0f), CUBLAS_STATUS_SUCCESS);
}

// A fresh seed on this rank, and every rank's, in rank order: each rank can
// then rebuild any rank's input with fill_uniform.
inline std::vector<std::uint64_t> fresh_seeds(std::uint64_t salt_value) {
  std::vector<std::uint64_t> seeds;
  for (const std::string& s : test::gather(std::to_string(bench::fresh_seed(ctx().rank(), salt_value))))
    seeds.push_back(std::stoull(s));
  return seeds;
}

inline void* dalloc(std::uint64_t bytes) {
  void* p = nullptr;
  WEFT_CUDA(cudaMalloc(&p, bytes));
  return p;
}

inline std::uint64_t salt = 1000;  // each check draws fresh seeds

// Runs `op` once per check (`checks` of them, 2 by default) on fresh inputs;
// returns the relative error of the output against the fp32 reference, (ag)
// the gathered A's mismatched bytes, and the mode the plan was built with
// (options().mode).
struct AgResult {
  double err;
  std::uint64_t gathered_mismatch;
  OverlapMode mode;
  std::string path;  // the path that ran (path())
};
struct ReduceResult {
  double err;
  OverlapMode mode;
  std::string path;
};

inline AgResult check_ag_gemm(std::int64_t m, std::int64_t n, std::int64_t k, OverlapMode mode, Cublas& cb,
                              AgWay way = AgWay::automatic, DType t = DType::bf16, int checks = 2) {
  cudaStream_t s = test::stream();
  const int w = ctx().world_size(), me = ctx().rank();
  const std::string ts = to_string(t);
  AgGemm plan(ctx_ptr(), AgGemmOptions{.m = m, .n = n, .k = k, .dtype = t, .mode = mode, .way = way});
  const std::int64_t rows = m / w;
  void* shard = dalloc(rows * k * 2);  // not the plan's slot: exercises the copy in
  void* b = dalloc(n * k * 2);
  void* c = dalloc(m * n * 2);
  void* gathered = dalloc(m * k * 2);
  float* ref = static_cast<float*>(dalloc(m * n * 4));
  AgResult r{0, 0, OverlapMode::automatic, ""};
  for (int check = 0; check < checks; ++check) {  // later checks: new data through the same plan
    const std::vector<std::uint64_t> a_seeds = fresh_seeds(++salt);
    bench::fill_uniform(shard, rows * k, ts, a_seeds[me], s);
    bench::fill_uniform(b, n * k, ts, bench::fresh_seed(me, ++salt), s);
    bench::poison(c, m * n * 2, 0xFF, s);
    plan.run(shard, b, c, s);
    for (int p = 0; p < w; ++p)  // every rank's shard, rebuilt here
      bench::fill_uniform(static_cast<char*>(gathered) + p * rows * k * 2, rows * k, ts, a_seeds[p], s);
    reference(cb.h, t, m, n, k, gathered, b, ref);
    r.err = std::max(r.err, bench::relative_error_vs_fp32(c, ts, ref, m * n, s));
    r.gathered_mismatch += bench::count_mismatches(plan.gathered(), gathered, m * k * 2, s);
  }
  // A forced fused way runs as asked.
  if (mode == OverlapMode::fused && way != AgWay::automatic && plan.options().mode == OverlapMode::fused)
    EXPECT_EQ(plan.path(), path_name(way));
  r.mode = plan.options().mode;
  r.path = plan.path();
  ctx().synchronize(s);
  for (void* p : {shard, b, c, gathered, static_cast<void*>(ref)}) cudaFree(p);
  return r;
}

// GemmRs (all_reduce = false) or GemmAr: A [m, k], B [n, k] per rank.
inline ReduceResult check_gemm_reduce(bool all_reduce, std::int64_t m, std::int64_t n, std::int64_t k, OverlapMode mode,
                                      Cublas& cb, FusedWay way = FusedWay::automatic, DType t = DType::bf16) {
  const std::string ts = to_string(t);
  cudaStream_t s = test::stream();
  const int w = ctx().world_size(), me = ctx().rank();
  const std::int64_t out_elems = all_reduce ? m * n : m / w * n;
  std::unique_ptr<GemmRs> rs;
  std::unique_ptr<GemmAr> ar;
  if (all_reduce)
    ar = std::make_unique<GemmAr>(ctx_ptr(),
                                  GemmArOptions{.m = m, .n = n, .k = k, .dtype = t, .mode = mode, .way = way});
  else
    rs = std::make_unique<GemmRs>(ctx_ptr(),
                                  GemmRsOptions{.m = m, .n = n, .k = k, .dtype = t, .mode = mode, .way = way});
  void* a = dalloc(m * k * 2);
  void* b = dalloc(n * k * 2);
  void* a_peer = dalloc(m * k * 2);
  void* b_peer = dalloc(n * k * 2);
  SymmetricBuffer out(ctx().heap(), out_elems * 2, ts, "test.out");
  float* sum = static_cast<float*>(dalloc(m * n * 4));
  double err = 0;
  for (int check = 0; check < 2; ++check) {
    const std::vector<std::uint64_t> a_seeds = fresh_seeds(++salt), b_seeds = fresh_seeds(++salt);
    bench::fill_uniform(a, m * k, ts, a_seeds[me], s);
    bench::fill_uniform(b, n * k, ts, b_seeds[me], s);
    bench::poison(out.get(), out_elems * 2, 0xFF, s);
    if (all_reduce)
      ar->run(a, b, out.get(), s);
    else
      rs->run(a, b, out.get(), s);
    for (int p = 0; p < w; ++p) {  // the sum of every rank's GEMM, its inputs rebuilt here
      bench::fill_uniform(a_peer, m * k, ts, a_seeds[p], s);
      bench::fill_uniform(b_peer, n * k, ts, b_seeds[p], s);
      reference(cb.h, t, m, n, k, a_peer, b_peer, sum, p > 0);
    }
    const float* ref = all_reduce ? sum : sum + me * (m / w) * n;  // ReduceScatter: this rank's rows
    err = std::max(err, bench::relative_error_vs_fp32(out.get(), ts, ref, out_elems, s));
  }
  // A forced fused way runs as asked.
  const std::string path = all_reduce ? ar->path() : rs->path();
  const OverlapMode built = all_reduce ? ar->options().mode : rs->options().mode;
  if (mode == OverlapMode::fused && way != FusedWay::automatic && built == OverlapMode::fused)
    EXPECT_EQ(path, path_name(way));
  ctx().synchronize(s);
  for (void* p : {a, b, a_peer, b_peer, static_cast<void*>(sum)}) cudaFree(p);
  return {err, built, path};
}

}  // namespace weft::test::overlap
