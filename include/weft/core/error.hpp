// weft/core/error.hpp - the one error type weft throws, and the checks that raise it.
//
// Every failure carries enough context to act on without a debugger: which call
// failed, where, on which rank, and what was expected. Host code throws
// weft::Error; nothing in weft returns error codes to the user.
#pragma once

#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace weft {

/// The exception weft throws for every failure it detects (bad input, a failed
/// CUDA/NCCL/driver call, a timeout, a peer that went away).
class Error : public std::runtime_error {
 public:
  /// `what` is the whole message: what failed, on which rank, what was expected.
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

/// Concatenates any streamable values into one string: str("rank ", 3, " of ", 8).
template <class... Args>
std::string str(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

/// The rank prefix used in errors and logs ("[weft rank 1/2] "), or "[weft] "
/// before the rank is known. Set once by Context; thread-safe to read.
std::string rank_prefix();
/// Records this process's rank for rank_prefix(); called by the runtime.
void set_rank_for_messages(int rank, int world_size);
/// Sets what the message of every failed CUDA call ends with: note(error
/// code), the runtime's account of why the GPU stopped (a device wait that
/// timed out and trapped, naming rank and flag; a fatal error of another rank
/// sharing the GPU under MPS), or "". A failure then explains itself wherever
/// the call was. The Context sets it; an empty function clears it.
void set_cuda_failure_note(std::function<std::string(int)> note);

namespace detail {
[[noreturn]] void throw_error(const char* file, int line, const std::string& msg);
[[noreturn]] void throw_cuda(const char* file, int line, const char* expr, int code);
[[noreturn]] void throw_driver(const char* file, int line, const char* expr, int code);
[[noreturn]] void throw_nccl(const char* file, int line, const char* expr, int code);
}  // namespace detail

}  // namespace weft

/// Throws weft::Error with the message (any streamable values) if cond is false.
#define WEFT_REQUIRE(cond, ...)                                                \
  do {                                                                         \
    if (!(cond)) ::weft::detail::throw_error(__FILE__, __LINE__, ::weft::str(__VA_ARGS__)); \
  } while (0)

/// Throws weft::Error with the message (any streamable values).
#define WEFT_FAIL(...) ::weft::detail::throw_error(__FILE__, __LINE__, ::weft::str(__VA_ARGS__))

/// Checks a CUDA runtime call (cudaError_t); throws with the call's text and the error name.
#define WEFT_CUDA(expr)                                                         \
  do {                                                                          \
    int weft_rc_ = static_cast<int>(expr);                                      \
    if (weft_rc_ != 0) ::weft::detail::throw_cuda(__FILE__, __LINE__, #expr, weft_rc_); \
  } while (0)

/// Checks a CUDA driver call (CUresult) made through weft::driver().
#define WEFT_CU(expr)                                                           \
  do {                                                                          \
    int weft_rc_ = static_cast<int>(expr);                                      \
    if (weft_rc_ != 0) ::weft::detail::throw_driver(__FILE__, __LINE__, #expr, weft_rc_); \
  } while (0)

/// Checks an NCCL call (ncclResult_t).
#define WEFT_NCCL(expr)                                                         \
  do {                                                                          \
    int weft_rc_ = static_cast<int>(expr);                                      \
    if (weft_rc_ != 0) ::weft::detail::throw_nccl(__FILE__, __LINE__, #expr, weft_rc_); \
  } while (0)
