// runtime.hpp - the process's weft state behind the Python package: the Context,
// the symmetric tensors' frees, and the plans the ops build per shape.
#pragma once

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

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
  Runtime(std::shared_ptr<weft::Context> ctx, std::string group_name)
      : ctx_(std::move(ctx)), group_name_(std::move(group_name)) {}

  weft::Context& ctx() { return *ctx_; }
  const std::shared_ptr<weft::Context>& ctx_ptr() const { return ctx_; }
  const std::string& group_name() const { return group_name_; }
  int device() const { return ctx_->team().device; }
  bool closed() const { return ctx_ == nullptr; }

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
  /// The lookup is inline and allocates nothing: it runs on every op call.
  template <class Make>
  AnyPlan& plan(const char* op, const std::string& key, cudaStream_t stream, Make&& make) {
    auto it = plans_.find(key);
    if (it != plans_.end()) return *it->second;
    return build(op, key, stream, std::forward<Make>(make));
  }

  /// The plans whose keys start with `prefix`, in key order: for a call that
  /// concerns every plan of one operator (ag_moe_check_errors).
  std::vector<AnyPlan*> plans_named(std::string_view prefix) const {
    std::vector<AnyPlan*> found;
    for (auto it = plans_.lower_bound(std::string(prefix)); it != plans_.end() && it->first.starts_with(prefix); ++it)
      found.push_back(it->second.get());
    return found;
  }

  /// Tears everything down (collective): the plans, then the Context and its
  /// heap. Tensors still alive in the heap must not be used afterwards.
  void close();

  std::uint64_t live_tensors() const { return live_; }
  std::uint64_t pending_frees();
  std::uint64_t plan_count() const { return plans_.size(); }

 private:
  /// plan()'s first call for `key`: builds the plan with `make`.
  AnyPlan& build(const char* op, const std::string& key, cudaStream_t stream,
                 const std::function<std::unique_ptr<AnyPlan>()>& make);

  std::shared_ptr<weft::Context> ctx_;
  std::string group_name_;
  std::mutex mu_;
  std::set<std::uint64_t> pending_;  // heap offsets released by this rank, not yet freed
  std::uint64_t live_ = 0;
  std::map<std::string, std::unique_ptr<AnyPlan>> plans_;
};

/// The process's runtime, or an error naming `op` when weft.init() was not called.
Runtime& runtime(const char* op);
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

/// A plan's key, built on every call: appends and std::to_string, without the
/// ostringstream of weft::str, whose construction alone is a sizeable share
/// of a small collective's host time.
inline void key_part(std::string& key, std::string_view s) { key += s; }
template <class I, std::enable_if_t<std::is_integral_v<I>, int> = 0>
void key_part(std::string& key, I v) {
  key += std::to_string(v);
}
template <class... Parts>
std::string plan_key(const Parts&... parts) {
  std::string key;
  key.reserve(64);
  (key_part(key, parts), ...);
  return key;
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
