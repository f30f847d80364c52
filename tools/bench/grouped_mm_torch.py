#!/usr/bin/env python3
"""torch._grouped_mm on weft-bench grouped_gemm's shapes and counts, one GPU.

    python3 tools/bench/grouped_mm_torch.py [--m ROWS --n N --k K --experts E] [--routing uniform|zipf|one-hot|zipf-reversed]
                                            [--layout nk|kn] [--dtype bf16|fp16] [--samples N] [--warmup N] [--json]

Prints the columns weft-bench grouped_gemm prints, so the two go in one table:
us per call (CUDA events; the median of samples of 5 back-to-back calls,
warm-up samples excluded), TFLOP/s = 2 x rows x N x K / time, and one dense
torch.mm [rows, K] x [K, N] of the same FLOPs timed in turn with it. The rows
per expert are weft-bench's (tools/bench/routing.cpp): deterministic, computed
the same way in tools/bench/routing.py, so both time the same problem. W is [E, N, K] (nk, passed
as its transpose, a view) or [E, K, N] (kn); offs are the experts' end rows.
Without --m, issue 33's three shapes, each with its own E.
"""
import argparse
import json
import statistics

import torch

from routing import routing_counts  # tools/bench/routing.py, beside this script

DEFAULT_CASES = [(16384, 7168, 4096, 8), (65536, 768, 2048, 128), (32768, 2048, 7168, 32)]


def time_us(fns, calls, samples, warmup):
    """Median us per call of each fn, sampled in turn (one sample of each per round)."""
    times = [[] for _ in fns]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for rnd in range(warmup + samples):
        for i, fn in enumerate(fns):
            torch.cuda.synchronize()
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            if rnd >= warmup:
                times[i].append(start.elapsed_time(end) * 1000.0 / calls)
    return [statistics.median(t) for t in times]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--m", type=int, help="rows summed over the experts (with --n, --k)")
    p.add_argument("--n", type=int)
    p.add_argument("--k", type=int)
    p.add_argument("--experts", type=int, default=0, help="default: 8 with --m, else each default shape's own")
    p.add_argument("--routing", default="uniform", choices=["uniform", "zipf", "one-hot", "zipf-reversed"])
    p.add_argument("--layout", default="nk", choices=["nk", "kn"])
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    p.add_argument("--samples", type=int, default=15)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if (args.m is None) != (args.n is None) or (args.m is None) != (args.k is None):
        raise SystemExit("--m, --n and --k go together")
    cases = ([(args.m, args.n, args.k, args.experts or 8)] if args.m is not None else
             [(m, n, k, args.experts or e) for (m, n, k, e) in DEFAULT_CASES])
    dt = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    torch.manual_seed(0)
    rows_out = []
    for (rows, n, k, experts) in cases:
        counts = routing_counts(args.routing, rows, experts)
        offs = torch.tensor(counts, device="cuda", dtype=torch.int32).cumsum(0, dtype=torch.int32)
        a = torch.rand(rows, k, device="cuda", dtype=dt).mul_(2).sub_(1)
        if args.layout == "nk":
            w_store = torch.rand(experts, n, k, device="cuda", dtype=dt).mul_(2).sub_(1)
            w = w_store.transpose(-2, -1)  # [E, K, N], a view of [E, N, K]
            dense_b = w_store[0].t()
        else:
            w_store = torch.rand(experts, k, n, device="cuda", dtype=dt).mul_(2).sub_(1)
            w = w_store
            dense_b = w_store[0]
        note = ""

        def grouped():
            return torch._grouped_mm(a, w, offs=offs)

        def dense():
            return torch.mm(a, dense_b)

        try:
            out = grouped()
            # A spot check against a plain matmul of the heaviest expert, so a figure is never of a wrong result.
            e = max(range(experts), key=lambda i: counts[i])
            lo = sum(counts[:e])
            want = (a[lo:lo + counts[e]].float() @ w[e].float())
            err = ((out[lo:lo + counts[e]].float() - want).norm() / want.norm().clamp_min(1e-30)).item()
            torch_us, dense_us = time_us([grouped, dense], 5, args.samples, args.warmup)
        except RuntimeError as ex:  # e.g. a dtype this torch build's grouped kernel does not take
            note = f"torch._grouped_mm failed: {str(ex).splitlines()[0]}"
            err, torch_us = float("nan"), float("nan")
            (dense_us,) = time_us([dense], 5, args.samples, args.warmup)
        flops = 2.0 * rows * n * k
        tf = (lambda us: flops / (us * 1e-6) / 1e12 if us == us else float("nan"))
        rows_out.append(dict(op="grouped_mm_torch", rows=rows, n=n, k=k, experts=experts, routing=args.routing,
                             layout=args.layout, dtype=args.dtype, torch_us=round(torch_us, 2),
                             torch_tflops=round(tf(torch_us), 1), dense_us=round(dense_us, 2),
                             dense_tflops=round(tf(dense_us), 1), vs_dense=round(dense_us / torch_us, 3),
                             most_rows=max(counts), empty_experts=counts.count(0), rel_err=err, note=note))
        del a, w, w_store, dense_b, offs
        torch.cuda.empty_cache()
    if args.json:
        for r in rows_out:
            print(json.dumps(r))
        return
    print(f"torch {torch.__version__} _grouped_mm {args.dtype}, W {'[E, N, K]' if args.layout == 'nk' else '[E, K, N]'}, "
          f"routing {args.routing}; us per call (median of {args.samples} samples of 5 back-to-back calls, grouped "
          "and dense in turn);\nTFLOP/s = 2 x rows x N x K / time; dense = torch.mm [rows, K] x [K, N] of the same "
          "FLOPs; ratio = grouped TFLOP/s / dense TFLOP/s; rel err = the heaviest expert against an fp32 matmul")
    print(f"{'rows':>6} {'N':>6} {'K':>6} {'E':>5} | {'most rows':>9} {'empty':>5} | {'torch us':>9} {'TFLOP/s':>7} | "
          f"{'dense us':>9} {'TFLOP/s':>7} | {'ratio':>6} | rel err")
    for r in rows_out:
        print(f"{r['rows']:>6} {r['n']:>6} {r['k']:>6} {r['experts']:>5} | {r['most_rows']:>9} {r['empty_experts']:>5} | "
              f"{r['torch_us']:>9.1f} {r['torch_tflops']:>7.1f} | {r['dense_us']:>9.1f} {r['dense_tflops']:>7.1f} | "
              f"{r['vs_dense']:>6.3f} | {r['rel_err']:.1e}{'  ' + r['note'] if r['note'] else ''}")


if __name__ == "__main__":
    main()
