#!/usr/bin/env python3
"""Counts a CUTLASS sm90 GEMM kernel's SASS by the kernel-level source line it inlines from.

usage: sass_lines.py KERNEL.gi.sass [LINE ...]
  KERNEL.gi.sass: `nvdisasm -gi -c` of a cubin built with -lineinfo.
  With no LINE: instructions per kernel line (the line in sm90_gemm_tma_warpspecialized_{cooperative,pingpong}.hpp
  the instruction is inlined at: which role and step it belongs to), and every spill (STL/LDL) with its lines.
  With LINEs: the opcode histogram of those lines (e.g. 773: the consumers' mainloop, 813: their epilogue).
Static counts: each instruction once, however often it runs.
"""
import collections
import re
import sys

INSN = re.compile(r'/\*([0-9a-f]{4,})\*/\s+(.*?);')
KERNEL_LINE = re.compile(r'File "[^"]*sm90_gemm_tma_warpspecialized_(?:cooperative|pingpong)\.hpp", line (\d+)')
FILE_LINE = re.compile(r'File "([^"]+)", line (\d+)')


def instructions(path):
    """Yields (address, instruction text, innermost file:line, kernel line) for each instruction."""
    chain, block, in_comments = [], [], False
    for line in open(path):
        if line.lstrip().startswith('//## File'):
            if not in_comments:
                block = []
            block.append(line)
            in_comments = True
            continue
        m = INSN.search(line)
        if not m:
            continue
        if in_comments:
            chain = block
        in_comments = False
        inner = FILE_LINE.search(chain[0]) if chain else None
        where = f"{inner.group(1).split('/')[-1]}:{inner.group(2)}" if inner else '?'
        kline = next((k.group(1) for k in map(KERNEL_LINE.search, chain) if k), '?')
        yield m.group(1), re.sub(r'\s+', ' ', m.group(2).strip()), where, kline


def main():
    path, lines = sys.argv[1], set(sys.argv[2:])
    per_line, ops, spills, total = collections.Counter(), collections.Counter(), [], 0
    for addr, text, where, kline in instructions(path):
        total += 1
        per_line[kline] += 1
        if re.search(r'\b(STL|LDL)', text):
            spills.append((addr, text, where, kline))
        if kline in lines:
            ops[re.sub(r'^@!?U?P\w+ ', '', text).split()[0]] += 1
    if lines:
        print(f"lines {' '.join(sorted(lines))}: {sum(ops.values())} instructions")
        for op, n in ops.most_common():
            print(f"  {n:5d} {op}")
        return
    print(f"{total} instructions; per kernel line:")
    for kline, n in per_line.most_common(25):
        print(f"  {kline:>5} {n:6d}")
    print(f"spills ({len(spills)}):")
    for s in spills:
        print("  ", *s)


if __name__ == '__main__':
    main()
