#!/usr/bin/env bash
# The test command: sets up, builds (and, where the build has the NVSHMEM heap
# backend, compiles the runtime once more without it), runs the CPU tests always and the GPU
# tests as the machine allows, and ends with one line that counts CPU and GPU
# test cases apart:
#   weft tests: CPU P passed, F failed, S skipped | GPU P passed, F failed, S skipped (...)
# Without a GPU, every GPU test case is a CTest entry of its own that reports
# itself skipped. With GPUs, scripts/gpu_tests.sh runs the GPU matrix: the
# suite at world sizes 1, 2, 4 and 8 (ranks sharing a GPU through MPS where
# there are fewer GPUs), the provoked hangs, the examples and the launcher.
# Between them, scripts/check_install.sh builds a program of its own against
# the installed weft, and scripts/python_tests.sh builds the Python package
# (installing torch 2.11 into .venv-torch/ where no Python has it) and runs
# its tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
BUILD=${WEFT_BUILD_DIR:-build}
status=0

# Both builds (docs/decisions/0057): where the build above has the NVSHMEM heap
# backend, a second one configured with WEFT_NVSHMEM=OFF compiles the units of
# the core and the runtime, the only ones the option changes (about a minute).
if grep -q '^WEFT_NVSHMEM_BUILT:INTERNAL=ON$' "$BUILD/CMakeCache.txt" 2>/dev/null && command -v ninja >/dev/null; then
  off="$BUILD-no-nvshmem"
  echo "== the runtime without NVSHMEM (WEFT_NVSHMEM=OFF, in $off)"
  t0=$SECONDS
  mkdir -p "$off"
  if cmake -S . -B "$off" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" \
       -DWEFT_GEMM_KERNELS=subset -DWEFT_NVSHMEM=OFF >"$off/configure.log" 2>&1; then
    mapfile -t units < <(ninja -C "$off" -t targets all | grep -oE '^CMakeFiles/weft\.dir/src/(core|runtime)/[^:]+\.o')
    if [ "${#units[@]}" -gt 0 ] && ninja -C "$off" -j "${WEFT_JOBS:-2}" "${units[@]}" >"$off/build.log" 2>&1 &&
       ! grep -q 'nvshmem_heap' <(printf '%s\n' "${units[@]}"); then
      echo "built without NVSHMEM: ${#units[@]} units of the core and the runtime, $((SECONDS - t0)) s"
    else
      echo "FAILED: the runtime without NVSHMEM does not build (log: $off/build.log)"; tail -n 30 "$off/build.log"; status=1
    fi
  else
    echo "FAILED: configuring with WEFT_NVSHMEM=OFF (log: $off/configure.log)"; tail -n 30 "$off/configure.log"; status=1
  fi
fi

gpus=0
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  gpus=$(nvidia-smi -L | grep -c '^GPU ' || true)
fi

# "P passed, F failed, S skipped" from a CTest JUnit report.
count() {
  python3 - "$1" <<'PY'
import sys, xml.etree.ElementTree as ET
cases = ET.parse(sys.argv[1]).getroot().iter("testcase")
p = f = s = 0
for c in cases:
    status = c.get("status", "")
    if c.find("skipped") is not None or status in ("notrun", "disabled"): s += 1
    elif c.find("failure") is not None or c.find("error") is not None or status == "fail": f += 1
    else: p += 1
print(f"{p} passed, {f} failed, {s} skipped")
PY
}

gpu_line=""
if [ "$gpus" -eq 0 ]; then
  echo "== GPU tests: no NVIDIA GPU visible here (nvidia-smi lists none); each case must report itself skipped"
  ctest --test-dir "$BUILD" -L gpu --output-on-failure --output-junit gpu-junit.xml -j "$(nproc)" || status=1
  gpu_line="GPU $(count "$BUILD/gpu-junit.xml") (no GPU on this machine)"
else
  echo "== GPU tests on $gpus GPU(s): the matrix of scripts/gpu_tests.sh"
  matrix_log="$BUILD/gpu-test-logs/matrix.txt"
  mkdir -p "$BUILD/gpu-test-logs"
  bash scripts/gpu_tests.sh "$BUILD" "$BUILD/gpu-test-logs" | tee "$matrix_log" || status=1
  gpu_line=$(tail -n 1 "$matrix_log")
  gpu_line="${gpu_line#GPU: }"
  gpu_line="GPU ${gpu_line%%; steps:*} (${gpu_line##*; })"
fi

# weft as a dependency: install the build, build examples/consumer against the installed package alone.
echo "== a program built against the installed weft (scripts/check_install.sh)"
WEFT_BUILD_DIR="$BUILD" bash scripts/check_install.sh || status=1

# The Python package: built against the library above, its CPU tests (and GPU tests as one rank, where there is a GPU).
echo "== the Python package (scripts/python_tests.sh)"
py_line="Python not run"
rm -f "$BUILD/python-junit.xml"
if bash scripts/python_tests.sh "$BUILD" "$BUILD/python-junit.xml"; then :; else status=1; fi
[ -f "$BUILD/python-junit.xml" ] && py_line="Python $(count "$BUILD/python-junit.xml")"

# The CPU tests run last, so the run ends with their count.
echo "== CPU tests"
ctest --test-dir "$BUILD" -L cpu --output-on-failure --output-junit cpu-junit.xml -j "$(nproc)" || status=1
echo "weft tests: CPU $(count "$BUILD/cpu-junit.xml") | $py_line | $gpu_line"
exit "$status"
