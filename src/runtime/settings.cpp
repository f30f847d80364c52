#include "weft/runtime/settings.hpp"

#include "weft/core/error.hpp"

namespace weft {

namespace {
/// A 0/1 switch; anything else names the variable.
bool env_switch(const EnvMap& env, const char* name, bool fallback) {
  const std::int64_t v = env_int(env, name, fallback ? 1 : 0);
  WEFT_REQUIRE(v == 0 || v == 1, name, " must be 0 or 1, got ", v);
  return v == 1;
}
}  // namespace

Settings Settings::read(const EnvMap& env) {
  Settings s;
  s.heap_bytes = env_bytes(env, "WEFT_HEAP_SIZE", s.heap_bytes);
  s.store_timeout = env_seconds(env, "WEFT_STORE_TIMEOUT", s.store_timeout);
  s.wait_timeout = env_seconds(env, "WEFT_WAIT_TIMEOUT", s.wait_timeout);
  s.check_calls = env_switch(env, "WEFT_CHECK_CALLS", s.check_calls);
  s.plan_graphs = env_switch(env, "WEFT_PLAN_GRAPHS", s.plan_graphs);
  const std::int64_t trace = env_int(env, "WEFT_TRACE_OVERLAP", s.trace_overlap);
  WEFT_REQUIRE(trace >= 0 && trace <= 1'000'000, "WEFT_TRACE_OVERLAP must be a count of calls, 0 to 1000000, got ",
               trace);
  s.trace_overlap = static_cast<int>(trace);
  s.tile_waits = env_switch(env, "WEFT_TILE_WAITS", s.tile_waits);
  if (env.count("WEFT_OVERLAP_MIN_CHUNK")) s.overlap_min_chunk = env_bytes(env, "WEFT_OVERLAP_MIN_CHUNK", 0);
  s.ce_chunk = env_bytes(env, "WEFT_CE_CHUNK", s.ce_chunk);
  return s;
}

}  // namespace weft
