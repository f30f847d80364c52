// weft-bench's argument validation and help (no GPU needed), the binary's
// behaviour on bad input and on a machine without a GPU, and the sweep
// scripts' checks before they run anything. Every subprocess is bounded in time.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <sys/wait.h>

#include "bench_args.hpp"
#include "weft/core/error.hpp"

using namespace weft;
using namespace weft::bench;

namespace {
std::string error_of(std::vector<std::string> argv) {
  argv.insert(argv.begin(), "weft-bench");
  try {
    parse_bench_args(argv);
  } catch (const Error& e) {
    return e.what();
  } catch (const HelpRequested&) {
    return "help";
  }
  return "";
}

// The help text --help brings, or "" when parsing does not ask for help.
std::string help_of(std::vector<std::string> argv) {
  argv.insert(argv.begin(), "weft-bench");
  try {
    parse_bench_args(argv);
  } catch (const HelpRequested& h) {
    return h.text;
  } catch (const Error& e) {
    return std::string("error: ") + e.what();
  }
  return "";
}

// Whether `text` names `flag` as a word of its own ("--m" in "--m LIST", not in "--max-sms").
bool mentions(const std::string& text, const std::string& flag) {
  auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_'; };
  for (std::size_t at = text.find(flag); at != std::string::npos; at = text.find(flag, at + 1)) {
    const bool starts = at == 0 || !word(text[at - 1]);
    const bool ends = at + flag.size() == text.size() || !word(text[at + flag.size()]);
    if (starts && ends) return true;
  }
  return false;
}

std::pair<int, std::string> run(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  std::array<char, 512> buf{};
  while (p && fgets(buf.data(), buf.size(), p)) out += buf.data();
  int status = p ? pclose(p) : -1;
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

struct Bounded {
  int code = -1;         // exit status; 124 when the bound killed it
  double seconds = 0;    // wall time
  std::string output;    // stdout and stderr together
};

// `cmd` under coreutils' timeout: killed after `limit_s` seconds (exit 124).
Bounded run_bounded(const std::string& cmd, int limit_s) {
  const auto t0 = std::chrono::steady_clock::now();
  auto [code, out] = run("timeout -k 2 " + std::to_string(limit_s) + " " + cmd);
  return {code, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), out};
}

const std::vector<std::string> kAllOps = {"all_gather", "all_reduce", "reduce_scatter", "gemm",
                                          "ag_gemm",    "gemm_rs",    "gemm_ar",    "ep",         "decode",
                                          "grouped_gemm", "moe_tp"};
}  // namespace

TEST(BenchArgs, DefaultsCoverEveryVariantFrom1KTo256M) {
  BenchArgs a = parse_bench_args({"weft-bench", "all_gather"});
  EXPECT_EQ(a.op, "all_gather");
  ASSERT_EQ(a.bytes.size(), 19u);
  EXPECT_EQ(a.bytes.front(), 1024u);
  EXPECT_EQ(a.bytes.back(), 256u << 20);
  EXPECT_EQ(a.variants, (std::vector<std::string>{"push", "pull", "ce", "ll", "ring"}));
}

TEST(BenchArgs, SamplesAreHeldUnlessNoHold) {
  EXPECT_TRUE(parse_bench_args({"weft-bench", "gemm"}).hold);
  EXPECT_FALSE(parse_bench_args({"weft-bench", "gemm", "--no-hold"}).hold);
}

TEST(BenchArgs, EnqueueTimesTheHostOfTheCollectives) {
  EXPECT_FALSE(parse_bench_args({"weft-bench", "all_reduce"}).enqueue);
  const BenchArgs a = parse_bench_args({"weft-bench", "all_reduce", "--bytes", "1K", "--variant", "auto", "--enqueue"});
  EXPECT_TRUE(a.enqueue);
  EXPECT_EQ(a.bytes, (std::vector<std::uint64_t>{1024}));
  EXPECT_EQ(a.variants, (std::vector<std::string>{"auto"}));
  EXPECT_TRUE(parse_bench_args({"weft-bench", "all_gather", "--enqueue"}).enqueue);
  EXPECT_TRUE(parse_bench_args({"weft-bench", "reduce_scatter", "--enqueue"}).enqueue);
  for (const std::string op : {"gemm", "ag_gemm", "gemm_rs", "gemm_ar", "ep", "decode"})
    EXPECT_NE(error_of({op, "--enqueue"}).find("--enqueue is for all_gather, all_reduce and reduce_scatter, got '" + op),
              std::string::npos)
        << op;
  EXPECT_NE(bench_usage("all_reduce").find("--enqueue"), std::string::npos);
}

TEST(BenchArgs, OrderNamesTheContendersOrderInARound) {
  EXPECT_EQ(parse_bench_args({"weft-bench", "gemm_rs"}).order, SampleOrder::fixed);
  EXPECT_EQ(parse_bench_args({"weft-bench", "gemm_rs", "--order", "shuffled"}).order, SampleOrder::shuffled);
  EXPECT_EQ(parse_bench_args({"weft-bench", "gemm", "--order", "fixed"}).order, SampleOrder::fixed);
  EXPECT_NE(error_of({"ag_gemm", "--order", "random"}).find("expected one of fixed, shuffled"), std::string::npos);
  EXPECT_STREQ(sample_order_name(SampleOrder::fixed), "fixed");
  EXPECT_STREQ(sample_order_name(SampleOrder::shuffled), "shuffled");
}

TEST(BenchArgs, EachOperationHasItsVariants) {
  EXPECT_EQ(parse_bench_args({"weft-bench", "all_reduce"}).variants,
            (std::vector<std::string>{"ll", "one_shot", "two_shot", "ce"}));
  EXPECT_EQ(parse_bench_args({"weft-bench", "reduce_scatter", "--variant", "ring,auto"}).variants,
            (std::vector<std::string>{"ring", "auto"}));
}

TEST(BenchArgs, TwoLevelIsNamedOrMeantByAllAcrossNodes) {
  // "all" on one node: every one-node variant, as before; two_level (the
  // schedule across nodes) only when named. Across nodes "all" means two_level.
  for (const std::string op : {"all_gather", "all_reduce", "reduce_scatter"}) {
    const BenchArgs d = parse_bench_args({"weft-bench", op});
    EXPECT_EQ(std::find(d.variants.begin(), d.variants.end(), "two_level"), d.variants.end()) << op;
    EXPECT_EQ(d.variants_across_nodes, (std::vector<std::string>{"two_level"})) << op;
    const BenchArgs t = parse_bench_args({"weft-bench", op, "--variant", "two_level", "--bytes", "64K,1M", "--check"});
    EXPECT_EQ(t.variants, (std::vector<std::string>{"two_level"})) << op;
    EXPECT_EQ(t.variants_across_nodes, t.variants) << op;
    EXPECT_TRUE(t.check) << op;
    // Named one-node variants stay across nodes (their plans refuse there, naming the ranks).
    const BenchArgs m = parse_bench_args({"weft-bench", op, "--variant", "ll,two_level,auto"});
    EXPECT_EQ(m.variants, (std::vector<std::string>{"ll", "two_level", "auto"})) << op;
    EXPECT_EQ(m.variants_across_nodes, m.variants) << op;
    const BenchArgs a = parse_bench_args({"weft-bench", op, "--variant", "all,two_level,auto"});
    EXPECT_EQ(a.variants.back(), "auto") << op;
    EXPECT_EQ(a.variants[a.variants.size() - 2], "two_level") << op;
    EXPECT_EQ(a.variants_across_nodes, (std::vector<std::string>{"two_level", "auto"})) << op;
  }
  EXPECT_EQ(parse_bench_args({"weft-bench", "all_reduce"}).variants,
            (std::vector<std::string>{"ll", "one_shot", "two_shot", "ce"}));
  // The other operations have no two_level; their lists are the same across nodes.
  const BenchArgs o = parse_bench_args({"weft-bench", "ag_gemm", "--variant", "all"});
  EXPECT_EQ(o.variants, (std::vector<std::string>{"fused", "sequential"}));
  EXPECT_EQ(o.variants_across_nodes, o.variants);
  EXPECT_EQ(parse_bench_args({"weft-bench", "gemm_rs"}).variants_across_nodes, (std::vector<std::string>{"auto"}));
  EXPECT_NE(error_of({"ag_gemm", "--variant", "two_level"}).find("unknown --variant 'two_level' for ag_gemm"),
            std::string::npos);
  // The help says what all and auto mean across nodes, and what two_level needs.
  for (const std::string op : {"all_gather", "all_reduce", "reduce_scatter"}) {
    const std::string h = bench_usage(op);
    EXPECT_NE(h.find("all means two_level there, and auto takes it"), std::string::npos) << h;
    EXPECT_NE(h.find("weft-bench built with NVSHMEM"), std::string::npos) << h;
  }
}

TEST(BenchArgs, TwoLevelHeapRoomCoversThePlansStaging) {
  constexpr std::uint64_t MiB = std::uint64_t{1} << 20;
  // AllGather's two-level plan holds flags only (the output is the caller's).
  EXPECT_EQ(two_level_heap_bytes("all_gather", 256 * MiB, 2, 16, 8), 2 * MiB);
  // ReduceScatter, 4 ranks as 2 nodes of 2, 1 MiB of bf16 per rank (128Ki elements a block), each
  // buffer a whole 2 MiB: flags, staging [2][N x L] blocks (2 MiB), node sums [2][N] in fp32
  // (2 MiB), send [N] in fp32 (1 MiB).
  EXPECT_EQ(two_level_heap_bytes("reduce_scatter", MiB, 2, 4, 2), 2 * MiB + 2 * MiB + 2 * MiB + 2 * MiB);
  // At 256 MiB, the sizes src/ops/internode/reduce_scatter.cu allocates, and the flags.
  const std::uint64_t b = 256 * MiB, count = b / (4 * 2);
  EXPECT_EQ(two_level_heap_bytes("reduce_scatter", b, 2, 4, 2),
            2 * MiB + 2 * 4 * count * 2 + 2 * 2 * count * 4 + 2 * count * 4);
  // AllReduce, 16 ranks as 2 nodes of 8, 256 MiB of bf16: slices of about count / 8.
  const std::uint64_t ar = two_level_heap_bytes("all_reduce", b, 2, 16, 8), slice = b / 2 / 8;
  EXPECT_GE(ar, 2 * 8 * slice * 2 + 2 * 2 * slice * 4 + 2 * slice * 2);
  EXPECT_LE(ar, 2 * 8 * slice * 2 + 2 * 2 * slice * 4 + 2 * slice * 2 + 8 * MiB);
  // Fewer ranks per node hold more: 2 nodes of one rank each hold node sums of the whole buffer.
  EXPECT_GT(two_level_heap_bytes("all_reduce", b, 2, 2, 1), two_level_heap_bytes("all_reduce", b, 2, 16, 8));
  EXPECT_GE(two_level_heap_bytes("all_reduce", b, 4, 2, 1), 2 * b + 2 * 2 * b + 2 * b);
  // An odd element count still rounds up to whole 16-byte slices.
  EXPECT_GE(two_level_heap_bytes("all_reduce", 6, 2, 4, 2), 3 * MiB);
  try {
    two_level_heap_bytes("all_reduce", b, 2, 6, 4);
    ADD_FAILURE() << "6 ranks in nodes of 4 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("6 ranks do not form nodes of 4"), std::string::npos) << e.what();
  }
}

TEST(BenchArgs, GemmShapes) {
  BenchArgs a = parse_bench_args({"weft-bench", "gemm", "--shapes", "1000,14336,8192;8x16x32", "--b-layout", "kn"});
  ASSERT_EQ(a.shapes.size(), 2u);
  EXPECT_EQ(a.shapes[0], (std::array<std::int64_t, 3>{1000, 14336, 8192}));
  EXPECT_EQ(a.shapes[1], (std::array<std::int64_t, 3>{8, 16, 32}));
  EXPECT_EQ(a.b_layout, "kn");
  EXPECT_EQ(parse_bench_args({"weft-bench", "gemm"}).shapes.size(), 9u) << "defaults: the TP benchmark shapes";
}

TEST(BenchArgs, ParsesListsRangesAndFlags) {
  BenchArgs a = parse_bench_args({"weft-bench", "all_gather", "--bytes", "4K:16K,1M,4K", "--variant", "pull,auto",
                                  "--check", "--json", "--samples", "7", "--warmup", "0", "--max-sms", "8",
                                  "--dtype", "fp32"});
  EXPECT_EQ(a.bytes, (std::vector<std::uint64_t>{4096, 8192, 16384, 1 << 20}));
  EXPECT_EQ(a.variants, (std::vector<std::string>{"pull", "auto"}));
  EXPECT_TRUE(a.check);
  EXPECT_TRUE(a.json);
  EXPECT_EQ(a.samples, 7);
  EXPECT_EQ(a.warmup, 0);
  EXPECT_EQ(a.max_sms, 8);
}

TEST(BenchArgs, HookAndWayNamesBecomeTheirEnums) {
  EXPECT_EQ(parse_bench_args({"weft-bench", "gemm"}).hook, GemmHook::none);
  EXPECT_EQ(parse_bench_args({"weft-bench", "gemm", "--hook", "wait_source_rows"}).hook, GemmHook::wait_source_rows);
  EXPECT_EQ(parse_bench_args({"weft-bench", "gemm", "--hook", "report_rows"}).hook, GemmHook::report_rows);
  EXPECT_EQ(parse_bench_args({"weft-bench", "gemm_rs"}).way, FusedWay::automatic);
  EXPECT_EQ(parse_bench_args({"weft-bench", "gemm_ar", "--way", "one_launch"}).way, FusedWay::ring_one_launch);
  EXPECT_EQ(parse_bench_args({"weft-bench", "gemm_rs", "--way", "plain_first"}).way, FusedWay::ring_plain_first);
  EXPECT_EQ(parse_bench_args({"weft-bench", "gemm_rs", "--way", "one_launch_add"}).way, FusedWay::one_launch_add);
  EXPECT_EQ(parse_bench_args({"weft-bench", "gemm", "--hook", "add_rows"}).hook, GemmHook::add_rows);
  EXPECT_EQ(parse_bench_args({"weft-bench", "--way", "plain_steps", "ag_gemm"}).ag_way, AgWay::plain_steps);
  EXPECT_EQ(parse_bench_args({"weft-bench", "ag_gemm"}).ag_way, AgWay::automatic);
  EXPECT_NE(error_of({"ag_gemm", "--way", "per_step"}).find(
                "unknown --way 'per_step': expected one of one_gemm, plain_steps"),
            std::string::npos);
  EXPECT_FALSE(parse_bench_args({"weft-bench", "gemm", "--hook", "wait_a_rows"}).any_order);
  EXPECT_TRUE(parse_bench_args({"weft-bench", "gemm", "--hook", "wait_a_rows", "--any-order"}).any_order);
  const BenchArgs halves =
      parse_bench_args({"weft-bench", "gemm", "--hook", "wait_source_rows", "--no-source-rows", "0,1024"});
  EXPECT_EQ(halves.no_source_begin, 0);
  EXPECT_EQ(halves.no_source_end, 1024);
  EXPECT_NE(error_of({"gemm", "--no-source-rows", "0,1024"}).find("is for gemm with --hook wait_source_rows"),
            std::string::npos);
  EXPECT_NE(error_of({"gemm", "--hook", "wait_source_rows", "--no-source-rows", "1024"}).find("expects B,E"),
            std::string::npos);
  EXPECT_NE(error_of({"gemm", "--hook", "wait_source_rows", "--no-source-rows", "512,256"}).find("expects B < E"),
            std::string::npos);
  EXPECT_NE(error_of({"gemm", "--hook", "wait"}).find(
                "unknown --hook 'wait': expected one of none, wait_a_rows, report_rows, wait_source_rows"),
            std::string::npos);
  EXPECT_NE(error_of({"gemm_rs", "--way", "ring"}).find("unknown --way 'ring': expected one of per_step, one_launch, plain_first"),
            std::string::npos);
}

TEST(BenchArgs, DecodeCasesDefaultToThePerfTableAndParse) {
  const BenchArgs d = parse_bench_args({"weft-bench", "decode"});
  ASSERT_EQ(d.decode_cases.size(), 12u);
  EXPECT_EQ(d.decode_cases[0].batch, 1);
  EXPECT_EQ(d.decode_cases[0].q_heads, 96);
  EXPECT_EQ(d.decode_cases[0].kv_heads, 12);
  EXPECT_EQ(d.decode_cases[2].kv_len, 524288);
  EXPECT_EQ(d.decode_cases[0].page_size, 0) << "contiguous";
  EXPECT_EQ(d.decode_cases[11].batch, 32);
  EXPECT_EQ(d.decode_cases[11].page_size, 16);
  EXPECT_EQ(d.decode_cases[6].batch, 4);
  EXPECT_EQ(d.decode_cases[6].page_size, 0) << "contiguous past batch 1";
  EXPECT_EQ(d.splits, 0);
  const BenchArgs c = parse_bench_args({"weft-bench", "decode", "--cases", "4,64,8,1000,32;2,8,1,77", "--splits", "5",
                                        "--dtype", "fp16", "--check"});
  ASSERT_EQ(c.decode_cases.size(), 2u);
  EXPECT_EQ(c.decode_cases[0].page_size, 32);
  EXPECT_EQ(c.decode_cases[1].kv_len, 77);
  EXPECT_EQ(c.splits, 5);
  EXPECT_TRUE(c.check);
  EXPECT_NE(error_of({"decode", "--cases", "1,96,12"}).find("--cases: '1,96,12' is not B,HQ,HKV,L"), std::string::npos);
  EXPECT_NE(error_of({"decode", "--cases", "1,30,8,64"}).find("query heads 30 must be a multiple of KV heads 8"),
            std::string::npos);
  EXPECT_NE(error_of({"decode", "--dtype", "fp32"}).find("decode takes --dtype bf16 or fp16"), std::string::npos);
  EXPECT_NE(error_of({"decode", "--splits", "129"}).find("--splits expects a whole number from 0 to 128"),
            std::string::npos);
  // The kernel variants, forced or swept [0064].
  EXPECT_EQ(d.stages, 0);
  EXPECT_EQ(d.merge, DecodeMerge::automatic);
  EXPECT_EQ(d.page_lookup, PageLookup::automatic);
  EXPECT_FALSE(d.sweep);
  const BenchArgs v = parse_bench_args({"weft-bench", "decode", "--stages", "6", "--merge", "last_block",
                                        "--page-lookup", "warp", "--sweep"});
  EXPECT_EQ(v.stages, 6);
  EXPECT_EQ(v.merge, DecodeMerge::last_block);
  EXPECT_EQ(v.page_lookup, PageLookup::per_warp);
  EXPECT_TRUE(v.sweep);
  EXPECT_NE(error_of({"decode", "--merge", "fused"}).find("unknown --merge 'fused': expected one of auto, launch, "
                                                          "last_block"),
            std::string::npos)
      << error_of({"decode", "--merge", "fused"});
  EXPECT_NE(error_of({"decode", "--page-lookup", "page"}).find("unknown --page-lookup 'page': expected one of auto, "
                                                               "row, warp"),
            std::string::npos)
      << error_of({"decode", "--page-lookup", "page"});
  EXPECT_NE(error_of({"decode", "--sweep", "--dist"}).find("--sweep and --dist time different things"),
            std::string::npos);
}

TEST(BenchArgs, SoakIsForTheGemmAndOverlappedOperatorsInWholeSeconds) {
  EXPECT_EQ(parse_bench_args({"weft-bench", "gemm_rs"}).soak_s, 0);
  EXPECT_EQ(parse_bench_args({"weft-bench", "ag_gemm", "--soak", "3"}).soak_s, 3);
  EXPECT_EQ(parse_bench_args({"weft-bench", "gemm", "--soak", "2"}).soak_s, 2);
  EXPECT_NE(error_of({"all_gather", "--soak", "3"}).find("--soak is for gemm, ag_gemm, gemm_rs and gemm_ar, got 'all_gather'"),
            std::string::npos);
  EXPECT_NE(error_of({"gemm_ar", "--soak", "0"}).find("--soak expects a whole number from 1 to 600, got '0'"),
            std::string::npos);
}

TEST(BenchArgs, RejectsBadInputNamingWhatWasExpected) {
  EXPECT_NE(error_of({}).find("no operation given: expected one of all_gather, all_reduce, reduce_scatter, gemm"),
            std::string::npos);
  EXPECT_NE(error_of({"gemm", "--shapes", "8192,14336"}).find("is not M,N,K"), std::string::npos);
  EXPECT_NE(error_of({"gemm", "--b-layout", "tn"}).find("--b-layout expects nk or kn"), std::string::npos);
  EXPECT_NE(error_of({"all_reduce_x"}).find("unknown operation 'all_reduce_x'"), std::string::npos);
  EXPECT_NE(error_of({"all_gather", "--bytes", "3K:5K"}).find("powers of two"), std::string::npos);
  EXPECT_NE(error_of({"all_gather", "--bytes", "12Q"}).find("cannot read --bytes size '12Q'"), std::string::npos);
  EXPECT_NE(error_of({"all_gather", "--bytes", "1001"}).find("not a whole number of bf16 elements"), std::string::npos);
  EXPECT_NE(error_of({"all_gather", "--variant", "fast"})
                .find("expected push, pull, ce, ll, ring, two_level, auto or all"),
            std::string::npos);
  EXPECT_NE(error_of({"all_reduce", "--variant", "push"})
                .find("expected ll, one_shot, two_shot, ce, two_level, auto or all"),
            std::string::npos);
  EXPECT_NE(error_of({"all_gather", "--samples", "0"}).find("--samples expects a whole number from 1"),
            std::string::npos);
  EXPECT_NE(error_of({"all_gather", "--samples"}).find("--samples needs a value"), std::string::npos);
  EXPECT_NE(error_of({"all_gather", "--dtype", "int4"}).find("expected bf16, fp16 or fp32"), std::string::npos);
  EXPECT_NE(error_of({"all_gather", "--frobnicate"}).find("unknown option '--frobnicate'"), std::string::npos);
  EXPECT_EQ(error_of({"--help"}), "help");
}

TEST(BenchBinary, BadArgumentsExit2) {
  auto [code, out] = run(std::string(WEFT_BENCH_PATH) + " all_gather --bytes 3K:5K");
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("powers of two"), std::string::npos) << out;
}

TEST(BenchBinary, WithoutAGpuSaysSoAndFails) {
  int code = run("nvidia-smi -L").first;
  if (code == 0) GTEST_SKIP() << "this machine has a GPU; the no-GPU message cannot be checked here";
  auto [rc, out] = run(std::string(WEFT_BENCH_PATH) + " all_gather --bytes 1K");
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("nothing to benchmark"), std::string::npos) << out;
  EXPECT_NE(out.find("Run it on a machine with NVIDIA"), std::string::npos) << out;
}

TEST(BenchArgs, ByteRangesThatWouldOverflowAreRefused) {
  // 8388608T is 2^63 bytes: doubling 1K up to it would wrap to 0 and never end.
  EXPECT_NE(error_of({"all_gather", "--bytes", "1K:8388608T"})
                .find("--bytes range end '8388608T' (in '1K:8388608T') is above 1024T (2^50 bytes), the largest "
                      "per-rank size weft-bench takes"),
            std::string::npos);
  EXPECT_NE(error_of({"all_reduce", "--bytes", "2048T"}).find("--bytes size '2048T' is above 1024T (2^50 bytes)"),
            std::string::npos);
  EXPECT_NE(error_of({"all_gather", "--bytes", "2048T:4096T"}).find("--bytes range start '2048T'"),
            std::string::npos);
  // Too large for 64 bits at all: still a size above the bound, not a typo.
  EXPECT_NE(error_of({"all_gather", "--bytes", "99999999999999999999"}).find("is above 1024T"), std::string::npos);
  EXPECT_NE(error_of({"all_gather", "--bytes", "1K,16777216T"}).find("--bytes size '16777216T' is above 1024T"),
            std::string::npos);
  // The bound itself is a size, and a range up to it ends.
  const std::vector<std::uint64_t> sizes = parse_size_list("1K:1024T");
  ASSERT_EQ(sizes.size(), 41u);
  EXPECT_EQ(sizes.front(), 1024u);
  EXPECT_EQ(sizes.back(), kMaxBenchBytes);
  EXPECT_EQ(parse_size_list("1:1"), (std::vector<std::uint64_t>{1}));
  EXPECT_NE(error_of({"all_gather", "--bytes", "0"}).find("--bytes sizes must be positive, got '0'"),
            std::string::npos);
}

TEST(BenchArgs, ShapeOptionsNameThemselvesAndWhatTheyExpect) {
  const std::string m = error_of({"gemm", "--m", "-5"});
  EXPECT_NE(m.find("--m expects a positive integer, or a comma list of them, each at most 16777216 (e.g. --m "
                   "2048,4096), got '-5'"),
            std::string::npos)
      << m;
  EXPECT_EQ(m.find("--shapes"), std::string::npos) << m;
  EXPECT_NE(error_of({"ag_gemm", "--m", "2048,x", "--n", "8192", "--k", "8192"}).find("got '2048,x' ('x' is not one)"),
            std::string::npos);
  EXPECT_NE(error_of({"gemm_rs", "--m", "2048", "--n", "0", "--k", "8192"})
                .find("--n expects a positive integer, at most 16777216 (e.g. --n 8192), got '0'"),
            std::string::npos);
  EXPECT_NE(error_of({"gemm_ar", "--m", "2048", "--n", "8192", "--k", "8k"}).find("--k expects a positive integer"),
            std::string::npos);
  EXPECT_NE(error_of({"gemm", "--m", "99999999", "--n", "8", "--k", "8"}).find("each at most 16777216"),
            std::string::npos);
  EXPECT_NE(error_of({"gemm", "--shapes", "1,2,99999999999"})
                .find("--shapes: '1,2,99999999999' is not M,N,K with three positive integers, each at most 16777216"),
            std::string::npos);
  EXPECT_NE(error_of({"gemm", "--shapes", "8x-1x8"}).find("--shapes: '8x-1x8' is not M,N,K"), std::string::npos);
  EXPECT_NE(error_of({"gemm", "--m", "2048"}).find("--m, --n and --k go together"), std::string::npos);
  EXPECT_NE(error_of({"gemm", "--m", "--n", "8"}).find("--m needs a value (--m LIST --n N --k K)"), std::string::npos);
  const BenchArgs a = parse_bench_args({"weft-bench", "gemm", "--m", "2048,4096", "--n", "8192", "--k", "1024"});
  EXPECT_EQ(a.shapes, (std::vector<std::array<std::int64_t, 3>>{{2048, 8192, 1024}, {4096, 8192, 1024}}));
}

TEST(BenchArgs, OptionsOfOtherOperationsAreNamedNotIgnored) {
  EXPECT_NE(error_of({"all_gather", "--shapes", "8,8,8"})
                .find("--shapes is for gemm, ag_gemm, gemm_rs and gemm_ar, got 'all_gather' ('weft-bench all_gather "
                      "--help' lists its options)"),
            std::string::npos);
  EXPECT_NE(error_of({"gemm", "--bytes", "1K"}).find("--bytes is for all_gather, all_reduce and reduce_scatter, got 'gemm'"),
            std::string::npos);
  EXPECT_NE(error_of({"--chunks", "4", "gemm"}).find("--chunks is for ag_gemm, gemm_rs and gemm_ar, got 'gemm'"),
            std::string::npos);
  EXPECT_NE(error_of({"all_reduce", "--byte", "1K"})
                .find("unknown option '--byte': all_reduce takes --bytes, --variant, --dtype"),
            std::string::npos);
  EXPECT_NE(error_of({"--frobnicate", "gemm_ar"}).find("unknown option '--frobnicate': gemm_ar takes"),
            std::string::npos);
  EXPECT_NE(error_of({"--frobnicate"}).find("'weft-bench --help' lists the operations"), std::string::npos);
}

TEST(BenchArgs, EachOperationsTypes) {
  EXPECT_NE(error_of({"gemm", "--dtype", "fp32"}).find("gemm takes --dtype bf16 or fp16, got 'fp32'"),
            std::string::npos);
  EXPECT_NE(error_of({"ag_gemm", "--dtype", "fp32"}).find("ag_gemm takes --dtype bf16 or fp16"), std::string::npos);
  EXPECT_EQ(parse_bench_args({"weft-bench", "gemm_rs", "--dtype", "fp16"}).dtype, "fp16");
  EXPECT_NE(error_of({"gemm", "--dtype", "fp16", "--out", "bf16"}).find("--out expects the input type (fp16) or fp32, "
                                                                        "got 'bf16'"),
            std::string::npos);
  EXPECT_EQ(parse_bench_args({"weft-bench", "gemm", "--dtype", "fp16", "--out", "fp32"}).out_dtype, "fp32");
}

TEST(BenchArgs, MessagesCarryNoSourceLocation) {
  const std::regex location(R"(\.(cpp|cu|hpp|h):[0-9]+)");
  for (const auto& argv : std::vector<std::vector<std::string>>{{},
                                                               {"nope"},
                                                               {"gemm", "--m", "-5"},
                                                               {"all_gather", "--bytes", "1K:8388608T"},
                                                               {"all_gather", "--bytes", "3K:5K"},
                                                               {"all_gather", "--samples", "0"},
                                                               {"gemm", "--bytes", "1K"},
                                                               {"gemm", "--hook", "wait"}}) {
    const std::string e = error_of(argv);
    EXPECT_FALSE(e.empty());
    EXPECT_FALSE(std::regex_search(e, location)) << e;
  }
}

TEST(BenchHelp, OverviewListsEveryOperationWithWhatItMeasures) {
  const std::string h = help_of({"--help"});
  EXPECT_EQ(h, bench_usage());
  EXPECT_EQ(help_of({"-h"}), h);
  for (const std::string& op : kAllOps) {
    const std::regex line("\n  " + op + " +([^\n]{20,})\n");
    EXPECT_TRUE(std::regex_search(h, line)) << op << " has no line of its own in:\n" << h;
  }
  EXPECT_NE(h.find("weft-bench OP --help"), std::string::npos) << h;
  EXPECT_NE(h.find("2 bad arguments"), std::string::npos) << h;
  // The options every operation takes, and none that only some take.
  EXPECT_TRUE(mentions(h, "--samples") && mentions(h, "--json")) << h;
  EXPECT_FALSE(mentions(h, "--bytes") || mentions(h, "--shapes") || mentions(h, "--hook")) << h;
}

TEST(BenchHelp, EachOperationListsItsOwnOptionsWithDefaults) {
  const std::vector<std::pair<std::string, std::string>> flags = {
      {"--bytes", "1K"},        {"--variant", "auto"},     {"--dtype", "bf16"},     {"--check", ""},
      {"--json", ""},           {"--samples", "3"},        {"--warmup", "1"},       {"--no-hold", ""},
      {"--order", "fixed"},     {"--max-sms", "8"},        {"--chunks", "2"},       {"--way", "x"},
      {"--soak", "1"},          {"--shapes", "8,8,8"},     {"--b-layout", "nk"},    {"--out", "fp32"},
      {"--config", "c"},        {"--hook", "none"},        {"--any-order", ""},     {"--no-source-rows", "0,256"},
      {"--m", "8"},             {"--n", "8"},              {"--k", "8"},            {"--cases", "1,8,1,64"},
      {"--splits", "2"},        {"--dist", ""},            {"--enqueue", ""},       {"--experts", "8"},
      {"--routing", "zipf"},    {"--layout", "kn"},        {"--stages", "4"},       {"--merge", "launch"},
      {"--page-lookup", "row"}, {"--sweep", ""},         {"--tune", ""}};
  for (const std::string& op : kAllOps) {
    const std::string h = help_of({op, "--help"});
    EXPECT_EQ(h, bench_usage(op));
    EXPECT_EQ(h.rfind("usage: weftrun -n N weft-bench " + op + " [options]\n", 0), 0u) << h;
    // Listed exactly when the parser takes it for this operation.
    for (const auto& [flag, value] : flags) {
      std::vector<std::string> argv{op, flag};
      if (!value.empty()) argv.push_back(value);
      const std::string e = error_of(argv);
      const bool refused = e.find(flag + " is for ") != std::string::npos && e.find("got '" + op + "'") != std::string::npos;
      EXPECT_EQ(mentions(h, flag), !refused) << op << " " << flag << ": " << e << "\n" << h;
    }
    // Every option row says its default.
    const std::string options = h.substr(h.find("\noptions:\n"));
    const std::regex row("\n  (--[a-z-]+)[^\n]*(\n {24}[^\n]*)*");
    int rows = 0;
    for (auto it = std::sregex_iterator(options.begin(), options.end(), row); it != std::sregex_iterator(); ++it) {
      ++rows;
      const std::string block = it->str();
      EXPECT_TRUE(block.find("default") != std::string::npos || block.find("always on") != std::string::npos)
          << op << ": no default in" << block;
    }
    EXPECT_GE(rows, 6) << h;
  }
  const std::string ag = bench_usage("all_gather");
  EXPECT_NE(ag.find("push, pull, ce, ll, ring, two_level, auto (the plan's choice)"), std::string::npos) << ag;
  EXPECT_NE(ag.find("(default 1K:256M)"), std::string::npos) << ag;
  EXPECT_NE(bench_usage("all_reduce").find("ll, one_shot, two_shot, ce, two_level, auto"), std::string::npos);
  const std::string gemm = bench_usage("gemm");
  EXPECT_NE(gemm.find("(default 15)"), std::string::npos) << gemm;
  EXPECT_NE(gemm.find("--hook H"), std::string::npos) << gemm;
  EXPECT_NE(bench_usage("ag_gemm").find("one_gemm or plain_steps"), std::string::npos);
  EXPECT_EQ(bench_usage("ag_gemm").find("per_step"), std::string::npos);
  EXPECT_NE(bench_usage("gemm_rs").find("per_step, one_launch, plain_first or one_launch_add (2 ranks)"), std::string::npos);
  // --help wins wherever it stands and whatever else is wrong; an unknown operation is named.
  EXPECT_EQ(help_of({"--help", "gemm_rs"}), bench_usage("gemm_rs"));
  EXPECT_EQ(help_of({"gemm", "--m", "-5", "--frobnicate", "--help"}), gemm);
  EXPECT_EQ(help_of({"gemm", "--m", "--help"}), gemm);
  EXPECT_NE(help_of({"gemmm", "--help"}).find("unknown operation 'gemmm': expected one of all_gather"),
            std::string::npos);
}

TEST(BenchBinary, BadSizesAndShapesExit2AtOnceNamingTheOption) {
  const std::string bench = WEFT_BENCH_PATH;
  const Bounded range = run_bounded(bench + " all_gather --bytes 1K:8388608T", 10);
  EXPECT_EQ(range.code, 2) << range.output;
  EXPECT_LT(range.seconds, 5.0) << range.output;
  EXPECT_NE(range.output.find("is above 1024T (2^50 bytes)"), std::string::npos) << range.output;
  const Bounded m = run_bounded(bench + " gemm --m -5", 10);
  EXPECT_EQ(m.code, 2) << m.output;
  EXPECT_NE(m.output.find("--m expects a positive integer, or a comma list of them"), std::string::npos) << m.output;
  EXPECT_EQ(m.output.find("--shapes"), std::string::npos) << m.output;
}

TEST(BenchBinary, HelpGoesToStdoutAndExits0) {
  const std::string bench = WEFT_BENCH_PATH;
  const Bounded all = run_bounded(bench + " --help 2>/dev/null", 10);
  EXPECT_EQ(all.code, 0) << all.output;
  for (const std::string& op : kAllOps) EXPECT_NE(all.output.find("\n  " + op + " "), std::string::npos) << all.output;
  const Bounded gemm = run_bounded(bench + " gemm --help 2>/dev/null", 10);
  EXPECT_EQ(gemm.code, 0) << gemm.output;
  EXPECT_EQ(gemm.output, bench_usage("gemm"));
}

namespace {
// The repository's scripts/ folder, found from this file's place in the tree.
std::filesystem::path scripts_dir() { return std::filesystem::path(__FILE__).parent_path() / ".." / ".." / "scripts"; }

bool have_python() { return run("python3 -c pass").first == 0; }
}  // namespace

TEST(SweepScripts, WithoutABuildSayHowToMakeOneAndExit1) {
  if (!have_python()) GTEST_SKIP() << "no python3 here";
  for (const std::string script : {"sweep_overlap.py", "sweep_collectives.py"}) {
    const std::filesystem::path path = scripts_dir() / script;
    if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is not next to this test's source";
    const std::string out_dir = testing::TempDir() + "weft_sweep_out_" + script;
    std::filesystem::remove_all(out_dir);
    const Bounded r = run_bounded("python3 " + path.string() + " --build /nonexistent/build --out " + out_dir, 30);
    EXPECT_EQ(r.code, 1) << r.output;
    EXPECT_NE(r.output.find("/nonexistent/build has no weftrun and no weft-bench"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("bash scripts/build.sh"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("Traceback"), std::string::npos) << r.output;
    EXPECT_FALSE(std::filesystem::exists(out_dir)) << "nothing is written before the checks pass";
  }
}

TEST(SweepScripts, WithoutAGpuSaySoAndExit1) {
  if (!have_python()) GTEST_SKIP() << "no python3 here";
  if (run("nvidia-smi -L").first == 0) GTEST_SKIP() << "this machine has a GPU; the no-GPU message cannot be checked here";
  const std::filesystem::path build = std::filesystem::path(WEFT_BENCH_PATH).parent_path();
  if (!std::filesystem::exists(build / "weftrun")) GTEST_SKIP() << "weftrun is not next to weft-bench in " << build;
  for (const std::string script : {"sweep_overlap.py", "sweep_collectives.py"}) {
    const std::filesystem::path path = scripts_dir() / script;
    if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is not next to this test's source";
    const Bounded r = run_bounded("python3 " + path.string() + " --build " + build.string() + " --out " +
                                      testing::TempDir() + "weft_sweep_nogpu",
                                  30);
    EXPECT_EQ(r.code, 1) << r.output;
    EXPECT_NE(r.output.find("no NVIDIA GPU"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("Traceback"), std::string::npos) << r.output;
  }
}

TEST(SweepScripts, OverlapNamesAMissingBaselinesFile) {
  if (!have_python()) GTEST_SKIP() << "no python3 here";
  const std::filesystem::path path = scripts_dir() / "sweep_overlap.py";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is not next to this test's source";
  const Bounded r = run_bounded("python3 " + path.string() + " --out " + testing::TempDir() +
                                    "weft_sweep_tb --torch-baselines /nonexistent/torch_tp_baselines.py",
                                30);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--torch-baselines: no file /nonexistent/torch_tp_baselines.py"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("Traceback"), std::string::npos) << r.output;
}

TEST(BenchArgs, EpTakesItsShapeAndNamesABadOne) {
  const BenchArgs d = parse_bench_args({"weft-bench", "ep"});
  EXPECT_EQ(d.ep_tokens, 4096);
  EXPECT_EQ(d.ep_hidden, 7168);
  EXPECT_EQ(d.ep_topk, 8);
  EXPECT_EQ(d.ep_experts, 256);
  EXPECT_EQ(d.ep_ll_tokens, 128);
  EXPECT_EQ(parse_bench_args({"weft-bench", "ep", "--ll-tokens", "0"}).ep_ll_tokens, 0);
  EXPECT_NE(error_of({"ep", "--ll-tokens", "4097"}).find("--ll-tokens expects a whole number from 0"), std::string::npos);
  const BenchArgs a =
      parse_bench_args({"weft-bench", "ep", "--tokens", "128", "--hidden", "2048", "--topk", "2", "--experts", "64",
                        "--max-sms", "16", "--check"});
  EXPECT_EQ(a.ep_tokens, 128);
  EXPECT_EQ(a.ep_hidden, 2048);
  EXPECT_EQ(a.ep_topk, 2);
  EXPECT_EQ(a.ep_experts, 64);
  EXPECT_EQ(a.max_sms, 16);
  EXPECT_TRUE(a.check);
  EXPECT_NE(error_of({"ep", "--hidden", "1001"}).find("--hidden 1001 is not a multiple of 8"), std::string::npos);
  EXPECT_NE(error_of({"ep", "--topk", "9", "--experts", "8"}).find("--topk 9 exceeds --experts 8"), std::string::npos);
  EXPECT_NE(error_of({"ep", "--tokens", "0"}).find("--tokens expects a whole number from 1"), std::string::npos);
  EXPECT_NE(error_of({"ep", "--bytes", "1K"}).find("--bytes is for all_gather"), std::string::npos);
  EXPECT_NE(error_of({"all_gather", "--tokens", "8"}).find("--tokens is for ep"), std::string::npos);
}

TEST(BenchArgs, GroupedGemmTunesOnlyWhereNoConfigurationIsForced) {
  EXPECT_FALSE(parse_bench_args({"weft-bench", "grouped_gemm"}).grouped_tune);
  EXPECT_TRUE(parse_bench_args({"weft-bench", "grouped_gemm", "--tune"}).grouped_tune);
  EXPECT_NE(error_of({"grouped_gemm", "--tune", "--config", "128x128x64 c1x1 cooperative"})
                .find("grouped_gemm: --tune times every configuration and --config forces one ('128x128x64 c1x1 "
                      "cooperative'): give one of them"),
            std::string::npos);
  EXPECT_NE(error_of({"gemm", "--tune"}).find("--tune is for grouped_gemm"), std::string::npos);
}

TEST(BenchArgs, MoeTpTakesItsLayersAndNamesABadOne) {
  const BenchArgs d = parse_bench_args({"weft-bench", "moe_tp"});
  ASSERT_EQ(d.moe_tp_cases.size(), 3u);  // issue 33's layers: its grouped GEMM rows as T x k
  EXPECT_EQ(d.moe_tp_cases[0].tokens * d.moe_tp_cases[0].top_k, 16384);
  EXPECT_EQ(d.moe_tp_cases[1].tokens * d.moe_tp_cases[1].top_k, 65536);
  EXPECT_EQ(d.moe_tp_cases[2].tokens * d.moe_tp_cases[2].top_k, 32768);
  EXPECT_EQ(d.moe_tp_cases[1].experts, 128);
  EXPECT_EQ(d.routing, "uniform");
  const BenchArgs a = parse_bench_args({"weft-bench", "moe_tp", "--cases", "1001,512,256,16,4;64,64,64,8,8", "--routing",
                                        "zipf", "--dtype", "fp16", "--check", "--max-sms", "32"});
  ASSERT_EQ(a.moe_tp_cases.size(), 2u);
  EXPECT_EQ(a.moe_tp_cases[0].tokens, 1001);
  EXPECT_EQ(a.moe_tp_cases[0].hidden, 512);
  EXPECT_EQ(a.moe_tp_cases[0].ffn, 256);
  EXPECT_EQ(a.moe_tp_cases[0].experts, 16);
  EXPECT_EQ(a.moe_tp_cases[0].top_k, 4);
  EXPECT_EQ(a.moe_tp_cases[1].top_k, 8);
  EXPECT_EQ(a.routing, "zipf");
  EXPECT_EQ(a.dtype, "fp16");
  EXPECT_TRUE(a.check);
  EXPECT_EQ(a.max_sms, 32);
  EXPECT_NE(error_of({"moe_tp", "--cases", "64,100,64,8,2"}).find("H = 100 and F = 64 must be multiples of 8"),
            std::string::npos);
  EXPECT_NE(error_of({"moe_tp", "--cases", "64,64,64,4,8"}).find("are out of range"), std::string::npos);
  EXPECT_NE(error_of({"moe_tp", "--cases", "64,64,64,8"}).find("is not T,H,F,E,k"), std::string::npos);
  EXPECT_NE(error_of({"moe_tp", "--dtype", "fp32"}).find("moe_tp takes --dtype bf16 or fp16"), std::string::npos);
  EXPECT_NE(error_of({"moe_tp", "--experts", "8"}).find("--experts is for"), std::string::npos);
  // decode's --cases keeps its own meaning
  EXPECT_EQ(parse_bench_args({"weft-bench", "decode", "--cases", "1,8,1,64"}).decode_cases.size(), 1u);
}
