#include "overlap.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "schedule.hpp"
#include "two_level.hpp"
#include "weft/core/error.hpp"
#include "weft/core/log.hpp"

namespace weft::ops_detail {

void max_over_ranks(Store& store, std::vector<float>& values, const char* what) {
  const std::string mine(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  const std::vector<std::string> all = store.all_gather(mine, what);
  if (std::any_of(all.begin(), all.end(), [&](const std::string& b) { return b.size() != mine.size(); })) {
    std::string counts;  // the same text on every rank
    for (std::size_t r = 0; r < all.size(); ++r)
      counts += str(r ? ", " : "", "rank ", r, " ", all[r].size() / sizeof(float));
    WEFT_FAIL(what, ": the ranks gave different numbers of values (", counts, "); they must make the same call");
  }
  for (const std::string& theirs : all)
    for (std::size_t i = 0; i < values.size(); ++i) {
      float v = 0;
      std::memcpy(&v, theirs.data() + i * sizeof(float), sizeof(float));
      values[i] = std::max(values[i], v);
    }
}

std::function<void(std::vector<float>&)> slowest_rank(std::shared_ptr<Context> ctx) {
  return [ctx](std::vector<float>& ms) { max_over_ranks(ctx->store(), ms, "GEMM tuning timings"); };
}

int sms_beside_copies(const Context& ctx) {
  if (!ctx.team().shares_gpus()) return 0;
  return std::max(2, ctx.team().sm_count / 2 / 2 * 2);  // whole clusters of 2
}

PlanShape require_shape(const char* who, std::int64_t m, std::int64_t n, std::int64_t k, DType dtype) {
  WEFT_REQUIRE(m > 0 && n > 0 && k > 0, who, ": M, N, K must be positive, got ", m, " x ", n, " x ", k);
  WEFT_REQUIRE(dtype == DType::bf16 || dtype == DType::fp16, who,
               ": dtype must be bf16 or fp16 (the hooked GEMM kernels' types), got ", to_string(dtype));
  return {m, n, k, dtype};
}

RowChunks plan_rows(const char* who, const PlanShape& shape, int chunks_wanted, const Context& ctx,
                    std::int64_t row_bytes, std::int64_t min_chunk_bytes) {
  const std::int64_t m = shape.m;
  const int world = ctx.world_size();
  WEFT_REQUIRE(m % world == 0, who, ": M = ", m, " must be a multiple of the world size ", world,
               " (each rank owns M / W rows)");
  WEFT_REQUIRE(chunks_wanted >= 1, who, ": chunks per rank must be >= 1, got ", chunks_wanted);
  RowChunks r;
  r.rows_per_rank = m / world;
  // WEFT_OVERLAP_MIN_CHUNK overrides the plan's floor, for measuring chunk sizes.
  const std::optional<std::uint64_t>& setting = ctx.settings().overlap_min_chunk;
  const std::int64_t min_chunk = setting ? static_cast<std::int64_t>(*setting) : min_chunk_bytes;
  r.chunks = schedule::copy_chunks(r.rows_per_rank, row_bytes, chunks_wanted, min_chunk);
  r.chunk_rows = r.rows_per_rank / r.chunks;
  return r;
}

std::string untileable_reason(const GemmOptions& g) {
  std::string why;
  Gemm::can_tile(g, &why);
  return why;
}

std::string across_nodes_reason(const Context& ctx) {
  if (ctx.all_peers_direct()) return "";
  return "some peers have no address here (other nodes, or virtual nodes): the fused path loads and stores every "
         "peer's heap, and its two-level schedule is not built";
}

std::string across_nodes_description(const Context& ctx) {
  return ctx.all_peers_direct() ? std::string() : str(", across nodes", two_level_readiness());
}

void require_sequential_across_nodes(const Context& ctx, const char* who, const char* collective) {
  if (ctx.all_peers_direct() || two_level_collectives()) return;
  WEFT_FAIL(who, ": some peers are on other nodes (or virtual nodes), so it runs its sequential path, whose ",
            collective, " reaches them only through NVSHMEM's put/get, ", two_level_remedy(collective));
}

OverlapMode runnable_mode(const char* who, std::int64_t m, std::int64_t n, std::int64_t k, OverlapMode requested,
                          const std::string& why_not_fused) {
  if (why_not_fused.empty() || requested == OverlapMode::sequential) return requested;
  WEFT_LOG(info, who, " ", m, " x ", n, " x ", k, ": ", why_not_fused, "; runs the sequential path (cuBLAS and the collective)");
  return OverlapMode::sequential;
}

std::string plan_description(const char* who, std::int64_t m, std::int64_t n, std::int64_t k, DType dtype,
                             BLayout layout, OverlapMode mode) {
  return str(who, " plan: ", m, " x ", n, " x ", k, " ", to_string(dtype), ", B ",
             layout == BLayout::nk ? "[N,K]" : "[K,N]", ", ", to_string(mode));
}

void require_operands(const char* who, std::initializer_list<const void*> operands, unsigned alignment) {
  for (const void* p : operands) {
    WEFT_REQUIRE(p, who, ": every operand must be a device pointer, got a null one");
    WEFT_REQUIRE(reinterpret_cast<std::uintptr_t>(p) % alignment == 0, who, ": ", p, " is not ", alignment,
                 "-byte aligned", alignment == 16 ? " (TMA needs 16-byte aligned matrices)" : " (one element)");
  }
}

}  // namespace weft::ops_detail
