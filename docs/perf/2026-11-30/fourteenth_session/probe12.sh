#!/bin/bash
# 14th session, call 3: A/B of 27904b1 (tiles without a source load nothing) against its parent, one-launch ring
set -u
export PATH="$PATH:/usr/local/cuda/bin" NCCL_NVLS_ENABLE=0
mkdir -p /tmp/old && tar cf - --exclude=./build-gpu --exclude=./build . | tar xf - -C /tmp/old
(cd .deps/old && find . -type f) | while read -r f; do cp ".deps/old/$f" "/tmp/old/$f"; done
cmake -S /tmp/old -B /tmp/old/build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null 2>&1
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null 2>&1
t0=$SECONDS
(cmake --build /tmp/old/build -j 16 --target weft-bench weftrun >$OUT/old_build.log 2>&1; echo "old build rc=$?") &
cmake --build build-gpu -j 16 --target weft-bench weftrun >$OUT/new_build.log 2>&1; echo "new build rc=$?"
wait; echo "builds $((SECONDS - t0)) s"
for r in 1 2; do for v in new old; do
  B=build-gpu; [ $v = old ] && B=/tmp/old/build
  for op in gemm_ar gemm_rs; do
    $B/weftrun -n 2 --timeout 200 -- $B/weft-bench $op --m 2048,4096,8192 --n 8192 --k 8192 --variant fused --way one_launch \
      --samples 15 --json 2>>$OUT/ab.log | sed "s/^/$r $v /" >>$OUT/ab.txt
  done
done; done
python3 - $OUT/ab.txt <<'PY'
import json, sys, collections
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    r, v, js = line.split(" ", 2)
    if not js.startswith("{"): continue
    j = json.loads(js)
    d[(j["op"], j["m"], v)].append(j)
print("op m version: weft ms / fused GEMMs alone ms / x ideal, per round [config]")
for (op, m, v), js in sorted(d.items()):
    print(f"{op} {m} {v}: " + "  ".join(f"{j['weft_ms']:.4f}/{j['gemm_hooked_ms']:.4f}/{j['vs_ideal']:.3f}" for j in js), f"[{js[-1]['config']}]")
PY
