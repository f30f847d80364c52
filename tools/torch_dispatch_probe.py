#!/usr/bin/env python3
"""What a call into weft costs on the host before any GPU work, for each way the
PyTorch ops could bind (docs/decisions/0051).

Each way wraps the same C++ function, which takes a tensor and returns nothing
(so only the call path is timed, on CPU tensors: the dispatcher's cost does not
depend on the device):

  direct C++    the function called in a C++ loop, no dispatcher (the floor)
  C++ dispatch  a TORCH_LIBRARY op called through the dispatcher from C++
  torch.ops     the TORCH_LIBRARY op called from Python (torch.ops.weft_probe.noop)
  stable ABI    the same op written against LibTorch's stable ABI (STABLE_TORCH_LIBRARY,
                boxed through the C shim), called from Python
  pybind        the function bound with pybind11 and called from Python
                (a nanobind/DLPack module without torch.library costs about this)
  Library.impl  torch.library.Library define + a Python kernel calling the pybind function
  custom_op     torch.library.custom_op (Python) calling the pybind function

and, for what an op that returns a new tensor costs over one that returns its
argument, on --device:

  in place      an op that returns its (a!) argument, as all_reduce_ does
  new tensor    an op that returns at::empty_like of its argument
  new tensor, Autograd fallthrough
                the same op with its Autograd kernel a fallthrough, so the
                dispatcher skips the generic autograd fallback (which walks
                every argument and output)
  new tensor, Autograd kernel
                the same op with an explicit Autograd kernel that refuses an
                input needing a gradient and calls the op below autograd
  empty_like    torch.empty_like from Python (ATen's own op that allocates)
  C++ empty_like
                at::empty_like in a C++ loop: the allocation alone

Usage: python3 tools/torch_dispatch_probe.py [--calls N] [--repeats R] [--device cpu|cuda] [--json]
Needs torch and a C++ compiler (the extension is built with load_inline into
torch's extension cache). Prints the median over R repeats of N calls each, in
nanoseconds per call.
"""
import argparse
import functools
import json
import statistics
import sys
import time

SOURCE = r"""
#include <torch/extension.h>
#include <torch/library.h>

static volatile int64_t g_sink = 0;

// The function every way calls: reads what a real op reads before it launches
// (pointer, element count, dtype), and nothing else.
void noop(const at::Tensor& x) { g_sink += reinterpret_cast<intptr_t>(x.data_ptr()) + x.numel() + static_cast<int>(x.scalar_type()); }

at::Tensor& touch_(at::Tensor& x) {
  noop(x);
  return x;
}
at::Tensor fresh(const at::Tensor& x) {
  noop(x);
  return at::empty_like(x);
}

TORCH_LIBRARY(weft_probe, m) {
  m.def("noop(Tensor x) -> ()");
  m.def("touch_(Tensor(a!) x) -> Tensor(a!)");
  m.def("fresh(Tensor x) -> Tensor");
  m.def("fresh_fallthrough(Tensor x) -> Tensor");
  m.def("fresh_checked(Tensor x) -> Tensor");
}

// An explicit Autograd kernel: refuses an input that needs a gradient (no formula), else calls the
// op below autograd - what the generic fallback decides, for one argument instead of all.
at::Tensor fresh_checked_autograd(const at::Tensor& x) {
  TORCH_CHECK(!(at::GradMode::is_enabled() && x.requires_grad()), "weft_probe::fresh_checked has no autograd formula");
  at::AutoDispatchBelowADInplaceOrView below;
  static auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("weft_probe::fresh_checked", "").typed<at::Tensor(const at::Tensor&)>();
  return op.call(x);
}
// The same kernels for CPU and CUDA tensors: none of them touches the data.
void impl_probe(torch::Library& m) {
  m.impl("noop", &noop);
  m.impl("touch_", &touch_);
  m.impl("fresh", &fresh);
  m.impl("fresh_fallthrough", &fresh);
  m.impl("fresh_checked", &fresh);
}
TORCH_LIBRARY_IMPL(weft_probe, CPU, m) { impl_probe(m); }
TORCH_LIBRARY_IMPL(weft_probe, CUDA, m) { impl_probe(m); }
TORCH_LIBRARY_IMPL(weft_probe, Autograd, m) {
  m.impl("fresh_fallthrough", torch::CppFunction::makeFallthrough());
  m.impl("fresh_checked", &fresh_checked_autograd);
}

int64_t loop_direct(const at::Tensor& x, int64_t calls) {
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < calls; ++i) noop(x);
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
}

int64_t loop_dispatch(const at::Tensor& x, int64_t calls) {
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow("weft_probe::noop", "").typed<void(const at::Tensor&)>();
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < calls; ++i) op.call(x);
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
}

int64_t loop_empty_like(const at::Tensor& x, int64_t calls) {
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < calls; ++i) g_sink += reinterpret_cast<intptr_t>(at::empty_like(x).data_ptr());
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("noop", &noop);
  m.def("loop_empty_like", &loop_empty_like);
  m.def("loop_direct", &loop_direct);
  m.def("loop_dispatch", &loop_dispatch);
}
"""

# The stable-ABI op: its own library, no pybind module.
STABLE_SOURCE = r"""
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>

static volatile int64_t g_sink = 0;

void noop(torch::stable::Tensor x) {
  g_sink += reinterpret_cast<intptr_t>(x.data_ptr()) + x.numel() + static_cast<int>(x.scalar_type());
}

STABLE_TORCH_LIBRARY(weft_probe_stable, m) { m.def("noop(Tensor x) -> ()"); }
STABLE_TORCH_LIBRARY_IMPL(weft_probe_stable, CPU, m) { m.impl("noop", TORCH_BOX(&noop)); }
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--device", default="cpu", help="where the out-of-place ops' tensors live: cpu or cuda")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    try:
        import torch
        from torch.utils.cpp_extension import load_inline
    except ImportError as e:
        print(f"torch_dispatch_probe: needs torch ({e})", file=sys.stderr)
        return 2

    ext = load_inline(name="weft_dispatch_probe", cpp_sources=[SOURCE], verbose=False)
    # load_inline puts torch/extension.h first, so TORCH_STABLE_ONLY cannot be
    # set; the op still goes through the stable C shim and its boxed calls.
    load_inline(name="weft_dispatch_probe_stable", cpp_sources=[STABLE_SOURCE], is_python_module=False, verbose=False)

    lib = torch.library.Library("weft_probe_py", "DEF")
    lib.define("noop(Tensor x) -> ()")
    lib.impl("noop", lambda x: ext.noop(x), "CPU")

    @torch.library.custom_op("weft_probe_custom::noop", mutates_args=())
    def custom_noop(x: torch.Tensor) -> None:
        ext.noop(x)

    x = torch.empty(256, dtype=torch.bfloat16)  # 512 bytes
    calls, repeats = args.calls, args.repeats

    def python_loop(fn, arg=x):
        def run():
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                fn(arg)
            return time.perf_counter_ns() - t0
        return run

    ways = {
        "direct C++": lambda: ext.loop_direct(x, calls),
        "C++ dispatch": lambda: ext.loop_dispatch(x, calls),
        "torch.ops": python_loop(torch.ops.weft_probe.noop),
        "stable ABI": python_loop(torch.ops.weft_probe_stable.noop),
        "pybind": python_loop(ext.noop),
        "Library.impl": python_loop(torch.ops.weft_probe_py.noop),
        "custom_op": python_loop(custom_noop),
    }
    dev = torch.empty(256, dtype=torch.bfloat16, device=args.device)
    device_loop = functools.partial(python_loop, arg=dev)

    ways.update({
        f"in place ({args.device})": device_loop(torch.ops.weft_probe.touch_),
        f"new tensor ({args.device})": device_loop(torch.ops.weft_probe.fresh),
        f"new tensor, Autograd fallthrough ({args.device})": device_loop(torch.ops.weft_probe.fresh_fallthrough),
        f"new tensor, Autograd kernel ({args.device})": device_loop(torch.ops.weft_probe.fresh_checked),
        f"empty_like ({args.device})": device_loop(torch.empty_like),
        f"C++ empty_like ({args.device})": lambda: ext.loop_empty_like(dev, calls),
    })
    results = {}
    for name, run in ways.items():
        run()  # warm-up
        samples = sorted(run() / calls for _ in range(repeats))
        results[name] = {"median_ns": statistics.median(samples), "min_ns": samples[0], "max_ns": samples[-1]}

    info = {"torch": torch.__version__, "python": sys.version.split()[0], "calls": calls, "repeats": repeats,
            "device": args.device}
    if args.json:
        print(json.dumps({"info": info, "results": results}))
    else:
        print(f"# torch {info['torch']}, Python {info['python']}: ns per call, median of {repeats} x {calls} calls")
        print("| way | median | min | max |")
        print("|---|---|---|---|")
        for name, r in results.items():
            print(f"| {name} | {r['median_ns']:.0f} | {r['min_ns']:.0f} | {r['max_ns']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
