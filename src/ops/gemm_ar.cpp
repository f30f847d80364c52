// GEMM + AllReduce: the plan. Fused = GemmRs's ring, then a copy-engine
// AllGather of the reduced blocks; the primitives are overlap.hpp's.
#include "weft/ops/gemm_ar.hpp"

#include "overlap.hpp"
#include "schedule.hpp"
#include "weft/core/error.hpp"

namespace weft {

using ops_detail::Overlap;

GemmAr::GemmAr(std::shared_ptr<Context> ctx, const GemmArOptions& requested)
    : ctx_(std::move(ctx)), options_(requested) {
  ctx_->require_direct_peers("GemmAr");  // its kernels load and store every peer's heap
  const int world = ctx_->world_size();
  const GemmArOptions& o = options_;
  const ops_detail::PlanShape shape = ops_detail::require_shape("GemmAr", o.m, o.n, o.k, o.dtype);
  // The fused path is GemmRs's ring: M / W rows per rank, and rows the engine tiles.
  const GemmOptions whole = gemm_options(o.m, o.n, o.k, o.dtype, o.b_layout);
  operand_alignment_ = ops_detail::operand_alignment(whole);
  std::string why_not_fused = ops_detail::untileable_reason(whole);
  if (why_not_fused.empty() && o.m % world != 0)
    why_not_fused = str("M = ", o.m, " is not a multiple of the world size ", world, " (the ring's blocks)");
  options_.mode = ops_detail::runnable_mode("GemmAr", o.m, o.n, o.k, o.mode, why_not_fused);
  if (o.mode != OverlapMode::sequential) {
    const ops_detail::RowChunks rows = ops_detail::plan_rows("GemmAr", shape, o.chunks_per_block, world, o.n * 2,
                                                             schedule::kMinStoredChunkBytes);
    block_rows_ = rows.rows_per_rank;
    chunks_ = rows.chunks;
    chunk_rows_ = rows.chunk_rows;
  }
  ctx_->verify_same_call(ops_detail::plan_description("GemmAr", o.m, o.n, o.k, o.dtype, o.b_layout, o.mode));
  overlap_ = std::make_unique<Overlap>(ctx_, "gemm_ar", o.mode, str("GemmAr ", o.m, " x ", o.n, " x ", o.k));
  if (o.mode != OverlapMode::sequential) {
    reduce_ = std::make_unique<GemmRs>(ctx_, GemmRsOptions{.m = o.m, .n = o.n, .k = o.k, .dtype = o.dtype,
                                                           .b_layout = o.b_layout, .mode = OverlapMode::fused,
                                                           .chunks_per_block = o.chunks_per_block,
                                                           .way = o.way});
    arrived_ = SymmetricBuffer(ctx_->heap(), static_cast<std::uint64_t>(world * chunks_ * 8), "u64",
                               "gemm_ar.arrived");
  }
  if (o.mode != OverlapMode::fused) {
    GemmOptions g = whole;
    g.allow_cublas = true;  // unhooked: cuBLAS where it is faster
    g.agree = ops_detail::slowest_rank(ctx_);
    plain_gemm_ = std::make_unique<Gemm>(g);
    all_reduce_ = std::make_unique<AllReduce>(
        ctx_, AllReduceOptions{.count = static_cast<std::uint64_t>(o.m * o.n), .dtype = o.dtype});
  }
}

GemmAr::~GemmAr() = default;

std::string GemmAr::path() const { return overlap_->path(); }
float GemmAr::measured_fused_ms() const { return overlap_->fused_ms(); }
float GemmAr::measured_sequential_ms() const { return overlap_->sequential_ms(); }

std::string GemmAr::gemm_config() const {
  if (overlap_->path().empty()) return "";
  return overlap_->fused() ? reduce_->fused_gemm_config(ops_detail::fused_way_of(overlap_->path()))
                            : plain_gemm_->config();
}

void GemmAr::run(const void* a, const void* b, void* out, cudaStream_t stream) {
  ops_detail::require_operands("GemmAr::run", {a, b, out}, operand_alignment_);
  WEFT_REQUIRE(ctx_->heap().contains(out, static_cast<std::uint64_t>(options_.m * options_.n * 2)),
               "GemmAr::run: out (", out, ", ", options_.m, " x ", options_.n,
               " ", to_string(options_.dtype), ") must be in the symmetric heap: peers write their blocks into it");
  if (ctx_->check_calls())
    ctx_->verify_same_call(str("GemmAr run: ", options_.m, " x ", options_.n, " x ", options_.k));
  overlap_->run(
      stream, {a, b, out},
      [&] {  // each fused way tunes its GEMMs on its first call (before its run starts)
        if (plain_gemm_) run_sequential(a, b, out, stream, false);  // a plan that may run sequentially
      },
      reduce_ ? ops_detail::fused_ways(*reduce_, [&](cudaStream_t s, FusedWay way) { run_fused(a, b, out, s, way); })
              : std::vector<Overlap::Fused>{},  // a sequential plan builds no ring
      [&](bool nccl) { run_sequential(a, b, out, stream, nccl); });
}

void GemmAr::run_sequential(const void* a, const void* b, void* out, cudaStream_t stream, bool nccl) {
  plain_gemm_->run(a, b, out, stream);
  if (nccl)
    WEFT_NCCL(ncclAllReduce(out, out, static_cast<std::size_t>(options_.m * options_.n), nccl_type(options_.dtype), ncclSum,
                            ctx_->nccl(), stream));
  else
    all_reduce_->run(out, out, stream);
}

void GemmAr::run_fused(const void* a, const void* b, void* out, cudaStream_t stream, FusedWay way) {
  const bool one_launch = way == FusedWay::ring_one_launch;
  const int world = ctx_->world_size(), me = ctx_->rank();
  const std::uint64_t chunk_bytes = static_cast<std::uint64_t>(chunk_rows_ * options_.n * 2);
  char* mine = static_cast<char*>(out) + me * chunks_ * chunk_bytes;
  auto* arrived = arrived_.as<std::uint64_t>();
  // GemmRs's start also tells us every peer's out is free for this run (its
  // side stream, where our sends go, waits for every peer's "free").
  // Each chunk of our block goes to every peer as soon as the ring's last step
  // has stored it, while the rest of the block computes.
  // With one launch the ring's GEMM stores every block's partial sum in out
  // (each leaves before its owner's final block arrives there); adding in one
  // launch, out is where the peer's partial sum of our block lands.
  reduce_->run_fused(a, b, mine, stream, way, [&](cudaStream_t side, const std::uint64_t* done, std::uint64_t done_value) {
    for (std::int64_t c = 0; c < chunks_; ++c)
      for (int turn = 1; turn < world; ++turn) {
        const int peer = schedule::shard_push_peer(me, turn, world);
        auto* peer_arrived = static_cast<std::uint64_t*>(ctx_->heap().peer_ptr(arrived, peer));
        Overlap::push_chunk_when_stored(ctx_->heap().peer_ptr(mine, peer), mine, chunk_bytes, c, done, done_value,
                                        peer_arrived + me * chunks_, side);
        if (Overlap::recording()) Overlap::mark(side, str("side: own chunk ", c, " sent to ", peer));
      }
  }, one_launch || way == FusedWay::one_launch_add ? out : nullptr);
  if (world == 1) return;
  // The wait is the flags' only reader: it zeroes them as it sees them (no
  // reset after it), unless WEFT_FLAG_RESET=memset asks for the old way.
  const bool memset = overlap_->resets_by_memset();
  overlap_->wait_all(arrived, static_cast<int>(world * chunks_), static_cast<int>(chunks_), stream, !memset);
  Overlap::mark(stream, "every block arrived");
  if (memset) Overlap::reset_flags(arrived, static_cast<int>(world * chunks_), stream);
}

}  // namespace weft
