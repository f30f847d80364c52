#include "tune_cache.hpp"

#include <cuda_runtime_api.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>

#include "weft/core/env.hpp"
#include "weft/core/error.hpp"

namespace weft::gemm_detail {
namespace {

constexpr const char* kTag = "weft-tune-1";

bool plain_field(const std::string& s) { return s.find_first_of("\t\n\r") == std::string::npos; }

}  // namespace

std::string device_name() {
  static std::mutex mutex;
  static std::map<int, std::string> names;
  int device = 0;
  WEFT_CUDA(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  auto it = names.find(device);
  if (it == names.end()) {
    cudaDeviceProp prop{};
    WEFT_CUDA(cudaGetDeviceProperties(&prop, device));
    it = names.emplace(device, prop.name).first;
  }
  return it->second;
}

TuneCache::TuneCache(std::string file) : file_(std::move(file)) {}

TuneCache& TuneCache::process() {
  static TuneCache cache(env_str(process_env(), "WEFT_TUNE_CACHE").value_or(""));
  return cache;
}

void TuneCache::load_locked() {
  if (loaded_) return;
  loaded_ = true;
  if (file_.empty()) return;
  std::FILE* f = std::fopen(file_.c_str(), "r");
  if (!f) {
    if (errno == ENOENT) return;  // the first store creates it
    WEFT_FAIL("WEFT_TUNE_CACHE: cannot read '", file_, "': ", std::strerror(errno));
  }
  std::string text;
  char buf[4096];
  for (std::size_t got; (got = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, got);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  WEFT_REQUIRE(!failed, "WEFT_TUNE_CACHE: reading '", file_, "' failed");
  text.resize(text.rfind('\n') + 1);  // a line another process is still appending: not yet
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    // Lines of another format version, or cut short by a crash, are skipped:
    // the tuner times that shape again and appends a good line.
    const auto t1 = line.find('\t');
    const auto t2 = t1 == std::string::npos ? t1 : line.find('\t', t1 + 1);
    if (t2 == std::string::npos || line.compare(0, t1, kTag) != 0 || t2 + 1 >= line.size()) continue;
    entries_[line.substr(t1 + 1, t2 - t1 - 1)] = line.substr(t2 + 1);
  }
}

std::optional<std::string> TuneCache::find(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  load_locked();
  const auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

void TuneCache::store(const std::string& key, const std::string& config) {
  WEFT_REQUIRE(plain_field(key) && plain_field(config) && !key.empty() && !config.empty(),
               "TuneCache: keys and configurations must be non-empty and hold no tab or newline, got '", key, "' -> '",
               config, "'");
  std::lock_guard<std::mutex> lock(mutex_);
  load_locked();
  entries_[key] = config;
  if (file_.empty()) return;
  // One write of the whole line to a file opened for appending: lines from
  // ranks writing at once do not interleave (O_APPEND, local file systems).
  const std::string line = std::string(kTag) + "\t" + key + "\t" + config + "\n";
  std::FILE* f = std::fopen(file_.c_str(), "a");
  if (!f) WEFT_FAIL("WEFT_TUNE_CACHE: cannot append to '", file_, "': ", std::strerror(errno));
  std::setvbuf(f, nullptr, _IOFBF, line.size() + 1);
  const bool written = std::fwrite(line.data(), 1, line.size(), f) == line.size();
  const bool closed = std::fclose(f) == 0;
  WEFT_REQUIRE(written && closed, "WEFT_TUNE_CACHE: writing to '", file_, "' failed: ", std::strerror(errno));
}

}  // namespace weft::gemm_detail
