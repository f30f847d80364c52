// The Autograd kernel of every torch.ops.weft op. weft's ops have no backward
// (docs/PYTHON.md): an input that needs a gradient while grad mode is on is
// refused here, naming the op and the argument, instead of running and leaving
// an output whose backward only warns. Otherwise the call goes straight to the
// kernels below autograd.
//
// Why an explicit kernel: without one, every call goes through PyTorch's
// generic autograd fallback, which walks the schema's arguments and returns
// for aliasing and history; on an op that returns a new tensor that cost
// about 1.8 us of host time on the GPU machines, as much as the output's
// allocation (tools/torch_dispatch_probe.py, "new tensor" against "new tensor,
// Autograd kernel"; docs/PERF.md, "PyTorch package").
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <string>

namespace weft_torch {
namespace {

bool needs_grad(const c10::IValue& v) {
  if (v.isTensor()) return v.toTensor().requires_grad();
  if (v.isTensorList())
    for (const at::Tensor& t : v.toTensorList())
      if (t.requires_grad()) return true;
  return false;
}

void no_backward(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  if (at::GradMode::is_enabled()) {
    const auto& arguments = op.schema().arguments();
    const std::size_t first = stack->size() - arguments.size();
    for (std::size_t i = 0; i < arguments.size(); ++i)
      TORCH_CHECK(!needs_grad((*stack)[first + i]), "weft.", op.schema().operator_name().name.substr(6),
                  ": argument '", arguments[i].name(), "' requires grad, and weft's ops have no backward: call ",
                  "them under torch.no_grad() or torch.inference_mode(), or pass a tensor that does not require ",
                  "grad (.detach())");
  }
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
}

}  // namespace
}  // namespace weft_torch

TORCH_LIBRARY_IMPL(weft, Autograd, m) {
  for (const char* op : {"all_reduce", "all_reduce_", "all_gather_into_tensor", "all_gather_into_tensor_out",
                         "reduce_scatter_tensor", "fused_all_gather_matmul", "fused_matmul_reduce_scatter",
                         "matmul_all_reduce", "flash_decode", "dist_flash_decode", "ag_moe", "moe_rs"})
    m.impl(op, torch::CppFunction::makeFromBoxedFunction<&weft_torch::no_backward>());
}
