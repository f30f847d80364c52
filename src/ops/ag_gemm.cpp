// AllGather + GEMM: the plan. Each fused way is data (ag_plan.hpp: the peers
// our shard goes to, and the steps, each a GEMM and what it waits on), built
// once here per way and enqueued by one loop, run_plan. The kernel is
// weft::Gemm, hooked with wait_a_rows for the one GEMM (src/gemm/tile_hooks.cuh)
// or plain for a shard's step; the copies and waits are copy_pipe.hpp's, and
// path_choice.hpp picks between the fused and sequential paths. Across nodes
// the fused way's data movement is weft::internode's counting two-level
// AllGather (two_level.hpp; docs/decisions/0074).
#include "weft/ops/ag_gemm.hpp"

#include <array>
#include <utility>

#include "ag_plan.hpp"
#include "copy_pipe.hpp"
#include "overlap.hpp"
#include "path_choice.hpp"
#include "trace.hpp"
#include "two_level.hpp"
#include "weft/core/error.hpp"
#include "weft/core/nccl_type.hpp"

namespace weft {

namespace trace = ops_detail::trace;

namespace {
// Across nodes, the thread blocks of the fused path's two-level AllGather; the
// GEMMs take the rest of the rank's SMs. Its rail puts are NVSHMEM block puts
// (the NIC's pace, not the SMs'); its NVLink pushes are SM copies, a few
// blocks' worth per hop. A starting point, to be measured on two nodes.
constexpr int kTwoLevelAgBlocks = 8;
}  // namespace

const char* path_name(AgWay way) {
  switch (way) {
    case AgWay::one_gemm: return "fused";
    case AgWay::plain_steps: return "fused, plain steps";
    case AgWay::automatic: break;
  }
  return "fused, automatic";
}

AgGemm::AgGemm(std::shared_ptr<Context> ctx, const AgGemmOptions& requested)
    : ctx_(std::move(ctx)), options_(requested) {
  const int world = ctx_->world_size();
  const AgGemmOptions& o = options_;
  const ops_detail::PlanShape shape = ops_detail::require_shape("AgGemm", o.m, o.n, o.k, o.dtype);
  const GemmOptions whole = gemm_options(o.m, o.n, o.k, o.dtype, o.b_layout);
  operand_alignment_ = ops_detail::operand_alignment(whole);
  // Across nodes the fused way is plain steps over the counting two-level
  // AllGather, where weft::internode registered it; else only the sequential
  // path runs (its AllGather takes the two-level schedule, or refuses below).
  const bool across_nodes = !ctx_->all_peers_direct();
  const ops_detail::TwoLevelCollectives* two_level = across_nodes ? ops_detail::two_level_collectives() : nullptr;
  std::string why_not_fused = two_level ? std::string() : ops_detail::across_nodes_reason(*ctx_);
  if (why_not_fused.empty()) why_not_fused = ops_detail::untileable_reason(whole);
  options_.mode = ops_detail::runnable_mode("AgGemm", o.m, o.n, o.k, o.mode, why_not_fused);
  const ops_detail::RowChunks rows = ops_detail::plan_rows("AgGemm", shape, o.chunks_per_shard, *ctx_, o.k * 2);
  shard_rows_ = rows.rows_per_rank;
  chunks_ = rows.chunks;
  chunk_rows_ = rows.chunk_rows;
  ctx_->verify_same_call(ops_detail::plan_description("AgGemm", o.m, o.n, o.k, o.dtype, o.b_layout, o.mode) +
                         ops_detail::across_nodes_description(*ctx_));
  ops_detail::require_sequential_across_nodes(*ctx_, "AgGemm", "AllGather");
  const std::string what = str("AgGemm ", o.m, " x ", o.n, " x ", o.k);
  const ops_detail::AgLayout flags{world, chunks_};
  tile_waits_ = std::make_unique<ops_detail::TileWaits>(what, flags.flag_words(), ctx_->settings().tile_waits);
  pipe_ = std::make_unique<ops_detail::CopyPipe>(ctx_, "ag_gemm");
  choice_ = std::make_unique<ops_detail::PathChoice>(ctx_, o.mode, what, tile_waits_.get());
  gathered_ = SymmetricBuffer(ctx_->heap(), static_cast<std::uint64_t>(o.m * o.k * 2), to_string(o.dtype), "ag_gemm.gathered");
  arrived_ =
      SymmetricBuffer(ctx_->heap(), static_cast<std::uint64_t>(flags.flag_words()) * 8, "u64", "ag_gemm.arrived");
  GemmOptions g = whole;
  g.allow_cublas = true;  // unhooked GEMMs take cuBLAS where it is faster
  g.agree = ops_detail::slowest_rank(ctx_);
  g.max_sms = ops_detail::sms_beside_copies(*ctx_);  // ranks sharing a GPU: room for copies that run as kernels
  WEFT_REQUIRE(o.way != AgWay::plain_steps || world > 1, "AgGemm: AgWay::plain_steps needs 2 or more ranks, got ",
               world);
  WEFT_REQUIRE(!across_nodes || o.mode == OverlapMode::sequential || o.way != AgWay::one_gemm,
               "AgGemm: AgWay::one_gemm needs every peer's heap mapped here (its tiles wait on flags peers raise in "
               "it), and some peers are on other nodes (or virtual nodes): across nodes use AgWay::plain_steps or "
               "AgWay::automatic (plain steps over the two-level AllGather), or OverlapMode::sequential");
  if (o.mode != OverlapMode::sequential && two_level) {
    // One way: a GEMM per shard, in the order the shards land, beside the AllGather's blocks.
    plans_.push_back(ops_detail::ag_plan_two_level(ops_detail::two_level_grid(*ctx_, "AgGemm"), ctx_->rank()));
    ag_arrivals_ = two_level->ag_arrivals(*ctx_, static_cast<std::uint64_t>(shard_rows_ * o.k * 2),
                                          kTwoLevelAgBlocks);
    GemmOptions one_shard = g;
    one_shard.m = shard_rows_;
    const int share = g.max_sms > 0 ? g.max_sms : ctx_->team().sm_count;
    one_shard.max_sms = std::max(2, (share - ag_arrivals_->blocks()) / 2 * 2);  // whole clusters of 2
    step_gemm_ = std::make_unique<Gemm>(one_shard);
  } else if (o.mode != OverlapMode::sequential) {
    // Each way asked for (automatic: both, plain steps from 2 ranks), as this rank runs it on every call.
    for (AgWay way : {AgWay::one_gemm, AgWay::plain_steps})
      if ((o.way == AgWay::automatic && (way != AgWay::plain_steps || world > 1)) || o.way == way)
        plans_.push_back(ops_detail::ag_plan(way, ctx_->rank(), world));
    // One Gemm per kind that a built way's steps run.
    for (const ops_detail::AgPlan& plan : plans_)
      for (const ops_detail::AgStep& step : plan.steps) {
        if (step.gemm == ops_detail::AgGemmKind::whole_waiting && !fused_gemm_) {
          GemmOptions hooked = g;
          hooked.hook = GemmHook::wait_a_rows;
          // A tile waits for its rows' chunk; our own shard is present from the start.
          hooked.hook_layout = HookLayout{.rows_per_flag = chunk_rows_, .present_rows = shard_rows_};
          fused_gemm_ = std::make_unique<Gemm>(hooked);
        }
        if (step.gemm == ops_detail::AgGemmKind::shard && !step_gemm_) {
          // One shard's rows: a plain GEMM needs no flags, so any tile order (or cuBLAS) will do.
          GemmOptions one_shard = g;
          one_shard.m = shard_rows_;
          step_gemm_ = std::make_unique<Gemm>(one_shard);
        }
      }
  }
  if (o.mode != OverlapMode::fused) plain_gemm_ = std::make_unique<Gemm>(g);
  // The sequential path's gather, and the fused paths' first gather (real data to tune on).
  all_gather_ = std::make_unique<AllGather>(
      ctx_, AllGatherOptions{.bytes_per_rank = static_cast<std::uint64_t>(shard_rows_ * o.k * 2)});
}

AgGemm::~AgGemm() = default;

void* AgGemm::local_shard() const {
  return gathered_.as<char>() + ctx_->rank() * shard_rows_ * options_.k * 2;
}

const void* AgGemm::gathered() const { return gathered_.get(); }

std::string AgGemm::path() const { return choice_->path(); }
float AgGemm::measured_fused_ms() const { return choice_->fused_ms(); }
float AgGemm::measured_sequential_ms() const { return choice_->sequential_ms(); }

std::string AgGemm::gemm_config() const {
  if (choice_->path().empty()) return "";
  if (!choice_->fused()) return plain_gemm_->config();
  return choice_->path() == path_name(AgWay::one_gemm) ? fused_gemm_->config() : step_gemm_->config();
}

void AgGemm::run(const void* a_shard, const void* b, void* c, cudaStream_t stream) {
  ops_detail::require_operands("AgGemm::run", {a_shard, b, c}, operand_alignment_);
  if (ctx_->check_calls())
    ctx_->verify_same_call(str("AgGemm run: ", options_.m, " x ", options_.n, " x ", options_.k));
  if (a_shard != local_shard())
    WEFT_CUDA(cudaMemcpyAsync(local_shard(), a_shard, static_cast<std::size_t>(shard_rows_ * options_.k * 2),
                              cudaMemcpyDeviceToDevice, stream));
  std::vector<ops_detail::FusedPath> fused;
  for (const ops_detail::AgPlan& plan : plans_)
    fused.push_back({path_name(plan.way), [&, way = &plan](cudaStream_t s) { run_plan(*way, b, c, s); }});
  choice_->run(
      stream, {b, c},
      [&] {  // real data for the GEMMs to tune on: a sequential run, or (fused only) the gather alone
        if (plain_gemm_) run_sequential(b, c, stream, false);
        else gather(stream, false);
        if (fused_gemm_) fused_gemm_->prepare(fused_args(b, c), stream);  // validated, then tuned with every row present
        if (step_gemm_) step_gemm_->prepare(GemmArgs{.a = local_shard(), .b = b, .c = c}, stream);
        if (plain_gemm_) plain_gemm_->prepare(GemmArgs{.a = gathered_.get(), .b = b, .c = c}, stream);
      },
      fused, [&](bool nccl) { run_sequential(b, c, stream, nccl); });
}

void AgGemm::gather(cudaStream_t stream, bool nccl) {
  // In place: our shard already sits in its slot of the gathered A.
  if (nccl)
    WEFT_NCCL(ncclAllGather(local_shard(), gathered_.get(), static_cast<std::size_t>(shard_rows_ * options_.k),
                            nccl_type(options_.dtype), ctx_->nccl(), stream));
  else
    all_gather_->run(local_shard(), gathered_.get(), stream);
}

void AgGemm::run_sequential(const void* b, void* c, cudaStream_t stream, bool nccl) {
  gather(stream, nccl);
  plain_gemm_->run(gathered_.get(), b, c, stream);
}

GemmArgs AgGemm::fused_args(const void* b, void* c) const {
  const int me = ctx_->rank();
  GemmArgs args{.a = gathered_.get(), .b = b, .c = c, .first_row = me * shard_rows_};
  args.wait = RowSignals{.world = &ctx_->world(),
                         .flags = arrived_.as<std::uint64_t>(),
                         .value = 1,
                         .ready_begin = me * shard_rows_,
                         .ready_end = (me + 1) * shard_rows_,
                         .flags_per_rank = static_cast<int>(chunks_),
                         .waited_ns = tile_waits_->counters(),
                         // The GEMM zeroes its flags once every tile saw
                         // them: no reset before the next run. Tuning never waits.
                         .consume = true};
  return args;
}

void AgGemm::run_plan(const ops_detail::AgPlan& plan, const void* b, void* c, cudaStream_t stream) {
  using ops_detail::AgGemmKind;
  const ops_detail::AgLayout flags{ctx_->world_size(), chunks_};
  auto* arrived = arrived_.as<std::uint64_t>();
  const std::int64_t k = options_.k, n = options_.n;
  auto shard_args = [&](int q) {
    return GemmArgs{.a = gathered_.as<char>() + q * shard_rows_ * k * 2,
                    .b = b,
                    .c = static_cast<char*>(c) + q * shard_rows_ * n * 2};
  };
  auto gemm = [&](const ops_detail::AgStep& step) -> Gemm& {
    return step.gemm == AgGemmKind::whole_waiting ? *fused_gemm_ : *step_gemm_;
  };
  auto args = [&](const ops_detail::AgStep& step) {
    return step.gemm == AgGemmKind::whole_waiting ? fused_args(b, c) : shard_args(step.shard);
  };

  // Tune (first run only) before the run starts, so no peer waits on a
  // tuning rank: each GEMM on the first step that runs it (a shard's GEMM on
  // our own rows). The hooked GEMM reads every shard: it tunes on the A it
  // will read, gathered first, not on stale peer slots.
  std::array<bool, ops_detail::kAgGemmKinds> prepared{};
  for (const ops_detail::AgStep& step : plan.steps) {
    if (std::exchange(prepared[static_cast<int>(step.gemm)], true)) continue;
    if (step.gemm == AgGemmKind::whole_waiting && !fused_gemm_->prepared() && !ops_detail::capturing(stream))
      gather(stream, false);
    gemm(step).prepare(args(step), stream);
  }

  if (ag_arrivals_) {
    // Across nodes: the two-level AllGather on the side stream (its "ready"
    // flags stand for the "free" exchange: no peer writes our gathered A
    // before our launch has begun, after our last run's GEMMs), counting into
    // arrived[q]; the stream's first GEMM starts on our own rows.
    ag_arrivals_->run(local_shard(), gathered_.get(), arrived, pipe_->fork(stream));
    trace::mark(stream, "start");
  } else {
    // Every peer hears that our gathered A is free; the side stream pushes once
    // every peer said the same, and the stream waits for nobody: its first GEMM
    // starts on our own rows.
    cudaStream_t side = pipe_->begin(stream);
    trace::mark(stream, "start");
    push_shard(plan.pushes, side);
  }
  // A later plain step waits for its shard's chunk flags in one block before
  // its GEMM, bounded by the timeout that names the peer (a stream-memory
  // wait would hang silently). The shard landed during the step before, so
  // the wait costs a launch.
  for (std::size_t s = 0; s < plan.steps.size(); ++s) {
    const ops_detail::AgStep& step = plan.steps[s];
    if (step.wait == ops_detail::AgWait::shard_flags_before_launch)
      ops_detail::wait_from_and_consume(ctx_->world(), arrived + flags.arrived_word(step.wait_from),
                                        static_cast<int>(chunks_), step.wait_from, stream);
    else if (step.wait == ops_detail::AgWait::shard_arrivals_before_launch)  // across nodes: word q counts blocks
      ops_detail::wait_count_and_consume(ctx_->world(), arrived + step.shard,
                                         static_cast<std::uint64_t>(ag_arrivals_->blocks()), step.wait_from, stream);
    gemm(step).run(args(step), stream);
    if (step.gemm == AgGemmKind::whole_waiting) trace::mark(stream, "GEMM");
    else if (trace::recording()) trace::mark(stream, str("step ", s, " GEMM (shard ", step.shard, ")"));
  }
  pipe_->join(stream);  // our pushes (or the AllGather) are done: the caller may overwrite its shard
}

void AgGemm::push_shard(const std::vector<int>& peers, cudaStream_t side) {
  const int me = ctx_->rank();
  const ops_detail::AgLayout flags{ctx_->world_size(), chunks_};
  auto* arrived = arrived_.as<std::uint64_t>();
  // Into slot `me` of each peer's gathered A; its chunks' flags are [me][chunk] there.
  for (const int peer : peers) {
    auto* peer_arrived = static_cast<std::uint64_t*>(ctx_->heap().peer_ptr(arrived, peer));
    for (std::int64_t c = 0; c < chunks_; ++c) {
      ops_detail::push_chunk(ctx_->heap().peer_ptr(local_shard(), peer), local_shard(),
                             static_cast<std::uint64_t>(chunk_rows_ * options_.k * 2), c,
                             peer_arrived + flags.arrived_word(me), side);
      if (trace::recording()) trace::mark(side, str("side: chunk ", c, " sent to ", peer));
    }
  }
}

}  // namespace weft
