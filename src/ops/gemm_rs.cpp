// GEMM + ReduceScatter: the plan. Fused: the ring (ring_plan.hpp says each
// way's steps, ring_executor.hpp enqueues them, the kernels are weft::Gemm's
// hooked ones); sequential: the GEMM, then weft's or NCCL's ReduceScatter.
// Across nodes the fused path is a GEMM per block beside weft::internode's
// two-level ReduceScatter after stores (two_level.hpp; docs/decisions/0075).
// path_choice.hpp picks between them on the first run.
#include "weft/ops/gemm_rs.hpp"

#include <algorithm>

#include "copy_pipe.hpp"
#include "overlap.hpp"
#include "path_choice.hpp"
#include "ring_executor.hpp"
#include "schedule.hpp"
#include "trace.hpp"
#include "two_level.hpp"
#include "weft/core/error.hpp"
#include "weft/core/nccl_type.hpp"

namespace weft {

namespace trace = ops_detail::trace;

namespace {
// Across nodes, the thread blocks of the fused path's ReduceScatter kernel;
// the block GEMMs take the rest of the rank's SMs. Its rail puts are NVSHMEM
// block puts (the NIC's pace, not the SMs'), its sums and NVLink pushes SM
// work. A starting point, to be measured on two nodes.
constexpr int kTwoLevelRsBlocks = 8;
}  // namespace

const char* path_name(FusedWay way) {
  switch (way) {
    case FusedWay::ring_per_step: return "fused";
    case FusedWay::ring_one_launch: return "fused, one launch";
    case FusedWay::ring_plain_first: return "fused, plain first step";
    case FusedWay::one_launch_add: return "fused, one launch, adding";
    case FusedWay::automatic: break;
  }
  return "fused, automatic";
}

GemmRs::GemmRs(std::shared_ptr<Context> ctx, const GemmRsOptions& requested)
    : ctx_(std::move(ctx)), options_(requested) {
  const GemmRsOptions& o = options_;
  const ops_detail::PlanShape shape = ops_detail::require_shape("GemmRs", o.m, o.n, o.k, o.dtype);
  const GemmOptions whole = gemm_options(o.m, o.n, o.k, o.dtype, o.b_layout);
  operand_alignment_ = ops_detail::operand_alignment(whole);
  // Across nodes the fused path is block GEMMs beside the two-level
  // ReduceScatter after stores, where weft::internode registered it; else only
  // the sequential path runs (its ReduceScatter takes the two-level schedule,
  // or refuses below).
  const bool across_nodes = !ctx_->all_peers_direct();
  const ops_detail::TwoLevelCollectives* two_level = across_nodes ? ops_detail::two_level_collectives() : nullptr;
  std::string why_not_fused = two_level ? std::string() : ops_detail::across_nodes_reason(*ctx_);
  if (why_not_fused.empty()) why_not_fused = ops_detail::untileable_reason(whole);
  options_.mode = ops_detail::runnable_mode("GemmRs", o.m, o.n, o.k, o.mode, why_not_fused);
  const ops_detail::RowChunks rows = ops_detail::plan_rows("GemmRs", shape, o.chunks_per_block, *ctx_, o.n * 2,
                                                           schedule::kMinStoredChunkBytes);
  block_rows_ = rows.rows_per_rank;
  ctx_->verify_same_call(ops_detail::plan_description("GemmRs", o.m, o.n, o.k, o.dtype, o.b_layout, o.mode) +
                         ops_detail::across_nodes_description(*ctx_));
  ops_detail::require_sequential_across_nodes(*ctx_, "GemmRs", "ReduceScatter");
  WEFT_REQUIRE(!across_nodes || o.mode == OverlapMode::sequential || o.way == FusedWay::automatic, "GemmRs: ",
               path_name(o.way), " (FusedWay) walks a ring through every peer's heap, and some peers are on other ",
               "nodes (or virtual nodes): across nodes use FusedWay::automatic (\"", ops_detail::kTwoLevelStepsPath,
               "\": block GEMMs beside the two-level ReduceScatter) or OverlapMode::sequential");
  if (o.mode != OverlapMode::sequential && two_level) {
    const hierarchy::NodeGrid grid = ops_detail::two_level_grid(*ctx_, "GemmRs");
    for (int t = 0; t < grid.world(); ++t) block_order_.push_back(hierarchy::rs_block(grid, ctx_->rank(), t));
    rs_after_stores_ = two_level->rs_after_stores(*ctx_, static_cast<std::uint64_t>(block_rows_ * o.n), o.dtype,
                                                  kTwoLevelRsBlocks);
    GemmOptions block = whole;
    block.m = block_rows_;
    block.allow_cublas = true;  // unhooked: cuBLAS where it is faster
    block.agree = ops_detail::slowest_rank(ctx_);
    const int beside = ops_detail::sms_beside_copies(*ctx_);
    const int share = beside > 0 ? beside : ctx_->team().sm_count;
    block.max_sms = std::max(2, (share - rs_after_stores_->blocks()) / 2 * 2);  // whole clusters of 2
    block_gemm_ = std::make_unique<Gemm>(block);
    stored_ = SymmetricBuffer(ctx_->heap(), static_cast<std::uint64_t>(ctx_->world_size()) * 8, "u64",
                              "gemm_rs.stored");
    pipe_ = std::make_unique<ops_detail::CopyPipe>(ctx_, "gemm_rs.two_level");
  } else if (o.mode != OverlapMode::sequential)
    ring_ = std::make_unique<ops_detail::RingExecutor>(
        ctx_, ops_detail::RingOptions{.who = "GemmRs", .shape = shape, .b_layout = o.b_layout, .way = o.way,
                                      .rows = rows});
  choice_ = std::make_unique<ops_detail::PathChoice>(ctx_, o.mode, str("GemmRs ", o.m, " x ", o.n, " x ", o.k),
                                                     ring_ ? &ring_->tile_waits() : nullptr);
  if (o.mode != OverlapMode::fused) {
    GemmOptions g = whole;
    g.allow_cublas = true;  // unhooked: cuBLAS where it is faster
    g.agree = ops_detail::slowest_rank(ctx_);
    g.max_sms = ops_detail::sms_beside_copies(*ctx_);
    plain_gemm_ = std::make_unique<Gemm>(g);
    partial_ = SymmetricBuffer(ctx_->heap(), static_cast<std::uint64_t>(o.m * o.n * 2), to_string(o.dtype),
                               "gemm_rs.partial");
    reduce_scatter_ = std::make_unique<ReduceScatter>(
        ctx_, ReduceScatterOptions{.count = static_cast<std::uint64_t>(block_rows_ * o.n), .dtype = o.dtype});
  }
  if (block_gemm_ && !plain_gemm_)  // across nodes, fused only: the block GEMMs' partials
    partial_ = SymmetricBuffer(ctx_->heap(), static_cast<std::uint64_t>(o.m * o.n * 2), to_string(o.dtype),
                               "gemm_rs.partial");
}

GemmRs::~GemmRs() = default;

std::string GemmRs::path() const { return choice_->path(); }
float GemmRs::measured_fused_ms() const { return choice_->fused_ms(); }
float GemmRs::measured_sequential_ms() const { return choice_->sequential_ms(); }

std::string GemmRs::gemm_config() const {
  if (choice_->path().empty()) return "";
  if (!choice_->fused()) return plain_gemm_->config();
  return block_gemm_ ? block_gemm_->config() : fused_gemm_config(ops_detail::fused_way_of(choice_->path()));
}

bool GemmRs::builds(FusedWay way) const { return ring_ && ring_->builds(way); }

std::string GemmRs::fused_gemm_config(FusedWay way) const { return ring_ ? ring_->gemm_config(way) : ""; }

void GemmRs::run(const void* a, const void* b, void* out, cudaStream_t stream) {
  ops_detail::require_operands("GemmRs::run", {a, b, out}, operand_alignment_);
  if (ctx_->check_calls())
    ctx_->verify_same_call(str("GemmRs run: ", options_.m, " x ", options_.n, " x ", options_.k));
  std::vector<ops_detail::FusedPath> fused;
  if (ring_) fused = ring_->paths([&](cudaStream_t s, FusedWay way) { ring_->run(way, a, b, out, s); });
  if (block_gemm_)
    fused.push_back({ops_detail::kTwoLevelStepsPath, [&](cudaStream_t s) { run_two_level_steps(a, b, out, s); }});
  choice_->run(
      stream, {a, b, out},
      [&] {  // each fused way tunes its GEMMs on its first call (before its run starts)
        if (plain_gemm_) run_sequential(a, b, out, stream, false);  // a plan that may run sequentially
      },
      fused, [&](bool nccl) { run_sequential(a, b, out, stream, nccl); });
}

void GemmRs::run_two_level_steps(const void* a, const void* b, void* out, cudaStream_t stream) {
  const std::int64_t k = options_.k, n = options_.n;
  auto block_args = [&](int q) {
    return GemmArgs{.a = static_cast<const char*>(a) + q * block_rows_ * k * 2,
                    .b = b,
                    .c = partial_.as<char>() + q * block_rows_ * n * 2};
  };
  // Tune (first run only) before the run starts, so no peer's ReduceScatter
  // waits on a tuning rank.
  if (!block_gemm_->prepared()) block_gemm_->prepare(block_args(block_order_.front()), stream);
  auto* stored = stored_.as<std::uint64_t>();
  // The words go back to 0 before the side stream forks: the last run's
  // ReduceScatter, which read them, was joined into `stream` at its end.
  ops_detail::reset_flags(stored, static_cast<int>(block_order_.size()), stream);
  rs_after_stores_->run(partial_.get(), out, stored, pipe_->fork(stream));
  trace::mark(stream, "start");
  for (const int q : block_order_) {
    block_gemm_->run(block_args(q), stream);
    ops_detail::raise_flag_when_done(stored, q, stream);
    if (trace::recording()) trace::mark(stream, str("GEMM (block ", q, ")"));
  }
  pipe_->join(stream);  // the ReduceScatter is done: `out` is whole, partial_ free
}

void GemmRs::run_sequential(const void* a, const void* b, void* out, cudaStream_t stream, bool nccl) {
  plain_gemm_->run(a, b, partial_.get(), stream);
  if (nccl)
    WEFT_NCCL(ncclReduceScatter(partial_.get(), out, static_cast<std::size_t>(block_rows_ * options_.n),
                                nccl_type(options_.dtype), ncclSum, ctx_->nccl(), stream));
  else
    reduce_scatter_->run(partial_.get(), out, stream);
}

}  // namespace weft
