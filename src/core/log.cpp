#include "weft/core/log.hpp"

#include <unistd.h>

#include <cstdlib>
#include <string>

namespace weft {

LogLevel log_level() {
  static const LogLevel level = [] {
    const char* v = std::getenv("WEFT_LOG_LEVEL");
    std::string s = v ? v : "";
    if (s == "error") return LogLevel::error;
    if (s == "info") return LogLevel::info;
    if (s == "debug") return LogLevel::debug;
    return LogLevel::warn;
  }();
  return level;
}

void log_line(LogLevel level, const std::string& message) {
  static const char* names[] = {"error: ", "warning: ", "", "debug: "};
  std::string line = rank_prefix() + names[static_cast<int>(level)] + message + "\n";
  // One write() per line so lines of different ranks do not interleave mid-line.
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

}  // namespace weft
