// GEMM+ReduceScatter's ring: the GEMMs each step kind runs, and the one loop
// that enqueues a RingPlan. The plan says what; this file says with which
// buffers (RingLayout) and which primitives (copy_pipe.hpp).
#include "ring_executor.hpp"

#include <algorithm>
#include <utility>

#include "ring_step.hpp"
#include "weft/core/error.hpp"

namespace weft::ops_detail {

namespace {
constexpr std::int64_t kOneLaunchBlockRows = 512;  // tile rows x cluster rows, at most

/// `o` for a ring step: CUTLASS's cooperative 128x256 c2x1 kernel (a bare name:
/// its tile-scheduler settings are tuned), where one is compiled for the step's types,
/// layout and hook. Timed alone, back to back, the tuner finds the 128x128
/// pingpong kernel about as fast and often takes it; in the ring, one step
/// after another, the cooperative steps ran GEMM+ReduceScatter at K = 8192
/// 1.2-4.8 % faster (M = 8192 down to 2048; at 2048 rows the steps' GEMMs
/// alone, nothing sent, 0.186 against 0.190-0.196 ms): docs/decisions/0030.
GemmOptions cooperative_step(GemmOptions o) {
  const std::string name = ring_step_config(o.hook);
  if (Gemm::has_configuration(o, name)) o.config = name;
  return o;
}

int way_index(FusedWay way) {
  for (int i = 0; i < 4; ++i)
    if (kFusedWays[i] == way) return i;
  return -1;
}
}  // namespace

std::string ring_step_config(GemmHook hook) {
  const char* kind = hook == GemmHook::wait_source_rows ? " hooked+source"
                     : hook == GemmHook::add_rows       ? " hooked+add"
                     : hook == GemmHook::none           ? ""
                                                        : " hooked";
  return str("128x256x64 c2x1 cooperative", kind);
}

FusedWay fused_way_of(const std::string& path) {
  for (FusedWay way : kFusedWays)
    if (path == path_name(way)) return way;
  return FusedWay::automatic;
}

RingExecutor::RingExecutor(std::shared_ptr<Context> ctx, const RingOptions& options)
    : ctx_(std::move(ctx)),
      options_(options),
      pipe_(ctx_, options.caller_ships ? "gemm_ar" : "gemm_rs"),
      tile_waits_(str(options.who, " ", options.shape.m, " x ", options.shape.n, " x ", options.shape.k),
                  ctx_->world_size() > 1 ? static_cast<int>(ctx_->world_size() * options.rows.chunks) : 0,
                  ctx_->settings().tile_waits) {
  const int world = ctx_->world_size(), steps = world - 1;
  const RingOptions& o = options_;
  const char* who = o.who;
  layout_ = RingLayout{.world = world,
                       .n = o.shape.n,
                       .block_rows = o.rows.rows_per_rank,
                       .chunks = o.rows.chunks,
                       .chunk_rows = o.rows.chunk_rows};
  // One launch computes the blocks in the ring's order within one tile order:
  // its hooked scheduler walks whole blocks from the first step's block down
  // (HookLayout::descending_block_rows), the order the side stream sends them
  // in, so the block sent at step s is the one its tiles compute at step s at
  // any number of ranks (the CPU tests check the walk against
  // schedule::ring_gemm_block at 1 to 8). A tile must not straddle two blocks
  // (its wait would hold back the block before it, which the ring needs
  // first), whatever the tile (at most 256 rows, in clusters of at most 2
  // along M): M / W a multiple of 512. At one rank it is the one GEMM.
  const bool one_launch_possible = layout_.block_rows % kOneLaunchBlockRows == 0;
  WEFT_REQUIRE(o.way != FusedWay::ring_one_launch || one_launch_possible, who,
               ": FusedWay::ring_one_launch needs M / W a multiple of ", kOneLaunchBlockRows,
               " (no tile may straddle two blocks), got M / W = ", layout_.block_rows, " on ", world, " rank(s)");
  // Adding our block onto the peer's partial sum takes exactly one peer, and
  // whole tiles on both sides of the blocks' boundary.
  const bool one_launch_add_possible = world == 2 && one_launch_possible;
  WEFT_REQUIRE(o.way != FusedWay::one_launch_add || one_launch_add_possible, who,
               ": FusedWay::one_launch_add needs exactly 2 ranks and M / 2 a multiple of ", kOneLaunchBlockRows,
               ", got M / W = ", layout_.block_rows, " on ", world, " rank(s)");
  WEFT_REQUIRE(o.way != FusedWay::ring_plain_first || steps > 0, who,
               ": FusedWay::ring_plain_first needs 2 or more ranks, got ", world);
  const bool any = o.way == FusedWay::automatic;
  // Automatic times one launch at 2 ranks only, where it has run on GPUs;
  // at 3 and more it runs when asked for by name until it has a figure there
  // (docs/ROADMAP.md): automatic picks a way by its time alone. At one rank
  // every way is the one GEMM: automatic times it once (the per-step ring's).
  const bool one = ((any && steps == 1) || o.way == FusedWay::ring_one_launch) && one_launch_possible;
  const bool per_step = any || o.way == FusedWay::ring_per_step || (steps == 0 && !one);
  const bool plain_first = (any || o.way == FusedWay::ring_plain_first) && steps > 0;
  // Only when asked for: its GEMM's one-lane reduce-add has no GPU figure
  // beside the others yet (docs/decisions/0033), and automatic picks a way by
  // its time alone.
  const bool adding = o.way == FusedWay::one_launch_add && one_launch_add_possible;

  // At 2 ranks a plain first step's block leaves as the last step starts, by
  // column band (2-D copies), so the last step's tiles walk along M as a
  // plain GEMM may, where N splits into bands of whole 256-column tiles.
  if (plain_first && steps == 1 && !o.caller_ships)
    for (std::int64_t bands = layout_.chunks; bands >= 1 && !band_cols_; --bands)
      if (layout_.n % bands == 0 && layout_.n / bands % 256 == 0) band_cols_ = layout_.n / bands;
  // Each built way's ring, as this rank runs it on every call.
  for (FusedWay way : kFusedWays) {
    const bool built = way == FusedWay::ring_per_step     ? per_step
                       : way == FusedWay::ring_one_launch ? one
                       : way == FusedWay::ring_plain_first ? plain_first
                                                           : adding;
    if (built) plans_[way_index(way)] = ring_plan(way, ctx_->rank(), world, o.caller_ships, band_cols_ > 0);
  }

  GemmOptions g = gemm_options(layout_.block_rows, o.shape.n, o.shape.k, o.shape.dtype, o.b_layout);
  // Unhooked GEMMs take cuBLAS where it is faster: a ring step's where no
  // cooperative step is compiled for its types (cooperative_step).
  g.allow_cublas = true;
  g.agree = slowest_rank(ctx_);
  g.max_sms = sms_beside_copies(*ctx_);  // ranks sharing a GPU: room for copies that run as kernels
  GemmOptions hooked = g;
  hooked.hook = GemmHook::wait_source_rows;
  // Partial sums land, and stored rows leave, by chunk; at one rank nothing
  // moves, and no run waits or reports.
  const std::int64_t chunk_rows = steps > 0 ? layout_.chunk_rows : 0;
  hooked.hook_layout.rows_per_flag = chunk_rows;
  auto options_for = [&](RingGemm kind) {
    GemmOptions x = kind == RingGemm::plain || kind == RingGemm::reporting || kind == RingGemm::whole_adding ? g
                                                                                                              : hooked;
    switch (kind) {
      case RingGemm::plain: return cooperative_step(x);
      case RingGemm::reporting:
        x.hook = GemmHook::report_rows;
        x.hook_layout.rows_per_report = chunk_rows;
        return cooperative_step(x);
      case RingGemm::source_reporting: x.hook_layout.rows_per_report = chunk_rows; return cooperative_step(x);
      // Sends nothing on: its tiles may walk in any order (along M too, and
      // in the pingpong kernel, whose epilogue with its source load runs
      // under the other warpgroup's mainloop).
      case RingGemm::source_any_order: x.any_tile_order = true; return cooperative_step(x);
      case RingGemm::source_arrival_order:
        // Its source arrives by column band where the plain first step's
        // block leaves by column band: flags per band of columns.
        x.any_tile_order = band_cols_ > 0;
        x.hook_layout.cols_per_flag = band_cols_;
        return cooperative_step(x);
      case RingGemm::whole_ring:
        x.m = o.shape.m;
        x.hook_layout.rows_per_report = chunk_rows;
        // Whole blocks from the first down: the ring's order (schedule::ring_gemm_block).
        x.hook_layout.descending_block_rows = layout_.block_rows;
        return x;
      case RingGemm::whole_adding:
        x.m = o.shape.m;
        x.hook = GemmHook::add_rows;
        x.hook_layout = HookLayout{.rows_per_flag = chunk_rows, .rows_per_report = chunk_rows};
        x.allow_cublas = false;
        return x;
    }
    return x;
  };
  // One Gemm per kind that a built way's steps run.
  for (const std::optional<RingPlan>& p : plans_)
    if (p)
      for (const RingStep& step : p->steps) {
        auto& slot = gemms_[static_cast<int>(step.gemm)];
        if (!slot) slot = std::make_unique<Gemm>(options_for(step.gemm));
      }
  if (steps > 0) {
    const std::string name = o.caller_ships ? "gemm_ar.ring" : "gemm_rs";
    staging_ = SymmetricBuffer(ctx_->heap(), layout_.all_bytes(), to_string(o.shape.dtype), name + ".staging");
    flags_ = SymmetricBuffer(ctx_->heap(), static_cast<std::uint64_t>(layout_.flag_words()) * 8, "u64",
                             name + ".arrived");
    send_ = DeviceBuffer(layout_.all_bytes());
  }
}

bool RingExecutor::builds(FusedWay way) const {
  const int i = way_index(way);
  return i >= 0 && plans_[i].has_value();
}

const RingPlan& RingExecutor::plan(FusedWay way) const {
  WEFT_REQUIRE(builds(way), options_.who, ": this plan did not build the fused way '", path_name(way),
               "' (its options' way; builds())");
  return *plans_[way_index(way)];
}

std::vector<FusedPath> RingExecutor::paths(const std::function<void(cudaStream_t, FusedWay)>& enqueue) const {
  std::vector<FusedPath> paths;
  for (FusedWay way : kFusedWays)
    if (builds(way)) paths.push_back({path_name(way), [=](cudaStream_t s) { enqueue(s, way); }});
  return paths;
}

Gemm& RingExecutor::gemm(RingGemm kind) const {
  const auto& g = gemms_[static_cast<int>(kind)];
  WEFT_REQUIRE(g, options_.who, ": the ring has no GEMM for step kind ", static_cast<int>(kind));
  return *g;
}

std::string RingExecutor::gemm_config(FusedWay way) const {
  if (!builds(way)) return "";
  std::vector<RingGemm> kinds;  // in step order, each once
  for (const RingStep& step : plan(way).steps)
    if (std::find(kinds.begin(), kinds.end(), step.gemm) == kinds.end()) kinds.push_back(step.gemm);
  std::string text = gemm(kinds[0]).config();
  for (std::size_t i = 1; i < kinds.size(); ++i)
    text += str(i == 1 ? "; then " : "; last ", gemm(kinds[i]).config());
  return text;
}

GemmArgs RingExecutor::step_args(const RingStep& step, const void* a, const void* b, void* out, char* d) const {
  const RingLayout& L = layout_;
  auto* flags = flags_.as<std::uint64_t>();  // none at one rank: nothing waits or reports
  unsigned long long* waited = tile_waits_.counters();
  const int blk = step.block;
  const std::int64_t first_row = blk * L.block_rows;
  // The partial sum from rank - 1 lands by chunk; each tile waits for its chunk's flag.
  const RowSignals block_source{.world = &ctx_->world(),
                                .flags = flags ? flags + L.arrived_word(blk) : nullptr,
                                .value = 1,
                                .from_rank = step.source_rank,
                                .waited_ns = waited ? waited + L.arrived_word(blk) : nullptr};
  const RowsDone block_done{.counters = flags ? flags + L.stored_word(blk) : nullptr};
  GemmArgs args{.a = static_cast<const char*>(a) + first_row * options_.shape.k * L.element_bytes,
                .b = b,
                .c = step.stores_to_out ? out : d + L.block_offset(blk)};
  switch (step.gemm) {
    case RingGemm::plain: break;
    case RingGemm::reporting: args.report = block_done; break;
    case RingGemm::source_reporting:
    case RingGemm::source_any_order:
    case RingGemm::source_arrival_order:
      args.epilogue = AddSource{.source = staging_.as<char>() + L.block_offset(blk)};
      args.wait = block_source;
      if (step.gemm == RingGemm::source_reporting) args.report = block_done;
      break;
    case RingGemm::whole_ring:
    case RingGemm::whole_adding: {
      // All M rows, indexed as the sum's; flags and counters likewise.
      const std::int64_t block_end = first_row + L.block_rows;
      args.a = a;
      args.c = d;
      args.wait = RowSignals{.world = &ctx_->world(),
                             .flags = flags ? flags + L.arrived_word(0) : nullptr,
                             .value = 1,
                             // The first block adds nothing (one launch:
                             // nobody sends it) or is stored, not added
                             // (adding): nothing to wait for there.
                             .ready_begin = first_row,
                             .ready_end = block_end,
                             .from_rank = step.source_rank,
                             .waited_ns = waited};
      args.report = RowsDone{.counters = flags ? flags + L.stored_word(0) : nullptr};
      args.first_row = first_row;
      if (step.gemm == RingGemm::whole_ring) {
        args.epilogue = AddSource{.source = staging_.get(), .plain_begin = first_row, .plain_end = block_end};
      } else {
        const int me = ctx_->rank();
        args.epilogue = ReduceAddRows{.into = out, .begin = me * L.block_rows, .end = (me + 1) * L.block_rows};
      }
      break;
    }
  }
  return args;
}

void RingExecutor::enqueue_send(const BlockSend& send, void* out, char* d, void* all_rows, cudaStream_t side,
                                const ShipOwnBlock& ship_own) const {
  const RingLayout& L = layout_;
  const int blk = send.block;
  auto* flags = flags_.as<std::uint64_t>();
  const std::uint64_t* stored = flags + L.stored_word(blk);
  const char* rows = d + L.block_offset(blk);
  auto peer_flags = [&] {
    return static_cast<std::uint64_t*>(ctx_->heap().peer_ptr(flags, send.rank)) + L.arrived_word(blk);
  };
  auto push_chunks = [&](void* dst, const char* src, std::uint64_t* to_flags, const char* what) {
    for (std::int64_t c = 0; c < L.chunks; ++c) {
      if (send.when == SendWhen::stored)
        push_chunk_when_stored(dst, src, L.chunk_bytes(), c, stored, L.chunk_stored(), to_flags, side);
      else
        push_chunk(dst, src, L.chunk_bytes(), c, to_flags, side);
      if (trace::recording()) trace::mark(side, str("side: block ", blk, " chunk ", c, " ", what));
    }
  };
  switch (send.to) {
    case SendTo::next_staging: {
      void* dst = ctx_->heap().peer_ptr(staging_.as<char>() + L.block_offset(blk), send.rank);
      if (send.when != SendWhen::step_done_by_column_band) {
        push_chunks(dst, rows, peer_flags(), "sent");
        return;
      }
      const std::int64_t row_bytes = L.n * L.element_bytes, band_bytes = band_cols_ * L.element_bytes;
      for (std::int64_t c = 0; c < L.n / band_cols_; ++c) {
        push_column_band(dst, rows, L.block_rows, row_bytes, band_bytes, c, peer_flags(), side);
        if (trace::recording()) trace::mark(side, str("side: block ", blk, " column band ", c, " sent"));
      }
      return;
    }
    case SendTo::peer_out: {
      // Where our partial sum of the peer's block lands: the same buffer, the peer's block.
      char* landing = static_cast<char*>(ctx_->heap().peer_ptr(all_rows ? all_rows : out, send.rank)) +
                      (all_rows ? L.block_offset(blk) : 0);
      push_chunks(landing, rows, peer_flags(), "sent");
      return;
    }
    case SendTo::out:
      if (rows != out) push_chunks(out, rows, nullptr, "moved to out");
      return;
    case SendTo::caller:
      ship_own(side, stored, L.chunk_stored());
      return;
  }
}

void RingExecutor::run(FusedWay way, const void* a, const void* b, void* out, cudaStream_t stream,
                       const ShipOwnBlock& ship_own, void* all_rows) {
  const int world = ctx_->world_size(), me = ctx_->rank();
  const RingLayout& L = layout_;
  const RingPlan& ring = plan(way);
  WEFT_REQUIRE(static_cast<bool>(ship_own) == options_.caller_ships, options_.who,
               ": a ring built for a caller that ships our block runs with one, and only it");
  // Non-final blocks are stored here; with one launch and the caller's room
  // for all M rows, there (the other blocks' partial sums pass through it
  // before they leave, and ours is final where the caller wants it).
  char* d = way == FusedWay::ring_one_launch && all_rows ? static_cast<char*>(all_rows) : send_.as<char>();
  if (world > 1 && way == FusedWay::ring_one_launch && options_.caller_ships)
    WEFT_REQUIRE(d + L.block_offset(me) == out, options_.who,
                 ": with one launch, a caller that ships our block passes all_rows, with out its block ", me);
  if (way == FusedWay::one_launch_add) {
    // The peer's copy engine lands its partial sum of our block in `out`, so
    // `out` must be the peer's to write: ours in the symmetric heap (or the
    // caller's all_rows, GemmAr's out, whose block `me` it is).
    WEFT_REQUIRE(!all_rows || static_cast<char*>(all_rows) + L.block_offset(me) == out, options_.who,
                 ": with all_rows, out must be its block ", me);
    WEFT_REQUIRE(ctx_->heap().contains(out, L.block_bytes()), options_.who,
                 "::run: FusedWay::one_launch_add needs `out` (", out,
                 ") in the symmetric heap, the same buffer on every rank: the peer's copy engine writes its partial "
                 "sum there");
  }
  if (world == 1) {  // one rank: the one GEMM, nothing to wait for or send
    gemm(RingGemm::plain).run(step_args(ring.steps[0], a, b, out, d), stream);
    return;
  }
  // Tune (first run only) before the run starts, so no peer waits on a tuning
  // rank: each GEMM on its first step's operands. The counters and flags tell
  // the tuner how many rows move together.
  std::array<bool, kRingGemmKinds> prepared{};
  for (const RingStep& step : ring.steps)
    if (!std::exchange(prepared[static_cast<int>(step.gemm)], true))
      gemm(step.gemm).prepare(step_args(step, a, b, out, d), stream);

  // Our flags and counters of the last run are zeroed and every peer hears
  // that our buffers are free. Once every peer said the same, each block goes
  // on chunk by chunk, each chunk as soon as our GEMM stored it (a plain first
  // step's block: once the step is done). Each of the side stream's waits on
  // our stored rows is enqueued after the GEMM that stores them: streams may
  // share one hardware queue (more streams than CUDA_DEVICE_MAX_CONNECTIONS,
  // or that set to 1, as Megatron-LM does), and a queue runs in the order work
  // was enqueued, so a wait enqueued before its GEMM would hold that GEMM back
  // forever (docs/decisions/0049).
  cudaStream_t side = pipe_.begin(stream, flags_.as<std::uint64_t>(), L.flag_words());
  trace::mark(stream, "start");
  for (std::size_t s = 0; s < ring.steps.size(); ++s) {
    const RingStep& step = ring.steps[s];
    gemm(step.gemm).run(step_args(step, a, b, out, d), stream);
    if (trace::recording()) trace::mark(stream, ring.steps.size() == 1 ? std::string("GEMM") : str("step ", s, " GEMM"));
    bool waited_for_step = false;
    for (const BlockSend& send : step.sends) {
      if (send.when != SendWhen::stored && !std::exchange(waited_for_step, true)) {
        WEFT_CUDA(cudaEventRecord(step_done_, stream));
        WEFT_CUDA(cudaStreamWaitEvent(side, step_done_, 0));
      }
      enqueue_send(send, out, d, all_rows, side, ship_own);
    }
  }
  pipe_.join(stream);  // our sends are done: the next run may overwrite them
}

}  // namespace weft::ops_detail
