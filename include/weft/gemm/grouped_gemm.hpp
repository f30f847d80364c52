// weft/gemm/grouped_gemm.hpp - the grouped GEMM engine: every expert's rows times its weight, in one launch.
//
// out[rows of expert e] = A[rows of expert e] x W[e]^T (W as [E, N, K], "nk")
// or A[rows of expert e] x W[e] (W as [E, K, N], "kn"). A is row-major
// [rows, K] with its rows sorted by expert; out is row-major [rows, N]; the
// rows each expert holds are counted in device memory (int32 [E]), as a
// router writes them, so a run never waits on the host: no copy of the counts
// to the host, no synchronisation, and a run can be captured in a CUDA graph
// and replayed with other counts. Experts may hold no rows. bf16 or fp16,
// fp32 accumulation, output of the input type.
//
// Expert e's rows follow expert e - 1's (packed), or start where an optional
// int32 [E] of first rows, also on the device, says: a padded layout such as
// [E, rows_per_expert, K] with a count of valid rows per expert, or a part of
// every expert's rows (one source rank's pairs of each expert, as an
// overlapped MoE layer computes them as they arrive). Rows between the
// experts' ranges are neither read for the output nor written.
//
// The kernels are CUTLASS 3's sm_90a grouped (ptr-array) GEMMs: one persistent
// grid whose tile scheduler walks every expert's tiles in turn, so an
// imbalanced routing costs the tiles it has and no more (nothing is padded to
// the largest expert). A short prologue kernel on the same stream turns the
// counts into each expert's problem shape, pointers and strides, in a
// workspace the plan owns.
//
// A run may wait, tile by tile, for its rows of A (GroupedRowWait): each row
// names the flag its producer raises (a source rank's shard landing, say),
// and a tile's loads start once the flags of the rows it reads are up, while
// tiles whose rows are present compute: the grouped kernel's hook seam for an
// overlapped MoE layer, as the dense engine's RowSignals are for AllGather + GEMM.
// And a run may report the rows of out it has stored (GroupedRowsDone):
// counters per band of out's rows, raised as tiles' stores complete, which a
// consumer (a ReduceScatter of the finished rows, say) waits on while the GEMM
// goes on, as the dense engine's RowsDone serves GEMM + ReduceScatter.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "weft/core/cuda_resources.hpp"
#include "weft/core/dtype.hpp"
#include "weft/device/world.cuh"
#include "weft/gemm/gemm_types.hpp"

namespace weft {

/// What a GroupedGemm plan is built for.
struct GroupedGemmOptions {
  int experts = 0;            ///< E >= 1: the groups, one weight matrix each
  std::int64_t n = 0, k = 0;  ///< each expert's weight is N x K; both multiples of 8 (16-byte rows for TMA)
  /// The most rows (summed over experts) a run may take: A's and out's row
  /// capacity. A run whose counts sum to more computes only the rows that fit
  /// and records the fault for check_counts().
  std::int64_t max_rows = 0;
  DType dtype = DType::bf16;  ///< A, W and out: bf16 or fp16
  BLayout w_layout = BLayout::nk;  ///< W as [E, N, K] (nk) or [E, K, N] (kn)
  /// The rows a typical run holds (summed over experts), for the size
  /// heuristic; 0: max_rows. Any count up to max_rows runs correctly.
  std::int64_t expected_rows = 0;
  /// Force a configuration by name (see GroupedGemm::configurations); empty:
  /// chosen, by timing (autotune) or by the size heuristic.
  std::string config;
  /// Choose the configuration by timing every compiled candidate on the
  /// first run that is not captured in a CUDA graph (or on prepare()), on
  /// that run's operands and routing, with the dense GEMM's tuner (weft/core/timing.hpp:
  /// interleaved passes, medians). The choice is kept by shape (E, N, K, type,
  /// layout, expected_rows, SM budget, GPU, candidates) in the tuning cache
  /// that the dense GEMM's choices share (WEFT_TUNE_CACHE), so a later plan of
  /// the shape takes it at once. False: the size heuristic, which picked the
  /// fastest tile on every shape measured (docs/PERF.md, Grouped GEMM). Off by
  /// default because the timing runs block the host on the stream: a plan
  /// whose grouped GEMMs run behind waits on other ranks (AgMoe's per-source
  /// runs) tunes in prepare(), before it enqueues any wait, or not at all.
  bool autotune = false;
  /// The most SMs the persistent grid may hold; 0: every SM. Rounded down to
  /// whole clusters of the chosen kernel, and at least one cluster.
  int max_sms = 0;
};

/// What a run's tiles wait for before loading their rows of A. For each
/// row r a tile reads (its expert's rows, clipped to the expert's count), the
/// kernel's mainloop producer warp waits until flags[row_flag[r]] >= value
/// (acquire, system scope; lanes that share a flag poll it once), then
/// fences the async proxy and issues the tile's TMA loads; the consumer warps
/// are fed through shared memory and never wait. Rows of one flag may sit in
/// any experts, in any order: the map is the run's, on the device (an
/// overlapped MoE layer writes it as it sorts the gathered pairs). The flags
/// are not reset by the run: raise them to a value that grows run over run
/// (an epoch), or reset them after the run in stream order. A row whose
/// row_flag is outside [0, flag_count) waits for nothing and is recorded for
/// check_counts(). No flags: no wait.
struct GroupedRowWait {
  const dev::World* world = nullptr;     ///< names the rank and bounds the wait (its timeout)
  const std::uint64_t* flags = nullptr;  ///< device memory written by copy engines, peers or kernels; 8-byte aligned
  int flag_count = 0;                    ///< flags' length, >= 1 where flags are given
  std::uint64_t value = 1;               ///< a flag is up when >= value
  const std::int32_t* row_flag = nullptr;  ///< device memory, int32 [max_rows]: each row's flag
  /// Flag f is raised by rank f / flags_per_rank (named by the timeout report); >= 1.
  int flags_per_rank = 1;
};

/// Where a run reports the rows of out it has stored. Once the TMA stores of
/// a tile are complete, the tile adds (its rows in band b) x (its columns) to
/// counters[b], band b = rows [b * rows_per_report, (b + 1) * rows_per_report)
/// of out, with release semantics at system scope. Band b is complete when
/// counters[b] reaches (its rows inside some expert's range) x N
/// (complete_value): with packed rows summing to T, min(T, (b + 1) x
/// rows_per_report) - b x rows_per_report of them. A tile is reported once
/// its CTA has issued the stores of its next tile (or at the CTA's end), so
/// reporting costs the consumers nothing; a band waits at most one tile of
/// its last CTA longer. The counters are not reset by the run: zero them
/// before it, in stream order. No counters: no report.
struct GroupedRowsDone {
  std::uint64_t* counters = nullptr;  ///< device memory, ceil(max_rows / rows_per_report) of them, 8-byte aligned
  std::int64_t rows_per_report = 0;   ///< >= 1 where counters are given; 0 without

  /// A band's counter once every tile has stored its `covered_rows` rows (those inside experts' ranges) of N columns.
  static constexpr std::uint64_t complete_value(std::int64_t covered_rows, std::int64_t n) {
    return static_cast<std::uint64_t>(covered_rows * n);
  }
};

/// One run's operands: device pointers, 16-byte aligned.
struct GroupedGemmArgs {
  const void* a = nullptr;    ///< [rows, K] row-major, rows sorted by expert
  const void* w = nullptr;    ///< [E, N, K] or [E, K, N] row-major
  void* out = nullptr;        ///< [rows, N] row-major
  /// Device memory, int32 [E]: the rows of each expert, in order. Read on the device only.
  const std::int32_t* expert_rows = nullptr;
  /// Optional device memory, int32 [E]: the row of A and out where each
  /// expert's rows start, ascending, the ranges [first, first + count) apart
  /// and within max_rows (else recorded for check_counts(), and the expert
  /// computed as empty). Null: packed, expert e's rows right after expert e - 1's.
  const std::int32_t* expert_first_row = nullptr;
  /// Optional: the tiles' waits for their rows of A (GroupedRowWait). A run
  /// that waits is never timed: with autotune, the configuration is the
  /// tuning cache's or the heuristic's unless prepare() ran without a wait.
  GroupedRowWait wait{};
  /// Optional: the stored rows' report (GroupedRowsDone). A run that reports
  /// is never timed either: a timing run would add to the counters again.
  GroupedRowsDone report{};
};

namespace gemm_detail {
struct GroupedConfig;
}

/// A planned grouped GEMM for one (E, N, K, dtype, layout). Not thread-safe;
/// one stream at a time (the per-expert arrays live in the plan's workspace).
class GroupedGemm {
 public:
  /// Validates the options (errors say what was expected) and picks the configuration.
  explicit GroupedGemm(const GroupedGemmOptions& options);
  ~GroupedGemm();
  GroupedGemm(const GroupedGemm&) = delete;
  GroupedGemm& operator=(const GroupedGemm&) = delete;

  /// Enqueues the prologue and the grouped GEMM on `stream`. Checks the
  /// pointers on the host; the counts are read on the device only. The first
  /// run prepares the plan (prepare()) if nothing did.
  void run(const GroupedGemmArgs& args, cudaStream_t stream);
  /// With autotune: times every candidate on `args` (their routing as the
  /// device holds it when the timing runs), or takes the tuning cache's
  /// choice for this shape, and leaves `out` holding the chosen
  /// configuration's result. Without: nothing. Blocks the host until the
  /// timing runs end, so it must not follow work on `stream` that waits on
  /// another rank's progress. Under graph capture it keeps the heuristic's
  /// choice for good (nothing can be timed inside a capture). Once per plan.
  void prepare(const GroupedGemmArgs& args, cudaStream_t stream);
  /// True when prepare() took the choice from the tuning cache instead of timing.
  bool from_cache() const { return chosen_by_ == ChosenBy::tuning_cache; }
  /// How the configuration in use was chosen: "forced" (options.config),
  /// "timing" (autotune timed the candidates), "tuning cache" (autotune found
  /// this shape's earlier choice) or "heuristic" (the size heuristic).
  const char* chosen_by() const;
  /// Synchronises `stream`, then throws weft::Error if a run since the last
  /// check was given a negative count, counts that summed past max_rows (such
  /// a run computes only the rows that fit) or, with first rows, an expert
  /// whose range was out of order, overlapped the one before or passed
  /// max_rows (computed as empty), naming the first such expert, or a row
  /// whose GroupedRowWait::row_flag was out of range; clears the record.
  /// For tests and debugging: run() itself never synchronises.
  void check_counts(cudaStream_t stream);
  /// The configuration in use ("128x256x64 c2x1 cooperative").
  std::string config() const;
  /// Names of the compiled configurations for this dtype and layout.
  std::vector<std::string> configurations() const;
  const GroupedGemmOptions& options() const { return options_; }

 private:
  GroupedGemmOptions options_;
  std::vector<const gemm_detail::GroupedConfig*> candidates_;
  const gemm_detail::GroupedConfig* chosen_ = nullptr;
  int sm_count_ = 0;
  bool prepared_ = false;
  enum class ChosenBy { forced, heuristic, timing, tuning_cache } chosen_by_ = ChosenBy::heuristic;
  DeviceBuffer workspace_;  // the per-expert arrays, then CUTLASS's workspace: room for every candidate's
  std::size_t workspace_bytes_ = 0;
  DeviceBuffer faults_;  // GroupedFaultRecord: fault bits, the first total past max_rows, the first bad range, a bad flag row

  const char* launch(const gemm_detail::GroupedConfig& cfg, const GroupedGemmArgs& args, cudaStream_t stream);
  /// prepare() after the operand checks: true where it left `out` holding the chosen configuration's result.
  bool choose(const GroupedGemmArgs& args, cudaStream_t stream);
};

}  // namespace weft
