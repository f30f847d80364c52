#include "weft/core/error.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <mutex>

#include "weft/core/driver.hpp"

namespace weft {
namespace {
std::mutex g_prefix_mutex;
std::string g_prefix = "[weft] ";
std::function<std::string(int)> g_cuda_note;  // guarded by g_prefix_mutex

std::string cuda_failure_note(int code) {
  std::function<std::string(int)> note;
  {
    std::lock_guard<std::mutex> lock(g_prefix_mutex);
    note = g_cuda_note;
  }
  std::string text = note ? note(code) : std::string();
  return text.empty() ? text : ". " + text;
}
}  // namespace

void set_cuda_failure_note(std::function<std::string(int)> note) {
  std::lock_guard<std::mutex> lock(g_prefix_mutex);
  g_cuda_note = std::move(note);
}

std::string rank_prefix() {
  std::lock_guard<std::mutex> lock(g_prefix_mutex);
  return g_prefix;
}

void set_rank_for_messages(int rank, int world_size) {
  std::lock_guard<std::mutex> lock(g_prefix_mutex);
  g_prefix = str("[weft rank ", rank, "/", world_size, "] ");
}

namespace detail {
namespace {
std::string where(const char* file, int line) {
  std::string f = file;
  auto pos = f.rfind("/src/");
  if (pos == std::string::npos) pos = f.rfind("/include/");
  if (pos != std::string::npos) f = f.substr(pos + 1);
  return str(" (", f, ":", line, ")");
}
}  // namespace

// A message about input or state says what was expected, in the user's terms:
// no source location (noise to a user). A failed CUDA, driver or NCCL call
// keeps its location, which a bug report needs.
void throw_error(const char*, int, const std::string& msg) { throw Error(rank_prefix() + msg); }

void throw_cuda(const char* file, int line, const char* expr, int code) {
  auto err = static_cast<cudaError_t>(code);
  throw Error(str(rank_prefix(), expr, " failed: ", cudaGetErrorName(err), " (", code, "): ",
                  cudaGetErrorString(err), where(file, line), cuda_failure_note(code)));
}

void throw_driver(const char* file, int line, const char* expr, int code) {
  throw Error(str(rank_prefix(), expr, " failed: ", driver_error_name(code), " (", code, ")",
                  where(file, line)));
}

void throw_nccl(const char* file, int line, const char* expr, int code) {
  throw Error(str(rank_prefix(), expr, " failed: ",
                  ncclGetErrorString(static_cast<ncclResult_t>(code)), " (", code, ")",
                  where(file, line)));
}
}  // namespace detail
}  // namespace weft
