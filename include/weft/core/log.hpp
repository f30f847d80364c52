// weft/core/log.hpp - rank-tagged progress and debug messages on stderr.
//
// WEFT_LOG_LEVEL=error|warn|info|debug (default warn) picks what is printed.
#pragma once

#include "weft/core/error.hpp"

namespace weft {

enum class LogLevel { error = 0, warn = 1, info = 2, debug = 3 };

/// The level read once from WEFT_LOG_LEVEL.
LogLevel log_level();
/// Writes one line "[weft rank r/W] message" to stderr (atomically, one write call).
void log_line(LogLevel level, const std::string& message);

}  // namespace weft

#define WEFT_LOG(level, ...)                                                        \
  do {                                                                              \
    if (static_cast<int>(::weft::LogLevel::level) <= static_cast<int>(::weft::log_level())) \
      ::weft::log_line(::weft::LogLevel::level, ::weft::str(__VA_ARGS__));          \
  } while (0)
