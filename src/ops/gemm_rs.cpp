// GEMM + ReduceScatter: the plan. The kernels are weft::Gemm, the steps after
// the first with the wait_source_rows hook (src/gemm/tile_hooks.cuh); the
// primitives are overlap.hpp's, the ring order schedule.hpp's.
#include "weft/ops/gemm_rs.hpp"

#include "../gemm/row_bands.hpp"
#include "overlap.hpp"
#include "schedule.hpp"
#include "weft/core/error.hpp"

namespace weft {

using ops_detail::Overlap;

GemmRs::GemmRs(std::shared_ptr<Context> ctx, const GemmRsOptions& o) : ctx_(std::move(ctx)), options_(o) {
  const int world = ctx_->world_size();
  // Chunks only count the rows of our own block stored, for a caller that
  // copies it on (GemmAr); the ring signals in bands.
  const ops_detail::RowChunks rows = ops_detail::plan_rows("GemmRs", o.m, o.n, o.k, o.dtype, o.chunks_per_block, world,
                                                              o.n * 2, schedule::kMinOwnBlockChunkBytes);
  block_rows_ = rows.rows_per_rank;
  chunks_ = rows.chunks;
  chunk_rows_ = rows.chunk_rows;
  bands_ = schedule::ring_bands(block_rows_);
  band_rows_ = block_rows_ / bands_;
  ctx_->verify_same_call(ops_detail::plan_description("GemmRs", o.m, o.n, o.k, o.dtype, o.b_layout, o.mode));
  overlap_ = std::make_unique<Overlap>(ctx_, "gemm_rs", o.mode, str("GemmRs ", o.m, " x ", o.n, " x ", o.k));
  const std::uint64_t block_bytes = static_cast<std::uint64_t>(block_rows_ * o.n * 2);
  const int steps = world - 1;
  GemmOptions g = gemm_options(block_rows_, o.n, o.k, o.dtype, o.b_layout);
  g.allow_cublas = true;  // unhooked GEMMs take cuBLAS where it is faster
  if (o.mode != OverlapMode::sequential) {
    GemmOptions first = g;
    if (steps > 0) first.hook = GemmHook::report_rows;  // rank + 1 waits for its stored rows
    first_gemm_ = std::make_unique<Gemm>(first);
    if (steps > 0) {
      send_ = SymmetricBuffer(ctx_->heap(), steps * block_bytes, "bf16", "gemm_rs.send");
      arrived_ = SymmetricBuffer(ctx_->heap(), static_cast<std::uint64_t>((steps * bands_ + chunks_) * 8), "u64",
                                 "gemm_rs.arrived");
      GemmOptions hooked = g;
      hooked.hook = GemmHook::wait_source_rows;
      step_gemm_ = std::make_unique<Gemm>(hooked);
    }
  }
  if (o.mode != OverlapMode::fused) {
    GemmOptions whole = g;
    whole.m = o.m;
    plain_gemm_ = std::make_unique<Gemm>(whole);
    partial_ = SymmetricBuffer(ctx_->heap(), static_cast<std::uint64_t>(o.m * o.n * 2), "bf16", "gemm_rs.partial");
    reduce_scatter_ = std::make_unique<ReduceScatter>(
        ctx_, ReduceScatterOptions{.count = static_cast<std::uint64_t>(block_rows_ * o.n), .dtype = o.dtype});
  }
}

GemmRs::~GemmRs() = default;

std::string GemmRs::path() const { return overlap_->path(); }
float GemmRs::measured_fused_ms() const { return overlap_->fused_ms(); }
float GemmRs::measured_sequential_ms() const { return overlap_->sequential_ms(); }

std::string GemmRs::gemm_config() const {
  if (overlap_->path().empty()) return "";
  if (!overlap_->fused()) return plain_gemm_->config();
  if (!step_gemm_) return first_gemm_->config();
  return str(first_gemm_->config(), "; then ", step_gemm_->config());
}

void GemmRs::run(const void* a, const void* b, void* out, cudaStream_t stream) {
  ops_detail::require_operands("GemmRs::run", {a, b, out});
  if (ctx_->check_calls())
    ctx_->verify_same_call(str("GemmRs run: ", options_.m, " x ", options_.n, " x ", options_.k));
  overlap_->run(
      stream, {a, b, out},
      [&] {
        run_sequential(a, b, out, stream, false);
        run_fused(a, b, out, stream);  // tunes its GEMMs (before its handshake), then runs
      },
      [&](cudaStream_t s) { run_fused(a, b, out, s); }, [&](bool nccl) { run_sequential(a, b, out, stream, nccl); });
}

void GemmRs::run_sequential(const void* a, const void* b, void* out, cudaStream_t stream, bool nccl) {
  plain_gemm_->run(a, b, partial_.get(), stream);
  if (nccl)
    WEFT_NCCL(ncclReduceScatter(partial_.get(), out, static_cast<std::size_t>(options_.m / ctx_->world_size() * options_.n),
                                ncclBfloat16, ncclSum, ctx_->nccl(), stream));
  else
    reduce_scatter_->run(partial_.get(), out, stream);
}

void GemmRs::run_fused(const void* a, const void* b, void* out, cudaStream_t stream,
                       const OwnBlockStored& own_block_stored) {
  const int world = ctx_->world_size(), me = ctx_->rank();
  const std::int64_t n = options_.n, k = options_.k;
  const std::uint64_t block_bytes = static_cast<std::uint64_t>(block_rows_ * n * 2);
  auto block_of_a = [&](int blk) { return static_cast<const char*>(a) + blk * block_rows_ * k * 2; };
  const int steps = world - 1;
  if (steps == 0) {
    first_gemm_->run(a, b, out, stream);
    return;
  }
  const int prev = schedule::wrap(me - 1, world);
  // Step s's GEMM stores its block into our send(s) and counts the rows it
  // stored per band (about 128 rows) once the stores are complete
  // (weft::RowsDone). Rank + 1's step s + 1 reads it from here: its epilogue
  // waits for a tile's band, then loads the tile's source rows from our send(s)
  // over NVLink (TMA loads from the peer's mapping), while the tile's
  // mainloop runs. No copy engine, no per-chunk cost, and every store stays local.
  auto send = [&](int step) { return send_.as<char>() + step * block_bytes; };
  auto prev_send = [&](int step) { return static_cast<const char*>(ctx_->heap().peer_ptr(send(step), prev)); };
  auto* stored = arrived_.as<std::uint64_t>();  // [step][band]: rows of send(step) stored, then [chunk] of `out`
  auto* prev_stored = static_cast<const std::uint64_t*>(ctx_->heap().peer_ptr(stored, prev));
  std::uint64_t* own_stored = stored + steps * bands_;
  const std::uint64_t band_stored = gemm_detail::band_stored_value(0, band_rows_, block_rows_, n);
  const std::uint64_t chunk_stored = gemm_detail::band_stored_value(0, chunk_rows_, block_rows_, n);

  // Tune (first run only) before the handshake, so no peer waits on a tuning rank.
  first_gemm_->prepare(GemmArgs{.a = a, .b = b, .c = send(0)}, stream);
  step_gemm_->prepare(GemmArgs{.a = a, .b = b, .c = out, .source = prev_send(0)}, stream);
  // Every peer is past its last run: it reads our send buffers and counters no
  // more, so they are zeroed and refilled.
  overlap_->handshake(stream, nullptr, 0, stored, static_cast<int>(steps * bands_ + chunks_));
  if (own_block_stored) own_block_stored(overlap_->fork(stream), own_stored, chunk_stored);

  for (int s = 0; s < world; ++s) {
    const int blk = schedule::ring_gemm_block(me, s, world);
    GemmArgs args{.a = block_of_a(blk), .b = b, .c = s == steps ? out : send(s)};
    if (s < steps) args.done = RowsDone{.counters = stored + s * bands_, .rows_per_counter = band_rows_};
    else if (own_block_stored) args.done = RowsDone{.counters = own_stored, .rows_per_counter = chunk_rows_};
    if (s == 0) {
      first_gemm_->run(args, stream);
      continue;
    }
    // Each tile's epilogue waits for its band of rank - 1's partial sum, then reads it there.
    args.source = prev_send(s - 1);
    args.signals = RowSignals{.world = &ctx_->world(),
                              .flags = prev_stored + (s - 1) * bands_,
                              .rows_per_flag = band_rows_,
                              .value = band_stored,
                              .from_rank = prev};
    step_gemm_->run(args, stream);
  }
  if (own_block_stored) overlap_->join(stream);  // the caller's sends are done when the run is
}

}  // namespace weft
