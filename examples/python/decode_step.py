#!/usr/bin/env python3
"""A decode loop through weft's decode attention: each step appends one token's
K and V to every sequence's cache and attends with the new query, checked
against torch's F.scaled_dot_product_attention (float32) every step, with the
step's attention time printed.

    python3 examples/python/decode_step.py                                    # one rank: weft.flash_decode
    weftrun -n 2 --share-gpu -- python3 examples/python/decode_step.py        # two ranks: weft.dist_flash_decode
    torchrun --nproc_per_node 2 examples/python/decode_step.py

The cache is allocated once at its capacity, [batch, kv_heads, capacity,
head_dim], and grows through kv_lens (int32 [batch], on the GPU): every step
runs the same plan. With more than one rank (or --dist) each rank keeps a
shard of every sequence: token t on rank t mod W, at slot t // W of a shard
of ceil(capacity / W) keys (the merge by log-sum-exp does not care which keys
a rank holds), so the shards grow together and a sequence shorter than the
world leaves ranks empty; dist_flash_decode gives every rank the attention
over all of them.

Exit status: 0 every step matched; 1 a runtime failure; 2 bad arguments; 3 a step's error was over --tol.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--q-heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128, choices=[64, 128])
    p.add_argument("--capacity", type=int, default=4096, help="keys per sequence the cache holds (default 4096)")
    p.add_argument("--prompt", type=int, default=1000,
                   help="the longest prompt; sequence b starts at max(1, prompt (b + 1) / batch) keys (default 1000)")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    p.add_argument("--dist", action="store_true", help="weft.dist_flash_decode at one rank too (on with W > 1)")
    p.add_argument("--tol", type=float, default=2e-2, help="largest relative error of a step's output (default 0.02)")
    return p.parse_args(argv)


def init():
    """A gloo group over the launcher's ranks (or a world of one), this rank's GPU, and weft on it."""
    import weft

    env = os.environ
    local = int(env.get("LOCAL_RANK", env.get("WEFT_LOCAL_RANK", "0")))
    torch.cuda.set_device(local % torch.cuda.device_count())
    if "WEFT_RANK" in env:
        addr, port = env.get("WEFT_MASTER_ADDR", "127.0.0.1"), env.get("WEFT_MASTER_PORT", "29517")
        dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=int(env["WEFT_RANK"]),
                                world_size=int(env["WEFT_WORLD_SIZE"]))
    elif "RANK" in env and "MASTER_ADDR" in env:
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    weft.init(dist.group.WORLD, device=torch.cuda.current_device())
    return weft


def main(argv=None) -> int:
    args = parse(argv)
    if not torch.cuda.is_available():
        print("decode_step.py: no CUDA GPU visible here", file=sys.stderr)
        return 1
    weft = init()
    w, r = weft.world_size(), weft.rank()
    use_dist = args.dist or w > 1
    say = print if r == 0 else (lambda *a, **k: None)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    b, hq, hkv, d, cap = args.batch, args.q_heads, args.kv_heads, args.head_dim, args.capacity
    if args.prompt + args.steps > cap:
        print(f"decode_step.py: --prompt + --steps ({args.prompt + args.steps}) must fit --capacity ({cap})",
              file=sys.stderr)
        return 2
    dev = torch.device("cuda", torch.cuda.current_device())
    g = torch.Generator().manual_seed(1234)  # the same tokens on every rank

    def rand(*shape):
        return torch.randn(shape, generator=g).to(dtype).to(dev)

    # The whole cache (every rank keeps it, for the reference) and, distributed, this rank's shard.
    k_full = torch.empty(b, hkv, cap, d, dtype=dtype, device=dev)
    v_full = torch.empty_like(k_full)
    lens = torch.tensor([max(1, args.prompt * (i + 1) // b) for i in range(b)], dtype=torch.int32, device=dev)
    for i, n in enumerate(lens.tolist()):
        k_full[i, :, :n], v_full[i, :, :n] = rand(hkv, n, d), rand(hkv, n, d)
    shard = (cap + w - 1) // w
    k_mine = torch.empty(b, hkv, shard, d, dtype=dtype, device=dev)
    v_mine = torch.empty_like(k_mine)
    for i, n in enumerate(lens.tolist()):
        mine = len(range(r, n, w))
        k_mine[i, :, :mine], v_mine[i, :, :mine] = k_full[i, :, r:n:w], v_full[i, :, r:n:w]

    def my_lens():  # tokens t < len with t mod W = r
        return ((lens - r + w - 1).clamp_min(0) // w).to(torch.int32)

    op = "dist_flash_decode" if use_dist else "flash_decode"
    say(f"decode_step: weft.{op}, {w} rank(s), batch {b}, {hq}/{hkv} heads of {d}, {args.dtype}, capacity {cap}, "
        f"{torch.cuda.get_device_name(dev)}")
    rows = torch.arange(b, device=dev)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    worst = 0.0
    for step in range(args.steps + 1):  # step 0 builds the plan (and, distributed, meets the ranks)
        # Append this step's token to every sequence, then attend with its query.
        t = lens.long()
        k_new, v_new, q = rand(b, hkv, d), rand(b, hkv, d), rand(b, hq, d)
        k_full[rows, :, t], v_full[rows, :, t] = k_new, v_new
        here = (t % w) == r
        k_mine[rows[here], :, t[here] // w], v_mine[rows[here], :, t[here] // w] = k_new[here], v_new[here]
        lens += 1
        kv_lens = my_lens() if use_dist else lens
        start.record()
        if use_dist:
            out, lse = weft.dist_flash_decode(q, k_mine, v_mine, kv_lens)
        else:
            out, lse = weft.flash_decode(q, k_full, v_full, kv_lens)
        end.record()
        end.synchronize()
        us = start.elapsed_time(end) * 1e3
        err = 0.0
        for i, n in enumerate(lens.tolist()):
            ref = F.scaled_dot_product_attention(q[i, :, None].float()[None], k_full[i:i + 1, :, :n].float(),
                                                 v_full[i:i + 1, :, :n].float(), enable_gqa=True)[0, :, 0]
            err = max(err, ((out[i].float() - ref).norm() / ref.norm()).item())
        worst = max(worst, err)
        errs = torch.tensor([err], dtype=torch.float64)
        dist.all_reduce(errs, op=dist.ReduceOp.MAX)
        first = " (first call: builds the plan)" if step == 0 else ""
        say(f"  step {step}: lengths {lens.tolist()}, {us:8.1f} us{first}, relative error {errs.item():.2e} "
            "(worst rank)")
    ok = worst <= args.tol
    flags = torch.tensor([0 if ok else 1])
    dist.all_reduce(flags)
    say("ok: every step matches F.scaled_dot_product_attention" if flags.item() == 0
        else f"FAILED: {flags.item()} rank(s) had a step's error over {args.tol}")
    weft.shutdown()
    dist.destroy_process_group()
    return 0 if flags.item() == 0 else 3


if __name__ == "__main__":
    sys.exit(main())
