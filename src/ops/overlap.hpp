// overlap.hpp (private) - what the overlapped operators (AgGemm, GemmRs, GemmAr)
// check and decide at construction: the shape, the row split into chunks, the
// path an untileable shape takes, the GEMMs' SM budget and how ranks agree on
// a tuning. Their run-time parts are copy_pipe.hpp (the copy engines),
// path_choice.hpp (which path runs, through graph_cache.hpp) and trace.hpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "schedule.hpp"
#include "weft/gemm/gemm.hpp"
#include "weft/ops/collective.hpp"
#include "weft/runtime/context.hpp"

namespace weft::ops_detail {

/// How a plan's rows split: rows per rank, and those rows in equal chunks
/// (the copy and signal unit).
struct RowChunks {
  std::int64_t rows_per_rank, chunks, chunk_rows;
};

/// An overlapped plan's shape and type, as require_shape checked them.
struct PlanShape {
  std::int64_t m, n, k;
  DType dtype;
};

/// The checks every overlapped plan makes at construction: positive M, N, K;
/// bf16 or fp16 (the hooked kernels' types). Throws naming `who`; returns the
/// shape it checked.
PlanShape require_shape(const char* who, std::int64_t m, std::int64_t n, std::int64_t k, DType dtype);

/// For a shape require_shape checked: M a multiple of `ctx`'s world size;
/// chunks_wanted >= 1. Throws naming `who`. Returns the row split: rows of
/// `row_bytes` bytes in schedule::copy_chunks chunks (at most chunks_wanted,
/// none under min_chunk_bytes, or under Settings::overlap_min_chunk where set, equal rows).
RowChunks plan_rows(const char* who, const PlanShape& shape, int chunks_wanted, const Context& ctx,
                    std::int64_t row_bytes, std::int64_t min_chunk_bytes = schedule::kMinChunkBytes);

/// Why the GEMM engine cannot tile the plan's GEMM `g` ("" where it can;
/// Gemm::can_tile's rule: for 2-byte elements, K and N multiples of 8). Such
/// plans run their sequential path on cuBLAS (which takes any K) and say so
/// once, at info level: an overlapped operator never refuses a shape cuBLAS and
/// the collective can compute.
std::string untileable_reason(const GemmOptions& g);

/// Why the fused path cannot run on the context's ranks ("" where every peer's
/// heap is mapped here): across nodes (or virtual nodes) the fused paths'
/// copies and kernels, which load and store every peer's heap, cannot, and
/// their two-level schedules are not built. Such plans run their sequential
/// path: the GEMM and the collective, on its two-level schedule
/// (weft::internode, while a weft::RemotePeers is alive; docs/decisions/0073).
std::string across_nodes_reason(const Context& ctx);
/// The fused path across nodes of GemmRs (a GEMM per block beside the two-level
/// ReduceScatter after stores, docs/decisions/0075) and of GemmAr (those steps,
/// then the two-level AllGather of the summed blocks, 0076).
inline constexpr const char* kTwoLevelStepsPath = "fused, two-level steps";
/// ", across nodes" and whether the two-level schedules are at hand, for the
/// plan description the ranks compare (verify_same_call); "" on one node.
std::string across_nodes_description(const Context& ctx);
/// Across nodes with no two-level schedule at hand (weft::internode not linked,
/// or no weft::RemotePeers alive): throws, naming `who` and its sequential
/// path's `collective`, and the remedy. Call it after the ranks agreed on a
/// description carrying across_nodes_description, so that all throw alike.
void require_sequential_across_nodes(const Context& ctx, const char* who, const char* collective);

/// The alignment the operands of a plan whose GEMM is `g` need: 16 bytes where
/// weft's kernels may run (TMA), one element where the shape leaves cuBLAS
/// alone (Gemm::can_tile).
inline unsigned operand_alignment(const GemmOptions& g) {
  return Gemm::can_tile(g) ? 16 : static_cast<unsigned>(dtype_size(g.input));
}

/// The mode a plan runs in: `requested`, or sequential where `why_not_fused` is not
/// empty (logged once, at info, naming `who`, the shape and the reason).
OverlapMode runnable_mode(const char* who, std::int64_t m, std::int64_t n, std::int64_t k, OverlapMode requested,
                          const std::string& why_not_fused);

/// "AgGemm plan: 8192 x 14336 x 8192 bf16, B [N,K], auto": what the ranks compare (verify_same_call).
std::string plan_description(const char* who, std::int64_t m, std::int64_t n, std::int64_t k, DType dtype,
                             BLayout layout, OverlapMode mode);

/// Replaces each of `values` by its maximum over the ranks of `store` (one
/// all_gather). Collective; every rank passes as many values, else every
/// rank throws naming each rank's count. `what` names the exchange in errors.
void max_over_ranks(Store& store, std::vector<float>& values, const char* what);

/// GemmOptions::agree for a plan's GEMMs: max_over_ranks of the tuning
/// timings through the context's store, so every rank runs the same
/// configuration, picked by the slowest rank's time. Collective.
std::function<void(std::vector<float>&)> slowest_rank(std::shared_ptr<Context> ctx);

/// GemmOptions::max_sms for the GEMMs of a plan whose tiles wait for rows
/// that other ranks' GEMMs produce and copies carry. Between GPUs the copies
/// run on copy engines (weft-copy-probe) and each GEMM has its GPU: every SM
/// (0). Where ranks share a GPU, two things change. A copy into a peer's
/// buffer stays within the GPU and runs as a kernel (weft-copy-probe at 2
/// ranks on one H200: it waits for SMs), so it needs SMs the waiting tiles do
/// not hold. And a persistent GEMM assigns its tiles to its CTAs up front, so
/// a CTA that never becomes resident stalls every rank downstream of its
/// tiles: all the ranks' GEMMs must be resident at once, placed as clusters
/// of 2 SMs among SMs that copies and other ranks' kernels also take. So the
/// GEMMs keep to half the rank's share (Team::sm_count), the rest left to
/// copies and to the slack that cluster placement needs.
int sms_beside_copies(const Context& ctx);

/// Every operand non-null and `alignment`-byte aligned (16: TMA's requirement;
/// 2, an element, for plans that run cuBLAS only), checked before a run starts
/// any collective work; throws naming `who` and the pointer.
void require_operands(const char* who, std::initializer_list<const void*> operands, unsigned alignment = 16);

}  // namespace weft::ops_detail
