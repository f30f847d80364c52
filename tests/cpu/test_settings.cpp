// The WEFT_* settings a Context reads once (weft/runtime/settings.hpp): their
// defaults, every one parsed from an environment, and a malformed value
// refused naming its variable.
#include <gtest/gtest.h>

#include <string>

#include "weft/core/error.hpp"
#include "weft/runtime/settings.hpp"

using weft::EnvMap;
using weft::Settings;

TEST(Settings, DefaultsWhereNothingIsSet) {
  const Settings s = Settings::read({});
  EXPECT_EQ(s.heap_bytes, 1ull << 30);
  EXPECT_EQ(s.store_timeout, std::chrono::seconds(120));
  EXPECT_EQ(s.wait_timeout, std::chrono::seconds(60));
  EXPECT_FALSE(s.check_calls);
  EXPECT_TRUE(s.plan_graphs);
  EXPECT_EQ(s.trace_overlap, 0);
  EXPECT_FALSE(s.tile_waits);
  EXPECT_FALSE(s.overlap_min_chunk.has_value()) << "absent: each plan's own floor";
  EXPECT_EQ(s.ce_chunk, 0u);
  // Set to 0: no floor at all, which is not the same as absent.
  EXPECT_EQ(Settings::read(EnvMap{{"WEFT_OVERLAP_MIN_CHUNK", "0"}}).overlap_min_chunk, std::optional<std::uint64_t>(0));
}

TEST(Settings, EveryVariableIsRead) {
  const Settings s = Settings::read(EnvMap{{"WEFT_HEAP_SIZE", "256M"},
                                           {"WEFT_STORE_TIMEOUT", "7"},
                                           {"WEFT_WAIT_TIMEOUT", "0.5"},
                                           {"WEFT_CHECK_CALLS", "1"},
                                           {"WEFT_PLAN_GRAPHS", "0"},
                                           {"WEFT_TRACE_OVERLAP", "3"},
                                           {"WEFT_TILE_WAITS", "1"},
                                           {"WEFT_OVERLAP_MIN_CHUNK", "2M"},
                                           {"WEFT_CE_CHUNK", "16M"}});
  EXPECT_EQ(s.heap_bytes, 256ull << 20);
  EXPECT_EQ(s.store_timeout, std::chrono::seconds(7));
  EXPECT_EQ(s.wait_timeout, std::chrono::milliseconds(500));
  EXPECT_TRUE(s.check_calls);
  EXPECT_FALSE(s.plan_graphs);
  EXPECT_EQ(s.trace_overlap, 3);
  EXPECT_TRUE(s.tile_waits);
  EXPECT_EQ(s.overlap_min_chunk, std::optional<std::uint64_t>(2ull << 20));
  EXPECT_EQ(s.ce_chunk, 16ull << 20);
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
