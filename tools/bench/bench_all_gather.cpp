// weft-bench all_gather: every variant against NCCL's all_gather, in one run, on the same buffers.
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <map>

#include "bench.hpp"
#include "gpu_check.hpp"
#include "timing.hpp"
#include "weft/core/env.hpp"
#include "weft/core/error.hpp"
#include "weft/ops/all_gather.hpp"

namespace weft::bench {
namespace {

ncclDataType_t nccl_type(const std::string& dtype) {
  if (dtype == "fp16") return ncclHalf;
  if (dtype == "fp32") return ncclFloat32;
  return ncclBfloat16;
}

struct Row {
  std::uint64_t bytes = 0;
  std::string variant;
  int blocks = 0;
  double weft_loop = 0, nccl_loop = 0, weft_single = 0, nccl_single = 0;
  std::string check = "skipped";
};

// Calls back to back per sample: enough to hide launch overhead, bounded for large sizes.
int calls_for(std::uint64_t bytes) {
  return static_cast<int>(std::clamp<std::uint64_t>((std::uint64_t{64} << 20) / bytes, 2, 100));
}

// Fresh random input on every rank, poisoned outputs, one weft run and one
// NCCL run; weft's output must equal NCCL's and every shard its owner's input.
std::string check_once(Context& ctx, AllGather& plan, void* input, void* output, void* nccl_out,
                       ncclDataType_t type, int elem, cudaStream_t stream) {
  const std::uint64_t bytes = plan.bytes_per_rank();
  const int world = ctx.world_size();
  std::uint64_t seed = fresh_seed(ctx.rank(), bytes);
  auto seeds = ctx.store().all_gather(std::to_string(seed), "check seeds");
  fill_random(input, bytes, seed, stream);
  poison(output, bytes * world, 0xA5, stream);
  poison(nccl_out, bytes * world, 0x5A, stream);
  ctx.barrier(stream);
  plan.run(input, output, stream);
  WEFT_NCCL(ncclAllGather(input, nccl_out, bytes / elem, type, ctx.nccl(), stream));
  ctx.synchronize(stream);
  std::uint64_t bad = count_mismatches(output, nccl_out, bytes * world, stream);
  for (int p = 0; p < world; ++p)
    bad += count_mismatches_random(static_cast<char*>(output) + p * bytes, bytes, std::stoull(seeds[p]), stream);
  return bad ? str("FAIL(", bad, " bytes)") : "ok";
}

}  // namespace

int bench_all_gather(const std::shared_ptr<Context>& ctx_ptr, const BenchArgs& args) {
  Context& ctx = *ctx_ptr;
  const int world = ctx.world_size(), me = ctx.rank();
  const std::uint64_t max_bytes = args.bytes.back();
  const int elem = dtype_bytes(args.dtype);
  const ncclDataType_t type = nccl_type(args.dtype);
  cudaStream_t stream;
  WEFT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  SymmetricBuffer input(ctx.heap(), max_bytes, args.dtype, "bench.all_gather.input");
  SymmetricBuffer output(ctx.heap(), max_bytes * world, args.dtype, "bench.all_gather.output");
  void* nccl_out = nullptr;
  WEFT_CUDA(cudaMalloc(&nccl_out, max_bytes * world));
  fill_random(input.get(), max_bytes, fresh_seed(me, 1), stream);

  std::vector<Row> rows;
  bool all_ok = true;
  for (std::uint64_t bytes : args.bytes) {
    const int calls = calls_for(bytes);
    auto nccl = [&] {
      WEFT_NCCL(ncclAllGather(input.get(), nccl_out, bytes / elem, type, ctx.nccl(), stream));
    };
    double nccl_loop = time_per_call(ctx, stream, nccl, calls, args.samples, args.warmup);
    double nccl_single = time_per_call(ctx, stream, nccl, 1, args.samples, args.warmup);
    for (const std::string& v : args.variants) {
      if (v == "ll" && bytes > kAllGatherLowLatencyMaxBytes) continue;  // beyond LL's range
      if (me == 0) std::fprintf(stderr, "[weft-bench] all_gather %s per rank, %s ...\n", format_bytes(bytes).c_str(), v.c_str());
      AllGather plan(ctx_ptr, {bytes, parse_all_gather_variant(v), args.blocks});
      Row row;
      row.bytes = bytes;
      row.variant = v == "auto" ? std::string("a:") + to_string(plan.variant()) : to_string(plan.variant());
      row.blocks = plan.sms_used();
      if (args.check) row.check = check_once(ctx, plan, input.get(), output.get(), nccl_out, type, elem, stream);
      auto weft = [&] { plan.run(input.get(), output.get(), stream); };
      row.weft_loop = time_per_call(ctx, stream, weft, calls, args.samples, args.warmup);
      row.weft_single = time_per_call(ctx, stream, weft, 1, args.samples, args.warmup);
      row.nccl_loop = nccl_loop;
      row.nccl_single = nccl_single;
      if (args.check) {  // the timed runs must have left the same, right answer
        WEFT_NCCL(ncclAllGather(input.get(), nccl_out, bytes / elem, type, ctx.nccl(), stream));
        std::uint64_t bad = count_mismatches(output.get(), nccl_out, bytes * world, stream);
        if (bad && row.check == "ok") row.check = str("FAIL-after-timing(", bad, ")");
      }
      // Every rank must agree on the verdict.
      for (auto& c : ctx.store().all_gather(row.check, "check verdicts"))
        if (c != "ok" && c != "skipped") row.check = c;
      all_ok &= row.check == "ok" || row.check == "skipped";
      rows.push_back(row);
    }
  }
  WEFT_CUDA(cudaFree(nccl_out));
  WEFT_CUDA(cudaStreamDestroy(stream));

  if (me == 0) {
    auto gbs = [&](std::uint64_t bytes, double us) { return static_cast<double>(bytes) * world / (us * 1e3); };
    if (args.json) {
      for (auto& r : rows)
        std::printf("{\"op\":\"all_gather\",\"world\":%d,\"dtype\":\"%s\",\"bytes_per_rank\":%llu,\"variant\":\"%s\","
                    "\"sms\":%d,\"weft_loop_us\":%.3f,\"nccl_loop_us\":%.3f,\"weft_single_us\":%.3f,"
                    "\"nccl_single_us\":%.3f,\"algbw_weft_gbs\":%.2f,\"algbw_nccl_gbs\":%.2f,\"check\":\"%s\"}\n",
                    world, args.dtype.c_str(), static_cast<unsigned long long>(r.bytes), r.variant.c_str(), r.blocks,
                    r.weft_loop, r.nccl_loop, r.weft_single, r.nccl_single, gbs(r.bytes, r.weft_loop),
                    gbs(r.bytes, r.nccl_loop), r.check.c_str());
    } else {
      std::printf("all_gather, %d ranks, %s; times in us per call (median of %d samples, max over ranks);\n"
                  "loop = back-to-back calls, single = one call after a device barrier; ratio = weft/NCCL time;\n"
                  "algbw = world x bytes / loop time\n",
                  world, args.dtype.c_str(), args.samples);
      std::printf("%8s %7s %4s | %9s %9s %6s | %9s %9s %6s | %8s %8s | %s\n", "bytes", "variant", "SMs", "weft", "nccl",
                  "ratio", "weft", "nccl", "ratio", "GB/s", "nccl", "check");
      std::printf("%8s %7s %4s | %26s | %26s | %17s |\n", "", "", "", "loop", "single", "algbw");
      for (auto& r : rows)
        std::printf("%8s %7s %4d | %9.2f %9.2f %6.3f | %9.2f %9.2f %6.3f | %8.1f %8.1f | %s\n",
                    format_bytes(r.bytes).c_str(), r.variant.c_str(), r.blocks, r.weft_loop, r.nccl_loop,
                    r.weft_loop / r.nccl_loop, r.weft_single, r.nccl_single, r.weft_single / r.nccl_single,
                    gbs(r.bytes, r.weft_loop), gbs(r.bytes, r.nccl_loop), r.check.c_str());
    }
    std::fflush(stdout);
  }
  return all_ok ? 0 : 3;
}

}  // namespace weft::bench
