#!/usr/bin/env python3
"""Host overhead of weft's PyTorch ops, world 1: the host's time from a Python call
of torch.ops.weft.all_reduce on 1 KB bf16 to its kernel's launch, against the C++
AllReduce::run of the same plan (weft-bench all_reduce --enqueue), and the GPU time
of a CUDA graph of one call replayed, from Python and from C++.

    python3 tools/bench/host_overhead.py [--bench build-gpu/weft-bench] [--bytes 1024] [--samples 15]

Method (the same on both sides): the stream is held (a sleeping kernel here,
torch.cuda._sleep, checked to be still asleep when the last call is enqueued;
weft-bench's EnqueueHold there), 100 calls are enqueued behind it, and the
host's wall time over them is divided by 100: no call waits for the GPU, so the
time is the host's alone (dispatcher, argument checks, the plan's lookup, the
launch). The median of --samples samples. GPU times: CUDA events around 100
calls (or graph replays) enqueued behind the hold, so they run back to back.
Both sides use the plan's automatic variant for the size. Goal (issue 31): the
Python call costs at most 5 us more than AllReduce::run; a graph's replay takes
the same GPU time from either.

Exit status: 0 measured (whether or not the goal is met; the last line says),
1 a runtime failure (no GPU, weft-bench failed).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

GOAL_US = 5.0
CALLS = 100  # per sample, as weft-bench --enqueue: far below CUDA's launch queue depth


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="host_overhead.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--bench", default=None,
                   help="weft-bench to run for the C++ figures (default: $WEFT_BUILD_DIR/weft-bench, build-gpu/, build/)")
    p.add_argument("--no-cpp", action="store_true", help="leave out the C++ figures")
    p.add_argument("--bytes", type=int, default=1024, help="message size in bytes, bf16 (default 1024)")
    p.add_argument("--samples", type=int, default=15, help="timed samples, the median reported (default 15)")
    p.add_argument("--warmup", type=int, default=3, help="untimed samples first (default 3)")
    p.add_argument("--json", action="store_true", help="also print the figures as one JSON line")
    return p


def find_bench(arg: Optional[str]) -> Optional[Path]:
    root = Path(__file__).resolve().parents[2]
    candidates = [arg] if arg else [os.path.join(os.environ.get("WEFT_BUILD_DIR", "build-gpu"), "weft-bench"),
                                    "build-gpu/weft-bench", "build/weft-bench"]
    for c in candidates:
        for path in (Path(c), root / c):
            if path.is_file() and os.access(path, os.X_OK):
                return path
    return None


def cpp_figures(bench: Path, nbytes: int, samples: int, warmup: int) -> dict:
    """weft-bench all_reduce --enqueue at world 1 (its own process, before this one starts weft)."""
    cmd = [str(bench), "all_reduce", "--bytes", str(nbytes), "--variant", "auto", "--dtype", "bf16", "--enqueue",
           "--json", "--samples", str(samples), "--warmup", str(warmup)]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("WEFT_RANK") and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "WEFT_WORLD_SIZE")}
    print("$ " + " ".join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"weft-bench exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    for line in r.stdout.splitlines():
        if line.startswith("{") and '"mode":"enqueue"' in line:
            return json.loads(line)
    raise RuntimeError(f"weft-bench printed no enqueue line:\n{r.stdout}\n{r.stderr}")


class Hold:
    """Holds the current stream with torch.cuda._sleep long enough for a sample to be enqueued behind it."""

    def __init__(self, torch):
        self.torch = torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(20_000_000)
        end.record()
        end.synchronize()
        self.cycles_per_ms = 20_000_000 / max(start.elapsed_time(end), 1e-3)
        self.ms = 20.0  # doubled whenever a sample outlasts it

    def sample(self, enqueue: Callable[[], None], batched: bool = False) -> Optional[float]:
        """Host microseconds per call of enqueue() (CALLS calls; one call that enqueues CALLS if batched)
        behind the hold; None if the hold ran out first."""
        torch = self.torch
        torch.cuda.synchronize()
        torch.cuda._sleep(int(self.ms * self.cycles_per_ms))
        asleep = torch.cuda.Event()
        asleep.record()
        t0 = time.perf_counter_ns()
        if batched:
            enqueue()
        else:
            for _ in range(CALLS):
                enqueue()
        t1 = time.perf_counter_ns()
        held = not asleep.query()
        torch.cuda.synchronize()
        if not held:
            self.ms *= 2
            return None
        return (t1 - t0) / 1e3 / CALLS

    def gpu_sample(self, enqueue: Callable[[], None], start, end) -> Optional[float]:
        """GPU microseconds per call: CUDA events around CALLS calls enqueued behind the hold (back to back);
        None if the hold ran out first."""
        torch = self.torch
        torch.cuda.synchronize()
        torch.cuda._sleep(int(self.ms * self.cycles_per_ms))
        start.record()
        for _ in range(CALLS):
            enqueue()
        end.record()
        held = not start.query()  # still asleep: the calls will run back to back
        end.synchronize()
        if not held:
            self.ms *= 2
            return None
        return 1000.0 * start.elapsed_time(end) / CALLS

    @staticmethod
    def median(sample: Callable[[], Optional[float]], samples: int, warmup: int) -> float:
        """The median of `samples` samples after `warmup`, retrying those the hold did not cover."""
        us = []
        tries = 4 * (warmup + samples)
        while len(us) < warmup + samples:
            if tries == 0:
                raise RuntimeError("the GPU hold kept running out before the calls were enqueued")
            tries -= 1
            s = sample()
            if s is not None:
                us.append(s)
        return statistics.median(us[warmup:])

    def host_us(self, enqueue: Callable[[], None], samples: int, warmup: int, batched: bool = False) -> float:
        return self.median(lambda: self.sample(enqueue, batched), samples, warmup)

    def gpu_us(self, enqueue: Callable[[], None], samples: int, warmup: int) -> float:
        torch = self.torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        return self.median(lambda: self.gpu_sample(enqueue, start, end), samples, warmup)


def python_figures(nbytes: int, samples: int, warmup: int) -> dict:
    import torch

    import weft

    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA GPU visible: host_overhead.py measures on one GPU")
    weft.init(heap_size="256M")  # a job of one: no launcher, no process group
    g = weft.group_name()
    ops = torch.ops.weft
    x = torch.randn(nbytes // 2, device="cuda").to(torch.bfloat16)
    for _ in range(3):  # builds the plan (the first call), then warm
        ops.all_reduce(x, "sum", g)
        ops.all_reduce_(x, "sum", g)
    torch.cuda.synchronize()
    hold = Hold(torch)
    # The calls as a user writes them (torch.ops.weft.X(...)), bound by functools.partial: no Python frame of ours.
    out_of_place = functools.partial(ops.all_reduce, x, "sum", g)
    in_place = functools.partial(ops.all_reduce_, x, "sum", g)
    out = {
        "all_reduce_host_us": hold.host_us(out_of_place, samples, warmup),
        "all_reduce__host_us": hold.host_us(in_place, samples, warmup),
        "all_reduce_device_us": hold.gpu_us(out_of_place, samples, warmup),
        "all_reduce__device_us": hold.gpu_us(in_place, samples, warmup),
        # The overload named: what torch.compile's graphs call, without the packet's overload resolution.
        "all_reduce__default_host_us": hold.host_us(functools.partial(ops.all_reduce_.default, x, "sum", g),
                                                    samples, warmup),
        # An ATen op of the same size, for scale: the dispatcher and a kernel launch, nothing of weft's.
        "aten_add__host_us": hold.host_us(functools.partial(x.add_, 1), samples, warmup),
        # Its out-of-place form, beside weft's: the output's allocation and Python object, nothing of weft's.
        "aten_add_host_us": hold.host_us(functools.partial(torch.add, x, 1), samples, warmup),
    }
    # The same calls from C++ (weft._C._enqueue_all_reduces, CALLS per Python call): through the dispatcher's
    # typed call, and to the op's CUDA kernel function directly. Python's call less the dispatcher's is
    # Python's (the op packet, argument parsing, the result's Python object); the dispatcher's less the
    # body's is the dispatcher's (the autograd and CUDA kernels' dispatch); the body less AllReduce::run is
    # weft's glue (argument checks, the plan's lookup) and, out of place, the output's allocation.
    for in_place_, tag in ((False, "all_reduce"), (True, "all_reduce_")):
        for dispatcher, where in ((True, "dispatcher"), (False, "body")):
            out[f"{tag}_{where}_host_us"] = hold.host_us(
                functools.partial(weft._C._enqueue_all_reduces, x, g, CALLS, in_place_, dispatcher),
                samples, warmup, batched=True)
    for name, call in (("all_reduce", out_of_place), ("all_reduce_", in_place)):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            call()
        graph.replay()
        torch.cuda.synchronize()
        out[f"{name}_graph_replay_host_us"] = hold.host_us(graph.replay, samples, warmup)
        out[f"{name}_graph_replay_device_us"] = hold.gpu_us(graph.replay, samples, warmup)
    out["plans"] = weft.info()["plans"]
    del graph  # the last one; each earlier one went when the next replaced it
    weft.shutdown()
    return out


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    if a.bytes <= 0 or a.bytes % 2:
        print("host_overhead.py: --bytes must be a positive, even number (bf16 elements)", file=sys.stderr)
        return 2
    cpp = None
    if not a.no_cpp:
        bench = find_bench(a.bench)
        if bench is None:
            print("host_overhead.py: no weft-bench found (give --bench PATH, or build it: bash scripts/build.sh); "
                  "the C++ figures are left out", flush=True)
        else:
            try:
                cpp = cpp_figures(bench, a.bytes, a.samples, a.warmup)
            except (RuntimeError, subprocess.TimeoutExpired) as e:  # e.g. a weft-bench built before --enqueue
                print(f"host_overhead.py: the C++ figures are left out: {e}", flush=True)
        if cpp:
            print(f"C++ ({cpp['variant']}): run {cpp['run_host_us']:.2f} us host, {cpp['run_device_us']:.2f} us GPU; "
                  f"graph launch {cpp['graph_launch_host_us']:.2f} us host, replay {cpp['graph_replay_device_us']:.2f} "
                  "us GPU", flush=True)
    py = python_figures(a.bytes, a.samples, a.warmup)

    def f(v):
        return f"{v:8.2f}" if v is not None and v >= 0 else f"{'-':>8}"

    c = cpp or {}
    print(f"\nhost overhead, world 1: all_reduce of {a.bytes} bytes bf16 (the plan's automatic variant"
          f"{', ' + c['variant'] if cpp else ''}); us per call, median of {a.samples} samples of {CALLS} calls "
          f"enqueued behind a held stream")
    print(f"{'':44} {'host':>8} {'GPU':>8}")
    print(f"{'C++ AllReduce::run':44} {f(c.get('run_host_us'))} {f(c.get('run_device_us'))}")
    print(f"{'torch.ops.weft.all_reduce (out of place)':44} {f(py['all_reduce_host_us'])} "
          f"{f(py['all_reduce_device_us'])}")
    print(f"{'torch.ops.weft.all_reduce_ (in place)':44} {f(py['all_reduce__host_us'])} "
          f"{f(py['all_reduce__device_us'])}")
    print(f"{'torch.ops.weft.all_reduce_.default':44} {f(py.get('all_reduce__default_host_us'))}")
    for tag, form in (("all_reduce", "out of place"), ("all_reduce_", "in place")):
        print(f"{'  ' + form + ', from C++ through the dispatcher':44} {f(py.get(tag + '_dispatcher_host_us'))}")
        print(f"{'  ' + form + ', from C++, the op body alone':44} {f(py.get(tag + '_body_host_us'))}")
    print(f"{'x.add_(1), an ATen op (for scale)':44} {f(py.get('aten_add__host_us'))}")
    print(f"{'torch.add(x, 1), out of place (for scale)':44} {f(py.get('aten_add_host_us'))}")
    print(f"{'CUDA graph of one call: C++ cudaGraphLaunch':44} {f(c.get('graph_launch_host_us'))} "
          f"{f(c.get('graph_replay_device_us'))}")
    print(f"{'CUDA graph of one all_reduce: replay()':44} {f(py['all_reduce_graph_replay_host_us'])} "
          f"{f(py['all_reduce_graph_replay_device_us'])}")
    print(f"{'CUDA graph of one all_reduce_: replay()':44} {f(py['all_reduce__graph_replay_host_us'])} "
          f"{f(py['all_reduce__graph_replay_device_us'])}")
    if c.get("nccl_host_us", -1) >= 0:
        print(f"{'NCCL ncclAllReduce (for scale)':44} {f(c['nccl_host_us'])} {f(None)}")
    summary = {"bytes": a.bytes, "python": py, "cpp": cpp}
    if cpp:
        diff = py["all_reduce_host_us"] - cpp["run_host_us"]
        diff_ = py["all_reduce__host_us"] - cpp["run_host_us"]
        ratio = py["all_reduce_graph_replay_device_us"] / cpp["graph_replay_device_us"]
        summary.update(diff_us=diff, diff_inplace_us=diff_, graph_replay_ratio=ratio)
        print(f"\ndifference, Python - C++: all_reduce {diff:+.2f} us, all_reduce_ {diff_:+.2f} us (goal: at most "
              f"+{GOAL_US:.0f} us: {'met' if diff <= GOAL_US else 'NOT met'})")
        print(f"graph replay, GPU time Python / C++: {ratio:.3f} (goal: equal)")
        for tag in ("all_reduce", "all_reduce_"):
            py_us, disp, body = (py.get(tag + k) for k in ("_host_us", "_dispatcher_host_us", "_body_host_us"))
            if disp is not None and body is not None:
                noisy = " (the body alone timed above the call through the dispatcher, which runs it: " \
                        "the split is within this host's noise)" if body > disp else ""
                print(f"{tag}'s difference split: Python binding {py_us - disp:+.2f} us, dispatcher "
                      f"{disp - body:+.2f} us, weft's op body beyond AllReduce::run {body - cpp['run_host_us']:+.2f} us"
                      + noisy)
        line = (f"host_overhead: Python {py['all_reduce_host_us']:.2f} us, C++ {cpp['run_host_us']:.2f} us, "
                f"difference {diff:+.2f} us (goal <= {GOAL_US:.0f}: {'met' if diff <= GOAL_US else 'NOT met'}); "
                f"graph replay GPU {py['all_reduce_graph_replay_device_us']:.2f} vs {cpp['graph_replay_device_us']:.2f} us")
    else:
        line = (f"host_overhead: Python {py['all_reduce_host_us']:.2f} us per call, graph replay GPU "
                f"{py['all_reduce_graph_replay_device_us']:.2f} us (no C++ figures)")
    if a.json:
        print(json.dumps(summary))
    print(line, flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"host_overhead.py: {e}", file=sys.stderr)
        sys.exit(1)
