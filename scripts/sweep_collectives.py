#!/usr/bin/env python3
"""Sweep weft's collectives against NCCL and turn the results into a CSV and plots.

On a GPU machine, for each op, this runs

    BUILD/weftrun -n N -- BUILD/weft-bench OP --bytes BYTES --variant all,auto --check --json EXTRA

(progress lines on stderr pass straight through; stdout is read as one JSON
object per line, anything else is ignored) and writes into --out:

    collectives.csv   one row per JSON object, all its fields, plus
                      best_for_size (1 on the fastest non-automatic variant of
                      that op and size, by weft_loop_us) and ratio_loop
                      (weft_loop_us / nccl_loop_us)
    OP.png            latency (loop us) and bus bandwidth against bytes per rank,
                      every weft variant and NCCL (needs matplotlib)
    OP.jsonl          the raw JSON lines of each run (feed them back with --from-json)
    vs_torch.csv      with --torch-json: best weft all_reduce against PyTorch's
                      symmetric-memory one-shot all-reduce (tools/torch_symm_mem_bench.py)

and prints a short table per op. BUILD (--build, default build) is where
scripts/build.sh builds (scripts/gpu_session.sh builds into build-gpu and passes
--build build-gpu). Before running anything it checks that BUILD holds weftrun
and weft-bench and that 'nvidia-smi -L' lists a GPU.

Exit status: 0 when every run succeeded and every row's check is "ok" or
"skipped"; 1 otherwise (a failed run or check, no build, no GPU); 2 for bad
arguments.

    python3 scripts/sweep_collectives.py --out /tmp/sweep
    python3 scripts/sweep_collectives.py --build build-gpu --out /tmp/sweep
    python3 scripts/sweep_collectives.py --out /tmp/sweep --ops all_reduce --bytes 1K:1M \\
        --torch-json /tmp/torch_ar.jsonl --extra "--samples 51"
    python3 scripts/sweep_collectives.py --out /tmp/replot --from-json a.jsonl b.jsonl

Only the Python standard library is needed; matplotlib for the plots.
"""
import argparse
import collections
import csv
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import threading

import sweep_checks  # scripts/sweep_checks.py
from collections import OrderedDict, defaultdict

DEFAULT_OPS = ["all_reduce", "reduce_scatter", "all_gather"]
REQUIRED = ("op", "variant", "weft_loop_us", "nccl_loop_us")
PASSING = ("ok", "skipped")
TAIL_LINES = 20  # of a failed run's stderr, repeated in the failure report
# Bus bandwidth = algorithm bandwidth x this factor (as nccl-tests count it).
BUSBW_FACTOR = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
}


def fail(msg, code=1):
    print(f"sweep_collectives: error: {msg}", file=sys.stderr)
    sys.exit(code)


def warn(msg):
    print(f"sweep_collectives: warning: {msg}", file=sys.stderr)


def fmt_bytes(n):
    """1024 -> '1K', 1536 -> '1.5K', 1 << 30 -> '1G' (powers of 1024, as weft-bench writes them)."""
    for unit, shift in (("T", 40), ("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift:
            v = n / (1 << shift)
            return f"{v:g}{unit}" if v == int(v) else f"{v:.3g}{unit}"
    return f"{int(n)}"


def num(row, key):
    """A float field, or None when missing, null or not a number."""
    try:
        v = float(row.get(key))
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def is_auto(variant):
    return str(variant).startswith("a:") or variant == "auto"


# ---------------------------------------------------------------- reading


def normalize(obj):
    """A weft-bench JSON object as a row, or None if it is not one.

    Older weft-bench builds write bytes_per_rank and algbw_*_gbs instead of
    bytes and busbw_*_gbs; those are accepted and the busbw fields derived."""
    if not isinstance(obj, dict) or not all(k in obj for k in REQUIRED):
        return None
    row = dict(obj)
    if "bytes" not in row and "bytes_per_rank" in row:
        row["bytes"] = row["bytes_per_rank"]
    try:
        row["bytes"] = int(row["bytes"])
    except (KeyError, TypeError, ValueError):
        return None
    world, factor = row.get("world"), BUSBW_FACTOR.get(row["op"])
    for who in ("weft", "nccl"):
        bus, alg = f"busbw_{who}_gbs", f"algbw_{who}_gbs"
        if bus not in row and num(row, alg) is not None and factor and isinstance(world, int) and world > 0:
            row[bus] = round(num(row, alg) * factor(world), 3)
    return row


def parse_lines(lines, rows, raw=None):
    """Append the rows found in lines to rows; returns how many lines were skipped."""
    skipped = 0
    for line in lines:
        text = line.strip()
        row = None
        if text.startswith("{"):
            try:
                row = normalize(json.loads(text))
            except json.JSONDecodeError:
                row = None
        if row is None:
            if text:
                skipped += 1
            continue
        rows.append(row)
        if raw is not None:
            raw.append(text)
    return skipped


def read_json_files(paths):
    rows = []
    for path in paths:
        try:
            with open(path) as f:
                skipped = parse_lines(f, rows)
        except OSError as e:
            fail(f"cannot read --from-json file: {e}")
        if skipped:
            warn(f"{path}: ignored {skipped} line(s) that are not weft-bench JSON objects")
    return rows


def run_bench(args, ops, nproc):
    """Runs weft-bench once per op on nproc ranks; returns (rows, names of failed runs)."""
    weftrun, bench = os.path.join(args.build, "weftrun"), os.path.join(args.build, "weft-bench")
    extra = shlex.split(args.extra or "")
    rows, failed = [], []
    for op in ops:
        cmd = [weftrun, "-n", str(nproc)]
        if args.timeout:
            cmd += ["--timeout", str(args.timeout)]
        cmd += ["--", bench, op, "--bytes", args.bytes, "--variant", "all,auto", "--check", "--json", *extra]
        print(f"### {op}: {shlex.join(cmd)}", file=sys.stderr, flush=True)
        op_rows, raw = [], []
        tail = collections.deque(maxlen=TAIL_LINES)
        try:
            # weft-bench's progress lines (stderr) show as they come; the last ones are kept for a failure report.
            with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1) as proc:
                def pump_stderr():
                    for line in proc.stderr:
                        sys.stderr.write(line)
                        tail.append(line.rstrip("\n"))
                pump = threading.Thread(target=pump_stderr, daemon=True)
                pump.start()
                for line in proc.stdout:
                    if parse_lines([line], op_rows, raw):
                        sys.stderr.write(line)  # not JSON: shown, not parsed
                        tail.append(line.rstrip("\n"))
                rc = proc.wait()
                pump.join(timeout=5)
        except OSError as e:
            rc = None
            tail.append(f"cannot start {weftrun}: {e}")
        except KeyboardInterrupt:
            fail("interrupted", 130)
        with open(os.path.join(args.out, f"{op}.jsonl"), "w") as f:
            f.writelines(t + "\n" for t in raw)
        if rc != 0 or not op_rows:
            why = "did not start" if rc is None else f"exit status {rc}" if rc != 0 else "no JSON rows on stdout"
            print(f"### {op}: weft-bench FAILED ({why}): {shlex.join(cmd)}", file=sys.stderr)
            if tail:
                print("  last lines of its output:\n" + "\n".join("    " + line for line in tail), file=sys.stderr)
            sys.stderr.flush()
            failed.append(f"{op} ({why})")
        rows += op_rows
    return rows, failed


def read_torch(path):
    rows = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if obj.get("op") == "all_reduce" and num(obj, "loop_us") and "bytes" in obj:
                    obj["bytes"] = int(obj["bytes"])
                    rows.append(obj)
    except OSError as e:
        fail(f"cannot read --torch-json file: {e}")
    if not rows:
        warn(f"{path} holds no all_reduce points (torch symm-mem unavailable there?); no torch comparison")
    return rows


# ---------------------------------------------------------------- analysis


def group_key(row):
    return (row["op"], row.get("world"), row.get("dtype"))


def annotate(rows):
    """Adds ratio_loop and best_for_size to every row."""
    by_size = defaultdict(list)
    for r in rows:
        w, n = num(r, "weft_loop_us"), num(r, "nccl_loop_us")
        r["ratio_loop"] = round(w / n, 4) if w is not None and n else ""
        r["best_for_size"] = 0
        by_size[group_key(r) + (r["bytes"],)].append(r)
    for group in by_size.values():
        # A variant that gave a wrong answer is not a candidate.
        cands = [r for r in group if not is_auto(r["variant"]) and num(r, "weft_loop_us") is not None
                 and r.get("check", "skipped") in PASSING]
        if cands:
            min(cands, key=lambda r: num(r, "weft_loop_us"))["best_for_size"] = 1
    return by_size


def write_csv(path, rows, first=()):
    fields = list(first)
    for r in rows:
        fields += [k for k in r if k not in fields]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, restval="")
        w.writeheader()
        w.writerows(rows)


def nccl_series(group_rows, key):
    """NCCL is measured once per size; its figure repeats on every variant's row."""
    vals = defaultdict(list)
    for r in group_rows:
        v = num(r, key)
        if v is not None:
            vals[r["bytes"]].append(v)
    return sorted((b, statistics.median(v)) for b, v in vals.items())


def torch_busbw(t):
    n = t.get("world")
    factor = BUSBW_FACTOR["all_reduce"](n) if isinstance(n, int) and n > 1 else 1.0
    return t["bytes"] / (num(t, "loop_us") * 1e3) * factor


def torch_matching(torch_rows, world, dtype):
    return [t for t in torch_rows if t.get("world") == world and t.get("dtype", dtype) == dtype]


VS_TORCH_FIELDS = ("world", "dtype", "bytes", "size", "best_variant", "best_kind", "weft_loop_us", "torch_loop_us",
                   "ratio_weft_over_torch", "best_fixed_variant", "best_fixed_us", "auto_variant", "auto_us",
                   "weft_single_us", "torch_single_us", "torch_relerr", "torch_check")


def vs_torch(rows, torch_rows):
    """Best weft all_reduce per size (fixed and automatic variants) against torch."""
    out = []
    for t in sorted(torch_rows, key=lambda t: (t.get("world", 0), t["bytes"])):
        same = [r for r in rows if r["op"] == "all_reduce" and r["bytes"] == t["bytes"]
                and r.get("world") == t.get("world") and r.get("dtype") == t.get("dtype", r.get("dtype"))
                and num(r, "weft_loop_us") is not None and r.get("check", "skipped") in PASSING]
        if not same:
            continue
        fixed = [r for r in same if not is_auto(r["variant"])]
        auto = [r for r in same if is_auto(r["variant"])]
        best = min(same, key=lambda r: num(r, "weft_loop_us"))
        bf = min(fixed, key=lambda r: num(r, "weft_loop_us")) if fixed else None
        ba = min(auto, key=lambda r: num(r, "weft_loop_us")) if auto else None
        tl = num(t, "loop_us")
        out.append(OrderedDict(
            world=t.get("world"), dtype=t.get("dtype"), bytes=t["bytes"], size=fmt_bytes(t["bytes"]),
            best_variant=best["variant"], best_kind="automatic" if is_auto(best["variant"]) else "fixed",
            weft_loop_us=num(best, "weft_loop_us"), torch_loop_us=tl,
            ratio_weft_over_torch=round(num(best, "weft_loop_us") / tl, 4),
            best_fixed_variant=bf["variant"] if bf else "", best_fixed_us=num(bf, "weft_loop_us") if bf else "",
            auto_variant=ba["variant"] if ba else "", auto_us=num(ba, "weft_loop_us") if ba else "",
            weft_single_us=num(best, "weft_single_us"), torch_single_us=num(t, "single_us"),
            torch_relerr=t.get("relerr", ""), torch_check=t.get("check", "")))
    return out


# ---------------------------------------------------------------- plots


def plot_group(plt, ticker, path, op, world, dtype, group_rows, torch_rows):
    order = ["ll", "one_shot", "two_shot", "push", "pull", "ce", "ring", "mesh"]  # stable colours across ops
    variants = sorted({r["variant"] for r in group_rows if not is_auto(r["variant"])},
                      key=lambda v: (order.index(v) if v in order else len(order), v))
    fig, (lat, bw) = plt.subplots(1, 2, figsize=(15, 5.8))
    # Red, gray and black are kept for PyTorch, NCCL and the automatic choice.
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:olive", "tab:cyan", "tab:pink"]

    def series(rows, key):
        pts = sorted((r["bytes"], num(r, key)) for r in rows if num(r, key) is not None)
        return [p[0] for p in pts], [p[1] for p in pts]

    lines = [(f"weft {v}", [r for r in group_rows if r["variant"] == v], dict(color=colors[i % len(colors)], marker="o"))
             for i, v in enumerate(variants)]
    auto = [r for r in group_rows if is_auto(r["variant"])]
    if auto:
        lines.append(("weft automatic", auto, dict(color="black", marker="x", linestyle=":", linewidth=1.2)))
    for label, rs, style in lines:
        lat.plot(*series(rs, "weft_loop_us"), label=label, markersize=4, **style)
        bw.plot(*series(rs, "busbw_weft_gbs"), label=label, markersize=4, **style)
    nccl = dict(color="gray", marker="s", linewidth=2.5, markersize=4, alpha=0.8)
    for ax, key in ((lat, "nccl_loop_us"), (bw, "busbw_nccl_gbs")):
        pts = nccl_series(group_rows, key)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label="NCCL", **nccl)
    bad = [r for r in group_rows if r.get("check") not in PASSING]
    for ax, key in ((lat, "weft_loop_us"), (bw, "busbw_weft_gbs")):
        xs, ys = series(bad, key)
        if xs:
            ax.scatter(xs, ys, s=120, facecolors="none", edgecolors="red", linewidths=1.5, zorder=5,
                       label="check failed")
    if torch_rows:
        pts = sorted(torch_rows, key=lambda t: t["bytes"])
        style = dict(color="tab:red", marker="D", linestyle="--", markersize=4)
        lat.plot([t["bytes"] for t in pts], [num(t, "loop_us") for t in pts], label="PyTorch symm-mem one-shot", **style)
        bw.plot([t["bytes"] for t in pts], [torch_busbw(t) for t in pts], label="PyTorch symm-mem one-shot", **style)

    sizes = sorted({r["bytes"] for r in group_rows} | {t["bytes"] for t in torch_rows})
    ticks = [1 << k for k in range(int(math.log2(sizes[0])), int(math.ceil(math.log2(sizes[-1]))) + 1)]
    for ax in (lat, bw):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks)
        ax.set_xticklabels([fmt_bytes(t) for t in ticks], rotation=45 if len(ticks) > 12 else 0, fontsize=8)
        ax.minorticks_off()
        ax.set_xlabel("bytes per rank")
        ax.grid(True, which="major", alpha=0.3)
    lat.set_yscale("log")
    lat.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    lat.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    lat.yaxis.set_minor_formatter(ticker.NullFormatter())
    lat.set_ylabel("time per call, back-to-back loop (us)")
    lat.set_title("latency (lower is better)")
    bw.set_ylabel("bus bandwidth (GB/s)")
    bw.set_title("bus bandwidth (higher is better)")
    lat.legend(fontsize=8)
    bw.legend(fontsize=8, loc="upper left")
    fig.suptitle(f"weft {op} vs NCCL - world {world}, {dtype}  (median of samples, max over ranks)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def make_plots(out_dir, groups, torch_rows):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker as ticker
    except ImportError as e:
        print(f"sweep_collectives: matplotlib is not available ({e}): CSV written, no plots "
              "(to plot later: install matplotlib, rerun with --from-json on the JSON lines)", file=sys.stderr)
        return []
    per_op = defaultdict(list)
    for key in groups:
        per_op[key[0]].append(key)
    written = []
    for op, keys in per_op.items():
        for key in keys:
            _, world, dtype = key
            name = f"{op}.png" if len(keys) == 1 else f"{op}_w{world}_{dtype}.png"
            path = os.path.join(out_dir, name)
            trs = torch_matching(torch_rows, world, dtype) if op == "all_reduce" else []
            if op == "all_reduce" and torch_rows and not trs:
                warn(f"no torch points for world {world}, {dtype}: not added to {name}")
            plot_group(plt, ticker, path, op, world, dtype, groups[key], trs)
            written.append(path)
    return written


# ---------------------------------------------------------------- summary


def print_tables(groups, by_size):
    for (op, world, dtype), group_rows in groups.items():
        print(f"\n{op}, world {world}, {dtype}: loop us per call; ratio = weft/NCCL time; best among fixed variants")
        hdr = f"{'size':>6} {'best':>10} {'weft us':>9} {'NCCL us':>9} {'ratio':>6} {'busbw weft/NCCL GB/s':>21}  {'auto':>12} {'auto us':>8}  check"
        print(hdr)
        print("-" * len(hdr))
        for b in sorted({r["bytes"] for r in group_rows}):
            rs = by_size[(op, world, dtype, b)]
            best = next((r for r in rs if r["best_for_size"] == 1), None)
            auto = next((r for r in rs if is_auto(r["variant"])), None)
            bad = [f"{r['variant']}:{r.get('check', 'missing')}" for r in rs if r.get("check") not in PASSING]
            check = "; ".join(bad) if bad else ",".join(sorted({r["check"] for r in rs}))
            f = lambda v, spec: "-" if v is None else format(v, spec)
            ref = best or rs[0]
            bw = f"{f(num(best, 'busbw_weft_gbs') if best else None, '.1f')}/{f(num(ref, 'busbw_nccl_gbs'), '.1f')}"
            print(f"{fmt_bytes(b):>6} {best['variant'] if best else '-':>10} "
                  f"{f(num(best, 'weft_loop_us') if best else None, '.2f'):>9} {f(num(ref, 'nccl_loop_us'), '.2f'):>9} "
                  f"{f(best['ratio_loop'] if best and best['ratio_loop'] != '' else None, '.3f'):>6} {bw:>21}  "
                  f"{auto['variant'] if auto else '-':>12} {f(num(auto, 'weft_loop_us') if auto else None, '.2f'):>8}  {check}")


def main():
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Writes DIR/collectives.csv, DIR/OP.png, DIR/OP.jsonl and (with --torch-json) DIR/vs_torch.csv.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build",
                    help="build folder with weftrun and weft-bench (default build, where scripts/build.sh builds)")
    ap.add_argument("--out", required=True, metavar="DIR", help="output folder (created if missing)")
    ap.add_argument("--ops", help=f"comma-separated ops (default {','.join(DEFAULT_OPS)}; "
                                  "with --from-json: every op in the files)")
    ap.add_argument("--bytes", default="1K:1G", help="per-rank sizes, passed to weft-bench --bytes (default 1K:1G)")
    ap.add_argument("--nproc", type=int, help="ranks (default: the GPUs that 'nvidia-smi -L' lists)")
    ap.add_argument("--timeout", type=int, help="seconds, passed to weftrun --timeout (default: none)")
    ap.add_argument("--extra", help='more weft-bench arguments as one string, e.g. --extra="--samples 51"')
    ap.add_argument("--torch-json", metavar="FILE", help="JSON lines from tools/torch_symm_mem_bench.py --out")
    ap.add_argument("--from-json", nargs="+", action="extend", metavar="FILE",
                    help="read saved weft-bench JSON lines instead of running (repeatable)")
    args = ap.parse_args()
    if args.nproc is not None and args.nproc < 1:
        ap.error("--nproc must be at least 1")
    ops = [o for o in (args.ops or "").split(",") if o] or None
    if not args.from_json:
        bad = [o for o in ops or [] if o not in DEFAULT_OPS]
        if bad:
            ap.error(f"unknown op(s) {', '.join(bad)}: expected {', '.join(DEFAULT_OPS)}")
        if args.torch_json and not os.path.isfile(args.torch_json):
            fail(f"--torch-json: no file {args.torch_json} (write one with tools/torch_symm_mem_bench.py --out FILE)", 2)
        # Everything a run needs, before anything is written.
        sweep_checks.require_build(args.build, fail)
        visible = sweep_checks.count_gpus(fail)
        nproc = args.nproc or visible
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        fail(f"cannot create --out folder: {e}")

    failed = []
    if args.from_json:
        rows = read_json_files(args.from_json)
        if ops:
            rows = [r for r in rows if r["op"] in ops]
    else:
        rows, failed = run_bench(args, ops or DEFAULT_OPS, nproc)
    if not rows:
        fail("no weft-bench rows to report" + (f"; failed runs: {', '.join(failed)}" if failed else ""))

    by_size = annotate(rows)
    groups = OrderedDict()
    for r in rows:
        groups.setdefault(group_key(r), []).append(r)
    csv_path = os.path.join(args.out, "collectives.csv")
    write_csv(csv_path, rows, first=("op", "world", "dtype", "bytes", "variant"))
    print(f"wrote {csv_path} ({len(rows)} rows)", file=sys.stderr)

    torch_rows = read_torch(args.torch_json) if args.torch_json else []
    cmp = []
    if args.torch_json:
        cmp = vs_torch(rows, torch_rows)
        path = os.path.join(args.out, "vs_torch.csv")
        write_csv(path, cmp, first=VS_TORCH_FIELDS)
        print(f"wrote {path} ({len(cmp)} sizes in both)", file=sys.stderr)
        if torch_rows and not cmp:
            warn("no size, world and dtype common to the torch file and the weft all_reduce rows")
    for path in make_plots(args.out, groups, torch_rows):
        print(f"wrote {path}", file=sys.stderr)

    print_tables(groups, by_size)
    bad = [r for r in rows if r.get("check") not in PASSING]
    if cmp:
        print("\nall_reduce vs PyTorch symm-mem one-shot (loop us; best = fastest weft row, fixed or automatic):")
        for c in cmp:
            print(f"  w{c['world']} {c['size']:>6}: weft {c['weft_loop_us']:.2f} ({c['best_variant']}, {c['best_kind']}) "
                  f"torch {c['torch_loop_us']:.2f}  ratio {c['ratio_weft_over_torch']:.3f}")
    status = 0
    if bad:
        print(f"\nFAILED checks: {len(bad)} row(s): " +
              ", ".join(f"{r['op']} {fmt_bytes(r['bytes'])} {r['variant']}={r.get('check', 'missing')}" for r in bad[:10]))
        status = 1
    if failed:
        print(f"\nFAILED weft-bench runs: {', '.join(failed)}")
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
