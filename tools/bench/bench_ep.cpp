// weft-bench ep: MoE expert-parallel dispatch and combine (throughput mode), timed alone and
// together, against a copy bound measured in the same run.
//
// Each rank routes --tokens tokens, uniformly at random, to --topk distinct experts of
// --experts. Contenders, interleaved (timing.hpp):
//   layout            the device count, the exchange of counts, the host read;
//   layout+dispatch   what a caller of dispatch waits for (DeepEP's normal mode also reads
//                     the counts on the host before it moves tokens);
//   full call         layout, dispatch, combine (identity experts: y = recv_x);
//   each step         dispatch and combine on the GPU's clock: events around each, after the
//                     layout's host read, the stream held while they are enqueued (the rows
//                     above are differences of whole-call medians);
//   fp8 dispatch      layout + dispatch_fp8 (e4m3 rows and a float scale per 128 channels;
//                     where H is a multiple of 128), with its own copy bound and expanded
//                     write over its bytes (H + H / 32 per row);
//   low-latency mode  (--ll-tokens M, default 128) ExpertParallelLowLatency at M tokens per
//                     rank: dispatch (send + recv) and combine (identity experts: y = recv_x)
//                     of one step timed apart by events around each, and fp8 dispatch (cast
//                     on the way) likewise;
//   NCCL all-to-all   where every rank has a GPU of its own: what torch's all_to_all_single
//                     with NCCL does between two index_selects (the permutation into
//                     destination-major rows, ncclSend/ncclRecv of each rank's rows in one
//                     group, the expansion into recv_x's expert-major rows), its recv_x
//                     compared bitwise with weft's; its counts are given it (torch would
//                     exchange them first), so it is timed without weft's layout;
//   copy bound        each rank's token-rank pairs pushed into the ranks' heaps by the copy
//                     engines (cudaMemcpyAsync, one stream per destination, all at once):
//                     the same bytes over the same links, with no routing;
//   expanded write    the received rows written once (cudaMemsetAsync over recv_x): dispatch
//                     ends by expanding each token-rank pair into one row per local expert
//                     (top-8 of 256 experts: 32768 rows, 470 MB, from 58.7 MB of pairs), and
//                     combine reads those rows back. The bound beside both calls is the copy
//                     bound plus the expanded write: the two moves one after the other.
// dispatch = (layout+dispatch) - layout and combine = full - (layout+dispatch), since a
// plan runs its calls in that order (each once per layout).
// Bandwidth, DeepEP's convention: bytes of the valid token-rank pairs (H x 2 per token and
// destination rank, this rank's own included) over the time; remote: the pairs that leave
// the rank. Times are the slowest rank's medians; bytes are the slowest rank's too.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string_view>
#include <vector>

#include "bench.hpp"
#include "enqueue_hold.hpp"
#include "gpu_check.hpp"
#include "timing.hpp"
#include "weft/core/error.hpp"
#include "weft/ops/ep.hpp"

namespace weft::bench {
namespace {

float bf16_to_float(std::uint16_t b) {
  const std::uint32_t u = std::uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Uniform random routing: topk distinct experts per token; weights in (0, 1).
void make_routing(std::int64_t T, int k, int E, std::uint64_t seed, std::vector<std::int64_t>& topk,
                  std::vector<float>& weights) {
  std::mt19937_64 rng(seed);
  topk.assign(static_cast<std::size_t>(T) * k, -1);
  weights.assign(static_cast<std::size_t>(T) * k, 0.f);
  std::uniform_real_distribution<float> w(0.05f, 1.f);
  std::vector<int> pick;
  for (std::int64_t t = 0; t < T; ++t) {
    pick.clear();
    while (static_cast<int>(pick.size()) < k) {
      const int e = static_cast<int>(rng() % static_cast<std::uint64_t>(E));
      if (std::find(pick.begin(), pick.end(), e) == pick.end()) pick.push_back(e);
    }
    for (int j = 0; j < k; ++j) {
      topk[t * k + j] = pick[j];
      weights[t * k + j] = w(rng);
    }
  }
}

// Identity experts (y = recv_x): combine must return out[t] = x[t] x (the sum of t's weights).
// Values of T tokens outside `roundings` bf16 roundings (2^-8 each, relative to that sum:
// every term has x[t]'s sign) of it; synchronises the device first. The throughput mode
// rounds each rank's partial and the sum (2), across nodes also a node's sum on its rail
// GPU (3), as tests/gpu/test_ep.cu bounds it.
std::int64_t identity_combine_errors(const void* d_x, const void* d_out, const std::vector<float>& weights,
                                     std::int64_t T, int H, int k, int roundings) {
  WEFT_CUDA(cudaDeviceSynchronize());
  std::vector<std::uint16_t> x(static_cast<std::size_t>(T) * H), out(x.size());
  WEFT_CUDA(cudaMemcpy(x.data(), d_x, x.size() * 2, cudaMemcpyDeviceToHost));
  WEFT_CUDA(cudaMemcpy(out.data(), d_out, out.size() * 2, cudaMemcpyDeviceToHost));
  std::int64_t bad = 0;
  for (std::int64_t t = 0; t < T; ++t) {
    double sw = 0;
    for (int j = 0; j < k; ++j) sw += weights[t * k + j];
    for (int c = 0; c < H; ++c) {
      const double xv = bf16_to_float(x[t * H + c]), got = bf16_to_float(out[t * H + c]);
      if (!(std::fabs(got - xv * sw) <= std::fabs(xv) * sw * roundings / 256 + 1e-37)) ++bad;
    }
  }
  return bad;
}

}  // namespace

int bench_ep(const std::shared_ptr<Context>& ctx_ptr, const BenchArgs& args) {
  Context& ctx = *ctx_ptr;
  const int world = ctx.world_size(), me = ctx.rank();
  const std::int64_t T = args.ep_tokens;
  const int H = args.ep_hidden, k = args.ep_topk, E = args.ep_experts;
  WEFT_REQUIRE(E % world == 0, "weft-bench ep: --experts ", E, " is not a multiple of the world size ", world);
  const bool shared = ctx.team().shares_gpus();
  cudaStream_t stream;
  WEFT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  bool ok = true;
  std::string check = "skipped";
  double t_layout = 0, t_ld = 0, t_full = 0, t_copy = 0, t_expand = 0;
  double t_ld8 = 0, t_copy8 = 0, t_expand8 = 0;  // fp8 dispatch (H a multiple of 128)
  double t_ll_dispatch = 0, t_ll_combine = 0, t_ll_dispatch8 = 0;  // the low-latency mode at --ll-tokens
  double t_nccl = 0;  // NCCL all-to-all with the permutations (0: not run)
  double t_dispatch_ev = 0, t_combine_ev = 0;  // events around each step, after the layout
  std::string nccl_check = "not run (ranks share a GPU: NCCL refuses them)";
  const int M = args.ep_ll_tokens;
  std::string ll_check = "skipped";
  const bool fp8 = H % 128 == 0;
  const std::int64_t row8 = H + H / 32;  // an fp8 row's bytes: H e4m3 and H / 128 float scales
  std::int64_t pairs_bytes = 0, remote_bytes = 0, recv_rows = 0;  // recv_rows: this rank's expanded rows
  int blocks = 0;
  {
    ExpertParallel plan(ctx_ptr, {.experts = E, .hidden = H, .top_k = k, .max_tokens = T, .max_sms = args.max_sms});
    blocks = plan.blocks();
    std::vector<std::int64_t> topk;
    std::vector<float> weights;
    make_routing(T, k, E, fresh_seed(me, 0xe9), topk, weights);
    std::int64_t* d_topk = nullptr;
    float* d_w = nullptr;
    void *d_x = nullptr, *d_out = nullptr;
    WEFT_CUDA(cudaMalloc(&d_topk, topk.size() * 8));
    WEFT_CUDA(cudaMalloc(&d_w, weights.size() * 4));
    WEFT_CUDA(cudaMalloc(&d_x, static_cast<std::size_t>(T) * H * 2));
    WEFT_CUDA(cudaMalloc(&d_out, static_cast<std::size_t>(T) * H * 2));
    WEFT_CUDA(cudaMemcpy(d_topk, topk.data(), topk.size() * 8, cudaMemcpyHostToDevice));
    WEFT_CUDA(cudaMemcpy(d_w, weights.data(), weights.size() * 4, cudaMemcpyHostToDevice));
    fill_uniform(d_x, static_cast<std::uint64_t>(T) * H, "bf16", fresh_seed(me, 0x5e), stream);
    EpHandle h = plan.layout(d_topk, T, stream);
    recv_rows = h.recv_rows;
    void* d_recv = nullptr;
    WEFT_CUDA(cudaMalloc(&d_recv, std::max<std::int64_t>(h.recv_rows, 1) * H * 2));
    // fp8 dispatch: its tokens are d_x's first T x H bytes (timing only: the GPU tests check its
    // bits), its scales a constant; it receives into d_recv's first recv_rows x H bytes.
    float *d_xs = nullptr, *d_rs = nullptr;
    if (fp8) {
      WEFT_CUDA(cudaMalloc(&d_xs, static_cast<std::size_t>(std::max<std::int64_t>(T, 1)) * (H / 128) * 4));
      WEFT_CUDA(cudaMalloc(&d_rs, static_cast<std::size_t>(std::max<std::int64_t>(h.recv_rows, 1)) * (H / 128) * 4));
      WEFT_CUDA(cudaMemset(d_xs, 0x3f, static_cast<std::size_t>(std::max<std::int64_t>(T, 1)) * (H / 128) * 4));
    }
    for (int p = 0; p < world; ++p) {
      pairs_bytes += h.tokens_to[p] * H * 2;
      if (p != me) remote_bytes += h.tokens_to[p] * H * 2;
    }

    // Check: identity experts (y = recv_x), so out[t] = x[t] x (sum of its weights).
    plan.dispatch(h, d_x, d_w, d_recv, nullptr, stream);
    if (args.check) {
      poison(d_out, static_cast<std::uint64_t>(T) * H * 2, 0x5A, stream);
      plan.combine(h, d_recv, d_out, stream);
      const std::int64_t bad = identity_combine_errors(d_x, d_out, weights, T, H, k, ctx.team().single_node() ? 2 : 3);
      check = bad ? str("FAIL(", bad, " values)") : "ok";
    } else {
      plan.combine(h, d_recv, d_out, stream);
    }
    for (auto& verdict : ctx.store().all_gather(check, "ep check verdicts"))
      if (verdict != "ok" && verdict != "skipped") check = verdict;
    ok = check == "ok" || check == "skipped";

    if (ctx.has_nccl()) {
      // Every rank's routing, so each receiver can build its expansion index as torch would after
      // exchanging the routing: recv_x row (local expert, source, source token) <- received row.
      const auto routings = ctx.store().all_gather(
          std::string_view(reinterpret_cast<const char*>(topk.data()), topk.size() * 8), "ep routings");
      const int per = E / world;
      std::vector<std::int32_t> send_index, expand_index;
      for (int p = 0; p < world; ++p)  // this rank's tokens for p, ascending: destination-major send rows
        for (std::int64_t t = 0; t < T; ++t)
          for (int j = 0; j < k; ++j)
            if (topk[t * k + j] / per == p) {
              send_index.push_back(static_cast<std::int32_t>(t));
              break;
            }
      std::vector<std::int64_t> first_from(world, 0);  // where source s's rows start in the receive buffer
      for (int src = 1; src < world; ++src) first_from[src] = first_from[src - 1] + h.tokens_from[src - 1];
      std::vector<std::vector<std::int32_t>> position(world);  // source token -> received row, or -1
      for (int src = 0; src < world; ++src) {
        const auto* rt = reinterpret_cast<const std::int64_t*>(routings[src].data());
        position[src].assign(static_cast<std::size_t>(T), -1);
        std::int64_t at = first_from[src];
        for (std::int64_t t = 0; t < T; ++t)
          for (int j = 0; j < k; ++j)
            if (rt[t * k + j] / per == me) {
              position[src][t] = static_cast<std::int32_t>(at++);
              break;
            }
      }
      for (int le = 0; le < per; ++le)
        for (int src = 0; src < world; ++src) {
          const auto* rt = reinterpret_cast<const std::int64_t*>(routings[src].data());
          for (std::int64_t t = 0; t < T; ++t)
            for (int j = 0; j < k; ++j)
              if (rt[t * k + j] == static_cast<std::int64_t>(me) * per + le) expand_index.push_back(position[src][t]);
        }
      std::int32_t *d_send_index = nullptr, *d_expand_index = nullptr;
      void *d_send = nullptr, *d_recv_tokens = nullptr, *d_recv_nccl = nullptr;
      const std::size_t row = static_cast<std::size_t>(H) * 2;
      WEFT_CUDA(cudaMalloc(&d_send_index, std::max<std::size_t>(send_index.size(), 1) * 4));
      WEFT_CUDA(cudaMalloc(&d_expand_index, std::max<std::size_t>(expand_index.size(), 1) * 4));
      WEFT_CUDA(cudaMalloc(&d_send, std::max<std::size_t>(send_index.size(), 1) * row));
      WEFT_CUDA(cudaMalloc(&d_recv_tokens, std::max<std::int64_t>(h.recv_tokens, 1) * row));
      WEFT_CUDA(cudaMalloc(&d_recv_nccl, std::max<std::size_t>(expand_index.size(), 1) * row));
      if (!send_index.empty())
        WEFT_CUDA(cudaMemcpy(d_send_index, send_index.data(), send_index.size() * 4, cudaMemcpyHostToDevice));
      if (!expand_index.empty())
        WEFT_CUDA(cudaMemcpy(d_expand_index, expand_index.data(), expand_index.size() * 4, cudaMemcpyHostToDevice));
      ncclComm_t comm = ctx.nccl();
      auto nccl_all_to_all = [&] {
        gather_rows(d_send, d_x, d_send_index, static_cast<std::int64_t>(send_index.size()), H * 2, stream);
        WEFT_NCCL(ncclGroupStart());
        std::int64_t sent = 0;
        for (int p = 0; p < world; ++p) {
          WEFT_NCCL(ncclSend(static_cast<char*>(d_send) + sent * row, h.tokens_to[p] * H, ncclBfloat16, p, comm,
                             stream));
          WEFT_NCCL(ncclRecv(static_cast<char*>(d_recv_tokens) + first_from[p] * row, h.tokens_from[p] * H,
                             ncclBfloat16, p, comm, stream));
          sent += h.tokens_to[p];
        }
        WEFT_NCCL(ncclGroupEnd());
        gather_rows(d_recv_nccl, d_recv_tokens, d_expand_index, static_cast<std::int64_t>(expand_index.size()), H * 2,
                    stream);
      };
      // weft's recv_x of this routing, then the baseline's: bitwise equal (the same rows, the same order).
      {
        const EpHandle hh = plan.layout(d_topk, T, stream);
        plan.dispatch(hh, d_x, d_w, d_recv, nullptr, stream);
        plan.combine(hh, d_recv, d_out, stream);  // (the plan's order: combine follows dispatch)
      }
      poison(d_recv_nccl, std::max<std::size_t>(expand_index.size(), 1) * row, 0xA5, stream);
      nccl_all_to_all();
      const std::uint64_t differ =
          static_cast<std::int64_t>(expand_index.size()) == h.recv_rows
              ? count_mismatches(d_recv_nccl, d_recv, static_cast<std::uint64_t>(h.recv_rows) * row, stream)
              : ~std::uint64_t{0};
      nccl_check = differ == 0 ? "ok" : differ == ~std::uint64_t{0} ? "FAIL(row counts differ)"
                                                                  : str("FAIL(", differ, " bytes differ)");
      for (auto& verdict : ctx.store().all_gather(nccl_check, "ep nccl check verdicts"))
        if (verdict != "ok") nccl_check = verdict;
      ok = ok && nccl_check == "ok";
      t_nccl = time_per_call(ctx, stream, nccl_all_to_all, 1, args.samples, args.warmup, args.hold);
      ctx.synchronize(stream);
      cudaFree(d_send_index);
      cudaFree(d_expand_index);
      cudaFree(d_send);
      cudaFree(d_recv_tokens);
      cudaFree(d_recv_nccl);
    }

    // The copy bound: this rank's token-rank pairs into a symmetric buffer of each rank, at once.
    SymmetricBuffer sink(ctx.heap(), static_cast<std::uint64_t>(std::max<std::int64_t>(T, 1)) * H * 2, "bf16",
                         "bench.ep.copy_bound");
    std::vector<cudaStream_t> sides(world);
    std::vector<cudaEvent_t> done(world);
    cudaEvent_t fork;
    WEFT_CUDA(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    for (int p = 0; p < world; ++p) {
      WEFT_CUDA(cudaStreamCreateWithFlags(&sides[p], cudaStreamNonBlocking));
      WEFT_CUDA(cudaEventCreateWithFlags(&done[p], cudaEventDisableTiming));
    }
    const std::vector<std::int64_t> to = h.tokens_to;
    // Across nodes only this node's peers have an address to copy to: the bound
    // then moves their pairs alone (the table says so), the network's have none.
    std::vector<bool> mapped(world);
    for (int p = 0; p < world; ++p) mapped[p] = ctx.heap().peer_reachable(p);
    auto copy_bound = [&] {
      WEFT_CUDA(cudaEventRecord(fork, stream));
      for (int p = 0; p < world; ++p) {
        WEFT_CUDA(cudaStreamWaitEvent(sides[p], fork));
        if (to[p] > 0 && mapped[p])
          WEFT_CUDA(cudaMemcpyAsync(ctx.heap().peer_ptr(sink.get(), p), d_x, static_cast<std::size_t>(to[p]) * H * 2,
                                    cudaMemcpyDeviceToDevice, sides[p]));
        WEFT_CUDA(cudaEventRecord(done[p], sides[p]));
        WEFT_CUDA(cudaStreamWaitEvent(stream, done[p]));
      }
    };
    // Every contender below runs whole calls in the plan's order. layout reads the counts on
    // the host, so these samples cannot hold the stream (--no-hold's method, timing.hpp).
    auto layout_only = [&] { plan.layout(d_topk, T, stream); };
    auto layout_dispatch = [&] {
      const EpHandle hh = plan.layout(d_topk, T, stream);
      plan.dispatch(hh, d_x, d_w, d_recv, nullptr, stream);
    };
    auto layout_dispatch_fp8 = [&] {
      const EpHandle hh = plan.layout(d_topk, T, stream);
      plan.dispatch_fp8(hh, d_x, d_xs, d_w, d_recv, d_rs, nullptr, stream);
    };
    auto full = [&] {
      const EpHandle hh = plan.layout(d_topk, T, stream);
      plan.dispatch(hh, d_x, d_w, d_recv, nullptr, stream);
      plan.combine(hh, d_recv, d_out, stream);
    };
    if (me == 0) std::fprintf(stderr, "[weft-bench] ep %lld tokens, hidden %d, top-%d of %d experts ...\n",
                              static_cast<long long>(T), H, k, E);
    std::vector<std::function<void()>> contenders = {layout_only, layout_dispatch, full};
    if (fp8) contenders.push_back(layout_dispatch_fp8);
    const std::vector<double> t = time_interleaved(ctx, stream, contenders, 1, args.samples, args.warmup, false);
    t_layout = t[0];
    t_ld = t[1];
    t_full = t[2];
    if (fp8) t_ld8 = t[3];
    t_copy = time_per_call(ctx, stream, copy_bound, 1, args.samples, args.warmup, args.hold);
    const std::size_t recv_bytes = static_cast<std::size_t>(std::max<std::int64_t>(h.recv_rows, 1)) * H * 2;
    auto expand_write = [&] { WEFT_CUDA(cudaMemsetAsync(d_recv, 0x3c, recv_bytes, stream)); };
    t_expand = time_per_call(ctx, stream, expand_write, 1, args.samples, args.warmup, args.hold);
    if (fp8) {  // the same two moves over an fp8 row's bytes
      auto copy_bound8 = [&] {
        WEFT_CUDA(cudaEventRecord(fork, stream));
        for (int p = 0; p < world; ++p) {
          WEFT_CUDA(cudaStreamWaitEvent(sides[p], fork));
          if (to[p] > 0 && mapped[p])
            WEFT_CUDA(cudaMemcpyAsync(ctx.heap().peer_ptr(sink.get(), p), d_x, static_cast<std::size_t>(to[p]) * row8,
                                      cudaMemcpyDeviceToDevice, sides[p]));
          WEFT_CUDA(cudaEventRecord(done[p], sides[p]));
          WEFT_CUDA(cudaStreamWaitEvent(stream, done[p]));
        }
      };
      t_copy8 = time_per_call(ctx, stream, copy_bound8, 1, args.samples, args.warmup, args.hold);
      const std::size_t recv8 = static_cast<std::size_t>(std::max<std::int64_t>(h.recv_rows, 1)) * row8;
      auto expand_write8 = [&] { WEFT_CUDA(cudaMemsetAsync(d_recv, 0x3c, recv8, stream)); };
      t_expand8 = time_per_call(ctx, stream, expand_write8, 1, args.samples, args.warmup, args.hold);
    }
    {  // Each step on the GPU's clock. "dispatch" and "combine" above are differences of
       // whole-call medians (layout + dispatch minus layout, ...), which move with the layout's
       // host read; here the layout runs first (it reads its counts on the host), then the
       // stream is held while the host enqueues a device barrier and the events around
       // dispatch and combine, so neither the host's enqueue nor the layout lands in them.
      EnqueueHold held;
      cudaEvent_t ev[3];
      for (auto& e : ev) WEFT_CUDA(cudaEventCreate(&e));
      std::vector<double> dispatch_ms, combine_ms;
      for (int i = 0; i < args.warmup + args.samples; ++i) {
        const EpHandle hh = plan.layout(d_topk, T, stream);
        held.hold(stream);
        ctx.barrier(stream);
        WEFT_CUDA(cudaEventRecord(ev[0], stream));
        plan.dispatch(hh, d_x, d_w, d_recv, nullptr, stream);
        WEFT_CUDA(cudaEventRecord(ev[1], stream));
        plan.combine(hh, d_recv, d_out, stream);
        WEFT_CUDA(cudaEventRecord(ev[2], stream));
        held.release();
        ctx.synchronize(stream);
        WEFT_REQUIRE(!held.timed_out(), "weft-bench ep: a step's enqueue outlasted the hold (", held.limit_ms(),
                     " ms)");
        if (i < args.warmup) continue;
        float d = 0, c = 0;
        WEFT_CUDA(cudaEventElapsedTime(&d, ev[0], ev[1]));
        WEFT_CUDA(cudaEventElapsedTime(&c, ev[1], ev[2]));
        dispatch_ms.push_back(d);
        combine_ms.push_back(c);
      }
      for (auto& e : ev) cudaEventDestroy(e);
      const std::vector<double> te =
          slowest_over_ranks(ctx, {median(dispatch_ms) * 1e3, median(combine_ms) * 1e3}, "ep step timings");
      t_dispatch_ev = te[0];
      t_combine_ev = te[1];
    }
    if (M > 0) {  // the low-latency mode: its own plans, M tokens of x and of the routing
      ExpertParallelLowLatency ll(ctx_ptr, {.experts = E, .hidden = H, .top_k = k, .max_tokens = M,
                                            .max_sms = args.max_sms});
      std::vector<std::int64_t> topk_ll;
      std::vector<float> weights_ll;
      make_routing(M, k, E, fresh_seed(me, 0x11), topk_ll, weights_ll);
      std::int64_t* d_topk_ll = nullptr;
      float* d_w_ll = nullptr;
      void* d_out_ll = nullptr;
      WEFT_CUDA(cudaMalloc(&d_topk_ll, topk_ll.size() * 8));
      WEFT_CUDA(cudaMalloc(&d_w_ll, weights_ll.size() * 4));
      WEFT_CUDA(cudaMalloc(&d_out_ll, static_cast<std::size_t>(M) * H * 2));
      WEFT_CUDA(cudaMemcpy(d_topk_ll, topk_ll.data(), topk_ll.size() * 8, cudaMemcpyHostToDevice));
      WEFT_CUDA(cudaMemcpy(d_w_ll, weights_ll.data(), weights_ll.size() * 4, cudaMemcpyHostToDevice));
      const std::int64_t T_ll = std::min<std::int64_t>(M, T);  // x's first rows
      auto ll_step = [&](ExpertParallelLowLatency& plan) {  // identity experts: the received rows are the outputs
        plan.dispatch(d_topk_ll, d_x, T_ll, stream);
        plan.combine(ll.recv_x(), d_topk_ll, d_w_ll, d_out_ll, T_ll, stream);  // (bf16 rows: y for either plan)
      };
      if (args.check) {  // out[t] = x[t] x (sum of its weights), as above
        poison(d_out_ll, static_cast<std::uint64_t>(T_ll) * H * 2, 0x5A, stream);
        ll_step(ll);
        ll.check_errors(stream);
        const std::int64_t bad = identity_combine_errors(d_x, d_out_ll, weights_ll, T_ll, H, k, 2);
        ll_check = bad ? str("FAIL(", bad, " values)") : "ok";
      }
      for (auto& verdict : ctx.store().all_gather(ll_check, "ep low-latency check verdicts"))
        if (verdict != "ok" && verdict != "skipped") ll_check = verdict;
      ok = ok && (ll_check == "ok" || ll_check == "skipped");
      std::unique_ptr<ExpertParallelLowLatency> ll8;
      if (fp8)
        ll8 = std::make_unique<ExpertParallelLowLatency>(
            ctx_ptr, EpLowLatencyOptions{.experts = E, .hidden = H, .top_k = k, .max_tokens = M,
                                         .max_sms = args.max_sms, .fp8_dispatch = true});
      // A step is dispatch then combine (the plan's order); events around each half, every rank
      // starting together (a device barrier), the bf16 and fp8 plans' steps interleaved.
      cudaEvent_t ev[3];
      for (auto& e : ev) WEFT_CUDA(cudaEventCreate(&e));
      std::vector<double> dispatch_ms, combine_ms, dispatch8_ms;
      for (int i = 0; i < args.warmup + args.samples; ++i) {
        for (ExpertParallelLowLatency* plan : {&ll, ll8.get()}) {
          if (!plan) continue;
          ctx.barrier(stream);
          WEFT_CUDA(cudaEventRecord(ev[0], stream));
          plan->dispatch(d_topk_ll, d_x, T_ll, stream);
          WEFT_CUDA(cudaEventRecord(ev[1], stream));
          plan->combine(ll.recv_x(), d_topk_ll, d_w_ll, d_out_ll, T_ll, stream);
          WEFT_CUDA(cudaEventRecord(ev[2], stream));
          ctx.synchronize(stream);
          if (i < args.warmup) continue;
          float d = 0, c = 0;
          WEFT_CUDA(cudaEventElapsedTime(&d, ev[0], ev[1]));
          WEFT_CUDA(cudaEventElapsedTime(&c, ev[1], ev[2]));
          (plan == &ll ? dispatch_ms : dispatch8_ms).push_back(d);
          if (plan == &ll) combine_ms.push_back(c);
        }
      }
      for (auto& e : ev) cudaEventDestroy(e);
      const std::vector<double> tl =
          slowest_over_ranks(ctx, {median(dispatch_ms) * 1e3, median(combine_ms) * 1e3,
                                   fp8 ? median(dispatch8_ms) * 1e3 : 0.0}, "ep low-latency timings");
      t_ll_dispatch = tl[0];
      t_ll_combine = tl[1];
      t_ll_dispatch8 = tl[2];
      ctx.synchronize(stream);
      cudaFree(d_topk_ll);
      cudaFree(d_w_ll);
      cudaFree(d_out_ll);
    }
    ctx.synchronize(stream);
    for (int p = 0; p < world; ++p) {
      cudaStreamDestroy(sides[p]);
      cudaEventDestroy(done[p]);
    }
    cudaEventDestroy(fork);
    cudaFree(d_topk);
    cudaFree(d_w);
    cudaFree(d_x);
    cudaFree(d_out);
    cudaFree(d_recv);
    cudaFree(d_xs);
    cudaFree(d_rs);
  }
  WEFT_CUDA(cudaStreamDestroy(stream));
  // The slowest rank's bytes (its time is already the slowest's).
  std::int64_t max_pairs = 0, max_remote = 0;
  for (auto& v : ctx.store().all_gather(str(pairs_bytes, " ", remote_bytes), "ep bytes")) {
    long long a = 0, b = 0;
    std::sscanf(v.c_str(), "%lld %lld", &a, &b);
    max_pairs = std::max<std::int64_t>(max_pairs, a);
    max_remote = std::max<std::int64_t>(max_remote, b);
  }
  const double t_dispatch = t_ld - t_layout, t_combine = t_full - t_ld;
  const double t_bound = t_copy + t_expand;  // pairs over the links, then the expanded rows written
  const double t_dispatch8 = fp8 ? t_ld8 - t_layout : 0, t_bound8 = t_copy8 + t_expand8;
  auto gbs = [](std::int64_t bytes, double us) { return us > 0 ? bytes / us / 1e3 : 0.0; };
  if (me == 0) {
    if (args.json) {
      std::printf("{\"op\":\"ep\",\"world\":%d,\"tokens\":%lld,\"hidden\":%d,\"topk\":%d,\"experts\":%d,\"sms\":%d,"
                  "\"layout_us\":%.3f,\"layout_dispatch_us\":%.3f,\"full_us\":%.3f,\"dispatch_us\":%.3f,"
                  "\"combine_us\":%.3f,\"copy_bound_us\":%.3f,\"expand_write_us\":%.3f,\"bound_us\":%.3f,"
                  "\"recv_rows\":%lld,\"pair_bytes\":%lld,\"remote_bytes\":%lld,"
                  "\"dispatch_gbs\":%.2f,\"combine_gbs\":%.2f,\"copy_bound_gbs\":%.2f,\"shared_gpu\":%s,"
                  "\"fp8_dispatch_us\":%.3f,\"fp8_bound_us\":%.3f,\"ll_tokens\":%d,\"ll_dispatch_us\":%.3f,"
                  "\"ll_combine_us\":%.3f,\"ll_fp8_dispatch_us\":%.3f,\"ll_check\":\"%s\",\"nccl_us\":%.3f,"
                  "\"nccl_check\":\"%s\",\"dispatch_events_us\":%.3f,\"combine_events_us\":%.3f,\"check\":\"%s\"}\n",
                  world, static_cast<long long>(T), H, k, E, blocks, t_layout, t_ld, t_full, t_dispatch, t_combine,
                  t_copy, t_expand, t_bound, static_cast<long long>(recv_rows), static_cast<long long>(max_pairs),
                  static_cast<long long>(max_remote),
                  gbs(max_pairs, t_dispatch), gbs(max_pairs, t_combine), gbs(max_pairs, t_copy),
                  shared ? "true" : "false", t_dispatch8, t_bound8, M, t_ll_dispatch, t_ll_combine, t_ll_dispatch8,
                  ll_check.c_str(), t_nccl, nccl_check.c_str(), t_dispatch_ev, t_combine_ev, check.c_str());
    } else {
      std::printf("ep, %d ranks, %lld tokens per rank, hidden %d, top-%d of %d experts, %d SMs; us per call "
                  "(median of %d samples, max over ranks)\n",
                  world, static_cast<long long>(T), H, k, E, blocks, args.samples);
      if (shared)
        std::printf("Ranks share a GPU: times are not performance figures (a record of the run only).\n");
      std::printf("bytes per rank (slowest): %.1f MB of token-rank pairs, %.1f MB of them remote; %lld rows received "
                  "on rank 0\n",
                  max_pairs / 1e6, max_remote / 1e6, static_cast<long long>(recv_rows));
      std::printf("%-18s %10s %10s %12s\n", "", "us", "GB/s", "remote GB/s");
      std::printf("%-18s %10.2f %10s %12s\n", "layout", t_layout, "", "");
      std::printf("%-18s %10.2f %10.1f %12.1f\n", "dispatch", t_dispatch, gbs(max_pairs, t_dispatch),
                  gbs(max_remote, t_dispatch));
      std::printf("%-18s %10.2f %10.1f %12.1f\n", "combine", t_combine, gbs(max_pairs, t_combine),
                  gbs(max_remote, t_combine));
      std::printf("%-18s %10.2f %10.1f %12.1f\n", "layout+dispatch", t_ld, gbs(max_pairs, t_ld), gbs(max_remote, t_ld));
      std::printf("%-18s %10.2f %10s %12s\n", "all three", t_full, "", "");
      std::printf("%-18s %10.2f %10.1f %12.1f   (copy engines, same bytes%s)\n", "copy bound", t_copy,
                  gbs(max_pairs, t_copy), gbs(max_remote, t_copy),
                  ctx.all_peers_direct() ? "" : "; across nodes only this node's pairs: no bound for the network's");
      std::printf("%-18s %10.2f %10.1f %12s   (memset of rank 0's %.1f MB of expanded rows)\n", "expanded write",
                  t_expand, gbs(recv_rows * H * 2, t_expand), "", recv_rows * H * 2 / 1e6);
      std::printf("%-18s %10.2f %10s %12s   (copy bound + expanded write)\n", "bound", t_bound, "", "");
      if (fp8)
        std::printf("%-18s %10.2f %10.1f %12.1f   (e4m3 rows + scales; its bound %.2f us: copy %.2f + write %.2f)\n",
                    "fp8 dispatch", t_dispatch8, gbs(max_pairs / (2 * H) * row8, t_dispatch8),
                    gbs(max_remote / (2 * H) * row8, t_dispatch8), t_bound8, t_copy8, t_expand8);
      std::printf("dispatch / bound: %.3f, combine / bound: %.3f, dispatch / copy bound: %.3f, combine / copy bound: "
                  "%.3f (time ratios); check: %s\n",
                  t_dispatch / t_bound, t_combine / t_bound, t_dispatch / t_copy, t_combine / t_copy, check.c_str());
      std::printf("each step on the GPU's clock (events around it, the layout before, the stream held): dispatch "
                  "%.2f us, combine %.2f us; dispatch / bound: %.3f, combine / bound: %.3f\n",
                  t_dispatch_ev, t_combine_ev, t_dispatch_ev / t_bound, t_combine_ev / t_bound);
      if (fp8) std::printf("fp8 dispatch / its bound: %.3f, fp8 dispatch / bf16 dispatch: %.3f\n",
                           t_dispatch8 / t_bound8, t_dispatch8 / t_dispatch);
      if (t_nccl > 0)
        std::printf("NCCL all-to-all + permutations (torch's all_to_all_single between two index_selects; its "
                    "counts given): %.2f us, weft dispatch / it: %.3f; its recv_x vs weft's: %s\n",
                    t_nccl, t_dispatch / t_nccl, nccl_check.c_str());
      else
        std::printf("NCCL all-to-all: %s\n", nccl_check.c_str());
      if (M > 0)
        std::printf("low-latency mode, %d tokens per rank (events around each half of a step, median, max over "
                    "ranks): dispatch %.2f us, combine %.2f us%s; check: %s\n",
                    M, t_ll_dispatch, t_ll_combine,
                    fp8 ? str(", fp8 dispatch ", std::round(t_ll_dispatch8 * 100) / 100, " us").c_str() : "",
                    ll_check.c_str());
    }
    std::fflush(stdout);
  }
  return ok ? 0 : 3;
}

}  // namespace weft::bench
