// GEMM + ReduceScatter: the plan. The kernels are weft::Gemm, the steps after
// the first with the wait_source_rows hook (src/gemm/tile_hooks.cuh); the
// primitives are overlap.hpp's, the ring order schedule.hpp's.
#include "weft/ops/gemm_rs.hpp"

#include "overlap.hpp"
#include "ring_step.hpp"
#include "schedule.hpp"
#include "weft/core/error.hpp"

namespace weft {

using ops_detail::Overlap;

namespace {
constexpr std::int64_t kOneLaunchBlockRows = 512;  // tile rows x cluster rows, at most

/// `o` for a ring step: CUTLASS's cooperative 128x256 c2x1 kernel (a bare name:
/// its tile-scheduler settings are tuned), where one is compiled for the step's types,
/// layout and hook. Timed alone, back to back, the tuner finds the 128x128
/// pingpong kernel about as fast and often takes it; in the ring, one step
/// after another, the cooperative steps ran GEMM+ReduceScatter at K = 8192
/// 1.2-4.8 % faster (M = 8192 down to 2048; at 2048 rows the steps' GEMMs
/// alone, nothing sent, 0.186 against 0.190-0.196 ms): docs/decisions/0030.
/// Why the tuner's timing cannot see it is open (docs/ROADMAP.md).
GemmOptions cooperative_step(GemmOptions o) {
  const std::string name = ops_detail::ring_step_config(o.hook);
  if (Gemm::has_configuration(o, name)) o.config = name;
  return o;
}
}  // namespace

std::string ops_detail::ring_step_config(GemmHook hook) {
  const char* kind = hook == GemmHook::wait_source_rows ? " hooked+source"
                     : hook == GemmHook::add_rows       ? " hooked+add"
                     : hook == GemmHook::none           ? ""
                                                        : " hooked";
  return str("128x256x64 c2x1 cooperative", kind);
}

std::vector<Overlap::Fused> ops_detail::fused_ways(const GemmRs& plan,
                                                   const std::function<void(cudaStream_t, FusedWay)>& enqueue) {
  std::vector<Overlap::Fused> paths;
  for (FusedWay way : ops_detail::kFusedWays)
    if (plan.builds(way)) paths.push_back({path_name(way), [=](cudaStream_t s) { enqueue(s, way); }});
  return paths;
}

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

FusedWay ops_detail::fused_way_of(const std::string& path) {
  for (FusedWay way : ops_detail::kFusedWays)
    if (path == path_name(way)) return way;
  return FusedWay::automatic;
}

GemmRs::GemmRs(std::shared_ptr<Context> ctx, const GemmRsOptions& requested)
    : ctx_(std::move(ctx)), options_(requested) {
  ctx_->require_direct_peers("GemmRs");  // its kernels load and store every peer's heap
  const int world = ctx_->world_size();
  const GemmRsOptions& o = options_;
  const ops_detail::PlanShape shape = ops_detail::require_shape("GemmRs", o.m, o.n, o.k, o.dtype);
  const GemmOptions whole = gemm_options(o.m, o.n, o.k, o.dtype, o.b_layout);
  operand_alignment_ = ops_detail::operand_alignment(whole);
  options_.mode = ops_detail::runnable_mode("GemmRs", o.m, o.n, o.k, o.mode, ops_detail::untileable_reason(whole));
  const ops_detail::RowChunks rows = ops_detail::plan_rows("GemmRs", shape, o.chunks_per_block, world, o.n * 2,
                                                           schedule::kMinStoredChunkBytes);
  block_rows_ = rows.rows_per_rank;
  chunks_ = rows.chunks;
  chunk_rows_ = rows.chunk_rows;
  ctx_->verify_same_call(ops_detail::plan_description("GemmRs", o.m, o.n, o.k, o.dtype, o.b_layout, o.mode));
  // One launch computes the blocks in the ring's order within one tile order:
  // its hooked scheduler walks whole blocks from the first step's block down
  // (GemmArgs::descending_block_rows), the order the side stream sends them
  // in, so the block sent at step s is the one its tiles compute at step s at
  // any number of ranks (the CPU tests check the walk against
  // schedule::ring_gemm_block at 1 to 8). A tile must not straddle two blocks
  // (its wait would hold back the block before it, which the ring needs
  // first), whatever the tile (at most 256 rows, in clusters of at most 2
  // along M): M / W a multiple of 512. At one rank it is the one GEMM.
  const bool one_launch_possible = block_rows_ % kOneLaunchBlockRows == 0;
  WEFT_REQUIRE(o.way != FusedWay::ring_one_launch || one_launch_possible,
               "GemmRs: FusedWay::ring_one_launch needs M / W a multiple of ", kOneLaunchBlockRows,
               " (no tile may straddle two blocks), got M / W = ", block_rows_, " on ", world, " rank(s)");
  // Adding our block onto the peer's partial sum takes exactly one peer, and
  // whole tiles on both sides of the blocks' boundary.
  const bool one_launch_add_possible = world == 2 && one_launch_possible;
  WEFT_REQUIRE(o.way != FusedWay::one_launch_add || one_launch_add_possible,
               "GemmRs: FusedWay::one_launch_add needs exactly 2 ranks and M / 2 a multiple of ", kOneLaunchBlockRows,
               ", got M / W = ", block_rows_, " on ", world, " rank(s)");
  overlap_ = std::make_unique<Overlap>(ctx_, "gemm_rs", o.mode, str("GemmRs ", o.m, " x ", o.n, " x ", o.k));
  const std::uint64_t all_bytes = static_cast<std::uint64_t>(o.m * o.n * 2);
  const int steps = world - 1;
  GemmOptions g = gemm_options(block_rows_, o.n, o.k, o.dtype, o.b_layout);
  // Unhooked GEMMs take cuBLAS where it is faster: the sequential path's, and
  // a ring step's where no cooperative step is compiled for its types (cooperative_step).
  g.allow_cublas = true;
  g.agree = ops_detail::slowest_rank(ctx_);
  g.max_sms = ops_detail::sms_beside_copies(*ctx_);  // ranks sharing a GPU: room for copies that run as kernels
  if (o.mode != OverlapMode::sequential) {
    const bool any = o.way == FusedWay::automatic;
    // Automatic times one launch at 2 ranks only, where it has run on GPUs;
    // at 3 and more it runs when asked for by name until its GPU tests have
    // passed there (docs/ROADMAP.md): automatic picks a way by its time
    // alone, so an unchecked way must not be among them. At one rank every
    // way is the one GEMM: automatic times it once (the per-step ring's).
    const bool one = ((any && steps == 1) || o.way == FusedWay::ring_one_launch) && one_launch_possible;
    const bool per_step = any || o.way == FusedWay::ring_per_step || (steps == 0 && !one);
    const bool plain_first = (any || o.way == FusedWay::ring_plain_first) && steps > 0;
    WEFT_REQUIRE(o.way != FusedWay::ring_plain_first || plain_first,
                 "GemmRs: FusedWay::ring_plain_first needs 2 or more ranks, got ", world);
    if (per_step) {
      GemmOptions first = g;
      if (steps > 0) first.hook = GemmHook::report_rows;  // its chunks leave as they are stored
      first_gemm_ = std::make_unique<Gemm>(cooperative_step(first));
    }
    // One rank: the whole GEMM, nothing to wait for or send.
    if (one && steps == 0) whole_gemm_ = std::make_unique<Gemm>(cooperative_step(g));
    if (steps > 0) {
      staging_ = SymmetricBuffer(ctx_->heap(), all_bytes, to_string(o.dtype), "gemm_rs.staging");
      arrived_ = SymmetricBuffer(ctx_->heap(), static_cast<std::uint64_t>(2 * world * chunks_ * 8), "u64",
                                 "gemm_rs.arrived");
      overlap_->count_tile_waits(static_cast<int>(world * chunks_));  // WEFT_TILE_WAITS: per [block][chunk] flag
      WEFT_CUDA(cudaMalloc(&send_, all_bytes));
      GemmOptions hooked = g;
      hooked.hook = GemmHook::wait_source_rows;
      if (per_step || plain_first) {  // the steps after the first
        step_gemm_ = std::make_unique<Gemm>(cooperative_step(hooked));
        // The last step, unless a caller ships it (GemmAr), sends nothing on:
        // its tiles may walk in any order (along M too, and in the pingpong
        // kernel, whose epilogue with its source load runs under the other
        // warpgroup's mainloop). Its sources mostly arrived during the steps before.
        GemmOptions last = hooked;
        last.any_tile_order = true;
        last_gemm_ = std::make_unique<Gemm>(cooperative_step(last));
      }
      if (plain_first) {
        // Its block leaves once the whole step is stored: the plain GEMM may
        // walk its tiles in any order (or be cuBLAS's, where cooperative_step
        // finds no configuration), and reports nothing.
        plain_first_gemm_ = std::make_unique<Gemm>(cooperative_step(g));
        WEFT_CUDA(cudaEventCreateWithFlags(&first_step_done_, cudaEventDisableTiming));
        // The steps after it are the per-step ring's, but at 2 ranks the
        // last step's source leaves the previous rank only as the step
        // starts, so its tiles walk in the order it arrives: by column band
        // (2-D copies), so they walk along M as a plain GEMM may, where N
        // splits into bands of whole 256-column tiles; else by row chunk.
        if (steps == 1) {
          for (std::int64_t bands = chunks_; bands >= 1 && !band_cols_; --bands)
            if (o.n % bands == 0 && o.n / bands % 256 == 0) band_cols_ = o.n / bands;
          GemmOptions last = hooked;
          last.any_tile_order = band_cols_ > 0;
          ordered_last_gemm_ = std::make_unique<Gemm>(cooperative_step(last));
        }
      }
      if (one) {
        hooked.m = o.m;
        whole_gemm_ = std::make_unique<Gemm>(hooked);
      }
      // Only when asked for: its GEMM's one-lane reduce-add has not run on a
      // GPU yet (docs/decisions/0033), and automatic picks a
      // way by its time alone, so an unchecked way must not be among them.
      if (o.way == FusedWay::one_launch_add && one_launch_add_possible) {
        GemmOptions adding = g;
        adding.m = o.m;
        adding.hook = GemmHook::add_rows;
        adding.allow_cublas = false;
        add_gemm_ = std::make_unique<Gemm>(adding);
      }
    }
  }
  if (o.mode != OverlapMode::fused) {
    GemmOptions whole = g;
    whole.m = o.m;
    plain_gemm_ = std::make_unique<Gemm>(whole);
    partial_ = SymmetricBuffer(ctx_->heap(), all_bytes, to_string(o.dtype), "gemm_rs.partial");
    reduce_scatter_ = std::make_unique<ReduceScatter>(
        ctx_, ReduceScatterOptions{.count = static_cast<std::uint64_t>(block_rows_ * o.n), .dtype = o.dtype});
  }
}

GemmRs::~GemmRs() {
  if (send_) cudaFree(send_);
  if (first_step_done_) cudaEventDestroy(first_step_done_);
}

std::string GemmRs::path() const { return overlap_->path(); }
float GemmRs::measured_fused_ms() const { return overlap_->fused_ms(); }
float GemmRs::measured_sequential_ms() const { return overlap_->sequential_ms(); }

std::string GemmRs::gemm_config() const {
  if (overlap_->path().empty()) return "";
  return overlap_->fused() ? fused_gemm_config(ops_detail::fused_way_of(overlap_->path())) : plain_gemm_->config();
}

bool GemmRs::builds(FusedWay way) const {
  switch (way) {
    case FusedWay::ring_per_step: return first_gemm_ != nullptr;
    case FusedWay::ring_one_launch: return whole_gemm_ != nullptr;
    case FusedWay::ring_plain_first: return plain_first_gemm_ != nullptr;
    case FusedWay::one_launch_add: return add_gemm_ != nullptr;
    case FusedWay::automatic: break;
  }
  return false;
}

Gemm* GemmRs::last_step_gemm(FusedWay way) const {
  // A plain first step's block leaves as the last step starts at 2 ranks
  // (the only case with ordered_last_gemm_): that step waits in arrival order.
  return way == FusedWay::ring_plain_first && ordered_last_gemm_ ? ordered_last_gemm_.get() : last_gemm_.get();
}

std::string GemmRs::fused_gemm_config(FusedWay way) const {
  if (!builds(way)) return "";
  if (way == FusedWay::ring_one_launch) return whole_gemm_->config();
  if (way == FusedWay::one_launch_add) return add_gemm_->config();
  const bool plain_first = way == FusedWay::ring_plain_first;
  const Gemm& first = plain_first ? *plain_first_gemm_ : *first_gemm_;
  if (!step_gemm_) return first.config();
  // The steps' GEMMs that ran: those that send on, the last one that does not, or both (W > 2).
  const Gemm& last = *last_step_gemm(way);
  const bool steps_ran = step_gemm_->prepared(), last_ran = last.prepared();
  if (steps_ran && last_ran) return str(first.config(), "; then ", step_gemm_->config(), "; last ", last.config());
  return str(first.config(), "; then ", (last_ran ? last : *step_gemm_).config());
}

void GemmRs::run(const void* a, const void* b, void* out, cudaStream_t stream) {
  ops_detail::require_operands("GemmRs::run", {a, b, out}, operand_alignment_);
  if (ctx_->check_calls())
    ctx_->verify_same_call(str("GemmRs run: ", options_.m, " x ", options_.n, " x ", options_.k));
  overlap_->run(
      stream, {a, b, out},
      [&] {  // each fused way tunes its GEMMs on its first call (before its run starts)
        if (plain_gemm_) run_sequential(a, b, out, stream, false);  // a plan that may run sequentially
      },
      ops_detail::fused_ways(*this, [&](cudaStream_t s, FusedWay way) { run_fused(a, b, out, s, way); }),
      [&](bool nccl) { run_sequential(a, b, out, stream, nccl); });
}

void GemmRs::run_sequential(const void* a, const void* b, void* out, cudaStream_t stream, bool nccl) {
  plain_gemm_->run(a, b, partial_.get(), stream);
  if (nccl)
    WEFT_NCCL(ncclReduceScatter(partial_.get(), out, static_cast<std::size_t>(options_.m / ctx_->world_size() * options_.n),
                                nccl_type(options_.dtype), ncclSum, ctx_->nccl(), stream));
  else
    reduce_scatter_->run(partial_.get(), out, stream);
}

void GemmRs::run_fused(const void* a, const void* b, void* out, cudaStream_t stream, FusedWay way,
                       const OwnBlockStored& own_block_stored, void* all_rows) {
  const int world = ctx_->world_size(), me = ctx_->rank();
  const std::int64_t n = options_.n, k = options_.k;
  WEFT_REQUIRE(builds(way), "GemmRs::run_fused: this plan did not build the fused way '", path_name(way),
               "' (GemmRsOptions::way; builds())");
  if (way == FusedWay::one_launch_add) {
    run_one_launch_add(a, b, out, stream, own_block_stored, all_rows);
    return;
  }
  const bool one_launch = way == FusedWay::ring_one_launch;
  const std::uint64_t block_bytes = static_cast<std::uint64_t>(block_rows_ * n * 2);
  const std::uint64_t chunk_bytes = static_cast<std::uint64_t>(chunk_rows_ * n * 2);
  // A chunk's stored-row counter once final (every chunk has chunk_rows_ rows).
  const std::uint64_t chunk_stored = RowsDone::complete_value(chunk_rows_, n);
  const int steps = world - 1;
  if (steps == 0) {  // one rank: the one GEMM, whichever way asked for it
    (one_launch ? whole_gemm_ : first_gemm_)->run(a, b, out, stream);
    return;
  }
  // Every buffer, flag and counter is indexed by block.
  char* d = one_launch && all_rows ? static_cast<char*>(all_rows) : static_cast<char*>(send_);
  auto rows_of = [&](auto* base, int blk) { return reinterpret_cast<char*>(base) + blk * block_bytes; };
  auto* arrived = arrived_.as<std::uint64_t>();  // [block][chunk]: the chunk's partial sum has landed here
  auto* stored = arrived + world * chunks_;      // [block][chunk]: elements of the chunk our GEMM stored
  const int next = schedule::wrap(me + 1, world), prev = schedule::wrap(me - 1, world);
  const int first_block = schedule::ring_gemm_block(me, 0, world);
  const RowSignals from_prev{.world = &ctx_->world(),
                             .flags = arrived,
                             .rows_per_flag = chunk_rows_,
                             .value = 1,
                             .ready_begin = first_block * block_rows_,  // no source, with one launch
                             .ready_end = (first_block + 1) * block_rows_,
                             .from_rank = prev,
                             .waited_ns = overlap_->tile_wait_counter()};
  const RowsDone stored_rows{.counters = stored, .rows_per_counter = chunk_rows_};
  auto block_signals = [&](int blk) {
    RowSignals s = from_prev;
    s.flags = arrived + blk * chunks_;
    if (s.waited_ns) s.waited_ns = overlap_->tile_wait_counter() + blk * chunks_;  // indexed as the flags
    s.ready_begin = s.ready_end = 0;
    return s;
  };
  auto block_done = [&](int blk) { return RowsDone{.counters = stored + blk * chunks_, .rows_per_counter = chunk_rows_}; };
  const GemmArgs whole{.a = a,
                       .b = b,
                       .c = d,
                       .source = staging_.get(),
                       .signals = from_prev,
                       .done = stored_rows,
                       .first_row = first_block * block_rows_,
                       // Whole blocks from the first down: the ring's order (schedule::ring_gemm_block).
                       .descending_block_rows = block_rows_,
                       // Nobody sends us our first block: its tiles add nothing (and load nothing).
                       .no_source_begin = first_block * block_rows_,
                       .no_source_end = (first_block + 1) * block_rows_};
  // Tune (first run only) before the run starts, so no peer waits on a tuning
  // rank. The counters and flags tell the tuner how many rows move together.
  const bool plain_first = way == FusedWay::ring_plain_first;
  // The last step when nobody ships it: any tile order, unless its source
  // leaves the previous rank only as it starts (a plain first step at 2 ranks).
  Gemm* last = last_step_gemm(way);
  // Where that source arrives by column band (not for a caller that ships
  // our block: its last step reports rows, in row order).
  const bool by_columns = plain_first && steps == 1 && band_cols_ > 0 && !own_block_stored;
  auto source_signals = [&](int blk) {
    RowSignals s = block_signals(blk);
    if (by_columns) s.cols_per_flag = band_cols_;
    return s;
  };
  if (one_launch) {
    whole_gemm_->prepare(whole, stream);
  } else {
    if (plain_first) plain_first_gemm_->prepare(GemmArgs{.a = a, .b = b, .c = d}, stream);
    else first_gemm_->prepare(GemmArgs{.a = a, .b = b, .c = d, .done = block_done(0)}, stream);
    // Steps report their stored rows where they are sent on: every step but
    // the last, and the last too where a caller ships it (step_gemm_);
    // otherwise the last step reports nothing (`last`).
    const GemmArgs step{.a = a, .b = b, .c = out, .source = staging_.get(), .signals = block_signals(0)};
    if (steps > 1 || own_block_stored) {
      GemmArgs reporting = step;
      reporting.done = block_done(0);
      step_gemm_->prepare(reporting, stream);
    }
    if (!own_block_stored) {
      GemmArgs last_step = step;
      last_step.signals = source_signals(0);
      last->prepare(last_step, stream);
    }
  }

  // Our flags and counters of the last run are zeroed and every peer hears
  // that our staging is free. Once every peer said the same, each step's
  // block goes to rank + 1 chunk by chunk, each chunk as soon as our GEMM
  // stored it (a plain first step's block: once the step is done).
  cudaStream_t side = overlap_->begin(stream, arrived, static_cast<int>(2 * world * chunks_));
  Overlap::mark(stream, "start");
  auto* next_arrived = static_cast<std::uint64_t*>(ctx_->heap().peer_ptr(arrived, next));
  auto send_block = [&](int s, bool when_stored) {
    const int blk = schedule::ring_gemm_block(me, s, world);
    void* dst = ctx_->heap().peer_ptr(rows_of(staging_.get(), blk), next);
    if (by_columns && s == 0) {
      for (std::int64_t c = 0; c < n / band_cols_; ++c) {
        Overlap::push_column_band(dst, rows_of(d, blk), block_rows_, n * 2, band_cols_ * 2, c,
                                  next_arrived + blk * chunks_, side);
        if (Overlap::recording()) Overlap::mark(side, str("side: step ", s, " column band ", c, " sent"));
      }
      return;
    }
    for (std::int64_t c = 0; c < chunks_; ++c) {
      if (when_stored)
        Overlap::push_chunk_when_stored(dst, rows_of(d, blk), chunk_bytes, c, stored + blk * chunks_, chunk_stored,
                                        next_arrived + blk * chunks_, side);
      else
        Overlap::push_chunk(dst, rows_of(d, blk), chunk_bytes, c, next_arrived + blk * chunks_, side);
      if (Overlap::recording()) Overlap::mark(side, str("side: step ", s, " chunk ", c, " sent"));
    }
  };
  // Our own block (the ring's last step), final once stored: a caller that
  // ships it takes it from there; with one launch it moves to out.
  auto send_own_block = [&] {
    char* own = one_launch ? rows_of(d, me) : static_cast<char*>(out);
    if (own_block_stored) {
      WEFT_REQUIRE(own == out, "GemmRs::run_fused: a caller that ships out on must pass all_rows with one launch");
      own_block_stored(side, stored + me * chunks_, chunk_stored);
    } else if (own != out) {
      for (std::int64_t c = 0; c < chunks_; ++c) {
        Overlap::push_chunk_when_stored(out, own, chunk_bytes, c, stored + me * chunks_, chunk_stored, nullptr, side);
        if (Overlap::recording()) Overlap::mark(side, str("side: own chunk ", c, " moved to out"));
      }
    }
  };
  // Each of the side stream's waits on our stored rows is enqueued after the
  // GEMM that stores them. Streams may share one hardware queue (more streams
  // than CUDA_DEVICE_MAX_CONNECTIONS, or that set to 1, as Megatron-LM does),
  // and a queue runs in the order work was enqueued: a wait enqueued before
  // its GEMM would hold that GEMM back forever (docs/decisions/0049).
  if (one_launch) {
    whole_gemm_->run(whole, stream);
    Overlap::mark(stream, "GEMM");
    for (int s = 0; s < steps; ++s) send_block(s, true);
    send_own_block();
  } else {
    for (int s = 0; s < world; ++s) {
      const int blk = schedule::ring_gemm_block(me, s, world);
      GemmArgs args{.a = static_cast<const char*>(a) + blk * block_rows_ * k * 2,
                    .b = b,
                    .c = s == steps ? out : rows_of(d, blk)};
      if (s == 0 && plain_first) {
        // Its block leaves once the whole step is done.
        plain_first_gemm_->run(args, stream);
        Overlap::mark(stream, "step 0 GEMM");
        WEFT_CUDA(cudaEventRecord(first_step_done_, stream));
        WEFT_CUDA(cudaStreamWaitEvent(side, first_step_done_, 0));
        send_block(0, false);
        continue;
      }
      if (s < steps || own_block_stored) args.done = block_done(blk);
      if (s == 0) {
        first_gemm_->run(args, stream);
        Overlap::mark(stream, "step 0 GEMM");
      } else {
        // Each tile's epilogue waits for its chunk of the partial sum from rank - 1.
        args.source = rows_of(staging_.get(), blk);
        args.signals = s == steps ? source_signals(blk) : block_signals(blk);
        (s == steps && !own_block_stored ? last : step_gemm_.get())->run(args, stream);
        if (Overlap::recording()) Overlap::mark(stream, str("step ", s, " GEMM"));
      }
      // The step's block goes to rank + 1 chunk by chunk, each as soon as stored.
      if (s < steps) send_block(s, true);
      else send_own_block();
    }
  }
  overlap_->join(stream);  // our sends are done: the next run may overwrite them
}

void GemmRs::run_one_launch_add(const void* a, const void* b, void* out, cudaStream_t stream,
                                const OwnBlockStored& own_block_stored, void* all_rows) {
  const int me = ctx_->rank(), peer = 1 - me, world = ctx_->world_size();
  const std::int64_t n = options_.n;
  const std::uint64_t block_bytes = static_cast<std::uint64_t>(block_rows_ * n * 2);
  const std::uint64_t chunk_bytes = static_cast<std::uint64_t>(chunk_rows_ * n * 2);
  // The peer's copy engine lands its partial sum of our block in `out`, so
  // `out` must be the peer's to write: ours in the symmetric heap (or the
  // caller's all_rows, GemmAr's out, whose block `me` it is).
  WEFT_REQUIRE(!all_rows || static_cast<char*>(all_rows) + me * block_bytes == out,
               "GemmRs::run_fused: with all_rows, out must be its block ", me);
  WEFT_REQUIRE(ctx_->heap().contains(out, block_bytes), "GemmRs::run: FusedWay::one_launch_add needs `out` (", out,
               ") in the symmetric heap, the same buffer on every rank: the peer's copy engine writes its partial "
               "sum there");
  // Where our partial sum of the peer's block goes: the same buffer, the peer's block.
  char* peer_landing = static_cast<char*>(ctx_->heap().peer_ptr(all_rows ? all_rows : out, peer)) +
                       (all_rows ? peer * block_bytes : 0);
  auto* arrived = arrived_.as<std::uint64_t>();  // [block][chunk]: the peer's partial sum of the chunk is in out
  auto* stored = arrived + world * chunks_;      // [block][chunk]: elements of the chunk our GEMM stored or added
  const std::uint64_t chunk_stored = RowsDone::complete_value(chunk_rows_, n);
  // The peer's block first: stored into send_ (at its own rows) and sent as
  // each chunk is complete; then ours, each tile waiting (in its mainloop's
  // producer) for its chunk of the peer's partial sum, then adding onto it.
  const GemmArgs args{.a = a,
                      .b = b,
                      .c = send_,
                      .signals = RowSignals{.world = &ctx_->world(),
                                            .flags = arrived,
                                            .rows_per_flag = chunk_rows_,
                                            .value = 1,
                                            .ready_begin = peer * block_rows_,  // stored, not added: nothing to wait for
                                            .ready_end = (peer + 1) * block_rows_,
                                            .from_rank = peer,
                                            .waited_ns = overlap_->tile_wait_counter()},
                      .done = RowsDone{.counters = stored, .rows_per_counter = chunk_rows_},
                      .first_row = peer * block_rows_,
                      .add_into = out,
                      .add_begin = me * block_rows_,
                      .add_end = (me + 1) * block_rows_};
  add_gemm_->prepare(args, stream);  // tunes on the first run, before any peer waits on us
  // Our flags and counters of the last run are zeroed; the side stream sends
  // only once the peer said its `out` is free for this run.
  cudaStream_t side = overlap_->begin(stream, arrived, static_cast<int>(2 * world * chunks_));
  Overlap::mark(stream, "start");
  auto* peer_arrived = static_cast<std::uint64_t*>(ctx_->heap().peer_ptr(arrived, peer)) + peer * chunks_;
  const char* ours_of_peer = static_cast<const char*>(send_) + peer * block_bytes;
  // The GEMM first: the side stream's waits on its stored rows are enqueued
  // after it (streams may share a hardware queue: docs/decisions/0049).
  add_gemm_->run(args, stream);
  Overlap::mark(stream, "GEMM");
  for (std::int64_t c = 0; c < chunks_; ++c) {
    Overlap::push_chunk_when_stored(peer_landing, ours_of_peer, chunk_bytes, c, stored + peer * chunks_, chunk_stored,
                                    peer_arrived, side);
    if (Overlap::recording()) Overlap::mark(side, str("side: peer's chunk ", c, " sent"));
  }
  // Our block is final chunk by chunk as its adds complete (they report like stores).
  if (own_block_stored) own_block_stored(side, stored + me * chunks_, chunk_stored);
  overlap_->join(stream);  // our sends are done: the next run may overwrite send_
}

}  // namespace weft
