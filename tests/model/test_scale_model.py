"""CPU tests of the scale model (tools/model/scale_model.py) and its page (docs/SCALE.md).

Standard library only (unittest); pytest runs them too. CTest runs each case on its own
(tests/CMakeLists.txt, label "cpu"):

    python3 tests/model/test_scale_model.py               # every case
    python3 tests/model/test_scale_model.py ClosedForm     # one class
    python3 -m pytest tests/model                          # where pytest is installed
"""
import importlib.util
import json
import math
import os
import subprocess
import sys
import unittest

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SCRIPT = os.path.join(ROOT, "tools", "model", "scale_model.py")
DOC = os.path.join(ROOT, "docs", "SCALE.md")

_spec = importlib.util.spec_from_file_location("scale_model", SCRIPT)
sm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sm)

US, GB, MB = 1e-6, 1e9, 2 ** 20
WORLDS = (2, 4, 8, 16, 32, 64, 128)


def defaults(**over):
    p = {k: v[0] for k, v in sm.PARAMS.items()}
    p.update(over)
    return p


def cli(*args):
    return subprocess.run([sys.executable, SCRIPT] + list(args), capture_output=True, text=True)


class ClosedForm(unittest.TestCase):
    """Cases simple enough to write down: the model must give exactly these."""

    def close(self, got, want):
        self.assertTrue(math.isclose(got, want, rel_tol=1e-9), "model %.9g s, closed form %.9g s" % (got, want))

    def test_nccl_ring_allgather_in_one_node(self):
        # A ring of W GPUs: (W-1)/W of the gathered bytes cross each link, one latency per step.
        p = defaults()
        for W in (2, 4, 8):
            for S in (1 * MB, 256 * MB):
                want = (p["nccl_t0"] * US + (W - 1) * p["nvl_lat"] * US
                        + (W - 1) / W * (W * S) / (p["nccl_ag_bw"] * GB))
                self.close(sm.nccl("ag", S, W, p), want)

    def test_nccl_ring_reducescatter_and_allreduce_in_one_node(self):
        p = defaults()
        W, S = 8, 64 * MB
        self.close(sm.nccl("rs", S, W, p), p["nccl_t0"] * US + (W - 1) * p["nvl_lat"] * US
                   + (W - 1) / W * S / (p["nccl_rs_bw"] * GB))
        self.close(sm.nccl("ar", S, W, p), p["nccl_t0"] * US + 2 * (W - 1) * p["nvl_lat"] * US
                   + 2 * (W - 1) / W * S / (p["nccl_ar_bw"] * GB))

    def test_weft_allgather_in_one_node_is_bandwidth_plus_one_flag(self):
        # Every peer's shard comes over the one NVLink receive side; the last one's flag follows it.
        p = defaults()
        for W in (2, 8):
            S = 64 * MB
            want = p["weft_t0"] * US + (W - 1) / W * (W * S) / (p["nvl_bw"] * GB) + p["nvl_lat"] * US
            self.close(sm.ag_weft(S, W, p), want)

    def test_weft_allgather_across_nodes_with_free_nvlink_is_a_ring_of_puts(self):
        # NVLink infinitely fast: what is left is the rail ring, Nn - 1 puts of one shard, each
        # paying the NIC latency, then one NVLink flag.
        p = defaults(nvl_bw=1e12)
        S = 16 * MB
        for W in (16, 32, 64):
            Nn = W // 8
            B = p["nic_bw"] * p["nic_eff"] * GB
            want = p["weft_t0"] * US + (Nn - 1) * (p["nic_lat"] * US + S / B) + p["nvl_lat"] * US
            got = sm.ag_weft(S, W, p)
            self.assertTrue(math.isclose(got, want, rel_tol=1e-6), (W, got, want))

    def test_weft_reducescatter_in_one_node(self):
        p = defaults()
        W, S = 8, 256 * MB
        want = p["weft_t0"] * US + (W - 1) / W * S / (p["nvl_red_bw"] * GB) + p["nvl_lat"] * US
        self.close(sm.rs_weft(S, W, p), want)

    def test_weft_allreduce_in_one_node_is_reducescatter_then_allgather(self):
        p = defaults()
        W, S = 8, 256 * MB
        want = (p["weft_t0"] * US + 2 * p["nvl_lat"] * US
                + (W - 1) / W * S * (1 / (p["nvl_red_bw"] * GB) + 1 / (p["nvl_bw"] * GB)))
        self.close(sm.ar_weft(S, W, p), want)

    def test_gemm_compute_bound_and_memory_bound(self):
        p = defaults()
        m, n, k = 8192, 8192, 8192
        self.close(sm.gemm_time(m, n, k, p), 2.0 * m * n * k / (p["gemm_tflops"] * 1e12) + p["gemm_t0"] * US)
        m, n, k = 8192, 1, 8192   # a matrix-vector product: HBM-bound
        moved = 2.0 * (m * k + n * k + m * n)
        self.close(sm.gemm_time(m, n, k, p), moved / (p["hbm_bw"] * GB) + p["gemm_t0"] * US)

    def test_two_stage_pipeline(self):
        self.close(sm.pipe(8.0, 2.0, 4), 8.5)
        self.close(sm.pipe(2.0, 8.0, 4), 8.5)

    def test_ep_at_one_node_crosses_no_nic(self):
        p = defaults()
        t = sm.ep_two_hop(4096, 8, p, sm.FP8_TOKEN, 4)
        self.assertEqual(t, sm.ep_two_hop(4096, 8, defaults(nic_bw=1.0, nic_lat=1e3), sm.FP8_TOKEN, 4))


class Monotonicity(unittest.TestCase):
    """More GPUs never make a bandwidth-bound collective cheaper per byte. Per byte = the marginal
    cost, (t(2S) - t(S)) / bytes, so fixed latencies (which a larger world spreads over more
    bytes) drop out; bytes = what each rank ends with for AllGather (W S), what each rank puts in
    for ReduceScatter and AllReduce (S)."""

    def per_byte(self, op, f, S, W, p):
        return (f(2 * S, W, p) - f(S, W, p)) / (W * S if op == "ag" else S)

    def check(self, op, f, slack=lambda W, p: 0.0):
        for params in (defaults(), sm.h800(defaults()), defaults(nic_bw=25.0, nic_lat=8.0)):
            for S in (64 * MB, 256 * MB, 1024 * MB):
                for a, b in zip(WORLDS, WORLDS[1:]):
                    lo = self.per_byte(op, f, S, a, params) - slack(a, params)
                    self.assertGreaterEqual(self.per_byte(op, f, S, b, params), lo * (1 - 1e-9),
                                            "%s, %d MB per rank: %d GPUs cheaper per byte than %d" % (op, S // MB, b, a))

    def test_nccl(self):
        for op in ("ag", "rs", "ar"):
            self.check(op, lambda S, W, p, op=op: sm.nccl(op, S, W, p))

    def test_weft_allgather_and_allreduce(self):
        self.check("ag", sm.ag_weft)
        self.check("ar", sm.ar_weft)

    def test_weft_reducescatter_up_to_its_last_local_sum(self):
        # The one exception in the model: ReduceScatter's last step sums the Nn node sums of the
        # own block (fp32, 2 S / W bytes each) after the last lands. That tail, (2 Nn + 1) / W of
        # the input read or written in HBM, shrinks as W grows while the NVLink stage ((L-1)/L of
        # the input) does not, so a larger world may save at most that much per byte.
        def tail(W, p):
            L, Nn = sm.topo(W, p)
            return (sm.FP32_SUM * Nn + 1) / W / (p["hbm_bw"] * GB) if Nn > 1 else 0.0
        self.check("rs", sm.rs_weft, slack=tail)

    def test_slower_nic_is_never_faster(self):
        for W in (16, 32, 64):
            for op in ("ag", "rs", "ar"):
                S = 64 * MB
                fast, slow = defaults(), defaults(nic_bw=25.0)
                self.assertLessEqual(sm.WEFT[op](S, W, fast), sm.WEFT[op](S, W, slow))
                self.assertLessEqual(sm.nccl(op, S, W, fast), sm.nccl(op, S, W, slow))


class OverlapBound(unittest.TestCase):
    """A fused operator is never faster than its longer part, and never slower than its parts
    one after the other."""

    def cases(self):
        for params in (defaults(), sm.h800(defaults()), defaults(nic_bw=12.5, nic_lat=10.0)):
            for op in ("ag_gemm", "gemm_rs"):
                for W in (2,) + sm.WORLDS:
                    shapes = [s[:3] for s in sm.shapes_for(op, W)] + [(4096, 4096, 8192), (2048, 51200, 5120)]
                    for m, n, k in shapes:
                        yield params, op, W, (m, n, k)

    def test_fused_at_least_the_longer_part(self):
        for p, op, W, (m, n, k) in self.cases():
            g, nc, wc, f, _ = sm.fused(op, m, n, k, W, p)
            self.assertGreaterEqual(f, max(g, wc), (op, W, m, n, k))
            ov = p["ov_ag"] if op == "ag_gemm" else p["ov_rs"]
            self.assertGreaterEqual(f, g * ov, (op, W, m, n, k))

    def test_fused_at_most_its_parts_in_sequence(self):
        for p, op, W, (m, n, k) in self.cases():
            g, nc, wc, f, _ = sm.fused(op, m, n, k, W, p)
            ov = p["ov_ag"] if op == "ag_gemm" else p["ov_rs"]
            self.assertLessEqual(f, g * ov + wc + 1e-12, (op, W, m, n, k))


class ArGemmWays(unittest.TestCase):
    """GEMM+AllReduce across nodes: the sequential way is the GEMM then the AllReduce; "blocks"
    is GEMM+ReduceScatter's schedule then the AllGather of the summed blocks; no way beats the
    GEMM alone, and "slices" never beats its GEMM plus the rail's bytes."""

    def test_the_ways_are_their_parts(self):
        for p in (defaults(), sm.h800(defaults()), defaults(nic_bw=12.5, nic_lat=10.0)):
            for W in (16, 32, 64):
                for m, n, k in sm.AR_GEMM_SHAPES:
                    r = sm.ar_gemm_ways(m, n, k, W, p)
                    S, g = m * n * 2.0, sm.gemm_time(m, n, k / W, p)
                    self.assertAlmostEqual(r["gemm_s"], g)
                    self.assertAlmostEqual(r["sequential_s"], g + sm.ar_weft(S, W, p))
                    self.assertAlmostEqual(r["blocks_s"], sm.rs_weft(S, W, p, g * p["ov_rs"]) + sm.ag_weft(S / W, W, p))
                    for way in ("sequential_s", "blocks_s", "slices_s"):
                        self.assertGreaterEqual(r[way], g, (way, W, m, n, k))
                    L, Nn = sm.topo(W, p)
                    rail = sm.FP32_SUM * 2 * (Nn - 1) / Nn * S / L / sm.nic(p)   # the cheaper rail's bytes
                    self.assertGreaterEqual(r["slices_s"], g * p["ov_rs"] + rail * (1 - 1e-9), (W, m, n, k))


class DocAndCommandLine(unittest.TestCase):
    def test_doc_table_equals_the_script(self):
        with open(DOC, encoding="utf-8") as f:
            have = sm.doc_block(f.read())
        self.assertIsNotNone(have, "docs/SCALE.md has no block between %s and %s" % (sm.BEGIN, sm.END))
        want = sm.render(defaults())
        self.assertEqual(have, want, "docs/SCALE.md's tables differ from the script's output: paste "
                         "`python3 tools/model/scale_model.py` between the markers")

    def test_check_flag_agrees(self):
        r = cli("--check", DOC)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_markdown_has_every_world_size(self):
        r = cli("--markdown")
        self.assertEqual(r.returncode, 0, r.stderr)
        for op in ("| AllGather+GEMM | 8192 x 28672 x 8192 | ", "| GEMM+ReduceScatter | 8192 x 8192 x 28672 | "):
            for W in (8, 16, 32, 64):
                self.assertIn("%s%d |" % (op, W), r.stdout)
        for row in ("| 16 | dispatch |", "| 32 | combine |", "| 64 | dispatch |"):
            self.assertIn(row, r.stdout)
        for kind in ("measured", "published", "assumed"):
            self.assertIn("| %s |" % kind, r.stdout, "no parameter of kind " + kind)

    def test_every_parameter_names_its_source(self):
        for name, (value, unit, kind, source) in sm.PARAMS.items():
            self.assertIn(kind, ("measured", "published", "assumed"), name)
            self.assertTrue(source.strip(), name)
            if kind == "measured":
                self.assertTrue("docs/PERF.md" in source or "not in docs/PERF.md" in source, name)

    def test_json_is_the_same_model(self):
        r = cli("--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        data = json.loads(r.stdout)
        self.assertEqual(sorted({row["gpus"] for row in data["overlapped"]}), [8, 16, 32, 64])
        row = [x for x in data["overlapped"] if x["op"] == "ag_gemm" and x["gpus"] == 16][0]
        g, nc, wc, f, _ = sm.fused("ag_gemm", row["m"], row["n"], row["k"], 16, defaults())
        self.assertTrue(math.isclose(row["weft_s"], f) and math.isclose(row["baseline_s"], g + nc))
        self.assertEqual(row["paper_x_seq"], 1.33)
        self.assertEqual(data["params"]["nic_bw"]["kind"], "published")

    def test_set_overrides_a_parameter(self):
        base = json.loads(cli("--json").stdout)
        slow = json.loads(cli("--json", "--set", "nic_bw=12.5", "--set", "nic_lat=10").stdout)
        self.assertEqual(slow["params"]["nic_bw"]["value"], 12.5)
        pick = lambda d: [r for r in d["ep"] if r["gpus"] == 32 and r["op"] == "dispatch"][0]["two_hop_s"]  # noqa: E731
        self.assertGreater(pick(slow), pick(base))

    def test_other_node_sizes_render(self):
        # The low-latency EP rows exist where DeepEP published figures, whatever the node size.
        for gpn in ("4", "16"):
            r = cli("--set", "gpus_per_node=" + gpn)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("### Expert parallelism", r.stdout, gpn)

    def test_bad_set_is_refused(self):
        for bad in ("no_such_parameter=1", "nic_bw", "nic_bw=fast", "nic_bw=-5", "gpus_per_node=7.5"):
            r = cli("--set", bad)
            self.assertEqual(r.returncode, 2, bad)
            self.assertIn("--set", r.stderr, bad)

    def test_check_refuses_overrides(self):
        self.assertEqual(cli("--check", DOC, "--set", "nic_bw=40").returncode, 2)


if __name__ == "__main__":
    unittest.main()
