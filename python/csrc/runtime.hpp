// runtime.hpp - the process's weft state behind the Python package: the Context,
// the symmetric tensors' frees, and the plans the ops build per shape.
#pragma once

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/EmptyTensor.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "internode.hpp"
#include "plan_key.hpp"
#include "weft/core/error.hpp"
#include "weft/runtime/context.hpp"

namespace weft_torch {

/// A plan of any operator, with the symmetric buffer it stages through (if any).
struct AnyPlan {
  virtual ~AnyPlan() = default;
  weft::SymmetricBuffer staging;
};

template <class Op>
struct Plan : AnyPlan {
  std::unique_ptr<Op> op;
};

class Runtime {
 public:
  /// Collective: also makes the weft::RemotePeers that ranks on several nodes
  /// need, where the extension links weft::internode (internode.hpp).
  Runtime(std::shared_ptr<weft::Context> ctx, std::string group_name)
      : ctx_(std::move(ctx)), group_name_(std::move(group_name)), remote_peers_(make_remote_peers(ctx_)) {}
  /// Frees what close() has not (the plans in key order, the RemotePeers, then the Context).
  ~Runtime();

  weft::Context& ctx() { return *ctx_; }
  const std::shared_ptr<weft::Context>& ctx_ptr() const { return ctx_; }
  const std::string& group_name() const { return group_name_; }
  int device() const { return ctx_->team().device; }
  bool closed() const { return ctx_ == nullptr; }
  /// Whether a weft::RemotePeers is alive: the two-level schedules across nodes are at hand.
  bool remote_peers() const { return remote_peers_ != nullptr; }

  /// Collective: a heap block of `bytes` for a tensor; frees that every rank
  /// has made since the last call are carried out first.
  void* allocate(std::uint64_t bytes, const std::string& type);
  /// Called by a symmetric tensor's deleter (any thread, no collective): the
  /// block is freed by the next collective allocation once every rank has
  /// dropped its tensor.
  void release(void* p);
  /// Collective: frees the blocks that every rank has released.
  void collect();

  /// The plan `key` names, built by `make` (collective) if this process has
  /// none yet. Refused during CUDA graph capture: a plan allocates, checks
  /// the call across ranks and, for the overlapped operators, times its paths.
  /// The lookup is inline and allocates nothing (a hash of the key's integers):
  /// it runs on every op call.
  template <class Make>
  AnyPlan& plan(const char* op, const PlanKey& key, cudaStream_t stream, Make&& make) {
    if (AnyPlan* found = find(key)) return *found;
    return build(op, key, stream, std::forward<Make>(make));
  }
  /// The plan `key` names, or nullptr: for an op that checks more before a
  /// plan is built (build() then builds it).
  AnyPlan* find(const PlanKey& key) {
    auto it = plans_.find(key);
    return it == plans_.end() ? nullptr : it->second.get();
  }
  /// plan()'s first call for `key`: builds the plan with `make`.
  AnyPlan& build(const char* op, const PlanKey& key, cudaStream_t stream,
                 const std::function<std::unique_ptr<AnyPlan>()>& make);

  /// Every plan of one operator, in key order (the same on every rank): for a
  /// call that concerns them all (ag_moe_check_errors).
  std::vector<AnyPlan*> plans_of(PlanKind kind) const {
    std::vector<std::pair<PlanKey, AnyPlan*>> found;
    for (const auto& [key, plan] : plans_)
      if (key.kind == kind) found.emplace_back(key, plan.get());
    std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<AnyPlan*> plans;
    for (const auto& [key, plan] : found) plans.push_back(plan);
    return plans;
  }

  /// Tears everything down (collective): the plans, then the Context and its
  /// heap. Tensors still alive in the heap must not be used afterwards.
  void close();

  std::uint64_t live_tensors() const { return live_; }
  std::uint64_t pending_frees();
  std::uint64_t plan_count() const { return plans_.size(); }

 private:
  /// Frees the plans in key order, the same on every rank: a plan's symmetric
  /// memory is freed collectively, buffer by buffer.
  void drop_plans();

  std::shared_ptr<weft::Context> ctx_;
  std::string group_name_;
  std::shared_ptr<void> remote_peers_;  // a weft::RemotePeers across nodes, else null
  std::mutex mu_;
  std::set<std::uint64_t> pending_;  // heap offsets released by this rank, not yet freed
  std::uint64_t live_ = 0;
  std::unordered_map<PlanKey, std::unique_ptr<AnyPlan>, PlanKeyHash> plans_;
};

extern std::shared_ptr<Runtime> g_runtime;  // set by weft.init (module.cpp)

/// The error of an op called before weft.init() (or after weft.shutdown()).
[[noreturn]] void not_initialised(const char* op);

/// The process's runtime, or an error naming `op` when weft.init() was not called.
/// Inline: every op call starts here.
inline Runtime& runtime(const char* op) {
  Runtime* rt = g_runtime.get();
  if (C10_UNLIKELY(rt == nullptr || rt->closed())) not_initialised(op);
  return *rt;
}
/// The runtime if initialised, else nullptr.
std::shared_ptr<Runtime> runtime_or_null();

/// Whether `stream` is being captured into a CUDA graph.
inline bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaStreamIsCapturing(stream, &status);
  return status != cudaStreamCaptureStatusNone;
}

/// Whether `t`'s bytes lie in the runtime's symmetric heap.
inline bool in_heap(Runtime& rt, const at::Tensor& t) {
  return rt.ctx().heap().contains(t.data_ptr(), std::max<std::uint64_t>(t.nbytes(), 1));
}

// ---- shared by the ops (ops.cpp) and the expert-parallel classes (ep.cpp) ----

/// A dtype as Python prints it ("torch.bfloat16"), for error messages.
inline std::string dtype_name(at::ScalarType t) { return "torch." + c10::getDtypeNames(t).first; }

inline std::string shape_of(const at::Tensor& t) {
  std::ostringstream os;
  os << t.sizes();
  return os.str();
}

/// Argument checks: each names the op, the argument and what was expected.
inline void check_device(const char* op, const char* arg, const at::Tensor& t, Runtime& rt) {
  TORCH_CHECK_VALUE(t.defined(), "weft.", op, ": argument '", arg, "' is undefined");
  TORCH_CHECK_VALUE(t.is_cuda() && t.get_device() == rt.device(), "weft.", op, ": argument '", arg,
                    "' must be on cuda:", rt.device(), " (this rank's GPU, as weft.init chose it), but it is on ",
                    t.device());
}

inline void check_dtype(const char* op, const char* arg, const at::Tensor& t, at::ScalarType want) {
  TORCH_CHECK_TYPE(t.scalar_type() == want, "weft.", op, ": argument '", arg, "' must be ", dtype_name(want),
                   ", got ", dtype_name(t.scalar_type()));
}
inline void check_group(const char* op, c10::string_view group_name, Runtime& rt) {
  TORCH_CHECK_VALUE(group_name.empty() || group_name == rt.group_name(), "weft.", op, ": argument 'group_name' is \"",
                    std::string(group_name), "\", but weft was initialised over group \"", rt.group_name(),
                    "\" (pass that name, or \"\")");
}
/// The error of an op's CPU kernel: weft's ops take CUDA tensors; `arg` is the first CPU one.
[[noreturn]] inline void refuse_cpu(const char* op, const char* arg) {
  TORCH_CHECK_VALUE(false, "weft.", op, ": argument '", arg,
                    "' is a CPU tensor, but weft's ops run on CUDA tensors of this rank's GPU (allocate them with "
                    "weft.empty / weft.zeros, or move them with .cuda())");
}
inline void check_contiguous(const char* op, const char* arg, const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.is_contiguous(), "weft.", op, ": argument '", arg,
                    "' must be contiguous (call .contiguous() first); it has shape ", shape_of(t), " and strides ",
                    t.strides());
}

/// An op's output: a new contiguous tensor of `sizes` and `dtype` on CUDA
/// device `device`, from torch's caching allocator directly, as ATen's own
/// kernels make their outputs. at::empty_like would go through the dispatcher
/// twice per call (empty_like, then the empty it calls), at::empty once; the
/// only other thing they add is filling the tensor under
/// torch.use_deterministic_algorithms' fill_uninitialized_memory, which
/// no op here needs: each writes its whole output.
inline at::Tensor new_output(c10::IntArrayRef sizes, at::ScalarType dtype, at::Device device) {
  return at::detail::empty_cuda(sizes, dtype, device, at::MemoryFormat::Contiguous);
}
/// As above, with `like`'s dtype and device.
inline at::Tensor new_output(c10::IntArrayRef sizes, const at::Tensor& like) {
  return new_output(sizes, like.scalar_type(), like.device());
}

inline cudaStream_t current_stream(Runtime& rt) { return at::cuda::getCurrentCUDAStream(rt.device()).stream(); }

/// Runs `body`, turning a weft::Error into a torch error that names the op.
template <class F>
auto guarded(const char* op, F&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const weft::Error& e) {
    TORCH_CHECK(false, "weft.", op, ": ", e.what());
  }
}

}  // namespace weft_torch
