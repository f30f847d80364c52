#include "weft/gemm/grouped_gemm.hpp"

#include <algorithm>
#include <climits>
#include <iterator>
#include <limits>

#include "grouped_config.hpp"
#include "tune_cache.hpp"
#include "weft/core/error.hpp"
#include "weft/core/log.hpp"
#include "weft/core/timing.hpp"
#include "weft/gemm/gemm.hpp"

namespace weft {
namespace gemm_detail {

// One function per compiled grouped kernel, each in a unit generated from the
// grouped rows of src/gemm/kernel_table.cmake (cmake/WeftGemmKernels.cmake).
#define WEFT_GROUPED_GEMM_KERNEL(id) const GroupedConfig* id();
#include "grouped_gemm_configs.inc"
#undef WEFT_GROUPED_GEMM_KERNEL

const std::vector<const GroupedConfig*>& all_grouped_configs() {
  static const std::vector<const GroupedConfig*> configs = {
#define WEFT_GROUPED_GEMM_KERNEL(id) id(),
#include "grouped_gemm_configs.inc"
#undef WEFT_GROUPED_GEMM_KERNEL
  };
  return configs;
}

namespace {

// The most experts a plan takes: the prologue's one block spreads them over
// its threads, and a router with more would be unusual.
constexpr int kMaxExperts = 1 << 16;

// The tuner's passes over the candidates (even: a linear clock drift cancels,
// weft/core/timing.hpp) and runs per sample: the dense tuner's final round.
// The compiled grouped tiles are few (2 per type and layout in the full
// table), so every one is timed that long, in one round.
constexpr int kTunePasses = 4;
constexpr int kTuneRuns = 8;

// A 128x128 tile's work per SM-second relative to a 128x256 tile's: the
// narrow tile loads 1.5x the operand bytes per flop (A once per 128 columns
// instead of 256). A prior, to be replaced by measurement (decision 0056).
double tile_throughput(const GroupedTile& t) { return t.tile_n >= 256 ? 1.0 : 0.85; }

std::int64_t ceil_div(std::int64_t x, std::int64_t y) { return (x + y - 1) / y; }

const char* layout_name(BLayout l) { return l == BLayout::nk ? "[E, N, K]" : "[E, K, N]"; }

}  // namespace

std::int64_t grouped_tiles(const GroupedTile& t, std::int64_t n, std::int64_t rows, int experts) {
  const std::int64_t per_expert = ceil_div(std::max<std::int64_t>(rows, 0), experts);
  const std::int64_t row_tiles = ceil_div(ceil_div(per_expert, t.tile_m), t.cluster_m) * t.cluster_m;
  const std::int64_t col_tiles = ceil_div(ceil_div(n, t.tile_n), t.cluster_n) * t.cluster_n;
  return experts * row_tiles * col_tiles;
}

std::size_t choose_grouped_tile(const std::vector<GroupedTile>& tiles, std::int64_t n, std::int64_t rows, int experts,
                                int sm_count) {
  std::size_t best = 0;
  double best_cost = std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < tiles.size(); ++i) {
    const GroupedTile& t = tiles[i];
    const double waves = static_cast<double>(ceil_div(std::max<std::int64_t>(grouped_tiles(t, n, rows, experts), 1),
                                                      std::max(sm_count, 1)));
    const double cost = waves * t.tile_m * t.tile_n / tile_throughput(t);
    if (cost < best_cost) {
      best_cost = cost;
      best = i;
    }
  }
  return best;
}

std::string grouped_options_error(const GroupedGemmOptions& o) {
  if (o.experts < 1 || o.experts > kMaxExperts)
    return str("experts = ", o.experts, ": expected 1 to ", kMaxExperts);
  if (o.n <= 0 || o.k <= 0) return str("N and K must be positive, got N = ", o.n, ", K = ", o.k);
  if (o.n > INT_MAX || o.k > INT_MAX) return str("N = ", o.n, " and K = ", o.k, " must fit in 31 bits");
  if (o.dtype != DType::bf16 && o.dtype != DType::fp16)
    return str("dtype must be bf16 or fp16, got ", to_string(o.dtype));
  // The dense engine's tiling rule (TMA's 16-byte rows of A, W and out), for one expert's GEMM.
  if (std::string why; !Gemm::can_tile(gemm_options(1, o.n, o.k, o.dtype, o.w_layout), &why)) return why;
  if (o.max_rows < 1 || o.max_rows > INT_MAX)
    return str("max_rows = ", o.max_rows, ": expected 1 to ", INT_MAX, " (the row capacity of A and out)");
  if (o.expected_rows < 0 || o.expected_rows > o.max_rows)
    return str("expected_rows = ", o.expected_rows, ": expected 0 (max_rows) to max_rows = ", o.max_rows);
  if (o.max_sms < 0) return str("max_sms = ", o.max_sms, " must be >= 0 (0: every SM)");
  return "";
}

std::string grouped_args_error(const GroupedGemmOptions& o, const GroupedGemmArgs& x) {
  struct Operand {
    const char* name;
    const void* ptr;
    std::uintptr_t align;
    bool optional;  // null allowed
  };
  const Operand operands[] = {
      {"A", x.a, 16, false},
      {"W", x.w, 16, false},
      {"out", x.out, 16, false},
      {"expert_rows", x.expert_rows, 4, false},
      {"expert_first_row", x.expert_first_row, 4, true},  // null: packed rows
  };
  // An operand's name and shape, written only for a message: a run that passes allocates nothing.
  auto named = [&](int i) {
    switch (i) {
      case 0: return str("A [rows <= ", o.max_rows, ", K = ", o.k, "]");
      case 1:
        return o.w_layout == BLayout::nk ? str("W [E = ", o.experts, ", N = ", o.n, ", K = ", o.k, "]")
                                         : str("W [E = ", o.experts, ", K = ", o.k, ", N = ", o.n, "]");
      case 2: return str("out [rows <= ", o.max_rows, ", N = ", o.n, "]");
      case 3: return str("expert_rows int32 [E = ", o.experts, "]");
      default: return str("expert_first_row int32 [E = ", o.experts, "] (optional)");
    }
  };
  for (int i = 0; i < static_cast<int>(std::size(operands)); ++i) {
    const Operand& op = operands[i];
    if (!op.ptr && op.optional) continue;
    if (!op.ptr) return str(named(i), " must be a device pointer, got null");
    if (reinterpret_cast<std::uintptr_t>(op.ptr) % op.align != 0)
      return str(named(i), " at ", op.ptr, " is not ", op.align, "-byte aligned",
                 op.align == 16 ? " (TMA needs 16-byte aligned matrices)" : "");
  }
  const GroupedRowsDone& r = x.report;
  if (r.counters) {
    if (reinterpret_cast<std::uintptr_t>(r.counters) % 8 != 0)
      return str("report.counters at ", static_cast<const void*>(r.counters), " is not 8-byte aligned (uint64 counters)");
    if (r.rows_per_report < 1)
      return str("report.rows_per_report = ", r.rows_per_report, ": expected >= 1 (the rows of out one counter covers; ",
                 "the counters then number ceil(max_rows = ", o.max_rows, " / rows_per_report))");
  } else if (r.rows_per_report != 0) {
    return str("report.rows_per_report = ", r.rows_per_report,
               " is given without report.counters: expected both (a report) or neither");
  }
  const GroupedRowWait& w = x.wait;
  if (!w.flags) {
    if (w.row_flag) return "wait.row_flag is given without wait.flags: expected both (a wait) or neither";
    return "";
  }
  if (reinterpret_cast<std::uintptr_t>(w.flags) % 8 != 0)
    return str("wait.flags at ", static_cast<const void*>(w.flags), " is not 8-byte aligned (uint64 flags)");
  if (w.flag_count < 1) return str("wait.flag_count = ", w.flag_count, ": expected the flags' length, >= 1");
  if (!w.row_flag) return str("wait.row_flag must be a device pointer to int32 [max_rows = ", o.max_rows, "], got null");
  if (reinterpret_cast<std::uintptr_t>(w.row_flag) % 4 != 0)
    return str("wait.row_flag at ", static_cast<const void*>(w.row_flag), " is not 4-byte aligned (int32)");
  if (!w.world) return "wait.world must be given: the wait's timeout names the rank and the flag";
  if (w.flags_per_rank < 1)
    return str("wait.flags_per_rank = ", w.flags_per_rank, ": expected >= 1 (flag f is raised by rank f / flags_per_rank)");
  return "";
}

std::string grouped_fault_message(const GroupedGemmOptions& o, const GroupedFaultRecord& record) {
  std::string why;
  if (record.bits & kNegativeCount) why += "an expert's row count was negative (taken as 0)";
  if (record.bits & kOverCapacity)
    why += str(why.empty() ? "" : "; ", "the row counts summed to ", record.first_total, ", past max_rows = ",
               o.max_rows, " (the rows past it were not computed)");
  if (record.bits & kBadFirstRow) {
    const long long expert = static_cast<long long>(o.experts) - record.bad_range_mark;
    why += str(why.empty() ? "" : "; ", "expert ", expert,
               "'s rows [first, first + count) were out of order, overlapped the previous expert's or passed "
               "max_rows = ", o.max_rows, " (that expert was computed as empty)");
  }
  if (record.bits & kBadRowFlag)
    why += str(why.empty() ? "" : "; ", "row ", static_cast<long long>(record.bad_flag_row) - 1,
               "'s wait.row_flag was outside [0, flag_count) (that row waited for nothing)");
  if (why.empty()) return "";
  std::string expected;
  if (record.bits & (kNegativeCount | kOverCapacity | kBadFirstRow))
    expected = str("E = ", o.experts, " counts >= 0 summing to at most max_rows",
                   (record.bits & kBadFirstRow) ? ", and first rows >= 0, ascending, each range ending before the "
                                                  "next begins and at most at max_rows"
                                                : "");
  if (record.bits & kBadRowFlag)
    expected += str(expected.empty() ? "" : "; and ", "every row a tile reads naming one of the run's flags");
  return str("GroupedGemm: ", why, "; expected ", expected);
}

}  // namespace gemm_detail

namespace {
std::string describe(const GroupedGemmOptions& o) {
  return str(o.experts, " experts x ", o.n, "x", o.k, " ", to_string(o.dtype), ", W ", gemm_detail::layout_name(o.w_layout));
}
}  // namespace

GroupedGemm::GroupedGemm(const GroupedGemmOptions& options) : options_(options) {
  const GroupedGemmOptions& o = options_;
  // Every check before any CUDA call: a bad plan is refused the same way with or without a GPU.
  const std::string why = gemm_detail::grouped_options_error(o);
  WEFT_REQUIRE(why.empty(), "GroupedGemm: ", why);
  for (const auto* c : gemm_detail::all_grouped_configs())
    if (c->dtype == o.dtype && c->w_layout == o.w_layout && (o.config.empty() || o.config == c->name))
      candidates_.push_back(c);
  if (candidates_.empty()) {
    std::string have;
    for (const auto* c : gemm_detail::all_grouped_configs())
      have += str("\n  ", to_string(c->dtype), ", W ", gemm_detail::layout_name(c->w_layout), ": ", c->name);
    WEFT_FAIL("GroupedGemm: no compiled configuration for ", describe(o),
              o.config.empty() ? std::string() : str(" named '", o.config, "'"), "; available:",
              have.empty() ? std::string(" none (this build compiled no grouped kernels)") : have);
  }
  int device = 0;
  WEFT_CUDA(cudaGetDevice(&device));
  WEFT_CUDA(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device));
  if (o.max_sms > 0) sm_count_ = std::min(sm_count_, o.max_sms);
  std::vector<gemm_detail::GroupedTile> tiles;
  for (const auto* c : candidates_) tiles.push_back({c->tile_m, c->tile_n, c->cluster_m, c->cluster_n});
  const std::int64_t rows = o.expected_rows ? o.expected_rows : o.max_rows;
  chosen_ = candidates_[gemm_detail::choose_grouped_tile(tiles, o.n, rows, o.experts, sm_count_)];
  if (!o.config.empty()) chosen_by_ = ChosenBy::forced;
  // Room for any candidate's workspace: the tuner runs each in this one.
  for (const auto* c : candidates_) workspace_bytes_ = std::max(workspace_bytes_, c->workspace(o.experts, sm_count_));
  workspace_ = DeviceBuffer(workspace_bytes_);
  faults_ = DeviceBuffer(sizeof(gemm_detail::GroupedFaultRecord));
  WEFT_CUDA(cudaMemset(faults_.get(), 0, faults_.bytes()));
}

GroupedGemm::~GroupedGemm() = default;

std::string GroupedGemm::config() const { return chosen_->name; }

std::vector<std::string> GroupedGemm::configurations() const {
  std::vector<std::string> names;
  for (const auto* c : candidates_) names.push_back(c->name);
  return names;
}

const char* GroupedGemm::launch(const gemm_detail::GroupedConfig& cfg, const GroupedGemmArgs& args,
                                cudaStream_t stream) {
  gemm_detail::GroupedProblem p{options_.experts,
                                options_.n,
                                options_.k,
                                options_.max_rows,
                                args.a,
                                args.w,
                                args.out,
                                args.expert_rows,
                                args.expert_first_row,
                                workspace_.get(),
                                faults_.as<gemm_detail::GroupedFaultRecord>(),
                                sm_count_,
                                {},
                                args.report};
  if (const GroupedRowWait& w = args.wait; w.flags)
    p.wait = {*w.world, w.flags, w.row_flag, w.value, w.flag_count, w.flags_per_rank};
  return cfg.run(p, stream);
}

void GroupedGemm::prepare(const GroupedGemmArgs& args, cudaStream_t stream) {
  if (prepared_) return;
  const std::string why = gemm_detail::grouped_args_error(options_, args);
  WEFT_REQUIRE(why.empty(), "GroupedGemm::prepare: ", why);
  choose(args, stream);
}

bool GroupedGemm::choose(const GroupedGemmArgs& args, cudaStream_t stream) {
  prepared_ = true;
  if (!options_.autotune || candidates_.size() == 1) return false;  // the heuristic's (or the forced) choice
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  WEFT_CUDA(cudaStreamIsCapturing(stream, &capturing));
  if (capturing != cudaStreamCaptureStatusNone) {
    WEFT_LOG(debug, "GroupedGemm ", describe(options_), ": first run under graph capture, ", chosen_->name,
             " by the size heuristic (nothing can be timed inside a capture)");
    return false;
  }
  const GroupedGemmOptions& o = options_;
  std::string names;
  for (const auto* cfg : candidates_) names += str(cfg->name, ";");
  const std::string key = str("grouped ", describe(o), " | rows ", o.expected_rows ? o.expected_rows : o.max_rows,
                              " | ", gemm_detail::device_name(), ", ", sm_count_, " SMs | ", names);
  gemm_detail::TuneCache& cache = gemm_detail::TuneCache::process();
  if (const auto cached = cache.find(key)) {
    for (const auto* cfg : candidates_)
      if (cfg->name == *cached) {
        chosen_ = cfg;
        chosen_by_ = ChosenBy::tuning_cache;
        if (const char* err = launch(*cfg, args, stream); *err)
          WEFT_FAIL("GroupedGemm ", describe(o), ": the cached configuration '", cfg->name, "' failed to launch: ", err);
        WEFT_LOG(debug, "GroupedGemm ", describe(o), ": ", cfg->name, " from the tuning cache");
        return true;
      }
  }
  if (args.wait.flags || args.report.counters) {  // timing runs would wait on flags raised once per run, or report again
    WEFT_LOG(debug, "GroupedGemm ", describe(o), ": first run ", args.wait.flags ? "waits on flags" : "reports its rows",
             ", ", chosen_->name, " by the size heuristic (a run that waits or reports is never timed)");
    return false;
  }
  // Every candidate once (a warm-up, and the check that it launches), then timed.
  std::vector<const gemm_detail::GroupedConfig*> runnable;
  for (const auto* cfg : candidates_)
    if (const char* err = launch(*cfg, args, stream); !*err) runnable.push_back(cfg);
    else WEFT_LOG(debug, "GroupedGemm ", describe(o), ": ", cfg->name, " cannot run: ", err);
  WEFT_REQUIRE(!runnable.empty(), "GroupedGemm ", describe(o), ": no compiled configuration launches");
  const std::vector<float> ms = time_interleaved(
      runnable.size(), [&](std::size_t i) { launch(*runnable[i], args, stream); }, gemm_detail::kTunePasses,
      gemm_detail::kTuneRuns, stream);
  for (std::size_t i = 0; i < runnable.size(); ++i)
    WEFT_LOG(debug, "GroupedGemm ", describe(o), ": ", runnable[i]->name, " ", ms[i], " ms");
  chosen_ = runnable[fastest_candidate(ms)];
  chosen_by_ = ChosenBy::timing;
  cache.store(key, chosen_->name);
  // The last timed run may have been another candidate's: out holds the chosen one's result.
  if (const char* err = launch(*chosen_, args, stream); *err)
    WEFT_FAIL("GroupedGemm ", describe(o), " with ", chosen_->name, " failed to launch: ", err);
  return true;
}

const char* GroupedGemm::chosen_by() const {
  switch (chosen_by_) {
    case ChosenBy::forced: return "forced";
    case ChosenBy::timing: return "timing";
    case ChosenBy::tuning_cache: return "tuning cache";
    case ChosenBy::heuristic: break;
  }
  return "heuristic";
}

void GroupedGemm::run(const GroupedGemmArgs& args, cudaStream_t stream) {
  const std::string why = gemm_detail::grouped_args_error(options_, args);
  WEFT_REQUIRE(why.empty(), "GroupedGemm::run: ", why);
  if (!prepared_ && choose(args, stream)) return;  // the tuner's last launch was this run's
  const char* err = launch(*chosen_, args, stream);
  WEFT_REQUIRE(!*err, "GroupedGemm ", describe(options_), " with ", chosen_->name, " failed to launch: ", err);
}

void GroupedGemm::check_counts(cudaStream_t stream) {
  gemm_detail::GroupedFaultRecord record{};
  WEFT_CUDA(cudaMemcpyAsync(&record, faults_.get(), sizeof(record), cudaMemcpyDeviceToHost, stream));
  WEFT_CUDA(cudaStreamSynchronize(stream));
  if (record.bits == 0) return;
  WEFT_CUDA(cudaMemsetAsync(faults_.get(), 0, sizeof(record), stream));
  WEFT_CUDA(cudaStreamSynchronize(stream));
  WEFT_FAIL(gemm_detail::grouped_fault_message(options_, record));
}

}  // namespace weft
