"""CPU tests of tools/bench/host_overhead.py: --help without a GPU, and its report from stand-in figures."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "bench" / "host_overhead.py"


def _load():
    spec = importlib.util.spec_from_file_location("host_overhead", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_help_runs_without_a_gpu():
    r = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 0, r.stderr
    assert "--bench" in r.stdout and "--bytes" in r.stdout


def test_report_from_stand_in_figures(monkeypatch, capsys, tmp_path):
    ho = _load()
    bench = tmp_path / "weft-bench"
    bench.write_text("#!/bin/sh\n")
    bench.chmod(0o755)
    cpp = {"variant": "a:ll", "run_host_us": 2.0, "run_device_us": 1.5, "graph_launch_host_us": 1.8,
           "graph_replay_device_us": 1.6, "nccl_host_us": -1.0}
    py = {"all_reduce_host_us": 8.5, "all_reduce__host_us": 6.0, "all_reduce_device_us": 1.5,
          "all_reduce__device_us": 1.5, "all_reduce_graph_replay_host_us": 3.0,
          "all_reduce_graph_replay_device_us": 1.6, "all_reduce__graph_replay_host_us": 3.0,
          "all_reduce__graph_replay_device_us": 1.6, "aten_add__host_us": 5.5, "aten_add_host_us": 7.25, "plans": 1,
          "all_reduce_dispatcher_host_us": 6.0, "all_reduce_body_host_us": 4.25,
          "all_reduce__dispatcher_host_us": 4.0, "all_reduce__body_host_us": 2.5}
    monkeypatch.setattr(ho, "cpp_figures", lambda *a: cpp)
    monkeypatch.setattr(ho, "python_figures", lambda *a: py)
    assert ho.main(["--bench", str(bench), "--json"]) == 0
    out = capsys.readouterr().out
    assert "difference, Python - C++: all_reduce +6.50 us, all_reduce_ +4.00 us (goal: at most +5 us: NOT met)" in out
    assert "graph replay, GPU time Python / C++: 1.000" in out
    assert ("all_reduce's difference split: Python binding +2.50 us, dispatcher +1.75 us, weft's op body beyond "
            "AllReduce::run +2.25 us") in out
    assert ("all_reduce_'s difference split: Python binding +2.00 us, dispatcher +1.50 us, weft's op body beyond "
            "AllReduce::run +0.50 us") in out
    assert any(line.startswith("torch.add(x, 1), out of place (for scale)") and line.split()[-1] == "7.25"
               for line in out.splitlines())
    assert out.strip().splitlines()[-1].startswith("host_overhead: Python 8.50 us, C++ 2.00 us, difference +6.50 us")
    assert "noise" not in out
    summary = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
    assert summary["diff_us"] == 6.5

    py["all_reduce_body_host_us"] = 6.5  # above the dispatcher's call, which includes it
    assert ho.main(["--bench", str(bench)]) == 0
    out = capsys.readouterr().out
    assert ("all_reduce's difference split: Python binding +2.50 us, dispatcher -0.50 us, weft's op body beyond "
            "AllReduce::run +4.50 us (the body alone timed above the call through the dispatcher") in out

    def failing(*a):
        raise RuntimeError("weft-bench exited 2")

    monkeypatch.setattr(ho, "cpp_figures", failing)
    assert ho.main(["--bench", str(bench)]) == 0
    out = capsys.readouterr().out
    assert "the C++ figures are left out: weft-bench exited 2" in out
    assert out.strip().splitlines()[-1].startswith("host_overhead: Python 8.50 us per call")
