#!/usr/bin/env bash
# The GPU test matrix, on whatever NVIDIA GPUs this machine has:
#   - the whole GPU suite at world sizes 1, 2, 4 and 8, with ranks sharing a
#     GPU through MPS (weftrun --share-gpu) where there are more ranks than GPUs;
#   - where weft was built with NVSHMEM (WEFT_NVSHMEM), the whole suite again on
#     the NVSHMEM heap (WEFT_HEAP_BACKEND=nvshmem) at world sizes 1, 2 and 4, and
#     every collective's result digest compared with the native heap's run;
#   - where weft::internode is built (NVSHMEM with its device library), its
#     test (weft_internode_tests: the device path of remote.cuh and the
#     collectives' two-level schedules) on the NVSHMEM heap with virtual nodes
#     (WEFT_VIRTUAL_NODES): world 4 as 2 nodes of 2, world 8 as 2 x 4 and 4 x 2;
#     and a rank that skips a two-level AllGather at world 4 as 2 x 2, named
#     (or the rank blocked behind it) by the others' bounded waits; and
#     weft-bench's all_gather, reduce_scatter and all_reduce, variants
#     two_level and auto, checked at world 4 as 2 x 2 (two small sizes);
#   - the overlapped operators at world 2 and 4 with one hardware queue per rank
#     (CUDA_DEVICE_MAX_CONNECTIONS=1);
#   - the provoked hangs: a rank that skips an AllReduce at world 4, named by
#     the others within the wait timeout; a GEMM whose rows never arrive (world 1);
#   - the examples at world 2 (each checks its own result);
#   - weftrun stopping a job within 10 s of a rank being killed, and on Ctrl-C;
#   - after every job, no MPS daemon or server that weftrun started left running.
# Times measured with ranks sharing a GPU are not performance figures.
#
#   bash scripts/gpu_tests.sh [BUILD_DIR] [LOG_DIR]
#
# GPU_TESTS_PARTS picks parts of the matrix (default: all of them, in order):
#   suite nvshmem internode two_level_bench one_queue hangs examples launcher
# so that a machine lent for a bounded call can run the matrix in two calls,
# e.g. "suite" then "nvshmem internode two_level_bench one_queue hangs examples
# launcher". SUITE_WORLDS and NVSHMEM_WORLDS narrow the suite's world sizes (default
# "1 2 4 8") and the NVSHMEM part's (default "1 2 4"); SUITE_FILTER narrows both
# parts' cases (a GoogleTest filter, e.g. "Overlap.*:MoeTp.*"; default every case).
# INTERNODE_RUNS narrows the internode part's runs (world/nodes, default "4/2 8/2 8/4").
# The nvshmem part compares its digests with the native suite's logs in
# LOG_DIR; where those are absent it runs the digest case on the native heap
# at the same world size first.
#
# One line per step; the last line counts the test cases (passed and skipped
# from rank 0's GoogleTest summary at each world size, failed on any rank)
# and the steps:
#   GPU: P passed, F failed, S skipped test cases (world sizes 1 2 4 8[, on NVSHMEM 1 2 4][, virtual nodes 4/2 8/2 8/4]); steps: N ok, M failed
# Exit status 0 iff every step passed. scripts/test.sh runs it on GPU machines,
# scripts/gpu_session.sh in its gpu stage.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-${WEFT_BUILD_DIR:-build}}
LOGS=${2:-$BUILD/gpu-test-logs}
mkdir -p "$LOGS"
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
# Plans at world 8 hold buffers of M = 2048 x 8 rows: room for them in every rank's heap.
export WEFT_HEAP_SIZE=${WEFT_HEAP_SIZE:-2G}
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
TESTS="$BUILD/tests/weft_gpu_tests"
WEFTRUN="$BUILD/weftrun"
passed=0 failed=0 skipped=0 steps_ok=0 steps_failed=0
PARTS=" ${GPU_TESTS_PARTS:-suite nvshmem internode two_level_bench one_queue hangs examples launcher} "
part() { [[ "$PARTS" == *" $1 "* ]]; }
worlds="" nv_worlds="" vn_runs=""
# A build of the CI subset of GEMM kernels (WEFT_GEMM_KERNELS=subset) lacks
# kernels the tuner and the GPU suite choose: the parts that run the suite need
# all of them. The internode part (collectives, EP, the operators' sequential
# path at small shapes) and weft-bench's two-level collectives run on the subset.
if grep -q '^WEFT_GEMM_KERNELS:STRING=subset$' "$BUILD/CMakeCache.txt" 2>/dev/null &&
   { part suite || part nvshmem || part one_queue || part hangs || part examples; }; then
  echo "gpu_tests.sh: $BUILD compiles only the CI subset of GEMM kernels, and the suite needs every kernel:" \
       "WEFT_GEMM_KERNELS=all WEFT_BUILD_DIR=$BUILD bash scripts/build.sh (or GPU_TESTS_PARTS=\"internode two_level_bench\")" >&2
  exit 2
fi

mps_processes() { ps -eo pid=,args= | grep -E '[n]vidia-cuda-mps-(control|server)' | awk '{print $1}' | sort; }
MPS_BEFORE=$(mps_processes)

say() { printf '%-44s %s\n' "$1" "$2"; }
verdict() {  # name, ok (0/1), detail
  if [ "$2" = 0 ]; then steps_ok=$((steps_ok + 1)); say "$1" "ok: $3"; else steps_failed=$((steps_failed + 1)); say "$1" "FAILED: $3"; fi
}
# weftrun's arguments for n ranks on this machine's GPUs: one GPU each, or sharing.
ranks() {
  local n=$1
  if [ "$n" -le "$GPUS" ]; then echo "-n $n"
  elif [ $((n % GPUS)) -eq 0 ]; then echo "-n $n --share-gpu"
  else return 1; fi
}
# Every MPS process now was there before the matrix began: weftrun left none.
no_mps_left() {
  local now
  now=$(mps_processes)
  [ "$now" = "$MPS_BEFORE" ] && return 0
  echo "MPS processes left: $(comm -13 <(echo "$MPS_BEFORE") <(echo "$now") | tr '\n' ' ')"
  return 1
}

if [ "$GPUS" -eq 0 ]; then
  echo "GPU: 0 passed, 0 failed, 0 skipped test cases (no NVIDIA GPU here: nvidia-smi lists none); steps: none"
  exit 0
fi

# The test cases that failed on any rank in log $1, each counted once: a case
# can fail on one rank alone, where rank 0's summary says nothing of it.
failed_cases() { grep -oE '^\[rank [0-9]+\] \[  FAILED  \] [A-Za-z][A-Za-z0-9_/.]*' "$1" | awk '{print $NF}' | sort -u | wc -l; }

# A suite's log $1: p (passed) and s (skipped) from rank 0's summary, f (failed on
# any rank), added to the totals (a log with neither summary nor failed case: the
# binary died, one failure); left, the MPS processes left over.
tally() {
  local log=$1
  p=$(grep -oE '^\[rank 0\] \[  PASSED  \] [0-9]+' "$log" | awk '{print $NF}')
  s=$(grep -oE '^\[rank 0\] \[  SKIPPED \] [0-9]+' "$log" | awk '{print $NF}')
  f=$(failed_cases "$log")
  passed=$((passed + ${p:-0})) skipped=$((skipped + ${s:-0})) failed=$((failed + ${f:-0}))
  [ -z "$p" ] && [ "$f" = 0 ] && failed=$((failed + 1))  # no summary and no failed case: the binary died
  left=$(no_mps_left)
}

# The suite's GoogleTest filter: SUITE_FILTER's cases ($1, where given, among
# them), never WaitTimeout.* (the hangs part provokes those on purpose). A
# filter that names cases gets $1 added: the NVSHMEM part reads the backend line
# and the digests HeapBackend.* prints, whatever else the filter keeps.
suite_filter() {
  local f=${SUITE_FILTER:-*}
  case $f in '*'|'*-'*|-*) ;; *) f="${1:+$1:}$f" ;; esac
  case $f in *-*) echo "$f:WaitTimeout.*" ;; *) echo "$f-WaitTimeout.*" ;; esac
}
# One run of the whole suite: log $1, heap backend $2 ("" for the default), weftrun's
# arguments $3, cases the filter must keep $4. Tallies its test cases (tally) and
# leaves rc and secs too for the caller's verdict.
run_suite() {
  local log=$1 backend=$2 args=$3 keep=${4:-} t0=$SECONDS
  # shellcheck disable=SC2086  # args is a word list
  env ${backend:+WEFT_HEAP_BACKEND=$backend} "$WEFTRUN" $args --tag-output --timeout 1200 -- "$TESTS" \
    --gtest_filter="$(suite_filter "$keep")" >"$log" 2>&1
  rc=$?
  tally "$log"
  secs=$((SECONDS - t0))
}
# The suite's failed and skipped cases, as every rank printed them.
suite_cases() { grep -E '^\[rank [0-9]+\] \[  (FAILED  |SKIPPED )\] [A-Za-z]' "$1" | sort -u | head -n 20; }

if part suite; then
# ---- the suite at every world size ---------------------------------------------------
for n in ${SUITE_WORLDS:-1 2 4 8}; do
  if ! args=$(ranks "$n"); then
    say "suite, world $n" "not run: $n ranks do not divide evenly over $GPUS GPUs"
    continue
  fi
  worlds="$worlds $n"
  run_suite "$LOGS/suite_w$n.log" "" "$args"
  ok=1
  [ "$rc" -eq 0 ] && [ -n "$p" ] && [ -z "$left" ] && ok=0
  verdict "suite, world $n ($args)" $ok "rc=$rc, ${p:-0} passed, ${f:-0} failed, ${s:-0} skipped, $secs s${left:+; $left}"
  suite_cases "$LOGS/suite_w$n.log"
done
fi

if part nvshmem; then
# ---- the suite on the NVSHMEM heap, where weft was built with it ---------------------------
# The same binary and cases, the heap from NVSHMEM (docs/decisions/0057); then
# the digests HeapBackend.CollectiveDigestsOnFixedInputs prints must equal the
# native run's at the same world size: collectives bitwise equal under either backend.
if grep -q '^WEFT_NVSHMEM_BUILT:INTERNAL=ON$' "$BUILD/CMakeCache.txt" 2>/dev/null; then
  for n in ${NVSHMEM_WORLDS:-1 2 4}; do
    args=$(ranks "$n") || continue
    nv_worlds="$nv_worlds $n"
    log="$LOGS/nvshmem_w$n.log"
    run_suite "$log" nvshmem "$args" "HeapBackend.*"
    backend=$(grep -oE 'heap backend: [a-z]+' "$log" | head -n 1)
    ok=1
    [ "$rc" -eq 0 ] && [ -n "$p" ] && [ -z "$left" ] && [ "$backend" = "heap backend: nvshmem" ] && ok=0
    verdict "suite on NVSHMEM, world $n ($args)" $ok \
      "rc=$rc, ${p:-0} passed, ${f:-0} failed, ${s:-0} skipped, ${backend:-no backend line}, $secs s${left:+; $left}"
    suite_cases "$log"
    # Bitwise: every digest line of this run against the native suite's at the same world size
    # (its log from the suite part, or the digest case alone on the native heap where that part ran elsewhere).
    if ! grep -q '\[ digest \]' "$LOGS/suite_w$n.log" 2>/dev/null; then
      # shellcheck disable=SC2086
      "$WEFTRUN" $args --tag-output --timeout 300 -- "$TESTS" \
        --gtest_filter='HeapBackend.CollectiveDigestsOnFixedInputs' >"$LOGS/suite_w$n.log" 2>&1
    fi
    native=$(grep -oE '\[ digest \] .*' "$LOGS/suite_w$n.log" 2>/dev/null | sort)
    nvshmem=$(grep -oE '\[ digest \] .*' "$log" | sort)
    lines=$(printf '%s\n' "$nvshmem" | grep -c 'digest' || true)
    same=1
    [ -n "$native" ] && [ "$native" = "$nvshmem" ] && same=0
    verdict "collectives bitwise, native = NVSHMEM, world $n" $same \
      "$lines digests$([ -z "$native" ] && echo ', none from the native run')$(
        [ -n "$native" ] && [ "$native" != "$nvshmem" ] && echo ": $(diff <(echo "$native") <(echo "$nvshmem") | grep -c '^>') differ")"
  done
else
  say "suite on NVSHMEM" "not run: $BUILD was built without NVSHMEM (WEFT_NVSHMEM=ON, scripts/setup.sh fetches it)"
fi
fi

if part internode; then
# ---- NVSHMEM's device path between virtual nodes (weft::internode) ------------------------
# WEFT_VIRTUAL_NODES splits the job's ranks into nodes: peers in another node
# are reached through NVSHMEM's put-with-signal and get (over its P2P transport
# on one machine), peers in the same node by load and store. Every case of
# weft_internode_tests must run (none skipped) and find every byte: the device
# path (test_remote.cu, docs/decisions/0061), the two-level AllGather,
# ReduceScatter and AllReduce (test_collectives.cu, docs/decisions/0066) and
# ExpertParallel's two hops (test_ep.cu's throughput cases, docs/decisions/0072;
# its 10,000-call soak runs on one node only: across nodes BackToBack's fresh
# routings and the hundred repeated calls cover reuse). The provoked hang runs
# apart: its ranks' CUDA contexts end trapped.
INTERNODE_TESTS="$BUILD/tests/weft_internode_tests"
# It holds AcrossNodes.* too: AgGemm, GemmRs and GemmAr across nodes, each path
# (test_operators.cu, docs/decisions/0073-0076); DistFlashDecode over the two-level
# AllGather, AgMoe and MoeRs on their sequential path (test_dist_flash_decode.cu,
# test_moe_tp.cu built again with WEFT_TESTS_ACROSS_NODES); and Context::barrier
# across nodes (TwoLevel.ContextBarrier...).
if grep -q '^WEFT_INTERNODE_BUILT:INTERNAL=ON$' "$BUILD/CMakeCache.txt" 2>/dev/null && [ -x "$INTERNODE_TESTS" ]; then
  for run in ${INTERNODE_RUNS:-4/2 8/2 8/4}; do  # world/nodes
    n=${run%/*} nodes=${run#*/}
    args=$(ranks "$n") || continue
    log="$LOGS/internode_w${n}_n${nodes}.log"
    t0=$SECONDS
    # shellcheck disable=SC2086
    WEFT_HEAP_BACKEND=nvshmem WEFT_VIRTUAL_NODES=$nodes "$WEFTRUN" $args --tag-output --timeout 600 -- \
      "$INTERNODE_TESTS" --gtest_filter='-TwoLevelWaitTimeout.*:ExpertParallel.TenThousand*' >"$log" 2>&1
    rc=$?
    tally "$log"
    vn_runs="$vn_runs $run"
    ok=1
    [ "$rc" -eq 0 ] && [ -n "$p" ] && [ -z "$s" ] && [ -z "$left" ] && ok=0
    verdict "internode, world $n as $nodes virtual nodes ($args)" $ok \
      "rc=$rc, ${p:-0} passed, ${f:-0} failed, ${s:-0} skipped, $((SECONDS - t0)) s${left:+; $left}$(
        grep -oE ', [0-9]+ of its hops through NVSHMEM' "$log" | head -n 1)"
    suite_cases "$log"
  done
  # The last rank skips a two-level AllGather: the others' waits end within the
  # bound, each report naming its rank, the flag and the rank that never raised
  # it, checked against the schedule (hierarchy::ag_walk) by the test itself.
  if args=$(ranks 4); then
    log="$LOGS/internode_provoked_hang_w4_n2.log"
    t0=$SECONDS
    # shellcheck disable=SC2086
    WEFT_TEST_PROVOKE_TIMEOUT=internode WEFT_WAIT_TIMEOUT=2 WEFT_CHECK_CALLS=0 WEFT_HEAP_BACKEND=nvshmem \
      WEFT_VIRTUAL_NODES=2 "$WEFTRUN" $args --tag-output --timeout 120 -- "$INTERNODE_TESTS" \
      --gtest_filter='TwoLevelWaitTimeout.*' >"$log" 2>&1
    rc=$?
    named=$(grep -c 'never signalled it' "$log")
    left=$(no_mps_left)
    ok=1
    [ "$rc" -eq 0 ] && [ "$named" -ge 1 ] && [ -z "$left" ] && ok=0
    verdict "internode provoked hang, world 4 as 2 nodes" $ok \
      "rc=$rc, $((SECONDS - t0)) s, $named report(s) name the rank${left:+; $left}: $(
        grep -oE 'provoked hang \(rank [0-9]+ skips\): [0-9]+ report\(s\)[^;]*; [0-9]+ rank\(s\) reported wrongly' "$log" | head -n 1)"
  fi
else
  say "internode (virtual nodes)" "not run: $BUILD has no weft::internode (NVSHMEM with libnvshmem_device.a)"
fi
fi

if part two_level_bench; then
# ---- weft-bench's two-level collectives between virtual nodes ---------------------------------
# weft-bench links weft::internode where it is built, as on two real nodes
# (docs/SCALE.md): each collective's two_level variant and auto (which must
# take two_level across nodes) at 64K and 4M per rank, --check on (against
# NCCL where every rank has a GPU of its own, else against every rank's input
# rebuilt from its seed). Times with ranks sharing a GPU are not figures.
if grep -q '^WEFT_INTERNODE_BUILT:INTERNAL=ON$' "$BUILD/CMakeCache.txt" 2>/dev/null && [ -x "$BUILD/weft-bench" ]; then
  if ! args=$(ranks 4); then
    say "weft-bench two_level (virtual nodes)" "not run: 4 ranks do not divide over $GPUS GPUs"
  else
    for op in all_gather reduce_scatter all_reduce; do
      log="$LOGS/internode_bench_${op}_w4_n2.log"
      t0=$SECONDS
      # shellcheck disable=SC2086
      WEFT_HEAP_BACKEND=nvshmem WEFT_VIRTUAL_NODES=2 "$WEFTRUN" $args --tag-output --timeout 300 -- \
        "$BUILD/weft-bench" "$op" --variant two_level,auto --bytes 64K,4M --samples 3 --warmup 1 --check --json \
        >"$log" 2>&1
      rc=$?
      rows=$(grep -c '"check":"ok"' "$log")
      auto=$(grep -c '"variant":"a:two_level"' "$log")
      ready=$(grep -c 'two-level collectives ready' "$log")
      left=$(no_mps_left)
      ok=1
      [ "$rc" -eq 0 ] && [ "$rows" -eq 4 ] && [ "$auto" -eq 2 ] && [ "$ready" -ge 1 ] && [ -z "$left" ] && ok=0
      verdict "weft-bench $op two_level, world 4 as 2 nodes" $ok \
        "rc=$rc, $rows of 4 rows checked ok, auto took two_level in $auto of 2, $((SECONDS - t0)) s${left:+; $left}"
      grep -E '"check":"FAIL|weft-bench: ' "$log" | head -n 5
    done
    # The operators as docs/SCALE.md's step 5 runs them on two real nodes, each
    # result checked (weft-bench exits 3 on a failed check; --check is on where
    # ranks share a GPU, and --json is not: a table): the overlapped
    # GEMMs in both modes and automatic (fused = their two-level steps), EP in
    # both modes, MoE under TP, and DistFlashDecode (its check is FlashDecode's
    # on the local shard; weft_internode_tests checks the distributed result).
    while IFS='|' read -r op bench_args; do
      log="$LOGS/internode_bench_${op}_w4_n2.log"
      t0=$SECONDS
      # shellcheck disable=SC2086
      WEFT_HEAP_BACKEND=nvshmem WEFT_VIRTUAL_NODES=2 "$WEFTRUN" $args --tag-output --timeout 300 -- \
        "$BUILD/weft-bench" "$op" $bench_args --samples 3 --warmup 1 --check >"$log" 2>&1
      rc=$?
      # Ranks sharing a GPU print a table (their times are not figures); a failed check says FAIL there too.
      fails=$(grep -c 'FAIL' "$log")
      ready=$(grep -c 'two-level collectives ready' "$log")
      left=$(no_mps_left)
      ok=1
      [ "$rc" -eq 0 ] && [ "$fails" -eq 0 ] && [ "$ready" -ge 1 ] && [ -z "$left" ] && ok=0
      verdict "weft-bench $op, world 4 as 2 nodes" $ok \
        "rc=$rc (3: a check failed), $fails line(s) saying FAIL, $((SECONDS - t0)) s${left:+; $left}"
      grep -E 'FAIL|error|weft-bench: ' "$log" | grep -v 'share a GPU' | head -n 5
    done <<'OPS'
ag_gemm|--shapes 1024,2048,1024 --variant fused,sequential,auto
gemm_rs|--shapes 1024,2048,1024 --variant fused,sequential,auto
gemm_ar|--shapes 1024,2048,1024 --variant fused,sequential,auto
ep|--tokens 512 --hidden 2048 --experts 16 --topk 4 --ll-tokens 64
moe_tp|--cases 1024,1024,1024,8,2 --routing zipf
decode|--dist --cases 4,32,8,8192
OPS
  fi
else
  say "weft-bench two_level (virtual nodes)" \
    "not run: $BUILD has no weft::internode or no weft-bench, so no two-level collectives to time (NVSHMEM: scripts/setup.sh)"
fi
fi

if part one_queue; then
# ---- the overlapped operators with one hardware queue per rank ---------------------------
# CUDA_DEVICE_MAX_CONNECTIONS=1 (as Megatron-LM sets it): every stream of a
# rank shares one queue, run in the order work was enqueued. A stream wait
# enqueued before the kernel it waits for would hang here (docs/decisions/0049).
for n in 2 4; do
  args=$(ranks "$n") || continue
  log="$LOGS/one_queue_w$n.log"
  t0=$SECONDS
  # shellcheck disable=SC2086
  CUDA_DEVICE_MAX_CONNECTIONS=1 "$WEFTRUN" $args --tag-output --timeout 600 -- "$TESTS" \
    --gtest_filter='AgGemm.*:GemmRs.*:GemmAr.*:Overlap.*' >"$log" 2>&1
  rc=$?
  p=$(grep -oE '^\[rank 0\] \[  PASSED  \] [0-9]+' "$log" | awk '{print $NF}')
  f=$(failed_cases "$log")
  left=$(no_mps_left)
  verdict "overlap, world $n, CUDA_DEVICE_MAX_CONNECTIONS=1" $([ "$rc" -eq 0 ] && [ -n "$p" ] && [ -z "$left" ]; echo $?) \
    "rc=$rc, ${p:-0} passed, ${f:-0} failed, $((SECONDS - t0)) s${left:+; $left}"
  grep -E '^\[rank [0-9]+\] \[  FAILED  \] [A-Za-z]' "$log" | sort -u | head -n 10
done
fi

if part hangs; then
# ---- provoked hangs: every wait is bounded and names who never signalled --------------------
if args=$(ranks 4); then
  log="$LOGS/provoked_hang_w4.log"
  t0=$SECONDS
  # shellcheck disable=SC2086
  WEFT_TEST_PROVOKE_TIMEOUT=1 WEFT_WAIT_TIMEOUT=2 WEFT_CHECK_CALLS=0 \
    "$WEFTRUN" $args --timeout 120 -- "$TESTS" --gtest_filter='WaitTimeout.*' >"$log" 2>&1
  rc=$?
  named=$(grep -c 'never signalled it' "$log")
  left=$(no_mps_left)
  ok=1
  [ "$rc" -eq 0 ] && [ "$named" -ge 1 ] && [ -z "$left" ] && ok=0
  verdict "provoked hang, world 4 (rank 3 skips)" $ok \
    "rc=$rc, $((SECONDS - t0)) s, $named message(s) name the rank${left:+; $left}: $(grep -oE 'provoked hang reported after [0-9.]+ s' "$log" | head -n 1)"
fi
log="$LOGS/provoked_hang_gemm.log"
WEFT_TEST_PROVOKE_TIMEOUT=gemm WEFT_WAIT_TIMEOUT=2 WEFT_CHECK_CALLS=0 \
  "$WEFTRUN" -n 1 --timeout 120 -- "$TESTS" --gtest_filter='WaitTimeout.*' >"$log" 2>&1
rc=$?
verdict "provoked GEMM hang, world 1" $([ "$rc" -eq 0 ] && grep -q 'never signalled it' "$log"; echo $?) \
  "rc=$rc: $(grep -oE 'reported after [0-9.]+ s' "$log" | head -n 1)"
fi

if part examples; then
# ---- the examples at world 2 --------------------------------------------------------
if args=$(ranks 2); then
  for ex in 01_notify_wait 02_intranode_allgather 07_ag_gemm 08_gemm_rs; do
    log="$LOGS/example_$ex.log"
    # shellcheck disable=SC2086
    "$WEFTRUN" $args --timeout 300 -- "$BUILD/example_$ex" >"$log" 2>&1
    rc=$?
    left=$(no_mps_left)
    verdict "example $ex, world 2" $([ "$rc" -eq 0 ] && [ -z "$left" ]; echo $?) \
      "rc=$rc${left:+; $left}: $(grep -E 'error|WRONG|ok|correct|identical' "$log" | head -n 1 | cut -c1-100)"
  done
fi
fi

if part launcher; then
# ---- weftrun stops a job whose rank died, and on Ctrl-C -----------------------------------
if args=$(ranks 4); then
  log="$LOGS/rank_killed_w4.log"
  t0=$(date +%s%N)
  # shellcheck disable=SC2086,SC2016
  "$WEFTRUN" $args -- sh -c 'if [ "$WEFT_RANK" = 1 ]; then (sleep 5; kill -9 $$) & fi; exec "$0" --gtest_filter=-WaitTimeout.*' \
    "$TESTS" >"$log" 2>&1
  rc=$?
  ms=$((($(date +%s%N) - t0) / 1000000))
  left=$(no_mps_left)
  verdict "rank 1 killed at 5 s, world 4" $([ "$rc" -eq 137 ] && [ "$ms" -lt 15000 ] && [ -z "$left" ] &&
    grep -q 'rank 1 (pid [0-9]*) was killed by signal 9' "$log"; echo $?) \
    "rc=$rc after $ms ms${left:+; $left}: $(grep -o 'rank 1 (pid [0-9]*) was killed[^;]*' "$log" | head -n 1)"

  log="$LOGS/ctrl_c_w4.log"
  # shellcheck disable=SC2086
  "$WEFTRUN" $args -- "$TESTS" --gtest_filter='-WaitTimeout.*' >"$log" 2>&1 &
  pid=$!
  sleep 5
  t0=$(date +%s%N)
  kill -INT "$pid"
  wait "$pid"
  rc=$?
  ms=$((($(date +%s%N) - t0) / 1000000))
  left=$(no_mps_left)
  verdict "Ctrl-C at 5 s, world 4" $([ "$rc" -eq 130 ] && [ "$ms" -lt 10000 ] && [ -z "$left" ]; echo $?) \
    "rc=$rc, job gone $ms ms after SIGINT${left:+; $left}"
fi
fi

# ---- a job that sees no GPU skips (exit 77, CTest's skip code) and says why --------------
log="$LOGS/no_visible_gpu.log"
CUDA_VISIBLE_DEVICES= "$TESTS" >"$log" 2>&1
rc=$?
verdict "CUDA_VISIBLE_DEVICES empty" $([ "$rc" -eq 77 ] && grep -q 'SKIPPED' "$log"; echo $?) \
  "rc=$rc: $(grep -m 1 -o 'SKIPPED.*' "$log" | cut -c1-100)"

echo "GPU: $passed passed, $failed failed, $skipped skipped test cases (world sizes$worlds${nv_worlds:+, on NVSHMEM$nv_worlds}${vn_runs:+, virtual nodes$vn_runs}); steps: $steps_ok ok, $steps_failed failed"
[ "$steps_failed" -eq 0 ] && [ "$failed" -eq 0 ]
