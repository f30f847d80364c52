// GEMM + ReduceScatter: the plan. Fused: the ring (ring_plan.hpp says each
// way's steps, ring_executor.hpp enqueues them, the kernels are weft::Gemm's
// hooked ones); sequential: the GEMM, then weft's or NCCL's ReduceScatter.
// path_choice.hpp picks between them on the first run.
#include "weft/ops/gemm_rs.hpp"

#include "overlap.hpp"
#include "path_choice.hpp"
#include "ring_executor.hpp"
#include "schedule.hpp"
#include "weft/core/error.hpp"
#include "weft/core/nccl_type.hpp"

namespace weft {

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
  // Across nodes only the sequential path runs (its ReduceScatter takes the two-level schedule).
  std::string why_not_fused = ops_detail::across_nodes_reason(*ctx_);
  if (why_not_fused.empty()) why_not_fused = ops_detail::untileable_reason(whole);
  options_.mode = ops_detail::runnable_mode("GemmRs", o.m, o.n, o.k, o.mode, why_not_fused);
  const ops_detail::RowChunks rows = ops_detail::plan_rows("GemmRs", shape, o.chunks_per_block, *ctx_, o.n * 2,
                                                           schedule::kMinStoredChunkBytes);
  block_rows_ = rows.rows_per_rank;
  ctx_->verify_same_call(ops_detail::plan_description("GemmRs", o.m, o.n, o.k, o.dtype, o.b_layout, o.mode) +
                         ops_detail::across_nodes_description(*ctx_));
  ops_detail::require_sequential_across_nodes(*ctx_, "GemmRs", "ReduceScatter");
  if (o.mode != OverlapMode::sequential)
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
}

GemmRs::~GemmRs() = default;

std::string GemmRs::path() const { return choice_->path(); }
float GemmRs::measured_fused_ms() const { return choice_->fused_ms(); }
float GemmRs::measured_sequential_ms() const { return choice_->sequential_ms(); }

std::string GemmRs::gemm_config() const {
  if (choice_->path().empty()) return "";
  return choice_->fused() ? fused_gemm_config(ops_detail::fused_way_of(choice_->path())) : plain_gemm_->config();
}

bool GemmRs::builds(FusedWay way) const { return ring_ && ring_->builds(way); }

std::string GemmRs::fused_gemm_config(FusedWay way) const { return ring_ ? ring_->gemm_config(way) : ""; }

void GemmRs::run(const void* a, const void* b, void* out, cudaStream_t stream) {
  ops_detail::require_operands("GemmRs::run", {a, b, out}, operand_alignment_);
  if (ctx_->check_calls())
    ctx_->verify_same_call(str("GemmRs run: ", options_.m, " x ", options_.n, " x ", options_.k));
  choice_->run(
      stream, {a, b, out},
      [&] {  // each fused way tunes its GEMMs on its first call (before its run starts)
        if (plain_gemm_) run_sequential(a, b, out, stream, false);  // a plan that may run sequentially
      },
      ring_ ? ring_->paths([&](cudaStream_t s, FusedWay way) { ring_->run(way, a, b, out, s); })
            : std::vector<ops_detail::FusedPath>{},
      [&](bool nccl) { run_sequential(a, b, out, stream, nccl); });
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
