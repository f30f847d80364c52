// MoE under tensor parallelism on the GPU: weft::AgMoe (AllGather + the
// up-projection's grouped GEMM) then weft::MoeRs (the down-projection's
// grouped GEMM + top-k weighted sum + ReduceScatter), each on its sequential
// path, its overlapped path (AgMoe by source regions, MoeRs by destination)
// and the path it chooses by timing, as one activation-free layer: AgMoe's
// output is MoeRs's h (K_local = N_local).
//
// Every rank rebuilds every rank's tokens, routing and weights and the full
// expert weights from a seed (values on a grid exact in bf16 and fp16), and
// holds rank r's slices of F (8-aligned, uneven where F / 8 does not divide
// by the world size). Checked on every rank, after outputs poisoned with NaN:
//   - the routing maps bitwise: expert counts and offsets, the sorted rows'
//     (gathered token, slot) against moe_detail::expert_rows on the gathered
//     routing, each pair's row and weight;
//   - AgMoe's rows against float64 (each one rounding of an fp32 dot), and
//     its rows past the pair count still poisoned;
//   - the layer's output against the float64 unsharded layer: relative
//     error (Frobenius, per rank) under 1e-2 and every element within 1/32
//     of its terms' magnitude;
//   - cases: Mixtral-like (E 8, k 2), DeepSeek-like (E 32, k 8), Qwen-like (E 128, k 8, uneven F
//     slices) on 1001 tokens ragged over the ranks under Zipf routing, a rank
//     whose tokens all go to one expert, -1 entries with repeated experts and
//     empty experts (first, last, every fourth), one token per rank, fp16,
//     padding past the largest rank's count, every AllGather and
//     ReduceScatter variant;
//   - every case on each mode (sequential, fused, automatic) of both plans,
//     fused reporting its path; one case with AgMoe and MoeRs on different
//     paths (MoeRs's regions come from the routing, whichever path sorted it);
//   - 1,000 back-to-back runs bitwise equal to the first; CUDA-graph replays
//     equal to eager, and a replay after new routing equal to an eager run on
//     it; both on the sequential and on the overlapped path;
//   - bad expert ids left out and named on every rank by check_errors; bad
//     options, disagreeing ranks, mismatched plans and (MoeRs fused) a
//     routing without its sorted rows' tokens refused on every rank.
// Every rank makes every collective call whatever it found; verdicts are
// compared across ranks.
//
// weft_internode_tests compiles this file too (WEFT_TESTS_ACROSS_NODES): there
// the ranks span nodes (virtual ones on one machine, or real ones), the
// sequential path's AllGather and ReduceScatter take their two-level
// schedules, and the same cases run on modes sequential and automatic (which
// runs the sequential path there); mode fused is refused, naming the modes
// that run, and the cases that pick one-node collective variants are left out.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gpu_check.hpp"
#include "gpu_test.hpp"
#include "half_bits.hpp"
#include "ops/moe/moe_tiles.hpp"
#include "ops/moe/moe_tp_layout.hpp"
#include "weft/core/error.hpp"
#include "weft/ops/moe_tp.hpp"

#include "across_nodes_setup.hpp"

using namespace weft;
using weft::test::ctx;
using weft::test::float_to_half_bits;
using weft::test::half_bits_to_float;

namespace {

std::uint64_t mix(std::uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// m / 64 for a seeded m in [-64, 64]: 7 significant bits, exact in bf16 and fp16.
double grid_value(std::uint64_t seed, std::uint64_t tag, std::uint64_t a, std::uint64_t b, std::uint64_t c) {
  const std::uint64_t h = mix(seed ^ mix(tag ^ mix(a ^ mix(b ^ mix(c)))));
  return (static_cast<double>(h % 129) - 64.0) / 64.0;
}

constexpr std::uint16_t kPoison = 0xFFFF;  // NaN in bf16 and fp16: memset 0xFF

enum class Routing { uniform, zipf, rank_to_one_expert, none_repeats_empty };
const char* name(Routing r) {
  const char* names[] = {"uniform", "Zipf", "the last rank's tokens to one expert",
                         "-1 entries, repeated experts, empty experts"};
  return names[static_cast<int>(r)];
}

struct BadId {
  int rank;
  std::int64_t token;
  int slot;
  std::int64_t id;
};

struct Case {
  std::string label;
  int experts, k;
  std::int64_t hidden, f;            // F: the unsharded intermediate size
  std::vector<std::int64_t> tokens;  // per rank
  Routing routing;
  std::uint64_t seed;
  DType dtype = DType::bf16;
  std::int64_t extra_capacity = 0;   // shard room past the largest rank's count
  AllGatherVariant gather = AllGatherVariant::automatic;
  ReduceScatterVariant scatter = ReduceScatterVariant::automatic;
  std::vector<BadId> bad;            // ids written over the routing after it is drawn
  OverlapMode mode = OverlapMode::sequential;     // AgMoe's path
  OverlapMode rs_mode = OverlapMode::sequential;  // MoeRs's
};

std::string describe(const Case& c) {
  std::string t;
  for (auto n : c.tokens) t += str(n, " ");
  return str(c.label, ": E ", c.experts, " k ", c.k, " H ", c.hidden, " F ", c.f, " ", to_string(c.dtype), ", ",
             name(c.routing), ", gather ", to_string(c.gather), ", scatter ", to_string(c.scatter), ", AgMoe mode ",
             to_string(c.mode), ", MoeRs mode ", to_string(c.rs_mode), ", tokens per rank ", t);
}

// `total` tokens over `world` ranks by weight s + 1, rank 1 holding none from 3 ranks on.
std::vector<std::int64_t> ragged(int world, std::int64_t total) {
  std::vector<std::int64_t> n(world, 0);
  std::int64_t weights = 0, given = 0;
  for (int s = 0; s < world; ++s) weights += (world > 2 && s == 1) ? 0 : s + 1;
  for (int s = 0; s < world; ++s) {
    n[s] = (world > 2 && s == 1) ? 0 : total * (s + 1) / weights;
    given += n[s];
  }
  n[0] += total - given;
  return n;
}

// Rank r's slice of F: [lo(r), lo(r + 1)), in units of 8.
std::int64_t slice_lo(std::int64_t f, int world, int r) { return 8 * ((f / 8) * r / world); }

struct Routed {
  std::vector<std::int64_t> topk;  // [T][k]
  std::vector<float> weights;      // [T][k]
};

Routed make_routing(const Case& c, int s, int world) {
  Routed r;
  const std::int64_t T = c.tokens[s];
  const int E = c.experts, k = c.k;
  std::mt19937_64 rng(c.seed * 1000003u + static_cast<std::uint64_t>(s));
  std::vector<double> weight(E, 1.0);
  if (c.routing == Routing::zipf)
    for (int e = 0; e < E; ++e) weight[e] = 1.0 / std::pow(e + 1.0, 1.2);
  if (c.routing == Routing::none_repeats_empty)  // experts 0, 4, 8, ... and the last stay empty
    for (int e = 0; e < E; ++e)
      if (e % 4 == 0 || e == E - 1) weight[e] = 0;
  r.topk.assign(static_cast<std::size_t>(T) * k, -1);
  r.weights.assign(static_cast<std::size_t>(T) * k, 0.f);
  std::uniform_real_distribution<float> wd(0.05f, 1.f);
  for (std::int64_t t = 0; t < T; ++t) {
    std::int64_t* row = &r.topk[t * k];
    for (int j = 0; j < k; ++j) r.weights[t * k + j] = wd(rng);
    if (c.routing == Routing::rank_to_one_expert && s == world - 1) {
      row[0] = E / 2;  // this rank's every pair goes to one expert
      continue;
    }
    std::vector<double> w = weight;
    for (int j = 0; j < k; ++j) {
      if (std::all_of(w.begin(), w.end(), [](double v) { return v == 0; })) break;
      std::discrete_distribution<int> pick(w.begin(), w.end());
      row[j] = pick(rng);
      w[row[j]] = 0;  // distinct, unless repeated below
    }
    if (c.routing == Routing::none_repeats_empty) {
      for (int j = 0; j < k; ++j)
        if (rng() % 3 == 0) row[j] = -1;
      if (k > 1 && t % 5 == 0) row[k - 1] = row[0];  // a repeated expert: two pairs, both summed
    }
  }
  for (const BadId& b : c.bad)
    if (b.rank == s && b.token < T) r.topk[b.token * k + b.slot] = b.id;
  return r;
}

struct TestBuffer {
  void* p = nullptr;
  std::size_t bytes = 0;
  explicit TestBuffer(std::size_t n) : bytes(std::max<std::size_t>(n, 16)) { WEFT_CUDA(cudaMalloc(&p, bytes)); }
  ~TestBuffer() { cudaFree(p); }
  TestBuffer(const TestBuffer&) = delete;
  TestBuffer& operator=(const TestBuffer&) = delete;
  template <class T>
  T* as() const { return static_cast<T*>(p); }
  template <class T>
  void upload(const std::vector<T>& v) const {
    if (v.empty()) return;
    WEFT_CUDA(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    // From pageable memory the copy may return before its DMA lands, on the legacy stream,
    // which the test's non-blocking stream does not wait for.
    WEFT_CUDA(cudaDeviceSynchronize());
  }
};

template <class T>
std::vector<T> to_host(const void* d, std::size_t n) {
  std::vector<T> v(n);
  if (n) WEFT_CUDA(cudaMemcpyAsync(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost, test::stream()));
  ctx().synchronize(test::stream());
  return v;
}

// One rank's view of a layer: every rank's inputs on the host, its own on
// the device, its plans, and the float64 checks.
class Layer {
 public:
  explicit Layer(const Case& c) : c_(c), world_(ctx().world_size()), me_(ctx().rank()) {
    cap_ = std::max<std::int64_t>(1, *std::max_element(c.tokens.begin(), c.tokens.end()) + c.extra_capacity);
    n_lo_ = slice_lo(c.f, world_, me_);
    n_local_ = slice_lo(c.f, world_, me_ + 1) - n_lo_;
    const int E = c.experts, k = c.k;
    const std::int64_t H = c.hidden, F = c.f;
    for (int s = 0; s < world_; ++s) routes_.push_back(make_routing(c, s, world_));
    xs_.resize(static_cast<std::size_t>(world_) * cap_ * H, 0.f);
    for (int s = 0; s < world_; ++s)
      for (std::int64_t t = 0; t < c.tokens[s]; ++t)
        for (std::int64_t h = 0; h < H; ++h) xs_[(s * cap_ + t) * H + h] = static_cast<float>(grid_value(c.seed, 1, s, t, h));
    up_.resize(static_cast<std::size_t>(E) * F * H);
    down_.resize(static_cast<std::size_t>(E) * H * F);
    for (int e = 0; e < E; ++e)
      for (std::int64_t f = 0; f < F; ++f)
        for (std::int64_t h = 0; h < H; ++h) {
          up_[(e * F + f) * H + h] = static_cast<float>(grid_value(c.seed, 2, e, f, h) / 32);
          down_[(e * H + h) * F + f] = static_cast<float>(grid_value(c.seed, 3, e, h, f) / 32);
        }

    const std::int64_t T = c.tokens[me_];
    std::vector<std::uint16_t> x(static_cast<std::size_t>(T) * H), wu(static_cast<std::size_t>(E) * n_local_ * H),
        wd(static_cast<std::size_t>(E) * H * n_local_);
    auto bits = [&](double v) { return float_to_half_bits(static_cast<float>(v), c.dtype); };  // v exact in the type
    for (std::int64_t i = 0; i < T * H; ++i) x[i] = bits(xs_[me_ * cap_ * H + i]);
    for (int e = 0; e < E; ++e)
      for (std::int64_t n = 0; n < n_local_; ++n)
        for (std::int64_t h = 0; h < H; ++h) {
          wu[(e * n_local_ + n) * H + h] = bits(up_[(e * F + n_lo_ + n) * H + h]);
          wd[(e * H + h) * n_local_ + n] = bits(down_[(e * H + h) * F + n_lo_ + n]);
        }
    x_ = std::make_unique<TestBuffer>(x.size() * 2);
    topk_ = std::make_unique<TestBuffer>(routes_[me_].topk.size() * 8);
    weights_ = std::make_unique<TestBuffer>(routes_[me_].weights.size() * 4);
    w_up_ = std::make_unique<TestBuffer>(wu.size() * 2);
    w_down_ = std::make_unique<TestBuffer>(wd.size() * 2);
    x_->upload(x);
    topk_->upload(routes_[me_].topk);
    weights_->upload(routes_[me_].weights);
    w_up_->upload(wu);
    w_down_->upload(wd);

    up_plan_ = std::make_unique<AgMoe>(test::ctx_ptr(), AgMoeOptions{.experts = E,
                                                                     .hidden = H,
                                                                     .n_local = n_local_,
                                                                     .top_k = k,
                                                                     .max_tokens_per_rank = cap_,
                                                                     .dtype = c.dtype,
                                                                     .gather = c.gather,
                                                                     .mode = c.mode});
    down_plan_ = std::make_unique<MoeRs>(test::ctx_ptr(), MoeRsOptions{.experts = E,
                                                                       .hidden = H,
                                                                       .k_local = n_local_,
                                                                       .top_k = k,
                                                                       .max_tokens_per_rank = cap_,
                                                                       .dtype = c.dtype,
                                                                       .scatter = c.scatter,
                                                                       .mode = c.rs_mode});
    h_ = std::make_unique<TestBuffer>(static_cast<std::size_t>(up_plan_->max_rows()) * n_local_ * 2);
    out_ = std::make_unique<TestBuffer>(static_cast<std::size_t>(T) * H * 2);
  }

  /// NaN into both outputs.
  void poison(cudaStream_t s) const {
    bench::poison(h_->p, h_->bytes, 0xFF, s);
    bench::poison(out_->p, out_->bytes, 0xFF, s);
  }
  /// The layer: AgMoe, then MoeRs on its output and routing. Collective.
  void run(cudaStream_t s) {
    up_plan_->run(x_->p, topk_->as<std::int64_t>(), weights_->as<float>(), c_.tokens[me_], w_up_->p, h_->p, s);
    down_plan_->run(h_->p, up_plan_->routing(), w_down_->p, out_->p, s);
  }

  /// Draws a new routing and new top-k weights for every rank (same counts, no bad ids) and
  /// uploads this rank's; the tokens and expert weights stay.
  void reroute(std::uint64_t seed) {
    c_.seed = seed;
    c_.bad.clear();
    routes_.clear();
    for (int s = 0; s < world_; ++s) routes_.push_back(make_routing(c_, s, world_));
    topk_->upload(routes_[me_].topk);
    weights_->upload(routes_[me_].weights);
  }

  /// Everything this rank can check of the last run: "" if right, else the first thing wrong.
  std::string check() const {
    std::string e = check_routing_and_h();
    if (e.empty()) e = check_out();
    return e;
  }

  AgMoe& up() { return *up_plan_; }
  MoeRs& down() { return *down_plan_; }
  const TestBuffer& h() const { return *h_; }
  const TestBuffer& out() const { return *out_; }

 private:
  // The gathered routing, ids outside [0, E) as none (what the plan computes with).
  std::vector<std::int64_t> gathered() const {
    std::vector<std::vector<std::int64_t>> topk;
    for (const Routed& r : routes_) topk.push_back(r.topk);
    std::vector<std::int64_t> g = moe_detail::gathered_routing(topk, c_.tokens, cap_, c_.k);
    for (auto& id : g)
      if (id < -1 || id >= c_.experts) id = -1;
    return g;
  }

  std::string check_routing_and_h() const {
    const int E = c_.experts, k = c_.k;
    const std::int64_t H = c_.hidden, F = c_.f, G = world_ * cap_;
    const MoeRouting& r = up_plan_->routing();
    const std::vector<std::int64_t> g = gathered();
    const moe_detail::ExpertRows want = moe_detail::expert_rows(g.data(), G, k, E);
    const auto offset = to_host<std::int32_t>(r.expert_offset, E + 1);
    const auto rows = to_host<std::int32_t>(r.expert_rows, E);
    for (int e = 0; e <= E; ++e)
      if (offset[e] != want.offset[e]) return str("expert_offset[", e, "] = ", offset[e], ", expected ", want.offset[e]);
    for (int e = 0; e < E; ++e)
      if (rows[e] != want.offset[e + 1] - want.offset[e])
        return str("expert_rows[", e, "] = ", rows[e], ", expected ", want.offset[e + 1] - want.offset[e]);
    const std::int64_t P = want.offset[E];
    const auto row_token = to_host<std::int32_t>(r.row_token, P);
    const auto row_slot = to_host<std::int32_t>(r.row_slot, P);
    for (std::int64_t i = 0; i < P; ++i)
      if (row_token[i] != want.token[i] || row_slot[i] != want.slot[i])
        return str("sorted row ", i, " holds (token ", row_token[i], ", slot ", row_slot[i], "), expected (",
                   want.token[i], ", ", want.slot[i], ")");
    std::vector<std::int32_t> inverse(static_cast<std::size_t>(G) * k, -1);
    for (std::int64_t i = 0; i < P; ++i) inverse[want.token[i] * k + want.slot[i]] = static_cast<std::int32_t>(i);
    const auto token_row = to_host<std::int32_t>(r.token_row, G * k);
    const auto token_weight = to_host<float>(r.token_weight, G * k);
    for (std::int64_t p = 0; p < G * k; ++p) {
      if (token_row[p] != inverse[p])
        return str("token_row of gathered token ", p / k, " slot ", p % k, ": ", token_row[p], ", expected ", inverse[p]);
      const std::int64_t s = p / k / cap_, t = p / k % cap_;
      const float w = inverse[p] >= 0 ? routes_[s].weights[t * k + p % k] : 0.f;
      if (std::memcmp(&token_weight[p], &w, 4) != 0)
        return str("token_weight of gathered token ", p / k, " slot ", p % k, ": ", token_weight[p], ", expected ", w);
    }

    // AgMoe's rows: pair i's up-projection over this rank's slice, one rounding of an fp32 dot.
    const auto h = to_host<std::uint16_t>(h_->p, static_cast<std::size_t>(up_plan_->max_rows()) * n_local_);
    for (std::int64_t i = 0; i < P; ++i) {
      const std::int64_t tok = want.token[i];
      const std::int64_t e = g[tok * k + want.slot[i]];
      const float* x = &xs_[tok * H];
      for (std::int64_t n = 0; n < n_local_; ++n) {
        const float* w = &up_[(e * F + n_lo_ + n) * H];
        double ref = 0, mag = 0;
        for (std::int64_t c = 0; c < H; ++c) {
          ref += static_cast<double>(w[c]) * x[c];
          mag += std::fabs(static_cast<double>(w[c]) * x[c]);
        }
        const double got = half_bits_to_float(h[i * n_local_ + n], c_.dtype);
        if (!(std::fabs(got - ref) <= std::fabs(ref) / 128 + mag * 1e-4))
          return str("AgMoe row ", i, " (token ", tok, ", expert ", e, ") column ", n, ": ", got, ", float64 ", ref);
      }
    }
    for (std::int64_t i = P * n_local_; i < up_plan_->max_rows() * n_local_; ++i)
      if (h[i] != kPoison) return str("AgMoe wrote element ", i % n_local_, " of row ", i / n_local_, " past the ", P, " pairs");
    return "";
  }

  std::string check_out() const {
    const int k = c_.k;
    const std::int64_t H = c_.hidden, F = c_.f, T = c_.tokens[me_];
    const std::vector<std::int64_t> g = gathered();
    const auto out = to_host<std::uint16_t>(out_->p, static_cast<std::size_t>(T) * H);
    double err2 = 0, ref2 = 0;
    std::vector<double> hf(F), ref(H), mag(H);
    for (std::int64_t t = 0; t < T; ++t) {
      const std::int64_t tok = me_ * cap_ + t;
      std::fill(ref.begin(), ref.end(), 0.0);
      std::fill(mag.begin(), mag.end(), 0.0);
      for (int j = 0; j < k; ++j) {
        const std::int64_t e = g[tok * k + j];
        if (e < 0) continue;
        const double w = routes_[me_].weights[t * k + j];
        const float* x = &xs_[tok * H];
        for (std::int64_t f = 0; f < F; ++f) {
          const float* u = &up_[(e * F + f) * H];
          double acc = 0;
          for (std::int64_t c = 0; c < H; ++c) acc += static_cast<double>(u[c]) * x[c];
          hf[f] = acc;
        }
        for (std::int64_t c = 0; c < H; ++c) {
          const float* d = &down_[(e * H + c) * F];
          double acc = 0, m = 0;
          for (std::int64_t f = 0; f < F; ++f) {
            acc += d[f] * hf[f];
            m += std::fabs(d[f] * hf[f]);
          }
          ref[c] += w * acc;
          mag[c] += std::fabs(w) * m;
        }
      }
      for (std::int64_t c = 0; c < H; ++c) {
        const double got = half_bits_to_float(out[t * H + c], c_.dtype);
        if (!(std::fabs(got - ref[c]) <= mag[c] / 32))
          return str("out token ", t, " channel ", c, ": ", got, ", float64 ", ref[c], " (sum of |terms| ", mag[c], ")");
        err2 += (got - ref[c]) * (got - ref[c]);
        ref2 += ref[c] * ref[c];
      }
    }
    if (ref2 == 0 ? err2 != 0 : !(std::sqrt(err2 / ref2) < 1e-2))
      return str("out's relative error ", std::sqrt(err2 / std::max(ref2, 1e-300)), " is not under 1e-2");
    return "";
  }

  Case c_;
  int world_, me_;
  std::int64_t cap_ = 0, n_lo_ = 0, n_local_ = 0;
  std::vector<Routed> routes_;
  std::vector<float> xs_;         // [W][cap][H], every rank's tokens
  std::vector<float> up_, down_;  // [E][F][H], [E][H][F]: the unsharded weights
  std::unique_ptr<TestBuffer> x_, topk_, weights_, w_up_, w_down_, h_, out_;
  std::unique_ptr<AgMoe> up_plan_;
  std::unique_ptr<MoeRs> down_plan_;
};

constexpr char kAgMoeFusedPath[] = "fused, source regions";
constexpr char kMoeRsFusedPath[] = "fused, by destination";

// "" if a plan asked for `mode` ran the path it names (automatic: either), else what it ran.
std::string path_error(const char* plan, OverlapMode mode, const std::string& path, const char* fused_path) {
  if (mode == OverlapMode::automatic || (mode == OverlapMode::fused) == (path == fused_path)) return "";
  return str(plan, " with mode ", to_string(mode), " ran the path '", path, "'");
}

// Builds the case's layer, runs it once on poisoned outputs (automatic: the
// first run times both paths, the output is its last call's), checks; "" or
// what was wrong (or thrown).
std::string run_and_check(const Case& c) {
  try {
    Layer layer(c);
    layer.poison(test::stream());
    layer.run(test::stream());
    std::string error = layer.check();
    if (error.empty()) error = path_error("AgMoe", c.mode, layer.up().path(), kAgMoeFusedPath);
    if (error.empty()) error = path_error("MoeRs", c.rs_mode, layer.down().path(), kMoeRsFusedPath);
    return error;
  } catch (const std::exception& e) {
    return str("threw: ", e.what());
  }
}

// The modes every case runs on, and those the repeat and replay cases run on:
// across nodes the overlapped paths are refused (their copies write into
// every peer's heap) and automatic runs the sequential path.
#if defined(WEFT_TESTS_ACROSS_NODES)
constexpr OverlapMode kModes[] = {OverlapMode::sequential, OverlapMode::automatic};
constexpr OverlapMode kRepeatModes[] = {OverlapMode::sequential};
#else
constexpr OverlapMode kModes[] = {OverlapMode::sequential, OverlapMode::fused, OverlapMode::automatic};
constexpr OverlapMode kRepeatModes[] = {OverlapMode::sequential, OverlapMode::fused};
#endif

// The case on each mode, both plans on the same one.
void expect_right(const Case& base) {
  for (OverlapMode mode : kModes) {
    Case c = base;
    c.mode = c.rs_mode = mode;
    const std::string error = run_and_check(c);
    EXPECT_EQ(error, "") << "rank " << ctx().rank() << ": " << describe(c);
    EXPECT_TRUE(test::all_ranks(error.empty())) << describe(c);
  }
}

}  // namespace

TEST(MoeTp, MixtralLikeLayerMatchesFloat64) {
  ACROSS_NODES_SETUP();
  const int world = ctx().world_size();
  expect_right({"Mixtral-like", 8, 2, 512, 1024, ragged(world, 256), Routing::uniform, 1});
}

TEST(MoeTp, QwenLikeLayerOn1001RaggedTokensUnderZipfRouting) {
  ACROSS_NODES_SETUP();
  const int world = ctx().world_size();
  // F = 520: 65 units of 8, so the slices differ by rank at 2, 4 and 8 ranks.
  expect_right({"Qwen-like", 128, 8, 128, 520, ragged(world, 1001), Routing::zipf, 2});
}

TEST(MoeTp, DeepSeekLikeLayerMatchesFloat64) {
  ACROSS_NODES_SETUP();
  const int world = ctx().world_size();
  // E 32, top-8: the third model shape's routing fan-out, at test size.
  expect_right({"DeepSeek-like", 32, 8, 512, 256, ragged(world, 512), Routing::uniform, 8});
}

TEST(MoeTp, ARankWhoseTokensAllGoToOneExpert) {
  ACROSS_NODES_SETUP();
  const int world = ctx().world_size();
  expect_right({"1001 tokens", 8, 2, 256, 512, ragged(world, 1001), Routing::rank_to_one_expert, 3});
}

#if !defined(WEFT_TESTS_ACROSS_NODES)  // the fused paths and one-node collective variants
TEST(MoeTp, AgMoeAndMoeRsOnDifferentPaths) {
  const int world = ctx().world_size();
  const OverlapMode sequential = OverlapMode::sequential, fused = OverlapMode::fused;
  for (auto [up, down] : {std::pair{sequential, fused}, std::pair{fused, sequential}}) {
    Case c{"mixed paths", 16, 4, 256, 512, ragged(world, 301), Routing::zipf, 7};
    c.mode = up;
    c.rs_mode = down;
    const std::string error = run_and_check(c);
    EXPECT_EQ(error, "") << "rank " << ctx().rank() << ": " << describe(c);
    EXPECT_TRUE(test::all_ranks(error.empty())) << describe(c);
  }
}

#endif

TEST(MoeTp, NoneEntriesRepeatedExpertsEmptyExpertsAndPadding) {
  ACROSS_NODES_SETUP();
  const int world = ctx().world_size();
  Case c{"-1, repeats, empties", 16, 4, 256, 512, ragged(world, 301), Routing::none_repeats_empty, 4};
  c.extra_capacity = 37;  // shards with room past every rank's tokens
  expect_right(c);
}

TEST(MoeTp, OneTokenPerRankAndFp16) {
  ACROSS_NODES_SETUP();
  const int world = ctx().world_size();
  expect_right({"one token per rank", 8, 2, 256, 512, std::vector<std::int64_t>(world, 1), Routing::uniform, 5});
  Case fp16{"fp16", 8, 2, 256, 512, ragged(world, 300), Routing::zipf, 6, DType::fp16};
  expect_right(fp16);
}

#if !defined(WEFT_TESTS_ACROSS_NODES)
TEST(MoeTp, EveryAllGatherAndReduceScatterVariant) {
  const int world = ctx().world_size();
  struct Pair {
    AllGatherVariant gather;
    ReduceScatterVariant scatter;
  };
  const Pair pairs[] = {{AllGatherVariant::push, ReduceScatterVariant::mesh},
                        {AllGatherVariant::pull, ReduceScatterVariant::ring},
                        {AllGatherVariant::low_latency, ReduceScatterVariant::low_latency},
                        {AllGatherVariant::ring, ReduceScatterVariant::copy_engine},
                        {AllGatherVariant::copy_engine, ReduceScatterVariant::mesh}};
  std::uint64_t seed = 10;
  for (const Pair& p : pairs) {
    Case c{"variants", 8, 2, 256, 512, ragged(world, 120), Routing::zipf, seed++};
    c.gather = p.gather;
    c.scatter = p.scatter;
    expect_right(c);
  }
}

#endif

namespace {

// 1,000 layer runs with both plans on one mode, each bitwise equal to the first. "" or what was wrong.
std::string thousand_runs_bitwise(OverlapMode mode) {
  const int world = ctx().world_size();
  std::string error;
  unsigned long long* bad = nullptr;
  WEFT_CUDA(cudaMalloc(&bad, 4 * sizeof(unsigned long long)));
  try {
    Case c{"back to back", 8, 2, 256, 512, ragged(world, 200), Routing::zipf, 20};
    c.mode = c.rs_mode = mode;
    Layer layer(c);
    cudaStream_t s = test::stream();
    layer.poison(s);
    layer.run(s);
    error = layer.check();
    const MoeRouting& r = layer.up().routing();
    const std::size_t G = static_cast<std::size_t>(r.world) * r.capacity;
    TestBuffer first_h(layer.h().bytes), first_out(layer.out().bytes), first_rows(r.max_rows * 4),
        first_token_row(G * r.top_k * 4);
    WEFT_CUDA(cudaMemcpyAsync(first_h.p, layer.h().p, layer.h().bytes, cudaMemcpyDeviceToDevice, s));
    WEFT_CUDA(cudaMemcpyAsync(first_out.p, layer.out().p, layer.out().bytes, cudaMemcpyDeviceToDevice, s));
    WEFT_CUDA(cudaMemcpyAsync(first_rows.p, r.row_token, r.max_rows * 4, cudaMemcpyDeviceToDevice, s));
    WEFT_CUDA(cudaMemcpyAsync(first_token_row.p, r.token_row, G * r.top_k * 4, cudaMemcpyDeviceToDevice, s));
    WEFT_CUDA(cudaMemsetAsync(bad, 0, 4 * sizeof(unsigned long long), s));
    for (int i = 1; i < 1000; ++i) {  // no synchronisation between runs
      layer.poison(s);
      layer.run(s);
      bench::accumulate_mismatches(layer.h().p, first_h.p, layer.h().bytes, bad, s);
      bench::accumulate_mismatches(layer.out().p, first_out.p, layer.out().bytes, bad + 1, s);
      bench::accumulate_mismatches(r.row_token, first_rows.p, r.max_rows * 4, bad + 2, s);
      bench::accumulate_mismatches(r.token_row, first_token_row.p, G * r.top_k * 4, bad + 3, s);
    }
    const auto n = to_host<unsigned long long>(bad, 4);
    if (error.empty() && (n[0] || n[1] || n[2] || n[3]))
      error = str("bytes that differed from the first run over 999 runs: h ", n[0], ", out ", n[1], ", row_token ",
                  n[2], ", token_row ", n[3]);
  } catch (const std::exception& e) {
    error = str("threw: ", e.what());
  }
  cudaFree(bad);
  return error;
}

}  // namespace

TEST(MoeTp, AThousandBackToBackRunsAreBitwiseEqualToTheFirst) {
  ACROSS_NODES_SETUP();
  for (OverlapMode mode : kRepeatModes) {
    const std::string error = thousand_runs_bitwise(mode);
    EXPECT_EQ(error, "") << "rank " << ctx().rank() << ", mode " << to_string(mode);
    EXPECT_TRUE(test::all_ranks(error.empty())) << "mode " << to_string(mode);
  }
}

namespace {

// CUDA-graph replays of the layer, both plans on one mode, against eager runs, before and after new routing. "" or
// what was wrong.
std::string graph_replays_equal_eager(OverlapMode mode) {
  const int world = ctx().world_size();
  std::string error;
  unsigned long long* bad = nullptr;
  WEFT_CUDA(cudaMalloc(&bad, 2 * sizeof(unsigned long long)));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  try {
    Case c{"graph", 16, 4, 256, 512, ragged(world, 230), Routing::zipf, 30};
    c.mode = c.rs_mode = mode;
    Layer layer(c);
    cudaStream_t s = test::stream();
    layer.poison(s);
    layer.run(s);  // eager first: plans choose and load their kernels outside the capture
    error = layer.check();
    TestBuffer eager_h(layer.h().bytes), eager_out(layer.out().bytes);
    WEFT_CUDA(cudaMemcpyAsync(eager_h.p, layer.h().p, layer.h().bytes, cudaMemcpyDeviceToDevice, s));
    WEFT_CUDA(cudaMemcpyAsync(eager_out.p, layer.out().p, layer.out().bytes, cudaMemcpyDeviceToDevice, s));
    WEFT_CUDA(cudaMemsetAsync(bad, 0, 2 * sizeof(unsigned long long), s));
    ctx().synchronize(s);
    WEFT_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    layer.poison(s);
    layer.run(s);
    WEFT_CUDA(cudaStreamEndCapture(s, &graph));
    WEFT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < 20; ++i) {
      WEFT_CUDA(cudaGraphLaunch(exec, s));
      bench::accumulate_mismatches(layer.h().p, eager_h.p, layer.h().bytes, bad, s);
      bench::accumulate_mismatches(layer.out().p, eager_out.p, layer.out().bytes, bad + 1, s);
    }
    auto n = to_host<unsigned long long>(bad, 2);
    if (error.empty() && (n[0] || n[1]))
      error = str("bytes of 20 replays that differed from the eager run: h ", n[0], ", out ", n[1]);
    if (error.empty()) error = layer.check();

    // New routing and weights in the same device buffers: a replay reads them, as an eager run does.
    layer.reroute(31);
    WEFT_CUDA(cudaGraphLaunch(exec, s));
    ctx().synchronize(s);
    if (error.empty()) {
      error = layer.check();
      if (!error.empty()) error = "replay after new routing: " + error;
    }
    WEFT_CUDA(cudaMemcpyAsync(eager_h.p, layer.h().p, layer.h().bytes, cudaMemcpyDeviceToDevice, s));
    WEFT_CUDA(cudaMemcpyAsync(eager_out.p, layer.out().p, layer.out().bytes, cudaMemcpyDeviceToDevice, s));
    WEFT_CUDA(cudaMemsetAsync(bad, 0, 2 * sizeof(unsigned long long), s));
    layer.poison(s);
    layer.run(s);
    bench::accumulate_mismatches(layer.h().p, eager_h.p, layer.h().bytes, bad, s);
    bench::accumulate_mismatches(layer.out().p, eager_out.p, layer.out().bytes, bad + 1, s);
    n = to_host<unsigned long long>(bad, 2);
    if (error.empty() && (n[0] || n[1]))
      error = str("the replay on new routing differs from the eager run on it: h ", n[0], ", out ", n[1], " bytes");
  } catch (const std::exception& e) {
    error = str("threw: ", e.what());
  }
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  cudaFree(bad);
  return error;
}

}  // namespace

TEST(MoeTp, GraphReplaysEqualEagerRunsAndReadTheRoutingOfTheirMoment) {
  ACROSS_NODES_SETUP();
  for (OverlapMode mode : kRepeatModes) {
    const std::string error = graph_replays_equal_eager(mode);
    EXPECT_EQ(error, "") << "rank " << ctx().rank() << ", mode " << to_string(mode);
    EXPECT_TRUE(test::all_ranks(error.empty())) << "mode " << to_string(mode);
  }
}

TEST(MoeTp, BadExpertIdsAreLeftOutAndNamedOnEveryRank) {
  ACROSS_NODES_SETUP();
  const int world = ctx().world_size();
  Case c{"bad ids", 8, 2, 256, 512, std::vector<std::int64_t>(world, 16), Routing::uniform, 40};
  c.bad = {{world - 1, 9, 1, 8 + 5}, {0, 7, 0, -3}, {world - 1, 12, 0, 1000}};
  std::string error, raised, later;
  try {
    Layer layer(c);
    layer.poison(test::stream());
    layer.run(test::stream());
    error = layer.check();  // the reference leaves the bad pairs out too
    try {
      layer.up().check_errors(test::stream());
    } catch (const std::exception& e) {
      raised = e.what();
    }
    layer.reroute(41);  // a clean routing: nothing more to report
    layer.run(test::stream());
    try {
      layer.up().check_errors(test::stream());
    } catch (const std::exception& e) {
      later = e.what();
    }
  } catch (const std::exception& e) {
    error = str("threw: ", e.what());
  }
  EXPECT_EQ(error, "") << "rank " << ctx().rank();
  // The lowest (gathered token, slot): rank 0's token 7.
  EXPECT_NE(raised.find("rank 0's token 7, slot 0 has expert id -3, outside [-1, 8)"), std::string::npos) << raised;
  EXPECT_EQ(later, "");
  EXPECT_TRUE(test::all_ranks(!HasFailure()));
}

TEST(MoeTp, BadOptionsDisagreeingRanksAndMismatchedPlansAreRefusedOnEveryRank) {
  ACROSS_NODES_SETUP();
  const int world = ctx().world_size(), me = ctx().rank();
  auto thrown = [](auto make) -> std::string {
    try {
      make();
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  };
  const std::string hidden = thrown([] {
    AgMoe p(test::ctx_ptr(), {.experts = 8, .hidden = 20, .n_local = 64, .top_k = 2, .max_tokens_per_rank = 8});
  });
  EXPECT_NE(hidden.find("AgMoe: hidden = 20 must be a positive multiple of 8"), std::string::npos) << hidden;
  const std::string k_local = thrown([] {
    MoeRs p(test::ctx_ptr(), {.experts = 8, .hidden = 64, .k_local = 12, .top_k = 2, .max_tokens_per_rank = 8});
  });
  EXPECT_NE(k_local.find("MoeRs: k_local = 12 must be a positive multiple of 8"), std::string::npos) << k_local;
  if (world > 1) {  // ranks asking for different plans all hear so
    const std::string differ = thrown([me] {
      AgMoe p(test::ctx_ptr(),
              {.experts = 8, .hidden = 64, .n_local = 64, .top_k = me == 0 ? 2 : 4, .max_tokens_per_rank = 8});
    });
    EXPECT_NE(differ.find("AgMoe plan"), std::string::npos) << differ;
  }
  // n_local may differ by rank: the plans agree.
  EXPECT_EQ(thrown([me] {
              AgMoe p(test::ctx_ptr(), {.experts = 8,
                                        .hidden = 64,
                                        .n_local = 64 + 8 * me,
                                        .top_k = 2,
                                        .max_tokens_per_rank = 8});
            }),
            "");
  std::string mismatch, too_many, no_rows;
  try {
    Layer layer({"mismatch", 8, 2, 256, 512, std::vector<std::int64_t>(world, 4), Routing::uniform, 50});
    MoeRs other(test::ctx_ptr(), {.experts = 8, .hidden = 256, .k_local = 64, .top_k = 4, .max_tokens_per_rank = 4});
    layer.run(test::stream());
    mismatch = thrown([&] { other.run(layer.h().p, layer.up().routing(), layer.h().p, layer.out().p, test::stream()); });
    const MoeRsOptions fused_options{
        .experts = 8, .hidden = 256, .k_local = 64, .top_k = 2, .max_tokens_per_rank = 4, .mode = OverlapMode::fused};
#if defined(WEFT_TESTS_ACROSS_NODES)
    // Across nodes the overlapped path is refused when the plan is built, naming the modes that run.
    no_rows = thrown([&] { MoeRs fused(test::ctx_ptr(), fused_options); });
#else
    MoeRs fused(test::ctx_ptr(), fused_options);
    // A routing without the sorted rows' tokens (as one rebuilt from the counts and pair maps alone):
    // the overlapped path cannot find its regions and says so, before any collective call.
    MoeRouting partial = layer.up().routing();
    partial.row_token = nullptr;
    no_rows = thrown([&] { fused.run(layer.h().p, partial, layer.h().p, layer.out().p, test::stream()); });
#endif
    too_many = thrown([&] {
      layer.up().run(nullptr, nullptr, nullptr, 5, layer.h().p, layer.h().p, test::stream());
    });
  } catch (const std::exception& e) {
    mismatch = str("threw: ", e.what());
  }
  EXPECT_NE(mismatch.find("top_k 2"), std::string::npos) << mismatch;
  EXPECT_NE(mismatch.find("this plan expects world"), std::string::npos) << mismatch;
  EXPECT_NE(too_many.find("num_tokens = 5 must be in [0, max_tokens_per_rank = 4]"), std::string::npos) << too_many;
#if defined(WEFT_TESTS_ACROSS_NODES)
  EXPECT_NE(no_rows.find("MoeRs with mode fused"), std::string::npos) << no_rows;
  EXPECT_NE(no_rows.find("use mode sequential, or automatic"), std::string::npos) << no_rows;
  const std::string up_fused = thrown([] {
    AgMoe p(test::ctx_ptr(), {.experts = 8, .hidden = 64, .n_local = 64, .top_k = 2, .max_tokens_per_rank = 8,
                              .mode = OverlapMode::fused});
  });
  EXPECT_NE(up_fused.find("AgMoe with mode fused"), std::string::npos) << up_fused;
  EXPECT_NE(up_fused.find("use mode sequential, or automatic"), std::string::npos) << up_fused;
#else
  EXPECT_NE(no_rows.find("mode fused needs the routing's expert_offset and row_token"), std::string::npos) << no_rows;
#endif
  EXPECT_TRUE(test::all_ranks(!HasFailure()));
}
