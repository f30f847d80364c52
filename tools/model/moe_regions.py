#!/usr/bin/env python3
"""Row tiles of MoE-TP's up-projection GEMM: packed by expert, against split into source regions.

Decision 0071 plans the overlapped AllGather + MoE as one grouped GEMM per
arriving shard, over that rank's pairs of each expert (its "source region").
Every region has its own last, partial tile, so the GEMM walks more row tiles
than the packed one. This model counts them:

  - pairs per expert: weft-bench's routing counts (tools/bench/routing.py) of
    T x k pairs over E experts, on weft-bench moe_tp's three default shapes;
  - each expert's pairs split evenly over the W source ranks (tokens are split
    evenly and the routing does not depend on the rank);
  - tiles per group: ceil(rows / tile_m) rounded up to whole clusters along M,
    as CUTLASS's grouped scheduler walks them (gemm_detail::grouped_tiles).

Column tiles multiply both counts alike, so the ratio is the GEMM's extra work
where tiles, not bytes, bound it. A model, not a measurement.

Batches (--batches): within an expert the rows run in source order, so the
regions of consecutive sources are one run of rows, and one GEMM over sources
[a, b) pays one partial tile per expert, not b - a. A rank takes its own
region alone (it starts at once), then the others in arrival order, `batch`
sources a GEMM, cut where the order wraps from source W - 1 to 0 (the rows
stop being one run there). batch 1 is what AgMoe runs today; batch W - 1 is
two or three GEMMs, the last starting once every shard is here. The ratio is
the mean over the ranks.

    moe_regions.py [--worlds 2,4,8] [--tile-m 128] [--markdown] [--batches 1,2,4]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
from routing import routing_counts  # noqa: E402  (tools/bench/routing.py)

# weft-bench moe_tp's default cases: (name, tokens T, experts E, top-k)
SHAPES = [("Mixtral-like", 8192, 8, 2), ("Qwen3-30B-A3B-like", 8192, 128, 8), ("DeepSeek-like", 4096, 32, 8)]
# The compiled grouped tiles' clusters along M (src/gemm/kernel_table.cmake: 128x256 c2x1, 128x128 c1x1).
CLUSTERS_M = (2, 1)


def group_tiles(rows, tile_m, cluster_m):
    """Row tiles of one group of `rows` rows, whole clusters along M (0 for an empty group)."""
    tiles = -(-rows // tile_m)
    return -(-tiles // cluster_m) * cluster_m


def source_split(rows, world):
    """An expert's rows split evenly over `world` sources: source s holds [rows s / W, rows (s + 1) / W)."""
    return [rows * (s + 1) // world - rows * s // world for s in range(world)]


def batch_plan(me, world, batch):
    """The source ranges [a, b) of rank `me`'s GEMMs, in arrival order: its own
    first, then `batch` sources at a time in arrival order (me + 1, me + 2, ...),
    each cut where the sources wrap from world - 1 to 0."""
    plan = [(me, me + 1)]
    order = [(me + i) % world for i in range(1, world)]
    for i in range(0, len(order), batch):
        group = order[i:i + batch]
        start = group[0]
        for prev, src in zip(group, group[1:]):
            if src != prev + 1:  # wrapped past world - 1
                plan.append((start, prev + 1))
                start = src
        plan.append((start, group[-1] + 1))
    return plan


def batched_tiles(counts, world, batch, tile_m, cluster_m):
    """Row tiles of every rank's GEMMs under batch_plan, averaged over the ranks."""
    total = 0
    for me in range(world):
        for c in counts:
            split = source_split(c, world)
            total += sum(group_tiles(sum(split[a:b]), tile_m, cluster_m) for a, b in batch_plan(me, world, batch))
    return total / world


def cases(worlds, tile_m):
    """Every (shape, routing, world, cluster) with its counts per expert and its packed row tiles."""
    for name, tokens, experts, top_k in SHAPES:
        for routing in ("uniform", "zipf"):
            counts = routing_counts(routing, tokens * top_k, experts)
            for world in worlds:
                for cm in CLUSTERS_M:
                    yield {"shape": name, "tokens": tokens, "experts": experts, "top_k": top_k, "routing": routing,
                           "world": world, "cluster_m": cm, "counts": counts,
                           "packed_tiles": sum(group_tiles(c, tile_m, cm) for c in counts)}


def batch_table(worlds, batches, tile_m):
    out = []
    for case in cases(worlds, tile_m):
        counts = case.pop("counts")
        for batch in batches:
            tiles = batched_tiles(counts, case["world"], batch, tile_m, case["cluster_m"])
            out.append(dict(case, batch=batch, ratio=tiles / case["packed_tiles"]))
    return out


def table(worlds, tile_m):
    out = []
    for case in cases(worlds, tile_m):
        counts = case.pop("counts")
        regions = sum(group_tiles(r, tile_m, case["cluster_m"]) for c in counts
                      for r in source_split(c, case["world"]))
        out.append(dict(case, region_tiles=regions, ratio=regions / case["packed_tiles"]))
    return out


def print_markdown(rows, columns, column_key, column_name):
    """One row per shape and routing, one column per `columns` entry: each row's ratio where column_key(row) is it."""
    print("| shape (T, E, k) | routing | " + " | ".join(column_name(c) for c in columns) + " |")
    print("|---|---|" + "---|" * len(columns))
    for name, tokens, experts, top_k in SHAPES:
        for routing in ("uniform", "zipf"):
            r = {column_key(x): x for x in rows if x["shape"] == name and x["routing"] == routing}
            print(f"| {name} ({tokens}, {experts}, {top_k}) | {routing} | "
                  + " | ".join(f"{r[c]['ratio']:.2f}" for c in columns) + " |")


def int_list(p, flag, text):
    """Comma-separated positive integers, or a parser error naming `flag`."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        p.error(f"{flag} takes comma-separated integers, got {text!r}")
    if any(v < 1 for v in values):
        p.error(f"{flag} takes positive integers")
    return values


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worlds", default="2,4,8", help="world sizes, comma-separated (default 2,4,8)")
    p.add_argument("--tile-m", type=int, default=128, help="rows of a tile (default 128, every grouped tile's)")
    p.add_argument("--markdown", action="store_true", help="a markdown table, one row per shape and routing")
    p.add_argument("--batches", help="sources per GEMM after a rank's own, comma-separated: the batched table instead")
    a = p.parse_args()
    worlds = int_list(p, "--worlds", a.worlds)
    if a.tile_m < 1:
        p.error("--tile-m takes positive integers")
    if a.batches is not None:
        batches = int_list(p, "--batches", a.batches)
        print_markdown(batch_table(worlds, batches, a.tile_m),
                       [(w, cm, b) for w in worlds for cm in CLUSTERS_M for b in batches],
                       lambda x: (x["world"], x["cluster_m"], x["batch"]),
                       lambda c: f"W {c[0]}, c{c[1]}x1, batch {c[2]}")
        return 0
    rows = table(worlds, a.tile_m)
    if a.markdown:
        print_markdown(rows, [(w, cm) for w in worlds for cm in CLUSTERS_M],
                       lambda x: (x["world"], x["cluster_m"]), lambda c: f"W {c[0]}, c{c[1]}x1")
        return 0
    print(f"row tiles of {a.tile_m} rows, by source regions / packed by expert (the GEMM's extra tiles)")
    for x in rows:
        print(f"{x['shape']:<20} {x['routing']:<8} W {x['world']}  c{x['cluster_m']}x1  "
              f"packed {x['packed_tiles']:>5}  regions {x['region_tiles']:>5}  ratio {x['ratio']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
