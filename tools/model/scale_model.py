#!/usr/bin/env python3
"""Cost model of weft's planned inter-node schedules at 16, 32 and 64 GPUs.

Prints the tables of docs/SCALE.md: predictions computed from PARAMS
(each measured on 2 x H200, published, or assumed, as its row says), at one
node (8 GPUs, the sanity anchor) and at 2, 4 and 8 nodes.

    scale_model.py [--markdown]        print the tables (standard library only)
    scale_model.py --json              the same predictions as one JSON object
    scale_model.py --check FILE        exit 0 iff FILE's block between the markers equals the output
    scale_model.py --set nic_lat=3     the tables with other values (e.g. measured ones; repeatable)
"""
import argparse
import difflib
import json
import math
import sys

BEGIN, END = "<!-- scale_model.py begin -->", "<!-- scale_model.py end -->"

# name: (value, unit, kind, source). kind: "measured" (2 x H200, NV18, docs/PERF.md, the section
# named), "published" (the document named) or "assumed". NVLink bandwidths are bus bandwidths at
# 256 MB per rank, back-to-back loop: the fused operators move 64 MB - 1 GB a call, 256 MB is the middle.
PARAMS = {
    "nvl_bw": (343.4, "GB/s", "measured", "docs/PERF.md, Collectives > AllGather: weft's bus bandwidth, 256 MB per rank"),
    "nvl_red_bw": (281.6, "GB/s", "measured", "docs/PERF.md, Collectives > ReduceScatter: weft's bus bandwidth, 256 MB"),
    "nccl_ag_bw": (256.6, "GB/s", "measured", "docs/PERF.md, Collectives > AllGather: NCCL's bus bandwidth, 256 MB"),
    "nccl_rs_bw": (229.9, "GB/s", "measured", "docs/PERF.md, Collectives > ReduceScatter: NCCL's bus bandwidth, 256 MB"),
    "nccl_ar_bw": (300.1, "GB/s", "measured", "docs/PERF.md, Collectives > AllReduce: NCCL's bus bandwidth, 256 MB"),
    "nvl_lat": (1.36, "us", "measured", "docs/PERF.md, Primitives: notify/wait ping-pong over NVLink, one way"),
    "weft_t0": (1.4, "us", "measured", "docs/PERF.md, Collectives: weft's 1 KB calls, 2.7-3.3 us, less one NVLink trip"),
    "nccl_t0": (4.7, "us", "measured", "docs/PERF.md, Collectives > AllReduce: NCCL at 1 KB, 6.1 us, less one NVLink trip"),
    "gemm_tflops": (700.0, "TFLOP/s", "measured", "docs/PERF.md, GEMM against cuBLAS: cuBLAS bf16 on the 9 per-rank TP shapes, 686-762"),
    "hbm_bw": (4250.0, "GB/s", "measured", "one H200: a 4 GiB device-to-device copy in 2.021 ms, read + write (not in docs/PERF.md)"),
    "gemm_t0": (3.0, "us", "assumed", "a GEMM's launch and last-wave tail"),
    "ov_ag": (1.02, "x", "measured", "docs/PERF.md, Overlapped operators > AllGather+GEMM: x ideal 1.007-1.034"),
    "ov_rs": (1.03, "x", "measured", "docs/PERF.md, Overlapped operators > GEMM+ReduceScatter: x ideal at K = 28672, 1.012-1.036"),
    "nic_bw": (50.0, "GB/s", "published", "NDR InfiniBand 400 Gb/s, one NIC per GPU (DeepEP README: ~50 GB/s)"),
    "nic_eff": (0.90, "x", "assumed", "share of the line rate GPU-initiated puts reach"),
    "nic_lat": (4.0, "us", "published", "put + signal across one IB switch: 'a few microseconds' (3-5), 4 taken"),
    "gpus_per_node": (8, "GPUs", "published", "HGX H200 / H800 node, NVSwitch, one rail per local rank"),
    "chunks": (8, "", "assumed", "pipeline depth of the AllReduce and EP stages"),
    "h800_nvl_bw": (160.0, "GB/s", "published", "H800 NVLink as DeepEP measured it (DeepEP README)"),
}

# Published peers' figures the tables are held against (anchors.md; DeepEP README).
# DeepEP normal mode: 8 GPUs over NVLink (bytes per token-rank pair), 16-64 over RDMA (per token-node pair).
DEEPEP_NORMAL = {8: (153, 158), 16: (43, 43), 32: (58, 57), 64: (51, 50)}   # GB/s, dispatch / combine, H800
UCCL_EP_8_H200 = (320, 319)   # GB/s, dispatch / combine, 8 x H200 (the same count as DeepEP's at one node)
DEEPEP_LL = {16: (118, 195), 32: (155, 273), 64: (173, 314)}        # us, dispatch / combine, H800
# Triton-distributed over PyTorch + NCCL, H800, means over the paper's shapes: 8 = one node, 16 = two.
PAPER = {8: {"ag_gemm": 1.42, "gemm_rs": 1.28}, 16: {"ag_gemm": 1.33, "gemm_rs": 1.42}}
# Qwen3-32B MLP, 8 x H800, M = 2048 (hidden 5120, intermediate 25600; AllGather+GEMM on gate and up,
# GEMM+ReduceScatter on down): Triton-distributed 0.885 ms, PyTorch 1.077 ms.
QWEN3_MLP = {"m": 2048, "hidden": 5120, "inter": 25600, "paper_ms": 0.885, "torch_ms": 1.077}
# GEMM+ReduceScatter where overlap does not pay (8 x H100): Triton-distributed 0.323 ms, cuBLAS + NCCL 0.167.
SMALL_RS = {"m": 4096, "n": 4096, "k": 8192, "paper_ms": 0.323, "base_ms": 0.167}
# PERF.md's overlapped tables, 2 x H200, "x seq" of sweep 1 / sweep 2.
MEASURED_2 = {("ag_gemm", 8192, 28672, 8192): (1.105, 1.120), ("ag_gemm", 8192, 8192, 8192): (1.397, 1.391),
              ("gemm_rs", 8192, 8192, 28672): (1.131, 1.127), ("gemm_rs", 8192, 8192, 8192): (1.391, 1.395)}
MEASURED_2_BUS = {"ag": "343 / 257", "rs": "282 / 230", "ar": "322 / 300"}   # GB/s weft / NCCL, 256 MB

US, GB = 1e-6, 1e9
# The two-level ReduceScatter and AllReduce keep a node's sum in fp32 across the rail and round
# once at the end (docs/decisions/0066): their NIC bytes, and the final sum's reads, are fp32,
# twice the bf16 bytes of the partials they sum.
FP32_SUM = 2.0


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
    there (weft's ReduceScatter bandwidth includes the sum); the node's sum of
    the block this GPU's rail owns is then put over the NIC to that node, in
    fp32 (FP32_SUM x the block's bytes). Every GPU runs the same schedule, so
    its peers' partials arrive as its own leave. Last, the Nn node sums (fp32)
    of its own block are summed from HBM and rounded once.
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
            t_nic = max(t_nic, ready) + FP32_SUM * blk / nic(p)
            last_remote = t_nic + a_nic
        else:
            own_ready = ready
    final = (FP32_SUM * Nn + 1) * blk / (p["hbm_bw"] * GB) if Nn > 1 else 0.0   # read Nn fp32 sums, write one
    return p["weft_t0"] * US + max(own_ready, last_remote) + final


def ar_weft(S, W, p):
    """Hierarchical AllReduce: ReduceScatter in the node, AllReduce of S/L across
    nodes on each rail, AllGather in the node, pipelined over `chunks`. Across
    nodes the plan takes the faster of direct puts to every rail peer (one
    latency, (Nn-1) S/L bytes of bf16 partials, sent as fp32 node sums: x FP32_SUM)
    and recursive halving then doubling (2 log2(Nn) latencies, 2(Nn-1)/Nn S/L, x FP32_SUM)."""
    L, Nn = topo(W, p)
    a_nvl, a_nic = p["nvl_lat"] * US, p["nic_lat"] * US
    # both in-node halves send (L-1)/L of the buffer through the same NVLink send side
    nvl = (L - 1) / L * S * (1 / (p["nvl_red_bw"] * GB) + 1 / (p["nvl_bw"] * GB))
    head = p["weft_t0"] * US + 2 * a_nvl   # a flag trip per in-node half
    if Nn == 1:
        return head + nvl
    shard = S / L
    ways = [(a_nic, FP32_SUM * (Nn - 1) * shard / nic(p)),
            (2 * math.ceil(math.log2(Nn)) * a_nic, FP32_SUM * 2 * (Nn - 1) / Nn * shard / nic(p))]
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


def ar_gemm_ways(m, n, k, W, p):
    """GEMM+AllReduce across nodes, the ways its fused schedule could take (seconds): each rank
    computes the M x N partial over its K / W and every rank ends with the sum; S = M N 2 bytes.

    sequential: the GEMM, then weft's hierarchical AllReduce (ar_weft), what GemmAr runs now.
    blocks:     GemmRs's block steps (rs_weft with the GEMM, W blocks of S / W), then the
                hierarchical AllGather of the W summed blocks (ag_weft of S / W shards): 3 (Nn-1)
                S / W bytes per NIC (node sums in fp32, then bf16 blocks) against the AllReduce's
                2 (Nn-1) S / L (direct).
    slices:     the GEMM in L row slices, ordered as the AllReduce's in-node ReduceScatter pushes
                them (the own slice last), so that those NVLink pushes hide under the GEMM; the
                rail AllReduce of the own slice (direct or halving-doubling, the faster) and the
                in-node AllGather, pipelined over `chunks`, follow the GEMM.
    """
    L, Nn = topo(W, p)
    S = m * n * 2.0
    g = gemm_time(m, n, k / W, p)
    a_nvl, a_nic = p["nvl_lat"] * US, p["nic_lat"] * US
    sequential = g + ar_weft(S, W, p)
    blocks = rs_weft(S, W, p, g * p["ov_rs"]) + ag_weft(S / W, W, p)
    # slices: slice i (1..L-1) leaves once computed, one push at a time on the send side
    slice_b, g_s = S / L, g * p["ov_rs"] / L
    t_nvl = 0.0
    for i in range(1, L):
        t_nvl = max(t_nvl, i * g_s) + slice_b / (p["nvl_red_bw"] * GB)
    ready = max(L * g_s, t_nvl + a_nvl)   # the own slice computed, and the peers' partials of it in
    if Nn > 1:
        rails = [(a_nic, FP32_SUM * (Nn - 1) * slice_b / nic(p)),
                 (2 * math.ceil(math.log2(Nn)) * a_nic, FP32_SUM * 2 * (Nn - 1) / Nn * slice_b / nic(p))]
    else:
        rails = [(0.0, 0.0)]
    gather = (L - 1) / L * S / (p["nvl_bw"] * GB)
    slices = p["weft_t0"] * US + ready + a_nvl + min(lat + pipe(b, gather, p["chunks"]) for lat, b in rails)
    return {"gemm_s": g, "sequential_s": sequential, "blocks_s": blocks, "slices_s": slices}


AR_GEMM_SHAPES = ((8192, 8192, 28672), (8192, 8192, 8192), (1024, 8192, 28672))


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
    lat = (p["weft_t0"] + (p["nic_lat"] if Nn > 1 else 0.0) + p["nvl_lat"]) * US
    return lat + pipe(t_nic, t_nvl, p["chunks"])


def ep_direct(tokens, W, p, token_bytes, groups, per_expert):
    """One put per (token, expert) (DeepEP's low-latency route) or per (token, rank)
    (a flat all-to-all, as NCCL's): the remote share crosses the NIC, the rest NVLink."""
    L, Nn = topo(W, p)
    copies = TOPK if per_expert else ep_fanout(W, p, groups)[1]
    # experts are uniform over the ranks: (W - L) / W of the copies leave the node
    t_nic = tokens * copies * (W - L) / W * token_bytes / nic(p)
    t_nvl = tokens * copies * (L - 1) / W * token_bytes / (p["nvl_bw"] * GB)
    return (p["weft_t0"] + (p["nic_lat"] if W > L else p["nvl_lat"])) * US + max(t_nic, t_nvl)


def logical_bw(tokens, W, p, seconds, conv_bytes, groups):
    """DeepEP's bandwidth: across nodes (token, node) pairs, own node included, x bytes / time
    (its 'RDMA bottleneck'); within one node (token, rank) pairs."""
    nodes, ranks = ep_fanout(W, p, groups)
    return tokens * (nodes if topo(W, p)[1] > 1 else ranks) * conv_bytes / seconds / GB


# ---- output ----
def table(headers, rows):
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(out + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def shapes_for(op, W):
    """The layer's M x N x K: two strong-scaling shapes (M = 8192) and one weak (M = 1024 W; at 8 GPUs
    that is the first shape, so it is left out)."""
    if op == "ag_gemm":
        shapes = [(8192, 28672, 8192, "8192"), (8192, 8192, 8192, "8192"), (1024 * W, 28672, 8192, "1024 W")]
    else:
        shapes = [(8192, 8192, 28672, "8192"), (8192, 8192, 8192, "8192"), (1024 * W, 8192, 28672, "1024 W")]
    return shapes if 1024 * W != 8192 else shapes[:2]


def bound(g, coll, S, op, W, p):
    L, Nn = topo(W, p)
    if g >= coll:
        return "GEMM"
    nvl_t = (L - 1) * Nn * S / (p["nvl_bw"] * GB) if op == "ag_gemm" else (L - 1) / L * S / (p["nvl_red_bw"] * GB)
    nic_t = (Nn - 1) * S / nic(p) if op == "ag_gemm" else FP32_SUM * (Nn - 1) * S / W / nic(p)
    return "NIC" if nic_t > nvl_t else "NVLink"


NAMES = {"ag_gemm": "AllGather+GEMM", "gemm_rs": "GEMM+ReduceScatter"}
COLLS = (("ag", "AllGather"), ("rs", "ReduceScatter"), ("ar", "AllReduce"))
WORLDS = (8, 16, 32, 64)          # one node (the anchor), then 2, 4 and 8 nodes
EP_OPS = (("dispatch", FP8_TOKEN, HIDDEN * (1 + 4 / 128)), ("combine", BF16_TOKEN, BF16_TOKEN))


def mean(xs):
    return sum(xs) / len(xs)


def overlapped_row(op, m, n, k, label, W, p):
    """One fused operator at one world size: times in seconds, ratios, the H800 ratio, the paper's."""
    g, nc, wc, f, S = fused(op, m, n, k, W, p)
    gh, nch, _, fh, _ = fused(op, m, n, k, W, h800(p))
    return {"op": op, "shape": "%s x %d x %d" % (label, n, k), "m": m, "n": n, "k": k, "gpus": W,
            "bytes_per_rank": S, "gemm_s": g, "nccl_coll_s": nc, "weft_coll_s": wc, "baseline_s": g + nc,
            "weft_s": f, "x_seq": (g + nc) / f, "x_ideal": f / max(g, wc), "bound": bound(g, wc, S, op, W, p),
            "x_seq_h800": (gh + nch) / fh, "paper_x_seq": PAPER.get(W, {}).get(op)}


def qwen3_mlp(p):
    """Qwen3-32B's MLP at 8 GPUs: AllGather+GEMM on gate and up, then GEMM+ReduceScatter on down."""
    q, out = QWEN3_MLP, {}
    for key, prm in (("h200", p), ("h800", h800(p))):
        ag = fused("ag_gemm", q["m"], 2 * q["inter"], q["hidden"], 8, prm)
        rs = fused("gemm_rs", q["m"], q["hidden"], q["inter"], 8, prm)
        out[key] = {"baseline_s": ag[0] + ag[1] + rs[0] + rs[1], "weft_s": ag[3] + rs[3]}
    return out


def predict(p):
    """Every prediction the tables print, as plain data (seconds, GB/s, ratios)."""
    res = {"params": {k: {"value": p[k], "unit": v[1], "kind": v[2], "source": v[3]} for k, v in PARAMS.items()}}

    rows = []
    for (op, m, n, k), meas in MEASURED_2.items():
        g, nc, _, f, _ = fused(op, m, n, k, 2, p)
        rows.append({"figure": NAMES[op] + ", x seq", "size": "%d x %d x %d" % (m, n, k),
                     "model": (g + nc) / f, "measured": list(meas)})
    for op, name in COLLS:
        S = 256 * 2 ** 20
        rows.append({"figure": name + ", bus GB/s weft / NCCL", "size": "256 MB per rank",
                     "model": [bus_bytes(op, S, 2) / WEFT[op](S, 2, p) / GB, bus_bytes(op, S, 2) / nccl(op, S, 2, p) / GB],
                     "measured": MEASURED_2_BUS[op]})
    res["two_gpus"] = rows

    res["ar_gemm"] = [dict(ar_gemm_ways(m, n, k, W, p), gpus=W, shape="%d x %d x %d" % (m, n, k))
                      for W in WORLDS[1:] for m, n, k in AR_GEMM_SHAPES]

    res["overlapped"] = [overlapped_row(op, m, n, k, label, W, p)
                         for op in ("ag_gemm", "gemm_rs") for W in WORLDS for m, n, k, label in shapes_for(op, W)]

    rows = []
    for op, name in COLLS:
        for mb in (1, 16, 256):
            S = mb * 2 ** 20
            for W in WORLDS:
                tw, tn = WEFT[op](S, W, p), nccl(op, S, W, p)
                rows.append({"collective": name, "op": op, "bytes_per_rank": S, "gpus": W, "weft_s": tw, "nccl_s": tn,
                             "weft_bus_gbps": bus_bytes(op, S, W) / tw / GB, "nccl_bus_gbps": bus_bytes(op, S, W) / tn / GB})
    res["collectives"] = rows

    rows = []
    for W in WORLDS:
        for i, (op, tb, conv) in enumerate(EP_OPS):
            t = ep_two_hop(4096, W, p, tb, 4)
            row = {"gpus": W, "op": op, "two_hop_s": t, "gbps": logical_bw(4096, W, p, t, conv, 4),
                   "flat_s": ep_direct(4096, W, p, tb, 4, False),
                   "gbps_h800": logical_bw(4096, W, p, ep_two_hop(4096, W, h800(p), tb, 4), conv, 4),
                   "deepep_gbps": DEEPEP_NORMAL[W][i]}
            if W in DEEPEP_LL:  # the low-latency mode at the sizes with DeepEP's published figures
                row.update({"ll_two_hop_s": ep_two_hop(128, W, p, tb, NO_LIMIT),
                            "ll_direct_s": ep_direct(128, W, p, tb, NO_LIMIT, True), "deepep_ll_us": DEEPEP_LL[W][i],
                            "ll_two_hop_h800_s": ep_two_hop(128, W, h800(p), tb, NO_LIMIT),
                            "ll_direct_h800_s": ep_direct(128, W, h800(p), tb, NO_LIMIT, True)})
            rows.append(row)
    res["ep"] = rows

    ov = res["overlapped"]
    per = {(W, op): [r for r in ov if r["gpus"] == W and r["op"] == op] for W in WORLDS for op in NAMES}
    small = {key: fused("gemm_rs", SMALL_RS["m"], SMALL_RS["n"], SMALL_RS["k"], 8, prm)
             for key, prm in (("h200", p), ("h800", h800(p)))}
    ep8 = [r for r in res["ep"] if r["gpus"] == 8]
    res["published"] = {
        "mean_x_seq": {"%d/%s" % (W, op): {"h200": mean([r["x_seq"] for r in per[W, op]]),
                                           "h800": mean([r["x_seq_h800"] for r in per[W, op]]),
                                           "paper": PAPER[W][op]} for W in (8, 16) for op in NAMES},
        "qwen3_mlp": dict(qwen3_mlp(p), paper_ms=QWEN3_MLP["paper_ms"], torch_ms=QWEN3_MLP["torch_ms"]),
        "small_gemm_rs": {key: {"baseline_s": v[0] + v[1], "weft_s": v[3]} for key, v in small.items()},
        "ep_one_node": {r["op"]: {"gbps": r["gbps"], "gbps_h800": r["gbps_h800"], "deepep_gbps": r["deepep_gbps"]}
                        for r in ep8},
        "ep": {op: {"gbps": [r["gbps"] for r in res["ep"] if r["op"] == op and r["gpus"] > 8],
                    "ratio_h800": [r["gbps_h800"] / r["deepep_gbps"] for r in res["ep"] if r["op"] == op and r["gpus"] > 8]}
               for op, _, _ in EP_OPS},
        "ll32": [(r["ll_two_hop_s"], r["ll_direct_s"], r["ll_two_hop_h800_s"], r["ll_direct_h800_s"])
                 for r in res["ep"] if r["gpus"] == 32 and r["op"] == "dispatch"][0],
    }
    return res


def render(p):
    """The markdown tables of docs/SCALE.md."""
    res = predict(p)
    ms, us = (lambda s: "%.3f" % (s * 1e3)), (lambda s: "%.0f" % (s * 1e6))
    x = lambda v: "%.2f" % v  # noqa: E731
    out = ["### Parameters",
           table(["name", "value", "unit", "kind", "source"],
                 [(k, v["value"], v["unit"], v["kind"], v["source"]) for k, v in res["params"].items()]), ""]

    rows = []
    for r in res["two_gpus"]:
        if isinstance(r["model"], list):
            rows.append((r["figure"], r["size"], "%.0f / %.0f" % tuple(r["model"]), r["measured"]))
        else:
            rows.append((r["figure"], r["size"], x(r["model"]), "%.3f / %.3f" % tuple(r["measured"])))
    out += ["### The model at 2 GPUs against PERF.md (measured)",
            table(["figure", "shape or size", "model", "measured (sweep 1 / 2)"], rows), ""]

    pub = res["published"]
    mx, q, sm = pub["mean_x_seq"], pub["qwen3_mlp"], pub["small_gemm_rs"]
    rows = [("%s over PyTorch + NCCL (mean of the 2 shapes)" % NAMES[op], "%.2fx (its shapes)" % mx["8/" + op]["paper"],
             "%.2fx" % mx["8/" + op]["h200"], "%.2fx" % mx["8/" + op]["h800"]) for op in NAMES]
    rows.append(("Qwen3-32B MLP, M = 2048: AllGather+GEMM then GEMM+ReduceScatter, over PyTorch",
                 "%.3f vs %.3f ms (%.2fx)" % (q["paper_ms"], q["torch_ms"], q["torch_ms"] / q["paper_ms"]),
                 "%s vs %s ms (%.2fx)" % (ms(q["h200"]["weft_s"]), ms(q["h200"]["baseline_s"]),
                                          q["h200"]["baseline_s"] / q["h200"]["weft_s"]),
                 "%.2fx" % (q["h800"]["baseline_s"] / q["h800"]["weft_s"])))
    rows.append(("GEMM+ReduceScatter 4096 x 4096 x 8192 over cuBLAS + NCCL (8 x H100)",
                 "%.3f vs %.3f ms (%.2fx)" % (SMALL_RS["paper_ms"], SMALL_RS["base_ms"], SMALL_RS["base_ms"] / SMALL_RS["paper_ms"]),
                 "%s vs %s ms (%.2fx)" % (ms(sm["h200"]["weft_s"]), ms(sm["h200"]["baseline_s"]),
                                          sm["h200"]["baseline_s"] / sm["h200"]["weft_s"]),
                 "%.2fx" % (sm["h800"]["baseline_s"] / sm["h800"]["weft_s"])))
    for i, op in enumerate(("dispatch", "combine")):
        e = pub["ep_one_node"][op]
        rows.append(("EP %s, 4096 tokens, GB/s (token-rank pairs), the model's bound" % op,
                     "DeepEP %d GB/s; UCCL-EP %d on 8 x H200" % (e["deepep_gbps"], UCCL_EP_8_H200[i]),
                     "%.0f GB/s (UCCL-EP at %.2f of it)" % (e["gbps"], UCCL_EP_8_H200[i] / e["gbps"]),
                     "%.0f GB/s (DeepEP at %.2f of it)" % (e["gbps_h800"], e["deepep_gbps"] / e["gbps_h800"])))
    out += ["### One node (8 GPUs) against the published single-node figures (the anchor)",
            table(["figure", "published (8 x H800 unless said)", "model, H200", "model, H800 NVLink"], rows), ""]

    rows = []
    for r in res["overlapped"]:
        paper = "-" if r["paper_x_seq"] is None else "%.2f (mean)" % r["paper_x_seq"]
        rows.append((NAMES[r["op"]], r["shape"], r["gpus"], ms(r["gemm_s"]), ms(r["nccl_coll_s"]), ms(r["weft_coll_s"]),
                     ms(r["baseline_s"]), ms(r["weft_s"]), x(r["x_seq"]), x(r["x_ideal"]), r["bound"],
                     x(r["x_seq_h800"]), paper))
    out += ["### Overlapped operators (8 GPUs per node; strong scaling, except M = 1024 W)",
            table(["operator", "M x N x K", "GPUs", "GEMM ms", "NCCL coll. ms", "weft coll. ms", "NCCL + cuBLAS ms",
                   "weft fused ms", "x seq", "x ideal", "bound", "x seq, H800 NVLink", "paper x seq, H800"], rows), ""]

    rows = [(r["shape"], r["gpus"], ms(r["gemm_s"]), ms(r["sequential_s"]), ms(r["blocks_s"]), ms(r["slices_s"]),
             x(r["sequential_s"] / r["blocks_s"]), x(r["sequential_s"] / r["slices_s"]))
            for r in res["ar_gemm"]]
    out += ["### GEMM+AllReduce across nodes: two candidate fused schedules against the sequential path",
            table(["M x N x K", "GPUs", "GEMM ms", "sequential ms", "blocks, then AllGather ms",
                   "slices under the in-node ReduceScatter ms", "x seq, blocks", "x seq, slices"], rows), ""]

    rows, cells = [], {}
    for r in res["collectives"]:
        cells.setdefault((r["collective"], r["bytes_per_rank"]), []).append(
            "%.0f / %.0f (%.2fx)" % (r["weft_bus_gbps"], r["nccl_bus_gbps"], r["nccl_s"] / r["weft_s"]))
    for (name, S), c in cells.items():
        rows.append([name, "%d MB" % (S // 2 ** 20)] + c)
    out += ["### Collectives: bus bandwidth, weft hierarchical / NCCL, GB/s (NCCL time / weft time)",
            table(["collective", "bytes per rank"] + ["%d GPUs" % W for W in WORLDS], rows), ""]

    rows = [(r["gpus"], r["op"], us(r["two_hop_s"]), "%.0f" % r["gbps"], us(r["flat_s"]), "%.0f" % r["gbps_h800"],
             r["deepep_gbps"], us(r["ll_two_hop_s"]), us(r["ll_direct_s"]), r["deepep_ll_us"])
            for r in res["ep"] if r["gpus"] in DEEPEP_LL]
    out += ["### Expert parallelism: 4096 tokens per rank (top-4 nodes) and 128 (low latency, no node limit)",
            table(["GPUs", "op", "4096: two-hop us", "GB/s (DeepEP's count)", "flat us", "H800 NVLink GB/s",
                   "DeepEP, H800 GB/s", "128: two-hop us", "direct us", "DeepEP, H800 us"], rows), ""]

    ep, ll = pub["ep"], pub["ll32"]
    rows = [("%s over PyTorch + NCCL, 16 GPUs" % NAMES[op], "%.2fx" % mx["16/" + op]["paper"],
             "%.2fx" % mx["16/" + op]["h200"], "%.2fx" % mx["16/" + op]["h800"]) for op in NAMES]
    for op, paper in (("dispatch", "1.18x"), ("combine", "1.44x")):
        rows.append(("%s over DeepEP, 16-64 GPUs" % op, paper, "%.0f-%.0f GB/s" % (min(ep[op]["gbps"]), max(ep[op]["gbps"])),
                     "bound / DeepEP: %.2f-%.2fx" % (min(ep[op]["ratio_h800"]), max(ep[op]["ratio_h800"]))))
    rows.append(("low-latency dispatch, 32 GPUs", "137 us vs DeepEP 182 us (1.33x)",
                 "two-hop %s us vs direct %s us (%.2fx)" % (us(ll[0]), us(ll[1]), ll[1] / ll[0]),
                 "two-hop %s us vs direct %s us (%.2fx)" % (us(ll[2]), us(ll[3]), ll[3] / ll[2])))
    out += ["### Against the published multi-node figures (means over the three shapes above)",
            table(["figure", "published", "model, H200", "model, H800 NVLink"], rows)]
    return "\n".join(out) + "\n"


def parse_params(sets):
    """PARAMS' values with NAME=VALUE overrides; raises ValueError naming the bad one."""
    p = {k: v[0] for k, v in PARAMS.items()}
    for s in sets:
        name, eq, value = s.partition("=")
        if name not in p or not eq:
            raise ValueError("--set %s: expected NAME=VALUE with NAME one of %s" % (s, ", ".join(PARAMS)))
        try:
            p[name] = float(value)
        except ValueError:
            raise ValueError("--set %s: %r is not a number" % (s, value))
        if not p[name] > 0 and name not in ("gemm_t0", "weft_t0", "nccl_t0", "nvl_lat", "nic_lat"):
            raise ValueError("--set %s: must be positive" % s)
    if p["gpus_per_node"] != int(p["gpus_per_node"]) or p["chunks"] != int(p["chunks"]):
        raise ValueError("--set: gpus_per_node and chunks must be whole numbers")
    return p


def doc_block(text):
    """The part of a page between the markers, or None."""
    if BEGIN not in text or END not in text:
        return None
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true", help="print the tables (the default)")
    ap.add_argument("--json", action="store_true", help="print the predictions as one JSON object (seconds, GB/s)")
    ap.add_argument("--check", metavar="FILE", help="compare FILE's block between the markers with the output")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="override a parameter")
    args = ap.parse_args(argv)
    try:
        p = parse_params(args.set)
    except ValueError as e:
        ap.error(str(e))
    if args.json and (args.markdown or args.check):
        ap.error("--json prints the data alone: drop --markdown and --check")
    if args.json:
        json.dump(predict(p), sys.stdout, indent=1, sort_keys=True)
        sys.stdout.write("\n")
        return 0
    out = render(p)
    if args.check:
        if args.set:
            ap.error("--check compares the documented parameters: drop --set")
        with open(args.check, encoding="utf-8") as f:
            have = doc_block(f.read())
        if have is None:
            print("%s: no block between %s and %s" % (args.check, BEGIN, END))
            return 1
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
