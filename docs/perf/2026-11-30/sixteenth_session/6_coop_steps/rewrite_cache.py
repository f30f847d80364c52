# Rewrites a weft tuning cache: every choice for a GEMM of ROWS x 8192 x 4096 (GEMM+ReduceScatter's ring steps at
# 2 x ROWS rows, K = 8192) becomes a cooperative 128x256 c2x1 one, in a raster and swizzle its key allows
# (16th session probe: the operator's steps timed with cooperative kernels against the tuner's choice).
import re, sys
src, dst, rows = sys.argv[1], sys.argv[2], sys.argv[3]
out = []
for line in open(src):
    tag, key, cfg = line.rstrip("\n").split("\t")
    if key.startswith(f"{rows}x8192x4096"):
        rasters = re.search(r"\| rasters (\w+) \|", key).group(1)
        source = "source" in key
        if source:
            along, sw = ("M" if rasters == "M" else "N"), 1
            name = "128x256x64 c2x1 cooperative hooked+source"
        elif "reporting" in key:
            along, sw, name = "N", 1, "128x256x64 c2x1 cooperative hooked"
        else:
            along, sw, name = "N", 2, "128x256x64 c2x1 cooperative"
        cfg = f"{name}, swizzle {sw} along {along}"
    out.append("\t".join([tag, key, cfg]))
open(dst, "w").write("\n".join(out) + "\n")
print("\n".join(l.split("\t")[1][:100] + " -> " + l.split("\t")[2] for l in out if l.split("\t")[1].startswith(f"{rows}x8192x4096")))
