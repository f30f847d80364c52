#include "weft/core/env.hpp"

#include <cctype>
#include <cmath>
#include <cstdlib>

#include "weft/core/error.hpp"

extern char** environ;

namespace weft {

EnvMap process_env() {
  EnvMap env;
  for (char** e = environ; e && *e; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

std::uint64_t parse_bytes(const std::string& text, const std::string& what) {
  auto bad = [&] {
    WEFT_FAIL("cannot read ", what, " '", text,
              "': expected a whole number of bytes, optionally with a suffix K, M, G or T "
              "(powers of 1024), e.g. 4096, 64K, 256M, 2G");
  };
  std::size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  if (i == 0) bad();
  std::uint64_t value = 0;
  for (std::size_t j = 0; j < i; ++j) {
    if (value > (UINT64_MAX - 9) / 10) bad();
    value = value * 10 + static_cast<std::uint64_t>(text[j] - '0');
  }
  std::string suffix = text.substr(i);
  for (auto& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  int shift = 0;
  if (suffix.empty() || suffix == "B") shift = 0;
  else if (suffix == "K" || suffix == "KB" || suffix == "KIB") shift = 10;
  else if (suffix == "M" || suffix == "MB" || suffix == "MIB") shift = 20;
  else if (suffix == "G" || suffix == "GB" || suffix == "GIB") shift = 30;
  else if (suffix == "T" || suffix == "TB" || suffix == "TIB") shift = 40;
  else bad();
  if (shift && value > (UINT64_MAX >> shift)) bad();
  return value << shift;
}

std::string format_bytes(std::uint64_t bytes) {
  const char* units[] = {"", "K", "M", "G", "T"};
  int u = 0;
  while (u < 4 && bytes >= 1024 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++u;
  }
  return str(bytes, units[u]);
}

std::int64_t env_int(const EnvMap& env, const std::string& name, std::int64_t fallback) {
  auto it = env.find(name);
  if (it == env.end() || it->second.empty()) return fallback;
  const std::string& s = it->second;
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(s.c_str(), &end, 10);
  WEFT_REQUIRE(errno == 0 && end && *end == '\0', "environment variable ", name, "='", s,
               "' is not an integer");
  return v;
}

std::uint64_t env_bytes(const EnvMap& env, const std::string& name, std::uint64_t fallback) {
  auto it = env.find(name);
  if (it == env.end() || it->second.empty()) return fallback;
  return parse_bytes(it->second, "environment variable " + name);
}

std::optional<std::string> env_str(const EnvMap& env, const std::string& name) {
  auto it = env.find(name);
  if (it == env.end() || it->second.empty()) return std::nullopt;
  return it->second;
}

std::chrono::milliseconds env_seconds(const EnvMap& env, const std::string& name,
                                      std::chrono::milliseconds fallback) {
  auto it = env.find(name);
  if (it == env.end() || it->second.empty()) return fallback;
  char* end = nullptr;
  double v = std::strtod(it->second.c_str(), &end);
  WEFT_REQUIRE(end && *end == '\0' && std::isfinite(v) && v >= 0, "environment variable ", name,
               "='", it->second, "' is not a non-negative number of seconds");
  return std::chrono::milliseconds(static_cast<std::int64_t>(v * 1000.0));
}

}  // namespace weft
