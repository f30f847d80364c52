// The tuning cache: what a file holds, what a fresh process reads back, and errors that name the file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "gemm/tune_cache.hpp"
#include "weft/core/error.hpp"

namespace {

using weft::gemm_detail::TuneCache;

std::string temp_path(const char* stem) {
  return std::string("/tmp/weft_tune_cache_") + stem + "_" + std::to_string(::getpid()) + "_" +
         std::to_string(std::rand());
}

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(TuneCache, InMemoryWithoutAFile) {
  TuneCache cache("");
  EXPECT_FALSE(cache.find("2048x8192x4096 bf16").has_value());
  cache.store("2048x8192x4096 bf16", "128x256x64 c2x1 cooperative, swizzle 2 along N");
  EXPECT_EQ(cache.find("2048x8192x4096 bf16").value_or(""), "128x256x64 c2x1 cooperative, swizzle 2 along N");
  EXPECT_FALSE(cache.find("2048x8192x4097 bf16").has_value());
}

TEST(TuneCache, AFreshCacheReadsWhatAnotherWroteAndTheLastLineWins) {
  const std::string path = temp_path("roundtrip");
  {
    TuneCache writer(path);
    EXPECT_FALSE(writer.find("a").has_value());  // absent file: nothing yet, no error
    writer.store("a", "first, swizzle 1 along M");
    writer.store("b", "cublasLt");
    writer.store("a", "second, swizzle 4 along N");
  }
  EXPECT_EQ(read_all(path),
            "weft-tune-1\ta\tfirst, swizzle 1 along M\nweft-tune-1\tb\tcublasLt\nweft-tune-1\ta\tsecond, swizzle 4 along N\n");
  TuneCache reader(path);
  EXPECT_EQ(reader.find("a").value_or(""), "second, swizzle 4 along N");
  EXPECT_EQ(reader.find("b").value_or(""), "cublasLt");
  std::remove(path.c_str());
}

TEST(TuneCache, SkipsOtherVersionsMalformedLinesAndALineStillBeingWritten) {
  const std::string path = temp_path("malformed");
  {
    std::ofstream out(path);
    out << "weft-tune-0\told\tformat\n"       // another version
        << "not a cache line\n"              // no tabs
        << "weft-tune-1\tempty value\t\n"    // no configuration
        << "weft-tune-1\tgood\tcfg\n"
        << "weft-tune-1\tpartial\tcf";        // no newline yet: another process is appending
  }
  TuneCache cache(path);
  EXPECT_EQ(cache.find("good").value_or(""), "cfg");
  EXPECT_FALSE(cache.find("old").has_value());
  EXPECT_FALSE(cache.find("empty value").has_value());
  EXPECT_FALSE(cache.find("partial").has_value());
  std::remove(path.c_str());
}

TEST(TuneCache, RefusesTabsAndNewlinesAndNamesAnUnwritableFile) {
  TuneCache cache("");
  EXPECT_THROW(cache.store("a\tb", "cfg"), weft::Error);
  EXPECT_THROW(cache.store("a", "c\nfg"), weft::Error);
  EXPECT_THROW(cache.store("", "cfg"), weft::Error);
  TuneCache nowhere("/nonexistent-weft-dir/cache");
  try {
    nowhere.store("a", "cfg");
    FAIL() << "a store into a missing directory did not throw";
  } catch (const weft::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-weft-dir/cache"), std::string::npos) << e.what();
  }
}

}  // namespace
