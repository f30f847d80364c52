#!/usr/bin/env python3
"""PyTorch baselines for weft's tensor-parallel operators, measured in one run.

(weft's copy of the project's shared reference script, ../shared/tools/torch_baselines.py,
with one change: it imports torch.distributed._symmetric_memory, which is what defines the
symm_mem fused ops, and enables symmetric memory for the group; without that import the
ops are missing and Async-TP reads as n/a.)

Run on a machine with N GPUs and PyTorch:
    torchrun --nproc_per_node=N torch_tp_baselines.py [--shapes M,N,K ...] [--dtype bf16|fp16]

For each shape it prints, for AllGather+GEMM and GEMM+ReduceScatter:
sequential NCCL + cuBLAS, the collective alone, the GEMM alone, PyTorch's
decomposed Async-TP (torch.ops.symm_mem.fused_*), and the ideal max(gemm, comm).
N is the full output width (AG+GEMM) and K the full reduction depth (GEMM+RS).
Times are medians in ms, the max over ranks.
"""
import argparse, json
import torch, torch.distributed as dist
try:  # defines torch.ops.symm_mem.fused_all_gather_matmul / fused_matmul_reduce_scatter
    import torch.distributed._symmetric_memory as symm_mem
except ImportError:
    symm_mem = None

p = argparse.ArgumentParser()
p.add_argument("--shapes", nargs="*", default=["2048,28672,8192", "4096,28672,8192", "8192,28672,8192", "8192,8192,8192"])
p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
p.add_argument("--iters", type=int, default=20)
p.add_argument("--json", action="store_true", help="one JSON object per line instead of text")
args = p.parse_args()
dt = torch.bfloat16 if args.dtype == "bf16" else torch.float16

dist.init_process_group("nccl")
r, W = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(r % torch.cuda.device_count())
gname = dist.group.WORLD.group_name
if symm_mem is not None and hasattr(symm_mem, "enable_symm_mem_for_group"):
    try:
        symm_mem.enable_symm_mem_for_group(gname)
    except Exception:
        pass  # newer PyTorch: enabled by default

def bench(fn):
    for _ in range(5): fn()
    torch.cuda.synchronize(); dist.barrier()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(args.iters):
        dist.barrier(); s.record(); fn(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
    t = torch.tensor([sorted(ts)[len(ts) // 2]], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()

def relerr(x, ref):
    return ((x.float() - ref.float()).norm() / ref.float().norm()).item()

torch.manual_seed(1234 + r)
for spec in args.shapes:
    M, N, K = map(int, spec.split(","))
    # AllGather + GEMM: A row-sharded [M/W, K], B column-sharded [N/W, K]
    a = torch.randn(M // W, K, device="cuda", dtype=dt)
    b = torch.randn(N // W, K, device="cuda", dtype=dt)
    ag = torch.empty(M, K, device="cuda", dtype=dt)
    def seq():
        dist.all_gather_into_tensor(ag, a); return ag @ b.t()
    row = {"op": "ag_gemm", "m": M, "n": N, "k": K, "world": W, "dtype": args.dtype}
    row["seq_ms"] = bench(seq)
    row["comm_ms"] = bench(lambda: dist.all_gather_into_tensor(ag, a))
    row["gemm_ms"] = bench(lambda: ag @ b.t())
    try:
        fused = lambda: torch.ops.symm_mem.fused_all_gather_matmul(a, [b.t()], gather_dim=0, group_name=gname)
        row["asynctp_err"] = relerr(fused()[1][0], seq())
        row["asynctp_ms"] = bench(fused)
    except Exception as ex:  # older or newer PyTorch without the op
        row["asynctp_ms"] = None; row["asynctp_error"] = str(ex)[:120]
    row["ideal_ms"] = max(row["comm_ms"], row["gemm_ms"])
    rows = [row]
    # GEMM + ReduceScatter: A [M, K/W], B [N, K/W], output [M/W, N]
    a2 = torch.randn(M, K // W, device="cuda", dtype=dt)
    b2 = torch.randn(N, K // W, device="cuda", dtype=dt)
    out = torch.empty(M // W, N, device="cuda", dtype=dt)
    def seq2():
        dist.reduce_scatter_tensor(out, a2 @ b2.t()); return out
    c = a2 @ b2.t()
    row2 = {"op": "gemm_rs", "m": M, "n": N, "k": K, "world": W, "dtype": args.dtype}
    row2["seq_ms"] = bench(seq2)
    row2["comm_ms"] = bench(lambda: dist.reduce_scatter_tensor(out, c))
    row2["gemm_ms"] = bench(lambda: a2 @ b2.t())
    try:
        fused2 = lambda: torch.ops.symm_mem.fused_matmul_reduce_scatter(a2, b2.t(), "sum", scatter_dim=0, group_name=gname)
        ref = seq2().clone()
        row2["asynctp_err"] = relerr(fused2(), ref)
        row2["asynctp_ms"] = bench(fused2)
    except Exception as ex:
        row2["asynctp_ms"] = None; row2["asynctp_error"] = str(ex)[:120]
    row2["ideal_ms"] = max(row2["comm_ms"], row2["gemm_ms"])
    rows.append(row2)
    if r == 0:
        for x in rows:
            if args.json:
                print(json.dumps(x))
            else:
                at = "n/a" if x["asynctp_ms"] is None else f"{x['asynctp_ms']:.3f}"
                print(f"{x['op']:8s} M={M} N={N} K={K} W={W}: seq {x['seq_ms']:.3f}  comm {x['comm_ms']:.3f}  "
                      f"gemm {x['gemm_ms']:.3f}  asyncTP {at}  ideal {x['ideal_ms']:.3f}")
dist.destroy_process_group()
