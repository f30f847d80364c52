#include "weft/core/error.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <mutex>

#include "weft/core/driver.hpp"

namespace weft {
namespace {
std::mutex g_prefix_mutex;
std::string g_prefix = "[weft] ";
}  // namespace

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

void throw_error(const char* file, int line, const std::string& msg) {
  throw Error(rank_prefix() + msg + where(file, line));
}

void throw_cuda(const char* file, int line, const char* expr, int code) {
  auto err = static_cast<cudaError_t>(code);
  throw Error(str(rank_prefix(), expr, " failed: ", cudaGetErrorName(err), " (", code, "): ",
                  cudaGetErrorString(err), where(file, line)));
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
