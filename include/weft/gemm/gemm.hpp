// weft/gemm/gemm.hpp - the Hopper GEMM engine: C = A x B^T (or A x B) on one GPU, as a reusable plan.
//
// A is row-major [M, K]. B is [N, K] ("weights as PyTorch Linear stores them",
// BLayout::nk) or [K, N] (BLayout::kn). C is row-major [M, N]. Inputs bf16 or
// fp16, accumulation fp32, output bf16/fp16 (the input type) or fp32. Any M, N,
// K whose rows are 16-byte aligned (K and, for kn, N multiples of 8 elements).
//
// The kernels are CUTLASS 3 (CuTe) persistent, warp-specialised sm_90a GEMMs:
// TMA loads into a multi-stage shared-memory pipeline on mbarriers, wgmma from
// warpgroups, TMA-store epilogue. A plan holds several tile configurations of
// its type/layout and picks one per shape, with the tile scheduler's swizzle
// and raster order: by timing them on the first run (outside graph capture),
// or by a size heuristic.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "weft/core/cuda_resources.hpp"
#include "weft/core/dtype.hpp"
#include "weft/device/world.cuh"
#include "weft/gemm/gemm_types.hpp"

namespace weft {

/// What a hooked run's tiles wait for: flags that say which rows of A
/// (wait_a_rows, add_rows) or of the source (wait_source_rows) have arrived.
/// The tile holding row r waits, in one warp, until flags[r / rows_per_flag]
/// >= value (acquire, system scope), then fences the async proxy and loads;
/// with flags by column band (HookLayout::cols_per_flag) the tile holding
/// column c waits for flags[c / cols_per_flag]. How many rows or columns a
/// flag covers is the plan's (GemmOptions::hook_layout); the flags, and the
/// rows already present, are the run's. No flags: every row is present.
struct RowSignals {
  const dev::World* world = nullptr;     ///< names the rank and bounds the wait (its timeout)
  const std::uint64_t* flags = nullptr;  ///< device memory written by copy engines or peers
  std::uint64_t value = 1;
  std::int64_t ready_begin = 0, ready_end = 0;  ///< rows known present: their tiles do not wait
  int flags_per_rank = 0;  ///< > 0: flag i is raised by rank i / flags_per_rank (for the timeout report)
  int from_rank = -1;      ///< else the rank that raises them all
  /// Optional diagnostics (device memory, zeroed by the caller, one counter
  /// per flag, indexed as `flags`): every tile adds to waited_ns[f] the
  /// nanoseconds its waiting warp spent on flag f, so the counters say how
  /// long tiles stalled on each chunk.
  unsigned long long* waited_ns = nullptr;
  /// Consume the flags: once every CTA of the run has passed its last wait,
  /// the last of them waits for each flag it may wait on (outside the ready
  /// rows; already raised, so this costs reads) and sets every one back to 0,
  /// so the next run needs no reset (a memset ahead of the GEMM costs about
  /// 1.5 us on the GPU's timeline). Every flag outside the ready rows must
  /// therefore be raised once per run, and nobody may raise one for the next
  /// run before this one ends. Run a plan with consuming signals on one
  /// stream at a time (its CTAs count themselves out in the plan's own word).
  bool consume = false;
};

/// Where a hooked run reports the rows of C it has stored. Once the TMA
/// stores of a tile are complete, the tile adds (its rows in band b) x (its
/// columns) to counters[b] (band b = rows [b * HookLayout::rows_per_report,
/// (b + 1) * rows_per_report)), with release semantics at system scope. Band b
/// is therefore complete when counters[b] reaches (its rows) x N: a copy
/// engine can wait for that (cuStreamWaitValue64) and send the band while the
/// GEMM goes on. Zero the counters before the run. No counters: no report.
struct RowsDone {
  std::uint64_t* counters = nullptr;  ///< device memory, one per band

  /// A band's counter once every tile of an [M, n] product has stored its
  /// `band_rows` rows (rows_per_report, or fewer for a last, short band).
  static constexpr std::uint64_t complete_value(std::int64_t band_rows, std::int64_t n) {
    return static_cast<std::uint64_t>(band_rows * n);
  }
};

/// The epilogue of a run, one of three; which one follows from the plan's
/// hook (Gemm::can_implement says so where a run's does not match).
/// C = A x B: every plan but the two below.
struct StoreProduct {};

/// GemmHook::wait_source_rows: C = A x B + S, S [M, N] of the output type
/// (16-byte aligned). Rows [plain_begin, plain_end) add no source (C = A x B
/// there): their tiles neither load S nor add it. Both bounds are multiples
/// of 256 (the tallest tile) or M; rows that wait must not be among them (mark
/// them ready: RowSignals::ready_begin, ready_end).
struct AddSource {
  const void* source = nullptr;
  std::int64_t plain_begin = 0, plain_end = 0;
};

/// GemmHook::add_rows: rows [begin, end) of A x B are added by TMA reduce-add
/// into `into` (row `begin` of the product onto its row 0, with C's row
/// stride; 16-byte aligned), whose rows already hold a partial sum; the other
/// rows are stored into C. Both bounds multiples of 256 (the tallest tile) or
/// M. Rows that wait (outside the ready rows) must be among the added ones:
/// the partial sum they wait for is what they add onto.
struct ReduceAddRows {
  void* into = nullptr;
  std::int64_t begin = 0, end = 0;
};

using GemmEpilogue = std::variant<StoreProduct, AddSource, ReduceAddRows>;

/// One run's operands: A, B and C, and for hooked plans the mainloop wait,
/// the epilogue and the report. Gemm::prepare validates them against the plan
/// (Gemm::can_implement); a run is validated again only where its hook
/// operands differ from the last validated run's in more than their pointers.
struct GemmArgs {
  const void* a = nullptr;  ///< [M, K] row-major
  const void* b = nullptr;  ///< [N, K] or [K, N]
  void* c = nullptr;        ///< [M, N] row-major, the output
  RowSignals wait{};        ///< hooked plans that wait (wait_a_rows, wait_source_rows, add_rows)
  GemmEpilogue epilogue{};  ///< StoreProduct, or the plan's hook's (AddSource, ReduceAddRows)
  RowsDone report{};        ///< hooked plans with HookLayout::rows_per_report
  /// Hooked plans: tiles start at the row tile holding this row, then wrap;
  /// walking blocks (HookLayout::descending_block_rows), a block's first row.
  std::int64_t first_row = 0;
};

/// What every run of a hooked plan looks like, fixed when the plan is built:
/// the tuner keeps to the configurations and tile-scheduler settings that fit
/// it, the tuning cache keys on it, and each run's operands are checked
/// against it.
struct HookLayout {
  /// Rows one flag covers (RowSignals); runs that wait need it > 0 (or
  /// cols_per_flag). A swizzle band is kept no taller, so rows are consumed
  /// in the order they arrive.
  std::int64_t rows_per_flag = 0;
  /// > 0, wait_source_rows only: the flags cover column bands of this many
  /// columns of every row instead, and tiles walk along M (a source that
  /// arrives by column band); a swizzle band is kept no wider.
  std::int64_t cols_per_flag = 0;
  /// wait_a_rows: the rows present before a run starts (its ready rows, this
  /// rank's shard). A swizzle band taller than them puts remote rows into
  /// the first wave, whose tiles idle until their copy lands (4096 x 8192 x
  /// 8192 at swizzle 8, 256-row tiles in 2-CTA clusters, ran 1.35x its GEMM
  /// alone). 0: no bound.
  std::int64_t present_rows = 0;
  /// > 0: runs may report stored rows (RowsDone), in bands of this many rows;
  /// only configurations that can report (cooperative kernels) are candidates.
  std::int64_t rows_per_report = 0;
  /// > 0: the rows are blocks of this many rows (M a multiple of it), and
  /// tiles walk them whole from first_row's block down, wrapping: block f,
  /// f - 1, ..., 0, B - 1, ..., f + 1, each block's row tiles in ascending
  /// order (GEMM+ReduceScatter's ring in one launch computes its blocks in
  /// the order the ring sends them). Only configurations whose swizzle band
  /// (swizzle x cluster x tile rows) divides a block run it, so no band
  /// mixes two blocks.
  std::int64_t descending_block_rows = 0;
};

/// What a Gemm plan is built for.
struct GemmOptions {
  std::int64_t m = 0, n = 0, k = 0;
  DType input = DType::bf16;   ///< bf16 or fp16 (A and B)
  DType output = DType::bf16;  ///< the input type or fp32
  BLayout b_layout = BLayout::nk;
  /// Pick the configuration by timing each on the first run (true), or by a
  /// size heuristic only (false). Graph capture always uses the heuristic.
  bool autotune = true;
  /// Force a configuration by name (see Gemm::configurations); empty = choose.
  /// "NAME" alone: the tile scheduler's swizzle and raster order are still
  /// tuned. "NAME, swizzle S along M" (or N), as config() prints it, sets
  /// both: nothing is tuned, and prepare() (or the first run) launches it
  /// once with the hook's waits off, as tuning would have.
  std::string config;
  /// The communication hook (with the configurations compiled for it).
  GemmHook hook = GemmHook::none;
  /// Hooked plans: the shape of every run's waits, reports and tile walk.
  HookLayout hook_layout{};
  /// Let the tuner also time cuBLAS (plain plans only) and run it where it is
  /// faster, or alone where weft's kernels cannot tile the shape (K, or N, not
  /// a multiple of 8: their TMA needs 16-byte aligned rows). Off by default, so
  /// a Gemm is weft's own kernels unless asked; the overlapped operators turn
  /// it on for their unhooked GEMMs.
  bool allow_cublas = false;
  /// For ranks that tune the same GEMM together (the overlapped plans'
  /// GEMMs): a collective that replaces each timing of a list (ms; the same
  /// candidates in the same order on every rank) by its maximum over those
  /// ranks, so that every rank runs the same configuration, picked by the
  /// slowest rank's time. Empty: this rank's own timings decide.
  std::function<void(std::vector<float>&)> agree;
  /// Hooked plans whose runs neither rotate the tile order (GemmArgs::first_row
  /// = 0) nor report stored rows (no HookLayout::rows_per_report): their tiles wait for
  /// rows that mostly arrived before the GEMM reached them, so any tile order
  /// is correct and none needs to follow the arrivals; the tuner then also
  /// times the walk along M and every swizzle, as for plain plans. Runs that
  /// rotate or report are refused (weft::Error).
  bool any_tile_order = false;
  /// The most SMs the persistent kernels may hold (their grid); 0: every SM
  /// this rank may use. Plans whose tiles wait for copies of their own rank
  /// set it where ranks share a GPU: a copy within one GPU may run as a
  /// kernel, which needs an SM the waiting tiles do not hold. A kernel of
  /// clusters holds whole clusters: the budget rounded down to them, and at
  /// least one (2 SMs for a 2x1 cluster on a budget of 1).
  int max_sms = 0;
};

/// Options of a plain GEMM: C [m, n] = A [m, k] x B, inputs and output of type `t`.
inline GemmOptions gemm_options(std::int64_t m, std::int64_t n, std::int64_t k, DType t = DType::bf16,
                                BLayout layout = BLayout::nk) {
  GemmOptions o;
  o.m = m;
  o.n = n;
  o.k = k;
  o.input = o.output = t;
  o.b_layout = layout;
  return o;
}

namespace gemm_detail {
struct Config;
struct Problem;
/// A run's operands but for their addresses (gemm.cpp: args_shape).
using ArgsShape = std::array<std::int64_t, 14>;
}

/// A planned GEMM for one shape. Not thread-safe; one stream at a time.
class Gemm {
 public:
  /// Validates the shape, types and alignment (errors say what was expected).
  explicit Gemm(const GemmOptions& options);
  ~Gemm();
  /// True if this build compiled a configuration named `name` that computes
  /// what `o` asks (its types, B layout and hook): a plan that forces a
  /// configuration (GemmOptions::config) asks first, as the constructor
  /// refuses a forced name it cannot run.
  static bool has_configuration(const GemmOptions& o, const std::string& name);
  /// True if weft's kernels can tile a GEMM of these options (what it depends
  /// on: K, N, the B layout and the output type). Their TMA loads and stores
  /// need 16-byte aligned rows: of A (and B stored [N,K]), so K a multiple of
  /// 8; of B stored [K,N], so N a multiple of 8; of C, so N a multiple of 16
  /// bytes' worth of output elements. Where they cannot, `why` (if given)
  /// receives the reason, and only cuBLAS runs the shape
  /// (GemmOptions::allow_cublas): the one rule for plans and for the
  /// overlapped operators that choose their paths by it.
  static bool can_tile(const GemmOptions& o, std::string* why = nullptr);
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  /// "" if this plan can run `args`, else what was expected: the operands'
  /// presence and alignment, and the hook operands against the plan's hook
  /// and HookLayout (CUTLASS's can_implement, for the plan rather than one
  /// kernel). prepare() asks it and throws its answer.
  std::string can_implement(const GemmArgs& args) const;
  /// C = A x B^T (nk) or A x B (kn) on `stream`. Device pointers, 16-byte aligned.
  void run(const void* a, const void* b, void* c, cudaStream_t stream);
  /// The same with a hook's operands. The first run prepares (and validates);
  /// a later run is validated again only where its operands differ from the
  /// last validated run's in more than their addresses.
  void run(const GemmArgs& args, cudaStream_t stream);
  /// Validates `args` (can_implement) and chooses the configuration now
  /// (timing them, outside graph capture) on these operands, as the first run
  /// would; hooked plans time their kernels with every row marked present and
  /// nothing reported or added outside C. Hooked plans call it before their
  /// first collective run, so no peer waits on a rank that is still tuning.
  /// A configuration chosen without
  /// timing (forced by its full name, or autotune off) is launched once here
  /// all the same: CUDA loads a kernel at its first launch, and that load,
  /// behind a stream wait on this GEMM's own reports, would never finish.
  /// Inside a graph capture nothing is launched (the heuristic's choice or
  /// the first candidate is taken); prepare outside the capture first.
  void prepare(const GemmArgs& args, cudaStream_t stream);
  /// True once the configuration is chosen (tuned, forced, or by the size heuristic).
  bool prepared() const { return chosen_ != nullptr; }
  /// True if prepare() took the configuration from the tuning cache instead
  /// of timing: a Gemm of the same options and constraints tuned earlier in
  /// this process, or one stored in the file WEFT_TUNE_CACHE names (one line
  /// per choice, appended as each is made; delete it to tune afresh). Ranks
  /// that agree (GemmOptions::agree) take a cached choice only where all of
  /// them hold the same one; otherwise they all tune.
  bool from_cache() const { return from_cache_; }
  /// The configuration in use ("128x256x64 c2x1 cooperative, swizzle 4 along N"), or "" before the first
  /// run if autotuning.
  std::string config() const;
  /// Names of the configurations available for these types and layout.
  std::vector<std::string> configurations() const;
  const GemmOptions& options() const { return options_; }
  /// 2 x M x N x K.
  double flops() const { return 2.0 * options_.m * options_.n * options_.k; }

 private:
  void tune(const GemmArgs& args, cudaStream_t stream);
  /// Validates a run against the plan and the chosen configuration, unless
  /// one of the same shape (gemm_detail::ArgsShape) was validated last; throws what was expected.
  void validate_run(const GemmArgs& args);
  /// One launch of `cfg` on these operands with the hook's waits and reports
  /// off: "" or why it cannot run.
  const char* launch_unhooked(const GemmArgs& args, const gemm_detail::Config& cfg, int swizzle, int raster,
                              cudaStream_t stream);
  gemm_detail::Problem problem(const GemmArgs& args, int swizzle, int raster) const;
  void reserve_workspace(std::size_t bytes);

  GemmOptions options_;
  std::vector<const gemm_detail::Config*> candidates_;
  const gemm_detail::Config* chosen_ = nullptr;
  int swizzle_ = 1, raster_ = 0;  // the tile scheduler's settings for chosen_
  DeviceBuffer workspace_;
  int sm_count_ = 0;
  bool from_cache_ = false;
  bool cublas_only_ = false;  // a shape weft's kernels cannot tile (K or N): cuBLAS alone (allow_cublas)
  bool launched_ = false;  // prepare() launched chosen_ (or every candidate) once, outside graph capture
  /// What the last validated run looked like, but for its addresses: the hook
  /// operands' values, which pointers were given and their alignment (a fixed
  /// array: comparing it costs a run no allocation).
  gemm_detail::ArgsShape validated_shape_{};
  bool shape_validated_ = false;
  DeviceBuffer exits_;  // u64, hooked plans: CTAs past their last wait (RowSignals::consume), 0 between runs
};

}  // namespace weft
