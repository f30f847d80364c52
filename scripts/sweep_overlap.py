#!/usr/bin/env python3
"""Sweep weft's overlapped operators against NCCL + cuBLAS (and PyTorch Async-TP); CSV, PNG and a table.

On a GPU machine, for each op in ag_gemm, gemm_rs, gemm_ar, this runs

    BUILD/weftrun -n N -- BUILD/weft-bench OP --check --json EXTRA

and, with --torch-baselines tools/torch_tp_baselines.py (optional; needs PyTorch in
this Python), PyTorch's sequential and Async-TP figures for the same shapes:

    python3 -m torch.distributed.run --nproc_per_node=N tools/torch_tp_baselines.py --json --shapes ...

then writes into --out:

    overlap.csv   one row per (op, shape, mode): weft, sequential NCCL + cuBLAS, GEMM and
                  collective alone, ideal, PyTorch Async-TP (ag_gemm, gemm_rs; n/a without
                  --torch-baselines), the ratios
    overlap.png   per op, bars of weft / sequential / Async-TP / ideal per shape (matplotlib)
    OP.jsonl      weft-bench's raw JSON lines; torch.jsonl PyTorch's

and prints one table. BUILD (--build, default build) is where scripts/build.sh builds
(scripts/gpu_session.sh builds into build-gpu and passes --build build-gpu).

Exit status: 0 when every run succeeded and every check passed; 1 when a run or a check
failed, or there is no build or no GPU; 2 for bad arguments.

    python3 scripts/sweep_overlap.py --out /tmp/ov --torch-baselines tools/torch_tp_baselines.py
    python3 scripts/sweep_overlap.py --build build-gpu --out /tmp/ov --ops gemm_rs --extra="--samples 20"
    python3 scripts/sweep_overlap.py --out /tmp/replot --from-json ag_gemm.jsonl torch.jsonl
"""
import argparse
import collections
import csv
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import threading

import sweep_checks  # scripts/sweep_checks.py

OPS = ["ag_gemm", "gemm_rs", "gemm_ar"]
TAIL_LINES = 20  # of a failed command's stderr, repeated in the failure report


def fail(msg, code=1):
    print(f"sweep_overlap: error: {msg}", file=sys.stderr)
    sys.exit(code)


def warn(msg):
    print(f"sweep_overlap: warning: {msg}", file=sys.stderr)


def run_lines(cmd, timeout):
    """Runs cmd; returns (exit status or None when it could not start or timed out,
    the JSON objects on its stdout, the last lines of its stderr). Its stderr passes
    through as it comes."""
    print("$ " + shlex.join(cmd), file=sys.stderr, flush=True)
    tail = collections.deque(maxlen=TAIL_LINES)
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
    except OSError as e:
        return None, [], [f"cannot start {cmd[0]}: {e}"]

    def pump_stderr():
        for line in proc.stderr:
            sys.stderr.write(line)
            tail.append(line.rstrip("\n"))

    out = []

    def pump_stdout():
        for line in proc.stdout:
            out.append(line)

    threads = [threading.Thread(target=pump_stderr, daemon=True), threading.Thread(target=pump_stdout, daemon=True)]
    for t in threads:
        t.start()
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        tail.append(f"(stopped after {timeout} s)")
        rc = None
    for t in threads:
        t.join(timeout=5)
    rows = []
    for line in out:
        line = line.strip()
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return rc, rows, list(tail)


def report_failure(what, cmd, rc, tail):
    why = "did not run to its end" if rc is None else f"exit status {rc}"
    print(f"sweep_overlap: {what} failed ({why}): {shlex.join(cmd)}", file=sys.stderr)
    if tail:
        print("  last lines of its stderr:\n" + "\n".join("    " + line for line in tail), file=sys.stderr)


WEFT_FIELDS = ("op", "m", "n", "k", "mode", "path", "weft_ms", "seq_ms", "ideal_ms", "speedup_vs_seq", "vs_ideal")


def usable(rows, fields, what):
    keep = [r for r in rows if isinstance(r, dict) and all(k in r for k in fields)]
    if len(keep) < len(rows):
        warn(f"left out {len(rows) - len(keep)} {what} row(s) without the fields {', '.join(fields)}")
    return keep


def read_json_lines(path):
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.startswith("{")]
    except OSError as e:
        fail(f"cannot read --from-json file: {e}")
    except json.JSONDecodeError as e:
        fail(f"{path} is not JSON lines: {e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 epilog="Exit status: 0 all ran and passed; 1 a run or check failed, or no build "
                                        "or no GPU; 2 bad arguments.")
    ap.add_argument("--build", default="build",
                    help="build folder with weftrun and weft-bench (default build, where scripts/build.sh builds)")
    ap.add_argument("--out", required=True, metavar="DIR", help="output folder (created if missing)")
    ap.add_argument("--ops", default=",".join(OPS), help=f"comma-separated ops (default {','.join(OPS)})")
    ap.add_argument("--gpus", type=int, default=0, help="ranks (default: every GPU 'nvidia-smi -L' lists)")
    ap.add_argument("--extra", default="", help="more weft-bench arguments as one string, e.g. --extra='--samples 20'")
    ap.add_argument("--torch-baselines", default="", metavar="SCRIPT",
                    help="PyTorch's figures for the same shapes, sequential and Async-TP: the script "
                         "tools/torch_tp_baselines.py, run under this Python's torch.distributed.run "
                         "(default: none; the Async-TP columns read n/a)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per command (default 900)")
    ap.add_argument("--from-json", nargs="*", default=None, metavar="FILE",
                    help="re-plot saved JSON lines (OP.jsonl, torch.jsonl) instead of running")
    a = ap.parse_args()
    ops = [o for o in a.ops.split(",") if o]
    bad = [o for o in ops if o not in OPS]
    if bad:
        ap.error(f"unknown op(s) {bad}: expected {OPS}")
    if a.timeout <= 0:
        ap.error("--timeout must be a positive number of seconds")

    run_torch = False
    if a.from_json is None:
        # Everything a run needs, before anything is written.
        if a.torch_baselines:
            if not os.path.isfile(a.torch_baselines):
                fail(f"--torch-baselines: no file {a.torch_baselines} (PyTorch's baselines script is "
                     f"tools/torch_tp_baselines.py in this repository; leave the option out to skip them)", 2)
            if importlib.util.find_spec("torch") is None:
                warn(f"PyTorch is not importable by {sys.executable}: no PyTorch baselines (the Async-TP columns "
                     "read n/a); run this script with a Python that has torch for them")
            else:
                run_torch = True
        sweep_checks.require_build(a.build, fail)
        visible = sweep_checks.count_gpus(fail)
        gpus = a.gpus if a.gpus > 0 else visible
    try:
        os.makedirs(a.out, exist_ok=True)
    except OSError as e:
        fail(f"cannot create --out folder: {e}")

    weft_rows, torch_rows, failed = [], [], False
    if a.from_json is not None:
        for path in a.from_json:
            for r in read_json_lines(path):
                (torch_rows if "asynctp_ms" in r or "seq_ms" in r and "weft_ms" not in r else weft_rows).append(r)
    else:
        for op in ops:
            cmd = [os.path.join(a.build, "weftrun"), "-n", str(gpus), "--timeout", str(a.timeout), "--",
                   os.path.join(a.build, "weft-bench"), op, "--check", "--json"] + shlex.split(a.extra)
            rc, rows, tail = run_lines(cmd, a.timeout + 30)
            if rc != 0 or not rows:
                report_failure(f"weft-bench {op}" + ("" if rc != 0 else " (no JSON rows on stdout)"), cmd, rc, tail)
                failed = True
            with open(os.path.join(a.out, f"{op}.jsonl"), "w") as f:
                for r in rows:
                    f.write(json.dumps(r) + "\n")
            weft_rows += rows
        shapes = sorted({f"{r['m']},{r['n']},{r['k']}" for r in weft_rows
                         if r.get("op") in ("ag_gemm", "gemm_rs") and all(k in r for k in ("m", "n", "k"))})
        if run_torch and shapes:
            # The baselines in weft's element type (--extra="--dtype fp16" times both in fp16).
            extra = shlex.split(a.extra)
            dtype = extra[extra.index("--dtype") + 1] if "--dtype" in extra[:-1] else "bf16"
            cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={gpus}", a.torch_baselines,
                   "--json", "--dtype", dtype, "--shapes"] + shapes
            rc, torch_rows, tail = run_lines(cmd, a.timeout + 30)
            if rc != 0 or not torch_rows:
                # The baselines are an extra: their failure is reported, not counted against weft.
                report_failure("the PyTorch baselines", cmd, rc, tail)
            with open(os.path.join(a.out, "torch.jsonl"), "w") as f:
                for r in torch_rows:
                    f.write(json.dumps(r) + "\n")

    # Rows without the fields the table needs (another tool's JSON) are left out, and said so.
    weft_rows = usable(weft_rows, WEFT_FIELDS, "weft-bench")
    torch_rows = usable(torch_rows, ("op", "m", "n", "k"), "PyTorch baselines")
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

    if not table:
        fail("no weft-bench rows to report" + ("; the failures are above" if failed else ""))
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
