// bench_args.hpp - the command line of weft-bench, parsed and validated without touching a GPU.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "routing.hpp"
#include "timing.hpp"
#include "weft/gemm/gemm.hpp"
#include "weft/ops/ag_gemm.hpp"
#include "weft/ops/flash_decode.hpp"
#include "weft/ops/gemm_rs.hpp"

namespace weft::bench {

/// One shape of weft-bench decode: batch x query heads over KV heads, keys per sequence, page size (0: contiguous).
struct DecodeCase {
  std::int64_t batch, q_heads, kv_heads, kv_len, page_size;
};

/// One shape of weft-bench grouped_gemm: rows summed over the experts, each expert's weight N x K.
struct GroupedCase {
  std::int64_t rows, n, k;
  int experts;
};

/// One layer of weft-bench moe_tp: T tokens over all ranks, hidden H, the experts' intermediate size F, E experts, top-k.
struct MoeTpCase {
  std::int64_t tokens, hidden, ffn;
  int experts, top_k;
};

/// Everything weft-bench was asked to do.
struct BenchArgs {
  std::string op;                     ///< "all_gather", "all_reduce", "reduce_scatter", "gemm", "ag_gemm", "gemm_rs", "gemm_ar", "ep", "decode", "grouped_gemm", "moe_tp"
  std::vector<std::uint64_t> bytes;   ///< per-rank message sizes, ascending
  std::vector<std::string> variants;  ///< e.g. {"push", "pull", "ce"}; "all": every one-node variant; overlap ops: modes
  /// Collectives: the variants to time where some peer is not mapped (ranks on
  /// several nodes, or WEFT_VIRTUAL_NODES): `variants`, except that "all" (the
  /// default) means two_level there, the one schedule that reaches such peers.
  /// A one-node variant named on the command line stays (its plan refuses, naming the ranks).
  std::vector<std::string> variants_across_nodes;
  std::string dtype = "bf16";         ///< element type: bf16, fp16, fp32
  bool check = false;                 ///< verify bitwise against NCCL before timing
  bool json = false;                  ///< one JSON object per line instead of a table
  int samples = 15;                   ///< timed samples per (size, variant); the median is reported
  int warmup = 3;                     ///< untimed samples first
  bool hold = true;                   ///< hold the stream while a sample is enqueued (--no-hold: not; timing.hpp)
  bool enqueue = false;               ///< collectives: time the host's enqueue of a call, and a graph of one call
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
  bool grouped_tune = false;  ///< --tune: grouped_gemm times every configuration first (GroupedGemmOptions::autotune)
  bool any_order = false;  ///< --any-order: a waiting --hook's plan allows any tile order (GemmOptions::any_tile_order)
  /// --no-source-rows B,E: with --hook wait_source_rows, rows [B, E) add no
  /// source (AddSource::plain_begin/end; Gemm::can_implement checks the bounds)
  std::int64_t no_source_begin = 0, no_source_end = 0;
  // ep only
  std::int64_t ep_tokens = 4096;  ///< --tokens: tokens each rank routes
  int ep_hidden = 7168;           ///< --hidden: channels per token (bf16)
  int ep_topk = 8;                ///< --topk: experts per token
  int ep_experts = 256;           ///< --experts: experts over all ranks
  int ep_ll_tokens = 128;         ///< --ll-tokens: tokens per rank of the low-latency mode's timing (0: none)
  // decode only
  std::vector<DecodeCase> decode_cases;  ///< --cases (default: the shapes of docs/PERF.md's decode table)
  int splits = 0;                        ///< --splits: KV splits per (sequence, KV head) (0: the plan's choice)
  bool dist = false;                     ///< --dist: also time DistFlashDecode over a shard per rank
  int stages = 0;                        ///< --stages: the kernel's pipeline stages (0: the default)
  DecodeMerge merge = DecodeMerge::automatic;          ///< --merge: launch, last_block or auto
  PageLookup page_lookup = PageLookup::automatic;      ///< --page-lookup: row, warp or auto (paged cases)
  bool sweep = false;                    ///< --sweep: every kernel variant against the default, per case
  // grouped_gemm only (also b_layout, from --layout)
  std::vector<GroupedCase> grouped_cases;  ///< --m/--n/--k/--experts (default: issue 33's three MoE shapes)
  // moe_tp only (also routing, dtype, check, max_sms)
  std::vector<MoeTpCase> moe_tp_cases;  ///< --cases T,H,F,E,k;... (default: issue 33's three MoE layers)
  std::string routing = "uniform";         ///< --routing: uniform, zipf, one-hot or zipf-reversed (routing.hpp)
};

/// The largest per-rank message --bytes takes (1024T): far above any GPU's
/// memory, and low enough that a range's doubling and the buffer sizes derived
/// from it stay well inside 64 bits.
inline constexpr std::uint64_t kMaxBenchBytes = std::uint64_t{1} << 50;

/// The largest GEMM dimension (M, N or K) weft-bench takes: one bf16 matrix of
/// 2^24 x 8192 already exceeds a GPU's memory, and the sizes derived from a
/// shape stay well inside 64 bits.
inline constexpr std::int64_t kMaxShapeDim = std::int64_t{1} << 24;

/// Parses "M,N,K;M,N,K" (also "MxNxK"), each dimension 1 to kMaxShapeDim;
/// throws naming --shapes and the bad shape.
std::vector<std::array<std::int64_t, 3>> parse_shapes(const std::string& text);

/// Parses "B,HQ,HKV,L[,P];..." (weft-bench decode --cases); throws naming --cases and the bad case.
std::vector<DecodeCase> parse_decode_cases(const std::string& text);
/// Parses weft-bench moe_tp's --cases: "T,H,F,E,k;..." (H and F multiples of 8, top-k at most E).
std::vector<MoeTpCase> parse_moe_tp_cases(const std::string& text);

/// Bytes of one element of `dtype`; throws naming the accepted types.
int dtype_bytes(const std::string& dtype);

/// Parses argv (argv[0] is the program). Throws weft::Error with a message
/// that names the bad argument and what was expected, and rejects an option
/// that does not apply to the operation. `--help` (anywhere) throws
/// HelpRequested carrying the overview, or the operation's own options when
/// one is named.
BenchArgs parse_bench_args(const std::vector<std::string>& argv);

/// Bytes of symmetric heap the two-level plan of collective `op` (all_gather,
/// all_reduce, reduce_scatter) allocates at `bytes` per rank, elements of
/// `elem` bytes, `world` ranks in nodes of `per_node` (its staging: the sizes
/// of src/ops/internode/*.cu, each buffer rounded up to 2 MiB, plus 2 MiB of
/// flags): the room weft-bench adds to its heap where it may time two_level.
std::uint64_t two_level_heap_bytes(const std::string& op, std::uint64_t bytes, int elem, int world, int per_node);

/// "fixed" or "shuffled": the name --order takes.
const char* sample_order_name(SampleOrder order);

/// ag_gemm, gemm_rs, gemm_ar: the overlapped tensor-parallel operators.
bool is_overlap_op(const std::string& op);

/// The overview: usage, every operation with a line on what it measures, the
/// options every operation takes, the exit codes.
std::string bench_usage();

/// `op`'s own help: what it measures and each option that applies to it, with
/// its default. Throws weft::Error for an unknown operation.
std::string bench_usage(const std::string& op);

/// Thrown by parse_bench_args for --help / -h.
struct HelpRequested {
  std::string text;
};

/// Parses a size list: "1K,64K,1M", a power-of-two range "1K:256M", or a mix
/// ("1K:4K,1M"), every size 1 to kMaxBenchBytes. Throws on malformed sizes,
/// sizes above the bound, or ranges whose ends are not powers of two.
std::vector<std::uint64_t> parse_size_list(const std::string& text);

}  // namespace weft::bench
