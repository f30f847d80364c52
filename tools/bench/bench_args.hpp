// bench_args.hpp - the command line of weft-bench, parsed and validated without touching a GPU.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "timing.hpp"
#include "weft/gemm/gemm.hpp"
#include "weft/ops/ag_gemm.hpp"
#include "weft/ops/gemm_rs.hpp"

namespace weft::bench {

/// Everything weft-bench was asked to do.
struct BenchArgs {
  std::string op;                     ///< "all_gather", "all_reduce", "reduce_scatter", "gemm", "ag_gemm", "gemm_rs", "gemm_ar"
  std::vector<std::uint64_t> bytes;   ///< per-rank message sizes, ascending
  std::vector<std::string> variants;  ///< e.g. {"push", "pull", "ce"}; "all" expands to every variant; overlap ops: modes
  std::string dtype = "bf16";         ///< element type: bf16, fp16, fp32
  bool check = false;                 ///< verify bitwise against NCCL before timing
  bool json = false;                  ///< one JSON object per line instead of a table
  int samples = 15;                   ///< timed samples per (size, variant); the median is reported
  int warmup = 3;                     ///< untimed samples first
  bool hold = true;                   ///< hold the stream while a sample is enqueued (--no-hold: not; timing.hpp)
  SampleOrder order = SampleOrder::fixed;  ///< --order: the contenders' order in each round of samples (timing.hpp)
  int max_sms = 0;                    ///< SM variants: cap on SMs (0 = plan's choice)
  int chunks = 0;                     ///< overlapped operators: copy/signal chunks per rank's rows (0 = plan's default)
  FusedWay way = FusedWay::automatic;  ///< gemm_rs, gemm_ar: --way per_step | one_launch | plain_first (automatic: timed)
  AgWay ag_way = AgWay::automatic;     ///< ag_gemm: --way one_gemm | plain_steps (automatic: timed)
  int soak_s = 0;  ///< overlapped operators: after timing, run each contender alone for this many seconds (clock studies)
  // gemm only
  std::vector<std::array<std::int64_t, 3>> shapes;  ///< M, N, K per shape
  std::string b_layout = "nk";                      ///< "nk" (B is [N,K]) or "kn"
  std::string out_dtype;                            ///< output type ("" = the input type)
  std::string config;                               ///< force a GEMM configuration by name
  GemmHook hook = GemmHook::none;                   ///< --hook: a hooked kernel alone, nothing waited on
  bool any_order = false;  ///< --any-order: a waiting --hook's plan allows any tile order (GemmOptions::any_tile_order)
  /// --no-source-rows B,E: with --hook wait_source_rows, rows [B, E) add no
  /// source (GemmArgs::no_source_begin/end; Gemm::run checks the bounds)
  std::int64_t no_source_begin = 0, no_source_end = 0;
};

/// Parses "M,N,K;M,N,K" (also "MxNxK"); throws naming the bad shape.
std::vector<std::array<std::int64_t, 3>> parse_shapes(const std::string& text);

/// Bytes of one element of `dtype`; throws naming the accepted types.
int dtype_bytes(const std::string& dtype);

/// Parses argv (argv[0] is the program). Throws weft::Error with a message
/// that names the bad argument and what was expected. `--help` throws
/// HelpRequested carrying the usage text.
BenchArgs parse_bench_args(const std::vector<std::string>& argv);

/// "fixed" or "shuffled": the name --order takes.
const char* sample_order_name(SampleOrder order);

/// ag_gemm, gemm_rs, gemm_ar: the overlapped tensor-parallel operators.
bool is_overlap_op(const std::string& op);

/// The usage text.
std::string bench_usage();

/// Thrown by parse_bench_args for --help / -h.
struct HelpRequested {
  std::string text;
};

/// Parses a size list: "1K,64K,1M", a power-of-two range "1K:256M", or a mix
/// ("1K:4K,1M"). Throws on malformed sizes or ranges whose ends are not powers of two.
std::vector<std::uint64_t> parse_size_list(const std::string& text);

}  // namespace weft::bench
