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
  const ops_detail::RowChunks rows = ops_detail::plan_rows("GemmRs", o.m, o.n, o.k, o.dtype, o.chunks_per_block, world,
                                                              o.n * 2, schedule::kMinStoredChunkBytes);
  block_rows_ = rows.rows_per_rank;
  chunks_ = rows.chunks;
  chunk_rows_ = rows.chunk_rows;
  ctx_->verify_same_call(ops_detail::plan_description("GemmRs", o.m, o.n, o.k, o.dtype, o.b_layout, o.mode));
  overlap_ = std::make_unique<Overlap>(ctx_, "gemm_rs", o.mode, str("GemmRs ", o.m, " x ", o.n, " x ", o.k));
  const std::uint64_t block_bytes = static_cast<std::uint64_t>(block_rows_ * o.n * 2);
  const int steps = world - 1;
  GemmOptions g = gemm_options(block_rows_, o.n, o.k, o.dtype, o.b_layout);
  g.allow_cublas = true;  // unhooked GEMMs take cuBLAS where it is faster
  if (o.mode != OverlapMode::sequential) {
    GemmOptions first = g;
    if (steps > 0) first.hook = GemmHook::report_rows;  // its chunks leave as they are stored
    first_gemm_ = std::make_unique<Gemm>(first);
    if (steps > 0) {
      staging_ = SymmetricBuffer(ctx_->heap(), steps * block_bytes, "bf16", "gemm_rs.staging");
      arrived_ = SymmetricBuffer(ctx_->heap(), static_cast<std::uint64_t>((steps + world) * chunks_ * 8), "u64",
                                 "gemm_rs.arrived");
      WEFT_CUDA(cudaMalloc(&send_, steps * block_bytes));
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

GemmRs::~GemmRs() {
  if (send_) cudaFree(send_);
}

std::string GemmRs::path() const { return overlap_->path(); }
float GemmRs::measured_fused_ms() const { return overlap_->fused_ms(); }
float GemmRs::measured_sequential_ms() const { return overlap_->sequential_ms(); }

std::string GemmRs::gemm_config() const {
  if (overlap_->path().empty()) return "";
  return overlap_->fused() ? fused_gemm_config() : plain_gemm_->config();
}

std::string GemmRs::fused_gemm_config() const {
  if (!first_gemm_) return "";
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
  const std::uint64_t chunk_bytes = static_cast<std::uint64_t>(chunk_rows_ * n * 2);
  // A chunk's stored-row counter once final (every chunk has chunk_rows_ rows).
  const std::uint64_t chunk_stored = gemm_detail::band_stored_value(0, chunk_rows_, block_rows_, n);
  auto block_of_a = [&](int blk) { return static_cast<const char*>(a) + blk * block_rows_ * k * 2; };
  auto send = [&](int step) { return static_cast<char*>(send_) + step * block_bytes; };
  auto staging = [&](int step) { return staging_.as<char>() + step * block_bytes; };
  const int steps = world - 1;
  auto* arrived = arrived_.as<std::uint64_t>();
  auto* stored = arrived + steps * chunks_;  // [step][chunk]: elements of the chunk stored by that step's GEMM
  auto stored_of = [&](int step) { return stored + step * chunks_; };
  const int next = schedule::wrap(me + 1, world), prev = schedule::wrap(me - 1, world);
  // Tune (first run only) before the handshake, so no peer waits on a tuning
  // rank. The counters and flags tell the tuner how many rows move together.
  const RowsDone chunk_done{.counters = stored_of(0), .rows_per_counter = chunk_rows_};
  first_gemm_->prepare(GemmArgs{.a = a, .b = b, .c = steps ? send(0) : out, .done = steps ? chunk_done : RowsDone{}},
                       stream);
  if (steps == 0) {
    first_gemm_->run(a, b, out, stream);
    return;
  }
  step_gemm_->prepare(GemmArgs{.a = a,
                               .b = b,
                               .c = out,
                               .source = staging(0),
                               .signals = RowSignals{.world = &ctx_->world(),
                                                     .flags = arrived,
                                                     .rows_per_flag = chunk_rows_,
                                                     .value = 1,
                                                     .from_rank = prev},
                               .done = chunk_done},
                      stream);

  // Every rank's staging and flags are free for this run; our flags and counters of the last run are zeroed.
  overlap_->handshake(stream, arrived, static_cast<int>((steps + world) * chunks_));
  Overlap::mark(stream, "handshake");
  // The side stream starts now, before the GEMMs: each step's block goes to
  // rank + 1 chunk by chunk, each chunk as soon as that step's GEMM stored it.
  cudaStream_t side = overlap_->fork(stream);
  auto* next_arrived = static_cast<std::uint64_t*>(ctx_->heap().peer_ptr(arrived, next));
  for (int s = 0; s < steps; ++s)
    for (std::int64_t c = 0; c < chunks_; ++c) {
      Overlap::push_chunk_when_stored(ctx_->heap().peer_ptr(staging(s), next), send(s), chunk_bytes, c, stored_of(s),
                                      chunk_stored, next_arrived + s * chunks_, side);
      if (Overlap::recording()) Overlap::mark(side, str("side: step ", s, " chunk ", c, " sent"));
    }
  if (own_block_stored) own_block_stored(side, stored_of(steps), chunk_stored);

  for (int s = 0; s < world; ++s) {
    const int blk = schedule::ring_gemm_block(me, s, world);
    GemmArgs args{.a = block_of_a(blk), .b = b, .c = s == steps ? out : send(s)};
    if (s < steps || own_block_stored) args.done = RowsDone{.counters = stored_of(s), .rows_per_counter = chunk_rows_};
    if (s == 0) {
      first_gemm_->run(args, stream);
      Overlap::mark(stream, "step 0 GEMM");
      continue;
    }
    // Each tile's epilogue waits for its chunk of the partial sum from rank - 1.
    args.source = staging(s - 1);
    args.signals = RowSignals{.world = &ctx_->world(),
                              .flags = arrived + (s - 1) * chunks_,
                              .rows_per_flag = chunk_rows_,
                              .value = 1,
                              .from_rank = prev};
    step_gemm_->run(args, stream);
    if (Overlap::recording()) Overlap::mark(stream, str("step ", s, " GEMM"));
  }
  overlap_->join(stream);  // our sends are done: the next run may overwrite them
}

}  // namespace weft
