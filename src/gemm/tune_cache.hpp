// tune_cache.hpp (private) - the tuner's choices by key, kept for this process and, with
// WEFT_TUNE_CACHE=FILE, across processes, so a GEMM of a shape already tuned starts at once.
#pragma once

#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

namespace weft::gemm_detail {

/// Configurations the tuner chose ("128x256x64 c2x1 cooperative, swizzle 4
/// along N", as Gemm::config prints them), by a key that holds everything the
/// choice depended on (shape, types, hook, tile-order and band constraints,
/// the GPU, the compiled candidates). Entries live in memory; with a file,
/// they are read from it on first use and each new one is appended as one
/// line, "weft-tune-1<TAB>key<TAB>config", so ranks and processes sharing the
/// file add to it without rewriting it (the last line for a key wins).
/// Thread-safe.
class TuneCache {
 public:
  /// `file` empty: this process only.
  explicit TuneCache(std::string file);

  /// The configuration stored for `key`, if any. Reads the file on first use;
  /// a file that exists but cannot be read throws weft::Error naming it.
  std::optional<std::string> find(const std::string& key);
  /// Keeps `config` for `key`, and appends it to the file (created if absent;
  /// one that cannot be written throws weft::Error naming it). Keys and
  /// configurations must hold no tab or newline.
  void store(const std::string& key, const std::string& config);

  /// The process's cache: its file from WEFT_TUNE_CACHE (unset: memory only).
  static TuneCache& process();

 private:
  void load_locked();

  std::mutex mutex_;
  std::string file_;
  bool loaded_ = false;
  std::unordered_map<std::string, std::string> entries_;
};

/// The current GPU's name, part of a tuning cache key (with the SM count).
/// Per device: a process may drive more than one.
std::string device_name();

}  // namespace weft::gemm_detail
