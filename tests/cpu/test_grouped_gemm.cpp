// GroupedGemm's host side, on the CPU: the compiled configurations and their
// names, the size heuristic that picks among them, the checks of options and
// operands (refused before any CUDA call, naming what was expected), the
// message of a run's count faults, and weft-bench grouped_gemm's routings and
// arguments.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <regex>
#include <set>
#include <string>
#include <tuple>

#include "bench_args.hpp"
#include "gemm/grouped_config.hpp"
#include "routing.hpp"
#include "weft/core/error.hpp"
#include "weft/gemm/grouped_gemm.hpp"

namespace {

using weft::BLayout;
using weft::DType;
using weft::GroupedGemmArgs;
using weft::GroupedGemmOptions;
using weft::GroupedRowsDone;
using weft::GroupedRowWait;
using namespace weft::gemm_detail;
using namespace weft::bench;

GroupedGemmOptions options(int experts, std::int64_t n, std::int64_t k, std::int64_t max_rows,
                           DType t = DType::bf16, BLayout layout = BLayout::nk) {
  GroupedGemmOptions o;
  o.experts = experts;
  o.n = n;
  o.k = k;
  o.max_rows = max_rows;
  o.dtype = t;
  o.w_layout = layout;
  return o;
}

std::string construct_error(const GroupedGemmOptions& o) {
  try {
    weft::GroupedGemm g(o);
  } catch (const weft::Error& e) {
    return e.what();
  }
  return "";
}

TEST(GroupedGemmConfigs, NamesSayTileClusterAndScheduleOncePerTypeAndLayout) {
  const std::regex name_re(R"(^(\d+)x(\d+)x(\d+) c(\d+)x(\d+) cooperative$)");
  std::set<std::tuple<DType, BLayout, std::string>> seen;
  for (const auto* c : all_grouped_configs()) {
    SCOPED_TRACE(c->name);
    std::cmatch m;
    ASSERT_TRUE(std::regex_match(c->name, m, name_re));
    EXPECT_EQ(std::stoi(m[1]), c->tile_m);
    EXPECT_EQ(std::stoi(m[2]), c->tile_n);
    EXPECT_EQ(std::stoi(m[4]), c->cluster_m);
    EXPECT_EQ(std::stoi(m[5]), c->cluster_n);
    EXPECT_TRUE(c->dtype == DType::bf16 || c->dtype == DType::fp16);
    EXPECT_TRUE(seen.insert({c->dtype, c->w_layout, c->name}).second) << "a name twice for one type and layout";
    EXPECT_NE(c->workspace, nullptr);
    EXPECT_NE(c->run, nullptr);
  }
  // Every grouped row the build compiled (the generator counts them), once.
  EXPECT_EQ(static_cast<int>(all_grouped_configs().size()), WEFT_GROUPED_GEMM_KERNEL_COUNT);
  // The CI subset keeps at least one kernel of each type and each layout compiling.
  std::set<DType> types;
  std::set<BLayout> layouts;
  for (const auto* c : all_grouped_configs()) {
    types.insert(c->dtype);
    layouts.insert(c->w_layout);
  }
  EXPECT_EQ(types.size(), 2u);
  EXPECT_EQ(layouts.size(), 2u);
}

TEST(GroupedGemmHeuristic, TilesCountEveryExpertsRowTilesInWholeClusters) {
  const GroupedTile wide{128, 256, 2, 1}, narrow{128, 128, 1, 1};
  // 8 experts of 2048 rows, N 7168: 16 row tiles x 28 column tiles each.
  EXPECT_EQ(grouped_tiles(wide, 7168, 16384, 8), 8 * 16 * 28);
  // 200 rows per expert: 2 row tiles; a 2x1 cluster keeps 2, 300 rows (3 tiles) round up to 4.
  EXPECT_EQ(grouped_tiles(wide, 256, 1600, 8), 8 * 2 * 1);
  EXPECT_EQ(grouped_tiles(wide, 256, 2400, 8), 8 * 4 * 1);
  EXPECT_EQ(grouped_tiles(narrow, 256, 2400, 8), 8 * 3 * 2);
  // N not a multiple of the tile: a last, partial column tile.
  EXPECT_EQ(grouped_tiles(narrow, 200, 128, 1), 2);
  EXPECT_EQ(grouped_tiles(wide, 8, 1, 1), 2) << "one row still fills a whole cluster of row tiles";
}

TEST(GroupedGemmHeuristic, TheIssueShapesTakeTheWideTileAndSmallProblemsTheNarrowOne) {
  const std::vector<GroupedTile> both = {{128, 256, 2, 1}, {128, 128, 1, 1}};
  const int sms = 132;
  // Mixtral-, Qwen3-30B-A3B- and DeepSeek-like up-projections: many waves, the wide tile's throughput wins.
  EXPECT_EQ(choose_grouped_tile(both, 7168, 16384, 8, sms), 0u);
  EXPECT_EQ(choose_grouped_tile(both, 768, 65536, 128, sms), 0u);
  EXPECT_EQ(choose_grouped_tile(both, 2048, 32768, 32, sms), 0u);
  // 8 experts x 128 rows x N 1024: 64 wide tiles (half of them the empty second
  // row tile of a 2x1 cluster) or 64 narrow ones, one wave either way: the narrow tile is less work per SM.
  EXPECT_EQ(choose_grouped_tile(both, 1024, 1024, 8, sms), 1u);
  // The order given decides a tie only, not the outcome.
  const std::vector<GroupedTile> reversed = {both[1], both[0]};
  EXPECT_EQ(choose_grouped_tile(reversed, 7168, 16384, 8, sms), 1u);
  EXPECT_EQ(choose_grouped_tile(reversed, 1024, 1024, 8, sms), 0u);
  // One candidate (the CI subset) is always the choice.
  EXPECT_EQ(choose_grouped_tile({both[0]}, 1024, 1024, 8, sms), 0u);
  // Zero rows (a plan sized for nothing yet) still chooses.
  EXPECT_LT(choose_grouped_tile(both, 1024, 0, 8, sms), 2u);
}

TEST(GroupedGemmChecks, BadOptionsAreRefusedBeforeAnyCudaCallNamingWhatWasExpected) {
  const std::pair<GroupedGemmOptions, const char*> refused[] = {
      {options(0, 1024, 1024, 64), "experts = 0: expected 1 to 65536"},
      {options(70000, 1024, 1024, 64), "experts = 70000: expected 1 to 65536"},
      {options(8, 0, 1024, 64), "N and K must be positive"},
      {options(8, 1024, 100, 64), "K = 100 must be a multiple of 8"},
      {options(8, 1000 + 4, 1024, 64), "N = 1004 must be a multiple of 8"},
      {options(8, 1024, 1024, 0), "max_rows = 0: expected 1 to"},
      {options(8, 1024, 1024, 64, DType::fp32), "dtype must be bf16 or fp16, got fp32"},
  };
  for (const auto& [o, why] : refused) {
    EXPECT_NE(grouped_options_error(o).find(why), std::string::npos) << grouped_options_error(o);
    // The constructor refuses the same way, before it touches a GPU (none here).
    const std::string e = construct_error(o);
    EXPECT_NE(e.find("GroupedGemm: "), std::string::npos) << e;
    EXPECT_NE(e.find(why), std::string::npos) << e;
  }
  GroupedGemmOptions expected = options(8, 1024, 1024, 64);
  expected.expected_rows = 65;
  EXPECT_NE(grouped_options_error(expected).find("expected_rows = 65: expected 0 (max_rows) to max_rows = 64"),
            std::string::npos);
  GroupedGemmOptions sms = options(8, 1024, 1024, 64);
  sms.max_sms = -1;
  EXPECT_NE(grouped_options_error(sms).find("max_sms = -1 must be >= 0"), std::string::npos);
  GroupedGemmOptions named = options(8, 1024, 1024, 64);
  named.config = "no such tile";
  EXPECT_NE(construct_error(named).find("named 'no such tile'; available:"), std::string::npos) << construct_error(named);
  EXPECT_EQ(grouped_options_error(options(1, 8, 8, 1)), "") << "the smallest plan";
  EXPECT_EQ(grouped_options_error(options(128, 768, 2048, 65536, DType::fp16, BLayout::kn)), "");
}

TEST(GroupedGemmChecks, OperandsMustBeAlignedDevicePointersNamedWithTheirShapes) {
  const GroupedGemmOptions o = options(4, 64, 32, 100, DType::bf16, BLayout::kn);
  void* aligned = reinterpret_cast<void*>(std::uintptr_t{1} << 20);
  void* odd = reinterpret_cast<void*>((std::uintptr_t{1} << 20) + 8);
  const auto* counts = reinterpret_cast<const std::int32_t*>(std::uintptr_t{1} << 21);
  const GroupedGemmArgs good{.a = aligned, .w = aligned, .out = aligned, .expert_rows = counts};
  EXPECT_EQ(grouped_args_error(o, good), "");
  GroupedGemmArgs x = good;
  x.a = nullptr;
  EXPECT_NE(grouped_args_error(o, x).find("A [rows <= 100, K = 32] must be a device pointer, got null"), std::string::npos)
      << grouped_args_error(o, x);
  x = good;
  x.w = odd;
  EXPECT_NE(grouped_args_error(o, x).find("W [E = 4, K = 32, N = 64] at"), std::string::npos) << grouped_args_error(o, x);
  EXPECT_NE(grouped_args_error(o, x).find("is not 16-byte aligned (TMA needs"), std::string::npos);
  x = good;
  x.out = odd;
  EXPECT_NE(grouped_args_error(o, x).find("out [rows <= 100, N = 64]"), std::string::npos);
  x = good;
  x.expert_rows = nullptr;
  EXPECT_NE(grouped_args_error(o, x).find("expert_rows int32 [E = 4] must be a device pointer"), std::string::npos);
  x.expert_rows = reinterpret_cast<const std::int32_t*>(std::uintptr_t{(1u << 21) + 2});
  EXPECT_NE(grouped_args_error(o, x).find("is not 4-byte aligned"), std::string::npos);
  // First rows are optional (null: packed); given, they are an aligned int32 [E].
  x = good;
  x.expert_first_row = counts;
  EXPECT_EQ(grouped_args_error(o, x), "");
  x.expert_first_row = reinterpret_cast<const std::int32_t*>(std::uintptr_t{(1u << 21) + 2});
  EXPECT_NE(grouped_args_error(o, x).find("expert_first_row int32 [E = 4] (optional) at"), std::string::npos)
      << grouped_args_error(o, x);
  EXPECT_NE(grouped_args_error(o, x).find("is not 4-byte aligned"), std::string::npos);
}

TEST(GroupedGemmChecks, AWaitNeedsItsFlagsRowMapAndWorldNamedWhereMissing) {
  const GroupedGemmOptions o = options(4, 64, 32, 100);
  const auto* aligned = reinterpret_cast<const void*>(std::uintptr_t{1u << 20});
  const auto* counts = reinterpret_cast<const std::int32_t*>(std::uintptr_t{1u << 21});
  const auto* flags = reinterpret_cast<const std::uint64_t*>(std::uintptr_t{1u << 22});
  const auto* row_flag = reinterpret_cast<const std::int32_t*>(std::uintptr_t{1u << 23});
  const weft::dev::World world{};
  GroupedGemmArgs good{.a = aligned, .w = aligned, .out = const_cast<void*>(aligned), .expert_rows = counts};
  EXPECT_EQ(grouped_args_error(o, good), "") << "no wait";
  good.wait = GroupedRowWait{.world = &world, .flags = flags, .flag_count = 2, .value = 3, .row_flag = row_flag};
  EXPECT_EQ(grouped_args_error(o, good), "");
  auto error = [&](auto change) {
    GroupedGemmArgs x = good;
    change(x.wait);
    return grouped_args_error(o, x);
  };
  EXPECT_NE(error([&](GroupedRowWait& w) { w.flags = nullptr; }).find("wait.row_flag is given without wait.flags"),
            std::string::npos);
  EXPECT_NE(error([&](GroupedRowWait& w) { w.flags = reinterpret_cast<const std::uint64_t*>(std::uintptr_t{(1u << 22) + 4}); })
                .find("is not 8-byte aligned (uint64 flags)"),
            std::string::npos);
  EXPECT_NE(error([&](GroupedRowWait& w) { w.flag_count = 0; }).find("wait.flag_count = 0: expected the flags' length, >= 1"),
            std::string::npos);
  EXPECT_NE(error([&](GroupedRowWait& w) { w.row_flag = nullptr; })
                .find("wait.row_flag must be a device pointer to int32 [max_rows = 100], got null"),
            std::string::npos);
  EXPECT_NE(error([&](GroupedRowWait& w) { w.row_flag = reinterpret_cast<const std::int32_t*>(std::uintptr_t{(1u << 23) + 2}); })
                .find("is not 4-byte aligned (int32)"),
            std::string::npos);
  EXPECT_NE(error([&](GroupedRowWait& w) { w.world = nullptr; }).find("wait.world must be given"), std::string::npos);
  EXPECT_NE(error([&](GroupedRowWait& w) { w.flags_per_rank = 0; }).find("wait.flags_per_rank = 0: expected >= 1"),
            std::string::npos);
}

TEST(GroupedGemmChecks, AReportNeedsAlignedCountersAndItsBandRowsNamedWhereWrong) {
  const GroupedGemmOptions o = options(4, 64, 32, 1000);
  const auto* aligned = reinterpret_cast<const void*>(std::uintptr_t{1u << 20});
  const auto* counts = reinterpret_cast<const std::int32_t*>(std::uintptr_t{1u << 21});
  auto* counters = reinterpret_cast<std::uint64_t*>(std::uintptr_t{1u << 22});
  GroupedGemmArgs good{.a = aligned, .w = aligned, .out = const_cast<void*>(aligned), .expert_rows = counts};
  good.report = GroupedRowsDone{.counters = counters, .rows_per_report = 100};
  EXPECT_EQ(grouped_args_error(o, good), "");
  GroupedGemmArgs x = good;
  x.report.counters = reinterpret_cast<std::uint64_t*>(std::uintptr_t{(1u << 22) + 4});
  EXPECT_NE(grouped_args_error(o, x).find("report.counters at"), std::string::npos) << grouped_args_error(o, x);
  EXPECT_NE(grouped_args_error(o, x).find("is not 8-byte aligned (uint64 counters)"), std::string::npos);
  x = good;
  x.report.rows_per_report = 0;
  EXPECT_NE(grouped_args_error(o, x).find("report.rows_per_report = 0: expected >= 1"), std::string::npos)
      << grouped_args_error(o, x);
  EXPECT_NE(grouped_args_error(o, x).find("ceil(max_rows = 1000 / rows_per_report)"), std::string::npos);
  x = good;
  x.report.counters = nullptr;
  EXPECT_NE(grouped_args_error(o, x).find("report.rows_per_report = 100 is given without report.counters"),
            std::string::npos)
      << grouped_args_error(o, x);
  x.report.rows_per_report = 0;
  EXPECT_EQ(grouped_args_error(o, x), "") << "no report";
  // A band's complete value: its covered rows times N.
  static_assert(GroupedRowsDone::complete_value(100, 64) == 6400);
  static_assert(GroupedRowsDone::complete_value(0, 64) == 0);
}

TEST(GroupedGemmChecks, ARowWhoseFlagIsOutOfRangeIsNamed) {
  const GroupedGemmOptions o = options(8, 64, 64, 1000);
  // The record keeps 1 + some such row.
  const std::string flag = grouped_fault_message(o, {kBadRowFlag, 0, 0, 1 + 517});
  EXPECT_NE(flag.find("row 517's wait.row_flag was outside [0, flag_count) (that row waited for nothing)"),
            std::string::npos)
      << flag;
  EXPECT_NE(flag.find("expected every row a tile reads naming one of the run's flags"), std::string::npos) << flag;
  EXPECT_EQ(flag.find("counts >= 0"), std::string::npos) << "only the flag was wrong: " << flag;
  const std::string both = grouped_fault_message(o, {kNegativeCount | kBadRowFlag, 0, 0, 1});
  EXPECT_NE(both.find("negative"), std::string::npos) << both;
  EXPECT_NE(both.find("row 0's wait.row_flag"), std::string::npos) << both;
  EXPECT_NE(both.find("counts >= 0 summing to at most max_rows; and every row a tile reads"), std::string::npos) << both;
}

TEST(GroupedGemmChecks, CountFaultsSayWhatWasWrongAndWhatWasExpected) {
  const GroupedGemmOptions o = options(8, 64, 64, 1000);
  EXPECT_EQ(grouped_fault_message(o, {0, 0, 0, 0}), "");
  EXPECT_NE(grouped_fault_message(o, {kNegativeCount, 0, 0, 0}).find("an expert's row count was negative"),
            std::string::npos);
  const std::string over = grouped_fault_message(o, {kOverCapacity, 1234, 0, 0});
  EXPECT_NE(over.find("the row counts summed to 1234, past max_rows = 1000"), std::string::npos) << over;
  EXPECT_NE(over.find("expected E = 8 counts >= 0 summing to at most max_rows"), std::string::npos) << over;
  EXPECT_EQ(over.find("first rows"), std::string::npos) << "packed rows: nothing said of first rows";
  const std::string both = grouped_fault_message(o, {kNegativeCount | kOverCapacity, 1234, 0, 0});
  EXPECT_NE(both.find("negative"), std::string::npos);
  EXPECT_NE(both.find("summed to 1234"), std::string::npos);
  // A bad range: the mark is E - the lowest such expert (kept by atomicMax on the device).
  const std::string range = grouped_fault_message(o, {kBadFirstRow, 0, 8 - 3, 0});
  EXPECT_NE(range.find("expert 3's rows [first, first + count) were out of order, overlapped the previous expert's "
                       "or passed max_rows = 1000 (that expert was computed as empty)"),
            std::string::npos)
      << range;
  EXPECT_NE(range.find("first rows >= 0, ascending, each range ending before the next begins"), std::string::npos)
      << range;
}

TEST(GroupedRouting, CountsSumToTheRowsInEachRouting) {
  for (Routing r : {Routing::uniform, Routing::zipf, Routing::one_hot, Routing::zipf_reversed})
    for (int experts : {1, 7, 8, 32, 128})
      for (std::int64_t rows : {0, 1, 1001, 16384, 65536}) {
        const auto counts = routing_counts(r, rows, experts);
        ASSERT_EQ(static_cast<int>(counts.size()), experts);
        EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), std::int64_t{0}), rows)
            << routing_name(r) << ", " << experts << " experts, " << rows << " rows";
        for (std::int32_t c : counts) EXPECT_GE(c, 0);
      }
}

TEST(GroupedRouting, UniformIsBalancedZipfFallsByRankAndOneHotFillsOneExpert) {
  EXPECT_EQ(routing_counts(Routing::uniform, 1001, 8), (std::vector<std::int32_t>{126, 125, 125, 125, 125, 125, 125, 125}));
  EXPECT_EQ(routing_counts(Routing::one_hot, 1001, 4), (std::vector<std::int32_t>{1001, 0, 0, 0}));
  const auto zipf = routing_counts(Routing::zipf, 65536, 128);
  for (std::size_t i = 1; i < zipf.size(); ++i) EXPECT_LE(zipf[i], zipf[i - 1]) << "expert " << i;
  // Expert i's share ~ (i + 1)^-1.2: expert 0 holds 2^1.2 = 2.30 times expert 1's rows, within rounding.
  EXPECT_NEAR(static_cast<double>(zipf[0]) / zipf[1], 2.2974, 0.01);
  EXPECT_GT(zipf[0], 65536 / 8) << "skewed: the heaviest expert holds far more than the mean of 512";
  // Few rows over many experts leave some empty: the empty experts a test needs.
  const auto sparse = routing_counts(Routing::zipf, 100, 128);
  EXPECT_GT(std::count(sparse.begin(), sparse.end(), 0), 0);
  // The largest-remainder rounding, by hand: 10 rows over 3 experts, weights 1, 2^-1.2, 3^-1.2
  // (1, 0.4353, 0.2676): exact shares 5.87, 2.56, 1.57 -> floors 5, 2, 1; the two rows left go to
  // the largest fractions, expert 0's (.87) and expert 2's (.57).
  EXPECT_EQ(routing_counts(Routing::zipf, 10, 3), (std::vector<std::int32_t>{6, 2, 2}));
  // zipf-reversed: the same counts, the heaviest expert last.
  auto reversed = routing_counts(Routing::zipf_reversed, 65536, 128);
  std::reverse(reversed.begin(), reversed.end());
  EXPECT_EQ(reversed, zipf);
  EXPECT_EQ(parse_routing("zipf-reversed"), Routing::zipf_reversed);
  EXPECT_EQ(parse_routing("one-hot"), Routing::one_hot);
  try {
    parse_routing("random");
    ADD_FAILURE() << "an unknown routing was accepted";
  } catch (const weft::Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected uniform, zipf, one-hot or zipf-reversed"), std::string::npos);
  }
}

TEST(GroupedBenchArgs, DefaultsAreTheIssueShapesAndOptionsParse) {
  const BenchArgs d = parse_bench_args({"weft-bench", "grouped_gemm"});
  ASSERT_EQ(d.grouped_cases.size(), 3u);
  EXPECT_EQ(d.grouped_cases[0].rows, 16384);
  EXPECT_EQ(d.grouped_cases[0].n, 7168);
  EXPECT_EQ(d.grouped_cases[0].k, 4096);
  EXPECT_EQ(d.grouped_cases[0].experts, 8);
  EXPECT_EQ(d.grouped_cases[1].experts, 128);
  EXPECT_EQ(d.grouped_cases[2].experts, 32);
  EXPECT_EQ(d.routing, "uniform");
  EXPECT_EQ(d.b_layout, "nk");
  const BenchArgs a = parse_bench_args({"weft-bench", "grouped_gemm", "--m", "1001,4096", "--n", "768", "--k", "2048",
                                        "--experts", "128", "--routing", "zipf", "--layout", "kn", "--dtype", "fp16"});
  ASSERT_EQ(a.grouped_cases.size(), 2u);
  EXPECT_EQ(a.grouped_cases[0].rows, 1001);
  EXPECT_EQ(a.grouped_cases[1].rows, 4096);
  EXPECT_EQ(a.grouped_cases[1].experts, 128);
  EXPECT_EQ(a.routing, "zipf");
  EXPECT_EQ(a.b_layout, "kn");
  EXPECT_EQ(a.dtype, "fp16");
  EXPECT_EQ(parse_bench_args({"weft-bench", "grouped_gemm", "--m", "64", "--n", "64", "--k", "64"}).grouped_cases[0].experts, 8);
  EXPECT_EQ(parse_bench_args({"weft-bench", "grouped_gemm", "--experts", "16"}).grouped_cases[1].experts, 16)
      << "--experts alone sets every default shape's";
}

TEST(GroupedBenchArgs, BadArgumentsNameWhatWasExpected) {
  auto error_of = [](std::vector<std::string> argv) {
    argv.insert(argv.begin(), "weft-bench");
    try {
      parse_bench_args(argv);
    } catch (const weft::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of({"grouped_gemm", "--routing", "skewed"}).find("expected uniform, zipf, one-hot or zipf-reversed"), std::string::npos);
  EXPECT_NE(error_of({"grouped_gemm", "--layout", "mn"}).find("--layout expects nk or kn, got 'mn'"), std::string::npos);
  EXPECT_NE(error_of({"grouped_gemm", "--dtype", "fp32"}).find("grouped_gemm takes --dtype bf16 or fp16"),
            std::string::npos);
  EXPECT_NE(error_of({"grouped_gemm", "--m", "64", "--n", "100", "--k", "64"}).find("N = 100 and K = 64 must be multiples of 8"),
            std::string::npos);
  EXPECT_NE(error_of({"grouped_gemm", "--experts", "0"}).find("--experts expects a whole number from 1 to 65536"),
            std::string::npos);
  EXPECT_NE(error_of({"gemm", "--routing", "zipf"}).find("--routing is for grouped_gemm"), std::string::npos);
  EXPECT_NE(error_of({"grouped_gemm", "--b-layout", "kn"}).find("--b-layout is for gemm"), std::string::npos);
  // ep's --experts keeps its own range.
  EXPECT_NE(error_of({"ep", "--experts", "2048"}).find("from 1 to 1024"), std::string::npos);
}

}  // namespace
