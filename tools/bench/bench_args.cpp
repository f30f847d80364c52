#include "bench_args.hpp"

#include <algorithm>
#include <set>

#include "weft/core/env.hpp"
#include "weft/core/error.hpp"
#include "weft/ops/collective.hpp"

namespace weft::bench {
namespace {

const std::vector<std::string> kOps = {"all_gather", "all_reduce", "reduce_scatter", "gemm",
                                       "ag_gemm",    "gemm_rs",    "gemm_ar"};

// Every variant of an operation, "auto" last ("all" means every one but auto).
const std::vector<std::string>& variants_of(const std::string& op) {
  static const std::vector<std::string> ag = {"push", "pull", "ce", "ll", "ring", "auto"};
  static const std::vector<std::string> ar = {"ll", "one_shot", "two_shot", "ce", "auto"};
  static const std::vector<std::string> rs = {"ll", "mesh", "ring", "ce", "auto"};
  static const std::vector<std::string> gemm = {"auto"};
  static const std::vector<std::string> overlap = {"fused", "sequential", "auto"};
  if (is_overlap_op(op)) return overlap;
  return op == "all_gather" ? ag : op == "all_reduce" ? ar : op == "gemm" ? gemm : rs;
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

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
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
      std::uint64_t v = parse_bytes(item, "--bytes size");
      WEFT_REQUIRE(v > 0, "--bytes sizes must be positive, got '", item, "'");
      sizes.insert(v);
      continue;
    }
    std::uint64_t lo = parse_bytes(item.substr(0, colon), "--bytes range start");
    std::uint64_t hi = parse_bytes(item.substr(colon + 1), "--bytes range end");
    WEFT_REQUIRE(is_pow2(lo) && is_pow2(hi) && lo <= hi, "--bytes range '", item,
                 "' must run between powers of two, low to high (e.g. 1K:256M)");
    for (std::uint64_t v = lo; v <= hi; v *= 2) sizes.insert(v);
  }
  return {sizes.begin(), sizes.end()};
}

std::vector<std::array<std::int64_t, 3>> parse_shapes(const std::string& text) {
  std::vector<std::array<std::int64_t, 3>> shapes;
  for (std::string item : split(text, ';')) {
    for (char& c : item)
      if (c == 'x' || c == 'X') c = ',';
    auto dims = split(item, ',');
    std::array<std::int64_t, 3> s{};
    bool ok = dims.size() == 3;
    for (std::size_t i = 0; ok && i < 3; ++i) {
      std::size_t used = 0;
      try {
        s[i] = std::stoll(dims[i], &used);
      } catch (...) {
        used = 0;
      }
      ok = used == dims[i].size() && !dims[i].empty() && s[i] > 0;
    }
    WEFT_REQUIRE(ok, "--shapes: '", item, "' is not M,N,K with three positive integers (e.g. 8192,14336,8192)");
    shapes.push_back(s);
  }
  return shapes;
}

const char* sample_order_name(SampleOrder order) {
  for (const auto& entry : kOrders)
    if (entry.value == order) return entry.name;
  return "unknown";
}

bool is_overlap_op(const std::string& op) { return op == "ag_gemm" || op == "gemm_rs" || op == "gemm_ar"; }

std::string bench_usage() {
  return "usage: weftrun -n N weft-bench OP [options]\n"
         "  OP                 all_gather, all_reduce, reduce_scatter or gemm\n"
         "  --bytes LIST       per-rank message sizes: 1K,64K,1M or a power-of-two range 1K:256M (default 1K:256M)\n"
         "                     (all_gather: input per rank; all_reduce: buffer; reduce_scatter: input per rank)\n"
         "  --variant LIST     all_gather: push, pull, ce, ll, ring; all_reduce: ll, one_shot, two_shot, ce;\n"
         "                     reduce_scatter: ll, mesh, ring, ce; or auto, or all (default: all; variants\n"
         "                     are skipped above their size limits)\n"
         "  --dtype T          bf16 (default), fp16, fp32: sizes must be whole elements\n"
         "  --check            verify bitwise against NCCL (fresh random data, poisoned outputs)\n"
         "  --json             one JSON object per line\n"
         "  --samples N        timed samples per point, median reported (default 15)\n"
         "  --warmup N         untimed samples first (default 3)\n"
         "  --no-hold          let each sample's GPU work start while the host still enqueues it (by default the\n"
         "                     stream is held until the whole sample is enqueued, so events time the GPU, not the host)\n"
         "  --order O          gemm, ag_gemm, gemm_rs, gemm_ar: the contenders' order in each round of samples,\n"
         "                     fixed (default: each always follows the same one) or shuffled (a fresh order each\n"
         "                     round, the same on every rank)\n"
         "  --max-sms N        cap on the SMs an SM variant may occupy (default: the plan chooses)\n"
         "  --chunks N         ag_gemm, gemm_rs, gemm_ar: copy and signal chunks per rank's rows (default: the plan's)\n"
         "  --way W            gemm_rs, gemm_ar: the fused way, per_step, one_launch, plain_first or\n"
         "                     one_launch_add (2 ranks);\n"
         "                     ag_gemm: one_gemm or plain_steps\n"
         "                     (default: the plan times every way it can run)\n"
         "  --soak S           gemm, ag_gemm, gemm_rs, gemm_ar: after timing, run each contender alone, back to back,\n"
         "                     for about S seconds, and print its wall-clock window ([weft-bench] soak lines), so\n"
         "                     a clock log (nvidia-smi) can say at what SM clock and power each one ran\n"
         "gemm (each rank times its own GPU against cuBLAS):\n"
         "  --shapes LIST      M,N,K;M,N,K... (C[M,N] = A[M,K] x B^T; default: the tensor-parallel shapes)\n"
         "  --b-layout L       nk (B stored [N,K], default) or kn (B stored [K,N])\n"
         "  --out T            output type: the input type (default) or fp32\n"
         "  --config NAME      force one GEMM configuration\n"
         "  --hook H           none (default), wait_a_rows, report_rows, wait_source_rows (adds S = 0) or add_rows\n"
         "                     (the lower half of the rows added onto zeros):\n"
         "                     the hooked kernels alone (no flag waited on, nothing reported),\n"
         "                     to compare with the plain ones\n"
         "  --any-order        with wait_a_rows or wait_source_rows: the plan allows any tile order\n"
         "                     (GemmOptions::any_tile_order; its tuner also walks along M)\n"
         "  --no-source-rows B,E  with wait_source_rows: rows [B, E) add no source and load none\n"
         "                     (GemmArgs::no_source_begin/end; B and E multiples of 256, or M)\n"
         "ag_gemm, gemm_rs, gemm_ar (tensor-parallel operators against NCCL + cuBLAS, PyTorch-style shapes:\n"
         "N is the full output width, each rank computing N/W columns for ag_gemm; K the full depth, K/W per rank,\n"
         "for gemm_rs and gemm_ar):\n"
         "  --shapes LIST      M,N,K;... (default: the acceptance shapes of docs/PERF.md)\n"
         "  --m LIST --n N --k K   the same as shapes (m1,N,K);(m2,N,K)...\n"
         "  --variant MODE     auto (default: the plan times fused and sequential and keeps the faster),\n"
         "                     fused, sequential, or a list\n";
}

BenchArgs parse_bench_args(const std::vector<std::string>& argv) {
  BenchArgs args;
  std::vector<std::string> rest(argv.begin() + std::min<std::size_t>(1, argv.size()), argv.end());
  std::string bytes = "1K:256M", variants, m_list, n_value, k_value, way;
  for (std::size_t i = 0; i < rest.size(); ++i) {
    const std::string& a = rest[i];
    auto value = [&]() -> const std::string& {
      WEFT_REQUIRE(i + 1 < rest.size(), a, " needs a value");
      return rest[++i];
    };
    if (a == "-h" || a == "--help") throw HelpRequested{bench_usage()};
    else if (a == "--bytes") bytes = value();
    else if (a == "--variant") variants = value();
    else if (a == "--dtype") args.dtype = value();
    else if (a == "--check") args.check = true;
    else if (a == "--json") args.json = true;
    else if (a == "--samples") args.samples = parse_int(a, value(), 1, 100000);
    else if (a == "--warmup") args.warmup = parse_int(a, value(), 0, 100000);
    else if (a == "--no-hold") args.hold = false;
    else if (a == "--order") args.order = parse_name(kOrders, value(), a);
    else if (a == "--max-sms") args.max_sms = parse_int(a, value(), 0, 1024);
    else if (a == "--chunks") args.chunks = parse_int(a, value(), 1, 4096);
    else if (a == "--way") way = value();  // its names depend on the operation
    else if (a == "--soak") args.soak_s = parse_int(a, value(), 1, 600);
    else if (a == "--shapes") args.shapes = parse_shapes(value());
    else if (a == "--b-layout") args.b_layout = value();
    else if (a == "--out") args.out_dtype = value();
    else if (a == "--config") args.config = value();
    else if (a == "--hook") args.hook = parse_name(kHooks, value(), a);
    else if (a == "--any-order") args.any_order = true;
    else if (a == "--no-source-rows") {
      const std::string text = value();
      const std::vector<std::string> bounds = split(text, ',');
      WEFT_REQUIRE(bounds.size() == 2, "--no-source-rows expects B,E (rows [B, E) without a source), got '", text, "'");
      args.no_source_begin = parse_int(a, bounds[0], 0, 1 << 30);
      args.no_source_end = parse_int(a, bounds[1], 0, 1 << 30);
      WEFT_REQUIRE(args.no_source_begin < args.no_source_end, "--no-source-rows expects B < E, got '", text, "'");
    }
    else if (a == "--m") m_list = value();
    else if (a == "--n") n_value = value();
    else if (a == "--k") k_value = value();
    else if (!a.empty() && a[0] == '-') WEFT_FAIL("unknown option '", a, "'\n", bench_usage());
    else if (args.op.empty()) args.op = a;
    else WEFT_FAIL("unexpected argument '", a, "' (the operation is already '", args.op, "')");
  }
  WEFT_REQUIRE(!args.op.empty(), "no operation given: expected one of ", join(kOps), "\n", bench_usage());
  WEFT_REQUIRE(std::find(kOps.begin(), kOps.end(), args.op) != kOps.end(), "unknown operation '", args.op,
               "': expected one of ", join(kOps));
  if (!way.empty() && args.op == "ag_gemm") args.ag_way = parse_name(kAgWays, way, "--way");
  else if (!way.empty()) args.way = parse_name(kWays, way, "--way");
  WEFT_REQUIRE(args.no_source_begin == args.no_source_end || (args.op == "gemm" && args.hook == GemmHook::wait_source_rows),
               "--no-source-rows is for gemm with --hook wait_source_rows");
  WEFT_REQUIRE(args.soak_s == 0 || is_overlap_op(args.op) || args.op == "gemm",
               "--soak is for gemm, ag_gemm, gemm_rs and gemm_ar, got '", args.op, "'");
  args.bytes = parse_size_list(bytes);
  if (variants.empty()) variants = is_overlap_op(args.op) ? "auto" : "all";
  if (!m_list.empty() || !n_value.empty() || !k_value.empty()) {
    WEFT_REQUIRE(!m_list.empty() && !n_value.empty() && !k_value.empty(),
                 "--m, --n and --k go together (e.g. --m 2048,4096 --n 28672 --k 8192)");
    WEFT_REQUIRE(args.shapes.empty(), "give either --shapes or --m/--n/--k, not both");
    std::string text;
    for (const std::string& m : split(m_list, ',')) text += (text.empty() ? "" : ";") + m + "," + n_value + "," + k_value;
    args.shapes = parse_shapes(text);
  }
  if (args.op == "ag_gemm" && args.shapes.empty())
    args.shapes = parse_shapes("2048,28672,8192;4096,28672,8192;8192,28672,8192;2048,8192,8192;4096,8192,8192;"
                               "8192,8192,8192;4096,4096,8192");
  if ((args.op == "gemm_rs" || args.op == "gemm_ar") && args.shapes.empty())
    args.shapes = parse_shapes("2048,8192,28672;4096,8192,28672;8192,8192,28672;2048,8192,8192;4096,8192,8192;"
                               "8192,8192,8192;4096,4096,8192");
  WEFT_REQUIRE(args.b_layout == "nk" || args.b_layout == "kn", "--b-layout expects nk or kn, got '", args.b_layout,
               "'");
  if (!args.out_dtype.empty()) dtype_bytes(args.out_dtype);
  if (args.op == "gemm" && args.shapes.empty())  // the per-rank GEMMs of the tensor-parallel benchmark shapes
    args.shapes = parse_shapes("8192,14336,8192;4096,14336,8192;2048,14336,8192;1000,14336,8192;8192,4096,8192;"
                               "4096,4096,8192;8192,8192,14336;4096,8192,14336;2048,8192,14336");
  const int elem = dtype_bytes(args.dtype);
  for (auto b : args.bytes)
    WEFT_REQUIRE(b % elem == 0, "--bytes ", b, " is not a whole number of ", args.dtype, " elements (", elem,
                 " bytes each)");
  const auto& known = variants_of(args.op);
  for (const std::string& v : split(variants, ',')) {
    if (v == "all") {
      for (auto& x : known)
        if (x != "auto") args.variants.push_back(x);
      continue;
    }
    WEFT_REQUIRE(std::find(known.begin(), known.end(), v) != known.end(), "unknown --variant '", v, "' for ",
                 args.op, ": expected ", join(known), " or all");
    args.variants.push_back(v);
  }
  return args;
}

}  // namespace weft::bench
