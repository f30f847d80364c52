#!/usr/bin/env python3
"""torch.nn.functional.scaled_dot_product_attention on weft-bench decode's shapes, one GPU.

    python3 tools/bench/decode_sdpa.py [--cases "B,HQ,HKV,L[,P];..."] [--dtype bf16|fp16] [--samples N] [--json]

Prints the columns weft-bench decode prints, so the two go in one table: us
per call (CUDA events; the median of samples of 5 back-to-back calls, warm-up
samples excluded), KV bytes read per second, and the HBM copy bound measured
in the same run (a device-to-device copy of the same K and V bytes, read +
write), timed in turn with SDPA. The query is [B, HQ, 1, 128], K and V
[B, HKV, L, 128] (grouped-query attention through enable_gqa). SDPA has no
paged KV cache: a case with a page size runs on the contiguous cache of the
same shape, and says so.
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F

DEFAULT_CASES = ("1,96,12,32768;1,96,12,131072;1,96,12,524288;1,32,8,32768;1,32,8,131072;1,32,8,524288;"
                 "4,32,8,32768;8,96,12,32768;8,96,12,32768,16;8,32,8,32768,16;32,96,12,32768,16;32,32,8,32768,16")
HEAD_DIM = 128


def parse_cases(text):
    cases = []
    for item in text.split(";"):
        f = [int(x) for x in item.split(",")]
        if len(f) not in (4, 5) or min(f) < 1 or f[1] % f[2]:
            raise SystemExit(f"--cases: '{item}' is not B,HQ,HKV,L[,P] with HQ a multiple of HKV")
        cases.append(tuple(f) if len(f) == 5 else tuple(f) + (0,))
    return cases


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
    p.add_argument("--cases", default=DEFAULT_CASES)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    p.add_argument("--samples", type=int, default=15)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    dt = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    torch.manual_seed(0)
    rows = []
    for (b, hq, hkv, length, page) in parse_cases(args.cases):
        q = torch.rand(b, hq, 1, HEAD_DIM, device="cuda", dtype=dt).mul_(2).sub_(1)
        kv = torch.rand(2, b, hkv, length, HEAD_DIM, device="cuda", dtype=dt).mul_(2).sub_(1)  # K, V: one copy moves both
        k, v = kv[0], kv[1]
        dst = torch.empty_like(kv)
        kv_bytes = kv.numel() * kv.element_size()

        def sdpa():
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

        def copy():
            dst.copy_(kv)

        sdpa_us, copy_us = time_us([sdpa, copy], 5, args.samples, args.warmup)
        tbps = kv_bytes / (sdpa_us * 1e-6) / 1e12
        copy_tbps = 2 * kv_bytes / (copy_us * 1e-6) / 1e12
        rows.append(dict(op="decode_sdpa", batch=b, q_heads=hq, kv_heads=hkv, kv_len=length, page_size=page,
                         dtype=args.dtype, us=round(sdpa_us, 2), kv_tbps=round(tbps, 3), copy_us=round(copy_us, 2),
                         copy_tbps=round(copy_tbps, 3), vs_copy=round(tbps / copy_tbps, 3),
                         note="contiguous KV (SDPA has no paged KV)" if page else ""))
        del q, kv, k, v, dst
        torch.cuda.empty_cache()
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return
    print(f"torch {torch.__version__} SDPA decode {args.dtype}, head dim {HEAD_DIM}; us per call (median of "
          f"{args.samples} samples of 5 back-to-back calls, SDPA and the copy in turn);\nKV TB/s = K and V bytes "
          "read / time; copy TB/s = a device-to-device copy of the same bytes, read + write; ratio = KV TB/s / copy TB/s")
    print(f"{'batch':>5} {'heads':>9} {'KV':>8} {'page':>6} | {'splits':>6} | {'sdpa us':>9} {'TB/s':>7} | "
          f"{'copy us':>9} {'TB/s':>7} | {'ratio':>6}")
    for r in rows:
        kv = f"{r['kv_len'] // 1024}K" if r["kv_len"] % 1024 == 0 else str(r["kv_len"])
        page = f"{r['page_size']}*" if r["page_size"] else "-"
        print(f"{r['batch']:>5} {str(r['q_heads']) + '/' + str(r['kv_heads']):>9} {kv:>8} {page:>6} | {'-':>6} | "
              f"{r['us']:>9.1f} {r['kv_tbps']:>7.2f} | {r['copy_us']:>9.1f} {r['copy_tbps']:>7.2f} | {r['vs_copy']:>6.3f}")
    if any(r["page_size"] for r in rows):
        print("* SDPA has no paged KV cache: these rows ran on the contiguous cache of the same shape")


if __name__ == "__main__":
    main()
