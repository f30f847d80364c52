// weft-bench's argument validation (no GPU needed), and the binary's behaviour
// on bad input and on a machine without a GPU.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
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

std::pair<int, std::string> run(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  std::array<char, 512> buf{};
  while (p && fgets(buf.data(), buf.size(), p)) out += buf.data();
  int status = p ? pclose(p) : -1;
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}
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
  EXPECT_NE(error_of({"all_gather", "--variant", "fast"}).find("expected push, pull, ce, ll, ring, auto or all"),
            std::string::npos);
  EXPECT_NE(error_of({"all_reduce", "--variant", "push"}).find("expected ll, one_shot, two_shot, ce, auto or all"),
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
  EXPECT_NE(out.find("no CUDA GPU is visible"), std::string::npos) << out;
}
