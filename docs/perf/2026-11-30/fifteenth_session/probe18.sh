#!/bin/bash
# 15th session, call 1: the plans' first-run choice timed held (new tree) against unheld (old, f07cd2c);
# forced ways for the bench's steady figures; --no-source-rows; GPU tests.
set -u
export PATH="$PATH:/usr/local/cuda/bin" NCCL_NVLS_ENABLE=0
mkdir -p /tmp/old && tar xf .deps/old.tar -C /tmp/old && cp -r .deps /tmp/old/.deps 2>/dev/null
cmake -S /tmp/old -B /tmp/old/build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null 2>&1
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null 2>&1
t0=$SECONDS
(cmake --build /tmp/old/build -j 12 --target weft-bench weftrun >$OUT/old_build.log 2>&1; echo "old build rc=$? $((SECONDS - t0)) s") &
cmake --build build-gpu -j 20 >$OUT/new_build.log 2>&1; echo "new build rc=$? $((SECONDS - t0)) s"
wait; echo "builds $((SECONDS - t0)) s"
S='--m 2048,4096,8192 --n 8192 --k 8192 --samples 15 --json'
for v in new old; do
  B=build-gpu; [ $v = old ] && B=/tmp/old/build
  for op in gemm_ar gemm_rs; do
    t1=$SECONDS
    WEFT_LOG_LEVEL=info $B/weftrun -n 2 --timeout 200 -- $B/weft-bench $op $S 2>>$OUT/choice_$v.log | sed "s/^/$v auto /" >>$OUT/choice.txt
    echo "$v $op auto $((SECONDS - t1)) s"
  done
done
for w in one_launch plain_first; do
  t1=$SECONDS
  build-gpu/weftrun -n 2 --timeout 200 -- build-gpu/weft-bench gemm_ar $S --variant fused --way $w 2>>$OUT/ways.log | sed "s/^/new $w /" >>$OUT/choice.txt
  echo "gemm_ar $w $((SECONDS - t1)) s"
done
grep -h "runs " $OUT/choice_*.log | sed 's/^.*\] //' > $OUT/choice_lines.txt
python3 - $OUT/choice.txt <<'PY'
import json, sys
print("version way op m: weft ms, plan_fused_ms (choice's median of the path it ran), path")
for line in open(sys.argv[1]):
    v, w, js = line.split(" ", 2)
    if not js.startswith("{"): continue
    j = json.loads(js)
    print(f"{v} {w} {j['op']} {j['m']}: {j['weft_ms']:.4f} {j.get('plan_fused_ms') or 0:.4f} {j['path']} x ideal {j['vs_ideal']:.3f}")
PY
cat $OUT/choice_lines.txt
for h in "--hook none" "--hook wait_source_rows --any-order --no-source-rows 0,1024" "--hook none" "--hook wait_source_rows --any-order --no-source-rows 0,1024"; do
  build-gpu/weftrun -n 2 --timeout 120 -- build-gpu/weft-bench gemm --shapes 2048,8192,4096 $h --samples 15 2>&1 | tail -n 3 | sed "s/^/[$h] /" >>$OUT/no_source_rows.txt
done
cat $OUT/no_source_rows.txt
if [ $((SECONDS - t0)) -lt 420 ]; then bash scripts/gpu_session.sh gpu; else echo "no time left for the GPU tests"; fi
