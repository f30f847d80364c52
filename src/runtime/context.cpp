#include "weft/runtime/context.hpp"

#include <cstdlib>
#include <cstring>
#include <utility>
#include <exception>

#include "native_heap.hpp"
#include "nvshmem_heap.hpp"
#include "weft/core/env.hpp"
#include "weft/core/error.hpp"
#include "weft/core/log.hpp"

namespace weft {

void launch_barrier_kernel(const dev::World& world, cudaStream_t stream);  // stream_barrier.cu

std::shared_ptr<Context> Context::from_env(const ContextOptions& options) {
  EnvMap env = process_env();
  const Settings settings = Settings::read(env);
  LaunchEnv launch = detect_launch_env(env);
  set_rank_for_messages(launch.rank, launch.world_size);

  StoreOptions so;
  so.master_addr = launch.master_addr;
  so.master_port = launch.master_port;
  so.rank = launch.rank;
  so.world_size = launch.world_size;
  so.timeout = options.store_timeout.count() > 0 ? options.store_timeout : settings.store_timeout;
  return create(launch, Store::connect(so), options, settings);
}

std::shared_ptr<Context> Context::create(const LaunchEnv& launch, std::unique_ptr<Store> store,
                                         const ContextOptions& options) {
  return create(launch, std::move(store), options, Settings::read(process_env()));
}

std::shared_ptr<Context> Context::create(const LaunchEnv& launch, std::unique_ptr<Store> store,
                                         const ContextOptions& options, const Settings& settings) {
  // NVLink multicast must never be used on weft's machines (it can take a
  // shared host's GPUs down); make sure NCCL and NVSHMEM leave it off.
  ::setenv("NCCL_NVLS_ENABLE", "0", 0);
  ::setenv("NVSHMEM_DISABLE_NVLS", "1", 0);
  WEFT_REQUIRE(store, "Context::create needs a connected store");
  WEFT_REQUIRE(store->rank() == launch.rank && store->world_size() == launch.world_size, "Context::create: the store",
               " is rank ", store->rank(), " of ", store->world_size(), " but the launch environment says rank ",
               launch.rank, " of ", launch.world_size);

  std::shared_ptr<Context> ctx(new Context());
  EnvMap env = process_env();
  ctx->env_ = launch;
  ctx->settings_ = settings;
  set_rank_for_messages(ctx->env_.rank, ctx->env_.world_size);
  ctx->store_ = std::move(store);
  ctx->team_ = Team::discover(ctx->env_, *ctx->store_, options.virtual_nodes);

  std::uint64_t heap_bytes = options.heap_bytes ? options.heap_bytes : settings.heap_bytes;
  const HeapBackend backend = agree_heap_backend(options.heap_backend, env, ctx->team_.num_nodes, nvshmem_built(),
                                                 *ctx->store_, ctx->team_.virtual_nodes);
  ctx->heap_ = backend == HeapBackend::nvshmem ? make_nvshmem_heap(*ctx->store_, ctx->team_, heap_bytes)
                                               : make_native_heap(*ctx->store_, ctx->team_, heap_bytes);
  ctx->all_peers_direct_ = unreachable_pairs(ctx->heap_->reachability()).empty();

  if (options.create_nccl && ctx->team_.shares_gpus()) {
    WEFT_LOG(info, "no NCCL communicator: ranks share a GPU (", ctx->team_.ranks_per_gpu,
             " on one), which NCCL refuses; what needs NCCL is left out");
  } else if (options.create_nccl) {
    ncclUniqueId id{};
    if (ctx->rank() == 0) WEFT_NCCL(ncclGetUniqueId(&id));
    std::string blob = ctx->store_->broadcast(
        0, std::string_view(reinterpret_cast<const char*>(&id), sizeof(id)), "NCCL unique id");
    std::memcpy(&id, blob.data(), sizeof(id));
    WEFT_NCCL(ncclCommInitRank(&ctx->nccl_, ctx->world_size(), id, ctx->rank()));
  }

  ctx->wait_timeout_ = options.wait_timeout.count() >= 0 ? options.wait_timeout : settings.wait_timeout;
  WEFT_CUDA(cudaHostAlloc(&ctx->wait_report_, sizeof(dev::WaitReport), cudaHostAllocMapped | cudaHostAllocPortable));
  std::memset(ctx->wait_report_, 0, sizeof(dev::WaitReport));
  WEFT_CUDA(cudaMalloc(&ctx->barrier_epoch_, sizeof(std::uint64_t)));
  WEFT_CUDA(cudaMemset(ctx->barrier_epoch_, 0, sizeof(std::uint64_t)));

  auto* barrier_flags = ctx->heap_->alloc<std::uint64_t>(ctx->world_size(), "u64", "weft.barrier_flags");
  dev::World& w = ctx->world_;
  w.rank = ctx->rank();
  w.size = ctx->world_size();
  w.heap_base = ctx->heap_->base();
  w.heap_bytes = ctx->heap_->capacity();
  w.peer_base = ctx->heap_->peer_bases_device();
  w.barrier_flags = barrier_flags;
  w.barrier_epoch = ctx->barrier_epoch_;
  w.wait_timeout_ns = static_cast<std::uint64_t>(ctx->wait_timeout_.count()) * 1000000ull;
  void* report_device = nullptr;
  WEFT_CUDA(cudaHostGetDevicePointer(&report_device, ctx->wait_report_, 0));
  w.wait_report = static_cast<dev::WaitReport*>(report_device);
  // Every failed CUDA call of this process says why the GPU stopped, where the Context knows.
  set_cuda_failure_note([raw = ctx.get()](int code) { return raw->failure_note(code); });
  WEFT_LOG(info, "context ready: ", describe(ctx->env_), ", GPU ", ctx->team_.device, " (",
           ctx->team_.pci_bus_id[ctx->rank()], "), ", ctx->team_.sm_count, " of its ", ctx->team_.gpu_sm_count, " SMs",
           ctx->team_.mps_client ? " (MPS)" : "");
  return ctx;
}

Context::~Context() {
  set_cuda_failure_note(nullptr);
  // Release in reverse order of construction; the heap meets its peers first.
  heap_.reset();
  // After a trapped wait this rank's CUDA context is dead: abort NCCL rather than tear it down politely.
  const bool broken = wait_report_ && wait_report_->hit;
  if (nccl_) {
    if (std::uncaught_exceptions() == 0 && !broken) ncclCommDestroy(nccl_);
    else ncclCommAbort(nccl_);
  }
  if (barrier_epoch_) cudaFree(barrier_epoch_);
  if (wait_report_) cudaFreeHost(wait_report_);
  store_.reset();
}

ncclComm_t Context::nccl() const {
  WEFT_REQUIRE(nccl_, team_.shares_gpus()
                          ? "NCCL is not available in this job: ranks share a GPU, and NCCL refuses two ranks on one GPU"
                          : "this Context was created without an NCCL communicator (ContextOptions::create_nccl)");
  return nccl_;
}

void Context::barrier(cudaStream_t stream) {
  if (!all_peers_direct_) {
    if (!barriers_across_nodes_.empty()) return barriers_across_nodes_.back().second(stream);
    require_direct_peers("Context::barrier", "which Context::barrier takes through the barrier a weft::RemotePeers "
                                             "(weft::internode) installs while it is alive: construct one first.");
  }
  launch_barrier_kernel(world_, stream);
}

std::uint64_t Context::install_barrier_across_nodes(std::function<void(cudaStream_t)> barrier) {
  WEFT_REQUIRE(barrier, "install_barrier_across_nodes: an empty barrier");
  barriers_across_nodes_.emplace_back(++barrier_tokens_, std::move(barrier));
  return barrier_tokens_;
}

void Context::withdraw_barrier_across_nodes(std::uint64_t token) {
  std::erase_if(barriers_across_nodes_, [token](const auto& entry) { return entry.first == token; });
}

void Context::require_direct_peers(const std::string& who, const std::string& remedy) const {
  if (!all_peers_direct_) weft::require_direct_peers(who, heap_->reachability(), heap_->backend(), remedy);
}

void Context::host_barrier(const std::string& what) { store_->barrier(what); }

void Context::verify_same_call(const std::string& description) {
  const std::uint64_t n = ++calls_verified_;
  auto all = store_->all_gather(description, "collective call check");
  std::string differ;
  for (int r = 1; r < world_size(); ++r)
    if (all[r] != all[0]) differ += str("\n  rank ", r, ": ", all[r]);
  WEFT_REQUIRE(differ.empty(), "ranks disagree on checked call #", n, ":\n  rank 0: ", all[0], differ,
               "\nEvery rank must make the same collective calls, with the same sizes, in the same order.");
}

std::string Context::failure_note(int cuda_error) const {
  const volatile dev::WaitReport* r = wait_report_;
  if (r && r->hit) {
    auto cmp = static_cast<dev::Cmp>(r->cmp);
    std::string flag = r->flag_offset == ~std::uint64_t{0}
                           ? std::string("a flag outside the symmetric heap")
                           : "signal " + heap_->describe_offset(r->flag_offset);
    std::string who = r->peer >= 0 ? str("rank ", r->peer, " never signalled it") : std::string("a peer never signalled");
    return str("device wait timed out: rank ", r->rank, " (block ", r->block, ") waited ",
               static_cast<double>(r->waited_ns) / 1e9, " s for ", flag, " to become ", dev::cmp_name(cmp), " ",
               r->expected, "; it holds ", r->observed, ". ", who,
               ": check that every rank made the same calls, in the same order "
               "(WEFT_CHECK_CALLS=1 compares every call across ranks). WEFT_WAIT_TIMEOUT sets the bound; the CUDA "
               "context of this rank is now unusable.");
  }
  // Under MPS a fatal error in any client ends the work of every client on
  // that GPU: this rank's kernels may have been stopped by another rank's.
  const bool fatal = cuda_error == cudaErrorLaunchFailure || cuda_error == cudaErrorIllegalAddress ||
                     cuda_error == cudaErrorIllegalInstruction || cuda_error == cudaErrorMisalignedAddress ||
                     cuda_error == cudaErrorInvalidPc || cuda_error == cudaErrorHardwareStackError ||
                     cuda_error == cudaErrorMpsClientTerminated || cuda_error == cudaErrorUnknown;
  if (fatal && team_.mps_client && team_.same_gpu_ranks.size() > 1) {
    std::string sharing;
    for (int q : team_.same_gpu_ranks) sharing += str(sharing.empty() ? "" : ", ", q);
    return str("Ranks ", sharing, " share this GPU under MPS, where a fatal error in one rank (a wait that timed out, ",
               "a fault) ends every one's work: the other ranks' messages say which failed first");
  }
  return "";
}

void Context::check_wait_report() const {
  const volatile dev::WaitReport* r = wait_report_;
  if (r && r->hit) WEFT_FAIL(failure_note(cudaErrorLaunchFailure));
}

void Context::synchronize(cudaStream_t stream) {
  cudaError_t rc = cudaStreamSynchronize(stream);
  if (rc == cudaSuccess) return;
  check_wait_report();
  WEFT_CUDA(rc);  // the failure note says what this rank knows of why
}

SymmetricBuffer::SymmetricBuffer(SymmetricHeap& heap, std::uint64_t bytes, const std::string& type,
                                 const std::string& name)
    : heap_(&heap), ptr_(heap.alloc(bytes, type, name)), bytes_(bytes) {}

SymmetricBuffer::~SymmetricBuffer() { reset(); }

SymmetricBuffer::SymmetricBuffer(SymmetricBuffer&& o) noexcept
    : heap_(std::exchange(o.heap_, nullptr)), ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

SymmetricBuffer& SymmetricBuffer::operator=(SymmetricBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    heap_ = std::exchange(o.heap_, nullptr);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void SymmetricBuffer::reset() {
  if (!ptr_) return;
  try {
    if (std::uncaught_exceptions() == 0) heap_->free(ptr_);
  } catch (const std::exception& e) {
    WEFT_LOG(warn, "freeing a symmetric buffer failed: ", e.what());
  }
  ptr_ = nullptr;
}

SignalArray::SignalArray(SymmetricHeap& heap, std::uint64_t count, const std::string& name)
    : buffer_(heap, count * sizeof(std::uint64_t), "u64", name), count_(count) {
  WEFT_CUDA(cudaMalloc(&epoch_device_, sizeof(std::uint64_t) + sizeof(unsigned)));
  WEFT_CUDA(cudaMemset(epoch_device_, 0, sizeof(std::uint64_t) + sizeof(unsigned)));
  arrivals_device_ = reinterpret_cast<unsigned*>(epoch_device_ + 1);
}

SignalArray::~SignalArray() {
  if (epoch_device_) cudaFree(epoch_device_);
}

SignalArray::SignalArray(SignalArray&& o) noexcept
    : buffer_(std::move(o.buffer_)),
      count_(std::exchange(o.count_, 0)),
      epoch_device_(std::exchange(o.epoch_device_, nullptr)),
      arrivals_device_(std::exchange(o.arrivals_device_, nullptr)) {}

SignalArray& SignalArray::operator=(SignalArray&& o) noexcept {
  if (this != &o) {
    if (epoch_device_) cudaFree(epoch_device_);
    buffer_ = std::move(o.buffer_);
    count_ = std::exchange(o.count_, 0);
    epoch_device_ = std::exchange(o.epoch_device_, nullptr);
    arrivals_device_ = std::exchange(o.arrivals_device_, nullptr);
  }
  return *this;
}

}  // namespace weft
