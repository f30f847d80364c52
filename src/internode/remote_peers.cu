// weft::RemotePeers (weft/internode/remote_peers.hpp): NVSHMEM's device state
// set in this program's device code, for weft/device/remote.cuh's NVSHMEM
// branch. Compiled only into weft::internode, with relocatable device code,
// and device-linked (in the final program, with its kernels) against
// libnvshmem_device.a. docs/decisions/0061.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <exception>
#include <string>

#include <nvshmem.h>

#include "ops/internode/collectives.hpp"  // the collectives' two-level schedules, registered while alive
#include "runtime/nvshmem_heap.hpp"        // private: the host library libweft opened
#include "weft/core/driver.hpp"
#include "weft/core/error.hpp"
#include "weft/core/log.hpp"
#include "weft/core/rank_text.hpp"
#include "weft/internode/remote_peers.hpp"
#include "weft/ops/all_gather.hpp"

// NVSHMEM's device library version, a __constant__ of libnvshmem_device.a
// (init_device.cu): read by the probe below, which also keeps it in the linked
// image, where nvshmemx_culibrary_init looks for it beside the device state.
extern __constant__ nvshmemi_version_t nvshmemi_device_lib_version_d;

namespace weft {
namespace {

/// What NVSHMEM's device state says on the device: its PE, its PE count, and
/// the device library's version. One thread. Its CUlibrary is the image that
/// holds weft::internode's device code and the program's kernels.
__global__ void remote_peers_probe(int* out) {
  out[0] = nvshmem_my_pe();
  out[1] = nvshmem_n_pes();
  out[2] = nvshmemi_device_lib_version_d.major;
  out[3] = nvshmemi_device_lib_version_d.minor;
  out[4] = nvshmemi_device_lib_version_d.patch;
}

/// The CUlibrary the CUDA runtime loaded this program's device-link image
/// into (the image of remote_peers_probe). cuKernelGetLibrary is a CUDA 12.5
/// driver call, resolved at run time as weft resolves the driver (decision 0002).
CUlibrary this_image() {
  cudaKernel_t kernel = nullptr;
  WEFT_CUDA(cudaGetKernel(&kernel, remote_peers_probe));
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  cudaError_t rc = cudaGetDriverEntryPointByVersion("cuKernelGetLibrary", &fn, 12050, cudaEnableDefault, &found);
  WEFT_REQUIRE(rc == cudaSuccess && found == cudaDriverEntryPointSuccess && fn, "cannot resolve the CUDA driver's ",
               "cuKernelGetLibrary (", cudaGetErrorName(rc), "): weft::RemotePeers needs a driver for CUDA 12.5 or newer");
  CUlibrary library = nullptr;
  const CUresult cu = reinterpret_cast<CUresult (*)(CUlibrary*, CUkernel)>(fn)(&library, reinterpret_cast<CUkernel>(kernel));
  WEFT_REQUIRE(cu == CUDA_SUCCESS && library, "cuKernelGetLibrary on weft::internode's probe kernel failed: ",
               driver_error_name(cu));
  return library;
}

}  // namespace

// Context::barrier where some peer is not mapped: a two-level AllGather of 16
// bytes per rank (its kernel ends on a rank only once every rank's shard has
// reached it, so once every rank has started it), on one block: the fewest SMs
// beside the work it separates, where ranks share a GPU. Built after the
// two-level table is registered, which the plan takes. Collective.
struct RemotePeers::Barrier {
  static constexpr std::uint64_t kBytes = 16;
  explicit Barrier(const std::shared_ptr<Context>& ctx)
      : plan(ctx, AllGatherOptions{kBytes, AllGatherVariant::two_level, 1}),
        input(ctx->heap(), kBytes, "bytes", "weft.remote_barrier.input"),
        output(ctx->heap(), kBytes * ctx->world_size(), "bytes", "weft.remote_barrier.output") {
    WEFT_CUDA(cudaDeviceSynchronize());  // the buffers' zeroing, before a run on a non-blocking stream
  }
  void run(cudaStream_t stream) { plan.run(input.get(), output.get(), stream); }

  AllGather plan;
  SymmetricBuffer input, output;
};

RemotePeers::RemotePeers(std::shared_ptr<Context> ctx) : ctx_(std::move(ctx)) {
  WEFT_REQUIRE(ctx_, "RemotePeers needs a Context");
  const int world = ctx_->world_size(), rank = ctx_->rank();
  for (int pe = 0; pe < world; ++pe)
    if (!ctx_->heap().peer_reachable(pe)) remote_.push_back(pe);
  // Every rank runs the same backend (the ranks agreed on it), so every rank takes the same turn here.
  if (ctx_->heap().backend() != HeapBackend::nvshmem) {
    WEFT_LOG(debug, "RemotePeers: the ", to_string(ctx_->heap().backend()), " heap maps every peer; ",
             "weft/device/remote.cuh takes the direct path only");
    ops_detail::register_two_level(&ops_detail::internode_collectives());
    return;
  }

  std::string failure;
  void* library = nullptr;
  try {
    library = this_image();
    nvshmem_init_device_library(library);
    int* d = nullptr;
    WEFT_CUDA(cudaMalloc(&d, 5 * sizeof(int)));
    WEFT_CUDA(cudaMemset(d, 0xff, 5 * sizeof(int)));
    remote_peers_probe<<<1, 1>>>(d);
    int seen[5] = {};
    const cudaError_t launched = cudaGetLastError();
    const cudaError_t done = cudaMemcpy(seen, d, sizeof seen, cudaMemcpyDeviceToHost);
    cudaFree(d);
    WEFT_CUDA(launched);
    WEFT_CUDA(done);
    WEFT_REQUIRE(seen[0] == rank && seen[1] == world, "NVSHMEM's device state, read on the device after ",
                 "nvshmemx_culibrary_init, says PE ", seen[0], " of ", seen[1], ", not rank ", rank, " of ", world,
                 ": the state was not set in the image that holds the program's kernels (were they device-linked ",
                 "into another image, e.g. a second shared library linking weft::internode?)");
    WEFT_LOG(debug, "NVSHMEM device library ", seen[2], ".", seen[3], ".", seen[4], ": device state set");
  } catch (const std::exception& e) {
    failure = e.what();
  }
  if (failure.empty()) library_ = library;
  else if (library) nvshmem_finalize_device_library(library);

  // Every rank learns every rank's outcome: one that failed fails them all, by name.
  auto all = ctx_->store().all_gather(failure.empty() ? std::string("ok") : "failed: " + failure,
                                      "RemotePeers device state");
  std::string failed;
  for (int r = 0; r < world; ++r)
    if (all[r] != "ok") failed += str("\n  rank ", r, ": ", all[r].substr(8));
  if (!failed.empty()) {
    if (library_) nvshmem_finalize_device_library(library_);
    library_ = nullptr;
    WEFT_FAIL("weft::RemotePeers could not set NVSHMEM's device state:", failed);
  }
  if (rank == 0) WEFT_LOG(info, "RemotePeers: ", describe());
  // From here AllGather, ReduceScatter and AllReduce find their two-level schedules (docs/decisions/0066).
  ops_detail::register_two_level(&ops_detail::internode_collectives());
  if (ctx_->all_peers_direct()) return;  // the same on every rank: Context::barrier's own kernel serves
  try {
    barrier_ = std::make_unique<Barrier>(ctx_);
  } catch (...) {
    withdraw();  // no destructor runs for an object whose constructor throws
    throw;
  }
  barrier_token_ = ctx_->install_barrier_across_nodes([b = barrier_.get()](cudaStream_t s) { b->run(s); });
}

RemotePeers::~RemotePeers() { withdraw(); }

void RemotePeers::withdraw() noexcept {
  if (barrier_token_) ctx_->withdraw_barrier_across_nodes(barrier_token_);
  barrier_token_ = 0;
  barrier_.reset();  // frees its symmetric buffers: destroyed alike on every rank
  ops_detail::register_two_level(nullptr);
  if (library_) {
    cudaDeviceSynchronize();  // no kernel of this program reads the state past here
    nvshmem_finalize_device_library(library_);
    library_ = nullptr;
  }
}

std::string RemotePeers::describe() const {
  const std::string through =
      remote_.empty() ? std::string("every peer by load and store") : str(detail::ranks_text(remote_), " through NVSHMEM");
  if (!active()) return str(to_string(ctx_->heap().backend()), " heap: ", through);
  return str("NVSHMEM device state set (rank ", ctx_->rank(), " of ", ctx_->world_size(), "); ", through);
}

}  // namespace weft

// ---- the three host-library functions libnvshmem_device.a's host half calls ----
//
// The device link refers to every module of libnvshmem_device.a it holds,
// NVSHMEM's init_device.cu among them, so the program links that archive's
// host objects too (and this object: its device code is in the same link).
// They call nvshmemid_hostlib_init_attr, nvshmemid_hostlib_finalize and
// nvshmemid_init_status from libnvshmem_host.so, which weft does not link: it
// opens it at run time (docs/decisions/0057), so that weft's programs start
// where NVSHMEM is absent. These definitions forward to the opened library.
// weft never calls the archive's host functions (nvshmemi_init_thread,
// nvshmemi_finalize, nvshmemx_collective_launch): NVSHMEM is initialised by
// the host library and the device state set by nvshmemx_culibrary_init
// (RemotePeers above). Hidden: a shared library linking weft::internode
// exports none of them.
namespace {
template <class F>
F nvshmem_host_call(const char* name) {
  return reinterpret_cast<F>(weft::nvshmem_host_function(name));
}
}  // namespace

extern "C" {

__attribute__((visibility("hidden"))) int nvshmemid_hostlib_init_attr(int requested, int* provided,
                                                                        unsigned int bootstrap_flags,
                                                                        nvshmemx_init_attr_t* attr,
                                                                        nvshmemi_version_t device_lib_version,
                                                                        nvshmemx_device_lib_init_cb cb) {
  static const auto fn = nvshmem_host_call<decltype(&nvshmemid_hostlib_init_attr)>("nvshmemid_hostlib_init_attr");
  return fn(requested, provided, bootstrap_flags, attr, device_lib_version, cb);
}

__attribute__((visibility("hidden"))) void nvshmemid_hostlib_finalize(void* device_ctx, void* transport_device_ctx) {
  static const auto fn = nvshmem_host_call<decltype(&nvshmemid_hostlib_finalize)>("nvshmemid_hostlib_finalize");
  fn(device_ctx, transport_device_ctx);
}

__attribute__((visibility("hidden"))) int nvshmemid_init_status() {
  static const auto fn = nvshmem_host_call<decltype(&nvshmemid_init_status)>("nvshmemid_init_status");
  return fn();
}

}  // extern "C"
