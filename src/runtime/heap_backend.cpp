// The choice of symmetric-heap backend: WEFT_HEAP_BACKEND / ContextOptions, the
// job's nodes, and whether this build has NVSHMEM (docs/decisions/0057).
#include <algorithm>
#include <cctype>
#include <exception>

#include "weft/core/env.hpp"
#include "weft/core/error.hpp"
#include "weft/core/log.hpp"
#include "weft/core/rank_text.hpp"
#include "weft/runtime/heap.hpp"
#include "weft/runtime/store.hpp"

namespace weft {

const char* to_string(HeapBackend b) {
  switch (b) {
    case HeapBackend::automatic: return "auto";
    case HeapBackend::native: return "native";
    case HeapBackend::nvshmem: return "nvshmem";
  }
  return "?";
}

HeapBackend parse_heap_backend(const std::string& text, const std::string& what) {
  std::string t = text;
  t.erase(0, t.find_first_not_of(" \t"));
  t.erase(t.find_last_not_of(" \t") + 1);
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (t == "auto" || t == "automatic") return HeapBackend::automatic;
  if (t == "native") return HeapBackend::native;
  if (t == "nvshmem") return HeapBackend::nvshmem;
  WEFT_FAIL(what, "='", text, "' is not a heap backend: use native (CUDA VMM, one node), nvshmem (NVSHMEM, any ",
            "number of nodes) or auto (nvshmem when the job spans nodes, else native)");
}

bool nvshmem_built() {
#if defined(WEFT_HAVE_NVSHMEM) && WEFT_HAVE_NVSHMEM
  return true;
#else
  return false;
#endif
}

namespace {
constexpr const char* kHowToBuild =
    "Build weft with NVSHMEM: bash scripts/setup.sh fetches the pip wheel nvidia-nvshmem-cu13 into .deps-nvshmem/, or "
    "install it (python3 -m pip install nvidia-nvshmem-cu13) or set NVSHMEM_HOME; then configure with "
    "-DWEFT_NVSHMEM=ON (WEFT_NVSHMEM=ON bash scripts/build.sh)";
}  // namespace

HeapBackend choose_heap_backend(HeapBackend requested, int num_nodes, bool built_with_nvshmem, int virtual_nodes) {
  if (virtual_nodes > 1) {
    // One machine split into nodes: peers in another node are reached only
    // through NVSHMEM, which only the NVSHMEM heap brings.
    WEFT_REQUIRE(requested != HeapBackend::native, "WEFT_VIRTUAL_NODES=", virtual_nodes, " splits this machine's ",
                 "ranks into ", virtual_nodes, " nodes, whose peers in other nodes weft reaches only through NVSHMEM; ",
                 "the native heap (WEFT_HEAP_BACKEND=native) maps every peer by address and has no such path: use ",
                 "WEFT_HEAP_BACKEND=nvshmem or auto",
                 built_with_nvshmem ? "" : str(" with a weft built with NVSHMEM. ", kHowToBuild), ", or unset ",
                 "WEFT_VIRTUAL_NODES");
    WEFT_REQUIRE(built_with_nvshmem, "WEFT_VIRTUAL_NODES=", virtual_nodes, " needs the NVSHMEM heap backend ",
                 "(peers in other virtual nodes are reached through NVSHMEM), but this weft was built without ",
                 "NVSHMEM. ", kHowToBuild, "; or unset WEFT_VIRTUAL_NODES.");
    return HeapBackend::nvshmem;
  }
  HeapBackend chosen = requested;
  if (chosen == HeapBackend::automatic)
    chosen = num_nodes > 1 && built_with_nvshmem ? HeapBackend::nvshmem : HeapBackend::native;
  // (automatic picks NVSHMEM only where it is built in: only an explicit request can fail here)
  if (chosen == HeapBackend::nvshmem)
    WEFT_REQUIRE(built_with_nvshmem, "the NVSHMEM heap backend was asked for (WEFT_HEAP_BACKEND=nvshmem), but this ",
                 "weft was built without NVSHMEM. ", kHowToBuild, ".");
  if (chosen == HeapBackend::native && num_nodes > 1) {
    WEFT_REQUIRE(requested != HeapBackend::native, "WEFT_HEAP_BACKEND=native serves ranks on one node, but the job ",
                 "spans ", num_nodes, " nodes: use WEFT_HEAP_BACKEND=nvshmem or auto",
                 built_with_nvshmem ? "" : str(" with a weft built with NVSHMEM. ", kHowToBuild));
    WEFT_FAIL("the job spans ", num_nodes, " nodes, which needs the NVSHMEM heap backend, but this weft was built "
              "without NVSHMEM. ", kHowToBuild, ".");
  }
  return chosen;
}

HeapBackend agree_heap_backend(std::optional<HeapBackend> option, const EnvMap& env, int num_nodes,
                               bool built_with_nvshmem, Store& store, int virtual_nodes) {
  HeapBackend requested = HeapBackend::automatic;
  std::string source = "the default";
  std::exception_ptr parse_error;  // raised after the exchange, so no peer waits for this rank
  if (option) {
    requested = *option;
    source = "ContextOptions::heap_backend";
  } else if (auto text = env_str(env, "WEFT_HEAP_BACKEND")) {
    source = "WEFT_HEAP_BACKEND";
    try {
      requested = parse_heap_backend(*text);
    } catch (const Error&) {
      parse_error = std::current_exception();
    }
  }
  auto all = store.all_gather(parse_error ? "?" : to_string(requested), "heap backend");
  if (parse_error) std::rethrow_exception(parse_error);
  if (std::string why = detail::disagreement(all, "the heap backend", "set WEFT_HEAP_BACKEND the same on every rank");
      !why.empty())
    WEFT_FAIL(why);
  HeapBackend chosen = choose_heap_backend(requested, num_nodes, built_with_nvshmem, virtual_nodes);
  WEFT_LOG(info, "heap backend ", to_string(chosen), " (", to_string(requested), " from ", source, "; ", num_nodes,
           " node", num_nodes == 1 ? "" : "s", virtual_nodes > 1 ? " (virtual)" : "", ", NVSHMEM ",
           built_with_nvshmem ? "built in" : "not built in", ")");
  return chosen;
}

std::string unreachable_pairs(const Reachability& reach) {
  std::string out;
  for (std::size_t from = 0; from < reach.size(); ++from) {
    std::string pes;
    for (std::size_t to = 0; to < reach[from].size(); ++to)
      if (!reach[from][to]) pes += str(pes.empty() ? "" : ", ", to);
    if (!pes.empty()) out += str(out.empty() ? "" : "\n", "rank ", from, " cannot address rank(s) ", pes);
  }
  return out;
}

void require_direct_peers(const std::string& who, const Reachability& reach, HeapBackend backend,
                          const std::string& remedy) {
  const std::string pairs = unreachable_pairs(reach);
  if (pairs.empty()) return;
  std::string indented;
  for (char c : "  " + pairs) {
    indented += c;
    if (c == '\n') indented += "  ";
  }
  WEFT_FAIL(who, " reaches every peer by load and store (World::symm_at) or by copy engine, but on the ",
            to_string(backend), " heap some ranks have no direct path to others:\n", indented,
            "\nPeers on another node (or another virtual node, WEFT_VIRTUAL_NODES) are reached only through ",
            "NVSHMEM's put/get (weft/device/remote.cuh), ",
            remedy.empty() ? str("which ", who, " does not use yet. Run it with every rank on one node (and ",
                                 "WEFT_VIRTUAL_NODES unset).")
                           : remedy);
}

}  // namespace weft

#if !(defined(WEFT_HAVE_NVSHMEM) && WEFT_HAVE_NVSHMEM)
#include "nvshmem_heap.hpp"

namespace weft {
// A build without NVSHMEM: choose_heap_backend never picks it, so reaching this is a caller's mistake.
std::unique_ptr<SymmetricHeap> make_nvshmem_heap(Store&, const Team&, std::uint64_t) {
  WEFT_FAIL("this weft was built without NVSHMEM, so it has no NVSHMEM heap. ", kHowToBuild, ".");
}
std::string nvshmem_host_library() {
  WEFT_FAIL("this weft was built without NVSHMEM, so it opens no NVSHMEM library. ", kHowToBuild, ".");
}
void nvshmem_init_device_library(void*) {
  WEFT_FAIL("this weft was built without NVSHMEM, so it has no NVSHMEM device state to set. ", kHowToBuild, ".");
}
void nvshmem_finalize_device_library(void*) noexcept {}
void* nvshmem_host_function(const char*) {
  WEFT_FAIL("this weft was built without NVSHMEM, so it opens no NVSHMEM library. ", kHowToBuild, ".");
}
}  // namespace weft
#endif
