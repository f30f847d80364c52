#!/usr/bin/env python3
"""Sweep weft's overlapped operators against NCCL + cuBLAS (and PyTorch Async-TP); CSV, PNG and a table.

On a GPU machine, for each op in ag_gemm, gemm_rs, gemm_ar, this runs

    BUILD/weftrun -n N -- BUILD/weft-bench OP --check --json [--shapes ...] EXTRA

and, when --torch-baselines names PyTorch's script (torch_baselines.py),

    python3 -m torch.distributed.run --nproc_per_node=N torch_baselines.py --json --shapes ...

then writes into --out:

    overlap.csv   one row per (op, shape, mode): weft, sequential NCCL + cuBLAS, GEMM and
                  collective alone, ideal, PyTorch Async-TP (ag_gemm, gemm_rs), the ratios
    overlap.png   per op, bars of weft / sequential / Async-TP / ideal per shape (matplotlib)
    OP.jsonl      weft-bench's raw JSON lines; torch.jsonl PyTorch's

and prints one table. Exit status 0 when every run succeeded and every check passed.

    python3 scripts/sweep_overlap.py --build build-gpu --out /tmp/ov --torch-baselines .deps/torch_baselines.py
    python3 scripts/sweep_overlap.py --out /tmp/replot --from-json ag_gemm.jsonl torch.jsonl
"""
import argparse
import csv
import json
import os
import shlex
import subprocess
import sys

OPS = ["ag_gemm", "gemm_rs", "gemm_ar"]


def run_lines(cmd, timeout):
    print("$ " + " ".join(shlex.quote(c) for c in cmd), file=sys.stderr, flush=True)
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"timed out after {timeout} s: {cmd[0]}", file=sys.stderr)
        return 124, []
    rows = []
    for line in p.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return p.returncode, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build-gpu")
    ap.add_argument("--out", required=True)
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--gpus", type=int, default=0, help="ranks (default: every visible GPU)")
    ap.add_argument("--extra", default="", help="more weft-bench arguments, e.g. '--samples 20'")
    ap.add_argument("--torch-baselines", default="", help="path of torch_baselines.py (skipped if empty or missing)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per command")
    ap.add_argument("--from-json", nargs="*", default=None, help="re-plot saved JSON lines instead of running")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    ops = [o for o in a.ops.split(",") if o]
    bad = [o for o in ops if o not in OPS]
    if bad:
        ap.error(f"unknown op(s) {bad}: expected {OPS}")

    weft_rows, torch_rows, failed = [], [], False
    if a.from_json is not None:
        for path in a.from_json:
            for line in open(path):
                if line.startswith("{"):
                    r = json.loads(line)
                    (torch_rows if "asynctp_ms" in r or "seq_ms" in r and "weft_ms" not in r else weft_rows).append(r)
    else:
        gpus = a.gpus
        if gpus <= 0:
            out = subprocess.run(["nvidia-smi", "-L"], stdout=subprocess.PIPE, text=True).stdout
            gpus = sum(1 for l in out.splitlines() if l.startswith("GPU "))
        for op in ops:
            cmd = [f"{a.build}/weftrun", "-n", str(gpus), "--timeout", str(a.timeout), "--",
                   f"{a.build}/weft-bench", op, "--check", "--json"] + shlex.split(a.extra)
            rc, rows = run_lines(cmd, a.timeout + 30)
            failed |= rc != 0 or not rows
            with open(os.path.join(a.out, f"{op}.jsonl"), "w") as f:
                for r in rows:
                    f.write(json.dumps(r) + "\n")
            weft_rows += rows
        if a.torch_baselines and os.path.exists(a.torch_baselines):
            shapes = sorted({f"{r['m']},{r['n']},{r['k']}" for r in weft_rows if r["op"] in ("ag_gemm", "gemm_rs")})
            cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={gpus}", a.torch_baselines,
                   "--json", "--shapes"] + shapes
            rc, torch_rows = run_lines(cmd, a.timeout + 30)
            with open(os.path.join(a.out, "torch.jsonl"), "w") as f:
                for r in torch_rows:
                    f.write(json.dumps(r) + "\n")
        elif a.torch_baselines:
            print(f"PyTorch baselines skipped: {a.torch_baselines} not found", file=sys.stderr)

    torch_by = {(r["op"], r["m"], r["n"], r["k"]): r for r in torch_rows}
    table = []
    for r in weft_rows:
        t = torch_by.get((r["op"], r["m"], r["n"], r["k"]), {})
        row = dict(r)
        row["torch_seq_ms"] = t.get("seq_ms")
        row["asynctp_ms"] = t.get("asynctp_ms")
        row["vs_asynctp"] = (t["asynctp_ms"] / r["weft_ms"]) if t.get("asynctp_ms") else None
        row["check"] = "ok" if 0 <= r.get("rel_err", -1) < 1e-2 and r.get("gathered_mismatch", 0) <= 0 else (
            "unchecked" if r.get("rel_err", -1) < 0 else "FAIL")
        failed |= row["check"] == "FAIL"
        table.append(row)

    if table:
        keys = list(table[0].keys())
        with open(os.path.join(a.out, "overlap.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            for row in table:
                w.writerow(row)

    print("overlapped operators, ms (max over ranks); x seq = sequential / weft; x ideal = weft / ideal; "
          "x asyncTP = Async-TP / weft; fused GEMMs = the fused path's GEMMs alone, nothing sent")
    print(f"{'op':8s} {'M':>6s} {'N':>6s} {'K':>6s} {'path':16s} | {'weft':>7s} {'seq':>7s} {'ideal':>7s} "
          f"{'asyncTP':>7s} {'fusedGEMMs':>10s} | {'x seq':>6s} {'x ideal':>7s} {'x aTP':>6s} | check")
    for r in table:
        at = f"{r['asynctp_ms']:7.3f}" if r["asynctp_ms"] else "    n/a"
        xa = f"{r['vs_asynctp']:6.3f}" if r["vs_asynctp"] else "   n/a"
        print(f"{r['op']:8s} {r['m']:6d} {r['n']:6d} {r['k']:6d} {r['path']:16s} | {r['weft_ms']:7.3f} "
              f"{r['seq_ms']:7.3f} {r['ideal_ms']:7.3f} {at} {r.get('gemm_hooked_ms', 0):10.3f} | "
              f"{r['speedup_vs_seq']:6.3f} {r['vs_ideal']:7.3f} {xa} | {r['check']}")

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not available: no plot", file=sys.stderr)
        return 1 if failed else 0
    present = [op for op in OPS if any(r["op"] == op for r in table)]
    if present:
        fig, axes = plt.subplots(len(present), 1, figsize=(11, 3.6 * len(present)), squeeze=False)
        for ax, op in zip(axes[:, 0], present):
            rows = [r for r in table if r["op"] == op]
            labels = [f"{r['m']}x{r['n']}x{r['k']}" + ("" if r["mode"] == "auto" else f" {r['mode']}") for r in rows]
            xs = range(len(rows))
            series = [("weft", "weft_ms"), ("NCCL + cuBLAS", "seq_ms"), ("Async-TP", "asynctp_ms"),
                      ("ideal", "ideal_ms")]
            width = 0.2
            for i, (name, key) in enumerate(series):
                vals = [(r.get(key) or 0) for r in rows]
                ax.bar([x + (i - 1.5) * width for x in xs], vals, width, label=name)
            ax.set_xticks(list(xs))
            ax.set_xticklabels(labels, rotation=20, fontsize=8)
            ax.set_ylabel("ms")
            ax.set_title(f"{op}, {rows[0].get('world', '?')} GPUs, bf16 (M x N x K of the layer)")
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(a.out, "overlap.png"), dpi=110)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
