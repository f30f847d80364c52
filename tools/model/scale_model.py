#!/usr/bin/env python3
"""Cost model of weft's planned inter-node schedules at 16, 32 and 64 GPUs.

Prints the tables of docs/SCALE.md: predictions computed from PARAMS
(each measured on 2 x H200, published, or assumed, as its row says).

    scale_model.py [--markdown]        print the tables (standard library only)
    scale_model.py --check FILE        exit 0 iff FILE's block between the markers equals the output
    scale_model.py --set nic_lat=3     the tables with other values (e.g. measured ones)
"""
import argparse
import difflib
import math
import sys

BEGIN, END = "<!-- scale_model.py begin -->", "<!-- scale_model.py end -->"

# name: (value, unit, kind, source). "PERF" is docs/PERF.md, "anchors" is the
# reference anchors (measured on the same 2 x H200 machine, PyTorch 2.11).
# NVLink bandwidths are bus bandwidths at 256 MB per rank, 2 x H200, back-to-back
# loop: the fused operators move 64 MB - 1 GB a call, and 256 MB is the middle.
PARAMS = {
    "nvl_bw": (343.4, "GB/s", "measured-here", "weft AllGather bus bandwidth, 256 MB per rank (PERF, AllGather)"),
    "nvl_red_bw": (281.6, "GB/s", "measured-here", "weft ReduceScatter bus bandwidth, 256 MB (PERF, ReduceScatter)"),
    "nccl_ag_bw": (256.6, "GB/s", "measured-here", "NCCL AllGather bus bandwidth, 256 MB (PERF, AllGather)"),
    "nccl_rs_bw": (229.9, "GB/s", "measured-here", "NCCL ReduceScatter bus bandwidth, 256 MB (PERF, ReduceScatter)"),
    "nccl_ar_bw": (300.1, "GB/s", "measured-here", "NCCL AllReduce bus bandwidth, 256 MB (PERF, AllReduce)"),
    "nvl_lat": (1.36, "us", "measured-here", "notify/wait ping-pong over NVLink, one way (PERF, Primitives)"),
    "weft_t0": (1.4, "us", "measured-here", "weft's 1 KB collectives, 2.7-3.3 us, less one NVLink trip (PERF)"),
    "nccl_t0": (4.7, "us", "measured-here", "NCCL's 1 KB AllReduce, 6.1 us, less one NVLink trip (PERF)"),
    "gemm_tflops": (700.0, "TFLOP/s", "measured-here", "cuBLAS bf16 on the 9 per-rank TP shapes: 686-762 (PERF, GEMM)"),
    "hbm_bw": (4250.0, "GB/s", "measured-here", "HBM copy, 4 GiB, read + write (anchors)"),
    "gemm_t0": (3.0, "us", "assumed", "a GEMM's launch and last-wave tail"),
    "ov_ag": (1.02, "x", "measured-here", "fused AllGather+GEMM over ideal, 2 ranks: 1.007-1.034 (PERF)"),
    "ov_rs": (1.03, "x", "measured-here", "fused GEMM+ReduceScatter over ideal, K = 28672: 1.012-1.036 (PERF)"),
    "nic_bw": (50.0, "GB/s", "published", "NDR InfiniBand 400 Gb/s, one NIC per GPU (DeepEP README: ~50 GB/s)"),
    "nic_eff": (0.90, "x", "assumed", "share of the line rate GPU-initiated puts reach"),
    "nic_lat": (4.0, "us", "published", "put + signal across one IB switch: 'a few microseconds' (3-5), 4 taken"),
    "gpus_per_node": (8, "GPUs", "published", "HGX H200 / H800 node, NVSwitch, one rail per local rank"),
    "chunks": (8, "", "assumed", "pipeline depth of the AllReduce and EP stages"),
    "h800_nvl_bw": (160.0, "GB/s", "published", "H800 NVLink as DeepEP measured it (DeepEP README)"),
}

# Published peers' figures the tables are held against (anchors.md; DeepEP README).
DEEPEP_NORMAL = {16: (43, 43), 32: (58, 57), 64: (51, 50)}          # GB/s, dispatch / combine, H800
DEEPEP_LL = {16: (118, 195), 32: (155, 273), 64: (173, 314)}        # us, dispatch / combine, H800
PAPER_16 = {"ag_gemm": 1.33, "gemm_rs": 1.42}                        # over PyTorch + NCCL, 16 H800
# PERF.md's overlapped tables, 2 x H200, "x seq" of sweep 1 / sweep 2.
MEASURED_2 = {("ag_gemm", 8192, 28672, 8192): (1.105, 1.120), ("ag_gemm", 8192, 8192, 8192): (1.397, 1.391),
              ("gemm_rs", 8192, 8192, 28672): (1.131, 1.127), ("gemm_rs", 8192, 8192, 8192): (1.391, 1.395)}
MEASURED_2_BUS = {"ag": "343 / 257", "rs": "282 / 230", "ar": "322 / 300"}   # GB/s weft / NCCL, 256 MB

US, GB = 1e-6, 1e9


def topo(W, p):
    """GPUs per node L and nodes Nn; fewer than a node's GPUs is one node."""
    L = min(W, int(p["gpus_per_node"]))
    return L, W // L


def pipe(a, b, k):
    """Two stages over k chunks: the longer one, plus one chunk of the shorter (fill or drain)."""
    return max(a, b) + min(a, b) / k


def gemm_time(m, n, k, p):
    """cuBLAS-speed GEMM: compute-bound at the measured rate, HBM-bound for thin shapes."""
    # bf16 operands and output; no wave-quantisation or thin-shape loss (a known optimism).
    flops, moved = 2.0 * m * n * k, 2.0 * (m * k + n * k + m * n)
    return max(flops / (p["gemm_tflops"] * 1e12), moved / (p["hbm_bw"] * GB)) + p["gemm_t0"] * US


def nic(p):
    return p["nic_bw"] * p["nic_eff"] * GB


def ag_arrivals(S, W, p):
    """When each of the W shards (S bytes) is in this GPU's memory, hierarchical AllGather.

    Own shard at 0. Every GPU puts its shard around a ring of the GPUs with its
    local rank on the other nodes (a rail), so the shard of the node h hops away
    lands at h (a_nic + S/B_nic): one NIC sends one shard at a time. Shards held
    by a local peer (its own, then those its rail brought) are pushed over
    NVLink; this GPU receives them one after the other at the NVLink bandwidth.
    """
    L, Nn = topo(W, p)
    a_nvl, a_nic = p["nvl_lat"] * US, p["nic_lat"] * US
    rail = [h * (a_nic + S / nic(p)) for h in range(1, Nn)]   # written by the NIC: no NVLink hop
    # each local peer's own shard at once; the shards its rail brings as they land
    ready = sorted([0.0] * (L - 1) + [t for t in rail for _ in range(L - 1)])
    arrived, busy = [], 0.0
    for r in ready:
        busy = max(busy, r) + S / (p["nvl_bw"] * GB)   # the receive side is the one shared link
        arrived.append(busy + a_nvl)                    # the flag follows the data
    return sorted([0.0] + rail + arrived)


def ag_weft(S, W, p, g_total=0.0):
    """Hierarchical (AllGather+)GEMM of S-byte shards; g_total = the GEMM (0: AllGather alone).

    The GEMM (N/W columns over all M rows) is W equal pieces, one per shard,
    run in arrival order: a piece starts when its rows have landed (weft's
    tile waits). g_total includes ov_ag, what the fused GEMM lost to its waits
    and to the copies' traffic at 2 ranks.
    """
    t = 0.0
    for a in ag_arrivals(S, W, p):
        t = max(t, a) + g_total / W
    return p["weft_t0"] * US + t


def rs_weft(S, W, p, g_total=0.0):
    """Hierarchical (GEMM+)ReduceScatter of S bytes per rank; g_total = the GEMM (0: alone).

    The output is W blocks of S/W, ordered by destination node, remote nodes
    first (their partial sums have the longer way). Per node: the GEMM computes
    its L blocks; the L-1 owned by local peers are pushed over NVLink and summed
    there (weft's ReduceScatter bandwidth includes the sum); the node's partial
    of the block this GPU's rail owns is then put over the NIC to that node.
    Every GPU runs the same schedule, so its peers' partials arrive as its own
    leave. Last, the Nn node partials of its own block are summed from HBM.
    """
    L, Nn = topo(W, p)
    blk, g = S / W, g_total / W
    a_nvl, a_nic = p["nvl_lat"] * US, p["nic_lat"] * US
    t_gemm = t_nvl = t_nic = last_remote = own_ready = 0.0
    for j in range(Nn):
        for _ in range(L - 1):
            t_gemm += g
            t_nvl = max(t_nvl, t_gemm) + blk / (p["nvl_red_bw"] * GB)
        t_gemm += g
        ready = max(t_nvl + a_nvl, t_gemm)   # the peers' partials are in, and the own one computed
        if j < Nn - 1:                       # one NIC sends one block at a time
            t_nic = max(t_nic, ready) + blk / nic(p)
            last_remote = t_nic + a_nic
        else:
            own_ready = ready
    final = (Nn + 1) * blk / (p["hbm_bw"] * GB) if Nn > 1 else 0.0   # read Nn partials, write one
    return p["weft_t0"] * US + max(own_ready, last_remote) + final


def ar_weft(S, W, p):
    """Hierarchical AllReduce: ReduceScatter in the node, AllReduce of S/L across
    nodes on each rail, AllGather in the node, pipelined over `chunks`. Across
    nodes the plan takes the faster of direct puts to every rail peer (one
    latency, (Nn-1) S/L bytes) and recursive halving then doubling
    (2 log2(Nn) latencies, 2(Nn-1)/Nn S/L bytes)."""
    L, Nn = topo(W, p)
    a_nvl, a_nic = p["nvl_lat"] * US, p["nic_lat"] * US
    # both in-node halves send (L-1)/L of the buffer through the same NVLink send side
    nvl = (L - 1) / L * S * (1 / (p["nvl_red_bw"] * GB) + 1 / (p["nvl_bw"] * GB))
    head = p["weft_t0"] * US + 2 * a_nvl   # a flag trip per in-node half
    if Nn == 1:
        return head + nvl
    shard = S / L
    ways = [(a_nic, (Nn - 1) * shard / nic(p)),
            (2 * math.ceil(math.log2(Nn)) * a_nic, 2 * (Nn - 1) / Nn * shard / nic(p))]
    return head + min(lat + pipe(nvl, b, p["chunks"]) for lat, b in ways)


def nccl(op, S, W, p):
    """NCCL over all W GPUs (S = input bytes per rank, nccl-tests' convention): a flat ring,
    and for AllReduce across nodes also its tree, whichever is faster.

    Each link of a ring carries the collective's bus bytes. With one ring per
    rail, the L NICs of a node carry the rings' node crossings together, so a
    ring is held to min(NVLink, L x NIC). Latency: a chunk's path has one hop
    per step; ceil(steps Nn / W) of them cross nodes. The tree (a chain in each
    node, a binary tree across nodes, up then down) has fewer hops; its
    bandwidth term is taken as the ring's.
    """
    L, Nn = topo(W, p)
    a_nvl, a_nic = p["nvl_lat"] * US, p["nic_lat"] * US
    steps = 2 * (W - 1) if op == "ar" else W - 1
    bw = p["nccl_%s_bw" % op] * GB
    if Nn > 1:
        bw = min(bw, L * nic(p))
    crossings = 0 if Nn == 1 else math.ceil(steps * Nn / W)
    lat = steps * a_nvl + crossings * (a_nic - a_nvl)
    if op == "ar" and Nn > 1:
        lat = min(lat, 2 * ((L - 1) * a_nvl + math.ceil(math.log2(Nn)) * a_nic))
    return p["nccl_t0"] * US + lat + bus_bytes(op, S, W) / bw


def bus_bytes(op, S, W):
    """What a ring link carries; nccl-tests' bus bandwidth is this over the time."""
    return {"ag": (W - 1) * S, "rs": (W - 1) / W * S, "ar": 2 * (W - 1) / W * S}[op]


WEFT = {"ag": ag_weft, "rs": rs_weft, "ar": ar_weft}


def fused(op, m, n, k, W, p):
    """(GEMM alone, NCCL's collective, weft's collective, weft's fused operator), seconds,
    and S, the collective's bytes per rank. AllGather+GEMM: A's M rows sharded over W,
    each rank N/W columns. GEMM+ReduceScatter: K sharded, each rank keeps M/W rows."""
    if op == "ag_gemm":
        g, S, c, ov = gemm_time(m, n / W, k, p), m / W * k * 2, "ag", p["ov_ag"]
    else:
        g, S, c, ov = gemm_time(m, n, k / W, p), m * n * 2, "rs", p["ov_rs"]
    sim = ag_weft if c == "ag" else rs_weft
    return g, nccl(c, S, W, p), sim(S, W, p), sim(S, W, p, g * ov), S


def h800(p):
    """The paper's and DeepEP's machine: every NVLink bandwidth held to H800's."""
    q = dict(p)
    for key in ("nvl_bw", "nvl_red_bw", "nccl_ag_bw", "nccl_rs_bw", "nccl_ar_bw"):
        q[key] = min(q[key], p["h800_nvl_bw"])
    return q


# ---- expert parallelism (DeepSeek-V3 shapes: hidden 7168, 256 experts, top-8) ----
HIDDEN, TOPK = 7168, 8
FP8_TOKEN = HIDDEN + HIDDEN // 128 * 4 + 16    # fp8 payload, its scales, routing metadata
BF16_TOKEN = 2 * HIDDEN
NO_LIMIT = 10 ** 6                                # low-latency mode: top-8 over all experts


def ep_fanout(W, p, groups):
    """Expected distinct nodes and distinct ranks a token goes to: its top-8 experts
    fall uniformly on the `groups` nodes it may use (DeepEP's test: min(nodes, 4))."""
    L, Nn = topo(W, p)
    g = min(Nn, groups)
    return g * (1 - (1 - 1 / g) ** TOPK), g * L * (1 - (1 - 1 / (g * L)) ** TOPK)


def ep_two_hop(tokens, W, p, token_bytes, groups):
    """DeepEP's internode route: a token crosses the NIC once per distinct remote node
    (to the GPU of its own local rank there), then NVLink to each distinct rank
    that holds one of its experts. Combine is the same route backwards, summed at
    the rail GPU. NIC and NVLink stages pipelined."""
    L, Nn = topo(W, p)
    nodes, ranks = ep_fanout(W, p, groups)
    t_nic = tokens * nodes * (Nn - 1) / Nn * token_bytes / nic(p)
    t_nvl = tokens * ranks * (L - 1) / L * token_bytes / (p["nvl_bw"] * GB)
    lat = (p["weft_t0"] + p["nic_lat"] + p["nvl_lat"]) * US
    return lat + pipe(t_nic, t_nvl, p["chunks"])


def ep_direct(tokens, W, p, token_bytes, groups, per_expert):
    """One put per (token, expert) (DeepEP's low-latency route) or per (token, rank)
    (a flat all-to-all, as NCCL's): the remote share crosses the NIC, the rest NVLink."""
    L, Nn = topo(W, p)
    copies = TOPK if per_expert else ep_fanout(W, p, groups)[1]
    # experts are uniform over the ranks: (W - L) / W of the copies leave the node
    t_nic = tokens * copies * (W - L) / W * token_bytes / nic(p)
    t_nvl = tokens * copies * (L - 1) / W * token_bytes / (p["nvl_bw"] * GB)
    return (p["weft_t0"] + p["nic_lat"]) * US + max(t_nic, t_nvl)


def logical_bw(tokens, W, p, seconds, conv_bytes, groups):
    """DeepEP's 'bottleneck bandwidth': (token, node) pairs, own node included, x bytes / time."""
    return tokens * ep_fanout(W, p, groups)[0] * conv_bytes / seconds / GB


# ---- output ----
def table(headers, rows):
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(out + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def shapes_for(op, W):
    if op == "ag_gemm":
        return [(8192, 28672, 8192, "8192"), (8192, 8192, 8192, "8192"), (1024 * W, 28672, 8192, "1024 W")]
    return [(8192, 8192, 28672, "8192"), (8192, 8192, 8192, "8192"), (1024 * W, 8192, 28672, "1024 W")]


def bound(g, coll, S, op, W, p):
    L, Nn = topo(W, p)
    if g >= coll:
        return "GEMM"
    nvl_t = (L - 1) * Nn * S / (p["nvl_bw"] * GB) if op == "ag_gemm" else (L - 1) / L * S / (p["nvl_red_bw"] * GB)
    nic_t = (Nn - 1) * S / nic(p) if op == "ag_gemm" else (Nn - 1) * S / W / nic(p)
    return "NIC" if nic_t > nvl_t else "NVLink"


def render(p):
    ms, us = (lambda s: "%.3f" % (s * 1e3)), (lambda s: "%.0f" % (s * 1e6))
    names = {"ag_gemm": "AllGather+GEMM", "gemm_rs": "GEMM+ReduceScatter"}
    out = ["### Parameters",
           table(["name", "value", "unit", "kind", "source"],
                 [(k, p[k], v[1], v[2], v[3]) for k, v in PARAMS.items()]), ""]

    rows = []
    for (op, m, n, k), meas in MEASURED_2.items():
        g, nc, _, f, _ = fused(op, m, n, k, 2, p)
        rows.append((names[op] + ", x seq", "%d x %d x %d" % (m, n, k), "%.2f" % ((g + nc) / f), "%.3f / %.3f" % meas))
    for op, name in (("ag", "AllGather"), ("rs", "ReduceScatter"), ("ar", "AllReduce")):
        S = 256 * 2 ** 20
        rows.append((name + ", bus GB/s weft / NCCL", "256 MB per rank", "%.0f / %.0f" % (
            bus_bytes(op, S, 2) / WEFT[op](S, 2, p) / GB, bus_bytes(op, S, 2) / nccl(op, S, 2, p) / GB),
            MEASURED_2_BUS[op]))
    out += ["### The model at 2 GPUs against PERF.md",
            table(["figure", "shape or size", "model", "measured (sweep 1 / 2)"], rows), ""]

    rows, mean16 = [], {"ag_gemm": [[], []], "gemm_rs": [[], []]}
    for op in ("ag_gemm", "gemm_rs"):
        for W in (16, 32, 64):
            for m, n, k, label in shapes_for(op, W):
                g, nc, wc, f, S = fused(op, m, n, k, W, p)
                seq = g + nc
                gh, nch, _, fh, _ = fused(op, m, n, k, W, h800(p))
                if W == 16:
                    mean16[op][0].append(seq / f)
                    mean16[op][1].append((gh + nch) / fh)
                rows.append((names[op], "%s x %d x %d" % (label, n, k), W, ms(g), ms(nc), ms(wc), ms(seq), ms(f),
                             "%.2f" % (seq / f), "%.2f" % (f / max(g, wc)), bound(g, wc, S, op, W, p),
                             "%.2f" % ((gh + nch) / fh)))
    out += ["### Overlapped operators (8 GPUs per node; strong scaling, except M = 1024 W)",
            table(["operator", "M x N x K", "GPUs", "GEMM ms", "NCCL coll. ms", "weft coll. ms", "NCCL + cuBLAS ms",
                   "weft fused ms", "x seq", "x ideal", "bound", "x seq, H800 NVLink"], rows), ""]

    rows = []
    for op, name in (("ag", "AllGather"), ("rs", "ReduceScatter"), ("ar", "AllReduce")):
        for mb in (1, 16, 256):
            S, cells = mb * 2 ** 20, []
            for W in (16, 32, 64):
                tw, tn = WEFT[op](S, W, p), nccl(op, S, W, p)
                bus = bus_bytes(op, S, W) / GB
                cells.append("%.0f / %.0f (%.2fx)" % (bus / tw, bus / tn, tn / tw))
            rows.append([name, "%d MB" % mb] + cells)
    out += ["### Collectives: bus bandwidth, weft hierarchical / NCCL, GB/s (NCCL time / weft time)",
            table(["collective", "bytes per rank", "16 GPUs", "32 GPUs", "64 GPUs"], rows), ""]

    rows, ratios, h200, ll32 = [], {"dispatch": [], "combine": []}, {"dispatch": [], "combine": []}, None
    for W in (16, 32, 64):
        for i, (op, tb, conv) in enumerate((("dispatch", FP8_TOKEN, HIDDEN * (1 + 4 / 128)),
                                            ("combine", BF16_TOKEN, BF16_TOKEN))):
            t = ep_two_hop(4096, W, p, tb, 4)
            bw_h800 = logical_bw(4096, W, p, ep_two_hop(4096, W, h800(p), tb, 4), conv, 4)
            ratios[op].append(bw_h800 / DEEPEP_NORMAL[W][i])
            h200[op].append(logical_bw(4096, W, p, t, conv, 4))
            two, direct = ep_two_hop(128, W, p, tb, NO_LIMIT), ep_direct(128, W, p, tb, NO_LIMIT, True)
            if W == 32 and op == "dispatch":
                ll32 = [(ep_two_hop(128, W, q, tb, NO_LIMIT), ep_direct(128, W, q, tb, NO_LIMIT, True))
                        for q in (p, h800(p))]
            rows.append((W, op, us(t), "%.0f" % h200[op][-1], us(ep_direct(4096, W, p, tb, 4, False)),
                         "%.0f" % bw_h800, DEEPEP_NORMAL[W][i], us(two), us(direct), DEEPEP_LL[W][i]))
    out += ["### Expert parallelism: 4096 tokens per rank (top-4 nodes) and 128 (low latency, no node limit)",
            table(["GPUs", "op", "4096: two-hop us", "GB/s (DeepEP's count)", "flat us", "H800 NVLink GB/s",
                   "DeepEP, H800 GB/s", "128: two-hop us", "direct us", "DeepEP, H800 us"], rows), ""]

    def mean(xs):
        return sum(xs) / len(xs)

    ll = ["two-hop %s us vs direct %s us (%.2fx)" % (us(a), us(b), b / a) for a, b in ll32]
    rows = [("AllGather+GEMM over PyTorch + NCCL, 16 GPUs", "%.2fx" % PAPER_16["ag_gemm"],
             "%.2fx" % mean(mean16["ag_gemm"][0]), "%.2fx" % mean(mean16["ag_gemm"][1])),
            ("GEMM+ReduceScatter over PyTorch + NCCL, 16 GPUs", "%.2fx" % PAPER_16["gemm_rs"],
             "%.2fx" % mean(mean16["gemm_rs"][0]), "%.2fx" % mean(mean16["gemm_rs"][1])),
            ("dispatch over DeepEP, 16-64 GPUs", "1.18x", "%.0f-%.0f GB/s" % (min(h200["dispatch"]),
             max(h200["dispatch"])), "bound / DeepEP: %.2f-%.2fx" % (min(ratios["dispatch"]), max(ratios["dispatch"]))),
            ("combine over DeepEP, 16-64 GPUs", "1.44x", "%.0f-%.0f GB/s" % (min(h200["combine"]),
             max(h200["combine"])), "bound / DeepEP: %.2f-%.2fx" % (min(ratios["combine"]), max(ratios["combine"]))),
            ("low-latency dispatch, 32 GPUs", "137 us vs DeepEP 182 us (1.33x)", ll[0], ll[1])]
    out += ["### Against the published figures (means over the three shapes above)",
            table(["figure", "published", "model, H200", "model, H800 NVLink"], rows)]
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true", help="print the tables (the default)")
    ap.add_argument("--check", metavar="FILE", help="compare FILE's block between the markers with the output")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="override a parameter")
    args = ap.parse_args()
    p = {k: v[0] for k, v in PARAMS.items()}
    for s in args.set:
        name, _, value = s.partition("=")
        try:
            p[name] = float(value) if name in p else None
        except ValueError:
            p[name] = None
        if p[name] is None:
            ap.error("--set %s: expected NAME=VALUE, a number, with NAME one of %s" % (s, ", ".join(PARAMS)))
    out = render(p)
    if args.check:
        if args.set:
            ap.error("--check compares the documented parameters: drop --set")
        text = open(args.check, encoding="utf-8").read()
        if BEGIN not in text or END not in text:
            print("%s: no block between %s and %s" % (args.check, BEGIN, END))
            return 1
        have = text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"
        if have != out:
            sys.stdout.writelines(difflib.unified_diff(have.splitlines(True), out.splitlines(True),
                                                       args.check, "scale_model.py"))
            print("\n%s is out of step with the model: paste the output of scale_model.py between the markers"
                  % args.check)
            return 1
        return 0
    sys.stdout.write(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
