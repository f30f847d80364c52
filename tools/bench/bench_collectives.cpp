// weft-bench all_gather | all_reduce | reduce_scatter: every requested variant
// against NCCL's collective, in one run, on the same buffers.
//
// --bytes is the message per rank: AllGather's input, AllReduce's buffer,
// ReduceScatter's input (its output is bytes / world). Bus bandwidth follows
// nccl-tests: AllReduce bytes/t x 2(W-1)/W; ReduceScatter bytes/t x (W-1)/W;
// AllGather W x bytes/t x (W-1)/W.
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>

#include "bench.hpp"
#include "enqueue_hold.hpp"
#include "gpu_check.hpp"
#include "timing.hpp"
#include "weft/core/env.hpp"
#include "weft/core/error.hpp"
#include "weft/core/nccl_type.hpp"
#include "weft/ops/all_gather.hpp"
#include "weft/ops/all_reduce.hpp"
#include "weft/ops/reduce_scatter.hpp"

namespace weft::bench {
namespace {

std::string join_variants(const std::vector<std::string>& variants) {
  std::string s;
  for (const auto& v : variants) s += (s.empty() ? "" : ", ") + v;
  return s;
}

struct Row {
  std::uint64_t bytes = 0;
  std::string variant;
  int sms = 0;
  double weft_loop = 0, nccl_loop = 0, weft_single = 0, nccl_single = 0;
  std::string check = "skipped";
};

// The buffers of one operation at its largest size; smaller sizes use prefixes.
struct Buffers {
  SymmetricBuffer input, output;
  void* nccl_out = nullptr;
  std::uint64_t out_bytes = 0;
  Buffers(Context& ctx, const std::string& op, std::uint64_t max_bytes, const std::string& dtype) {
    const std::uint64_t w = ctx.world_size();
    out_bytes = op == "all_gather" ? max_bytes * w : op == "reduce_scatter" ? max_bytes / w : max_bytes;
    input = SymmetricBuffer(ctx.heap(), max_bytes, dtype, "bench.input");
    output = SymmetricBuffer(ctx.heap(), out_bytes, dtype, "bench.output");
    WEFT_CUDA(cudaMalloc(&nccl_out, out_bytes));
  }
  ~Buffers() { cudaFree(nccl_out); }
};

// One operation at one size and variant: how to run weft, how to run NCCL
// (empty where the job has no NCCL: ranks sharing a GPU).
struct Case {
  std::function<void(cudaStream_t)> weft, nccl;
  std::string variant;
  int sms = 0;
  std::uint64_t out_bytes = 0;
};

Case make_case(const std::shared_ptr<Context>& ctx, const std::string& op, const std::string& v, std::uint64_t bytes,
               const BenchArgs& args, Buffers& b, std::shared_ptr<void>& plan_holder) {
  Case c;
  const int elem = dtype_bytes(args.dtype);
  const std::uint64_t w = ctx->world_size();
  const ncclDataType_t type = nccl_type(parse_dtype(args.dtype));
  void *in = b.input.get(), *out = b.output.get(), *nout = b.nccl_out;
  ncclComm_t comm = ctx->has_nccl() ? ctx->nccl() : nullptr;
  auto label = [&](const char* chosen) { return v == "auto" ? std::string("a:") + chosen : std::string(chosen); };
  if (op == "all_gather") {
    auto plan = std::make_shared<AllGather>(ctx, AllGatherOptions{bytes, parse_all_gather_variant(v), args.max_sms});
    c.weft = [plan, in, out](cudaStream_t s) { plan->run(in, out, s); };
    if (comm) c.nccl = [=](cudaStream_t s) { WEFT_NCCL(ncclAllGather(in, nout, bytes / elem, type, comm, s)); };
    c.variant = label(to_string(plan->variant()));
    c.sms = plan->sms_used();
    c.out_bytes = bytes * w;
    plan_holder = plan;
  } else if (op == "all_reduce") {
    auto plan = std::make_shared<AllReduce>(
        ctx, AllReduceOptions{bytes / elem, parse_dtype(args.dtype), parse_all_reduce_variant(v), args.max_sms});
    c.weft = [plan, in, out](cudaStream_t s) { plan->run(in, out, s); };
    if (comm) c.nccl = [=](cudaStream_t s) { WEFT_NCCL(ncclAllReduce(in, nout, bytes / elem, type, ncclSum, comm, s)); };
    c.variant = label(to_string(plan->variant()));
    c.sms = plan->sms_used();
    c.out_bytes = bytes;
    plan_holder = plan;
  } else {
    WEFT_REQUIRE(bytes % (w * elem) == 0, "reduce_scatter: --bytes ", bytes, " is not a whole number of ", w,
                 " x ", args.dtype, " slices (one per rank)");
    const std::uint64_t count = bytes / (w * elem);
    auto plan = std::make_shared<ReduceScatter>(
        ctx, ReduceScatterOptions{count, parse_dtype(args.dtype), parse_reduce_scatter_variant(v), args.max_sms});
    c.weft = [plan, in, out](cudaStream_t s) { plan->run(in, out, s); };
    if (comm) c.nccl = [=](cudaStream_t s) { WEFT_NCCL(ncclReduceScatter(in, nout, count, type, ncclSum, comm, s)); };
    c.variant = label(to_string(plan->variant()));
    c.sms = plan->sms_used();
    c.out_bytes = count * elem;
    plan_holder = plan;
  }
  return c;
}

// Every variant but the low-latency and one-shot ones at any size (two_level included).
bool variant_fits(const std::string& op, const std::string& v, std::uint64_t bytes, int world) {
  if (op == "all_gather") return v != "ll" || bytes <= kAllGatherLowLatencyMaxBytes;
  if (op == "all_reduce")
    return (v != "ll" || bytes <= kAllReduceLowLatencyMaxBytes) && (v != "one_shot" || bytes <= kAllReduceOneShotMaxBytes);
  return v != "ll" || bytes / world <= kReduceScatterLowLatencyMaxBytes;
}

// The variants to time in this job: where some peer is not mapped (ranks on
// several nodes, or virtual nodes), "all" means two_level (BenchArgs); rank 0
// says so where that differs from the one-node list.
const std::vector<std::string>& variants_here(Context& ctx, const BenchArgs& args) {
  if (ctx.all_peers_direct()) return args.variants;
  if (ctx.rank() == 0 && args.variants_across_nodes != args.variants)
    std::fprintf(stderr,
                 "[weft-bench] ranks span nodes (or virtual nodes), which the one-node variants cannot reach, so "
                 "--variant all means two_level here: timing %s\n",
                 join_variants(args.variants_across_nodes).c_str());
  return args.variants_across_nodes;
}

// Without NCCL: weft's output against every rank's input rebuilt from its
// seed - gathered bytes bitwise, sums against a float sum of the inputs.
std::string check_against_seeds(Context& ctx, const std::string& op, const Case& c, std::uint64_t bytes,
                                const BenchArgs& args, Buffers& b, const std::vector<std::uint64_t>& seeds,
                                cudaStream_t stream) {
  const int elem = dtype_bytes(args.dtype), world = ctx.world_size();
  if (op == "all_gather") {
    std::uint64_t bad = 0;
    for (int p = 0; p < world; ++p)
      bad += count_mismatches_random(b.output.as<char>() + p * bytes, bytes, seeds[p], stream);
    return bad ? str("FAIL(", bad, " bytes)") : "ok";
  }
  const std::uint64_t count = c.out_bytes / elem;
  const std::uint64_t first = op == "reduce_scatter" ? count * ctx.rank() : 0;
  float* ref = nullptr;
  WEFT_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&ref), count * sizeof(float), stream));
  WEFT_CUDA(cudaMemsetAsync(ref, 0, count * sizeof(float), stream));
  for (int p = 0; p < world; ++p) accumulate_uniform(ref, count, args.dtype, seeds[p], first, stream);
  const double err = relative_error_vs_fp32(b.output.get(), args.dtype, ref, count, stream);
  WEFT_CUDA(cudaFreeAsync(ref, stream));
  const double tol = args.dtype == "fp32" ? 1e-6 : 1e-2;
  return err <= tol ? "ok" : str("FAIL(rel ", err, " vs the float sum of the inputs)");
}

// Fresh inputs on every rank, poisoned outputs, one weft run and one NCCL run.
// Data movement must match bitwise; sums must match bitwise at two ranks (IEEE
// addition commutes) and within the type's tolerance beyond. Without NCCL the
// reference is every rank's input, rebuilt from its seed.
std::string check_once(Context& ctx, const std::string& op, const Case& c, std::uint64_t bytes, const BenchArgs& args,
                       Buffers& b, cudaStream_t stream) {
  const int elem = dtype_bytes(args.dtype);
  std::uint64_t seed = fresh_seed(ctx.rank(), bytes);
  if (op == "all_gather") fill_random(b.input.get(), bytes, seed, stream);
  else fill_uniform(b.input.get(), bytes / elem, args.dtype, seed, stream);
  poison(b.output.get(), c.out_bytes, 0xA5, stream);
  poison(b.nccl_out, c.out_bytes, 0x5A, stream);
  ctx.barrier(stream);
  c.weft(stream);
  if (!c.nccl) {
    ctx.synchronize(stream);
    std::vector<std::uint64_t> seeds;
    for (const std::string& s : ctx.store().all_gather(std::to_string(seed), "check seeds")) seeds.push_back(std::stoull(s));
    return check_against_seeds(ctx, op, c, bytes, args, b, seeds, stream);
  }
  c.nccl(stream);
  ctx.synchronize(stream);
  if (op == "all_gather") {
    std::uint64_t bad = count_mismatches(b.output.get(), b.nccl_out, c.out_bytes, stream);
    return bad ? str("FAIL(", bad, " bytes)") : "ok";
  }
  ValueDiff d = compare_values(b.output.get(), b.nccl_out, c.out_bytes / elem, args.dtype, stream);
  const double tol = args.dtype == "fp32" ? 1e-6 : 1e-2;
  if (ctx.world_size() <= 2 ? d.mismatched != 0 : d.relative_error > tol)
    return str("FAIL(", d.mismatched, " differ, rel ", d.relative_error, ")");
  return "ok";
}

double busbw(const std::string& op, std::uint64_t bytes, int world, double us) {
  const double w = world, t = us * 1e-6;
  if (op == "all_reduce") return bytes / t * 2 * (w - 1) / w / 1e9;
  if (op == "reduce_scatter") return bytes / t * (w - 1) / w / 1e9;
  return bytes * w / t * (w - 1) / w / 1e9;
}

int calls_for(std::uint64_t bytes) {
  return static_cast<int>(std::clamp<std::uint64_t>((std::uint64_t{64} << 20) / bytes, 2, 100));
}


// ---- --enqueue: what one call costs the host ------------------------------

// Calls enqueued per sample: far below the depth of CUDA's launch queue
// (about a thousand launches), past which a launch blocks until the GPU has
// taken some, which would time the GPU again.
constexpr int kEnqueueCalls = 100;

// Host microseconds per call of `fn`: kEnqueueCalls calls enqueued behind a
// held stream (nothing runs until all are enqueued, so no call waits for the
// GPU), the wall time divided by the calls; the median over the samples on
// this rank.
double host_us_per_call(Context& ctx, cudaStream_t stream, EnqueueHold& held, const std::function<void()>& fn,
                        int samples, int warmup) {
  std::vector<double> us;
  for (int s = 0; s < warmup + samples; ++s) {
    ctx.synchronize(stream);
    held.hold(stream);
    const auto t0 = std::chrono::steady_clock::now();
    for (int c = 0; c < kEnqueueCalls; ++c) fn();
    const auto t1 = std::chrono::steady_clock::now();
    held.release();
    ctx.synchronize(stream);
    WEFT_REQUIRE(!held.timed_out(), "weft-bench --enqueue: rank ", ctx.rank(), " took over ", held.limit_ms(),
                 " ms to enqueue ", kEnqueueCalls, " calls: the hold gave up, so the sample is not the host's alone");
    if (s >= warmup) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / kEnqueueCalls);
  }
  return median(us);
}

struct EnqueueRow {
  std::uint64_t bytes = 0;
  std::string variant;
  double run_host = 0, graph_launch_host = 0, graph_replay_device = 0, run_device = 0, nccl_host = -1;
};

// weft-bench OP --enqueue: per size and variant, the host's time to enqueue
// one run(), one launch of a CUDA graph holding one run(), and that graph's
// replay time on the GPU (events around kEnqueueCalls replays behind a held
// stream), beside the GPU time of run() back to back and NCCL's enqueue.
int bench_enqueue(const std::shared_ptr<Context>& ctx_ptr, const BenchArgs& args) {
  Context& ctx = *ctx_ptr;
  const std::string& op = args.op;
  cudaStream_t stream;
  WEFT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<EnqueueRow> rows;
  {
    Buffers b(ctx, op, args.bytes.back(), args.dtype);
    fill_random(b.input.get(), args.bytes.back(), fresh_seed(ctx.rank(), 1), stream);
    if (op != "all_gather") fill_uniform(b.input.get(), args.bytes.back() / dtype_bytes(args.dtype), args.dtype, 7, stream);
    EnqueueHold held;
    const std::vector<std::string>& variants = variants_here(ctx, args);
    for (std::uint64_t bytes : args.bytes) {
      for (const std::string& v : variants) {
        if (!variant_fits(op, v, bytes, ctx.world_size())) continue;
        if (ctx.rank() == 0)
          std::fprintf(stderr, "[weft-bench] %s %s per rank, %s, enqueue ...\n", op.c_str(), format_bytes(bytes).c_str(),
                       v.c_str());
        std::shared_ptr<void> plan;
        Case c = make_case(ctx_ptr, op, v, bytes, args, b, plan);
        // One eager call first: a first run may finish setting up, and must not be captured.
        ctx.barrier(stream);
        c.weft(stream);
        ctx.synchronize(stream);
        cudaGraph_t graph = nullptr;
        cudaGraphExec_t exec = nullptr;
        WEFT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        c.weft(stream);
        WEFT_CUDA(cudaStreamEndCapture(stream, &graph));
        WEFT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
        WEFT_CUDA(cudaGraphUpload(exec, stream));
        auto replay = [&] { WEFT_CUDA(cudaGraphLaunch(exec, stream)); };
        std::vector<double> mine = {
            host_us_per_call(ctx, stream, held, [&] { c.weft(stream); }, args.samples, args.warmup),
            host_us_per_call(ctx, stream, held, replay, args.samples, args.warmup),
            time_per_call(ctx, stream, replay, kEnqueueCalls, args.samples, args.warmup, true),
            time_per_call(ctx, stream, [&] { c.weft(stream); }, kEnqueueCalls, args.samples, args.warmup, true),
            c.nccl ? host_us_per_call(ctx, stream, held, [&] { c.nccl(stream); }, args.samples, args.warmup) : -1.0};
        ctx.synchronize(stream);
        WEFT_CUDA(cudaGraphExecDestroy(exec));
        WEFT_CUDA(cudaGraphDestroy(graph));
        const std::vector<double> worst = slowest_over_ranks(ctx, mine, "enqueue timing");
        EnqueueRow row;
        row.bytes = bytes;
        row.variant = c.variant;
        row.run_host = worst[0];
        row.graph_launch_host = worst[1];
        row.graph_replay_device = worst[2];
        row.run_device = worst[3];
        row.nccl_host = worst[4];
        rows.push_back(row);
      }
    }
  }
  WEFT_CUDA(cudaStreamDestroy(stream));
  if (ctx.rank() != 0) return 0;
  if (args.json) {
    for (const auto& r : rows)
      std::printf("{\"op\":\"%s\",\"mode\":\"enqueue\",\"world\":%d,\"dtype\":\"%s\",\"bytes\":%llu,\"variant\":\"%s\","
                  "\"calls_per_sample\":%d,\"run_host_us\":%.3f,\"graph_launch_host_us\":%.3f,"
                  "\"graph_replay_device_us\":%.3f,\"run_device_us\":%.3f,\"nccl_host_us\":%.3f,"
                  "\"shared_gpu\":%s}\n",
                  op.c_str(), ctx.world_size(), args.dtype.c_str(), static_cast<unsigned long long>(r.bytes),
                  r.variant.c_str(), kEnqueueCalls, r.run_host, r.graph_launch_host, r.graph_replay_device,
                  r.run_device, r.nccl_host, ctx.team().shares_gpus() ? "true" : "false");
  } else {
    std::printf("%s, %d rank(s), %s: us per call, median of %d samples of %d calls enqueued behind a held stream, max "
                "over ranks.\nhost = the host's time to enqueue one call; GPU = CUDA events around the calls, run "
                "back to back\n",
                op.c_str(), ctx.world_size(), args.dtype.c_str(), args.samples, kEnqueueCalls);
    std::printf("%8s %11s | %10s %10s | %12s %12s | %10s\n", "bytes", "variant", "run", "run", "graph launch",
                "graph replay", "nccl");
    std::printf("%8s %11s | %10s %10s | %12s %12s | %10s\n", "", "", "host", "GPU", "host", "GPU", "host");
    for (const auto& r : rows) {
      char nccl[32] = "-";
      if (r.nccl_host >= 0) std::snprintf(nccl, sizeof nccl, "%.2f", r.nccl_host);
      std::printf("%8s %11s | %10.2f %10.2f | %12.2f %12.2f | %10s\n", format_bytes(r.bytes).c_str(),
                  r.variant.c_str(), r.run_host, r.run_device, r.graph_launch_host, r.graph_replay_device, nccl);
    }
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

int bench_collective(const std::shared_ptr<Context>& ctx_ptr, const BenchArgs& args) {
  if (args.enqueue) return bench_enqueue(ctx_ptr, args);
  Context& ctx = *ctx_ptr;
  const int world = ctx.world_size(), me = ctx.rank();
  const std::string& op = args.op;
  cudaStream_t stream;
  WEFT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<Row> rows;
  bool all_ok = true;
  {
    Buffers b(ctx, op, args.bytes.back(), args.dtype);
    fill_random(b.input.get(), args.bytes.back(), fresh_seed(me, 1), stream);
    if (op != "all_gather") fill_uniform(b.input.get(), args.bytes.back() / dtype_bytes(args.dtype), args.dtype, 7, stream);
    const std::vector<std::string>& variants = variants_here(ctx, args);
    for (std::uint64_t bytes : args.bytes) {
      const int calls = calls_for(bytes);
      double nccl_loop = -1, nccl_single = -1;
      for (const std::string& v : variants) {
        if (!variant_fits(op, v, bytes, world)) continue;
        if (me == 0) std::fprintf(stderr, "[weft-bench] %s %s per rank, %s ...\n", op.c_str(), format_bytes(bytes).c_str(), v.c_str());
        std::shared_ptr<void> plan;
        Case c = make_case(ctx_ptr, op, v, bytes, args, b, plan);
        if (nccl_loop < 0 && c.nccl) {
          nccl_loop = time_per_call(ctx, stream, [&] { c.nccl(stream); }, calls, args.samples, args.warmup, args.hold);
          nccl_single = time_per_call(ctx, stream, [&] { c.nccl(stream); }, 1, args.samples, args.warmup, args.hold);
        }
        Row row;
        row.bytes = bytes;
        row.variant = c.variant;
        row.sms = c.sms;
        if (args.check) row.check = check_once(ctx, op, c, bytes, args, b, stream);
        row.weft_loop = time_per_call(ctx, stream, [&] { c.weft(stream); }, calls, args.samples, args.warmup, args.hold);
        row.weft_single = time_per_call(ctx, stream, [&] { c.weft(stream); }, 1, args.samples, args.warmup, args.hold);
        row.nccl_loop = nccl_loop;
        row.nccl_single = nccl_single;
        if (args.check && row.check == "ok" && c.nccl) {  // the timed runs must have left the same answer
          c.nccl(stream);
          ctx.synchronize(stream);
          std::uint64_t bad = count_mismatches(b.output.get(), b.nccl_out, c.out_bytes, stream);
          if (bad && (op == "all_gather" || world <= 2)) row.check = str("FAIL-after-timing(", bad, " bytes)");
        }
        for (auto& verdict : ctx.store().all_gather(row.check, "check verdicts"))
          if (verdict != "ok" && verdict != "skipped") row.check = verdict;
        all_ok &= row.check == "ok" || row.check == "skipped";
        rows.push_back(row);
      }
    }
  }
  WEFT_CUDA(cudaStreamDestroy(stream));

  if (me == 0 && !ctx.has_nccl()) {
    // Ranks share a GPU: weft's times alone, as a record of the run, not as figures.
    if (args.json) {
      for (auto& r : rows)
        std::printf("{\"op\":\"%s\",\"world\":%d,\"dtype\":\"%s\",\"bytes\":%llu,\"variant\":\"%s\",\"sms\":%d,"
                    "\"weft_loop_us\":%.3f,\"weft_single_us\":%.3f,\"shared_gpu\":true,\"check\":\"%s\"}\n",
                    op.c_str(), world, args.dtype.c_str(), static_cast<unsigned long long>(r.bytes), r.variant.c_str(),
                    r.sms, r.weft_loop, r.weft_single, r.check.c_str());
    } else {
      std::printf("%s, %d ranks sharing GPUs, %s; us per call (median of %d samples, max over ranks).\n"
                  "Times on a shared GPU are not performance figures; no NCCL baseline (NCCL refuses ranks that share a "
                  "GPU).\n",
                  op.c_str(), world, args.dtype.c_str(), args.samples);
      std::printf("%8s %11s %4s | %9s %9s | %s\n", "bytes", "variant", "SMs", "loop", "single", "check");
      for (auto& r : rows)
        std::printf("%8s %11s %4d | %9.2f %9.2f | %s\n", format_bytes(r.bytes).c_str(), r.variant.c_str(), r.sms,
                    r.weft_loop, r.weft_single, r.check.c_str());
    }
    std::fflush(stdout);
  } else if (me == 0) {
    if (args.json) {
      for (auto& r : rows)
        std::printf("{\"op\":\"%s\",\"world\":%d,\"dtype\":\"%s\",\"bytes\":%llu,\"variant\":\"%s\",\"sms\":%d,"
                    "\"weft_loop_us\":%.3f,\"nccl_loop_us\":%.3f,\"weft_single_us\":%.3f,\"nccl_single_us\":%.3f,"
                    "\"busbw_weft_gbs\":%.2f,\"busbw_nccl_gbs\":%.2f,\"check\":\"%s\"}\n",
                    op.c_str(), world, args.dtype.c_str(), static_cast<unsigned long long>(r.bytes), r.variant.c_str(),
                    r.sms, r.weft_loop, r.nccl_loop, r.weft_single, r.nccl_single,
                    busbw(op, r.bytes, world, r.weft_loop), busbw(op, r.bytes, world, r.nccl_loop), r.check.c_str());
    } else {
      std::printf("%s, %d ranks, %s; us per call (median of %d samples, max over ranks); loop = back to back,\n"
                  "single = one call after a device barrier; ratio = weft/NCCL time; busbw from the loop times\n",
                  op.c_str(), world, args.dtype.c_str(), args.samples);
      std::printf("%8s %11s %4s | %9s %9s %6s | %9s %9s %6s | %8s %8s | %s\n", "bytes", "variant", "SMs", "weft",
                  "nccl", "ratio", "weft", "nccl", "ratio", "busbw", "nccl", "check");
      std::printf("%8s %11s %4s | %26s | %26s | %17s |\n", "", "", "", "loop", "single", "GB/s");
      for (auto& r : rows)
        std::printf("%8s %11s %4d | %9.2f %9.2f %6.3f | %9.2f %9.2f %6.3f | %8.1f %8.1f | %s\n",
                    format_bytes(r.bytes).c_str(), r.variant.c_str(), r.sms, r.weft_loop, r.nccl_loop,
                    r.weft_loop / r.nccl_loop, r.weft_single, r.nccl_single, r.weft_single / r.nccl_single,
                    busbw(op, r.bytes, world, r.weft_loop), busbw(op, r.bytes, world, r.nccl_loop), r.check.c_str());
    }
    std::fflush(stdout);
  }
  return all_ok ? 0 : 3;
}

}  // namespace weft::bench
