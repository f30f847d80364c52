// weft/core/env.hpp - typed reads of environment settings, with errors that name the variable.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace weft {

/// A snapshot of environment variables (name -> value). Parsing code takes one
/// of these instead of calling getenv, so it can be tested with made-up environments.
using EnvMap = std::map<std::string, std::string>;

/// The current process's environment as an EnvMap.
EnvMap process_env();

/// Parses a byte count such as "4096", "64K", "256M", "2G" or "1GiB" (powers of 1024).
/// Throws weft::Error naming `what` and the accepted forms on malformed input.
std::uint64_t parse_bytes(const std::string& text, const std::string& what = "byte count");

/// Formats a byte count compactly: 1024 -> "1K", 268435456 -> "256M", 1000 -> "1000".
std::string format_bytes(std::uint64_t bytes);

/// Reads an integer variable; absent -> fallback; malformed -> weft::Error naming it.
std::int64_t env_int(const EnvMap& env, const std::string& name, std::int64_t fallback);
/// Reads a byte-count variable (parse_bytes forms); absent -> fallback.
std::uint64_t env_bytes(const EnvMap& env, const std::string& name, std::uint64_t fallback);
/// Reads a string variable; absent -> std::nullopt.
std::optional<std::string> env_str(const EnvMap& env, const std::string& name);
/// Reads a duration in seconds (fractions allowed, "0.5"); absent -> fallback.
std::chrono::milliseconds env_seconds(const EnvMap& env, const std::string& name,
                                      std::chrono::milliseconds fallback);

}  // namespace weft
