// weft/runtime/context.hpp - one object per process that holds the job together.
//
//   auto ctx = weft::Context::from_env();   // rendezvous, team, heap, NCCL
//   weft::AllGather ag(ctx, {.bytes_per_rank = 1 << 20});
//   ag.run(in, out, stream);
//
// The Context owns, in this order of construction: the rendezvous store, the
// team (GPU picked and made current), the symmetric heap, an NCCL communicator
// (for host-side collectives and baselines), and the device World that
// kernels receive.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "weft/runtime/heap.hpp"
#include "weft/runtime/launch_env.hpp"
#include "weft/runtime/settings.hpp"
#include "weft/runtime/store.hpp"
#include "weft/runtime/team.hpp"
#include "weft/runtime/world.hpp"

namespace weft {

/// Settings for Context::from_env; zero/negative values defer to the environment.
struct ContextOptions {
  /// Bytes of symmetric heap per rank. 0: WEFT_HEAP_SIZE, else 1 GiB.
  std::uint64_t heap_bytes = 0;
  /// Which heap backend (docs/decisions/0057). Unset: WEFT_HEAP_BACKEND
  /// (native, nvshmem or auto), else auto: NVSHMEM when the job spans nodes
  /// and weft was built with it, the native heap otherwise. Every rank must ask
  /// for the same; asking for nvshmem from a build without it throws, saying
  /// how to build it.
  std::optional<HeapBackend> heap_backend;
  /// Virtual nodes, for tests of the inter-node paths on one machine: the
  /// job's ranks (all on one machine) split into this many nodes of contiguous
  /// ranks (Team::virtual_nodes). Unset: WEFT_VIRTUAL_NODES, else 1 (no split).
  /// Must divide the world size; needs the NVSHMEM heap (auto takes it;
  /// native throws), which leaves peers in other virtual nodes unmapped.
  std::optional<int> virtual_nodes;
  /// Create the NCCL communicator (needed for baselines and host collectives).
  /// Never created where ranks share a GPU: NCCL refuses two ranks on one GPU.
  bool create_nccl = true;
  /// Rendezvous timeout. 0: WEFT_STORE_TIMEOUT (seconds), else 120 s.
  std::chrono::milliseconds store_timeout{0};
  /// Bound on every device spin-wait. Negative: WEFT_WAIT_TIMEOUT (seconds; 0
  /// turns the bound off), else 60 s.
  std::chrono::milliseconds wait_timeout{-1};
};

/// The process's handle on the job. Create one per process, collectively.
class Context {
 public:
  /// Collective: reads the launcher's environment (weftrun, torchrun, mpirun,
  /// Slurm, or none for a single process), meets the other ranks, picks this
  /// rank's GPU, builds the heap and the NCCL communicator. Throws weft::Error
  /// with the rank and what failed.
  static std::shared_ptr<Context> from_env(const ContextOptions& options = {});
  /// Collective, as from_env, but over a rendezvous the caller already holds:
  /// `env` says where this rank sits (rank, world, local rank, GPU sharing)
  /// and `store` is a connected store of the same ranks (the Python package
  /// backs it with torch.distributed's c10d store, so no second port opens).
  static std::shared_ptr<Context> create(const LaunchEnv& env, std::unique_ptr<Store> store,
                                         const ContextOptions& options = {});
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  /// This process's rank, its world size, how it was launched, and its team
  /// (nodes, GPUs, links).
  int rank() const { return team_.rank; }
  int world_size() const { return team_.world_size; }
  const LaunchEnv& launch_env() const { return env_; }
  const Team& team() const { return team_; }
  /// The ranks' key-value store (bootstrap exchanges, call checks).
  Store& store() { return *store_; }
  /// The symmetric heap every collective buffer lives in (heap().backend() says which).
  SymmetricHeap& heap() { return *heap_; }
  /// The NCCL communicator over all ranks (throws, saying why, if there is none).
  ncclComm_t nccl() const;
  /// Whether nccl() has a communicator: asked for, and every rank on a GPU of
  /// its own. Paths and baselines that need NCCL are left out without it.
  bool has_nccl() const { return nccl_ != nullptr; }
  /// The device view kernels take as their World argument.
  const dev::World& world() const { return world_; }

  /// Enqueues a barrier across all ranks on `stream`: work after it on any
  /// rank's stream starts only once every rank's stream reached it. Calls on
  /// one rank must not run concurrently on two streams. Where every peer is
  /// mapped: a one-block kernel that stores to every peer's flag (and stores
  /// to peers issued before it are then visible). Where some peer is not (ranks
  /// on several nodes, or WEFT_VIRTUAL_NODES): the barrier a layer that
  /// reaches such peers installed (weft::RemotePeers, while it is alive: a
  /// few bytes' two-level AllGather on NVSHMEM's device path, which ends on a
  /// rank only once every rank has started it); without one, it throws on
  /// every rank, naming the ranks without a direct path and that remedy.
  void barrier(cudaStream_t stream);
  /// Installs the barrier barrier() enqueues where some peer is not mapped;
  /// the latest installed is used. Returns a token for withdraw_barrier_across_nodes.
  /// Not collective, but every rank must install alike (weft::RemotePeers'
  /// constructor, which is collective, does).
  std::uint64_t install_barrier_across_nodes(std::function<void(cudaStream_t)> barrier);
  /// Withdraws the barrier `token` names (before what it runs is destroyed).
  void withdraw_barrier_across_nodes(std::uint64_t token);

  /// True when every rank maps every peer's heap (World::reachable(pe) holds
  /// for every pe on every rank): always on the native heap; on the NVSHMEM
  /// heap, when the job has one node and no virtual nodes.
  bool all_peers_direct() const { return all_peers_direct_; }
  /// Throws, on every rank alike, naming `who` and each pair of ranks without
  /// a direct path, unless all_peers_direct(). Every operator whose kernels
  /// load or store peers' memory through World::symm_at, or copy to it by
  /// copy engine, calls it before its first collective step; kernels written
  /// on weft/device/remote.cuh handle unreachable peers and need not.
  /// `remedy`, where given, ends the message: what would serve such peers
  /// (the collectives: their two-level schedule, and what it needs).
  void require_direct_peers(const std::string& who, const std::string& remedy = "") const;
  /// Host barrier through the rendezvous store (not ordered with GPU work).
  void host_barrier(const std::string& what);

  /// cudaStreamSynchronize that turns a timed-out device wait into an error
  /// naming the rank, the flag, the expected and the observed value.
  void synchronize(cudaStream_t stream);
  /// Throws the timed-out-wait error if any wait on this rank gave up; else no-op.
  void check_wait_report() const;
  /// What this rank knows of why its GPU work stopped with `cuda_error`: its
  /// timed-out wait (rank, flag, values), or, for a fatal error where ranks
  /// share the GPU under MPS, that another rank's fatal error ends every
  /// rank's work; "" otherwise. Every failed CUDA call's message ends with it
  /// (set_cuda_failure_note).
  std::string failure_note(int cuda_error) const;
  /// Collective: checks that every rank describes the same call ("AllReduce
  /// plan: 1048576 x bf16, two_shot") and throws on every rank, naming each
  /// rank whose description differs from rank 0's, if not. Plans call it at
  /// construction always, and on every run when check_calls() is on: a rank
  /// that skips or changes a call is then reported instead of hanging.
  void verify_same_call(const std::string& description);
  /// WEFT_CHECK_CALLS=1: compare every collective run across ranks (a store
  /// round trip per call: for debugging and tests, not for speed).
  bool check_calls() const { return settings_.check_calls; }
  /// The WEFT_* settings, read once as the Context was made.
  const Settings& settings() const { return settings_; }
  /// Bound applied to device spin-waits (0 = none).
  std::chrono::milliseconds wait_timeout() const { return wait_timeout_; }

 private:
  Context() = default;
  static std::shared_ptr<Context> create(const LaunchEnv& env, std::unique_ptr<Store> store,
                                         const ContextOptions& options, const Settings& settings);

  LaunchEnv env_;
  std::unique_ptr<Store> store_;
  Team team_;
  std::unique_ptr<SymmetricHeap> heap_;
  ncclComm_t nccl_ = nullptr;
  dev::World world_{};
  dev::WaitReport* wait_report_ = nullptr;  // mapped pinned host memory
  std::uint64_t* barrier_epoch_ = nullptr;  // device memory
  std::chrono::milliseconds wait_timeout_{0};
  Settings settings_;
  bool all_peers_direct_ = true;
  std::uint64_t calls_verified_ = 0;
  std::vector<std::pair<std::uint64_t, std::function<void(cudaStream_t)>>> barriers_across_nodes_;
  std::uint64_t barrier_tokens_ = 0;
};

/// A symmetric allocation owned by an object: allocated collectively on
/// construction, freed collectively on destruction (errors there are logged,
/// not thrown).
class SymmetricBuffer {
 public:
  SymmetricBuffer() = default;
  /// Collective: `bytes` of `type` named `name` on every rank's heap, zeroed.
  SymmetricBuffer(SymmetricHeap& heap, std::uint64_t bytes, const std::string& type, const std::string& name);
  ~SymmetricBuffer();
  SymmetricBuffer(SymmetricBuffer&& o) noexcept;
  SymmetricBuffer& operator=(SymmetricBuffer&& o) noexcept;

  /// This rank's address of the buffer (nullptr when empty), untyped or as T*.
  void* get() const { return ptr_; }
  template <class T>
  T* as() const { return static_cast<T*>(ptr_); }
  /// Its size in bytes, as allocated on every rank.
  std::uint64_t bytes() const { return bytes_; }

 private:
  void reset();
  SymmetricHeap* heap_ = nullptr;
  void* ptr_ = nullptr;
  std::uint64_t bytes_ = 0;
};

/// A symmetric array of 64-bit signal flags plus the epoch their owner advances.
/// Every use of the flags is one epoch (1, 2, 3, ...), the same on every rank;
/// producers set a flag to the epoch (or add to it) and consumers wait for
/// flag >= epoch (or epoch x contributions). Flags only grow, so repeated runs
/// never need a reset.
///
/// The epoch lives in device memory (dev::LaunchEpoch): kernels read it at
/// start and the last block to finish advances it (or, for copy-engine
/// pipelines, a one-thread kernel advances it first), so a captured CUDA graph
/// replays correctly.
class SignalArray {
 public:
  SignalArray() = default;
  /// Collective: `count` zeroed flags named `name`, and a zeroed device epoch.
  SignalArray(SymmetricHeap& heap, std::uint64_t count, const std::string& name);
  ~SignalArray();
  SignalArray(SignalArray&&) noexcept;
  SignalArray& operator=(SignalArray&&) noexcept;

  /// This rank's flags (symmetric: peers reach them through the heap), and how many.
  std::uint64_t* flags() const { return buffer_.as<std::uint64_t>(); }
  std::uint64_t count() const { return count_; }
  /// The device-side epoch for kernels (dev::epoch_begin / dev::epoch_end).
  dev::LaunchEpoch launch_epoch() const { return {epoch_device_, arrivals_device_}; }

 private:
  SymmetricBuffer buffer_;
  std::uint64_t count_ = 0;
  std::uint64_t* epoch_device_ = nullptr;
  unsigned* arrivals_device_ = nullptr;
};

}  // namespace weft
