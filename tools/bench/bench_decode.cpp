// weft-bench decode: FlashDecode on this rank's GPU, in KV bytes read per
// second, against the HBM copy bound measured in the same run (a
// device-to-device cudaMemcpyAsync of the same K and V bytes, read + write),
// the two timed in turn with CUDA events (timing.hpp), warm-up excluded.
// Paged cases deal each sequence's pages to physical pages in a fixed
// shuffled order, as a serving cache's pages lie. With --dist every rank
// holds a contiguous shard of ceil(L / ranks) keys of each sequence, and the
// distributed call is timed beside FlashDecode over the shard alone: their
// difference is the exchange and combine.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench.hpp"
#include "decode_reference.hpp"
#include "gpu_check.hpp"
#include "timing.hpp"
#include "weft/core/error.hpp"
#include "weft/ops/dist_flash_decode.hpp"
#include "weft/ops/flash_decode.hpp"

namespace weft::bench {

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
    double dist_us = 0;  // --dist: the distributed call over the same shard
  };
  std::vector<Row> rows;
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
    o.splits = args.splits;
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
    FlashDecode op(o);
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
    poison(out, q_elems * elem, 0xFF, stream);
    op.run(run_args, stream);
    double rel_err = 0, lse_err = 0;
    if (args.check) {
      float *ref_out, *ref_lse, *scratch;
      WEFT_CUDA(cudaMalloc(&ref_out, q_elems * 4));
      WEFT_CUDA(cudaMalloc(&ref_lse, c.batch * c.q_heads * 4));
      WEFT_CUDA(cudaMalloc(&scratch, std::uint64_t(c.batch) * c.q_heads * c.kv_len * 4));
      DecodeProblem ref{.q = q, .k = k, .v = v, .kv_lens = lens, .block_table = dtable,
                        .batch = o.batch, .q_heads = o.q_heads, .kv_heads = o.kv_heads, .head_dim = kHeadDim,
                        .dtype = dtype, .max_kv_len = c.kv_len, .page_size = o.page_size,
                        .max_pages = o.max_pages_per_seq, .scale = 1.0f / std::sqrt(float(kHeadDim))};
      decode_reference(ref, scratch, ref_out, ref_lse, stream);
      rel_err = relative_error_vs_fp32(out, args.dtype, ref_out, q_elems, stream);
      std::vector<float> got(c.batch * c.q_heads), want(got.size());
      WEFT_CUDA(cudaMemcpy(got.data(), lse, got.size() * 4, cudaMemcpyDeviceToHost));
      WEFT_CUDA(cudaMemcpy(want.data(), ref_lse, want.size() * 4, cudaMemcpyDeviceToHost));
      for (std::size_t i = 0; i < got.size(); ++i) {
        const double e = std::fabs(double(got[i]) - want[i]) / std::max(1.0, std::fabs(double(want[i])));
        lse_err = std::isfinite(e) ? std::max(lse_err, e) : INFINITY;
      }
      ok &= rel_err <= 1e-2 && lse_err <= 1e-2;
      for (void* p : {static_cast<void*>(ref_out), static_cast<void*>(ref_lse), static_cast<void*>(scratch)})
        cudaFree(p);
    }
    const int calls = 5;
    std::vector<std::function<void()>> contenders = {
        [&] { op.run(run_args, stream); },
        [&] { WEFT_CUDA(cudaMemcpyAsync(copy_dst, kv, kv_bytes, cudaMemcpyDeviceToDevice, stream)); }};
    std::unique_ptr<DistFlashDecode> dist;
    if (args.dist) {
      dist = std::make_unique<DistFlashDecode>(ctx_ptr, o);
      contenders.push_back([&] { dist->run(run_args, stream); });
    }
    const std::vector<double> us =
        time_interleaved(ctx, stream, contenders, calls, args.samples, args.warmup, args.hold, args.order);
    rows.push_back({c, op.splits(), us[0], us[1], double(kv_bytes), rel_err, lse_err, args.dist ? us[2] : 0.0});
    dist.reset();
    for (void* p : {kv, copy_dst, q, out, static_cast<void*>(lse), static_cast<void*>(lens), static_cast<void*>(dtable)})
      if (p) cudaFree(p);
  }
  WEFT_CUDA(cudaStreamDestroy(stream));
  if (ctx.rank() == 0) {
    auto tbps = [](double bytes, double us) { return bytes / (us * 1e-6) / 1e12; };
    if (args.json) {
      for (const Row& r : rows)
        std::printf("{\"op\":\"decode\",\"batch\":%lld,\"q_heads\":%lld,\"kv_heads\":%lld,\"kv_len\":%lld,"
                    "\"page_size\":%lld,\"dtype\":\"%s\",\"splits\":%d,\"us\":%.2f,\"kv_tbps\":%.3f,"
                    "\"copy_us\":%.2f,\"copy_tbps\":%.3f,\"vs_copy\":%.3f,\"rel_err\":%.2e,\"lse_err\":%.2e,"
                    "\"world\":%d,\"dist_us\":%.2f,\"exchange_us\":%.2f}\n",
                    static_cast<long long>(r.c.batch), static_cast<long long>(r.c.q_heads),
                    static_cast<long long>(r.c.kv_heads), static_cast<long long>(r.c.kv_len),
                    static_cast<long long>(r.c.page_size), args.dtype.c_str(), r.splits, r.us, tbps(r.kv_bytes, r.us),
                    r.copy_us, tbps(2 * r.kv_bytes, r.copy_us), tbps(r.kv_bytes, r.us) / tbps(2 * r.kv_bytes, r.copy_us),
                    r.rel_err, r.lse_err, ctx.world_size(), r.dist_us, args.dist ? r.dist_us - r.us : 0.0);
    } else {
      std::printf("decode %s, head dim %d; us per call (median of %d samples of 5 back-to-back calls, weft and the "
                  "copy in turn, max over ranks);\nKV TB/s = K and V bytes read / time; copy TB/s = a device-to-device "
                  "copy of the same bytes, read + write; ratio = KV TB/s / copy TB/s%s\n",
                  args.dtype.c_str(), kHeadDim, args.samples,
                  args.check ? "; rel err = ||weft - ref|| / ||ref||, ref an fp32 attention on the GPU" : "");
      if (args.dist)
        std::printf("--dist: %d ranks, each holding ceil(L / %d) keys of every sequence (KV below: the shard); dist "
                    "us = DistFlashDecode,\nexchange us = dist us - weft us (what the exchange kernel costs beyond "
                    "the one-GPU merge)\n",
                    ctx.world_size(), ctx.world_size());
      std::printf("%5s %9s %8s %6s | %6s | %9s %7s | %9s %7s | %6s%s%s\n", "batch", "heads", "KV", "page", "splits",
                  "weft us", "TB/s", "copy us", "TB/s", "ratio", args.check ? " | rel err  lse err" : "",
                  args.dist ? " | dist us  exchange us" : "");
      for (const Row& r : rows) {
        const std::string heads = str(r.c.q_heads, "/", r.c.kv_heads);
        const std::string kv = r.c.kv_len % 1024 == 0 ? str(r.c.kv_len / 1024, "K") : str(r.c.kv_len);
        const std::string page = r.c.page_size ? str(r.c.page_size) : std::string("-");
        std::printf("%5lld %9s %8s %6s | %6d | %9.1f %7.2f | %9.1f %7.2f | %6.3f", static_cast<long long>(r.c.batch),
                    heads.c_str(), kv.c_str(), page.c_str(), r.splits, r.us, tbps(r.kv_bytes, r.us), r.copy_us,
                    tbps(2 * r.kv_bytes, r.copy_us), tbps(r.kv_bytes, r.us) / tbps(2 * r.kv_bytes, r.copy_us));
        if (args.check) std::printf(" | %.1e  %.1e", r.rel_err, r.lse_err);
        if (args.dist) std::printf(" | %7.1f  %11.1f", r.dist_us, r.dist_us - r.us);
        std::printf("\n");
      }
    }
    std::fflush(stdout);
  }
  return ok ? 0 : 3;
}

}  // namespace weft::bench
