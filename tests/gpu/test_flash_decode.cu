// FlashDecode on one GPU, against a float64 CPU attention: both element
// types, the contiguous and the paged KV cache (pages in random order, the
// last page of a sequence ending mid-page), batch 1, 8 and 32, grouped-query
// heads 96/12 and 32/8, one KV head, groups wider than one tile of 16 heads,
// ragged lengths (0, 1, 17, 4097, 131071), the log-sum-exp; cache rows that
// belong to no sequence hold NaNs, so a read past a sequence's end shows.
// Every case runs with every kernel variant [0064] (stage counts 3, 6;
// the launch and last_block merges; pages per row and per warp; all changed
// at once), each against the reference, and the stage counts and page
// lookups give the same bits as the default kernel at the same split count.
// Then: 100 runs give the same bits, a CUDA graph's replays equal the eager
// run (the default and the variants), and bad options or arguments are
// refused naming what was expected.
// Every rank runs each test on its own (any world size, ranks may share a GPU).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gpu_check.hpp"
#include "gpu_test.hpp"
#include "half_bits.hpp"
#include "weft/core/error.hpp"
#include "weft/ops/flash_decode.hpp"

using namespace weft;
using weft::test::ctx;
using weft::test::float_to_half_bits;
using weft::test::half_bits_to_float;

namespace {

constexpr std::uint16_t kNaN = 0xFFFF;  // a NaN in bf16 and in fp16

struct Case {
  std::string name;
  DType dtype = DType::bf16;
  int q_heads = 32, kv_heads = 8, head_dim = 128;
  KvLayout layout = KvLayout::paged;
  int page_size = 16;
  std::vector<int> lens;  // one per sequence
  float scale = 0;        // 0: 1 / sqrt(head_dim)
  int splits = 0;
};

/// A case's inputs on the host and the device, and the plan.
struct Problem {
  Case c;
  FlashDecodeOptions o;
  int batch = 0, group = 0, D = 0;
  std::int64_t lmax = 0;  // contiguous: the cache's keys per sequence
  std::vector<std::uint16_t> q, k, v;  // host copies, device layout
  std::vector<std::int32_t> table, lens;
  void *dq = nullptr, *dk = nullptr, *dv = nullptr, *dout = nullptr;
  float* dlse = nullptr;
  std::int32_t *dtable = nullptr, *dlens = nullptr;

  explicit Problem(const Case& cs) : c(cs) {
    batch = static_cast<int>(c.lens.size());
    group = c.q_heads / c.kv_heads;
    D = c.head_dim;
    std::mt19937_64 rng(bench::fresh_seed(ctx().rank(), 0xf1a5));
    std::uniform_real_distribution<float> uni(-1.f, 1.f);
    auto draw = [&] { return float_to_half_bits(uni(rng), c.dtype); };
    const int max_len = *std::max_element(c.lens.begin(), c.lens.end());
    o.batch = batch;
    o.q_heads = c.q_heads;
    o.kv_heads = c.kv_heads;
    o.head_dim = D;
    o.dtype = c.dtype;
    o.layout = c.layout;
    o.softmax_scale = c.scale;
    o.splits = c.splits;
    std::int64_t rows = 0;  // key rows of the cache (per KV head)
    if (c.layout == KvLayout::contiguous) {
      lmax = max_len + 5;  // rows past every sequence's end: NaN
      o.max_kv_len = lmax;
      rows = std::int64_t{batch} * lmax;
    } else {
      // Every sequence's pages, dealt to physical pages in random order, one spare page of NaNs that
      // the table's unused entries point at (a read through them shows as NaN, not as a fault).
      std::vector<int> pages(batch);
      int total = 0, widest = 0;
      for (int b = 0; b < batch; ++b) {
        pages[b] = (c.lens[b] + c.page_size - 1) / c.page_size;
        total += pages[b];
        widest = std::max(widest, pages[b]);
      }
      std::vector<std::int32_t> physical(total);
      std::iota(physical.begin(), physical.end(), 0);
      std::shuffle(physical.begin(), physical.end(), rng);
      o.page_size = c.page_size;
      o.max_pages_per_seq = widest + 1;
      table.assign(std::size_t(batch) * o.max_pages_per_seq, total);  // the spare page
      for (int b = 0, next = 0; b < batch; ++b)
        for (int i = 0; i < pages[b]; ++i) table[std::size_t(b) * o.max_pages_per_seq + i] = physical[next++];
      rows = std::int64_t{total + 1} * c.page_size;
    }
    lens.assign(c.lens.begin(), c.lens.end());
    q.resize(std::size_t(batch) * c.q_heads * D);
    for (auto& x : q) x = draw();
    k.assign(std::size_t(rows) * c.kv_heads * D, kNaN);
    v.assign(k.size(), kNaN);
    for (int b = 0; b < batch; ++b)
      for (int h = 0; h < c.kv_heads; ++h)
        for (int t = 0; t < c.lens[b]; ++t) {
          const std::size_t at = row(b, h, t);
          for (int d = 0; d < D; ++d) {
            k[at + d] = draw();
            v[at + d] = draw();
          }
        }
    auto upload = [](void** dst, const void* src, std::size_t bytes) {
      WEFT_CUDA(cudaMalloc(dst, std::max<std::size_t>(bytes, 16)));
      if (bytes) WEFT_CUDA(cudaMemcpy(*dst, src, bytes, cudaMemcpyHostToDevice));
    };
    upload(&dq, q.data(), q.size() * 2);
    upload(&dk, k.data(), k.size() * 2);
    upload(&dv, v.data(), v.size() * 2);
    upload(reinterpret_cast<void**>(&dlens), lens.data(), lens.size() * 4);
    if (c.layout == KvLayout::paged) upload(reinterpret_cast<void**>(&dtable), table.data(), table.size() * 4);
    WEFT_CUDA(cudaMalloc(&dout, q.size() * 2));
    WEFT_CUDA(cudaMalloc(reinterpret_cast<void**>(&dlse), std::size_t(batch) * c.q_heads * 4));
  }
  ~Problem() {
    for (void* p : {dq, dk, dv, dout, static_cast<void*>(dlse), static_cast<void*>(dtable), static_cast<void*>(dlens)})
      if (p) cudaFree(p);
  }
  Problem(const Problem&) = delete;
  Problem& operator=(const Problem&) = delete;

  /// Element offset of key t of sequence b, KV head h, in the host/device cache.
  std::size_t row(int b, int h, std::int64_t t) const {
    if (c.layout == KvLayout::contiguous) return ((std::size_t(b) * c.kv_heads + h) * lmax + t) * D;
    const std::int64_t page = table[std::size_t(b) * o.max_pages_per_seq + t / c.page_size];
    return ((std::size_t(page) * c.kv_heads + h) * c.page_size + t % c.page_size) * D;
  }

  FlashDecodeArgs args() const {
    return FlashDecodeArgs{.q = dq, .k = dk, .v = dv, .kv_lens = dlens, .block_table = dtable, .out = dout, .lse = dlse};
  }
  void poison_outputs(cudaStream_t s) const {
    bench::poison(dout, q.size() * 2, 0xFF, s);
    bench::poison(dlse, std::size_t(batch) * c.q_heads * 4, 0xFF, s);
  }
};

/// The attention of a case in float64 on the CPU: out [batch, q_heads, D], lse [batch, q_heads].
struct Reference {
  std::vector<double> out, lse;
};
Reference reference(const Problem& pr) {
  const Case& cs = pr.c;
  const double scale = cs.scale > 0 ? cs.scale : 1.0 / std::sqrt(double(pr.D));
  Reference ref;
  ref.out.assign(pr.q.size(), 0.0);
  ref.lse.assign(std::size_t(pr.batch) * cs.q_heads, -INFINITY);
  std::vector<double> qd(pr.D), score;
  for (int b = 0; b < pr.batch; ++b) {
    const int len = cs.lens[b];
    for (int hq = 0; hq < cs.q_heads; ++hq) {
      const int h = hq / pr.group;
      const std::size_t qo = (std::size_t(b) * cs.q_heads + hq) * pr.D;
      for (int d = 0; d < pr.D; ++d) qd[d] = half_bits_to_float(pr.q[qo + d], cs.dtype);
      score.assign(len, 0.0);
      double mx = -INFINITY;
      for (int t = 0; t < len; ++t) {
        const std::uint16_t* kr = &pr.k[pr.row(b, h, t)];
        double dot = 0;
        for (int d = 0; d < pr.D; ++d) dot += qd[d] * half_bits_to_float(kr[d], cs.dtype);
        score[t] = dot * scale;
        mx = std::max(mx, score[t]);
      }
      double sum = 0;
      for (int t = 0; t < len; ++t) {
        const double w = std::exp(score[t] - mx);
        sum += w;
        const std::uint16_t* vr = &pr.v[pr.row(b, h, t)];
        for (int d = 0; d < pr.D; ++d) ref.out[qo + d] += w * half_bits_to_float(vr[d], cs.dtype);
      }
      for (int d = 0; d < pr.D && len > 0; ++d) ref.out[qo + d] /= sum;
      if (len > 0) ref.lse[std::size_t(b) * cs.q_heads + hq] = mx + std::log(sum);
    }
  }
  return ref;
}

/// One run's results, copied to the host.
struct Outputs {
  std::vector<std::uint16_t> out;
  std::vector<float> lse;
  int splits = 0;
  bool operator==(const Outputs& o) const {
    return out == o.out && std::memcmp(lse.data(), o.lse.data(), lse.size() * 4) == 0;  // bits, NaN or not
  }
};
Outputs run_plan(const Problem& pr, const FlashDecodeOptions& o) {
  cudaStream_t s = test::stream();
  FlashDecode op(o);
  pr.poison_outputs(s);
  op.run(pr.args(), s);
  Outputs r;
  r.splits = op.splits();
  r.out.resize(pr.q.size());
  r.lse.resize(std::size_t(pr.batch) * pr.c.q_heads);
  WEFT_CUDA(cudaMemcpyAsync(r.out.data(), pr.dout, r.out.size() * 2, cudaMemcpyDeviceToHost, s));
  WEFT_CUDA(cudaMemcpyAsync(r.lse.data(), pr.dlse, r.lse.size() * 4, cudaMemcpyDeviceToHost, s));
  WEFT_CUDA(cudaStreamSynchronize(s));
  return r;
}

/// "" if a run's output is within 1e-2 (relative, per sequence) of the reference and its lse within
/// 1e-2 (relative above 1), else what is wrong per sequence.
std::string compare(const Problem& pr, const Reference& ref, const Outputs& got) {
  const Case& cs = pr.c;
  std::string bad;
  for (int b = 0; b < pr.batch; ++b) {
    const int len = cs.lens[b];
    double err2 = 0, ref2 = 0, lse_err = 0;
    for (int hq = 0; hq < cs.q_heads; ++hq) {
      const std::size_t qo = (std::size_t(b) * cs.q_heads + hq) * pr.D;
      for (int d = 0; d < pr.D; ++d) {
        const double r = ref.out[qo + d];
        const double g = half_bits_to_float(got.out[qo + d], cs.dtype);
        err2 += std::isfinite(g) ? (g - r) * (g - r) : INFINITY;
        ref2 += r * r;
      }
      const std::size_t at = std::size_t(b) * cs.q_heads + hq;
      const double got_lse = got.lse[at], ref_lse = ref.lse[at];
      if (len == 0) {
        if (got_lse != -INFINITY) lse_err = INFINITY;
      } else {
        lse_err = std::max(lse_err, std::isfinite(got_lse)
                                        ? std::fabs(got_lse - ref_lse) / std::max(1.0, std::fabs(ref_lse))
                                        : INFINITY);
      }
    }
    const double rel = len > 0 ? std::sqrt(err2 / ref2) : (err2 == 0 ? 0.0 : INFINITY);
    if (!(rel <= 1e-2) || !(lse_err <= 1e-2))
      bad += str(" [sequence ", b, " of ", len, " keys: output relative error ", rel, ", lse error ", lse_err, "]");
  }
  return bad;
}

/// A kernel variant [0064]: the options it sets over a case's (0 and automatic: the case's own).
struct Variant {
  std::string name;
  int stages = 0;
  DecodeMerge merge = DecodeMerge::automatic;
  PageLookup lookup = PageLookup::automatic;
  int splits = 0;
};

/// The variants built for a case's head dim and layout: every stage count, both merges (the
/// last_block one also at 7 splits forced, so it runs where the plan's own choice is one split),
/// both page lookups, and all three changed at once.
std::vector<Variant> variants_for(const Case& c) {
  const bool paged = c.layout == KvLayout::paged, d128 = c.head_dim == 128;
  std::vector<Variant> v = {{.name = "default"}};
  if (d128) {
    v.push_back({.name = "stages 3", .stages = 3});
    v.push_back({.name = "stages 6", .stages = 6});
  }
  v.push_back({.name = "merge launch", .merge = DecodeMerge::launch});
  v.push_back({.name = "merge last_block", .merge = DecodeMerge::last_block});
  v.push_back({.name = "merge last_block, 7 splits", .merge = DecodeMerge::last_block, .splits = 7});
  if (paged) {
    v.push_back({.name = "pages per row", .lookup = PageLookup::per_row});
    v.push_back({.name = "pages per warp", .lookup = PageLookup::per_warp});
  }
  v.push_back({.name = "all changed", .stages = d128 ? 6 : 0, .merge = DecodeMerge::last_block,
               .lookup = paged ? PageLookup::per_warp : PageLookup::automatic});
  return v;
}

FlashDecodeOptions with(FlashDecodeOptions o, const Variant& v) {
  o.stages = v.stages;
  o.merge = v.merge;
  o.page_lookup = v.lookup;
  if (v.splits) o.splits = v.splits;
  return o;
}

/// Runs the case with every kernel variant and compares each with a float64 attention (computed
/// once); returns "" or what is wrong. Then, at the default plan's split count forced, the stage
/// counts and page lookups must give the same bits as the default kernel with the same merge: they
/// change where bytes come from and when, not the arithmetic.
std::string check_against_reference(const Case& cs) {
  Problem pr(cs);
  const Reference ref = reference(pr);
  std::string bad;
  const std::vector<Variant> variants = variants_for(cs);
  int default_splits = 0;
  for (const Variant& v : variants) {
    const Outputs got = run_plan(pr, with(pr.o, v));
    if (v.name == "default") default_splits = got.splits;
    const std::string why = compare(pr, ref, got);
    if (!why.empty()) bad += str("\n  ", cs.name, ", ", v.name, " (", got.splits, " splits):", why);
  }
  for (DecodeMerge merge : {DecodeMerge::launch, DecodeMerge::last_block}) {
    // A merge needs more than one split: at one, the last_block variants run at 2.
    FlashDecodeOptions base = pr.o;
    base.splits = pr.o.splits ? pr.o.splits : default_splits;
    if (merge == DecodeMerge::last_block && base.splits == 1) base.splits = 2;
    base.merge = merge;
    const Outputs first = run_plan(pr, base);
    for (const Variant& v : variants) {
      if (v.stages == 0 && v.lookup == PageLookup::automatic) continue;
      FlashDecodeOptions o = with(base, v);
      o.merge = merge;
      o.splits = base.splits;
      if (!(run_plan(pr, o) == first))
        bad += str("\n  ", cs.name, ", ", v.name, " at ", base.splits, " splits, merge ", to_string(merge),
                   ": not the same bits as the default kernel's");
    }
  }
  return bad;
}

std::vector<int> random_lens(int batch, int lo, int hi, std::uint64_t salt) {
  std::mt19937 rng(static_cast<unsigned>(bench::fresh_seed(ctx().rank(), salt)));
  std::uniform_int_distribution<int> len(lo, hi);
  std::vector<int> v(batch);
  for (auto& x : v) x = len(rng);
  return v;
}

}  // namespace

TEST(FlashDecode, MatchesFloat64AttentionContiguousAndPagedBothTypes) {
  for (DType t : {DType::bf16, DType::fp16})
    for (KvLayout layout : {KvLayout::contiguous, KvLayout::paged}) {
      Case c{.name = str("batch 1, 96/12 heads, 4097 keys, ", to_string(t), ", ", to_string(layout)),
             .dtype = t, .q_heads = 96, .kv_heads = 12, .layout = layout, .page_size = 64, .lens = {4097}};
      EXPECT_EQ(check_against_reference(c), "");
      c.name += ", scale 1 (peaked softmax)";
      c.scale = 1.0f;
      EXPECT_EQ(check_against_reference(c), "");
    }
}

TEST(FlashDecode, PagedBatchesWithRaggedLengthsEndingMidPage) {
  for (DType t : {DType::bf16, DType::fp16}) {
    Case b8{.name = str("batch 8, 96/12 heads, page 16, ", to_string(t)), .dtype = t, .q_heads = 96, .kv_heads = 12,
            .page_size = 16, .lens = random_lens(8, 1, 3000, 8)};
    b8.lens[0] = 17;   // ends one key into its second page
    b8.lens[1] = 1;
    EXPECT_EQ(check_against_reference(b8), "");
    Case b32{.name = str("batch 32, 32/8 heads, page 48, ", to_string(t)), .dtype = t, .q_heads = 32, .kv_heads = 8,
             .page_size = 48, .lens = random_lens(32, 1, 1500, 32)};
    EXPECT_EQ(check_against_reference(b32), "");
  }
  Case pages{.name = "batch 4, 32/8 heads, every page size", .q_heads = 32, .kv_heads = 8, .lens = {1, 17, 300, 1000}};
  for (int p : {16, 32, 100, 128, 256}) {
    pages.page_size = p;
    pages.name = str("batch 4, 32/8 heads, page ", p);
    EXPECT_EQ(check_against_reference(pages), "");
  }
}

TEST(FlashDecode, OneKvHeadWithLengthsFromOneTo131071) {
  // Multi-query attention: 8 query heads on one KV head, lengths 1, 17, 4097
  // and 131071 in one batch (and an empty sequence: zeros, lse -inf); few
  // heads keep the float64 reference affordable.
  for (KvLayout layout : {KvLayout::paged, KvLayout::contiguous}) {
    Case c{.name = str("MQA 8/1, ragged, ", to_string(layout)), .q_heads = 8, .kv_heads = 1, .layout = layout,
           .page_size = 256, .lens = {1, 17, 4097, 131071, 0}};
    EXPECT_EQ(check_against_reference(c), "");
  }
  Case fp16{.name = "MQA 16/1, fp16, page 16", .dtype = DType::fp16, .q_heads = 16, .kv_heads = 1, .page_size = 16,
            .lens = {131071, 4097}};
  EXPECT_EQ(check_against_reference(fp16), "");
}

TEST(FlashDecode, GroupsWiderThanOneTileHeadDim64AndForcedSplits) {
  // Groups of 32 and 128 query heads take 2 and 8 blocks per KV split;
  // head dim 64; one split (no merge launch) and the most splits.
  EXPECT_EQ(check_against_reference({.name = "64/2 heads", .q_heads = 64, .kv_heads = 2, .lens = {700, 2049}}), "");
  EXPECT_EQ(check_against_reference({.name = "128/1 heads", .q_heads = 128, .kv_heads = 1, .lens = {3000}}), "");
  EXPECT_EQ(check_against_reference({.name = "12/4 heads (group 3), 8 seqs",
                                     .q_heads = 12, .kv_heads = 4, .lens = random_lens(8, 1, 2000, 12)}), "");
  for (KvLayout layout : {KvLayout::contiguous, KvLayout::paged})
    for (DType t : {DType::bf16, DType::fp16})
      EXPECT_EQ(check_against_reference({.name = str("head dim 64, ", to_string(t), ", ", to_string(layout)),
                                         .dtype = t, .q_heads = 32, .kv_heads = 8, .head_dim = 64,
                                         .layout = layout, .page_size = 32, .lens = {5000, 33, 1}}), "");
  // Every variant at each forced count (check_against_reference runs them all): 128 splits fill the
  // last_block merge's weights in shared memory to the limit.
  for (int splits : {1, 2, 7, 128})
    EXPECT_EQ(check_against_reference({.name = str(splits, " splits forced"), .q_heads = 32, .kv_heads = 8,
                                       .lens = {9000, 100, 1}, .splits = splits}), "");
  EXPECT_EQ(check_against_reference({.name = "96/12 heads, 128 splits forced, page 16", .q_heads = 96, .kv_heads = 12,
                                     .lens = {9000, 4097}, .splits = 128}), "");
}

TEST(FlashDecode, RepeatedRunsAndGraphReplaysGiveTheSameBits) {
  Problem pr({.name = "batch 4, 32/8", .q_heads = 32, .kv_heads = 8, .page_size = 16, .lens = {8191, 33, 20000, 1}});
  // The default kernel, then the variants [0064]: the last_block merge's arrival counters must come
  // back to zero after every run and every replay, or a later run would merge early or never.
  for (const Variant& v : {Variant{.name = "default"},
                           Variant{.name = "merge last_block", .merge = DecodeMerge::last_block},
                           Variant{.name = "stages 3, pages per row, merge launch", .stages = 3,
                                   .merge = DecodeMerge::launch, .lookup = PageLookup::per_row},
                           Variant{.name = "stages 6, pages per warp, last_block", .stages = 6,
                                   .merge = DecodeMerge::last_block, .lookup = PageLookup::per_warp}}) {
    SCOPED_TRACE(v.name);
    cudaStream_t s = test::stream();
    FlashDecode op(with(pr.o, v));
    ASSERT_GT(op.splits(), 1) << "the test wants the merge";
    const std::size_t out_bytes = pr.q.size() * 2, lse_bytes = std::size_t(pr.batch) * pr.c.q_heads * 4;
    void *first_out, *first_lse;
    unsigned long long* mismatches;
    WEFT_CUDA(cudaMalloc(&first_out, out_bytes));
    WEFT_CUDA(cudaMalloc(&first_lse, lse_bytes));
    WEFT_CUDA(cudaMalloc(reinterpret_cast<void**>(&mismatches), 2 * sizeof(unsigned long long)));
    WEFT_CUDA(cudaMemsetAsync(mismatches, 0, 2 * sizeof(unsigned long long), s));
    pr.poison_outputs(s);
    op.run(pr.args(), s);
    WEFT_CUDA(cudaMemcpyAsync(first_out, pr.dout, out_bytes, cudaMemcpyDeviceToDevice, s));
    WEFT_CUDA(cudaMemcpyAsync(first_lse, pr.dlse, lse_bytes, cudaMemcpyDeviceToDevice, s));
    for (int i = 0; i < 100; ++i) {
      pr.poison_outputs(s);
      op.run(pr.args(), s);
      bench::accumulate_mismatches(pr.dout, first_out, out_bytes, mismatches, s);
      bench::accumulate_mismatches(pr.dlse, first_lse, lse_bytes, mismatches + 1, s);
    }
    // The same calls captured once, replayed 1000 times: each replay equals the eager run.
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    WEFT_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    pr.poison_outputs(s);
    op.run(pr.args(), s);
    bench::accumulate_mismatches(pr.dout, first_out, out_bytes, mismatches, s);
    bench::accumulate_mismatches(pr.dlse, first_lse, lse_bytes, mismatches + 1, s);
    WEFT_CUDA(cudaStreamEndCapture(s, &graph));
    WEFT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < 1000; ++i) WEFT_CUDA(cudaGraphLaunch(exec, s));
    unsigned long long host[2];
    WEFT_CUDA(cudaMemcpyAsync(host, mismatches, sizeof(host), cudaMemcpyDeviceToHost, s));
    WEFT_CUDA(cudaStreamSynchronize(s));
    EXPECT_EQ(host[0], 0u) << "output bytes that differed from the first run, over 100 runs and 1000 replays";
    EXPECT_EQ(host[1], 0u) << "lse bytes that differed from the first run, over 100 runs and 1000 replays";
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    for (void* p : {first_out, first_lse, static_cast<void*>(mismatches)}) cudaFree(p);
  }
}

TEST(FlashDecode, AutomaticChoicesResolveToTheSweepWinners) {
  // The options' automatic choices [0064], on 132 SMs whatever this rank's share: 6 stages and the
  // last_block merge for batch 1 over a contiguous cache (16 splits at 8 KV heads, one block per SM),
  // 3 stages with the merge launch and pages per warp on a paged one; explicit choices stay.
  FlashDecodeOptions o;
  o.q_heads = 32;
  o.kv_heads = 8;
  o.max_kv_len = 32768;
  o.sm_count = 132;
  {
    FlashDecode op(o);
    EXPECT_EQ(op.stages(), 6);
    EXPECT_EQ(op.merge(), DecodeMerge::last_block);
    EXPECT_EQ(op.splits(), 16);
    EXPECT_EQ(op.page_lookup(), PageLookup::automatic);
  }
  o.batch = 32;  // 256 units: past 80 % of the SMs
  EXPECT_EQ(FlashDecode(o).stages(), 3);
  FlashDecodeOptions paged = o;
  paged.batch = 8;
  paged.layout = KvLayout::paged;
  paged.page_size = 16;
  paged.max_pages_per_seq = 2048;
  paged.max_kv_len = 0;
  {
    FlashDecode op(paged);
    EXPECT_EQ(op.stages(), 3);
    EXPECT_EQ(op.merge(), DecodeMerge::launch);
    EXPECT_EQ(op.page_lookup(), PageLookup::per_warp);
  }
  paged.stages = 6;
  paged.merge = DecodeMerge::last_block;
  paged.page_lookup = PageLookup::per_row;
  {
    FlashDecode op(paged);
    EXPECT_EQ(op.stages(), 6);
    EXPECT_EQ(op.merge(), DecodeMerge::last_block);
    EXPECT_EQ(op.page_lookup(), PageLookup::per_row);
  }
}

TEST(FlashDecode, RefusesBadOptionsAndArgumentsNamingWhy) {
  auto plan_error = [](FlashDecodeOptions o) {
    const std::string why = FlashDecode::can_implement(o);
    try {
      FlashDecode op(o);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << "the constructor throws can_implement's reason";
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  FlashDecodeOptions good{.batch = 2, .q_heads = 32, .kv_heads = 8, .max_kv_len = 1024};
  EXPECT_EQ(FlashDecode::can_implement(good), "");
  auto with = [&](auto change) {
    FlashDecodeOptions o = good;
    change(o);
    return plan_error(o);
  };
  const struct {
    std::string error, expected;
  } cases[] = {
      {with([](auto& o) { o.q_heads = 30; }), "q_heads = 30 must be a multiple of kv_heads = 8"},
      {with([](auto& o) { o.head_dim = 96; }), "head_dim = 96 is not supported: expected 64 or 128"},
      {with([](auto& o) { o.dtype = DType::fp32; }), "dtype = fp32 is not supported: expected bf16 or fp16"},
      {with([](auto& o) { o.kv_heads = 32; o.q_heads = 64; }), "kv_heads = 32 must be 1 to 16"},
      {with([](auto& o) { o.q_heads = 256; }), "q_heads = 256 must be 1 to 128"},
      {with([](auto& o) { o.max_kv_len = 0; }), "max_kv_len = 0 must be 1 to 2^31 - 1"},
      {with([](auto& o) { o.page_size = 16; }), "page_size and max_pages_per_seq are for KvLayout::paged"},
      {with([](auto& o) { o.layout = KvLayout::paged; o.page_size = 8; o.max_pages_per_seq = 4; o.max_kv_len = 0; }),
       "page_size = 8 must be 16 to 256"},
      {with([](auto& o) { o.layout = KvLayout::paged; o.page_size = 16; o.max_kv_len = 0; }),
       "max_pages_per_seq = 0 must be positive"},
      {with([](auto& o) { o.splits = 1000; }), "splits = 1000 must be 0"},
      {with([](auto& o) { o.softmax_scale = -1; }), "softmax_scale = -1 must be finite"},
      {with([](auto& o) { o.stages = 5; }), "stages = 5 is not built at head_dim = 128: expected 0"},
      {with([](auto& o) { o.stages = 4; }),
       "stages = 4 is not built at head_dim = 128: expected 0 (the default), 3 or 6"},
      {with([](auto& o) { o.stages = 3; o.head_dim = 64; }), "stages = 3 is not built at head_dim = 64"},
      {with([](auto& o) { o.page_lookup = PageLookup::per_warp; }),
       "page_lookup = warp is for KvLayout::paged; the contiguous layout takes PageLookup::automatic"},
  };
  for (const auto& c : cases) EXPECT_NE(c.error.find(c.expected), std::string::npos) << c.error;

  // Run-time arguments: refused before anything is enqueued.
  Problem pr({.name = "args", .q_heads = 32, .kv_heads = 8, .page_size = 16, .lens = {100, 5}});
  FlashDecode op(pr.o);
  auto run_error = [&](FlashDecodeArgs a) {
    try {
      op.run(a, test::stream());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  FlashDecodeArgs a = pr.args();
  a.block_table = nullptr;
  EXPECT_NE(run_error(a).find("block_table must not be null with KvLayout::paged"), std::string::npos) << run_error(a);
  a = pr.args();
  a.kv_lens = nullptr;
  EXPECT_NE(run_error(a).find("kv_lens must not be null with KvLayout::paged"), std::string::npos) << run_error(a);
  a = pr.args();
  a.q = nullptr;
  EXPECT_NE(run_error(a).find("q must not be null"), std::string::npos) << run_error(a);
  a = pr.args();
  a.k = static_cast<const char*>(a.k) + 2;
  EXPECT_NE(run_error(a).find("k must be 16-byte aligned"), std::string::npos) << run_error(a);
  WEFT_CUDA(cudaStreamSynchronize(test::stream()));
}
