#!/usr/bin/env python3
"""Where each profiled ring-step kernel's warps wait (twentieth session, next_probe.sh profile).

Reads NAME_sass.csv.gz (Nsight Compute's source page, SASS, per instruction: warp-state samples and
executed counts) for each NAME given, and prints:
  - the samples by how often an instruction runs, which tells the warp roles apart at
    1024 x 8192 x 4096 with 128x256 tiles (256 tiles; 8 consumer warps and 1 producer warp each):
    per k-block (consumer mainloop, >= 100000), once per tile per consumer warp (~2048),
    several times per tile (consumer epilogue loops and producer spins), once per tile per producer
    warp (~256), rare (setup, first tiles);
  - the consumers' wait for the first k-block of each tile: the first branch back to a try-wait
    executed once per tile per consumer warp, just before the mainloop (its samples: long_sb);
  - the top instructions by samples outside the mainloop.
Usage: python3 stall_table.py [--tiles T] [--dir D] plain source noreuse prefetch
(T: the run's tile count, 256 at 1024 x 8192 x 4096 with 128x256 tiles; D: where the .csv.gz files are)
"""
import collections
import csv
import gzip
import io
import sys


def load(name, folder):
    with gzip.open(f"{folder}/{name}_sass.csv.gz", "rt") as f:
        rows = list(csv.reader(io.StringIO(f.read())))
    header = rows[1]
    return header, [r for r in rows[2:] if len(r) == len(header)]


def main(args):
    tiles, folder, names = 256, ".", []
    while args:
        a = args.pop(0)
        if a == "--tiles": tiles = int(args.pop(0))
        elif a == "--dir": folder = args.pop(0)
        else: names.append(a)
    per_tile = lambda e: 7.4 * tiles <= e <= 8.6 * tiles     # 8 consumer warps
    per_tile_producer = lambda e: 0.8 * tiles <= e <= 1.2 * tiles
    for name in names or ["plain", "source", "noreuse", "prefetch"]:
        header, data = load(name, folder)
        col = {c: i for i, c in enumerate(header)}
        stalls = [c for c in header if c.startswith("stall_") and "Not Issued" not in c]
        samples = lambda r: int(r[col["Warp Stall Sampling (All Samples)"]] or 0)
        executed = lambda r: int(r[col["Instructions Executed"]] or 0)
        sass = lambda r: r[col["Source"]].strip()
        total = sum(samples(r) for r in data)
        groups = collections.defaultdict(lambda: [0, collections.Counter()])
        for r in data:
            e = executed(r)
            g = ("per k-block" if e >= 48 * tiles else "once per tile, consumer warp" if per_tile(e) else
                 "several per tile" if e > 8.6 * tiles else "once per tile, producer warp" if per_tile_producer(e)
                 else "rare")
            groups[g][0] += samples(r)
            for s in stalls:
                groups[g][1][s[6:]] += int(r[col[s]] or 0)
        print(f"== {name}: {total} samples")
        for g in ("per k-block", "once per tile, consumer warp", "several per tile", "once per tile, producer warp",
                  "rare"):
            n, by = groups[g]
            print(f"   {g:30s} {n:6d} ({n / total * 100:4.1f} %)  " +
                  ", ".join(f"{k} {v}" for k, v in by.most_common(4)))
        # The consumers' first k-block wait: the first per-tile branch whose next instruction is a try-wait
        # executed about half as often (the retries), before the first wgmma.
        first_mma = next(i for i, r in enumerate(data) if sass(r).startswith("HGMMA"))
        for i in range(first_mma - 1, 0, -1):
            if ("BRA" in sass(data[i]) and per_tile(executed(data[i])) and "TRYWAIT" in sass(data[i + 1])
                    and 0 < executed(data[i + 1]) < executed(data[i])):
                # The retries branch to an out-of-line loop (try-wait, sleep, check): its count is the
                # number of times a consumer warp slept there waiting for its tile's first k-block.
                target = sass(data[i + 2]).split()[-1]
                loop = next((r for r in data if r[col["Address"]] == target), None)
                print(f"   first k-block wait of a tile (instruction {i}): {samples(data[i])} samples "
                      f"({samples(data[i]) / total * 100:.1f} %), retried {executed(data[i + 1])} of "
                      f"{executed(data[i])} times, {executed(loop) if loop else '?'} sleeps in the retry loop")
                break
        top = sorted((r for r in data if executed(r) < 48 * tiles), key=samples, reverse=True)[:6]
        for r in top:
            why = max(stalls, key=lambda s: int(r[col[s]] or 0))[6:]
            print(f"     {samples(r):5d} x{executed(r):7d} {why:16s} {sass(r)[:70]}")


if __name__ == "__main__":
    main(sys.argv[1:])
