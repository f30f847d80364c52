#include "weft/gemm/gemm.hpp"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <limits>

#include "config.hpp"
#include "gemm_checks.hpp"
#include "tune_cache.hpp"
#include "weft/core/error.hpp"
#include "weft/core/log.hpp"
#include "weft/core/timing.hpp"

namespace weft {
namespace gemm_detail {

// One function per compiled kernel, each in a unit generated from
// src/gemm/kernel_table.cmake (cmake/WeftGemmKernels.cmake). Listed here, not
// self-registering: a static library would drop objects nothing refers to.
#define WEFT_GEMM_KERNEL(id) const Config* id();
#include "gemm_configs.inc"
#undef WEFT_GEMM_KERNEL

const std::vector<const Config*>& all_configs() {
  // In the table's order: the tuner's candidate order.
  static const std::vector<const Config*> configs = {
#define WEFT_GEMM_KERNEL(id) id(),
#include "gemm_configs.inc"
#undef WEFT_GEMM_KERNEL
  };
  return configs;
}

}  // namespace gemm_detail

namespace {

constexpr int kTunePasses = 4;     // round 1: passes over every candidate, one timed run each
constexpr std::size_t kFinalists = 4;  // round 2: the fastest few of round 1, and each configuration's fastest, ...
constexpr int kFinalRounds = 4;    // ... timed in passes ...
constexpr int kFinalRuns = 8;      // ... of this many runs each
static_assert(kTunePasses % 2 == 0 && kFinalRounds % 2 == 0,
              "as many backward passes as forward ones, so a linear clock drift cancels (weft/core/timing.hpp)");
using gemm_detail::kTallestTileRows;

const char* layout_name(BLayout l) { return l == BLayout::nk ? "[N,K]" : "[K,N]"; }

const char* hook_name(GemmHook h) {
  switch (h) {
    case GemmHook::none: return "";
    case GemmHook::wait_a_rows: return ", waiting on A rows";
    case GemmHook::wait_source_rows: return ", + source waiting on its rows";
    case GemmHook::report_rows: return ", reporting stored rows";
    case GemmHook::add_rows: return ", adding rows into a partial sum";
  }
  return "";
}

std::string describe(const GemmOptions& o) {
  return str(o.m, "x", o.n, "x", o.k, " ", to_string(o.input), " -> ", to_string(o.output), ", B ",
             layout_name(o.b_layout), hook_name(o.hook));
}

/// Splits "NAME" or "NAME, swizzle S along M|N" (as Gemm::config prints it)
/// into the name and the settings (0, 0 where absent). False if the settings
/// are malformed.
bool split_config(const std::string& text, std::string& name, int& swizzle, int& raster) {
  name = text;
  swizzle = raster = 0;
  const auto at = name.find(", swizzle ");
  if (at == std::string::npos) return true;
  const std::string settings = name.substr(at + 10);
  name.resize(at);
  char along = 0;
  if (std::sscanf(settings.c_str(), "%d along %c", &swizzle, &along) != 2 ||
      !(swizzle == 1 || swizzle == 2 || swizzle == 4 || swizzle == 8) || !(along == 'M' || along == 'N'))
    return false;
  raster = along == 'M' ? 1 : 2;
  return true;
}

bool hook_matches(const gemm_detail::Config& c, GemmHook h) {
  return c.hooked == (h != GemmHook::none) && c.with_source == (h == GemmHook::wait_source_rows) &&
         c.adds_rows == (h == GemmHook::add_rows) &&
         ((h != GemmHook::report_rows && h != GemmHook::add_rows) || c.reports);
}

/// True if configuration `c` computes what `o` asks: its types, B layout and
/// hook, and reports stored rows where the plan's runs may (HookLayout).
bool serves(const gemm_detail::Config& c, const GemmOptions& o) {
  return c.input == o.input && c.output == o.output && c.b_layout == o.b_layout && hook_matches(c, o.hook) &&
         (o.hook_layout.rows_per_report == 0 || c.reports);
}

bool waits(GemmHook h) {
  return h == GemmHook::wait_a_rows || h == GemmHook::wait_source_rows || h == GemmHook::add_rows;
}

}  // namespace

bool Gemm::has_configuration(const GemmOptions& o, const std::string& name) {
  for (const auto* c : gemm_detail::all_configs())
    if (c->name == name && serves(*c, o)) return true;
  return false;
}

bool Gemm::can_tile(const GemmOptions& o, std::string* why) {
  // weft's kernels load and store by TMA: 16-byte aligned rows.
  const std::int64_t out_align = 16 / static_cast<std::int64_t>(dtype_size(o.output));
  const bool k_ok = o.k % 8 == 0;
  const bool b_ok = o.b_layout != BLayout::kn || o.n % 8 == 0;
  const bool c_ok = o.n % out_align == 0;
  if (why && !k_ok)
    *why = str("K = ", o.k, " must be a multiple of 8 (rows of A", o.b_layout == BLayout::nk ? " and B" : "",
               " must be 16-byte aligned)");
  else if (why && !b_ok)
    *why = str("N = ", o.n, " must be a multiple of 8 for B stored [K,N] (16-byte aligned rows)");
  else if (why && !c_ok)
    *why = str("N = ", o.n, " must be a multiple of ", out_align, " for ", to_string(o.output),
               " output (16-byte aligned rows of C)");
  return k_ok && b_ok && c_ok;
}

Gemm::Gemm(const GemmOptions& options) : options_(options) {
  const GemmOptions& o = options_;
  WEFT_REQUIRE(o.m > 0 && o.n > 0 && o.k > 0, "Gemm: M, N, K must be positive, got ", o.m, " x ", o.n, " x ", o.k);
  WEFT_REQUIRE(o.m < (1ll << 31) && o.n < (1ll << 31) && o.k < (1ll << 31), "Gemm: dimensions must fit in 31 bits");
  WEFT_REQUIRE(o.input == DType::bf16 || o.input == DType::fp16, "Gemm: inputs must be bf16 or fp16, got ",
               to_string(o.input));
  WEFT_REQUIRE(o.output == o.input || o.output == DType::fp32, "Gemm: the output must be ", to_string(o.input),
               " (the input type) or fp32, got ", to_string(o.output));
  // cuBLAS takes any shape, so a plan that may run cuBLAS runs it alone where
  // weft's kernels cannot tile it.
  std::string untileable;
  cublas_only_ = !can_tile(o, &untileable);
  WEFT_REQUIRE(!cublas_only_ || (o.allow_cublas && o.hook == GemmHook::none && o.config.empty()), "Gemm: ",
               untileable, o.hook == GemmHook::none ? " (GemmOptions::allow_cublas runs such shapes on cuBLAS)" : "");
  WEFT_REQUIRE(!o.any_tile_order || o.hook == GemmHook::wait_a_rows || o.hook == GemmHook::wait_source_rows,
               "Gemm: GemmOptions::any_tile_order is for plans that wait (wait_a_rows, wait_source_rows) and report "
               "nothing; got a plan", *hook_name(o.hook) ? hook_name(o.hook) : " without a hook");
  if (const std::string why = gemm_detail::hook_layout_error(o); !why.empty()) WEFT_FAIL("Gemm ", describe(o), ": ", why);
  // "NAME" forces a configuration; "NAME, swizzle S along M|N" (what config()
  // prints) forces its tile-scheduler settings too.
  std::string name;
  int forced_swizzle = 0, forced_raster = 0;
  const bool settings_ok = split_config(o.config, name, forced_swizzle, forced_raster);
  if (forced_raster || !settings_ok) {
    WEFT_REQUIRE(settings_ok, "Gemm: config '", o.config,
                 "': expected 'NAME, swizzle S along M' or '... along N', S in 1, 2, 4, 8");
    WEFT_REQUIRE(o.hook == GemmHook::none || o.any_tile_order || forced_raster == 2, "Gemm: config '", o.config,
                 "': hooked plans keep the row-major tile order, so only '... along N' (or GemmOptions::any_tile_order)");
  }
  std::vector<const gemm_detail::Config*> pool = gemm_detail::all_configs();
  if (o.allow_cublas && o.hook == GemmHook::none)
    for (const auto* c : gemm_detail::cublas_configs()) pool.push_back(c);
  for (const auto* c : pool)
    if (serves(*c, o) && (name.empty() || name == c->name) && (!cublas_only_ || c->cublas)) candidates_.push_back(c);
  if (candidates_.empty()) {
    std::string have;
    for (const auto* c : gemm_detail::all_configs())
      have += str("\n  ", to_string(c->input), " -> ", to_string(c->output), ", B ", layout_name(c->b_layout),
                  c->hooked ? (c->with_source ? ", hooked, + source" : ", hooked") : "", ": ",
                  c->name);
    WEFT_FAIL("Gemm: no compiled configuration for ", describe(o),
              o.hook_layout.rows_per_report ? " that reports stored rows" : "",
              o.config.empty() ? std::string() : str(" named '", o.config, "'"), "; available:", have);
  }
  int device = 0;
  WEFT_CUDA(cudaGetDevice(&device));
  WEFT_CUDA(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device));
  WEFT_REQUIRE(o.max_sms >= 0, "Gemm: max_sms = ", o.max_sms, " must be >= 0 (0: every SM)");
  if (o.max_sms > 0) sm_count_ = std::min(sm_count_, o.max_sms);
  if (waits(o.hook)) {
    exits_ = DeviceBuffer(sizeof(std::uint64_t));
    WEFT_CUDA(cudaMemset(exits_.get(), 0, exits_.bytes()));
  }
  // Hooked kernels consume rows in the order they arrive: raster along N
  // (tile_hooks.cuh), whoever chooses the configuration, unless any order will do.
  if (o.hook != GemmHook::none && !o.any_tile_order) raster_ = 2;
  if (forced_raster) {
    chosen_ = candidates_.front();
    swizzle_ = forced_swizzle;
    raster_ = forced_raster;
    return;
  }
  // One candidate (a bare NAME, or one compiled configuration) still goes
  // through tune(): its scheduler settings are timed, and prepare() launches
  // it once, as CUDA's lazy loading needs before a plan enqueues waits on it.
  if (!o.autotune) {
    // Heuristic: a narrow tile when M alone cannot fill the GPU with wide ones.
    const gemm_detail::Config* best = candidates_.front();
    for (const auto* c : candidates_) {
      auto tiles = [&](const gemm_detail::Config* x) { return ((o.m + x->tile_m - 1) / x->tile_m) * ((o.n + x->tile_n - 1) / x->tile_n); };
      if (tiles(best) < sm_count_ && tiles(c) > tiles(best)) best = c;
    }
    chosen_ = best;
  }
}

Gemm::~Gemm() = default;

std::string Gemm::config() const {
  if (!chosen_) return "";
  if (chosen_->cublas) return chosen_->name;
  return str(chosen_->name, ", swizzle ", swizzle_, raster_ == 1 ? " along M" : raster_ == 2 ? " along N" : "");
}

void Gemm::reserve_workspace(std::size_t bytes) {
  if (bytes <= workspace_.bytes()) return;
  workspace_ = DeviceBuffer();  // cudaFree synchronises: nothing may still use the old one
  workspace_ = DeviceBuffer(bytes);
}

std::vector<std::string> Gemm::configurations() const {
  std::vector<std::string> names;
  for (const auto* c : candidates_) names.push_back(c->name);
  return names;
}

gemm_detail::Problem Gemm::problem(const GemmArgs& x, int swizzle, int raster) const {
  gemm_detail::Problem p{options_.m, options_.n, options_.k, x.a, x.b, x.c, nullptr, sm_count_, swizzle, raster};
  if (const auto* add = std::get_if<AddSource>(&x.epilogue)) {
    p.source = add->source;
    p.no_source_begin = add->plain_begin;
    p.no_source_end = add->plain_end;
  } else if (const auto* rows = std::get_if<ReduceAddRows>(&x.epilogue)) {
    p.add_into = rows->into;
    p.add_begin = rows->begin;
    p.add_end = rows->end;
  }
  if (options_.hook != GemmHook::none) {
    const HookLayout& layout = options_.hook_layout;
    gemm_detail::TileWaitParams& w = p.wait;
    const RowSignals& sig = x.wait;
    if (sig.world) w.world = *sig.world;
    w.flags = sig.flags;
    w.rows_per_flag = layout.rows_per_flag > 0 ? layout.rows_per_flag : 1;
    w.cols_per_flag = layout.cols_per_flag;
    w.value = sig.value;
    w.ready_begin = sig.ready_begin;
    w.ready_end = sig.ready_end;
    w.rotate_rows = x.first_row;
    w.descending_block_rows = layout.descending_block_rows;
    w.flags_per_rank = sig.flags_per_rank;
    w.from_rank = sig.from_rank;
    w.waited_ns = sig.waited_ns;
    w.exits = sig.flags && sig.consume ? exits_.as<std::uint64_t>() : nullptr;
    // The mainloop producer loads A; the epilogue producer loads the source.
    // Added rows wait before their A loads too: their adds come a mainloop
    // later, and that producer warp is the one a hooked kernel lets wait.
    w.wait_in = options_.hook == GemmHook::wait_a_rows || options_.hook == GemmHook::add_rows
                    ? gemm_detail::WaitIn::mainloop
                : options_.hook == GemmHook::wait_source_rows ? gemm_detail::WaitIn::epilogue
                                                               : gemm_detail::WaitIn::none;
    w.done = x.report.counters;
    w.rows_per_done = layout.rows_per_report > 0 ? layout.rows_per_report : 1;
  }
  return p;
}

const char* Gemm::launch_unhooked(const GemmArgs& args, const gemm_detail::Config& cfg, int swizzle, int raster,
                                  cudaStream_t stream) {
  GemmArgs local = args;
  local.wait.flags = nullptr;      // tuning and warm-up never wait: every row counts as present ...
  local.report.counters = nullptr;  // ... and report nothing
  if (auto* rows = std::get_if<ReduceAddRows>(&local.epilogue); rows && rows->into)
    // ... and write nothing outside C: the added rows add onto C's own rows
    rows->into = static_cast<char*>(local.c) +
                 rows->begin * options_.n * static_cast<std::int64_t>(dtype_size(options_.output));
  gemm_detail::Problem p = problem(local, swizzle, raster);
  if (const char* why = cfg.check(p); *why) return why;
  reserve_workspace(cfg.workspace(p));
  p.workspace = workspace_.get();
  return cfg.run(p, stream);
}

void Gemm::tune(const GemmArgs& args, cudaStream_t stream) {
  struct Candidate {
    const gemm_detail::Config* cfg;
    int swizzle, raster;
    float ms = 0;
  };
  // One launch of candidate `c`: "" or why it cannot run.
  auto launch = [&](const Candidate& c) { return launch_unhooked(args, *c.cfg, c.swizzle, c.raster, stream); };
  // Each candidate's ms: its median over `samples` passes of `runs` launches
  // back to back, passes alternating direction (weft/core/timing.hpp). Under
  // the power cap the clocks fall as the GPU heats (the H200s here spend most
  // busy time capped, 1250-1600 MHz): a candidate always timed early would look
  // faster than one timed late.
  auto time_candidates = [&](std::vector<Candidate>& cs, int samples, int runs) {
    const std::vector<float> ms =
        time_interleaved(cs.size(), [&](std::size_t i) { launch(cs[i]); }, samples, runs, stream);
    for (std::size_t i = 0; i < cs.size(); ++i) cs[i].ms = ms[i];
  };
  // Ranks that tune together (GemmOptions::agree) rank candidates by the slowest rank's time.
  auto agree = [&](std::vector<Candidate>& cs) {
    if (!options_.agree) return;
    std::vector<float> ms;
    for (const Candidate& c : cs) ms.push_back(c.ms);
    options_.agree(ms);
    WEFT_REQUIRE(ms.size() == cs.size(), "Gemm: GemmOptions::agree changed the number of timings");
    for (std::size_t i = 0; i < cs.size(); ++i) cs[i].ms = ms[i];
  };
  // The scheduler settings to try (the same kernel with other arguments, so
  // trying them costs only run time). Hooked kernels keep the row-major tile
  // order (raster along N), so rows are consumed in the order they arrive,
  // unless the plan said any order will do (GemmOptions::any_tile_order).
  const bool any_order = options_.hook == GemmHook::none || options_.any_tile_order;
  // A source that arrives by column band (HookLayout::cols_per_flag) is
  // consumed band by band: tiles walk along M.
  const HookLayout& layout = options_.hook_layout;
  const bool by_columns = layout.cols_per_flag > 0;
  const std::vector<int> rasters = by_columns  ? std::vector<int>{1}
                                   : any_order ? std::vector<int>{1, 2}
                                               : std::vector<int>{2};
  // A swizzle band (swizzle x cluster_m x tile_m rows) is walked across all
  // of N before the next, so hooked GEMMs keep bands no taller than the rows
  // that move together (swizzle 1 always fits):
  // - wait_a_rows: the rows already present (HookLayout::present_rows). A
  //   shard-major walk, column-major within each shard, was tried for it and
  //   never chosen.
  // - report_rows and wait_source_rows (rows sent on as they are stored): one
  //   chunk (HookLayout::rows_per_report, rows_per_flag), and a
  //   swizzle of 1 or 2, so each chunk is stored, and sent, while the GEMM
  //   goes on rather than with its last wave.
  const bool rows_leave_early =
      !any_order && (options_.hook == GemmHook::wait_source_rows || options_.hook == GemmHook::report_rows ||
                     options_.hook == GemmHook::add_rows);
  const std::vector<int> swizzles = rows_leave_early ? std::vector<int>{1, 2} : std::vector<int>{1, 2, 4, 8};
  std::int64_t band_rows = std::numeric_limits<std::int64_t>::max();
  if (options_.hook == GemmHook::wait_a_rows && layout.present_rows > 0 && !any_order) band_rows = layout.present_rows;
  if (rows_leave_early && layout.rows_per_report > 0) band_rows = std::min(band_rows, layout.rows_per_report);
  if (rows_leave_early && layout.rows_per_flag > 0) band_rows = std::min(band_rows, layout.rows_per_flag);
  // Walking blocks descending (HookLayout::descending_block_rows), a band must
  // also divide a block: one that held the end of a block and the start of
  // the next in the walk would mix tiles of two ring steps, and a CTA waiting
  // in the later step's tile could hold back a tile the earlier step needs.
  // Walking along M, a swizzle band is swizzle x cluster_n x tile_n columns,
  // no wider than a flag's column band.
  const std::int64_t block_rows = layout.descending_block_rows;
  auto band_fits = [&](const gemm_detail::Config* cfg, int swizzle) {
    if (by_columns)
      return swizzle == 1 ||
             static_cast<std::int64_t>(swizzle) * cfg->cluster_n * cfg->tile_n <= layout.cols_per_flag;
    const std::int64_t band = static_cast<std::int64_t>(swizzle) * cfg->cluster_m * cfg->tile_m;
    if (block_rows > 0 && block_rows % band != 0) return false;
    return swizzle == 1 || band <= band_rows;
  };
  // A choice made before for the same key (this process, or WEFT_TUNE_CACHE):
  // ranks that agree take it only where every one of them holds the same.
  std::string names;
  for (const auto* c : candidates_) names += str(c->name, ";");
  const std::string key =
      str(describe(options_), " | rasters ", rasters.size() == 2 ? "MN" : rasters.front() == 1 ? "M" : "N",
          " | swizzles ", swizzles.back(), " | band rows ", band_rows == std::numeric_limits<std::int64_t>::max() ? -1 : band_rows,
          " | column bands ", layout.cols_per_flag, " | reports ", layout.rows_per_report > 0 ? 1 : 0,
          block_rows > 0 ? str(" | descending blocks ", block_rows) : std::string(),
          " | agree ", options_.agree ? 1 : 0, " | ", gemm_detail::device_name(), ", ", sm_count_, " SMs | ", names);
  gemm_detail::TuneCache& cache = gemm_detail::TuneCache::process();
  auto take_cached = [&](const std::string& cached) {
    std::string name;
    int swizzle = 0, raster = 0;
    const gemm_detail::Config* cfg = nullptr;
    if (!cached.empty() && split_config(cached, name, swizzle, raster))
      for (const auto* c : candidates_)
        if (c->name == name) cfg = c;
    // cuBLAS's choices carry no scheduler settings, weft's carry ones this run allows.
    bool usable = cfg && (cfg->cublas ? raster == 0
                                      : std::find(rasters.begin(), rasters.end(), raster) != rasters.end() &&
                                            std::find(swizzles.begin(), swizzles.end(), swizzle) != swizzles.end() &&
                                            band_fits(cfg, swizzle));
    if (options_.agree) {  // all ranks hold it, and the same one: max(h) == -max(-h) only if every h is equal
      // 24 bits: a float holds them exactly, so equal maxima mean equal hashes.
      const float h = usable ? static_cast<float>(std::hash<std::string>{}(cached) & 0xffffff) : 0.0f;
      std::vector<float> v{usable ? 0.0f : 1.0f, h, -h};
      options_.agree(v);
      usable = v.size() == 3 && v[0] == 0.0f && v[1] == -v[2];
    }
    if (!usable) return false;
    chosen_ = cfg;
    swizzle_ = cfg->cublas ? swizzles.front() : swizzle;
    raster_ = cfg->cublas ? rasters.front() : raster;
    from_cache_ = true;
    // One launch now, as tuning would have made (it also reserves the
    // workspace, so no run allocates later, perhaps under graph capture).
    // The first launch of a kernel loads it (CUDA's lazy loading), and a load
    // waits for the GPU's work in flight. Tuning launches every candidate here,
    // before the caller enqueues anything that waits on this GEMM; first
    // launched later, behind a stream wait on this GEMM's own reports (a
    // GemmRs copy waiting on stored rows), the load and that wait wait on each
    // other: a hang at 2 ranks with every choice cached (docs/decisions/0017).
    if (const char* why = launch(Candidate{cfg, swizzle_, raster_}); *why)
      WEFT_FAIL("Gemm ", describe(options_), ": the cached configuration '", config(), "' failed to launch: ", why);
    WEFT_LOG(debug, "Gemm ", describe(options_), ": ", config(), " from the tuning cache");
    return true;
  };
  if (take_cached(cache.find(key).value_or(""))) return;
  // Round 1: every configuration with every setting (cuBLAS has none), timed briefly.
  std::vector<Candidate> all;
  for (const auto* cfg : candidates_)
    for (int swizzle : swizzles)
      for (int raster : rasters) {
        if (cfg->cublas && (swizzle != swizzles.front() || raster != rasters.front())) continue;
        if (!band_fits(cfg, swizzle)) continue;
        Candidate c{cfg, swizzle, raster};
        if (*launch(c)) continue;  // warm-up, and a check that it can run
        all.push_back(c);
      }
  WEFT_REQUIRE(!all.empty(), "Gemm: no configuration can run ", describe(options_));
  time_candidates(all, kTunePasses, 1);
  agree(all);
  for (const Candidate& c : all)
    WEFT_LOG(debug, "Gemm ", describe(options_), ": ", c.cfg->name, " swizzle ", c.swizzle, " raster ", c.raster, " ",
             c.ms, " ms");
  // Round 2: the few fastest again, longer, so that one noisy sample does not
  // pick the configuration; with them, every configuration's fastest setting.
  // Round 1's single runs are noisy, and with only its 4 fastest going on, a
  // setting 10 % slower was chosen in 2 of 4 tunings at 1024 x 8192 x 4096
  // (the 128x128 pingpong kernel at swizzle 2: 0.098-0.099 ms, where the
  // cooperative kernels and the same one at swizzle 8 ran 0.087-0.089); with
  // each kernel's fastest setting in round 2 too, in none of 6
  // (docs/decisions/0016).
  std::stable_sort(all.begin(), all.end(), [](const Candidate& x, const Candidate& y) { return x.ms < y.ms; });
  std::vector<Candidate> finalists;
  for (std::size_t i = 0; i < all.size(); ++i) {
    const bool config_new = std::none_of(finalists.begin(), finalists.end(),
                                         [&](const Candidate& f) { return f.cfg == all[i].cfg; });
    if (i < kFinalists || config_new) finalists.push_back(all[i]);
  }
  all = std::move(finalists);
  time_candidates(all, kFinalRounds, kFinalRuns);
  agree(all);
  std::vector<float> final_ms;
  for (const Candidate& c : all) {
    WEFT_LOG(debug, "Gemm ", describe(options_), ": finalist ", c.cfg->name, " swizzle ", c.swizzle, " raster ",
             c.raster, " ", c.ms, " ms");
    final_ms.push_back(c.ms);
  }
  const Candidate& best = all[fastest_candidate(final_ms)];
  chosen_ = best.cfg;
  swizzle_ = best.swizzle;
  raster_ = best.raster;
  WEFT_LOG(debug, "Gemm ", describe(options_), ": chose ", config(), " at ", best.ms, " ms");
  cache.store(key, config());
}

namespace gemm_detail {

std::string hook_layout_error(const GemmOptions& o) {
  const HookLayout& l = o.hook_layout;
  if (l.rows_per_flag < 0 || l.cols_per_flag < 0 || l.present_rows < 0 || l.rows_per_report < 0 ||
      l.descending_block_rows < 0)
    return "every HookLayout field must be >= 0 (0: not used)";
  if (o.hook == GemmHook::none && (l.rows_per_flag || l.cols_per_flag || l.present_rows || l.rows_per_report ||
                                   l.descending_block_rows))
    return "a plan without a hook (GemmHook::none) takes no HookLayout";
  if ((l.rows_per_flag || l.cols_per_flag) && !waits(o.hook))
    return str("flags (HookLayout::rows_per_flag, cols_per_flag) are for plans that wait (wait_a_rows, "
               "wait_source_rows, add_rows); got a plan", hook_name(o.hook));
  if (l.cols_per_flag && o.hook != GemmHook::wait_source_rows)
    return "flags by column band (HookLayout::cols_per_flag) are for wait_source_rows plans only";
  if (l.present_rows && o.hook != GemmHook::wait_a_rows)
    return "HookLayout::present_rows is for wait_a_rows plans only";
  if (l.descending_block_rows && o.m % l.descending_block_rows != 0)
    return str("a walk by descending blocks of ", l.descending_block_rows, " rows needs M = ", o.m,
               " a multiple of them");
  if (o.any_tile_order && (l.rows_per_report || l.descending_block_rows))
    return "GemmOptions::any_tile_order lets tiles walk in any order, so its runs can neither report stored rows "
           "(HookLayout::rows_per_report) nor walk blocks descending (HookLayout::descending_block_rows)";
  return "";
}

std::string run_args_error(const GemmOptions& o, bool cublas_only, const GemmArgs& x) {
  const HookLayout& layout = o.hook_layout;
  if (!x.a || !x.b || !x.c) return "A, B and C must be device pointers";
  // cuBLAS alone (an untileable shape) needs whole elements; TMA, 16 bytes.
  const std::uintptr_t align = cublas_only ? dtype_size(o.input) : 16;
  for (const void* ptr : {x.a, x.b, static_cast<const void*>(x.c)})
    if (reinterpret_cast<std::uintptr_t>(ptr) % align != 0)
      return str(ptr, " is not ", align, "-byte aligned", cublas_only ? "" : " (TMA needs 16-byte aligned matrices)");
  // A row range a tile picks its epilogue by (no source, added) holds whole
  // tiles whichever configuration runs: bounds on 256-row lines, or M.
  const std::int64_t m = o.m;
  auto bound = [&](std::int64_t row) { return row >= 0 && row <= m && (row % kTallestTileRows == 0 || row == m); };
  auto aligned16 = [](const void* ptr) { return ptr && (reinterpret_cast<std::uintptr_t>(ptr) & 15u) == 0; };
  const RowSignals& sig = x.wait;
  // The epilogue: the one the plan's hook computes.
  if (o.hook == GemmHook::wait_source_rows) {
    const auto* add = std::get_if<AddSource>(&x.epilogue);
    if (!add || !aligned16(add->source))
      return str("this plan adds a source matrix S [M, N] (GemmHook::wait_source_rows): expected the epilogue "
                 "AddSource with a 16-byte aligned device pointer, got ",
                 add ? str("source ", add->source) : std::string("another epilogue"));
    if (add->plain_begin != add->plain_end) {
      if (!(add->plain_begin < add->plain_end && bound(add->plain_begin) && bound(add->plain_end)))
        return str("rows without a source [", add->plain_begin, ", ", add->plain_end,
                   ") must be whole row tiles: bounds in [0, M = ", m, "], multiples of ", kTallestTileRows, " or M");
      if (sig.flags && !(sig.ready_begin <= add->plain_begin && add->plain_end <= sig.ready_end))
        return str("rows without a source [", add->plain_begin, ", ", add->plain_end,
                   ") read no source, so nothing may wait for theirs: mark them ready (RowSignals::ready_begin, "
                   "ready_end = [", sig.ready_begin, ", ", sig.ready_end, "))");
    }
  } else if (o.hook == GemmHook::add_rows) {
    const auto* rows = std::get_if<ReduceAddRows>(&x.epilogue);
    if (!rows) return "this plan adds rows into a partial sum (GemmHook::add_rows): expected the epilogue ReduceAddRows";
    if (!(rows->begin <= rows->end && bound(rows->begin) && bound(rows->end)))
      return str("the added rows [", rows->begin, ", ", rows->end, ") must be whole row tiles: bounds in [0, M = ", m,
                 "], multiples of ", kTallestTileRows, " or M");
    if (rows->begin != rows->end && !aligned16(rows->into))
      return str("the added rows need ReduceAddRows::into, a 16-byte aligned device pointer; got ", rows->into);
    // Rows that wait wait for the partial sum they add onto.
    const bool before_ok = sig.ready_begin <= 0 || (rows->begin <= 0 && sig.ready_begin <= rows->end);
    const bool after_ok = sig.ready_end >= m || (rows->begin <= sig.ready_end && m <= rows->end);
    if (sig.flags && !(before_ok && after_ok))
      return str("rows outside the ready rows [", sig.ready_begin, ", ", sig.ready_end,
                 ") wait for a partial sum, so they must be among the added rows [", rows->begin, ", ", rows->end, ")");
  } else if (!std::holds_alternative<StoreProduct>(x.epilogue)) {
    return str("this plan (", *hook_name(o.hook) ? hook_name(o.hook) + 2 : "no hook",
               ") stores A x B: expected the epilogue StoreProduct; AddSource needs GemmHook::wait_source_rows, "
               "ReduceAddRows GemmHook::add_rows");
  }
  // The mainloop wait.
  if (sig.consume && !sig.flags) return "RowSignals::consume asks the GEMM to reset its flags, but no flags were given";
  if (sig.flags) {
    if (!waits(o.hook)) return "row signals were given to a plan whose hook waits for nothing";
    if (!sig.world) return "row signals need the World (for the wait's bound and report)";
    if (layout.rows_per_flag <= 0 && layout.cols_per_flag <= 0)
      return "row signals were given to a plan built without HookLayout::rows_per_flag (or cols_per_flag): "
             "how many rows one flag covers is the plan's";
  }
  // The report.
  if (x.report.counters && layout.rows_per_report <= 0)
    return "stored-row counters (GemmArgs::report) were given to a plan built without HookLayout::rows_per_report";
  // The tile walk.
  if (x.first_row != 0 && (o.hook == GemmHook::none || o.any_tile_order))
    return str("GemmArgs::first_row = ", x.first_row, " rotates the tile order, which only a hooked plan without "
               "GemmOptions::any_tile_order keeps");
  if (x.first_row < 0 || x.first_row >= m) return str("GemmArgs::first_row = ", x.first_row, " must be in [0, M = ", m, ")");
  if (layout.descending_block_rows > 0 && x.first_row % layout.descending_block_rows != 0)
    return str("a walk by descending blocks of ", layout.descending_block_rows,
               " rows starts at a block's first row; GemmArgs::first_row = ", x.first_row);
  return "";
}

}  // namespace gemm_detail

std::string Gemm::can_implement(const GemmArgs& x) const {
  return gemm_detail::run_args_error(options_, cublas_only_, x);
}

namespace {
/// A run's operands but for their addresses: the values validation reads,
/// which pointers are given, and their alignment. Runs alike in these are
/// validated once.
gemm_detail::ArgsShape args_shape(const GemmArgs& x) {
  auto ptr = [](const void* p) { return p ? 1 + static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(p) & 15u) : 0; };
  gemm_detail::ArgsShape v{ptr(x.a), ptr(x.b), ptr(x.c), ptr(x.wait.flags), ptr(x.wait.world),
                    x.wait.ready_begin, x.wait.ready_end, x.wait.consume, ptr(x.report.counters),
                    x.first_row, static_cast<std::int64_t>(x.epilogue.index())};
  if (const auto* add = std::get_if<AddSource>(&x.epilogue)) {
    v[11] = ptr(add->source), v[12] = add->plain_begin, v[13] = add->plain_end;
  } else if (const auto* rows = std::get_if<ReduceAddRows>(&x.epilogue)) {
    v[11] = ptr(rows->into), v[12] = rows->begin, v[13] = rows->end;
  }
  return v;
}
}  // namespace

void Gemm::prepare(const GemmArgs& args, cudaStream_t stream) {
  if (launched_) return;
  if (const std::string why = can_implement(args); !why.empty()) WEFT_FAIL("Gemm ", describe(options_), ": ", why);
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  WEFT_CUDA(cudaStreamIsCapturing(stream, &capturing));
  if (capturing != cudaStreamCaptureStatusNone) {  // nothing can be timed or warmed inside a capture
    if (!chosen_) chosen_ = candidates_.front();
    return;
  }
  if (!chosen_) {
    tune(args, stream);  // launches every candidate it times, or the cached choice
  } else {
    // Chosen before any launch (forced by full name, or the size heuristic):
    // launched once now all the same, for CUDA's lazy loading (see
    // take_cached in tune()), before the caller enqueues waits on this GEMM.
    if (const char* why = launch_unhooked(args, *chosen_, swizzle_, raster_, stream); *why)
      WEFT_FAIL("Gemm ", describe(options_), ": the configuration '", config(), "' cannot run: ", why);
  }
  launched_ = true;
}

void Gemm::validate_run(const GemmArgs& x) {
  const gemm_detail::ArgsShape shape = args_shape(x);
  if (shape_validated_ && shape == validated_shape_) return;
  shape_validated_ = false;  // until this run's checks pass
  if (const std::string why = can_implement(x); !why.empty()) WEFT_FAIL("Gemm::run ", describe(options_), ": ", why);
  gemm_detail::Problem p = problem(x, swizzle_, raster_);
  // The epilogue decides by a tile's first row: a range of whole 256-row
  // bands holds whole tiles only where the tile height divides 256.
  const bool ranges = p.no_source_begin != p.no_source_end || p.add_begin != p.add_end;
  WEFT_REQUIRE(!ranges || kTallestTileRows % chosen_->tile_m == 0, "Gemm::run: rows without a source, or added rows, "
               "need tiles whose height divides ", kTallestTileRows, "; '", chosen_->name, "' has ", chosen_->tile_m);
  const char* why = chosen_->check(p);
  WEFT_REQUIRE(!*why, "Gemm ", describe(options_), " with ", chosen_->name, ": ", why);
  reserve_workspace(chosen_->workspace(p));
  validated_shape_ = shape;
  shape_validated_ = true;
}

void Gemm::run(const void* a, const void* b, void* c, cudaStream_t stream) {
  GemmArgs args;
  args.a = a;
  args.b = b;
  args.c = c;
  run(args, stream);
}

void Gemm::run(const GemmArgs& x, cudaStream_t stream) {
  prepare(x, stream);  // the first run: validates, and chooses the configuration
  validate_run(x);
  gemm_detail::Problem p = problem(x, swizzle_, raster_);
  p.workspace = workspace_.get();
  const char* err = chosen_->run(p, stream);
  WEFT_REQUIRE(!*err, "Gemm ", describe(options_), " with ", chosen_->name, " failed to launch: ", err);
}

}  // namespace weft
