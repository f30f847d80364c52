// error_text.hpp - what the CPU tests read from a weft::Error: its message, or
// nothing when the call succeeded, and whether a message contains a part.
#pragma once

#include <functional>
#include <string>

#include "weft/core/error.hpp"

namespace weft::test {

/// The message of the weft::Error `f` throws, or "" when it returns.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

/// Whether `text` contains `part`.
inline bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace weft::test
