// The WEFT_* settings a Context reads once (weft/runtime/settings.hpp): their
// defaults, every one parsed from an environment, and a malformed value
// refused naming its variable.
#include <gtest/gtest.h>

#include <string>

#include "weft/core/error.hpp"
#include "weft/runtime/settings.hpp"

using weft::EnvMap;
using weft::Settings;

namespace {
/// Every field of `got` against `want`, each named in a failure.
void expect_settings(const Settings& got, const Settings& want) {
  EXPECT_EQ(got.heap_bytes, want.heap_bytes);
  EXPECT_EQ(got.store_timeout, want.store_timeout);
  EXPECT_EQ(got.wait_timeout, want.wait_timeout);
  EXPECT_EQ(got.check_calls, want.check_calls);
  EXPECT_EQ(got.plan_graphs, want.plan_graphs);
  EXPECT_EQ(got.trace_overlap, want.trace_overlap);
  EXPECT_EQ(got.tile_waits, want.tile_waits);
  EXPECT_EQ(got.overlap_min_chunk, want.overlap_min_chunk);
  EXPECT_EQ(got.ce_chunk, want.ce_chunk);
}
}  // namespace

TEST(Settings, DefaultsWhereNothingIsSet) {
  // overlap_min_chunk absent: each plan's own floor.
  expect_settings(Settings::read({}),
                  Settings{.heap_bytes = 1ull << 30, .store_timeout = std::chrono::seconds(120),
                           .wait_timeout = std::chrono::seconds(60), .check_calls = false, .plan_graphs = true,
                           .trace_overlap = 0, .tile_waits = false, .overlap_min_chunk = std::nullopt, .ce_chunk = 0});
  // Set to 0: no floor at all, which is not the same as absent.
  EXPECT_EQ(Settings::read(EnvMap{{"WEFT_OVERLAP_MIN_CHUNK", "0"}}).overlap_min_chunk, std::optional<std::uint64_t>(0));
}

TEST(Settings, EveryVariableIsRead) {
  expect_settings(Settings::read(EnvMap{{"WEFT_HEAP_SIZE", "256M"},
                                        {"WEFT_STORE_TIMEOUT", "7"},
                                        {"WEFT_WAIT_TIMEOUT", "0.5"},
                                        {"WEFT_CHECK_CALLS", "1"},
                                        {"WEFT_PLAN_GRAPHS", "0"},
                                        {"WEFT_TRACE_OVERLAP", "3"},
                                        {"WEFT_TILE_WAITS", "1"},
                                        {"WEFT_OVERLAP_MIN_CHUNK", "2M"},
                                        {"WEFT_CE_CHUNK", "16M"}}),
                  Settings{.heap_bytes = 256ull << 20, .store_timeout = std::chrono::seconds(7),
                           .wait_timeout = std::chrono::milliseconds(500), .check_calls = true, .plan_graphs = false,
                           .trace_overlap = 3, .tile_waits = true, .overlap_min_chunk = 2ull << 20,
                           .ce_chunk = 16ull << 20});
}

TEST(Settings, AMalformedValueNamesItsVariable) {
  auto message = [](const EnvMap& env) {
    try {
      Settings::read(env);
    } catch (const weft::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  for (const auto& [name, value] : std::initializer_list<std::pair<const char*, const char*>>{
           {"WEFT_HEAP_SIZE", "lots"},
           {"WEFT_WAIT_TIMEOUT", "soon"},
           {"WEFT_CHECK_CALLS", "2"},
           {"WEFT_PLAN_GRAPHS", "yes"},
           {"WEFT_TRACE_OVERLAP", "-1"},
           {"WEFT_TILE_WAITS", "on"},
           {"WEFT_CE_CHUNK", "16Q"}}) {
    const std::string why = message(EnvMap{{name, value}});
    EXPECT_NE(why.find(name), std::string::npos) << name << "=" << value << ": " << why;
  }
}
