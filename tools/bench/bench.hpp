// bench.hpp - one entry point per benchmarked operation.
#pragma once

#include <cublas_v2.h>

#include <memory>

#include "bench_args.hpp"
#include "weft/runtime/context.hpp"

namespace weft::bench {

/// Throws weft::Error naming `what` unless cuBLAS returned success.
void require_cublas(cublasStatus_t status, const char* what);

/// weft-bench all_gather | all_reduce | reduce_scatter: every requested variant
/// against NCCL (exit code 0, or 3 if a check failed). Collective; rank 0 prints.
int bench_collective(const std::shared_ptr<Context>& ctx, const BenchArgs& args);

/// weft-bench gemm: weft's GEMM against cuBLAS on each shape, this rank's GPU
/// (exit code 0, or 3 if the result is off). Collective; rank 0 prints.
int bench_gemm(const std::shared_ptr<Context>& ctx, const BenchArgs& args);

/// weft-bench ag_gemm | gemm_rs | gemm_ar: the overlapped operator against
/// sequential NCCL + cuBLAS, the GEMM and the collective alone, and the ideal
/// bound (exit code 0, or 3 if a check failed). Collective; rank 0 prints.
int bench_overlap(const std::shared_ptr<Context>& ctx, const BenchArgs& args);

/// weft-bench ep: expert-parallel dispatch and combine alone and together, against a
/// copy-engine bound over the same bytes (exit code 0, or 3 if --check failed).
/// Collective; rank 0 prints.
int bench_ep(const std::shared_ptr<Context>& ctx, const BenchArgs& args);
/// weft-bench decode: FlashDecode on each case against the HBM copy bound
/// of the same run, this rank's GPU (exit code 0, or 3 if --check found the
/// result off). Collective; rank 0 prints.
int bench_decode(const std::shared_ptr<Context>& ctx, const BenchArgs& args);
/// weft-bench grouped_gemm: GroupedGemm on each case and routing against one
/// dense cuBLAS GEMM of the same FLOPs, this rank's GPU (exit code 0, or 3 if
/// the result is off). Collective; rank 0 prints.
int bench_grouped_gemm(const std::shared_ptr<Context>& ctx, const BenchArgs& args);
/// weft-bench moe_tp: AgMoe and MoeRs on each layer, each against its grouped
/// GEMM alone (exit code 0, or 3 if --check found the layer off). Collective; rank 0 prints.
int bench_moe_tp(const std::shared_ptr<Context>& ctx, const BenchArgs& args);

}  // namespace weft::bench
