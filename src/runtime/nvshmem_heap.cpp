// The NVSHMEM backend of the symmetric heap (docs/decisions/0057).
//
// NVSHMEM's host library is opened at run time (dlopen), as the CUDA driver is
// (decision 0002): a weft built with NVSHMEM starts, and runs the native heap,
// where no NVSHMEM is installed. Only host calls are made - unique-id bootstrap
// through nvshmemx_hostlib_init_attr, nvshmem_align / nvshmem_free, nvshmem_ptr -
// so libweft needs no relocatable device code and no libnvshmem_device.a.
#include "nvshmem_heap.hpp"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#define NVSHMEM_HOSTLIB_ONLY 1  // host declarations only: no device headers, no CCCL
#include <nvshmem.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "block_heap.hpp"
#include "weft/core/env.hpp"
#include "weft/core/error.hpp"
#include "weft/core/log.hpp"

namespace weft {
namespace {

constexpr std::uint64_t kAlignment = std::uint64_t{2} << 20;  // as the native heap's VMM granularity
// NVSHMEM's symmetric heap holds weft's block and NVSHMEM's own buffers (team
// sync arrays, collective scratch); this much beyond the block is left for them.
constexpr std::uint64_t kNvshmemReserve = std::uint64_t{512} << 20;

#ifndef WEFT_NVSHMEM_BUILD_LIBRARY
#define WEFT_NVSHMEM_BUILD_LIBRARY ""
#endif

/// The host functions weft calls, resolved from libnvshmem_host.so.3 once per process.
struct NvshmemApi {
  decltype(&nvshmemx_get_uniqueid) get_uniqueid = nullptr;
  decltype(&nvshmemx_set_attr_uniqueid_args) set_attr_uniqueid_args = nullptr;
  decltype(&nvshmemx_hostlib_init_attr) hostlib_init_attr = nullptr;
  decltype(&nvshmemx_hostlib_finalize) hostlib_finalize = nullptr;
  decltype(&nvshmemx_init_status) init_status = nullptr;
  decltype(&nvshmem_my_pe) my_pe = nullptr;
  decltype(&nvshmem_n_pes) n_pes = nullptr;
  decltype(&nvshmem_align) align = nullptr;
  decltype(&nvshmem_free) free = nullptr;
  decltype(&nvshmem_ptr) ptr = nullptr;
  decltype(&nvshmemx_vendor_get_version_info) version = nullptr;
  // Device-library state (weft::internode only): optional, resolved where the library has them.
  decltype(&nvshmemx_culibrary_init) culibrary_init = nullptr;
  decltype(&nvshmemx_culibrary_finalize) culibrary_finalize = nullptr;
  std::string path;      // the library that was opened
  void* handle = nullptr;  // its dlopen handle
};

template <class F>
void resolve(void* lib, const std::string& path, const char* name, F* fn) {
  *fn = reinterpret_cast<F>(::dlsym(lib, name));
  WEFT_REQUIRE(*fn, "NVSHMEM library ", path, " lacks ", name, ": weft needs NVSHMEM 3.x's host library ",
               "(pip nvidia-nvshmem-cu13 3.4 or newer)");
}

const NvshmemApi& nvshmem_api() {
  static const NvshmemApi api = [] {
    // Where to look, in order: WEFT_NVSHMEM_LIBRARY; the loader's search (a copy
    // already loaded, e.g. by torch, LD_LIBRARY_PATH, the system); the library
    // this weft was built against.
    std::vector<std::string> candidates;
    if (const char* e = std::getenv("WEFT_NVSHMEM_LIBRARY"); e && *e) candidates.push_back(e);
    candidates.push_back("libnvshmem_host.so.3");
    if (std::strlen(WEFT_NVSHMEM_BUILD_LIBRARY) > 0) candidates.push_back(WEFT_NVSHMEM_BUILD_LIBRARY);
    void* lib = nullptr;
    std::string tried;
    NvshmemApi a;
    for (const auto& c : candidates) {
      lib = ::dlopen(c.c_str(), RTLD_NOW | RTLD_GLOBAL);
      if (lib) {
        a.path = c;
        break;
      }
      const char* why = ::dlerror();
      tried += str("\n  ", c, ": ", why ? why : "not found");
    }
    WEFT_REQUIRE(lib, "the NVSHMEM heap backend cannot open NVSHMEM's host library; tried:", tried,
                 "\nInstall it (python3 -m pip install nvidia-nvshmem-cu13, as torch does) or set WEFT_NVSHMEM_LIBRARY "
                 "to the path of libnvshmem_host.so.3; or use WEFT_HEAP_BACKEND=native on one node.");
    a.handle = lib;
    resolve(lib, a.path, "nvshmemx_get_uniqueid", &a.get_uniqueid);
    resolve(lib, a.path, "nvshmemx_set_attr_uniqueid_args", &a.set_attr_uniqueid_args);
    resolve(lib, a.path, "nvshmemx_hostlib_init_attr", &a.hostlib_init_attr);
    resolve(lib, a.path, "nvshmemx_hostlib_finalize", &a.hostlib_finalize);
    resolve(lib, a.path, "nvshmemx_init_status", &a.init_status);
    resolve(lib, a.path, "nvshmem_my_pe", &a.my_pe);
    resolve(lib, a.path, "nvshmem_n_pes", &a.n_pes);
    resolve(lib, a.path, "nvshmem_align", &a.align);
    resolve(lib, a.path, "nvshmem_free", &a.free);
    resolve(lib, a.path, "nvshmem_ptr", &a.ptr);
    resolve(lib, a.path, "nvshmemx_vendor_get_version_info", &a.version);
    a.culibrary_init = reinterpret_cast<decltype(a.culibrary_init)>(::dlsym(lib, "nvshmemx_culibrary_init"));
    a.culibrary_finalize = reinterpret_cast<decltype(a.culibrary_finalize)>(::dlsym(lib, "nvshmemx_culibrary_finalize"));
    return a;
  }();
  return api;
}

/// Sets an NVSHMEM setting weft relies on unless the user set it already; says so at debug level.
void default_env(const char* name, const std::string& value) {
  if (std::getenv(name)) return;
  ::setenv(name, value.c_str(), 0);
  WEFT_LOG(debug, "NVSHMEM setting ", name, "=", value, " (weft's default)");
}

const char* init_status_name(int s) {
  switch (s) {
    case NVSHMEM_STATUS_NOT_INITIALIZED: return "not initialised";
    case NVSHMEM_STATUS_IS_BOOTSTRAPPED: return "bootstrapped";
    case NVSHMEM_STATUS_IS_INITIALIZED: return "initialised";
    case NVSHMEM_STATUS_LIMITED_MPG: return "initialised, several PEs per GPU (limited)";
    case NVSHMEM_STATUS_FULL_MPG: return "initialised, several PEs per GPU (full)";
  }
  return "unknown";
}

class NvshmemHeap final : public BlockHeap {
 public:
  NvshmemHeap(Store& store, const Team& team, std::uint64_t capacity);
  ~NvshmemHeap() override;
  HeapBackend backend() const override { return HeapBackend::nvshmem; }

 private:
  void init(const Team& team);

  const NvshmemApi& api_;
  bool initialised_here_ = false;  // this heap initialised NVSHMEM, so it finalises it
  char* block_ = nullptr;          // from nvshmem_align
};

NvshmemHeap::NvshmemHeap(Store& store, const Team& team, std::uint64_t capacity)
    : BlockHeap(store, team, capacity, kAlignment), api_(nvshmem_api()) {
  check_same_capacity();
  init(team);

  // One block per rank from NVSHMEM's symmetric heap; weft's allocator carves it.
  block_ = static_cast<char*>(api_.align(kAlignment, capacity_));
  const char* set_size = std::getenv("NVSHMEM_SYMMETRIC_SIZE");
  auto ok = store_.all_gather(block_ ? "1" : "0", "nvshmem heap block");
  std::string failed;
  for (int r = 0; r < world_; ++r)
    if (ok[r] != "1") failed += str(failed.empty() ? "" : ", ", r);
  WEFT_REQUIRE(failed.empty(), "nvshmem_align could not reserve a symmetric heap of ", format_bytes(capacity_),
               " on rank(s) ", failed, " (NVSHMEM_SYMMETRIC_SIZE=", set_size ? set_size : "unset",
               "). Lower WEFT_HEAP_SIZE, raise NVSHMEM_SYMMETRIC_SIZE, or free GPU memory.");

  // Peers NVSHMEM maps into this process (NVLink, the same GPU) get a base;
  // the others stay nullptr. So do peers in another node of this team even
  // where nvshmem_ptr maps them: under virtual nodes (WEFT_VIRTUAL_NODES)
  // another virtual node is another node, reached through NVSHMEM only, which
  // on one machine travels over NVSHMEM's P2P transport.
  int hidden = 0;
  for (int pe = 0; pe < world_; ++pe) {
    bases_[pe] = static_cast<char*>(api_.ptr(block_, pe));
    if (bases_[pe] && team.node_of[pe] != team.node_id) {
      bases_[pe] = nullptr;
      ++hidden;
    }
  }
  WEFT_REQUIRE(bases_[rank_] == block_, "nvshmem_ptr of rank ", rank_, "'s own block is not the block (",
               static_cast<void*>(bases_[rank_]), " against ", static_cast<void*>(block_), ")");
  // Every rank learns every pair. Unmapped peers are no error here: operators
  // that reach every peer by load and store refuse them, naming the pairs
  // (Context::require_direct_peers); kernels on weft/device/remote.cuh reach
  // them through NVSHMEM's device API.
  publish_bases(/*exchange=*/true);
  store_.barrier("nvshmem heap mapped");
  const std::string unmapped = unreachable_pairs(reach_);
  WEFT_LOG(info, "NVSHMEM symmetric heap: ", format_bytes(capacity_), " per rank, ", world_, " ranks, ",
           unmapped.empty() ? std::string("every pair mapped by nvshmem_ptr")
                            : str("pairs without an address reached through NVSHMEM only (", hidden,
                                  " of this rank's peers are in another virtual node)"));
}

void NvshmemHeap::init(const Team& team) {
  int major = 0, minor = 0, patch = 0;
  api_.version(&major, &minor, &patch);
  const int status = api_.init_status();
  if (status >= NVSHMEM_STATUS_IS_INITIALIZED) {
    // Someone in this process (torch's symmetric memory, another Context) set
    // NVSHMEM up already: usable only if its PEs are weft's ranks.
    WEFT_REQUIRE(api_.my_pe() == team.rank && api_.n_pes() == team.world_size, "NVSHMEM is already initialised ",
                 "in this process as PE ", api_.my_pe(), " of ", api_.n_pes(), ", but this is weft rank ", team.rank,
                 " of ", team.world_size, ": NVSHMEM serves one job per process. Use WEFT_HEAP_BACKEND=native, or ",
                 "let weft initialise NVSHMEM first.");
    WEFT_LOG(info, "NVSHMEM ", major, ".", minor, ".", patch, " already initialised in this process (",
             init_status_name(status), "); the heap uses it and leaves its finalisation to its owner");
  } else {
    // What NVSHMEM needs from weft's setting, unless the user chose otherwise (0057):
    // - room for weft's block beside NVSHMEM's own buffers;
    // - no NVLink multicast (Context sets it too) and no NCCL inside NVSHMEM:
    //   weft calls no NVSHMEM collective;
    // - ranks sharing a GPU under MPS: weft leaves CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
    //   unset (a cap does not keep spinning grids resident: decision 0012) and
    //   sizes every waiting grid from its SM share instead, so NVSHMEM's full
    //   multi-PE-per-GPU mode is asked for without the cap;
    // - a job on one machine (virtual nodes included: P2P carries them) needs no network transport.
    default_env("NVSHMEM_SYMMETRIC_SIZE", std::to_string(capacity_ + kNvshmemReserve));
    default_env("NVSHMEM_DISABLE_NVLS", "1");
    default_env("NVSHMEM_DISABLE_NCCL", "1");
    if (team.shares_gpus()) default_env("NVSHMEM_IGNORE_CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "1");
    if (team.single_host()) default_env("NVSHMEM_REMOTE_TRANSPORT", "none");

    nvshmemx_uniqueid_t id = NVSHMEMX_UNIQUEID_INITIALIZER;
    int rc = 0;
    if (team.rank == 0) rc = api_.get_uniqueid(&id);
    std::string blob(reinterpret_cast<const char*>(&id), sizeof(id));
    blob += rc == 0 ? '1' : '0';
    blob = store_.broadcast(0, blob, "NVSHMEM unique id");
    WEFT_REQUIRE(blob.size() == sizeof(id) + 1, "NVSHMEM unique id: ", blob.size(), " bytes arrived, ",
                 sizeof(id) + 1, " expected (ranks built against different NVSHMEM versions?)");
    WEFT_REQUIRE(blob.back() == '1', "nvshmemx_get_uniqueid failed on rank 0 (NVSHMEM ", major, ".", minor, ".",
                 patch, ", ", api_.path, "): set NVSHMEM_DEBUG=INFO for NVSHMEM's reasons");
    std::memcpy(&id, blob.data(), sizeof(id));

    nvshmemx_init_attr_t attr = NVSHMEMX_INIT_ATTR_INITIALIZER;
    rc = api_.set_attr_uniqueid_args(team.rank, team.world_size, &id, &attr);
    WEFT_REQUIRE(rc == 0, "nvshmemx_set_attr_uniqueid_args(", team.rank, ", ", team.world_size, ") returned ", rc);
    // Host-library initialisation (as nvshmem4py does): returns a status instead of exiting the process.
    rc = api_.hostlib_init_attr(NVSHMEMX_INIT_WITH_UNIQUEID, &attr);
    WEFT_REQUIRE(rc == 0, "NVSHMEM ", major, ".", minor, ".", patch, " (", api_.path, ") failed to initialise on ",
                 "rank ", team.rank, " (status ", rc, "); NVSHMEM_DEBUG=INFO prints its reasons");
    initialised_here_ = true;
    WEFT_LOG(info, "NVSHMEM ", major, ".", minor, ".", patch, " initialised by unique id (", api_.path, "): ",
             init_status_name(api_.init_status()));
  }

  // NVSHMEM's PE numbers must be weft's ranks: kernels and offsets assume one numbering.
  const std::string mine = str(api_.my_pe(), "/", api_.n_pes());
  auto all = store_.all_gather(mine, "NVSHMEM PE numbers");
  std::string wrong;
  for (int r = 0; r < world_; ++r)
    if (all[r] != str(r, "/", world_)) wrong += str("\n  weft rank ", r, " is NVSHMEM PE ", all[r]);
  WEFT_REQUIRE(wrong.empty(), "NVSHMEM numbers its PEs differently from weft's ranks (each rank r must be PE r of ",
               world_, "):", wrong);
}

NvshmemHeap::~NvshmemHeap() {
  // The NVSHMEM calls below are collective: where the peers were not met, the
  // block and NVSHMEM are left to process exit.
  if (!meet_peers_at_teardown()) return;
  if (block_) api_.free(block_);
  if (initialised_here_) api_.hostlib_finalize();
}

}  // namespace

std::string nvshmem_host_library() {
  const NvshmemApi& api = nvshmem_api();
  int major = 0, minor = 0, patch = 0;
  api.version(&major, &minor, &patch);
  return str(api.path, " (NVSHMEM ", major, ".", minor, ".", patch, ")");
}

std::unique_ptr<SymmetricHeap> make_nvshmem_heap(Store& store, const Team& team, std::uint64_t capacity) {
  return std::make_unique<NvshmemHeap>(store, team, capacity);
}

void nvshmem_init_device_library(void* library) {
  const NvshmemApi& api = nvshmem_api();
  int major = 0, minor = 0, patch = 0;
  api.version(&major, &minor, &patch);
  WEFT_REQUIRE(api.culibrary_init && api.culibrary_finalize, "NVSHMEM ", major, ".", minor, ".", patch, " (",
               api.path, ") lacks nvshmemx_culibrary_init, which sets NVSHMEM's device state in weft::internode's ",
               "device code: use NVSHMEM 3.4 or newer (pip nvidia-nvshmem-cu13)");
  WEFT_REQUIRE(api.init_status() >= NVSHMEM_STATUS_IS_INITIALIZED, "NVSHMEM's device state can be set only once ",
               "NVSHMEM is initialised (by the NVSHMEM heap: WEFT_HEAP_BACKEND=nvshmem); its status is ",
               init_status_name(api.init_status()));
  const int rc = api.culibrary_init(static_cast<CUlibrary>(library));
  WEFT_REQUIRE(rc == 0, "nvshmemx_culibrary_init returned ", rc, " (NVSHMEM ", major, ".", minor, ".", patch, ", ",
               api.path, "): the program's device code holds no NVSHMEM device state, or one of another NVSHMEM ",
               "version. It must be device-linked with the libnvshmem_device.a of the same NVSHMEM (CMake target ",
               "weft::internode); NVSHMEM_DEBUG=INFO prints NVSHMEM's reasons");
}

void* nvshmem_host_function(const char* name) {
  const NvshmemApi& api = nvshmem_api();
  void* fn = ::dlsym(api.handle, name);
  WEFT_REQUIRE(fn, "NVSHMEM library ", api.path, " lacks ", name, ", which libnvshmem_device.a calls: the device ",
               "library and the host library come from different NVSHMEM versions");
  return fn;
}

void nvshmem_finalize_device_library(void* library) noexcept {
  try {
    const NvshmemApi& api = nvshmem_api();
    if (!api.culibrary_finalize || api.init_status() < NVSHMEM_STATUS_IS_INITIALIZED) return;
    if (const int rc = api.culibrary_finalize(static_cast<CUlibrary>(library)); rc != 0)
      WEFT_LOG(warn, "nvshmemx_culibrary_finalize returned ", rc, "; NVSHMEM keeps a stale device-state pointer");
  } catch (const std::exception& e) {
    WEFT_LOG(warn, "NVSHMEM's device state was not released: ", e.what());
  }
}

}  // namespace weft
