#include "weft/gemm/gemm.hpp"

#include <algorithm>
#include <limits>

#include "config.hpp"
#include "weft/core/error.hpp"
#include "weft/core/log.hpp"

namespace weft {
namespace gemm_detail {

const std::vector<const Config*>& all_configs() {
  static const std::vector<const Config*> configs = {
      config_bf16_bf16_nk_128x256x64_c2x1_cooperative(),
      config_bf16_bf16_nk_128x256x64_c1x2_cooperative(),
      config_bf16_bf16_nk_128x256x64_c2x1_cooperative_streamK(),
      config_bf16_bf16_nk_256x128x64_c1x2_cooperative(),
      config_bf16_bf16_nk_256x128x64_c2x1_cooperative(),
      config_bf16_bf16_nk_128x128x64_c2x1_cooperative(),
      config_bf16_bf16_nk_64x256x64_c1x1_pingpong(),
      config_bf16_bf16_kn_128x256x64_c2x1_cooperative(),
      config_bf16_bf16_kn_64x256x64_c1x1_pingpong(),
      config_bf16_fp32_nk_128x256x64_c2x1_cooperative(),
      config_fp16_fp16_nk_128x256x64_c2x1_cooperative(),
      config_fp16_fp16_nk_64x256x64_c1x1_pingpong(),
      config_fp16_fp16_kn_128x256x64_c2x1_cooperative(),
  };
  return configs;
}

}  // namespace gemm_detail

namespace {

constexpr int kTuneRuns = 5;  // timed runs per candidate on the first run (3 left the choice to noise)

const char* layout_name(BLayout l) { return l == BLayout::nk ? "[N,K]" : "[K,N]"; }

std::string describe(const GemmOptions& o) {
  return str(o.m, "x", o.n, "x", o.k, " ", to_string(o.input), " -> ", to_string(o.output), ", B ",
             layout_name(o.b_layout));
}

}  // namespace

Gemm::Gemm(const GemmOptions& options) : options_(options) {
  const GemmOptions& o = options_;
  WEFT_REQUIRE(o.m > 0 && o.n > 0 && o.k > 0, "Gemm: M, N, K must be positive, got ", o.m, " x ", o.n, " x ", o.k);
  WEFT_REQUIRE(o.m < (1ll << 31) && o.n < (1ll << 31) && o.k < (1ll << 31), "Gemm: dimensions must fit in 31 bits");
  WEFT_REQUIRE(o.input == DType::bf16 || o.input == DType::fp16, "Gemm: inputs must be bf16 or fp16, got ",
               to_string(o.input));
  WEFT_REQUIRE(o.output == o.input || o.output == DType::fp32, "Gemm: the output must be ", to_string(o.input),
               " (the input type) or fp32, got ", to_string(o.output));
  WEFT_REQUIRE(o.k % 8 == 0, "Gemm: K = ", o.k, " must be a multiple of 8 (rows of A",
               o.b_layout == BLayout::nk ? " and B" : "", " must be 16-byte aligned)");
  WEFT_REQUIRE(o.b_layout == BLayout::nk || o.n % 8 == 0, "Gemm: N = ", o.n,
               " must be a multiple of 8 for B stored [K,N] (16-byte aligned rows)");
  const std::int64_t out_align = 16 / static_cast<std::int64_t>(dtype_size(o.output));
  WEFT_REQUIRE(o.n % out_align == 0, "Gemm: N = ", o.n, " must be a multiple of ", out_align, " for ",
               to_string(o.output), " output (16-byte aligned rows of C)");
  for (const auto* c : gemm_detail::all_configs())
    if (c->input == o.input && c->output == o.output && c->b_layout == o.b_layout &&
        (o.config.empty() || o.config == c->name))
      candidates_.push_back(c);
  if (candidates_.empty()) {
    std::string have;
    for (const auto* c : gemm_detail::all_configs())
      have += str("\n  ", to_string(c->input), " -> ", to_string(c->output), ", B ", layout_name(c->b_layout), ": ",
                  c->name);
    WEFT_FAIL("Gemm: no compiled configuration for ", describe(o),
              o.config.empty() ? std::string() : str(" named '", o.config, "'"), "; available:", have);
  }
  int device = 0;
  WEFT_CUDA(cudaGetDevice(&device));
  WEFT_CUDA(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device));
  if (candidates_.size() == 1 || !o.autotune) {
    // Heuristic: a narrow tile when M alone cannot fill the GPU with wide ones.
    const gemm_detail::Config* best = candidates_.front();
    for (const auto* c : candidates_) {
      auto tiles = [&](const gemm_detail::Config* x) { return ((o.m + x->tile_m - 1) / x->tile_m) * ((o.n + x->tile_n - 1) / x->tile_n); };
      if (tiles(best) < sm_count_ && tiles(c) > tiles(best)) best = c;
    }
    chosen_ = best;
  }
}

Gemm::~Gemm() {
  if (workspace_) cudaFree(workspace_);
}

std::string Gemm::config() const {
  if (!chosen_) return "";
  return str(chosen_->name, ", swizzle ", swizzle_, raster_ == 1 ? " along M" : raster_ == 2 ? " along N" : "");
}

void Gemm::reserve_workspace(std::size_t bytes) {
  if (bytes <= workspace_bytes_) return;
  if (workspace_) WEFT_CUDA(cudaFree(workspace_));  // synchronises: nothing may still use the old one
  WEFT_CUDA(cudaMalloc(&workspace_, bytes));
  workspace_bytes_ = bytes;
}

std::vector<std::string> Gemm::configurations() const {
  std::vector<std::string> names;
  for (const auto* c : candidates_) names.push_back(c->name);
  return names;
}

void Gemm::tune(const void* a, const void* b, void* c, cudaStream_t stream) {
  cudaEvent_t start, stop;
  WEFT_CUDA(cudaEventCreate(&start));
  WEFT_CUDA(cudaEventCreate(&stop));
  float best_ms = std::numeric_limits<float>::max();
  // Every configuration with every swizzle and raster order: the same kernel,
  // other scheduler arguments, so trying them costs only run time.
  for (const auto* cfg : candidates_)
    for (int swizzle : {1, 2, 4, 8})
      for (int raster : {1, 2}) {
        gemm_detail::Problem p{options_.m, options_.n, options_.k, a, b, c, nullptr, sm_count_, swizzle, raster};
        if (*cfg->check(p)) continue;
        reserve_workspace(cfg->workspace(p));
        p.workspace = workspace_;
        if (*cfg->run(p, stream)) continue;  // warm-up, and a check that it launches
        WEFT_CUDA(cudaEventRecord(start, stream));
        for (int i = 0; i < kTuneRuns; ++i) cfg->run(p, stream);
        WEFT_CUDA(cudaEventRecord(stop, stream));
        WEFT_CUDA(cudaEventSynchronize(stop));
        float ms = 0;
        WEFT_CUDA(cudaEventElapsedTime(&ms, start, stop));
        WEFT_LOG(debug, "Gemm ", describe(options_), ": ", cfg->name, " swizzle ", swizzle, " raster ", raster, " ",
                 ms / kTuneRuns, " ms");
        if (ms < best_ms) {
          best_ms = ms;
          chosen_ = cfg;
          swizzle_ = swizzle;
          raster_ = raster;
        }
      }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  WEFT_REQUIRE(chosen_, "Gemm: no configuration can run ", describe(options_));
}

void Gemm::run(const void* a, const void* b, void* c, cudaStream_t stream) {
  WEFT_REQUIRE(a && b && c, "Gemm::run: A, B and C must be device pointers");
  for (const void* ptr : {a, b, static_cast<const void*>(c)})
    WEFT_REQUIRE((reinterpret_cast<std::uintptr_t>(ptr) & 15u) == 0, "Gemm::run: ", ptr,
                 " is not 16-byte aligned (TMA needs 16-byte aligned matrices)");
  if (!chosen_) {
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    WEFT_CUDA(cudaStreamIsCapturing(stream, &capturing));
    if (capturing == cudaStreamCaptureStatusNone) tune(a, b, c, stream);
    else chosen_ = candidates_.front();
  }
  gemm_detail::Problem p{options_.m, options_.n, options_.k, a, b, c, nullptr, sm_count_, swizzle_, raster_};
  const char* why = chosen_->check(p);
  WEFT_REQUIRE(!*why, "Gemm ", describe(options_), " with ", chosen_->name, ": ", why);
  reserve_workspace(chosen_->workspace(p));
  p.workspace = workspace_;
  const char* err = chosen_->run(p, stream);
  WEFT_REQUIRE(!*err, "Gemm ", describe(options_), " with ", chosen_->name, " failed to launch: ", err);
}

}  // namespace weft
