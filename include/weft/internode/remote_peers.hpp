// weft/internode/remote_peers.hpp - NVSHMEM's device path, made ready for the
// kernels written on weft/device/remote.cuh (CMake target weft::internode).
//
//   auto ctx = weft::Context::from_env();      // the NVSHMEM heap (WEFT_HEAP_BACKEND=nvshmem)
//   weft::RemotePeers remote(ctx);             // before the first kernel that calls weft::remote::*
//   my_kernel<<<...>>>(ctx->world(), ...);     // put_signal_block / get_block / signal_wait_until
//
// NVSHMEM's device calls read a device-side state (NVSHMEM's own __constant__
// block: its PE, its heap, its transports) that lives in the program's device
// code, device-linked with libnvshmem_device.a, not in libweft. weft
// initialises NVSHMEM through its host library only (docs/decisions/0057), so
// that state is set here, once NVSHMEM is up: nvshmemx_culibrary_init on the
// device-link image holding weft::internode's code and the program's kernels.
// docs/decisions/0061.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "weft/runtime/context.hpp"

namespace weft {

class RemotePeers {
 public:
  /// Collective: every rank constructs one, after its Context and before it
  /// launches a kernel that may take remote.cuh's NVSHMEM branch. Under the
  /// NVSHMEM heap: sets NVSHMEM's device state in this program's device code,
  /// then checks it on the device (a kernel reads NVSHMEM's PE and PE count,
  /// which must be this rank and the world size); every rank learns every
  /// rank's outcome, so a failure throws on all of them, naming the ranks and
  /// why. Under the native heap every peer is mapped, remote.cuh never calls
  /// NVSHMEM, and nothing is set (active() is false).
  ///
  /// While it is alive, weft::AllGather, ReduceScatter and AllReduce find
  /// their two-level schedules, whose kernels are weft::internode's: a plan
  /// built across nodes (or virtual nodes) takes them, where without a
  /// RemotePeers it refuses, naming the ranks it cannot address. Keep it until
  /// the last run of such a plan (docs/decisions/0066).
  ///
  /// Where some peer is not mapped, it also installs the Context's device
  /// barrier (Context::barrier, which loads and stores every peer's flag on
  /// one node): a two-level AllGather of 16 bytes per rank, which ends on a
  /// rank only once every rank has started it, with the bounded waits of the
  /// two-level kernels (a rank that never arrives is named).
  explicit RemotePeers(std::shared_ptr<Context> ctx);
  /// Releases the device state (nvshmemx_culibrary_finalize) while the
  /// Context, which it holds, still has NVSHMEM up, and withdraws the
  /// two-level schedules (a plan that runs later throws, saying so) and the
  /// barrier it installed. Collective where it installed one (the barrier's
  /// symmetric buffers are freed on every rank alike), as a plan's destruction is.
  ~RemotePeers();
  RemotePeers(const RemotePeers&) = delete;
  RemotePeers& operator=(const RemotePeers&) = delete;

  /// True when NVSHMEM's device state was set (the NVSHMEM heap).
  bool active() const { return library_ != nullptr; }
  /// The ranks this rank reaches only through NVSHMEM (World::reachable false), in order.
  const std::vector<int>& remote_ranks() const { return remote_; }
  /// One line for logs: "NVSHMEM device state set (PE 1 of 4); ranks 2, 3 through NVSHMEM".
  std::string describe() const;

 private:
  struct Barrier;  // the two-level AllGather behind Context::barrier across nodes

  void withdraw() noexcept;

  std::shared_ptr<Context> ctx_;
  void* library_ = nullptr;  // the CUlibrary whose NVSHMEM state was set
  std::vector<int> remote_;
  std::unique_ptr<Barrier> barrier_;
  std::uint64_t barrier_token_ = 0;
};

}  // namespace weft
