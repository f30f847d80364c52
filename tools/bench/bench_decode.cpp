// weft-bench decode: FlashDecode on this rank's GPU, in KV bytes read per
// second, against the HBM copy bound measured in the same run (a
// device-to-device cudaMemcpyAsync of the same K and V bytes, read + write),
// the two timed in turn with CUDA events (timing.hpp), warm-up excluded.
// Paged cases deal each sequence's pages to physical pages in a fixed
// shuffled order, as a serving cache's pages lie. With --dist every rank
// holds a contiguous shard of ceil(L / ranks) keys of each sequence, and the
// distributed call is timed beside FlashDecode over the shard alone: their
// difference is the exchange and combine; the combine step is also timed
// alone (DistFlashDecode::combine). --stages, --merge and --page-lookup force
// a kernel variant [0064]; --sweep times every variant of each case in turn
// with the default and prints each one's TB/s beside the default's, so one
// GPU run says which wins where.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "bench.hpp"
#include "decode_reference.hpp"
#include "gpu_check.hpp"
#include "timing.hpp"
#include "weft/core/error.hpp"
#include "weft/ops/dist_flash_decode.hpp"
#include "weft/ops/flash_decode.hpp"

namespace weft::bench {
namespace {

/// "32K" for whole multiples of 1024 keys, else the number.
std::string keys_label(std::int64_t keys) { return keys % 1024 == 0 ? str(keys / 1024, "K") : str(keys); }

/// What a plan runs, as the sweep's table shows it: splits, stages, merge (none at one split), pages.
std::string merge_label(const FlashDecode& op) { return op.splits() > 1 ? to_string(op.merge()) : "-"; }
std::string pages_label(const FlashDecode& op) {
  return op.options().layout == KvLayout::paged ? to_string(op.page_lookup()) : "-";
}
auto resolved(const FlashDecode& op) {
  return std::make_tuple(op.splits(), op.stages(), merge_label(op), pages_label(op));
}

/// The variants --sweep times for a case, over its default options `base` whose plan chose
/// `splits` splits [0064]: half the splits (and one, where the plan takes 2-4), the other stage
/// count, the other merge, on paged caches the other page lookup, and decision 0053's kernel
/// (3 stages, the merge launch, pages per row). Variants that
/// resolve to the same kernel and split count as an earlier one are dropped by the caller.
std::vector<std::pair<std::string, FlashDecodeOptions>> sweep_variants(const FlashDecodeOptions& base, int splits) {
  std::vector<std::pair<std::string, FlashDecodeOptions>> v;
  auto add = [&](const std::string& name, auto change) {
    FlashDecodeOptions o = base;
    change(o);
    v.emplace_back(name, o);
  };
  const bool paged = base.layout == KvLayout::paged;
  add("default", [](FlashDecodeOptions&) {});
  if (splits > 1) add(str("splits ", splits / 2, " (/2)"), [&](FlashDecodeOptions& o) { o.splits = splits / 2; });
  if (splits > 1 && splits <= 4) add("splits 1", [](FlashDecodeOptions& o) { o.splits = 1; });
  add("stages 3", [](FlashDecodeOptions& o) { o.stages = 3; });
  add("stages 6", [](FlashDecodeOptions& o) { o.stages = 6; });
  add("merge launch", [](FlashDecodeOptions& o) { o.merge = DecodeMerge::launch; });
  add("merge last_block", [](FlashDecodeOptions& o) { o.merge = DecodeMerge::last_block; });
  if (paged) {
    add("pages per row", [](FlashDecodeOptions& o) { o.page_lookup = PageLookup::per_row; });
    add("pages per warp", [](FlashDecodeOptions& o) { o.page_lookup = PageLookup::per_warp; });
  }
  add("stages 3, merge launch", [](FlashDecodeOptions& o) {
    o.stages = 3;
    o.merge = DecodeMerge::launch;
  });
  add(paged ? "0053 kernel (pages per row)" : "0053 kernel", [&](FlashDecodeOptions& o) {
    o.stages = 3;
    o.merge = DecodeMerge::launch;
    if (paged) o.page_lookup = PageLookup::per_row;
  });
  return v;
}

}  // namespace

int bench_decode(const std::shared_ptr<Context>& ctx_ptr, const BenchArgs& args) {
  Context& ctx = *ctx_ptr;
  cudaStream_t stream;
  WEFT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const DType dtype = parse_dtype(args.dtype);
  constexpr int kHeadDim = 128;
  struct Row {
    DecodeCase c;
    int splits;
    double us, copy_us, kv_bytes, rel_err, lse_err;
    double dist_us = 0, combine_us = 0;  // --dist: the distributed call over the same shard, its combine alone
    int stages = 0;                      // the plan's kernel: stages, merge, page lookup
    std::string merge, pages;
  };
  struct SweepRow {  // --sweep: one variant of one case
    std::size_t case_index;
    std::string name;
    int splits, stages;
    std::string merge, pages;
    double us, rel_err, lse_err;
  };
  std::vector<Row> rows;
  std::vector<SweepRow> sweep_rows;
  bool ok = true;
  for (DecodeCase c : args.decode_cases) {
    if (args.dist) c.kv_len = (c.kv_len + ctx.world_size() - 1) / ctx.world_size();  // this rank's shard
    if (ctx.rank() == 0)
      std::fprintf(stderr, "[weft-bench] decode batch %lld, %lld/%lld heads, KV %lld%s ...\n",
                   static_cast<long long>(c.batch), static_cast<long long>(c.q_heads),
                   static_cast<long long>(c.kv_heads), static_cast<long long>(c.kv_len),
                   c.page_size ? str(", page ", c.page_size).c_str() : ", contiguous");
    FlashDecodeOptions o;
    o.batch = static_cast<int>(c.batch);
    o.q_heads = static_cast<int>(c.q_heads);
    o.kv_heads = static_cast<int>(c.kv_heads);
    o.head_dim = kHeadDim;
    o.dtype = dtype;
    std::vector<std::int32_t> table;
    std::int64_t rows_per_head;  // key rows of the cache per KV head
    if (c.page_size) {
      o.layout = KvLayout::paged;
      o.page_size = static_cast<int>(c.page_size);
      o.max_pages_per_seq = static_cast<int>((c.kv_len + c.page_size - 1) / c.page_size);
      o.max_kv_len = c.kv_len;
      std::vector<std::int32_t> physical(std::size_t(c.batch) * o.max_pages_per_seq);
      std::iota(physical.begin(), physical.end(), 0);
      std::shuffle(physical.begin(), physical.end(), std::mt19937(1234));
      table = physical;
      rows_per_head = static_cast<std::int64_t>(physical.size()) * c.page_size;
    } else {
      o.layout = KvLayout::contiguous;
      o.max_kv_len = c.kv_len;
      rows_per_head = c.batch * c.kv_len;
    }
    const FlashDecodeOptions defaults = o;  // the sweep's base: every choice the plan's
    o.splits = args.splits;
    o.stages = args.stages;
    o.merge = args.merge;
    if (c.page_size) o.page_lookup = args.page_lookup;  // the contiguous layout has no pages
    FlashDecode op(args.sweep ? defaults : o);
    const std::uint64_t elem = dtype_size(dtype);
    const std::uint64_t cache_elems = std::uint64_t(rows_per_head) * c.kv_heads * kHeadDim;
    const std::uint64_t q_elems = std::uint64_t(c.batch) * c.q_heads * kHeadDim;
    const std::uint64_t kv_bytes = op.kv_bytes(c.batch * c.kv_len);
    void *kv, *copy_dst, *q, *out;
    float* lse;
    std::int32_t *lens, *dtable = nullptr;
    WEFT_CUDA(cudaMalloc(&kv, 2 * cache_elems * elem));  // K, then V: one copy moves both
    WEFT_CUDA(cudaMalloc(&copy_dst, 2 * cache_elems * elem));
    WEFT_CUDA(cudaMalloc(&q, q_elems * elem));
    WEFT_CUDA(cudaMalloc(&out, q_elems * elem));
    WEFT_CUDA(cudaMalloc(&lse, c.batch * c.q_heads * 4));
    WEFT_CUDA(cudaMalloc(&lens, c.batch * 4));
    const std::vector<std::int32_t> host_lens(c.batch, static_cast<std::int32_t>(c.kv_len));
    WEFT_CUDA(cudaMemcpy(lens, host_lens.data(), c.batch * 4, cudaMemcpyHostToDevice));
    if (!table.empty()) {
      WEFT_CUDA(cudaMalloc(&dtable, table.size() * 4));
      WEFT_CUDA(cudaMemcpy(dtable, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
    }
    fill_uniform(kv, 2 * cache_elems, args.dtype, fresh_seed(ctx.rank(), 1), stream);
    fill_uniform(q, q_elems, args.dtype, fresh_seed(ctx.rank(), 2), stream);
    const void* k = kv;
    const void* v = static_cast<const char*>(kv) + cache_elems * elem;
    const FlashDecodeArgs run_args{.q = q, .k = k, .v = v, .kv_lens = lens, .block_table = dtable, .out = out, .lse = lse};

    // --check: an fp32 attention on the GPU, once per case; check(plan) runs the plan on poisoned
    // outputs and returns its (relative error, lse error).
    float *ref_out = nullptr, *ref_lse = nullptr;
    if (args.check) {
      float* scratch;
      WEFT_CUDA(cudaMalloc(&ref_out, q_elems * 4));
      WEFT_CUDA(cudaMalloc(&ref_lse, c.batch * c.q_heads * 4));
      WEFT_CUDA(cudaMalloc(&scratch, std::uint64_t(c.batch) * c.q_heads * c.kv_len * 4));
      DecodeProblem ref{.q = q, .k = k, .v = v, .kv_lens = lens, .block_table = dtable,
                        .batch = o.batch, .q_heads = o.q_heads, .kv_heads = o.kv_heads, .head_dim = kHeadDim,
                        .dtype = dtype, .max_kv_len = c.kv_len, .page_size = o.page_size,
                        .max_pages = o.max_pages_per_seq, .scale = 1.0f / std::sqrt(float(kHeadDim))};
      decode_reference(ref, scratch, ref_out, ref_lse, stream);
      WEFT_CUDA(cudaStreamSynchronize(stream));
      cudaFree(scratch);
    }
    auto check = [&](FlashDecode& plan) {
      poison(out, q_elems * elem, 0xFF, stream);
      plan.run(run_args, stream);
      if (!args.check) return std::make_pair(0.0, 0.0);
      const double rel_err = relative_error_vs_fp32(out, args.dtype, ref_out, q_elems, stream);
      std::vector<float> got(c.batch * c.q_heads), want(got.size());
      WEFT_CUDA(cudaMemcpy(got.data(), lse, got.size() * 4, cudaMemcpyDeviceToHost));
      WEFT_CUDA(cudaMemcpy(want.data(), ref_lse, want.size() * 4, cudaMemcpyDeviceToHost));
      double lse_err = 0;
      for (std::size_t i = 0; i < got.size(); ++i) {
        const double e = std::fabs(double(got[i]) - want[i]) / std::max(1.0, std::fabs(double(want[i])));
        lse_err = std::isfinite(e) ? std::max(lse_err, e) : INFINITY;
      }
      ok &= rel_err <= 1e-2 && lse_err <= 1e-2;
      return std::make_pair(rel_err, lse_err);
    };

    const int calls = 5;
    auto copy = [&] { WEFT_CUDA(cudaMemcpyAsync(copy_dst, kv, kv_bytes, cudaMemcpyDeviceToDevice, stream)); };
    if (args.sweep) {
      // Every variant's plan, built and checked first; then all of them and the copy timed in turn.
      std::vector<std::unique_ptr<FlashDecode>> plans;
      std::vector<std::string> names;
      for (const auto& [name, options] : sweep_variants(defaults, op.splits())) {
        auto plan = std::make_unique<FlashDecode>(options);
        const bool same =
            std::any_of(plans.begin(), plans.end(), [&](const auto& p) { return resolved(*p) == resolved(*plan); });
        if (same) continue;
        plans.push_back(std::move(plan));
        names.push_back(name);
      }
      std::vector<std::function<void()>> contenders;
      std::vector<std::pair<double, double>> errors;
      for (auto& plan : plans) {
        errors.push_back(check(*plan));
        contenders.push_back([&, p = plan.get()] { p->run(run_args, stream); });
      }
      contenders.push_back(copy);
      const std::vector<double> us =
          time_interleaved(ctx, stream, contenders, calls, args.samples, args.warmup, args.hold, args.order);
      for (std::size_t i = 0; i < plans.size(); ++i)
        sweep_rows.push_back({rows.size(), names[i], plans[i]->splits(), plans[i]->stages(), merge_label(*plans[i]),
                              pages_label(*plans[i]), us[i], errors[i].first, errors[i].second});
      rows.push_back({c, op.splits(), us[0], us.back(), double(kv_bytes), errors[0].first, errors[0].second, 0.0, 0.0,
                      op.stages(), merge_label(op), pages_label(op)});
    } else {
      const auto [rel_err, lse_err] = check(op);
      std::vector<std::function<void()>> contenders = {[&] { op.run(run_args, stream); }, copy};
      std::unique_ptr<DistFlashDecode> dist;
      if (args.dist) {
        dist = std::make_unique<DistFlashDecode>(ctx_ptr, o);
        dist->run(run_args, stream);  // combine() merges the partials a run left
        contenders.push_back([&] { dist->run(run_args, stream); });
        contenders.push_back([&] { dist->combine(run_args, stream); });
      }
      const std::vector<double> us =
          time_interleaved(ctx, stream, contenders, calls, args.samples, args.warmup, args.hold, args.order);
      rows.push_back({c, op.splits(), us[0], us[1], double(kv_bytes), rel_err, lse_err, args.dist ? us[2] : 0.0,
                      args.dist ? us[3] : 0.0, op.stages(), merge_label(op), pages_label(op)});
      dist.reset();
    }
    for (void* p : {kv, copy_dst, q, out, static_cast<void*>(lse), static_cast<void*>(lens), static_cast<void*>(dtable),
                    static_cast<void*>(ref_out), static_cast<void*>(ref_lse)})
      if (p) cudaFree(p);
  }
  WEFT_CUDA(cudaStreamDestroy(stream));
  if (ctx.rank() == 0) {
    auto tbps = [](double bytes, double us) { return bytes / (us * 1e-6) / 1e12; };
    const bool shared = ctx.team().shares_gpus();
    if (args.json && args.sweep) {
      for (const SweepRow& s : sweep_rows) {
        const Row& r = rows[s.case_index];
        std::printf("{\"op\":\"decode_sweep\",\"batch\":%lld,\"q_heads\":%lld,\"kv_heads\":%lld,\"kv_len\":%lld,"
                    "\"page_size\":%lld,\"dtype\":\"%s\",\"variant\":\"%s\",\"splits\":%d,\"stages\":%d,"
                    "\"merge\":\"%s\",\"pages\":\"%s\",\"us\":%.2f,\"kv_tbps\":%.3f,\"default_us\":%.2f,"
                    "\"vs_default\":%.3f,\"copy_us\":%.2f,\"copy_tbps\":%.3f,\"rel_err\":%.2e,\"lse_err\":%.2e}\n",
                    static_cast<long long>(r.c.batch), static_cast<long long>(r.c.q_heads),
                    static_cast<long long>(r.c.kv_heads), static_cast<long long>(r.c.kv_len),
                    static_cast<long long>(r.c.page_size), args.dtype.c_str(), s.name.c_str(), s.splits, s.stages,
                    s.merge.c_str(), s.pages.c_str(), s.us, tbps(r.kv_bytes, s.us), r.us, r.us / s.us, r.copy_us,
                    tbps(2 * r.kv_bytes, r.copy_us), s.rel_err, s.lse_err);
      }
    } else if (args.sweep) {
      std::printf("decode sweep %s, head dim %d: every kernel variant of a case [0064], the default among them, and a "
                  "copy of the same bytes timed in turn\n(median of %d samples of 5 back-to-back calls, max over "
                  "ranks); TB/s = K and V bytes read / time; vs default = the default's us / the variant's\n(above 1: "
                  "faster); copy TB/s = read + write%s\n",
                  args.dtype.c_str(), kHeadDim, args.samples,
                  args.check ? "; rel err = ||weft - ref|| / ||ref||, ref an fp32 attention on the GPU" : "");
      for (std::size_t i = 0; i < rows.size(); ++i) {
        const Row& r = rows[i];
        std::printf("\nbatch %lld, %lld/%lld heads, KV %s, %s: %.1f MB of K and V; copy %.1f us, %.2f TB/s\n",
                    static_cast<long long>(r.c.batch), static_cast<long long>(r.c.q_heads),
                    static_cast<long long>(r.c.kv_heads), keys_label(r.c.kv_len).c_str(),
                    r.c.page_size ? str("page ", r.c.page_size).c_str() : "contiguous", r.kv_bytes / 1e6, r.copy_us,
                    tbps(2 * r.kv_bytes, r.copy_us));
        std::printf("  %-28s %6s %6s %-10s %5s | %9s %7s | %10s%s\n", "variant", "splits", "stages", "merge", "pages",
                    "us", "TB/s", "vs default", args.check ? " | rel err  lse err" : "");
        for (const SweepRow& s : sweep_rows) {
          if (s.case_index != i) continue;
          std::printf("  %-28s %6d %6d %-10s %5s | %9.1f %7.2f | %10.3f", s.name.c_str(), s.splits, s.stages,
                      s.merge.c_str(), s.pages.c_str(), s.us, tbps(r.kv_bytes, s.us), r.us / s.us);
          if (args.check) std::printf(" | %.1e  %.1e", s.rel_err, s.lse_err);
          std::printf("\n");
        }
      }
    } else if (args.json) {
      for (const Row& r : rows)
        std::printf("{\"op\":\"decode\",\"batch\":%lld,\"q_heads\":%lld,\"kv_heads\":%lld,\"kv_len\":%lld,"
                    "\"page_size\":%lld,\"dtype\":\"%s\",\"splits\":%d,\"stages\":%d,\"merge\":\"%s\","
                    "\"pages\":\"%s\",\"us\":%.2f,\"kv_tbps\":%.3f,\"copy_us\":%.2f,\"copy_tbps\":%.3f,"
                    "\"vs_copy\":%.3f,\"rel_err\":%.2e,\"lse_err\":%.2e,"
                    "\"world\":%d,\"dist_us\":%.2f,\"exchange_us\":%.2f,\"combine_us\":%.2f,\"shared_gpu\":%s}\n",
                    static_cast<long long>(r.c.batch), static_cast<long long>(r.c.q_heads),
                    static_cast<long long>(r.c.kv_heads), static_cast<long long>(r.c.kv_len),
                    static_cast<long long>(r.c.page_size), args.dtype.c_str(), r.splits, r.stages, r.merge.c_str(),
                    r.pages.c_str(), r.us, tbps(r.kv_bytes, r.us), r.copy_us, tbps(2 * r.kv_bytes, r.copy_us),
                    tbps(r.kv_bytes, r.us) / tbps(2 * r.kv_bytes, r.copy_us),
                    r.rel_err, r.lse_err, ctx.world_size(), r.dist_us, args.dist ? r.dist_us - r.us : 0.0,
                    r.combine_us, shared ? "true" : "false");
    } else {
      std::printf("decode %s, head dim %d; us per call (median of %d samples of 5 back-to-back calls, weft and the "
                  "copy in turn, max over ranks);\nKV TB/s = K and V bytes read / time; copy TB/s = a device-to-device "
                  "copy of the same bytes, read + write; ratio = KV TB/s / copy TB/s%s\n",
                  args.dtype.c_str(), kHeadDim, args.samples,
                  args.check ? "; rel err = ||weft - ref|| / ||ref||, ref an fp32 attention on the GPU" : "");
      if (args.stages || args.merge != DecodeMerge::automatic || args.page_lookup != PageLookup::automatic)
        std::printf("kernel forced: stages %s, merge %s, page lookup %s (paged cases)\n",
                    args.stages ? str(args.stages).c_str() : "default", to_string(args.merge),
                    to_string(args.page_lookup));
      if (args.dist)
        std::printf("--dist: %d ranks, each holding ceil(L / %d) keys of every sequence (KV below: the shard); dist "
                    "us = DistFlashDecode,\nexchange us = dist us - weft us (what the exchange kernel costs beyond "
                    "the one-GPU merge); combine us = the combine step alone\n(DistFlashDecode::combine: each rank's "
                    "splits merged, the partials exchanged on the symmetric heap, merged in rank order)%s\n",
                    ctx.world_size(), ctx.world_size(),
                    shared ? ";\nthe ranks share one GPU: dist, exchange and combine times are NOT performance figures"
                           : "");
      std::printf("%5s %9s %8s %6s | %6s | %9s %7s | %9s %7s | %6s%s%s\n", "batch", "heads", "KV", "page", "splits",
                  "weft us", "TB/s", "copy us", "TB/s", "ratio", args.check ? " | rel err  lse err" : "",
                  args.dist ? " | dist us  exchange us  combine us" : "");
      for (const Row& r : rows) {
        const std::string heads = str(r.c.q_heads, "/", r.c.kv_heads);
        const std::string kv = keys_label(r.c.kv_len);
        const std::string page = r.c.page_size ? str(r.c.page_size) : std::string("-");
        std::printf("%5lld %9s %8s %6s | %6d | %9.1f %7.2f | %9.1f %7.2f | %6.3f", static_cast<long long>(r.c.batch),
                    heads.c_str(), kv.c_str(), page.c_str(), r.splits, r.us, tbps(r.kv_bytes, r.us), r.copy_us,
                    tbps(2 * r.kv_bytes, r.copy_us), tbps(r.kv_bytes, r.us) / tbps(2 * r.kv_bytes, r.copy_us));
        if (args.check) std::printf(" | %.1e  %.1e", r.rel_err, r.lse_err);
        if (args.dist) std::printf(" | %7.1f  %11.1f  %10.1f", r.dist_us, r.dist_us - r.us, r.combine_us);
        std::printf("\n");
      }
    }
    std::fflush(stdout);
  }
  return ok ? 0 : 3;
}

}  // namespace weft::bench
