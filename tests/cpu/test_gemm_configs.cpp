// The compiled GEMM configurations, on the CPU: plans force kernels by name
// (GemmOptions::config; GemmRs's ring steps), so a name must say what its
// kernel is - tile, cluster, schedule, hook - and name one kernel per types
// and layout. A forced name that stopped resolving would fall back to the
// tuner's pick without a word, so the ring steps' names are checked too.
#include <gtest/gtest.h>

#include <regex>
#include <set>
#include <string>
#include <tuple>

#include "gemm/config.hpp"
#include "ops/ring_step.hpp"
#include "weft/gemm/gemm.hpp"

namespace {

using weft::BLayout;
using weft::DType;
using weft::GemmHook;
using weft::GemmOptions;
using weft::gemm_detail::all_configs;

TEST(GemmConfigs, NamesSayTileClusterScheduleAndHook) {
  // "TMxTNxTK cCMxCN cooperative|pingpong[ swapped| stream-K][ hooked[+...source...|+add]]"
  const std::regex name_re(
      R"(^(\d+)x(\d+)x(\d+) c(\d+)x(\d+) (cooperative|pingpong)( swapped| stream-K)?( hooked(?:(\+[a-z]*source[a-z0-9-]*)|(\+add))?)?$)");
  int checked = 0;
  for (const auto* c : all_configs()) {
    SCOPED_TRACE(c->name);
    std::cmatch m;
    ASSERT_TRUE(std::regex_match(c->name, m, name_re)) << "a configuration name outside the convention";
    EXPECT_EQ(std::stoi(m[1]), c->tile_m);
    EXPECT_EQ(std::stoi(m[2]), c->tile_n);
    EXPECT_EQ(std::stoi(m[4]), c->cluster_m);
    EXPECT_EQ(std::stoi(m[5]), c->cluster_n);
    EXPECT_EQ(m[8].matched, c->hooked) << "\" hooked\" in the name, and only there";
    EXPECT_EQ(m[9].matched, c->with_source) << "\"source\" in the name, and only there";
    EXPECT_EQ(m[10].matched, c->adds_rows) << "\"+add\" in the name, and only there";
    // Only the cooperative kernel's single store warp can report stored rows.
    EXPECT_EQ(c->reports, c->hooked && m[6] == "cooperative");
    EXPECT_FALSE(c->cublas);
    ++checked;
  }
  // Every row the build compiled (cmake/WeftGemmKernels.cmake counts them: all
  // 25, or the CI subset) is in the list, once.
  EXPECT_EQ(checked, WEFT_GEMM_KERNEL_COUNT) << "a kernel compiled from src/gemm/kernel_table.cmake is missing from all_configs()";
}

TEST(GemmConfigs, AKernelOfClustersIsGivenWholeClustersOfSms) {
  using weft::gemm_detail::whole_cluster_sms;
  EXPECT_EQ(whole_cluster_sms(3, 2), 2);  // a grid of 3 with 2x1 clusters does not launch
  EXPECT_EQ(whole_cluster_sms(63, 2), 62);
  EXPECT_EQ(whole_cluster_sms(132, 2), 132);
  EXPECT_EQ(whole_cluster_sms(1, 2), 2);  // below one cluster: one cluster
  EXPECT_EQ(whole_cluster_sms(7, 1), 7);
  EXPECT_EQ(whole_cluster_sms(66, 4), 64);
}

TEST(GemmConfigs, EachNameIsOneKernelPerTypesAndLayout) {
  std::set<std::tuple<DType, DType, BLayout, std::string>> seen;
  for (const auto* c : all_configs())
    EXPECT_TRUE(seen.insert({c->input, c->output, c->b_layout, c->name}).second)
        << c->name << " twice for the same types and B layout: forcing it by name would be ambiguous";
}

TEST(GemmConfigs, TheRingStepsForcedNamesResolve) {
  // The names GemmRs's ring steps force (ops_detail::ring_step_config), for
  // B [N, K] and [K, N] (a Linear's weight either way).
  using weft::ops_detail::ring_step_config;
  const std::string plain = ring_step_config(GemmHook::none), source = ring_step_config(GemmHook::wait_source_rows);
  EXPECT_NE(plain, source);
  // Every overlapped operator runs bf16 and fp16: each type has every ring step's kernel.
  for (DType t : {DType::bf16, DType::fp16}) {
    SCOPED_TRACE(to_string(t));
    for (BLayout layout : {BLayout::nk, BLayout::kn}) {
      GemmOptions o;
      o.m = 4096, o.n = 8192, o.k = 4096;
      o.b_layout = layout;
      o.input = o.output = t;
      SCOPED_TRACE(layout == BLayout::nk ? "B [N, K]" : "B [K, N]");
      o.hook = GemmHook::none;
      EXPECT_TRUE(weft::Gemm::has_configuration(o, plain));
      EXPECT_FALSE(weft::Gemm::has_configuration(o, source)) << "a source kernel must not serve a plain GEMM";
      o.hook = GemmHook::wait_source_rows;
      EXPECT_TRUE(weft::Gemm::has_configuration(o, source));
      EXPECT_FALSE(weft::Gemm::has_configuration(o, plain)) << "a plain kernel cannot wait for source rows";
      if (layout == BLayout::nk) {
        o.hook = GemmHook::report_rows;
        EXPECT_TRUE(weft::Gemm::has_configuration(o, ring_step_config(GemmHook::report_rows)));
      }
    }
    // GemmRs's one-launch way at 2 ranks adds its own block onto the peer's partial sum.
    for (BLayout layout : {BLayout::nk, BLayout::kn}) {
      GemmOptions o;
      o.m = 4096, o.n = 8192, o.k = 4096;
      o.b_layout = layout;
      o.input = o.output = t;
      o.hook = GemmHook::add_rows;
      EXPECT_TRUE(weft::Gemm::has_configuration(o, ring_step_config(GemmHook::add_rows)));
      o.hook = GemmHook::report_rows;
      EXPECT_FALSE(weft::Gemm::has_configuration(o, ring_step_config(GemmHook::add_rows))) << "an adding kernel only adds";
    }
  }
}

}  // namespace
