// weft's layers only point down: core <- runtime <- device <- gemm <- ops <- tools.
// Every #include in include/weft, src and tools is resolved to the file it
// names, and a file may include only files of its own layer or a lower one.
// The breaks not yet removed are listed below, each with what removes it; the
// list must shrink, never grow: an entry that no longer occurs fails too.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

const std::vector<std::string> kLayers = {"core", "runtime", "device", "gemm", "ops", "tools"};

/// The layer of a file, by its path relative to the source tree; -1 if none
/// (tests, examples, third-party headers).
int layer_of(const std::string& rel) {
  if (rel.rfind("tools/", 0) == 0) return 5;
  if (rel == "include/weft/device.cuh") return 2;
  for (const char* root : {"include/weft/", "src/"}) {
    const std::string r(root);
    if (rel.rfind(r, 0) != 0) continue;
    const std::string first = rel.substr(r.size(), rel.find('/', r.size()) - r.size());
    const auto it = std::find(kLayers.begin(), kLayers.end(), first);
    if (it != kLayers.end()) return static_cast<int>(it - kLayers.begin());
  }
  return -1;
}

/// Includes from a lower layer to a higher one that are still there, as
/// "includer -> included", with what removes each (docs/ROADMAP.md, the
/// restructure).
const std::map<std::string, std::string> kKnownBreaks = {
    {"src/runtime/stream_barrier.cu -> include/weft/device/shmem.cuh",
     "the stream barrier's kernel moves out of runtime, into the device layer's collectives"},
};

/// Private headers (src/<layer>/) included from another layer's folder, as
/// "includer -> included": a layer above uses only the public API below it.
const std::map<std::string, std::string> kKnownPrivateUses = {};

struct Break {
  std::string edge;
  std::string where;
  bool private_use = false;  ///< same or lower layer, but another layer's private header
};

std::vector<Break> find_breaks(const fs::path& root) {
  std::vector<Break> breaks;
  const std::regex include_line(R"re(^\s*#\s*include\s+"([^"]+)")re");
  for (const char* top : {"include/weft", "src", "tools"}) {
    for (const auto& entry : fs::recursive_directory_iterator(root / top)) {
      if (!entry.is_regular_file()) continue;
      const std::string ext = entry.path().extension().string();
      if (ext != ".hpp" && ext != ".cpp" && ext != ".cu" && ext != ".cuh" && ext != ".h") continue;
      const std::string rel = fs::relative(entry.path(), root).generic_string();
      const int from = layer_of(rel);
      if (from < 0) continue;
      std::ifstream in(entry.path());
      std::string line;
      int line_no = 0;
      while (std::getline(in, line)) {
        ++line_no;
        std::smatch m;
        if (!std::regex_search(line, m, include_line)) continue;
        const std::string name = m[1];
        // "weft/..." names the public tree; anything else is relative to the includer.
        fs::path target = name.rfind("weft/", 0) == 0 ? root / "include" / name : entry.path().parent_path() / name;
        if (!fs::exists(target)) continue;  // a third-party header (CUTLASS, CUDA)
        const std::string target_rel = fs::relative(fs::weakly_canonical(target), root).generic_string();
        const int to = layer_of(target_rel);
        if (to > from) breaks.push_back({rel + " -> " + target_rel, rel + ":" + std::to_string(line_no)});
        // A private header: under src/, in another layer's folder than the includer's.
        const bool private_target = target_rel.rfind("src/", 0) == 0;
        const bool own_layer_folder = target_rel.rfind("src/" + kLayers[from] + "/", 0) == 0;
        if (to >= 0 && to < from && private_target && !own_layer_folder)
          breaks.push_back({rel + " -> " + target_rel, rel + ":" + std::to_string(line_no), true});
      }
    }
  }
  return breaks;
}

}  // namespace

TEST(Layers, IncludesOnlyPointDown) {
  const fs::path root = fs::weakly_canonical(WEFT_SOURCE_DIR);
  ASSERT_TRUE(fs::exists(root / "include/weft/core")) << "source tree not found at " << root;
  std::set<std::string> seen;
  for (const Break& b : find_breaks(root)) {
    if (b.private_use) continue;
    seen.insert(b.edge);
    EXPECT_TRUE(kKnownBreaks.count(b.edge))
        << b.where << ": " << b.edge << " includes a higher layer (core <- runtime <- device <- gemm <- ops <- tools)";
  }
  for (const auto& [edge, remedy] : kKnownBreaks)
    EXPECT_TRUE(seen.count(edge)) << "'" << edge << "' is gone: remove it from kKnownBreaks (" << remedy << ")";
}

TEST(Layers, ALayerAboveUsesOnlyThePublicHeadersBelowIt) {
  const fs::path root = fs::weakly_canonical(WEFT_SOURCE_DIR);
  std::set<std::string> seen;
  for (const Break& b : find_breaks(root)) {
    if (!b.private_use) continue;
    seen.insert(b.edge);
    EXPECT_TRUE(kKnownPrivateUses.count(b.edge))
        << b.where << ": " << b.edge << " uses a lower layer's private header (src/...); use its public API";
  }
  for (const auto& [edge, remedy] : kKnownPrivateUses)
    EXPECT_TRUE(seen.count(edge)) << "'" << edge << "' is gone: remove it from kKnownPrivateUses (" << remedy << ")";
}

TEST(Layers, LayerOfAFileFollowsItsFolder) {
  EXPECT_EQ(layer_of("include/weft/core/dtype.hpp"), 0);
  EXPECT_EQ(layer_of("src/runtime/context.cpp"), 1);
  EXPECT_EQ(layer_of("include/weft/device.cuh"), 2);
  EXPECT_EQ(layer_of("src/gemm/cutlass_kernel.cuh"), 3);
  EXPECT_EQ(layer_of("include/weft/ops/gemm_rs.hpp"), 4);
  EXPECT_EQ(layer_of("tools/bench/bench_args.cpp"), 5);
  EXPECT_EQ(layer_of("tests/gpu/main.cpp"), -1);
}
