// ep.cpp - weft._C.ExpertParallel and ExpertParallelLowLatency: MoE expert-parallel
// dispatch and combine (weft/ops/ep.hpp) for torch tensors, behind
// weft.ExpertParallel / weft.ExpertParallelLowLatency (weft/_ep.py).
//
// Classes of this module rather than torch.ops [0059]: a plan is a stateful object
// (calls go layout -> dispatch -> combine, with a handle in between), the
// throughput mode reads its counts on the host and sizes its outputs from
// them (shapes that a fake kernel cannot know, and a host synchronisation
// that no graph could hold), and DeepEP's Buffer, which the Python classes
// follow, is an object too. The plans themselves live in the Runtime's plan
// cache, keyed by their arguments, as the ops' plans do: freeing symmetric
// memory is collective, so a plan is never freed when one rank's Python
// object dies, only at weft.shutdown; objects built with the same arguments
// share one plan (as a model shares one DeepEP Buffer across its layers).
// Every call runs on torch's current stream; outputs come from torch's
// caching allocator, except the low-latency receive buffer, a view.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <pybind11/stl.h>
#include <torch/extension.h>

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "runtime.hpp"
#include "weft/ops/ep.hpp"

namespace py = pybind11;

namespace weft_torch {
namespace {

struct EpPlan : AnyPlan {
  std::unique_ptr<weft::ExpertParallel> op;
  std::uint64_t latest = 0;  // the id of the last dispatch that ran (0: none, or one failed)
  bool combined = false;     // whether that dispatch has been combined
};

using LlPlan = Plan<weft::ExpertParallelLowLatency>;

/// The runtime as a shared pointer: an object keeps it, to tell a call after weft.shutdown.
std::shared_ptr<Runtime> live_runtime(const char* op) {
  runtime(op);  // the "call weft.init() first" error
  return runtime_or_null();
}

Runtime& still_live(const std::shared_ptr<Runtime>& rt, const char* op) {
  TORCH_CHECK(!rt->closed(), "weft.", op, ": weft was shut down after this object was built, and its plan with it; "
              "build it again after weft.init()");
  return *rt;
}

/// A CUDA tensor of this rank's GPU, of dtype `want`, contiguous, shape [rows, cols]
/// (rows < 0: any), starting 16-byte aligned when `aligned` (tokens move as 16-byte vectors).
void check_matrix(const char* op, const char* arg, const at::Tensor& t, at::ScalarType want, std::int64_t rows,
                  std::int64_t cols, const char* cols_name, Runtime& rt, bool aligned) {
  check_device(op, arg, t, rt);
  check_dtype(op, arg, t, want);
  TORCH_CHECK_VALUE(t.dim() == 2 && (rows < 0 || t.size(0) == rows) && t.size(1) == cols, "weft.", op, ": argument '",
                    arg, "' must have shape [", rows < 0 ? std::string("T") : std::to_string(rows), ", ", cols, "] (",
                    cols, " = ", cols_name, "), got ", shape_of(t));
  check_contiguous(op, arg, t);
  TORCH_CHECK_VALUE(!aligned || reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 16 == 0, "weft.", op,
                    ": argument '", arg, "' must start at a 16-byte aligned address (tokens move as 16-byte "
                    "vectors); it is a view at an offset: pass a copy (.clone())");
}

/// x [T, H] bf16, topk_idx [T, k] int64, and (if defined) topk_weights [T, k] float32; returns T.
std::int64_t check_tokens(const char* op, const at::Tensor& x, const at::Tensor& topk_idx,
                          const at::Tensor* topk_weights, int hidden, int top_k, std::int64_t max_tokens,
                          Runtime& rt) {
  check_matrix(op, "x", x, at::kBFloat16, -1, hidden, "hidden", rt, true);
  const std::int64_t T = x.size(0);
  TORCH_CHECK_VALUE(T <= max_tokens, "weft.", op, ": argument 'x' has ", T, " tokens, but the plan was built for at "
                    "most max_tokens = ", max_tokens);
  check_matrix(op, "topk_idx", topk_idx, at::kLong, T, top_k, "top_k", rt, false);
  if (topk_weights) check_matrix(op, "topk_weights", *topk_weights, at::kFloat, T, top_k, "top_k", rt, false);
  return T;
}

// ---- throughput mode ------------------------------------------------------------

/// What dispatch returns besides the tensors: the layout, valid until the plan's next dispatch.
struct EpHandlePy {
  weft::EpHandle h;
  at::Tensor topk_idx;        // the routing the plan's kernels read, kept alive until combine
  const EpPlan* plan = nullptr;
  PlanKey plan_key;  // its plan's, for the error of a handle passed to another plan (formatted only then)
};

class ExpertParallelPy {
 public:
  ExpertParallelPy(std::int64_t experts, std::int64_t hidden, std::int64_t top_k, std::int64_t max_tokens,
                   std::int64_t max_sms) {
    const char* op = "ExpertParallel";
    guarded(op, [&] {
      rt_ = live_runtime(op);
      c10::cuda::CUDAGuard guard(rt_->device());
      key_ = PlanKey::make<PlanKind::expert_parallel>(experts, hidden, top_k, max_tokens, max_sms);
      plan_ = &static_cast<EpPlan&>(rt_->plan(op, key_, current_stream(*rt_), [&] {
        auto p = std::make_unique<EpPlan>();
        p->op = std::make_unique<weft::ExpertParallel>(
            rt_->ctx_ptr(), weft::EpOptions{.experts = static_cast<int>(experts), .hidden = static_cast<int>(hidden),
                                            .top_k = static_cast<int>(top_k), .max_tokens = max_tokens,
                                            .max_sms = static_cast<int>(max_sms)});
        return p;
      }));
    });
  }

  py::tuple dispatch(const at::Tensor& x, const at::Tensor& topk_idx, const at::Tensor& topk_weights) {
    const char* op = "ExpertParallel.dispatch";
    return guarded(op, [&] {
      Runtime& rt = still_live(rt_, op);
      weft::ExpertParallel& ep = *plan_->op;
      const auto& o = ep.options();
      const std::int64_t T = check_tokens(op, x, topk_idx, &topk_weights, o.hidden, o.top_k, o.max_tokens, rt);
      c10::cuda::CUDAGuard guard(rt.device());
      cudaStream_t stream = current_stream(rt);
      plan_->latest = 0;  // every earlier handle is stale from here on
      auto handle = std::make_shared<EpHandlePy>();
      {
        py::gil_scoped_release nogil;  // layout waits for the ranks' counts on the host
        handle->h = ep.layout(topk_idx.data_ptr<std::int64_t>(), T, stream);
      }
      const weft::EpHandle& h = handle->h;
      auto recv_x = at::empty({h.recv_rows, o.hidden}, x.options());
      auto recv_weights = at::empty({h.recv_rows}, topk_weights.options());
      ep.dispatch(h, x.data_ptr(), topk_weights.data_ptr<float>(), recv_x.data_ptr(), recv_weights.data_ptr<float>(),
                  stream);
      plan_->latest = h.id;
      plan_->combined = false;
      handle->topk_idx = topk_idx;
      handle->plan = plan_;
      handle->plan_key = key_;
      return py::make_tuple(recv_x, recv_weights, py::cast(h.expert_rows), py::cast(handle));
    });
  }

  at::Tensor combine(const at::Tensor& y, const EpHandlePy& handle) {
    const char* op = "ExpertParallel.combine";
    return guarded(op, [&] {
      Runtime& rt = still_live(rt_, op);
      weft::ExpertParallel& ep = *plan_->op;
      const weft::EpHandle& h = handle.h;
      TORCH_CHECK_VALUE(handle.plan == plan_, "weft.", op, ": argument 'handle' belongs to another plan (",
                        handle.plan_key.str(), "), not this one (", key_.str(),
                        "): pass the handle this object's dispatch returned");
      if (plan_->latest == 0 || h.id != plan_->latest) {
        const std::string since =
            plan_->latest ? "dispatch #" + std::to_string(plan_->latest) + " has" : "another dispatch has";
        TORCH_CHECK(false, "weft.", op, ": the handle is from dispatch #", h.id, ", but ", since, " run on this plan "
                    "since (objects built with the same arguments share one plan): combine takes the handle of the "
                    "latest dispatch");
      }
      TORCH_CHECK(!plan_->combined, "weft.", op, ": dispatch #", h.id, " has been combined already: combine runs once "
                  "per dispatch");
      check_matrix(op, "y", y, at::kBFloat16, h.recv_rows, ep.options().hidden, "hidden", rt, true);
      c10::cuda::CUDAGuard guard(rt.device());
      auto out = at::empty({h.num_tokens, ep.options().hidden}, y.options());
      ep.combine(h, y.data_ptr(), out.data_ptr(), current_stream(rt));
      plan_->combined = true;
      return out;
    });
  }

  int local_experts() const { return plan_->op->local_experts(); }
  std::int64_t recv_capacity() const { return plan_->op->recv_capacity(); }
  int blocks() const { return plan_->op->blocks(); }
  std::string key() const { return key_.str(); }

 private:
  std::shared_ptr<Runtime> rt_;
  EpPlan* plan_ = nullptr;  // owned by the runtime's plan cache
  PlanKey key_;
};

// ---- low-latency mode ---------------------------------------------------------------

class LowLatencyPy {
 public:
  LowLatencyPy(std::int64_t experts, std::int64_t hidden, std::int64_t top_k, std::int64_t max_tokens,
               std::int64_t max_sms) {
    const char* op = "ExpertParallelLowLatency";
    guarded(op, [&] {
      rt_ = live_runtime(op);
      c10::cuda::CUDAGuard guard(rt_->device());
      key_ = PlanKey::make<PlanKind::expert_parallel_low_latency>(experts, hidden, top_k, max_tokens, max_sms);
      plan_ = &static_cast<LlPlan&>(rt_->plan(op, key_, current_stream(*rt_), [&] {
        auto p = std::make_unique<LlPlan>();
        p->op = std::make_unique<weft::ExpertParallelLowLatency>(
            rt_->ctx_ptr(),
            weft::EpLowLatencyOptions{.experts = static_cast<int>(experts), .hidden = static_cast<int>(hidden),
                                      .top_k = static_cast<int>(top_k), .max_tokens = static_cast<int>(max_tokens),
                                      .max_sms = static_cast<int>(max_sms)});
        return p;
      }));
      world_ = rt_->ctx().world_size();
      per_ = static_cast<int>(experts) / world_;
      slots_ = static_cast<std::int64_t>(world_) * max_tokens;
    });
  }

  std::tuple<at::Tensor, at::Tensor> dispatch(const at::Tensor& x, const at::Tensor& topk_idx) {
    const char* op = "ExpertParallelLowLatency.dispatch";
    return guarded(op, [&] {
      Runtime& rt = still_live(rt_, op);
      weft::ExpertParallelLowLatency& ll = *plan_->op;
      const auto& o = ll.options();
      const std::int64_t T = check_tokens(op, x, topk_idx, nullptr, o.hidden, o.top_k, o.max_tokens, rt);
      c10::cuda::CUDAGuard guard(rt.device());
      ll.dispatch(topk_idx.data_ptr<std::int64_t>(), x.data_ptr(), T, current_stream(rt));
      // The plan's receive buffer itself (no copy: it is the experts' input), valid until its next dispatch.
      // (The device is given: no pointer query, which a call under graph capture had better not make.)
      auto recv_x = at::for_blob(ll.recv_x(), {per_, slots_, o.hidden})
                        .options(x.options())
                        .target_device(x.device())
                        .make_tensor();
      // The counts, copied on the stream (a few bytes): they stay valid after the next dispatch.
      auto counts = at::for_blob(const_cast<std::int32_t*>(ll.recv_count()), {per_, world_})
                        .options(x.options().dtype(at::kInt))
                        .target_device(x.device())
                        .make_tensor()
                        .clone();
      return std::make_tuple(recv_x, counts);
    });
  }

  at::Tensor combine(const at::Tensor& y, const at::Tensor& topk_idx, const at::Tensor& topk_weights) {
    const char* op = "ExpertParallelLowLatency.combine";
    return guarded(op, [&] {
      Runtime& rt = still_live(rt_, op);
      weft::ExpertParallelLowLatency& ll = *plan_->op;
      const auto& o = ll.options();
      check_device(op, "y", y, rt);
      check_dtype(op, "y", y, at::kBFloat16);
      TORCH_CHECK_VALUE(y.dim() == 3 && y.size(0) == per_ && y.size(1) == slots_ && y.size(2) == o.hidden, "weft.", op,
                        ": argument 'y' must have recv_x's shape [", per_, ", ", slots_, ", ", o.hidden,
                        "] (local experts, world size x max_tokens, hidden), got ", shape_of(y));
      check_contiguous(op, "y", y);
      TORCH_CHECK_VALUE(reinterpret_cast<std::uintptr_t>(y.data_ptr()) % 16 == 0, "weft.", op,
                        ": argument 'y' must start at a 16-byte aligned address; pass a copy (.clone())");
      check_matrix(op, "topk_idx", topk_idx, at::kLong, -1, o.top_k, "top_k", rt, false);
      const std::int64_t T = topk_idx.size(0);
      check_matrix(op, "topk_weights", topk_weights, at::kFloat, T, o.top_k, "top_k", rt, false);
      c10::cuda::CUDAGuard guard(rt.device());
      auto out = at::empty({T, o.hidden}, y.options());
      ll.combine(y.data_ptr(), topk_idx.data_ptr<std::int64_t>(), topk_weights.data_ptr<float>(), out.data_ptr(), T,
                 current_stream(rt));
      return out;
    });
  }

  void check_errors() {
    const char* op = "ExpertParallelLowLatency.check_errors";
    guarded(op, [&] {
      Runtime& rt = still_live(rt_, op);
      c10::cuda::CUDAGuard guard(rt.device());
      py::gil_scoped_release nogil;
      plan_->op->check_errors(current_stream(rt));
    });
  }

  int local_experts() const { return per_; }
  std::string key() const { return key_.str(); }

 private:
  std::shared_ptr<Runtime> rt_;
  LlPlan* plan_ = nullptr;  // owned by the runtime's plan cache
  PlanKey key_;
  int world_ = 1, per_ = 0;
  std::int64_t slots_ = 0;  // W x max_tokens: the rows of each local expert's block
};

}  // namespace

void bind_ep(py::module_& m) {
  py::class_<EpHandlePy, std::shared_ptr<EpHandlePy>>(m, "EpHandle",
                                                      "The layout of one ExpertParallel.dispatch, which its combine "
                                                      "takes; valid until the plan's next dispatch.")
      .def_property_readonly("id", [](const EpHandlePy& h) { return h.h.id; })
      .def_property_readonly("num_tokens", [](const EpHandlePy& h) { return h.h.num_tokens; })
      .def_property_readonly("recv_tokens", [](const EpHandlePy& h) { return h.h.recv_tokens; })
      .def_property_readonly("recv_rows", [](const EpHandlePy& h) { return h.h.recv_rows; })
      .def_property_readonly("expert_rows", [](const EpHandlePy& h) { return h.h.expert_rows; })
      .def_property_readonly("expert_offset", [](const EpHandlePy& h) { return h.h.expert_offset; })
      .def_property_readonly("tokens_from", [](const EpHandlePy& h) { return h.h.tokens_from; })
      .def_property_readonly("tokens_to", [](const EpHandlePy& h) { return h.h.tokens_to; })
      .def("__repr__", [](const EpHandlePy& h) {
        return weft::str("EpHandle(dispatch #", h.h.id, ", ", h.h.num_tokens, " tokens, ", h.h.recv_rows,
                         " rows received)");
      });

  py::class_<ExpertParallelPy>(m, "ExpertParallel")
      .def(py::init<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t>(), py::arg("experts"),
           py::arg("hidden"), py::arg("top_k"), py::arg("max_tokens"), py::arg("max_sms"))
      .def("dispatch", &ExpertParallelPy::dispatch, py::arg("x"), py::arg("topk_idx"), py::arg("topk_weights"))
      .def("combine", &ExpertParallelPy::combine, py::arg("y"), py::arg("handle"))
      .def_property_readonly("local_experts", &ExpertParallelPy::local_experts)
      .def_property_readonly("recv_capacity", &ExpertParallelPy::recv_capacity)
      .def_property_readonly("blocks", &ExpertParallelPy::blocks)
      .def_property_readonly("plan_key", &ExpertParallelPy::key);

  py::class_<LowLatencyPy>(m, "ExpertParallelLowLatency")
      .def(py::init<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t>(), py::arg("experts"),
           py::arg("hidden"), py::arg("top_k"), py::arg("max_tokens"), py::arg("max_sms"))
      .def("dispatch", &LowLatencyPy::dispatch, py::arg("x"), py::arg("topk_idx"))
      .def("combine", &LowLatencyPy::combine, py::arg("y"), py::arg("topk_idx"), py::arg("topk_weights"))
      .def("check_errors", &LowLatencyPy::check_errors)
      .def_property_readonly("local_experts", &LowLatencyPy::local_experts)
      .def_property_readonly("plan_key", &LowLatencyPy::key);
}

}  // namespace weft_torch
