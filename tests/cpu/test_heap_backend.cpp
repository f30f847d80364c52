// The choice of symmetric-heap backend (docs/decisions/0057): parsing
// WEFT_HEAP_BACKEND, the automatic choice by nodes and build, the errors that
// say how to get what was asked for, ranks that disagree, and - in a build with
// NVSHMEM - that its host library opens and offers every function the heap calls.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/nvshmem_heap.hpp"
#include "cpu/error_text.hpp"
#include "weft/core/error.hpp"
#include "weft/runtime/heap.hpp"
#include "weft/runtime/store.hpp"

using namespace weft;
using weft::test::error_of;
using weft::test::has;

namespace {

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    std::abort();
  ::close(fd);
  return ntohs(a.sin_port);
}

// agree_heap_backend on `envs.size()` ranks (one thread and store each): each
// rank's chosen backend's name, or its error.
std::vector<std::string> agree_on(const std::vector<EnvMap>& envs, int num_nodes, bool built) {
  const int port = free_port();
  const int n = static_cast<int>(envs.size());
  std::vector<std::string> out(n);
  std::vector<std::thread> ranks;
  for (int r = 0; r < n; ++r)
    ranks.emplace_back([&, r] {
      try {
        StoreOptions o;
        o.master_port = port;
        o.rank = r;
        o.world_size = n;
        o.timeout = std::chrono::seconds(10);
        auto store = Store::connect(o);
        out[r] = to_string(agree_heap_backend(std::nullopt, envs[r], num_nodes, built, *store));
      } catch (const Error& e) {
        out[r] = std::string("error: ") + e.what();
      }
    });
  for (auto& t : ranks) t.join();
  return out;
}

}  // namespace

TEST(HeapBackend, ParsesEveryFormAndNamesTheAcceptedOnes) {
  EXPECT_EQ(parse_heap_backend("native"), HeapBackend::native);
  EXPECT_EQ(parse_heap_backend("nvshmem"), HeapBackend::nvshmem);
  EXPECT_EQ(parse_heap_backend("auto"), HeapBackend::automatic);
  EXPECT_EQ(parse_heap_backend("automatic"), HeapBackend::automatic);
  EXPECT_EQ(parse_heap_backend(" NVSHMEM "), HeapBackend::nvshmem);
  EXPECT_EQ(parse_heap_backend("Native"), HeapBackend::native);
  for (HeapBackend b : {HeapBackend::automatic, HeapBackend::native, HeapBackend::nvshmem})
    EXPECT_EQ(parse_heap_backend(to_string(b)), b);
  std::string e = error_of([] { parse_heap_backend("vmm"); });
  EXPECT_TRUE(has(e, "WEFT_HEAP_BACKEND='vmm'")) << e;
  EXPECT_TRUE(has(e, "native") && has(e, "nvshmem") && has(e, "auto")) << e;
  EXPECT_FALSE(error_of([] { parse_heap_backend(""); }).empty());
}

TEST(HeapBackend, AutoTakesNvshmemOnlyAcrossNodesAndOnlyWhereBuilt) {
  EXPECT_EQ(choose_heap_backend(HeapBackend::automatic, 1, true), HeapBackend::native);
  EXPECT_EQ(choose_heap_backend(HeapBackend::automatic, 1, false), HeapBackend::native);
  EXPECT_EQ(choose_heap_backend(HeapBackend::automatic, 2, true), HeapBackend::nvshmem);
  EXPECT_EQ(choose_heap_backend(HeapBackend::automatic, 8, true), HeapBackend::nvshmem);
  // Asked for by name, each is taken where it can serve.
  EXPECT_EQ(choose_heap_backend(HeapBackend::native, 1, true), HeapBackend::native);
  EXPECT_EQ(choose_heap_backend(HeapBackend::nvshmem, 1, true), HeapBackend::nvshmem);
  EXPECT_EQ(choose_heap_backend(HeapBackend::nvshmem, 4, true), HeapBackend::nvshmem);
}

TEST(HeapBackend, ImpossibleChoicesSayHowToGetThem) {
  // NVSHMEM asked for, not built in: how to build it.
  std::string e = error_of([] { choose_heap_backend(HeapBackend::nvshmem, 1, false); });
  EXPECT_TRUE(has(e, "built without NVSHMEM")) << e;
  EXPECT_TRUE(has(e, "-DWEFT_NVSHMEM=ON") && has(e, "scripts/setup.sh") && has(e, "nvidia-nvshmem-cu13")) << e;
  // Several nodes, no NVSHMEM: the same advice.
  e = error_of([] { choose_heap_backend(HeapBackend::automatic, 2, false); });
  EXPECT_TRUE(has(e, "spans 2 nodes") && has(e, "-DWEFT_NVSHMEM=ON")) << e;
  // The native heap asked for across nodes: name the backend that serves them.
  e = error_of([] { choose_heap_backend(HeapBackend::native, 3, true); });
  EXPECT_TRUE(has(e, "WEFT_HEAP_BACKEND=native") && has(e, "3 nodes") && has(e, "WEFT_HEAP_BACKEND=nvshmem")) << e;
  EXPECT_FALSE(has(e, "-DWEFT_NVSHMEM")) << e;
  e = error_of([] { choose_heap_backend(HeapBackend::native, 3, false); });
  EXPECT_TRUE(has(e, "-DWEFT_NVSHMEM=ON")) << e;
}

TEST(HeapBackend, RanksAgreeFromTheEnvironmentOrAllFailNamingEachRequest) {
  auto same = agree_on({{{"WEFT_HEAP_BACKEND", "native"}}, {{"WEFT_HEAP_BACKEND", "native"}}}, 1, true);
  EXPECT_EQ(same, (std::vector<std::string>{"native", "native"}));
  auto unset = agree_on({{}, {}, {}}, 2, true);
  EXPECT_EQ(unset, (std::vector<std::string>{"nvshmem", "nvshmem", "nvshmem"}));

  auto differ = agree_on({{{"WEFT_HEAP_BACKEND", "native"}}, {{"WEFT_HEAP_BACKEND", "nvshmem"}}}, 1, true);
  for (auto& r : differ) {
    EXPECT_TRUE(has(r, "error: ") && has(r, "ranks disagree on the heap backend")) << r;
    EXPECT_TRUE(has(r, "rank 0 asked for native") && has(r, "rank 1 asked for nvshmem")) << r;
  }
  // A malformed value fails its own rank with the parse error, and the others naming it.
  auto bad = agree_on({{}, {{"WEFT_HEAP_BACKEND", "shm"}}}, 1, true);
  EXPECT_TRUE(has(bad[1], "WEFT_HEAP_BACKEND='shm'")) << bad[1];
  EXPECT_TRUE(has(bad[0], "rank 1 asked for a malformed value")) << bad[0];
  // Every rank reaches the same verdict when nvshmem cannot be had.
  auto unbuilt = agree_on({{{"WEFT_HEAP_BACKEND", "nvshmem"}}, {{"WEFT_HEAP_BACKEND", "nvshmem"}}}, 1, false);
  for (auto& r : unbuilt) EXPECT_TRUE(has(r, "built without NVSHMEM")) << r;
}

TEST(HeapBackend, NvshmemHostLibraryOpensWithEveryFunctionTheHeapCalls) {
  if (!nvshmem_built()) {
    std::string e = error_of([] { nvshmem_host_library(); });
    EXPECT_TRUE(has(e, "built without NVSHMEM")) << e;
    e = error_of([] { nvshmem_host_function("nvshmemx_culibrary_init"); });
    EXPECT_TRUE(has(e, "built without NVSHMEM")) << e;
    GTEST_SKIP() << "this weft was built without NVSHMEM (WEFT_NVSHMEM=OFF, or NVSHMEM not found)";
  }
  std::string lib = nvshmem_host_library();  // throws naming what is missing
  EXPECT_TRUE(has(lib, "libnvshmem_host.so.3")) << lib;
  EXPECT_TRUE(has(lib, "(NVSHMEM 3.")) << lib;
  std::printf("[ info ] %s\n", lib.c_str());
  // What weft::internode asks of the same library: the device state's setup, and
  // the three functions libnvshmem_device.a's host half calls (docs/decisions/0061).
  for (const char* f : {"nvshmemx_culibrary_init", "nvshmemx_culibrary_finalize", "nvshmemid_hostlib_init_attr",
                        "nvshmemid_hostlib_finalize", "nvshmemid_init_status"})
    EXPECT_NE(nvshmem_host_function(f), nullptr) << f;
  std::string e = error_of([] { nvshmem_host_function("nvshmemx_no_such_function"); });
  EXPECT_TRUE(has(e, "lacks nvshmemx_no_such_function")) << e;
}
