// GEMM + AllReduce: the plan. Fused = GemmRs's ring (ring_executor.hpp) into
// our rows of `out`, each chunk of our block shipped to every peer by copy
// engine as the ring's last GEMM stores it; sequential = the GEMM, then an
// AllReduce in place. Across nodes the fused path is GemmRs's two-level steps
// into our rows of `out`, then the two-level AllGather of the summed blocks in
// place (docs/decisions/0076). path_choice.hpp picks between them on the first run.
#include "weft/ops/gemm_ar.hpp"

#include "copy_pipe.hpp"
#include "overlap.hpp"
#include "path_choice.hpp"
#include "ring_executor.hpp"
#include "schedule.hpp"
#include "two_level.hpp"
#include "weft/core/error.hpp"
#include "weft/core/nccl_type.hpp"

namespace weft {

GemmAr::GemmAr(std::shared_ptr<Context> ctx, const GemmArOptions& requested)
    : ctx_(std::move(ctx)), options_(requested) {
  const int world = ctx_->world_size();
  const GemmArOptions& o = options_;
  const ops_detail::PlanShape shape = ops_detail::require_shape("GemmAr", o.m, o.n, o.k, o.dtype);
  // The fused path is GemmRs's ring: M / W rows per rank, and rows the engine tiles.
  const GemmOptions whole = gemm_options(o.m, o.n, o.k, o.dtype, o.b_layout);
  operand_alignment_ = ops_detail::operand_alignment(whole);
  // Across nodes the fused path is GemmRs's two-level steps, then the two-level
  // AllGather, where weft::internode registered them; else only the sequential
  // path runs (its AllReduce takes the two-level schedule, or refuses below).
  const bool across_nodes = !ctx_->all_peers_direct();
  const bool two_level = across_nodes && ops_detail::two_level_collectives();
  std::string why_not_fused = two_level ? std::string() : ops_detail::across_nodes_reason(*ctx_);
  if (why_not_fused.empty()) why_not_fused = ops_detail::untileable_reason(whole);
  if (why_not_fused.empty() && o.m % world != 0)
    why_not_fused = str("M = ", o.m, " is not a multiple of the world size ", world, " (the ring's blocks)");
  options_.mode = ops_detail::runnable_mode("GemmAr", o.m, o.n, o.k, o.mode, why_not_fused);
  ctx_->verify_same_call(ops_detail::plan_description("GemmAr", o.m, o.n, o.k, o.dtype, o.b_layout, o.mode) +
                         ops_detail::across_nodes_description(*ctx_));
  ops_detail::require_sequential_across_nodes(*ctx_, "GemmAr", "AllReduce");
  WEFT_REQUIRE(!across_nodes || o.mode == OverlapMode::sequential || o.way == FusedWay::automatic, "GemmAr: ",
               path_name(o.way), " (FusedWay) walks a ring through every peer's heap, and some peers are on other ",
               "nodes (or virtual nodes): across nodes use FusedWay::automatic (\"", ops_detail::kTwoLevelStepsPath,
               "\": GemmRs's block steps, then the two-level AllGather) or OverlapMode::sequential");
  if (o.mode != OverlapMode::sequential && two_level) {
    // Our block of the sum lands in our rows of out; the AllGather brings every other block.
    two_level_rs_ = std::make_unique<GemmRs>(
        ctx_, GemmRsOptions{.m = o.m, .n = o.n, .k = o.k, .dtype = o.dtype, .b_layout = o.b_layout,
                            .mode = OverlapMode::fused, .chunks_per_block = o.chunks_per_block});
    two_level_ag_ = std::make_unique<AllGather>(
        ctx_, AllGatherOptions{.bytes_per_rank = static_cast<std::uint64_t>(o.m / world * o.n * 2),
                               .variant = AllGatherVariant::two_level});
  } else if (o.mode != OverlapMode::sequential) {
    const ops_detail::RowChunks rows = ops_detail::plan_rows("GemmAr", shape, o.chunks_per_block, *ctx_, o.n * 2,
                                                             schedule::kMinStoredChunkBytes);
    ring_ = std::make_unique<ops_detail::RingExecutor>(
        ctx_, ops_detail::RingOptions{.who = "GemmAr", .shape = shape, .b_layout = o.b_layout, .way = o.way,
                                      .rows = rows, .caller_ships = true});
    arrived_ = SymmetricBuffer(ctx_->heap(), static_cast<std::uint64_t>(world * rows.chunks * 8), "u64",
                               "gemm_ar.arrived");
  }
  choice_ = std::make_unique<ops_detail::PathChoice>(ctx_, o.mode, str("GemmAr ", o.m, " x ", o.n, " x ", o.k),
                                                     ring_ ? &ring_->tile_waits() : nullptr);
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

std::string GemmAr::path() const { return choice_->path(); }
float GemmAr::measured_fused_ms() const { return choice_->fused_ms(); }
float GemmAr::measured_sequential_ms() const { return choice_->sequential_ms(); }

std::string GemmAr::gemm_config() const {
  if (choice_->path().empty()) return "";
  if (!choice_->fused()) return plain_gemm_->config();
  return two_level_rs_ ? two_level_rs_->gemm_config() : ring_->gemm_config(ops_detail::fused_way_of(choice_->path()));
}

void GemmAr::run(const void* a, const void* b, void* out, cudaStream_t stream) {
  ops_detail::require_operands("GemmAr::run", {a, b, out}, operand_alignment_);
  WEFT_REQUIRE(ctx_->heap().contains(out, static_cast<std::uint64_t>(options_.m * options_.n * 2)),
               "GemmAr::run: out (", out, ", ", options_.m, " x ", options_.n,
               " ", to_string(options_.dtype), ") must be in the symmetric heap: peers write their blocks into it");
  if (ctx_->check_calls())
    ctx_->verify_same_call(str("GemmAr run: ", options_.m, " x ", options_.n, " x ", options_.k));
  std::vector<ops_detail::FusedPath> fused;  // a sequential plan builds none
  if (ring_) fused = ring_->paths([&](cudaStream_t s, FusedWay way) { run_fused(a, b, out, s, way); });
  if (two_level_rs_)
    fused.push_back({ops_detail::kTwoLevelStepsPath, [&](cudaStream_t s) { run_two_level_steps(a, b, out, s); }});
  choice_->run(
      stream, {a, b, out},
      [&] {  // each fused way tunes its GEMMs on its first call (before its run starts)
        if (plain_gemm_) run_sequential(a, b, out, stream, false);  // a plan that may run sequentially
      },
      fused, [&](bool nccl) { run_sequential(a, b, out, stream, nccl); });
}

void GemmAr::run_two_level_steps(const void* a, const void* b, void* out, cudaStream_t stream) {
  const std::int64_t block_bytes = options_.m / ctx_->world_size() * options_.n * 2;
  char* mine = static_cast<char*>(out) + ctx_->rank() * block_bytes;
  two_level_rs_->run(a, b, mine, stream);   // our block of the sum (it ends once that block is whole)
  two_level_ag_->run(mine, out, stream);    // in place: every block, on every rank
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
  const int world = ctx_->world_size(), me = ctx_->rank();
  const ops_detail::RingLayout& L = ring_->layout();
  char* mine = static_cast<char*>(out) + L.block_offset(me);
  auto* arrived = arrived_.as<std::uint64_t>();
  // The ring's start also tells us every peer's out is free for this run (its
  // side stream, where our sends go, waits for every peer's "free").
  // Each chunk of our block goes to every peer as soon as the ring's last step
  // has stored it, while the rest of the block computes.
  auto ship = [&](cudaStream_t side, const std::uint64_t* done, std::uint64_t done_value) {
    for (std::int64_t c = 0; c < L.chunks; ++c)
      for (int turn = 1; turn < world; ++turn) {
        const int peer = schedule::shard_push_peer(me, turn, world);
        auto* peer_arrived = static_cast<std::uint64_t*>(ctx_->heap().peer_ptr(arrived, peer));
        ops_detail::push_chunk_when_stored(ctx_->heap().peer_ptr(mine, peer), mine, L.chunk_bytes(), c, done,
                                           done_value, peer_arrived + me * L.chunks, side);
        if (ops_detail::trace::recording())
          ops_detail::trace::mark(side, str("side: own chunk ", c, " sent to ", peer));
      }
  };
  // With one launch the ring's GEMM stores every block's partial sum in out
  // (each leaves before its owner's final block arrives there); adding in one
  // launch, out is where the peer's partial sum of our block lands.
  const bool all_rows = way == FusedWay::ring_one_launch || way == FusedWay::one_launch_add;
  ring_->run(way, a, b, mine, stream, ship, all_rows ? out : nullptr);
  if (world == 1) return;
  // The wait is the flags' only reader: it zeroes them as it sees them.
  ops_detail::wait_all_and_consume(ctx_->world(), arrived, static_cast<int>(world * L.chunks),
                                   static_cast<int>(L.chunks), stream);
  ops_detail::trace::mark(stream, "every block arrived");
}

}  // namespace weft
