"""CPU tests of the MoE source-region model (tools/model/moe_regions.py, decision 0071)
and of the torch-free routing counts it shares with grouped_mm_torch.py (tools/bench/routing.py).

Standard library only (unittest); CTest runs each case on its own (tests/CMakeLists.txt):

    python3 tests/model/test_moe_regions.py
"""
import importlib.util
import os
import subprocess
import sys
import unittest

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SCRIPT = os.path.join(ROOT, "tools", "model", "moe_regions.py")
BENCH = os.path.join(ROOT, "tools", "bench")


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


mr = load("moe_regions", SCRIPT)
routing = load("routing", os.path.join(BENCH, "routing.py"))


class RoutingCounts(unittest.TestCase):
    def test_the_counts_weft_bench_takes(self):
        # The values tests/cpu/test_grouped_gemm.cpp pins for weft::bench::routing_counts.
        self.assertEqual(routing.routing_counts("uniform", 1001, 8), [126] + [125] * 7)
        self.assertEqual(routing.routing_counts("one-hot", 1001, 4), [1001, 0, 0, 0])
        self.assertEqual(routing.routing_counts("zipf", 10, 3), [6, 2, 2])
        zipf = routing.routing_counts("zipf", 65536, 128)
        self.assertEqual(sum(zipf), 65536)
        self.assertEqual(zipf, sorted(zipf, reverse=True))
        self.assertEqual(routing.routing_counts("zipf-reversed", 65536, 128), zipf[::-1])

    def test_grouped_mm_torch_takes_these_counts(self):
        text = open(os.path.join(BENCH, "grouped_mm_torch.py")).read()
        self.assertIn("from routing import routing_counts", text)
        self.assertNotIn("def routing_counts", text, "a second copy of the counts")


class Regions(unittest.TestCase):
    def test_tiles_of_a_group_are_whole_clusters(self):
        self.assertEqual(mr.group_tiles(0, 128, 2), 0)
        self.assertEqual(mr.group_tiles(1, 128, 2), 2)
        self.assertEqual(mr.group_tiles(128, 128, 1), 1)
        self.assertEqual(mr.group_tiles(129, 128, 1), 2)
        self.assertEqual(mr.group_tiles(257, 128, 2), 4)

    def test_a_split_keeps_every_row_once(self):
        for rows in (0, 1, 7, 512, 1001):
            for world in (1, 2, 3, 8):
                parts = mr.source_split(rows, world)
                self.assertEqual(len(parts), world)
                self.assertEqual(sum(parts), rows)
                self.assertLessEqual(max(parts) - min(parts), 1)

    def test_regions_never_take_fewer_tiles_and_one_source_takes_the_same(self):
        for row in mr.table([1, 2, 4, 8], 128):
            self.assertGreaterEqual(row["region_tiles"], row["packed_tiles"], row)
            if row["world"] == 1:
                self.assertEqual(row["region_tiles"], row["packed_tiles"], row)

    def test_the_figures_decision_0071_quotes(self):
        rows = {(r["shape"], r["routing"], r["world"], r["cluster_m"]): r for r in mr.table([2, 4, 8], 128)}
        # Qwen3-like, uniform: 512 pairs per expert, 64 a region at 8 ranks: one 128-row tile (two with
        # the 2x1 cluster) per region where the packed expert takes 4.
        self.assertEqual(rows[("Qwen3-30B-A3B-like", "uniform", 8, 2)]["ratio"], 4.0)
        self.assertEqual(rows[("Qwen3-30B-A3B-like", "uniform", 8, 1)]["ratio"], 2.0)
        self.assertEqual(rows[("Mixtral-like", "uniform", 8, 2)]["ratio"], 1.0)
        for shape in ("Mixtral-like", "Qwen3-30B-A3B-like", "DeepSeek-like"):
            self.assertEqual(rows[(shape, "uniform", 2, 2)]["ratio"], 1.0, shape)


class Batches(unittest.TestCase):
    def test_a_plan_takes_every_source_once_its_own_first_in_arrival_order(self):
        for world in (1, 2, 3, 4, 8):
            for batch in (1, 2, 3, world):
                for me in range(world):
                    plan = mr.batch_plan(me, world, max(batch, 1))
                    self.assertEqual(plan[0], (me, me + 1))
                    sources = [s for a, b in plan for s in range(a, b)]
                    self.assertEqual(sources, [(me + i) % world for i in range(world)], (me, world, batch))
                    for a, b in plan:
                        self.assertTrue(0 <= a < b <= world, (a, b))  # one run of rows: never wraps

    def test_plans_as_the_docstring_draws_them(self):
        self.assertEqual(mr.batch_plan(1, 4, 7), [(1, 2), (2, 4), (0, 1)])  # cut where 3 wraps to 0
        self.assertEqual(mr.batch_plan(0, 4, 7), [(0, 1), (1, 4)])
        self.assertEqual(mr.batch_plan(5, 8, 2), [(5, 6), (6, 8), (0, 2), (2, 4), (4, 5)])

    def test_batch_one_is_the_region_table_and_larger_batches_never_add_tiles(self):
        regions = {(r["shape"], r["routing"], r["world"], r["cluster_m"]): r for r in mr.table([2, 4, 8], 128)}
        rows = mr.batch_table([2, 4, 8], [1, 2, 4, 7], 128)
        by = {(r["shape"], r["routing"], r["world"], r["cluster_m"], r["batch"]): r for r in rows}
        for key, r in regions.items():
            self.assertAlmostEqual(by[key + (1,)]["ratio"], r["ratio"], msg=str(key))
            previous = r["ratio"]
            for batch in (2, 4, 7):
                ratio = by[key + (batch,)]["ratio"]
                self.assertLessEqual(ratio, previous + 1e-12, key + (batch,))
                self.assertGreaterEqual(ratio, 1.0 - 1e-12, key + (batch,))
                previous = ratio

    def test_the_figures_decision_0071_quotes(self):
        rows = {(r["shape"], r["routing"], r["world"], r["cluster_m"], r["batch"]): r
                for r in mr.batch_table([8], [1, 7], 128)}
        # Qwen3-like at 8 ranks: every other rank's region in one or two GEMMs takes 1.75x the packed tiles
        # (2x1 cluster) where one GEMM a source takes 4x.
        self.assertEqual(rows[("Qwen3-30B-A3B-like", "uniform", 8, 2, 1)]["ratio"], 4.0)
        self.assertAlmostEqual(rows[("Qwen3-30B-A3B-like", "uniform", 8, 2, 7)]["ratio"], 1.75)
        self.assertAlmostEqual(rows[("Qwen3-30B-A3B-like", "uniform", 8, 1, 7)]["ratio"], 1.25)


class CommandLine(unittest.TestCase):
    def run_script(self, *args):
        return subprocess.run([sys.executable, SCRIPT] + list(args), capture_output=True, text=True)

    def test_markdown_has_a_row_per_shape_and_routing(self):
        r = self.run_script("--markdown")
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.strip().splitlines()
        self.assertTrue(lines[0].startswith("| shape (T, E, k) | routing | W 2, c2x1"), lines[0])
        self.assertEqual(len(lines), 2 + 2 * len(mr.SHAPES))

    def test_batched_markdown_has_a_column_per_world_cluster_and_batch(self):
        r = self.run_script("--worlds", "4,8", "--batches", "1,3")
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.strip().splitlines()
        self.assertTrue(lines[0].startswith("| shape (T, E, k) | routing | W 4, c2x1, batch 1 | W 4, c2x1, batch 3"),
                        lines[0])
        self.assertEqual(lines[0].count("batch"), 8)
        self.assertEqual(len(lines), 2 + 2 * len(mr.SHAPES))

    def test_bad_arguments_are_named(self):
        for args, message in ((("--batches", "0"), "--batches takes positive integers"),
                              (("--batches", "two"), "--batches takes comma-separated integers, got 'two'"),
                              (("--worlds", "x"), "--worlds takes comma-separated integers, got 'x'"),
                              (("--worlds", "0"), "--worlds takes positive integers"),
                              (("--tile-m", "0"), "positive integers")):
            r = self.run_script(*args)
            self.assertEqual(r.returncode, 2, args)
            self.assertIn(message, r.stderr, args)


if __name__ == "__main__":
    unittest.main()
