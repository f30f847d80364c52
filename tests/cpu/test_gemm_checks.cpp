// weft::Gemm's checks on the CPU (src/gemm/gemm_checks.hpp): a plan's
// HookLayout against its hook, and a run's typed operands against the plan,
// each refusal naming what was expected. Gemm::can_implement and the
// constructor return and throw exactly these texts (the GPU suite's
// Gemm.RejectsShapesItCannotTakeNamingWhy runs them through a plan).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "gemm/gemm_checks.hpp"
#include "weft/gemm/gemm.hpp"

namespace {

using weft::AddSource;
using weft::BLayout;
using weft::DType;
using weft::GemmArgs;
using weft::GemmHook;
using weft::GemmOptions;
using weft::HookLayout;
using weft::ReduceAddRows;
using weft::RowsDone;
using weft::RowSignals;
using weft::StoreProduct;
using weft::gemm_detail::hook_layout_error;
using weft::gemm_detail::run_args_error;

GemmOptions plan(GemmHook hook, HookLayout layout = {}, std::int64_t m = 1024) {
  GemmOptions o = weft::gemm_options(m, 1024, 512);
  o.hook = hook;
  o.hook_layout = layout;
  return o;
}

/// Aligned addresses that are never dereferenced: the checks read pointers only.
void* address(std::uintptr_t offset = 0) { return reinterpret_cast<void*>((std::uintptr_t{1} << 20) + offset); }

GemmArgs operands() { return GemmArgs{.a = address(), .b = address(), .c = address()}; }

/// Expects `error` to name `expected` (a refusal) or to be empty (expected "").
void expect_refusal(const std::string& error, const std::string& expected) {
  if (expected.empty()) {
    EXPECT_EQ(error, "");
  } else {
    EXPECT_NE(error.find(expected), std::string::npos) << "got: '" << error << "', expected it to name: " << expected;
  }
}

}  // namespace

TEST(GemmChecks, AHookLayoutFitsItsHook) {
  expect_refusal(hook_layout_error(plan(GemmHook::none)), "");
  expect_refusal(hook_layout_error(plan(GemmHook::none, {.rows_per_flag = 128})), "takes no HookLayout");
  expect_refusal(hook_layout_error(plan(GemmHook::report_rows, {.rows_per_flag = 128})), "for plans that wait");
  expect_refusal(hook_layout_error(plan(GemmHook::wait_a_rows, {.cols_per_flag = 256})),
                 "wait_source_rows plans only");
  expect_refusal(hook_layout_error(plan(GemmHook::wait_source_rows, {.rows_per_flag = 128, .cols_per_flag = 256})),
                 "");
  expect_refusal(hook_layout_error(plan(GemmHook::wait_source_rows, {.present_rows = 512})),
                 "wait_a_rows plans only");
  expect_refusal(hook_layout_error(plan(GemmHook::wait_a_rows, {.rows_per_flag = 128, .present_rows = 512})), "");
  expect_refusal(hook_layout_error(plan(GemmHook::report_rows, {.rows_per_report = -1})), "must be >= 0");
  expect_refusal(hook_layout_error(plan(GemmHook::report_rows, {.descending_block_rows = 384})),
                 "a walk by descending blocks of 384 rows needs M = 1024");
  expect_refusal(hook_layout_error(plan(GemmHook::report_rows, {.rows_per_report = 128, .descending_block_rows = 512})),
                 "");
  for (const HookLayout& layout : {HookLayout{.rows_per_report = 128}, HookLayout{.descending_block_rows = 512}}) {
    GemmOptions o = plan(GemmHook::wait_a_rows, layout);
    o.any_tile_order = true;
    expect_refusal(hook_layout_error(o), "can neither report stored rows");
  }
}

TEST(GemmChecks, OperandsArePresentAndAligned) {
  const GemmOptions o = plan(GemmHook::none);
  expect_refusal(run_args_error(o, false, operands()), "");
  GemmArgs missing = operands();
  missing.b = nullptr;
  expect_refusal(run_args_error(o, false, missing), "A, B and C must be device pointers");
  GemmArgs odd = operands();
  odd.c = address(2);
  expect_refusal(run_args_error(o, false, odd), "is not 16-byte aligned");
  // A shape only cuBLAS runs needs whole elements only.
  expect_refusal(run_args_error(o, true, odd), "");
  odd.c = address(1);
  expect_refusal(run_args_error(o, true, odd), "is not 2-byte aligned");
}

TEST(GemmChecks, TheEpilogueIsTheHooks) {
  GemmArgs x = operands();
  // A plain or reporting plan stores: no source, no added rows.
  for (GemmHook hook : {GemmHook::none, GemmHook::report_rows, GemmHook::wait_a_rows}) {
    x.epilogue = StoreProduct{};
    expect_refusal(run_args_error(plan(hook), false, x), "");
    x.epilogue = AddSource{.source = address()};
    expect_refusal(run_args_error(plan(hook), false, x), "expected the epilogue StoreProduct");
    x.epilogue = ReduceAddRows{.into = address(), .begin = 0, .end = 256};
    expect_refusal(run_args_error(plan(hook), false, x), "expected the epilogue StoreProduct");
  }
  // wait_source_rows adds an aligned source.
  const GemmOptions with_source = plan(GemmHook::wait_source_rows, {.rows_per_flag = 128});
  x.epilogue = StoreProduct{};
  expect_refusal(run_args_error(with_source, false, x), "expected the epilogue AddSource");
  x.epilogue = AddSource{.source = nullptr};
  expect_refusal(run_args_error(with_source, false, x), "expected the epilogue AddSource");
  x.epilogue = AddSource{.source = address(8)};
  expect_refusal(run_args_error(with_source, false, x), "16-byte aligned");
  x.epilogue = AddSource{.source = address()};
  expect_refusal(run_args_error(with_source, false, x), "");
  // add_rows adds whole row tiles into an aligned matrix.
  const GemmOptions adding = plan(GemmHook::add_rows, {.rows_per_flag = 128});
  x.epilogue = AddSource{.source = address()};
  expect_refusal(run_args_error(adding, false, x), "expected the epilogue ReduceAddRows");
  x.epilogue = ReduceAddRows{.into = address(), .begin = 512, .end = 1024};
  expect_refusal(run_args_error(adding, false, x), "");
  x.epilogue = ReduceAddRows{.into = nullptr, .begin = 512, .end = 1024};
  expect_refusal(run_args_error(adding, false, x), "need ReduceAddRows::into");
  x.epilogue = ReduceAddRows{.into = nullptr, .begin = 512, .end = 512};  // nothing added: no target needed
  expect_refusal(run_args_error(adding, false, x), "");
}

TEST(GemmChecks, RowRangesHoldWholeTilesAndNothingWaitsOutsideThem) {
  const std::int64_t m = 1000;  // not a multiple of 256: M itself is a bound
  const GemmOptions with_source = plan(GemmHook::wait_source_rows, {.rows_per_flag = 128}, m);
  static const weft::dev::World world{};
  const RowSignals waiting{.world = &world, .flags = static_cast<const std::uint64_t*>(address()),
                           .ready_begin = 768, .ready_end = m};
  GemmArgs x = operands();
  for (const auto& [begin, end, expected] : std::vector<std::tuple<std::int64_t, std::int64_t, std::string>>{
           {768, 1000, ""}, {0, 256, ""}, {128, 512, "must be whole row tiles"}, {512, 384, "must be whole row tiles"},
           {768, 1024, "must be whole row tiles"}}) {
    x.epilogue = AddSource{.source = address(), .plain_begin = begin, .plain_end = end};
    x.wait = {};
    expect_refusal(run_args_error(with_source, false, x), expected);
  }
  // Rows without a source read none, so none of them may wait.
  x.wait = waiting;
  x.epilogue = AddSource{.source = address(), .plain_begin = 768, .plain_end = m};
  expect_refusal(run_args_error(with_source, false, x), "");
  x.epilogue = AddSource{.source = address(), .plain_begin = 512, .plain_end = m};
  expect_refusal(run_args_error(with_source, false, x), "mark them ready");
  // Added rows: rows that wait must be among them (the partial sum they wait for is what they add onto).
  const GemmOptions adding = plan(GemmHook::add_rows, {.rows_per_flag = 128});
  x.wait = RowSignals{.world = &world, .flags = static_cast<const std::uint64_t*>(address()), .ready_begin = 0,
                      .ready_end = 512};
  x.epilogue = ReduceAddRows{.into = address(), .begin = 512, .end = 1024};
  expect_refusal(run_args_error(adding, false, x), "");
  x.wait.ready_end = 256;
  expect_refusal(run_args_error(adding, false, x), "must be among the added rows");
  x.epilogue = ReduceAddRows{.into = address(), .begin = 128, .end = 1024};
  expect_refusal(run_args_error(adding, false, x), "must be whole row tiles");
}

TEST(GemmChecks, WaitsAndReportsNeedThePlansLayout) {
  static const weft::dev::World world{};
  const RowSignals signals{.world = &world, .flags = static_cast<const std::uint64_t*>(address())};
  GemmArgs x = operands();
  x.wait = signals;
  expect_refusal(run_args_error(plan(GemmHook::wait_a_rows, {.rows_per_flag = 128}), false, x), "");
  expect_refusal(run_args_error(plan(GemmHook::wait_a_rows), false, x), "HookLayout::rows_per_flag");
  expect_refusal(run_args_error(plan(GemmHook::report_rows), false, x), "waits for nothing");
  expect_refusal(run_args_error(plan(GemmHook::none), false, x), "waits for nothing");
  x.wait.world = nullptr;
  expect_refusal(run_args_error(plan(GemmHook::wait_a_rows, {.rows_per_flag = 128}), false, x), "need the World");
  x.wait = RowSignals{.consume = true};
  expect_refusal(run_args_error(plan(GemmHook::wait_a_rows, {.rows_per_flag = 128}), false, x), "no flags were given");
  // Reports go in the plan's bands.
  x.wait = {};
  x.report = RowsDone{.counters = static_cast<std::uint64_t*>(address())};
  expect_refusal(run_args_error(plan(GemmHook::report_rows, {.rows_per_report = 128}), false, x), "");
  expect_refusal(run_args_error(plan(GemmHook::report_rows), false, x), "HookLayout::rows_per_report");
}

TEST(GemmChecks, TheTileWalkStartsInsideMAndOnABlock) {
  GemmArgs x = operands();
  x.first_row = 512;
  expect_refusal(run_args_error(plan(GemmHook::report_rows), false, x), "");
  expect_refusal(run_args_error(plan(GemmHook::none), false, x), "rotates the tile order");
  GemmOptions any_order = plan(GemmHook::wait_a_rows);
  any_order.any_tile_order = true;
  expect_refusal(run_args_error(any_order, false, x), "rotates the tile order");
  x.first_row = 1024;
  expect_refusal(run_args_error(plan(GemmHook::report_rows), false, x), "must be in [0, M = 1024)");
  x.first_row = -256;
  expect_refusal(run_args_error(plan(GemmHook::report_rows), false, x), "must be in [0, M = 1024)");
  const GemmOptions blocks = plan(GemmHook::report_rows, {.descending_block_rows = 512});
  x.first_row = 512;
  expect_refusal(run_args_error(blocks, false, x), "");
  x.first_row = 256;
  expect_refusal(run_args_error(blocks, false, x), "starts at a block's first row");
}
