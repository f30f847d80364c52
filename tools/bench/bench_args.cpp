#include "bench_args.hpp"

#include <algorithm>
#include <cctype>
#include <iterator>
#include <optional>
#include <set>

#include "weft/core/env.hpp"
#include "weft/core/error.hpp"
#include "weft/ops/collective.hpp"

namespace weft::bench {
namespace {

// The operations, in the order the overview lists them, each with a line on
// what it measures and (for its own help) what its sizes mean.
struct OpInfo {
  const char* name;
  const char* summary;
  const char* about;  // more lines for `weft-bench OP --help` ("" for none)
};
const OpInfo kOpInfo[] = {
    {"all_gather", "every rank's input gathered on every rank: weft's variants against NCCL", ""},
    {"all_reduce", "the element-wise sum over ranks, on every rank: weft's variants against NCCL", ""},
    {"reduce_scatter", "the element-wise sum over ranks, each rank keeping its slice: weft's variants against NCCL",
     ""},
    {"gemm", "weft's GEMM (C[M,N] = A[M,K] x B^T) against cuBLAS, each rank timing its own GPU", ""},
    {"ag_gemm", "AllGather + GEMM, overlapped, against NCCL then cuBLAS (and each part alone, and the ideal)",
     "Shapes are the layer's, PyTorch-style: A [M,K] is row-sharded over the ranks, N the full\n"
     "output width, each rank computing N/W columns (M and N multiples of the world size W)."},
    {"gemm_rs", "GEMM + ReduceScatter, overlapped, against cuBLAS then NCCL (and each part alone, and the ideal)",
     "Shapes are the layer's, PyTorch-style: K the full depth, K/W per rank; each rank keeps\n"
     "M/W rows of the sum (M and K multiples of the world size W)."},
    {"gemm_ar", "GEMM + AllReduce, overlapped, against cuBLAS then NCCL (and each part alone, and the ideal)",
     "Shapes are the layer's, PyTorch-style: K the full depth, K/W per rank; every rank gets\n"
     "the whole sum (M and K multiples of the world size W)."},
    {"ep", "MoE expert-parallel dispatch and combine (throughput mode) against a copy bound measured alike",
     "Each rank routes --tokens tokens to --topk of --experts experts (uniform random), E / W\n"
     "experts per rank. Bandwidth as DeepEP counts it: bytes per valid token-rank pair over time;\n"
     "remote bytes/s counts the pairs that leave the rank."},
    {"decode", "decode attention (FlashDecode) over a KV cache, in KV bytes read per second, against the HBM copy bound",
     "Each rank times its own GPU: per case, the attention (both launches) and a device-to-device\n"
     "copy of the same K and V bytes (the copy bound, read + write), median of the samples."},
    {"grouped_gemm", "weft's grouped GEMM (every expert's rows x its weight) against one dense cuBLAS GEMM of the same FLOPs",
     "out[rows of expert e] = A[rows of expert e] x W[e]^T: A [rows, K] sorted by expert, W [E, N, K]\n"
     "(or [E, K, N]), the counts on the device. Each rank times its own GPU, the grouped GEMM and\n"
     "cuBLAS's [rows, K] x [K, N] in turn; TFLOP/s = 2 x rows x N x K / time.\n"
     "tools/bench/grouped_mm_torch.py times torch._grouped_mm on the same shapes and counts."},
    {"moe_tp", "MoE under tensor parallelism (AgMoe, MoeRs: the sequential path) against their grouped GEMMs alone",
     "A layer of T tokens (a contiguous T / W on each rank), hidden H, E experts of intermediate\n"
     "size F (F / W of each on each rank), top-k. ag_moe = AllGather + sort by expert + up GEMM;\n"
     "moe_rs = down GEMM + top-k weighted sum + ReduceScatter; each against its grouped GEMM alone\n"
     "on the same counts and configuration. Pairs per expert as grouped_gemm's --routing counts them."},
};
constexpr std::size_t kOpCount = std::size(kOpInfo);

const std::vector<std::string> kOps = [] {
  std::vector<std::string> v;
  for (const auto& op : kOpInfo) v.push_back(op.name);
  return v;
}();

// Which operations an option applies to: one bit per operation, in kOpInfo's order.
constexpr unsigned kAllGather = 1u << 0, kAllReduce = 1u << 1, kReduceScatter = 1u << 2, kGemm = 1u << 3,
                   kAgGemm = 1u << 4, kGemmRs = 1u << 5, kGemmAr = 1u << 6, kEp = 1u << 7, kDecode = 1u << 8,
                   kGroupedGemm = 1u << 9, kMoeTp = 1u << 10;
constexpr unsigned kCollectives = kAllGather | kAllReduce | kReduceScatter;
constexpr unsigned kOverlap = kAgGemm | kGemmRs | kGemmAr;
constexpr unsigned kEvery = kCollectives | kGemm | kOverlap | kEp | kDecode | kGroupedGemm | kMoeTp;

unsigned op_bit(const std::string& op) {
  for (std::size_t i = 0; i < kOpCount; ++i)
    if (op == kOpInfo[i].name) return 1u << i;
  return 0;
}

// Every option weft-bench takes: the one place that knows which operations
// each applies to and what it means there. An option may have several rows,
// one per group of operations it means something different to. `label` is
// what the help shows (the flag and its value's name); a row without text is
// accepted but shown under another row's label (--n, --k under --m).
struct OptionInfo {
  const char* flag;
  bool takes_value;
  unsigned ops;
  const char* label;
  const char* text;  // lines separated by '\n'; "{variants}" becomes the operation's variants
};
const OptionInfo kOptions[] = {
    {"--bytes", true, kAllGather, "--bytes LIST",
     "sizes of each rank's input: 1K,64K,1M, a power-of-two range 1K:256M, or a mix;\n"
     "suffixes K, M, G, T (powers of 1024), at most 1024T (default 1K:256M)"},
    {"--bytes", true, kAllReduce, "--bytes LIST",
     "sizes of the buffer each rank contributes and receives: 1K,64K,1M, a power-of-two\n"
     "range 1K:256M, or a mix; suffixes K, M, G, T (powers of 1024), at most 1024T (default 1K:256M)"},
    {"--bytes", true, kReduceScatter, "--bytes LIST",
     "sizes of each rank's input (each rank keeps 1/world of the sum): 1K,64K,1M, a power-of-two\n"
     "range 1K:256M, or a mix; suffixes K, M, G, T (powers of 1024), at most 1024T (default 1K:256M)"},
    {"--variant", true, kCollectives, "--variant LIST",
     "{variants}, auto (the plan's choice),\n"
     "all (every one but auto and two_level) or a comma list (default all; a variant is\n"
     "skipped above its size limit). Where ranks span nodes (or WEFT_VIRTUAL_NODES splits\n"
     "them), only two_level reaches every peer: all means two_level there, and auto takes it;\n"
     "it needs a weft-bench built with NVSHMEM (weft::internode; scripts/setup.sh fetches it)"},
    {"--variant", true, kOverlap, "--variant LIST",
     "fused, sequential, auto (the plan times fused and sequential and keeps the faster),\n"
     "all (fused and sequential), or a comma list (default auto)"},
    {"--dtype", true, kCollectives, "--dtype T", "element type: bf16, fp16 or fp32; sizes must be whole elements (default bf16)"},
    {"--dtype", true, kGemm, "--dtype T", "input type: bf16 or fp16 (default bf16)"},
    {"--dtype", true, kOverlap, "--dtype T", "bf16 or fp16 (default bf16)"},
    {"--dtype", true, kDecode, "--dtype T", "q, K, V and output type: bf16 or fp16 (default bf16)"},
    {"--dtype", true, kGroupedGemm, "--dtype T", "A, W and output type: bf16 or fp16 (default bf16)"},
    {"--dtype", true, kMoeTp, "--dtype T", "tokens, weights and outputs: bf16 or fp16 (default bf16)"},
    {"--check", false, kCollectives, "--check", "verify bitwise against NCCL first (fresh random data, poisoned outputs) (default off)"},
    {"--check", false, kGemm, "--check",
     "always on for gemm: each shape's output is compared with cuBLAS's fp32 output"},
    {"--check", false, kAgGemm, "--check",
     "verify against NCCL + cuBLAS before timing: the output's relative error, the gathered A\n"
     "bitwise (default off)"},
    {"--check", false, kGemmRs | kGemmAr, "--check",
     "verify against cuBLAS + NCCL before timing: the output's relative error (default off)"},
    {"--check", false, kGroupedGemm, "--check",
     "always on for grouped_gemm: each case's output is compared with cuBLAS's fp32 output,\n"
     "expert by expert"},
    {"--check", false, kMoeTp, "--check",
     "check up to 4 tokens of each rank against a float64 layer built on the host from every\n"
     "rank's seeds (relative error at most 2e-2) (default off)"},
    {"--check", false, kDecode, "--check",
     "compare each case with an fp32 attention on the GPU (output relative error, lse) (default off)"},
    {"--json", false, kEvery, "--json", "one JSON object per line (default: a table)"},
    {"--samples", true, kEvery, "--samples N", "timed samples per point, 1 to 100000; the median is reported (default 15)"},
    {"--warmup", true, kEvery, "--warmup N", "untimed samples first, 0 to 100000 (default 3)"},
    {"--no-hold", false, kEvery, "--no-hold",
     "let each sample's GPU work start while the host still enqueues it (by default the stream\n"
     "is held until the whole sample is enqueued, so events time the GPU, not the host)"},
    {"--enqueue", false, kCollectives, "--enqueue",
     "time the host instead: microseconds to enqueue one call (run), one launch of a CUDA graph\n"
     "holding one call, and that graph's replay on the GPU; 100 calls per sample behind a held\n"
     "stream, so no call waits for the GPU; NCCL's enqueue beside them (default off)"},
    {"--max-sms", true, kCollectives, "--max-sms N", "cap on the SMs an SM variant may occupy, 0 to 1024 (default 0: the plan chooses)"},
    {"--max-sms", true, kEp, "--max-sms N",
     "cap on the SMs dispatch and combine occupy, 0 to 1024 (default 0: the rank's share of its GPU)"},
    {"--check", false, kEp, "--check",
     "verify first: identity experts, so combine must return x times the sum of the token's\n"
     "weights (bf16 tolerance), with fresh routing and poisoned outputs (default off)"},
    {"--max-sms", true, kMoeTp, "--max-sms N",
     "cap on the SMs of the grouped GEMMs and the sort, 0 to 1024 (default 0: the rank's share of its GPU)"},
    {"--tokens", true, kEp, "--tokens N", "tokens each rank routes, 1 to 1048576 (default 4096)"},
    {"--hidden", true, kEp, "--hidden H", "channels per token, bf16, a multiple of 8, 8 to 65536 (default 7168)"},
    {"--topk", true, kEp, "--topk K", "experts per token, 1 to 32, at most --experts (default 8)"},
    {"--experts", true, kEp, "--experts E", "experts over all ranks, a multiple of the world size, 1 to 1024 (default 256)"},
    {"--ll-tokens", true, kEp, "--ll-tokens M",
     "also time the low-latency mode (ExpertParallelLowLatency) at M tokens per rank, 0 to 4096:\n"
     "dispatch and combine, bf16, and fp8 dispatch where H is a multiple of 128 (default 128,\n"
     "DeepEP's low-latency shape; 0: skip)"},
    {"--shapes", true, kGemm, "--shapes LIST",
     "M,N,K;M,N,K... (also MxNxK), each dimension 1 to 16777216\n"
     "(default: the per-rank GEMMs of the tensor-parallel benchmark shapes)"},
    {"--shapes", true, kOverlap, "--shapes LIST",
     "M,N,K;M,N,K... (also MxNxK), each dimension 1 to 16777216\n"
     "(default: the shapes of docs/PERF.md's tables)"},
    {"--m", true, kGemm | kOverlap, "--m LIST --n N --k K",
     "the same as --shapes \"m1,N,K;m2,N,K...\": M a positive integer or a comma list of them,\n"
     "N and K one positive integer each (e.g. --m 2048,4096 --n 8192 --k 8192) (default: --shapes')"},
    {"--n", true, kGemm | kOverlap, "", nullptr},
    {"--k", true, kGemm | kOverlap, "", nullptr},
    {"--m", true, kGroupedGemm, "--m ROWS --n N --k K",
     "rows summed over the experts (a positive integer or a comma list), each expert's\n"
     "weight N x K (N = the MLP's F for an up-projection, K = H) (default: rows 16384 N 7168 K 4096 E 8;\n"
     "rows 65536 N 768 K 2048 E 128; rows 32768 N 2048 K 7168 E 32)"},
    {"--n", true, kGroupedGemm, "", nullptr},
    {"--k", true, kGroupedGemm, "", nullptr},
    {"--experts", true, kGroupedGemm, "--experts E",
     "experts, 1 to 65536 (default 8 with --m; without it, each default shape's own)"},
    {"--routing", true, kGroupedGemm, "--routing R",
     "rows per expert: uniform (balanced), zipf (expert i's share ~ (i + 1)^-1.2), one-hot\n"
     "(every row to expert 0) or zipf-reversed (zipf's counts with the heaviest expert last, to\n"
     "time the tile order) (default uniform)"},
    {"--routing", true, kMoeTp, "--routing R",
     "pairs per expert, as grouped_gemm counts them: uniform, zipf, one-hot or zipf-reversed\n"
     "(default uniform)"},
    {"--cases", true, kMoeTp, "--cases LIST",
     "T,H,F,E,k;... : tokens over all ranks, hidden, the experts' intermediate size, experts,\n"
     "top-k (H and F multiples of 8) (default: issue 33's layers, Mixtral-like 8192,4096,7168,8,2;\n"
     "Qwen3-30B-A3B-like 8192,2048,768,128,8; DeepSeek-like 4096,7168,2048,32,8)"},
    {"--layout", true, kGroupedGemm, "--layout L", "nk (W stored [E, N, K]) or kn (W stored [E, K, N]) (default nk)"},
    {"--order", true, kGemm | kOverlap | kGroupedGemm | kMoeTp, "--order O",
     "the contenders' order in each round of samples: fixed (each always follows the same one)\n"
     "or shuffled (a fresh order each round, the same on every rank) (default fixed)"},
    {"--soak", true, kGemm | kOverlap, "--soak S",
     "after timing, run each contender alone, back to back, for about S seconds (1 to 600), and\n"
     "print its wall-clock window ([weft-bench] soak lines), so a clock log (nvidia-smi) can say\n"
     "at what SM clock and power each one ran (default: no soak)"},
    {"--b-layout", true, kGemm, "--b-layout L", "nk (B stored [N,K]) or kn (B stored [K,N]) (default nk)"},
    {"--out", true, kGemm, "--out T", "output type: the input type or fp32 (default: the input type)"},
    {"--config", true, kGemm, "--config NAME", "force one GEMM configuration (default: the tuned one)"},
    {"--config", true, kGroupedGemm, "--config NAME",
     "force one grouped configuration, e.g. \"128x128x64 c1x1 cooperative\" (default: the size heuristic's)"},
    {"--tune", false, kGroupedGemm, "--tune",
     "choose the configuration by timing every one on the case's routing before the\n"
     "timed runs (GroupedGemmOptions::autotune) (default: the size heuristic's)"},
    {"--hook", true, kGemm, "--hook H",
     "none, wait_a_rows, report_rows, wait_source_rows (adds S = 0) or add_rows (the lower half\n"
     "of the rows added onto zeros): the hooked kernels alone (no flag waited on, nothing\n"
     "reported), to compare with the plain ones (default none)"},
    {"--any-order", false, kGemm, "--any-order",
     "with --hook wait_a_rows or wait_source_rows: the plan allows any tile order\n"
     "(GemmOptions::any_tile_order; its tuner also walks along M) (default: row-major order)"},
    {"--no-source-rows", true, kGemm, "--no-source-rows B,E",
     "with --hook wait_source_rows: rows [B, E) add no source and load none\n"
     "(AddSource::plain_begin/end; B and E multiples of 256, or M) (default: every row adds one)"},
    {"--cases", true, kDecode, "--cases LIST",
     "B,HQ,HKV,L[,P];... : batch, query heads, KV heads, keys per sequence, and a page size\n"
     "(paged KV) or none (contiguous) (default: batch 1 at 96/12 and 32/8 heads, KV 32K, 128K\n"
     "and 512K, contiguous; batch 4 at 32/8 and 8 at 96/12, 32K, contiguous; batch 8 and 32 at\n"
     "32K, page 16)"},
    {"--dist", false, kDecode, "--dist",
     "also time DistFlashDecode: each rank holds a contiguous shard (ceil(L / ranks) keys) of\n"
     "every sequence; reports FlashDecode over the shard alone, the distributed call, and their\n"
     "difference, the exchange and combine (default off)"},
    {"--splits", true, kDecode, "--splits N", "KV splits per (sequence, KV head), 0 to 128; 0: the plan chooses (default 0)"},
    {"--stages", true, kDecode, "--stages N",
     "the kernel's pipeline stages: 3 or 6 at head dim 128; 0: the plan chooses (6 for a contiguous\n"
     "cache filling less than 80 % of the SMs, else 3) (default 0)"},
    {"--merge", true, kDecode, "--merge M", "how splits merge: launch, last_block or auto (default auto: last_block on\n"
     "contiguous cases, launch on paged ones)"},
    {"--page-lookup", true, kDecode, "--page-lookup L",
     "paged cases: how a tile finds its pages: row, warp or auto (default auto: warp)"},
    {"--sweep", false, kDecode, "--sweep",
     "per case, time every kernel variant (half the splits, stage counts, merges, page lookups,\n"
     "and decision 0053's kernel: 3 stages, the merge launch, pages per row)\n"
     "against the default, in turn with it, and print each one's TB/s beside the default's\n"
     "(--splits, --stages, --merge and --page-lookup do not apply) (default off)"},
    {"--chunks", true, kOverlap, "--chunks N",
     "copy and signal chunks per rank's rows, 1 to 4096 (default: the plan's)"},
    {"--way", true, kAgGemm, "--way W",
     "the fused way: one_gemm or plain_steps (default: the plan times both and keeps the faster)"},
    {"--way", true, kGemmRs | kGemmAr, "--way W",
     "the fused way: per_step, one_launch, plain_first or one_launch_add (2 ranks)\n"
     "(default: the plan times every way it can run and keeps the fastest)"},
};

const OptionInfo* find_option(const std::string& flag) {
  for (const auto& o : kOptions)
    if (flag == o.flag) return &o;
  return nullptr;
}

// The operations any row of `flag` applies to.
unsigned ops_of(const std::string& flag) {
  unsigned ops = 0;
  for (const auto& o : kOptions)
    if (flag == o.flag) ops |= o.ops;
  return ops;
}

// Every variant of an operation, "auto" last ("all" means every one but auto).
const std::vector<std::string>& variants_of(const std::string& op) {
  static const std::vector<std::string> ag = {"push", "pull", "ce", "ll", "ring", "two_level", "auto"};
  static const std::vector<std::string> ar = {"ll", "one_shot", "two_shot", "ce", "two_level", "auto"};
  static const std::vector<std::string> rs = {"ll", "mesh", "ring", "ce", "two_level", "auto"};
  static const std::vector<std::string> gemm = {"auto"};
  if (op == "ep" || op == "moe_tp") return gemm;
  static const std::vector<std::string> overlap = {"fused", "sequential", "auto"};
  if (is_overlap_op(op)) return overlap;
  return op == "all_gather" ? ag : op == "all_reduce" ? ar : op == "gemm" || op == "decode" || op == "grouped_gemm" ? gemm : rs;
}

bool is_pow2(std::uint64_t v) { return v && (v & (v - 1)) == 0; }

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (true) {
    auto next = s.find(sep, pos);
    out.push_back(s.substr(pos, next - pos));
    if (next == std::string::npos) break;
    pos = next + 1;
  }
  return out;
}

int parse_int(const std::string& flag, const std::string& value, int lo, int hi) {
  std::size_t used = 0;
  long v = 0;
  try {
    v = std::stol(value, &used);
  } catch (...) {
    used = 0;
  }
  WEFT_REQUIRE(used == value.size() && !value.empty() && v >= lo && v <= hi, flag, " expects a whole number from ",
               lo, " to ", hi, ", got '", value, "'");
  return static_cast<int>(v);
}

// A GEMM dimension: digits only, 1 to kMaxShapeDim; nullopt otherwise.
std::optional<std::int64_t> parse_dim(const std::string& text) {
  if (text.empty() || text.size() > 12) return std::nullopt;
  std::int64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  if (v < 1 || v > kMaxShapeDim) return std::nullopt;
  return v;
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

// "a", "a and b", "a, b and c".
std::string join_and(const std::vector<std::string>& v) {
  std::string out;
  for (std::size_t i = 0; i < v.size(); ++i) out += (i == 0 ? "" : i + 1 == v.size() ? " and " : ", ") + v[i];
  return out;
}

std::vector<std::string> op_names(unsigned ops) {
  std::vector<std::string> names;
  for (std::size_t i = 0; i < kOpCount; ++i)
    if (ops & (1u << i)) names.push_back(kOpInfo[i].name);
  return names;
}

// The flags `op` takes, in the help's order.
std::vector<std::string> flags_of(const std::string& op) {
  std::vector<std::string> flags;
  for (const auto& o : kOptions)
    if ((o.ops & op_bit(op)) && std::find(flags.begin(), flags.end(), o.flag) == flags.end()) flags.push_back(o.flag);
  return flags;
}

void require_known_op(const std::string& op) {
  WEFT_REQUIRE(op_bit(op) != 0, "unknown operation '", op, "': expected one of ", join(kOps),
               " ('weft-bench --help' says what each measures)");
}

// One help row: the label in a column, the text beside it, continuation lines indented.
void add_row(std::string& out, const std::string& label, const std::string& text) {
  constexpr std::size_t kColumn = 24;
  std::string line = "  " + label;
  if (line.size() + 1 > kColumn) {
    out += line + "\n";
    line.clear();
  }
  std::size_t pos = 0;
  while (true) {
    const std::size_t next = text.find('\n', pos);
    line.resize(kColumn, ' ');
    out += line + text.substr(pos, next - pos) + "\n";
    if (next == std::string::npos) break;
    line.clear();
    pos = next + 1;
  }
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (std::size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
  return s;
}

// The names an option takes, and what each means: the one place that knows them.
const VariantName<GemmHook> kHooks[] = {{GemmHook::none, "none"},
                                        {GemmHook::wait_a_rows, "wait_a_rows"},
                                        {GemmHook::report_rows, "report_rows"},
                                        {GemmHook::wait_source_rows, "wait_source_rows"},
                                        {GemmHook::add_rows, "add_rows"}};
const VariantName<FusedWay> kWays[] = {{FusedWay::ring_per_step, "per_step"},
                                       {FusedWay::ring_one_launch, "one_launch"},
                                       {FusedWay::ring_plain_first, "plain_first"},
                                       {FusedWay::one_launch_add, "one_launch_add"}};
const VariantName<SampleOrder> kOrders[] = {{SampleOrder::fixed, "fixed"}, {SampleOrder::shuffled, "shuffled"}};
const VariantName<AgWay> kAgWays[] = {{AgWay::one_gemm, "one_gemm"}, {AgWay::plain_steps, "plain_steps"}};
// The decode kernel's options, by the names to_string gives them.
const VariantName<DecodeMerge> kMerges[] = {{DecodeMerge::automatic, "auto"},
                                            {DecodeMerge::launch, "launch"},
                                            {DecodeMerge::last_block, "last_block"}};
const VariantName<PageLookup> kPageLookups[] = {{PageLookup::automatic, "auto"},
                                                {PageLookup::per_row, "row"},
                                                {PageLookup::per_warp, "warp"}};

// One size of --bytes, 1 to kMaxBenchBytes; `what` names its place ("size", "range end").
std::uint64_t parse_one_size(const std::string& text, const std::string& item, const char* what) {
  std::uint64_t v = 0;
  try {
    v = parse_bytes(text, std::string("--bytes ") + what);
  } catch (const Error&) {
    // A well-formed number too large for 64 bits is a size above the bound, not a typo.
    std::size_t digits = 0;
    while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
    std::string suffix = text.substr(digits);
    for (char& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    static const char* const kSuffixes[] = {"", "B", "K", "KB", "KIB", "M", "MB", "MIB", "G", "GB", "GIB",
                                            "T", "TB", "TIB"};
    const bool well_formed = digits > 0 && std::find(std::begin(kSuffixes), std::end(kSuffixes), suffix) !=
                                               std::end(kSuffixes);
    if (!well_formed) throw;
    v = kMaxBenchBytes + 1;
  }
  WEFT_REQUIRE(v > 0, "--bytes sizes must be positive, got '", item, "'");
  WEFT_REQUIRE(v <= kMaxBenchBytes, "--bytes ", what, " '", text, "'",
               text == item ? std::string() : str(" (in '", item, "')"), " is above ", format_bytes(kMaxBenchBytes),
               " (2^50 bytes), the largest per-rank size weft-bench takes");
  return v;
}

}  // namespace

int dtype_bytes(const std::string& dtype) {
  if (dtype == "bf16" || dtype == "fp16") return 2;
  if (dtype == "fp32") return 4;
  WEFT_FAIL("unknown --dtype '", dtype, "': expected bf16, fp16 or fp32");
}

std::vector<std::uint64_t> parse_size_list(const std::string& text) {
  WEFT_REQUIRE(!text.empty(), "--bytes needs a size list such as 1K,64K or a range such as 1K:256M");
  std::set<std::uint64_t> sizes;
  for (const std::string& item : split(text, ',')) {
    auto colon = item.find(':');
    if (colon == std::string::npos) {
      sizes.insert(parse_one_size(item, item, "size"));
      continue;
    }
    const std::uint64_t lo = parse_one_size(item.substr(0, colon), item, "range start");
    const std::uint64_t hi = parse_one_size(item.substr(colon + 1), item, "range end");
    WEFT_REQUIRE(is_pow2(lo) && is_pow2(hi) && lo <= hi, "--bytes range '", item,
                 "' must run between powers of two, low to high (e.g. 1K:256M)");
    // hi <= kMaxBenchBytes, so no doubling here leaves 64 bits.
    for (std::uint64_t v = lo;; v *= 2) {
      sizes.insert(v);
      if (v >= hi) break;
    }
  }
  return {sizes.begin(), sizes.end()};
}

std::vector<std::array<std::int64_t, 3>> parse_shapes(const std::string& text) {
  std::vector<std::array<std::int64_t, 3>> shapes;
  for (std::string item : split(text, ';')) {
    const std::string given = item;
    for (char& c : item)
      if (c == 'x' || c == 'X') c = ',';
    auto dims = split(item, ',');
    std::array<std::int64_t, 3> s{};
    bool ok = dims.size() == 3;
    for (std::size_t i = 0; ok && i < 3; ++i) {
      const auto d = parse_dim(dims[i]);
      ok = d.has_value();
      if (ok) s[i] = *d;
    }
    WEFT_REQUIRE(ok, "--shapes: '", given, "' is not M,N,K with three positive integers, each at most ", kMaxShapeDim,
                 " (e.g. 8192,14336,8192; shapes separated by ';')");
    shapes.push_back(s);
  }
  return shapes;
}

std::vector<DecodeCase> parse_decode_cases(const std::string& text) {
  std::vector<DecodeCase> cases;
  for (const std::string& item : split(text, ';')) {
    const std::vector<std::string> f = split(item, ',');
    std::vector<std::int64_t> v;
    bool ok = f.size() == 4 || f.size() == 5;
    for (std::size_t i = 0; ok && i < f.size(); ++i) {
      const auto d = parse_dim(f[i]);
      ok = d.has_value();
      if (ok) v.push_back(*d);
    }
    WEFT_REQUIRE(ok, "--cases: '", item, "' is not B,HQ,HKV,L or B,HQ,HKV,L,P (positive integers, at most ",
                 kMaxShapeDim, "; cases separated by ';')");
    DecodeCase c{v[0], v[1], v[2], v[3], f.size() == 5 ? v[4] : 0};
    WEFT_REQUIRE(c.q_heads % c.kv_heads == 0, "--cases: '", item, "': query heads ", c.q_heads,
                 " must be a multiple of KV heads ", c.kv_heads);
    cases.push_back(c);
  }
  return cases;
}

std::vector<MoeTpCase> parse_moe_tp_cases(const std::string& text) {
  std::vector<MoeTpCase> cases;
  for (const std::string& item : split(text, ';')) {
    const std::vector<std::string> f = split(item, ',');
    std::vector<std::int64_t> v;
    bool ok = f.size() == 5;
    for (std::size_t i = 0; ok && i < f.size(); ++i) {
      const auto d = parse_dim(f[i]);
      ok = d.has_value();
      if (ok) v.push_back(*d);
    }
    WEFT_REQUIRE(ok, "--cases: '", item, "' is not T,H,F,E,k (positive integers, at most ", kMaxShapeDim,
                 "; cases separated by ';')");
    WEFT_REQUIRE(v[1] % 8 == 0 && v[2] % 8 == 0, "--cases: '", item, "': H = ", v[1], " and F = ", v[2],
                 " must be multiples of 8 (16-byte rows)");
    WEFT_REQUIRE(v[3] <= 1024 && v[4] <= 32 && v[4] <= v[3], "--cases: '", item, "': E = ", v[3], " (at most 1024)",
                 " and k = ", v[4], " (at most 32 and at most E) are out of range");
    cases.push_back({v[0], v[1], v[2], static_cast<int>(v[3]), static_cast<int>(v[4])});
  }
  return cases;
}

const char* sample_order_name(SampleOrder order) {
  for (const auto& entry : kOrders)
    if (entry.value == order) return entry.name;
  return "unknown";
}

bool is_overlap_op(const std::string& op) { return op == "ag_gemm" || op == "gemm_rs" || op == "gemm_ar"; }

std::string bench_usage() {
  std::string out =
      "usage: weftrun -n N weft-bench OP [options]   time OP against its baseline on N GPUs, in one run\n"
      "       weft-bench OP --help                   OP's options, with their defaults\n"
      "\noperations:\n";
  for (const auto& op : kOpInfo) add_row(out, op.name, op.summary);
  out += "\noptions every operation takes (each operation's --help lists the rest):\n";
  for (const auto& o : kOptions)
    if (o.ops == kEvery && o.text) add_row(out, o.label, o.text);
  out += "\nexit status: 0 done, 1 runtime failure (no GPU, rendezvous, CUDA), 2 bad arguments, 3 a check failed\n";
  return out;
}

std::string bench_usage(const std::string& op) {
  require_known_op(op);
  const unsigned bit = op_bit(op);
  const OpInfo& info = *std::find_if(std::begin(kOpInfo), std::end(kOpInfo), [&](const OpInfo& i) { return op == i.name; });
  std::string out = str("usage: weftrun -n N weft-bench ", op, " [options]\n", op, ": ", info.summary, "\n");
  if (*info.about) out += str(info.about, "\n");
  out += "\noptions:\n";
  std::vector<std::string> named;
  for (const auto& v : variants_of(op))
    if (v != "auto") named.push_back(v);
  for (const auto& o : kOptions)
    if ((o.ops & bit) && o.text) add_row(out, o.label, replace_all(o.text, "{variants}", join(named)));
  return out;
}

BenchArgs parse_bench_args(const std::vector<std::string>& argv) {
  BenchArgs args;
  std::vector<std::string> rest(argv.begin() + std::min<std::size_t>(1, argv.size()), argv.end());

  // The operation and the options given, in order. With --help anywhere, the
  // help wins over every other mistake: the operation's, or the overview.
  const bool help = std::find_if(rest.begin(), rest.end(), [](const std::string& a) {
                      return a == "-h" || a == "--help";
                    }) != rest.end();
  struct Given {
    std::string flag, value;
  };
  std::vector<Given> given;
  std::string op;
  for (std::size_t i = 0; i < rest.size(); ++i) {
    const std::string& a = rest[i];
    if (a == "-h" || a == "--help") continue;
    if (a.size() > 1 && a[0] == '-' && !std::isdigit(static_cast<unsigned char>(a[1]))) {
      const OptionInfo* o = find_option(a);
      if (!o) {
        if (help) continue;
        // The operation may come later; name it if it does.
        std::string named = op;
        for (std::size_t j = i + 1; named.empty() && j < rest.size(); ++j)
          if (op_bit(rest[j])) named = rest[j];
        if (named.empty() || !op_bit(named))
          WEFT_FAIL("unknown option '", a, "' ('weft-bench --help' lists the operations, 'weft-bench OP --help' ",
                    "the options of each)");
        WEFT_FAIL("unknown option '", a, "': ", named, " takes ", join(flags_of(named)), " ('weft-bench ", named,
                  " --help' says what each means)");
      }
      std::string value;
      if (o->takes_value) {
        const bool has = i + 1 < rest.size() && rest[i + 1].rfind("--", 0) != 0;
        if (!has && help) continue;
        WEFT_REQUIRE(has, a, " needs a value (", o->label, ")");
        value = rest[++i];
      }
      given.push_back({a, value});
    } else if (op.empty()) {
      op = a;
    } else if (!help) {
      WEFT_FAIL("unexpected argument '", a, "' (the operation is already '", op, "')");
    }
  }
  if (help) throw HelpRequested{op.empty() ? bench_usage() : bench_usage(op)};
  WEFT_REQUIRE(!op.empty(), "no operation given: expected one of ", join(kOps), "\n\n", bench_usage());
  require_known_op(op);
  args.op = op;
  for (const Given& g : given)
    WEFT_REQUIRE(ops_of(g.flag) & op_bit(op), g.flag, " is for ", join_and(op_names(ops_of(g.flag))), ", got '", op,
                 "' ('weft-bench ", op, " --help' lists its options)");

  std::string bytes = "1K:256M", variants, way;
  std::vector<std::int64_t> m_list;
  std::int64_t n_value = 0, k_value = 0;
  int grouped_experts = 0;  // grouped_gemm --experts (0: the default shapes' own, 8 with --m)
  bool shapes_given = false;
  // --n N, --k K: one dimension each.
  auto one_dim = [](const std::string& flag, const std::string& v) {
    const auto d = parse_dim(v);
    WEFT_REQUIRE(d.has_value(), flag, " expects a positive integer, at most ", kMaxShapeDim, " (e.g. ", flag,
                 " 8192), got '", v, "'");
    return *d;
  };
  for (const Given& g : given) {
    const std::string& a = g.flag;
    const std::string& v = g.value;
    if (a == "--bytes") bytes = v;
    else if (a == "--variant") variants = v;
    else if (a == "--dtype") args.dtype = v;
    else if (a == "--check") args.check = true;
    else if (a == "--json") args.json = true;
    else if (a == "--samples") args.samples = parse_int(a, v, 1, 100000);
    else if (a == "--warmup") args.warmup = parse_int(a, v, 0, 100000);
    else if (a == "--no-hold") args.hold = false;
    else if (a == "--enqueue") args.enqueue = true;
    else if (a == "--order") args.order = parse_name(kOrders, v, a);
    else if (a == "--max-sms") args.max_sms = parse_int(a, v, 0, 1024);
    else if (a == "--chunks") args.chunks = parse_int(a, v, 1, 4096);
    else if (a == "--way") way = v;  // its names depend on the operation
    else if (a == "--soak") args.soak_s = parse_int(a, v, 1, 600);
    else if (a == "--cases" && op == "moe_tp") args.moe_tp_cases = parse_moe_tp_cases(v);
    else if (a == "--cases") args.decode_cases = parse_decode_cases(v);
    else if (a == "--dist") args.dist = true;
    else if (a == "--splits") args.splits = parse_int(a, v, 0, 128);
    else if (a == "--stages") args.stages = parse_int(a, v, 0, 6);
    else if (a == "--merge") args.merge = parse_name(kMerges, v, a);
    else if (a == "--page-lookup") args.page_lookup = parse_name(kPageLookups, v, a);
    else if (a == "--sweep") args.sweep = true;
    else if (a == "--shapes") {
      args.shapes = parse_shapes(v);
      shapes_given = true;
    }
    else if (a == "--b-layout") args.b_layout = v;
    else if (a == "--out") args.out_dtype = v;
    else if (a == "--config") args.config = v;
    else if (a == "--hook") args.hook = parse_name(kHooks, v, a);
    else if (a == "--any-order") args.any_order = true;
    else if (a == "--tune") args.grouped_tune = true;
    else if (a == "--no-source-rows") {
      const std::vector<std::string> bounds = split(v, ',');
      WEFT_REQUIRE(bounds.size() == 2, "--no-source-rows expects B,E (rows [B, E) without a source), got '", v, "'");
      args.no_source_begin = parse_int(a, bounds[0], 0, 1 << 30);
      args.no_source_end = parse_int(a, bounds[1], 0, 1 << 30);
      WEFT_REQUIRE(args.no_source_begin < args.no_source_end, "--no-source-rows expects B < E, got '", v, "'");
    }
    else if (a == "--m") {
      m_list.clear();
      for (const std::string& item : split(v, ',')) {
        const auto d = parse_dim(item);
        WEFT_REQUIRE(d.has_value(), "--m expects a positive integer, or a comma list of them, each at most ",
                     kMaxShapeDim, " (e.g. --m 2048,4096), got '", v, "'",
                     item == v ? std::string() : str(" ('", item, "' is not one)"));
        m_list.push_back(*d);
      }
    }
    else if (a == "--n") n_value = one_dim(a, v);
    else if (a == "--tokens") args.ep_tokens = parse_int(a, v, 1, 1 << 20);
    else if (a == "--hidden") args.ep_hidden = parse_int(a, v, 8, 1 << 16);
    else if (a == "--topk") args.ep_topk = parse_int(a, v, 1, 32);
    else if (a == "--experts" && op == "grouped_gemm") grouped_experts = parse_int(a, v, 1, 1 << 16);
    else if (a == "--experts") args.ep_experts = parse_int(a, v, 1, 1024);
    else if (a == "--ll-tokens") args.ep_ll_tokens = static_cast<int>(parse_int(a, v, 0, 4096));
    else if (a == "--routing") args.routing = routing_name(parse_routing(v));
    else if (a == "--layout") args.b_layout = v;
    else if (a == "--k") k_value = one_dim(a, v);
  }
  if (!way.empty() && args.op == "ag_gemm") args.ag_way = parse_name(kAgWays, way, "--way");
  else if (!way.empty()) args.way = parse_name(kWays, way, "--way");
  WEFT_REQUIRE(args.no_source_begin == args.no_source_end || args.hook == GemmHook::wait_source_rows,
               "--no-source-rows is for gemm with --hook wait_source_rows");
  args.bytes = parse_size_list(bytes);
  if (variants.empty()) variants = is_overlap_op(args.op) ? "auto" : "all";
  if (!m_list.empty() || n_value || k_value) {
    WEFT_REQUIRE(!m_list.empty() && n_value && k_value,
                 "--m, --n and --k go together (e.g. --m 2048,4096 --n 28672 --k 8192)");
    WEFT_REQUIRE(!shapes_given, "give either --shapes or --m/--n/--k, not both");
    args.shapes.clear();
    for (std::int64_t m : m_list) args.shapes.push_back({m, n_value, k_value});
  }
  if (args.op == "ep") {
    WEFT_REQUIRE(args.ep_hidden % 8 == 0, "--hidden ", args.ep_hidden,
                 " is not a multiple of 8: tokens move as 16-byte vectors of 8 bf16");
    WEFT_REQUIRE(args.ep_topk <= args.ep_experts, "--topk ", args.ep_topk, " exceeds --experts ", args.ep_experts,
                 ": a token lists distinct experts");
  }
  if (args.op == "ag_gemm" && args.shapes.empty())
    args.shapes = parse_shapes("2048,28672,8192;4096,28672,8192;8192,28672,8192;2048,8192,8192;4096,8192,8192;"
                               "8192,8192,8192;4096,4096,8192");
  if ((args.op == "gemm_rs" || args.op == "gemm_ar") && args.shapes.empty())
    args.shapes = parse_shapes("2048,8192,28672;4096,8192,28672;8192,8192,28672;2048,8192,8192;4096,8192,8192;"
                               "8192,8192,8192;4096,4096,8192");
  WEFT_REQUIRE(args.b_layout == "nk" || args.b_layout == "kn", args.op == "grouped_gemm" ? "--layout" : "--b-layout",
               " expects nk or kn, got '", args.b_layout, "'");
  if (args.op == "grouped_gemm") {
    WEFT_REQUIRE(!args.grouped_tune || args.config.empty(), "grouped_gemm: --tune times every configuration and "
                 "--config forces one ('", args.config, "'): give one of them");
    if (args.shapes.empty()) {  // issue 33's shapes: Mixtral-, Qwen3-30B-A3B- and DeepSeek-like up-projections
      args.grouped_cases = {{16384, 7168, 4096, 8}, {65536, 768, 2048, 128}, {32768, 2048, 7168, 32}};
      if (grouped_experts)
        for (GroupedCase& c : args.grouped_cases) c.experts = grouped_experts;
    } else {
      for (const auto& s : args.shapes) args.grouped_cases.push_back({s[0], s[1], s[2], grouped_experts ? grouped_experts : 8});
    }
    for (const GroupedCase& c : args.grouped_cases) {
      WEFT_REQUIRE(c.n % 8 == 0 && c.k % 8 == 0, "grouped_gemm: N = ", c.n, " and K = ", c.k,
                   " must be multiples of 8 (16-byte rows for TMA)");
    }
    WEFT_REQUIRE(args.dtype == "bf16" || args.dtype == "fp16", "grouped_gemm takes --dtype bf16 or fp16, got '",
                 args.dtype, "'");
  }
  if (args.op == "moe_tp") {
    if (args.moe_tp_cases.empty())  // issue 33's layers: the grouped GEMM shapes' rows as T x k
      args.moe_tp_cases = parse_moe_tp_cases("8192,4096,7168,8,2;8192,2048,768,128,8;4096,7168,2048,32,8");
    WEFT_REQUIRE(args.dtype == "bf16" || args.dtype == "fp16", "moe_tp takes --dtype bf16 or fp16, got '", args.dtype,
                 "'");
  }
  if (args.op == "gemm" && args.shapes.empty())  // the per-rank GEMMs of the tensor-parallel benchmark shapes
    args.shapes = parse_shapes("8192,14336,8192;4096,14336,8192;2048,14336,8192;1000,14336,8192;8192,4096,8192;"
                               "4096,4096,8192;8192,8192,14336;4096,8192,14336;2048,8192,14336");
  if (args.op == "decode" && args.decode_cases.empty())
    args.decode_cases = parse_decode_cases("1,96,12,32768;1,96,12,131072;1,96,12,524288;1,32,8,32768;1,32,8,131072;"
                                           "1,32,8,524288;4,32,8,32768;8,96,12,32768;8,96,12,32768,16;8,32,8,32768,16;32,96,12,32768,16;"
                                           "32,32,8,32768,16");
  WEFT_REQUIRE(args.op != "decode" || args.dtype == "bf16" || args.dtype == "fp16",
               "decode takes --dtype bf16 or fp16, got '", args.dtype, "'");
  WEFT_REQUIRE(!args.sweep || !args.dist, "--sweep and --dist time different things: give one");
  const int elem = dtype_bytes(args.dtype);
  if (args.op == "gemm") {
    WEFT_REQUIRE(args.dtype != "fp32", "gemm takes --dtype bf16 or fp16, got 'fp32'");
    if (!args.out_dtype.empty()) {
      dtype_bytes(args.out_dtype);
      WEFT_REQUIRE(args.out_dtype == args.dtype || args.out_dtype == "fp32", "--out expects the input type (",
                   args.dtype, ") or fp32, got '", args.out_dtype, "'");
    }
  }
  WEFT_REQUIRE(!is_overlap_op(args.op) || args.dtype == "bf16" || args.dtype == "fp16", args.op,
               " takes --dtype bf16 or fp16 (the types of its hooked GEMMs), got '", args.dtype, "'");
  for (auto b : args.bytes)
    WEFT_REQUIRE(b % elem == 0, "--bytes ", b, " is not a whole number of ", args.dtype, " elements (", elem,
                 " bytes each)");
  // "all": every variant but auto and, for the collectives, two_level (the
  // schedule across nodes, timed on one node only when named); where some
  // peer is not mapped, two_level alone, as the one-node variants refuse there.
  const auto& known = variants_of(args.op);
  const bool collective = args.op == "all_gather" || args.op == "all_reduce" || args.op == "reduce_scatter";
  auto add_across = [&](const std::string& v) {
    if (std::find(args.variants_across_nodes.begin(), args.variants_across_nodes.end(), v) ==
        args.variants_across_nodes.end())
      args.variants_across_nodes.push_back(v);
  };
  for (const std::string& v : split(variants, ',')) {
    if (v == "all") {
      for (auto& x : known)
        if (x != "auto" && x != "two_level") args.variants.push_back(x);
      if (collective) add_across("two_level");
      else
        for (auto& x : known)
          if (x != "auto") args.variants_across_nodes.push_back(x);
      continue;
    }
    WEFT_REQUIRE(std::find(known.begin(), known.end(), v) != known.end(), "unknown --variant '", v, "' for ",
                 args.op, ": expected ", join(known), " or all");
    args.variants.push_back(v);
    if (collective) add_across(v);
    else args.variants_across_nodes.push_back(v);
  }
  return args;
}

std::uint64_t two_level_heap_bytes(const std::string& op, std::uint64_t bytes, int elem, int world, int per_node) {
  WEFT_REQUIRE(elem > 0 && world > 0 && per_node > 0 && world % per_node == 0, "two_level_heap_bytes: ", world,
               " ranks do not form nodes of ", per_node, " (", elem, "-byte elements)");
  constexpr std::uint64_t kRound = std::uint64_t{2} << 20;  // far above the heap's 256-byte block alignment
  auto block = [](std::uint64_t b) { return (b + kRound - 1) / kRound * kRound; };
  const std::uint64_t W = world, L = per_node, N = W / L, e = elem, f = sizeof(float);
  std::uint64_t total = kRound;  // the flags: [2 parities][slots][blocks] of 8 bytes, slots and blocks few
  if (op == "reduce_scatter") {  // count per rank's block; staging [2][N x L] blocks, node sums [2][N], send [N]
    const std::uint64_t count = bytes / (W * e);
    total += block(2 * N * L * count * e) + block(2 * N * count * f) + block(N * count * f);
  } else if (op == "all_reduce") {
    // Slices of ceil(count / L), 16-byte aligned: staging [2][L], node sums [2][N] in fp32, results [2].
    const std::uint64_t count = bytes / e, grain = std::max<std::uint64_t>(1, 16 / e);
    const std::uint64_t slice = ((count + L - 1) / L + grain - 1) / grain * grain + grain;
    total += block(2 * L * slice * e) + block(2 * N * slice * f) + block(2 * slice * e);
  }
  return total;  // all_gather: its flags only (the output is the caller's)
}

}  // namespace weft::bench
