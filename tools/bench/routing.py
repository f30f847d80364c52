"""Rows per expert under weft-bench's routings, in Python without torch.

The same counts as weft::bench::routing_counts (tools/bench/routing.cpp),
computed in the same order of double operations, so a Python benchmark
(grouped_mm_torch.py) and a model (tools/model/moe_regions.py) take the
problem weft-bench times.
"""
import math

ZIPF_EXPONENT = 1.2


def routing_counts(routing, rows, experts):
    """Rows per expert, as weft::bench::routing_counts computes them (same order of double operations)."""
    if routing == "uniform":
        return [rows // experts + (1 if e < rows % experts else 0) for e in range(experts)]
    if routing == "one-hot":
        return [rows] + [0] * (experts - 1)
    if routing == "zipf-reversed":
        return routing_counts("zipf", rows, experts)[::-1]
    w = [math.pow(float(e + 1), -ZIPF_EXPONENT) for e in range(experts)]
    total = 0.0
    for x in w:
        total += x
    counts, frac = [], []
    for e in range(experts):
        exact = float(rows) * w[e] / total
        floored = math.floor(exact)
        counts.append(int(floored))
        frac.append(exact - floored)
    order = sorted(range(experts), key=lambda e: -frac[e])  # stable: ties keep the lower index first
    given, i = sum(counts), 0
    while given < rows:
        counts[order[i % experts]] += 1
        given += 1
        i += 1
    return counts
