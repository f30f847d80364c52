// ops.cpp - torch.ops.weft: the collectives and overlapped operators as dispatcher ops.
//
// Schemas follow PyTorch's counterparts (the c10d functional collectives and
// torch.ops.symm_mem). Every CUDA kernel here runs the weft plan for its
// shape on torch's current stream, so streams, events and CUDA graph capture
// behave as for any torch op; the plan is built (collectively) on the first
// call with that shape, which must not be captured. Inputs outside the
// symmetric heap are staged through a buffer the plan owns, where the plan's
// variant needs them in the heap. The CPU kernels only refuse, saying what
// was expected; the fake (meta) kernels are registered from Python
// (weft/_meta.py), which also checks arguments for tracing.
#include <ATen/ATen.h>
#include <ATen/FunctionalTensorWrapper.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <vector>

#include "runtime.hpp"
#include "weft/core/error.hpp"
#include "weft/ops/ag_gemm.hpp"
#include "weft/ops/all_gather.hpp"
#include "weft/ops/all_reduce.hpp"
#include "weft/ops/gemm_ar.hpp"
#include "weft/ops/gemm_rs.hpp"
#include "weft/ops/reduce_scatter.hpp"

namespace weft_torch {
namespace {

// ---- argument checks: each names the op, the argument and what was expected ----

weft::DType to_weft(at::ScalarType t, const char* op, const char* arg, bool bf16_only) {
  if (t == at::kBFloat16) return weft::DType::bf16;
  TORCH_CHECK_TYPE(!bf16_only, "weft.", op, ": argument '", arg, "' must be torch.bfloat16, got ", t);
  if (t == at::kHalf) return weft::DType::fp16;
  if (t == at::kFloat) return weft::DType::fp32;
  TORCH_CHECK_TYPE(false, "weft.", op, ": argument '", arg,
                   "' must be torch.bfloat16, torch.float16 or torch.float32, got ", t);
}

void check_sum(const char* op, c10::string_view reduce_op) {
  TORCH_CHECK_VALUE(reduce_op == "sum", "weft.", op, ": argument 'reduce_op' must be \"sum\" (weft reduces by "
                    "sum only), got \"", std::string(reduce_op), "\"");
}

void check_group_size(const char* op, int64_t group_size, Runtime& rt) {
  TORCH_CHECK_VALUE(group_size == rt.ctx().world_size(), "weft.", op, ": argument 'group_size' is ", group_size,
                    ", but weft's group has ", rt.ctx().world_size(), " ranks");
}

void copy(void* dst, const void* src, std::uint64_t bytes, cudaStream_t stream) {
  WEFT_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
}

// ---- collectives ---------------------------------------------------------

void all_reduce_into(Runtime& rt, const char* op, const at::Tensor& input, const at::Tensor& output,
                     c10::string_view reduce_op, c10::string_view group_name) {
  check_sum(op, reduce_op);
  check_group(op, group_name, rt);
  check_device(op, "input", input, rt);
  check_contiguous(op, "input", input);
  const weft::DType dtype = to_weft(input.scalar_type(), op, "input", false);
  if (input.numel() == 0) return;
  c10::cuda::CUDAGuard guard(rt.device());
  cudaStream_t stream = current_stream(rt);
  const std::uint64_t count = input.numel(), bytes = input.nbytes();
  const PlanKey key = PlanKey::make<PlanKind::all_reduce>(count, dtype);
  auto& plan = static_cast<Plan<weft::AllReduce>&>(rt.plan(op, key, stream, [&] {
    auto p = std::make_unique<Plan<weft::AllReduce>>();
    p->op = std::make_unique<weft::AllReduce>(rt.ctx_ptr(),
                                              weft::AllReduceOptions{.count = count, .dtype = dtype});
    const auto v = p->op->variant();
    if (v == weft::AllReduceVariant::two_shot || v == weft::AllReduceVariant::copy_engine)
      p->staging = weft::SymmetricBuffer(rt.ctx().heap(), bytes, weft::to_string(dtype), "weft.all_reduce staging");
    return p;
  }));
  if (!plan.staging.get() || (in_heap(rt, input) && in_heap(rt, output))) {
    plan.op->run(input.data_ptr(), output.data_ptr(), stream);
  } else {
    copy(plan.staging.get(), input.data_ptr(), bytes, stream);
    plan.op->run(plan.staging.get(), plan.staging.get(), stream);
    copy(output.data_ptr(), plan.staging.get(), bytes, stream);
  }
}

at::Tensor all_reduce(const at::Tensor& input, c10::string_view reduce_op, c10::string_view group_name) {
  return guarded("all_reduce", [&] {
    Runtime& rt = runtime("all_reduce");
    auto out = new_output(input.sizes(), input);
    all_reduce_into(rt, "all_reduce", input, out, reduce_op, group_name);
    return out;
  });
}

at::Tensor& all_reduce_(at::Tensor& input, c10::string_view reduce_op, c10::string_view group_name) {
  return guarded("all_reduce_", [&]() -> at::Tensor& {
    all_reduce_into(runtime("all_reduce_"), "all_reduce_", input, input, reduce_op, group_name);
    return input;
  });
}

void all_gather_into(Runtime& rt, const char* op, const at::Tensor& input, const at::Tensor& out, int64_t group_size,
                     c10::string_view group_name) {
  check_group(op, group_name, rt);
  check_group_size(op, group_size, rt);
  check_device(op, "input", input, rt);
  check_contiguous(op, "input", input);
  const int world = rt.ctx().world_size();
  if (input.numel() == 0) return;
  c10::cuda::CUDAGuard guard(rt.device());
  cudaStream_t stream = current_stream(rt);
  const std::uint64_t bytes = input.nbytes();
  const PlanKey key = PlanKey::make<PlanKind::all_gather>(bytes);
  auto& plan = static_cast<Plan<weft::AllGather>&>(rt.plan(op, key, stream, [&] {
    auto p = std::make_unique<Plan<weft::AllGather>>();
    p->op = std::make_unique<weft::AllGather>(rt.ctx_ptr(),
                                              weft::AllGatherOptions{.bytes_per_rank = bytes});
    if (p->op->variant() != weft::AllGatherVariant::low_latency)
      p->staging = weft::SymmetricBuffer(rt.ctx().heap(), bytes * world, "bytes", "weft.all_gather staging");
    return p;
  }));
  const auto v = plan.op->variant();
  const bool direct = !plan.staging.get() || (v == weft::AllGatherVariant::pull ? in_heap(rt, input) : in_heap(rt, out));
  if (direct) {
    plan.op->run(input.data_ptr(), out.data_ptr(), stream);
  } else {
    char* slot = static_cast<char*>(plan.staging.get()) + bytes * rt.ctx().rank();
    copy(slot, input.data_ptr(), bytes, stream);
    plan.op->run(slot, plan.staging.get(), stream);
    copy(out.data_ptr(), plan.staging.get(), bytes * world, stream);
  }
}

at::Tensor all_gather_into_tensor(const at::Tensor& input, int64_t group_size, c10::string_view group_name) {
  return guarded("all_gather_into_tensor", [&] {
    Runtime& rt = runtime("all_gather_into_tensor");
    TORCH_CHECK_VALUE(input.dim() >= 1, "weft.all_gather_into_tensor: argument 'input' must have at least one "
                      "dimension (it is gathered along dimension 0)");
    at::DimVector sizes(input.sizes());
    sizes[0] *= group_size;
    auto out = new_output(sizes, input);
    all_gather_into(rt, "all_gather_into_tensor", input, out, group_size, group_name);
    return out;
  });
}

at::Tensor& all_gather_into_tensor_out(const at::Tensor& input, int64_t group_size, c10::string_view group_name,
                                       at::Tensor& out) {
  return guarded("all_gather_into_tensor_out", [&]() -> at::Tensor& {
    const char* op = "all_gather_into_tensor_out";
    Runtime& rt = runtime(op);
    check_device(op, "out", out, rt);
    check_contiguous(op, "out", out);
    TORCH_CHECK_TYPE(out.scalar_type() == input.scalar_type(), "weft.", op, ": argument 'out' must have input's dtype ",
                     input.scalar_type(), ", got ", out.scalar_type());
    TORCH_CHECK_VALUE(input.dim() >= 1 && out.dim() == input.dim() && out.size(0) == input.size(0) * group_size &&
                          out.sizes().slice(1) == input.sizes().slice(1),
                      "weft.", op, ": argument 'out' must have shape [group_size x ", input.dim() ? input.size(0) : 0,
                      ", ...] for input ", shape_of(input), ", got ", shape_of(out));
    all_gather_into(rt, op, input, out, group_size, group_name);
    return out;
  });
}

at::Tensor reduce_scatter_tensor(const at::Tensor& input, c10::string_view reduce_op, int64_t group_size,
                                 c10::string_view group_name) {
  const char* op = "reduce_scatter_tensor";
  return guarded(op, [&] {
    Runtime& rt = runtime(op);
    check_sum(op, reduce_op);
    check_group(op, group_name, rt);
    check_group_size(op, group_size, rt);
    check_device(op, "input", input, rt);
    check_contiguous(op, "input", input);
    const weft::DType dtype = to_weft(input.scalar_type(), op, "input", false);
    TORCH_CHECK_VALUE(input.dim() >= 1 && input.size(0) % group_size == 0, "weft.", op,
                      ": argument 'input' must have a first dimension divisible by group_size (", group_size,
                      "), got shape ", shape_of(input));
    at::DimVector sizes(input.sizes());
    sizes[0] /= group_size;
    auto out = new_output(sizes, input);
    if (out.numel() == 0) return out;
    c10::cuda::CUDAGuard guard(rt.device());
    cudaStream_t stream = current_stream(rt);
    const std::uint64_t count = out.numel();
    const PlanKey key = PlanKey::make<PlanKind::reduce_scatter>(count, dtype);
    auto& plan = static_cast<Plan<weft::ReduceScatter>&>(rt.plan(op, key, stream, [&] {
      auto p = std::make_unique<Plan<weft::ReduceScatter>>();
      p->op = std::make_unique<weft::ReduceScatter>(rt.ctx_ptr(),
                                                    weft::ReduceScatterOptions{.count = count, .dtype = dtype});
      if (p->op->variant() == weft::ReduceScatterVariant::mesh)
        p->staging = weft::SymmetricBuffer(rt.ctx().heap(), input.nbytes(), weft::to_string(dtype),
                                           "weft.reduce_scatter staging");
      return p;
    }));
    if (!plan.staging.get() || in_heap(rt, input)) {
      plan.op->run(input.data_ptr(), out.data_ptr(), stream);
    } else {
      copy(plan.staging.get(), input.data_ptr(), input.nbytes(), stream);
      plan.op->run(plan.staging.get(), out.data_ptr(), stream);
    }
    return out;
  });
}

// ---- overlapped operators --------------------------------------------------

/// B [K, N] as weft's overlapped GEMMs read it: the transpose of a row-major
/// [N, K] (BLayout::nk, a Linear weight's .t(): read in place). Any other
/// layout is copied into that one (the hooked kernels are compiled for nk).
struct BOperand {
  at::Tensor t;  // keeps a copy alive
  const void* ptr;
};

void check_b(const char* op, const char* arg, const at::Tensor& b, int64_t k, Runtime& rt) {
  check_device(op, arg, b, rt);
  to_weft(b.scalar_type(), op, arg, true);
  TORCH_CHECK_VALUE(b.dim() == 2 && b.size(0) == k, "weft.", op, ": argument '", arg, "' must be a matrix [K, N] with K = ",
                    k, " (A's last dimension), got shape ", shape_of(b));
  TORCH_CHECK_VALUE(b.size(1) > 0 && b.size(1) % 8 == 0, "weft.", op, ": argument '", arg,
                    "' must have N (its second dimension) a positive multiple of 8, got shape ", shape_of(b));
}

BOperand b_operand(const char* op, const char* arg, const at::Tensor& b, int64_t k, Runtime& rt) {
  check_b(op, arg, b, k, rt);
  if (b.stride(0) == 1 && b.stride(1) == k) return {b, b.data_ptr()};
  auto nk = b.t().contiguous();  // [N, K] row-major
  return {nk, nk.data_ptr()};
}

/// A [..., K] bf16 on weft's GPU, with dimension `dim` moved first and made
/// contiguous, as the [rows, K] matrix the plans take.
at::Tensor a_rows(const char* op, const at::Tensor& a, int64_t& dim, Runtime& rt, const char* dim_arg) {
  check_device(op, "A", a, rt);
  to_weft(a.scalar_type(), op, "A", true);
  TORCH_CHECK_VALUE(a.dim() >= 2, "weft.", op, ": argument 'A' must have at least 2 dimensions, got shape ", shape_of(a));
  const int64_t nd = a.dim();
  TORCH_CHECK_VALUE(dim >= -nd && dim < nd - 1 && dim != -1, "weft.", op, ": argument '", dim_arg,
                    "' must name a dimension of A other than the last (K), got ", dim, " for shape ", shape_of(a));
  if (dim < 0) dim += nd;
  const int64_t k = a.size(-1);
  TORCH_CHECK_VALUE(k > 0 && k % 8 == 0, "weft.", op,
                    ": argument 'A' must have its last dimension (K) a positive multiple of 8, got shape ", shape_of(a));
  return dim == 0 ? a.contiguous() : a.movedim(dim, 0).contiguous();
}

/// out_moved [rows..., N] (dimension 0 the moved one) back into A's order.
at::Tensor restore(const at::Tensor& moved, int64_t dim) {
  return dim == 0 ? moved : moved.movedim(0, dim).contiguous();
}

std::tuple<std::optional<at::Tensor>, std::vector<at::Tensor>> fused_all_gather_matmul(
    const at::Tensor& A, at::TensorList Bs, int64_t gather_dim, c10::string_view group_name, bool return_A) {
  const char* op = "fused_all_gather_matmul";
  return guarded(op, [&] {
    Runtime& rt = runtime(op);
    check_group(op, group_name, rt);
    TORCH_CHECK_VALUE(!Bs.empty(), "weft.", op, ": argument 'Bs' must hold at least one matrix");
    int64_t dim = gather_dim;
    at::Tensor a = a_rows(op, A, dim, rt, "gather_dim");
    const int world = rt.ctx().world_size();
    const int64_t k = a.size(-1), rows = a.numel() / k;
    for (size_t i = 1; i < Bs.size(); ++i) check_b(op, "Bs", Bs[i], k, rt);
    const BOperand b0 = b_operand(op, "Bs", Bs[0], k, rt);
    c10::cuda::CUDAGuard guard(rt.device());
    cudaStream_t stream = current_stream(rt);
    at::DimVector gathered_sizes(a.sizes());
    gathered_sizes[0] *= world;
    std::vector<at::Tensor> outs;
    at::Tensor gathered;
    if (rows == 0) {
      gathered = at::empty(gathered_sizes, a.options());
      for (const auto& b : Bs) outs.push_back(at::matmul(gathered, b));
    } else {
      const int64_t n0 = Bs[0].size(1);
      const PlanKey key = PlanKey::make<PlanKind::ag_gemm>(rows * world, n0, k);
      auto& plan = static_cast<Plan<weft::AgGemm>&>(rt.plan(op, key, stream, [&] {
        auto p = std::make_unique<Plan<weft::AgGemm>>();
        p->op = std::make_unique<weft::AgGemm>(
            rt.ctx_ptr(),
            weft::AgGemmOptions{.m = rows * world, .n = n0, .k = k, .b_layout = weft::BLayout::nk});
        return p;
      }));
      auto c0 = new_output({rows * world, n0}, a);
      plan.op->run(a.data_ptr(), b0.ptr, c0.data_ptr(), stream);
      // The plan's gathered A, valid on this stream until its next run: the other B's read it now
      // (torch.mm, cuBLAS: only the first B overlaps with the gather).
      auto view = at::from_blob(const_cast<void*>(plan.op->gathered()), {rows * world, k}, a.options());
      outs.push_back(c0);
      for (size_t i = 1; i < Bs.size(); ++i) outs.push_back(at::mm(view, Bs[i]));
      if (return_A) gathered = view.clone();
    }
    std::vector<at::Tensor> results;
    for (auto& c : outs) {
      auto sizes = gathered_sizes;
      sizes.back() = c.size(-1);
      results.push_back(restore(c.view(sizes), dim));
    }
    std::optional<at::Tensor> a_out;
    if (return_A) a_out = restore(gathered.view(gathered_sizes), dim);
    return std::make_tuple(a_out, results);
  });
}

at::Tensor fused_matmul_reduce_scatter(const at::Tensor& A, const at::Tensor& B, c10::string_view reduce_op,
                                       int64_t scatter_dim, c10::string_view group_name) {
  const char* op = "fused_matmul_reduce_scatter";
  return guarded(op, [&] {
    Runtime& rt = runtime(op);
    check_sum(op, reduce_op);
    check_group(op, group_name, rt);
    int64_t dim = scatter_dim;
    at::Tensor a = a_rows(op, A, dim, rt, "scatter_dim");
    const int world = rt.ctx().world_size();
    TORCH_CHECK_VALUE(a.size(0) % world == 0, "weft.", op, ": A's dimension ", dim, " (", a.size(0),
                      ") must be divisible by the world size (", world, "), got shape ", shape_of(A));
    const int64_t k = a.size(-1), m = a.numel() / k;
    BOperand b = b_operand(op, "B", B, k, rt);
    const int64_t n = B.size(1);
    at::DimVector out_sizes(a.sizes());
    out_sizes[0] /= world;
    out_sizes.back() = n;
    auto out = new_output(out_sizes, a);
    if (m > 0) {
      c10::cuda::CUDAGuard guard(rt.device());
      cudaStream_t stream = current_stream(rt);
      const PlanKey key = PlanKey::make<PlanKind::gemm_rs>(m, n, k);
      auto& plan = static_cast<Plan<weft::GemmRs>&>(rt.plan(op, key, stream, [&] {
        auto p = std::make_unique<Plan<weft::GemmRs>>();
        p->op = std::make_unique<weft::GemmRs>(
            rt.ctx_ptr(), weft::GemmRsOptions{.m = m, .n = n, .k = k, .b_layout = weft::BLayout::nk});
        return p;
      }));
      plan.op->run(a.data_ptr(), b.ptr, out.data_ptr(), stream);
    }
    return restore(out, dim);
  });
}

at::Tensor matmul_all_reduce(const at::Tensor& A, const at::Tensor& B, c10::string_view reduce_op,
                             c10::string_view group_name) {
  const char* op = "matmul_all_reduce";
  return guarded(op, [&] {
    Runtime& rt = runtime(op);
    check_sum(op, reduce_op);
    check_group(op, group_name, rt);
    int64_t dim = 0;
    at::Tensor a = a_rows(op, A, dim, rt, "A");
    const int world = rt.ctx().world_size();
    const int64_t k = a.size(-1), m = a.numel() / k;
    TORCH_CHECK_VALUE(m % world == 0, "weft.", op, ": A's rows (the product of its leading dimensions, ", m,
                      ") must be divisible by the world size (", world, "), got shape ", shape_of(A));
    BOperand b = b_operand(op, "B", B, k, rt);
    const int64_t n = B.size(1);
    at::DimVector out_sizes(A.sizes());
    out_sizes.back() = n;
    if (m == 0) return new_output(out_sizes, a);
    c10::cuda::CUDAGuard guard(rt.device());
    cudaStream_t stream = current_stream(rt);
    const PlanKey key = PlanKey::make<PlanKind::gemm_ar>(m, n, k);
    auto& plan = static_cast<Plan<weft::GemmAr>&>(rt.plan(op, key, stream, [&] {
      auto p = std::make_unique<Plan<weft::GemmAr>>();
      p->op = std::make_unique<weft::GemmAr>(
          rt.ctx_ptr(), weft::GemmArOptions{.m = m, .n = n, .k = k, .b_layout = weft::BLayout::nk});
      // Peers write their blocks of the sum into `out`: it lives in the heap.
      p->staging = weft::SymmetricBuffer(rt.ctx().heap(), static_cast<std::uint64_t>(m * n) * 2, "bf16",
                                         "weft.matmul_all_reduce output");
      return p;
    }));
    plan.op->run(a.data_ptr(), b.ptr, plan.staging.get(), stream);
    auto out = new_output({m, n}, a);
    copy(out.data_ptr(), plan.staging.get(), out.nbytes(), stream);
    return out.view(out_sizes);
  });
}

// ---- CPU kernels: weft runs on CUDA tensors only -----------------------------

at::Tensor all_reduce_cpu(const at::Tensor&, c10::string_view, c10::string_view) { refuse_cpu("all_reduce", "input"); }
at::Tensor& all_reduce__cpu(at::Tensor&, c10::string_view, c10::string_view) { refuse_cpu("all_reduce_", "input"); }
at::Tensor all_gather_cpu(const at::Tensor&, int64_t, c10::string_view) {
  refuse_cpu("all_gather_into_tensor", "input");
}
at::Tensor& all_gather_out_cpu(const at::Tensor&, int64_t, c10::string_view, at::Tensor&) {
  refuse_cpu("all_gather_into_tensor_out", "input");
}
at::Tensor reduce_scatter_cpu(const at::Tensor&, c10::string_view, int64_t, c10::string_view) {
  refuse_cpu("reduce_scatter_tensor", "input");
}
std::tuple<std::optional<at::Tensor>, std::vector<at::Tensor>> ag_mm_cpu(const at::Tensor&, at::TensorList, int64_t,
                                                                         c10::string_view, bool) {
  refuse_cpu("fused_all_gather_matmul", "A");
}
at::Tensor mm_rs_cpu(const at::Tensor&, const at::Tensor&, c10::string_view, int64_t, c10::string_view) {
  refuse_cpu("fused_matmul_reduce_scatter", "A");
}
at::Tensor mm_ar_cpu(const at::Tensor&, const at::Tensor&, c10::string_view, c10::string_view) {
  refuse_cpu("matmul_all_reduce", "A");
}

// ---- functionalization of the two ops that write their argument ----
// torch.compile and AOTAutograd trace programs as pure functions. The
// automatic functionalization of custom ops refuses an op whose return
// aliases an argument (the schemas of all_reduce_ and all_gather_into_tensor_out,
// which repeat _c10d_functional's), so these kernels say what the op is as a
// function: the out-of-place op, whose result then replaces the written
// tensor's value (ATen's own in-place ops are functionalized the same way).

at::Tensor& functional_update(at::Tensor& written, const at::Tensor& value) {
  at::functionalization::impl::replace_(written, value);
  at::functionalization::impl::commit_update(written);
  at::functionalization::impl::sync(written);
  return written;
}

at::Tensor& all_reduce__functionalize(at::Tensor& input, c10::string_view reduce_op, c10::string_view group_name) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("weft::all_reduce", "")
                       .typed<at::Tensor(const at::Tensor&, c10::string_view, c10::string_view)>();
  TORCH_CHECK(at::functionalization::impl::isFunctionalTensor(input),
              "weft.all_reduce_: functionalization reached a tensor that is not functional");
  at::functionalization::impl::sync(input);
  const at::Tensor plain = at::functionalization::impl::from_functional_tensor(input);
  at::Tensor reduced;
  {
    at::AutoDispatchSkipFunctionalize skip;
    reduced = op.call(plain, reduce_op, group_name);
  }
  return functional_update(input, reduced);
}

at::Tensor& all_gather_out_functionalize(const at::Tensor& input, int64_t group_size, c10::string_view group_name,
                                         at::Tensor& out) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("weft::all_gather_into_tensor", "")
                       .typed<at::Tensor(const at::Tensor&, int64_t, c10::string_view)>();
  TORCH_CHECK(at::functionalization::impl::isFunctionalTensor(out),
              "weft.all_gather_into_tensor_out: functionalization reached an output that is not functional");
  at::Tensor plain_input = input;
  if (at::functionalization::impl::isFunctionalTensor(input)) {
    at::functionalization::impl::sync(input);
    plain_input = at::functionalization::impl::from_functional_tensor(input);
  }
  at::Tensor gathered;
  {
    at::AutoDispatchSkipFunctionalize skip;
    gathered = op.call(plain_input, group_size, group_name);
  }
  return functional_update(out, gathered);
}

}  // namespace

void enqueue_all_reduces(const at::Tensor& x, const std::string& group_name, std::int64_t calls, bool in_place,
                         bool through_dispatcher) {
  TORCH_CHECK_VALUE(calls >= 0, "weft._C._enqueue_all_reduces: calls must be >= 0, got ", calls);
  at::Tensor input = x;
  if (!through_dispatcher) {
    for (std::int64_t i = 0; i < calls; ++i) {
      if (in_place) all_reduce_(input, "sum", group_name);
      else all_reduce(input, "sum", group_name);
    }
    return;
  }
  static auto out_of_place = c10::Dispatcher::singleton()
                                 .findSchemaOrThrow("weft::all_reduce", "")
                                 .typed<at::Tensor(const at::Tensor&, c10::string_view, c10::string_view)>();
  static auto inplace = c10::Dispatcher::singleton()
                            .findSchemaOrThrow("weft::all_reduce_", "")
                            .typed<at::Tensor&(at::Tensor&, c10::string_view, c10::string_view)>();
  for (std::int64_t i = 0; i < calls; ++i) {
    if (in_place) inplace.call(input, "sum", group_name);
    else out_of_place.call(input, "sum", group_name);
  }
}

}  // namespace weft_torch

TORCH_LIBRARY_IMPL(weft, Functionalize, m) {
  using namespace weft_torch;
  m.impl("all_reduce_", &all_reduce__functionalize);
  m.impl("all_gather_into_tensor_out", &all_gather_out_functionalize);
}

TORCH_LIBRARY(weft, m) {
  m.def("all_reduce(Tensor input, str reduce_op, str group_name) -> Tensor");
  m.def("all_reduce_(Tensor(a!) input, str reduce_op, str group_name) -> Tensor(a!)");
  m.def("all_gather_into_tensor(Tensor input, int group_size, str group_name) -> Tensor");
  m.def("all_gather_into_tensor_out(Tensor input, int group_size, str group_name, *, Tensor(a!) out) -> Tensor(a!)");
  m.def("reduce_scatter_tensor(Tensor input, str reduce_op, int group_size, str group_name) -> Tensor");
  m.def("fused_all_gather_matmul(Tensor A, Tensor[] Bs, int gather_dim, str group_name, *, bool return_A=True) "
        "-> (Tensor?, Tensor[])");
  m.def("fused_matmul_reduce_scatter(Tensor A, Tensor B, str reduce_op, int scatter_dim, str group_name) -> Tensor");
  m.def("matmul_all_reduce(Tensor A, Tensor B, str reduce_op, str group_name) -> Tensor");
}

TORCH_LIBRARY_IMPL(weft, CUDA, m) {
  using namespace weft_torch;
  m.impl("all_reduce", &all_reduce);
  m.impl("all_reduce_", &all_reduce_);
  m.impl("all_gather_into_tensor", &all_gather_into_tensor);
  m.impl("all_gather_into_tensor_out", &all_gather_into_tensor_out);
  m.impl("reduce_scatter_tensor", &reduce_scatter_tensor);
  m.impl("fused_all_gather_matmul", &fused_all_gather_matmul);
  m.impl("fused_matmul_reduce_scatter", &fused_matmul_reduce_scatter);
  m.impl("matmul_all_reduce", &matmul_all_reduce);
}

TORCH_LIBRARY_IMPL(weft, CPU, m) {
  using namespace weft_torch;
  m.impl("all_reduce", &all_reduce_cpu);
  m.impl("all_reduce_", &all_reduce__cpu);
  m.impl("all_gather_into_tensor", &all_gather_cpu);
  m.impl("all_gather_into_tensor_out", &all_gather_out_cpu);
  m.impl("reduce_scatter_tensor", &reduce_scatter_cpu);
  m.impl("fused_all_gather_matmul", &ag_mm_cpu);
  m.impl("fused_matmul_reduce_scatter", &mm_rs_cpu);
  m.impl("matmul_all_reduce", &mm_ar_cpu);
}
