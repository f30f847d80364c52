#!/usr/bin/env python3
"""PyTorch's symmetric-memory one-shot all-reduce, timed the way weft-bench times.

    torchrun --nproc_per_node=N tools/torch_symm_mem_bench.py --bytes 1K:1M [--dtype bf16]
             [--samples 25] [--warmup 3] [--out FILE]

For each size (bytes per rank): a symmetric buffer (symm_mem.empty + rendezvous)
of random values; torch.ops.symm_mem.one_shot_all_reduce(t, "sum", group) is
checked once against dist.all_reduce on a clone (relative error), then timed
with CUDA events as tools/bench/timing.cpp does: before every sample
dist.barrier() and torch.cuda.synchronize(); "loop" = clamp(64 MiB / bytes, 2,
100) calls back to back per sample, "single" = one call per sample; warm-up
samples excluded, median over samples on each rank, maximum over ranks.
Differences from weft-bench: the ranks are aligned by a host barrier, not a
device barrier kernel, and every call goes through Python and the dispatcher.

Rank 0 prints one JSON line per size (and writes them to --out):
  {"op":"all_reduce","impl":"torch_symm_mem_one_shot","world":2,"dtype":"bf16",
   "bytes":1024,"loop_us":..,"single_us":..,"relerr":..,"check":"ok"}
which scripts/sweep_collectives.py --torch-json FILE plots against weft.
Where this torch has no symmetric memory or no one-shot op, it says why and
exits 0, leaving --out empty. Exit 1 if a check fails.
"""
import argparse
import json
import os
import re
import statistics
import sys

# NVLink multicast stays off (as in weft), before torch is imported.
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

DTYPES = {"bf16": ("bfloat16", 2, 1e-2), "fp16": ("float16", 2, 1e-2), "fp32": ("float32", 4, 1e-5)}


def parse_size(text):
    """'4096', '64K', '256M', '1G' (powers of 1024), as weft-bench reads them."""
    m = re.fullmatch(r"(\d+)([KMGT]?)(I?B)?", text.strip().upper())
    if not m:
        raise argparse.ArgumentTypeError(f"cannot read size '{text}': expected e.g. 4096, 64K, 256M, 1G")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}[m.group(2)]


def parse_sizes(text):
    """'1K,64K' or a power-of-two range '1K:1M' (or both, comma-separated)."""
    sizes = set()
    for item in filter(None, text.split(",")):
        if ":" not in item:
            sizes.add(parse_size(item))
            continue
        lo, hi = (parse_size(x) for x in item.split(":", 1))
        if lo <= 0 or hi < lo or lo & (lo - 1) or hi & (hi - 1):
            raise argparse.ArgumentTypeError(f"range '{item}' must run between powers of two, low to high")
        while lo <= hi:
            sizes.add(lo)
            lo *= 2
    if not sizes or min(sizes) <= 0:
        raise argparse.ArgumentTypeError("--bytes needs positive sizes, e.g. 1K,64K or 1K:1M")
    return sorted(sizes)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="Launch with: torchrun --nproc_per_node=N " + sys.argv[0] + " ...")
    ap.add_argument("--bytes", type=parse_sizes, default=parse_sizes("1K:1M"),
                    help="per-rank sizes: 1K,64K or a power-of-two range 1K:1M (default 1K:1M)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="element type (default bf16)")
    ap.add_argument("--samples", type=int, default=25, help="timed samples per point, median reported (default 25)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed samples first (default 3)")
    ap.add_argument("--out", metavar="FILE", help="also write the JSON lines here (rank 0)")
    args = ap.parse_args()
    if args.samples < 1 or args.warmup < 0:
        ap.error("--samples must be at least 1 and --warmup at least 0")
    elem = DTYPES[args.dtype][1]
    odd = [b for b in args.bytes if b % elem]
    if odd:
        ap.error(f"--bytes {odd[0]} is not a whole number of {args.dtype} elements ({elem} bytes)")
    if "LOCAL_RANK" not in os.environ:
        ap.error("no LOCAL_RANK in the environment: launch with torchrun --nproc_per_node=N " + sys.argv[0])
    return args


def main():
    args = parse_args()
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        sys.exit(f"torch_symm_mem_bench: cannot import torch ({e}); this needs PyTorch with CUDA")

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    group_name = dist.group.WORLD.group_name
    dtype_name, elem, tol = DTYPES[args.dtype]
    dtype = getattr(torch, dtype_name)

    def emit(lines):
        if rank == 0 and args.out:
            with open(args.out, "w") as f:
                f.writelines(line + "\n" for line in lines)

    def max_over_ranks(x):
        t = torch.tensor([x], dtype=torch.float64, device="cuda")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    def time_per_call(fn, calls):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        us = []
        for s in range(args.warmup + args.samples):
            dist.barrier(device_ids=[local_rank])
            torch.cuda.synchronize()
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            torch.cuda.synchronize()
            if s >= args.warmup:
                us.append(start.elapsed_time(end) * 1000.0 / calls)
        return max_over_ranks(statistics.median(us))

    try:
        import torch.distributed._symmetric_memory as symm_mem
        one_shot = torch.ops.symm_mem.one_shot_all_reduce
        _ = (symm_mem.empty, symm_mem.rendezvous)  # older torch lacks them
        if hasattr(symm_mem, "enable_symm_mem_for_group"):  # needed by torch 2.5-2.7, a no-op later
            symm_mem.enable_symm_mem_for_group(group_name)
    except (ImportError, AttributeError, RuntimeError) as e:
        if rank == 0:
            print(f"torch_symm_mem_bench: torch {torch.__version__} has no symmetric-memory one-shot all-reduce "
                  f"({type(e).__name__}: {e}); nothing measured", file=sys.stderr)
        emit([])
        dist.destroy_process_group()
        return 0

    torch.manual_seed(1234 + rank)
    lines, all_ok = [], True
    for i, nbytes in enumerate(args.bytes):
        n = nbytes // elem
        try:
            t = symm_mem.empty(n, dtype=dtype, device="cuda")
            symm_mem.rendezvous(t, group_name)
            t.uniform_(-1.0, 1.0)
            got = one_shot(t, "sum", group_name)  # a new tensor; t stays as it was
        except (RuntimeError, NotImplementedError, TypeError) as e:
            why = f"torch {torch.__version__}; {type(e).__name__}: {e}"
            if i > 0:  # worked for a smaller size: e.g. an alignment limit
                if rank == 0:
                    print(f"torch_symm_mem_bench: {nbytes} bytes skipped ({why})", file=sys.stderr)
                continue
            if rank == 0:
                print(f"torch_symm_mem_bench: one_shot_all_reduce is unavailable here for {args.dtype} "
                      f"({why}); nothing measured", file=sys.stderr)
            emit([])
            dist.destroy_process_group()
            return 0
        ref = t.clone()
        dist.all_reduce(ref)
        relerr = max_over_ranks(((got.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item())
        check = "ok" if relerr < tol else "FAIL"
        all_ok &= check == "ok"
        op = lambda: one_shot(t, "sum", group_name)  # noqa: E731
        calls = max(2, min(100, (64 << 20) // nbytes))
        loop_us, single_us = time_per_call(op, calls), time_per_call(op, 1)
        line = json.dumps({"op": "all_reduce", "impl": "torch_symm_mem_one_shot", "world": world,
                           "dtype": args.dtype, "bytes": nbytes, "loop_us": round(loop_us, 3),
                           "single_us": round(single_us, 3), "relerr": float(f"{relerr:.3g}"), "check": check})
        lines.append(line)
        if rank == 0:
            print(line, flush=True)

    emit(lines)
    dist.destroy_process_group()
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
