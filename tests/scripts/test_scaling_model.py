#!/usr/bin/python3
"""Unit tests for scaling_model.py: /usr/bin/python3 tests/scripts/test_scaling_model.py"""
import contextlib
import io
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts")
sys.path.insert(0, HERE)
import scaling_model as sm  # noqa: E402

SCRIPT = os.path.join(HERE, "scaling_model.py")
ALPHA, BW = 20e-6, 3e9
SIZES = [8 * 2 ** k for k in range(26)]  # 8 B .. 256 MiB


def bench_doc(n, alpha=ALPHA, bw=BW, noise=0.03, backend="ring", sizes=SIZES):
    results = []
    for k, b in enumerate(sizes):
        t = (2 * (n - 1) * alpha + 2 * (n - 1) / n * b / bw) * (1 + noise * math.sin(1.7 * k + n))
        results.append({"backend": backend, "bytes": b, "count": b // 4, "type": "f32", "time_us": t * 1e6,
                        "algbw_gbps": b / t / 1e9, "busbw_gbps": b / t / 1e9 * 2 * (n - 1) / n, "wrong": 0})
    return {"ranks": n, "results": results}


def run_records(world_size, median, breakdown, buckets, with_ready=True):
    plan = {"type": "plan", "world_size": world_size, "nodes": 1, "arch": "resnet20", "batch_size": 64,
            "accum_steps": 1, "global_batch": 64 * world_size, "backend": "ring", "threads": 1,
            "params": sum(b[0] for b in buckets) // 4,
            "buckets": [{"bytes": b, "numel": b // 4, "parameters": 3} for b, _ in buckets]}
    summary = {"type": "summary", "median_step_s": median, "img_per_s": 100.0, "world_size": world_size,
               "steps": 60, "breakdown_s": breakdown, "breakdown_steps": 59,
               "buckets": [dict({"bytes": b, "allreduce_s": 0.001}, **({"ready_s": r} if with_ready else {}))
                           for b, r in buckets]}
    train = {"type": "train", "step": 10, "loss": 2.0}
    return [plan, train, train, summary]


BREAKDOWN = {"data_wait": 0.001, "forward": 0.06, "backward": 0.12, "exposed_comm": 0.004, "optimizer": 0.003}
BUCKETS = [(1 << 20, 0.05), (1 << 20, 0.09), (70000, 0.12)]


def write_jsonl(path, records):
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


class Temp(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.dir = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def path(self, name):
        return os.path.join(self.dir, name)

    def write_json(self, name, doc):
        with open(self.path(name), "w") as f:
            json.dump(doc, f)
        return self.path(name)


class FitTest(Temp):
    def test_recovers_alpha_and_bw(self):
        for n in (2, 3, 4):
            fit = sm.fit_ring(sm.load_bench(self.write_json(f"b{n}.json", bench_doc(n))))
            self.assertLess(abs(fit["alpha_s"] / ALPHA - 1), 0.15, fit)
            self.assertLess(abs(fit["bw_Bps"] / BW - 1), 0.05, fit)
            self.assertLess(fit["median_rel_err"], 0.04)

    def test_too_few_sizes_and_wrong_backend(self):
        path = self.write_json("few.json", bench_doc(2, sizes=[8, 1 << 20]))
        with self.assertRaisesRegex(sm.InputError, "few.json.*usable sizes"):
            sm.load_bench(path)
        path = self.write_json("mpi.json", bench_doc(2, backend="mpi"))
        self.assertEqual(sm.load_bench(path)["backend"], "mpi")  # default falls back to the only backend
        with self.assertRaisesRegex(sm.InputError, "mpi.json.*backend 'ring'"):
            sm.load_bench(path, "ring")

    def test_wrong_results_are_dropped(self):
        doc = bench_doc(2)
        doc["results"][0]["wrong"] = 5
        self.assertEqual(len(sm.load_bench(self.write_json("w.json", doc))["bytes"]), len(SIZES) - 1)


class HierarchicalTest(unittest.TestCase):
    def test_single_node_is_flat_ring(self):
        links = sm.Links()
        for g in (2, 4, 8):
            self.assertAlmostEqual(sm.hierarchical_time(1e8, g, links),
                                   sm.ring_time(1e8, g, links.nvlink_alpha, links.nvlink_bw), places=15)

    def test_two_nodes_by_hand(self):
        # 16 GPUs = 2 nodes x 8, 1 GB: NVLink RS+AG 14*5us + 1.75 GB/370 GB/s; IB 2*10us + 2*(1/2)*(1/8 GB)/48 GB/s
        want = 70e-6 + 1.75 / 370 + 20e-6 + 0.125 / 48
        self.assertAlmostEqual(sm.hierarchical_time(1e9, 16, sm.Links()), want, places=12)
        self.assertAlmostEqual(want, 7.42390e-3, places=7)

    def test_partial_node_is_an_error(self):
        with self.assertRaises(sm.InputError):
            sm.hierarchical_time(1e6, 12, sm.Links())


class StepTest(unittest.TestCase):
    compute = sm.Compute(data_wait=0.001, forward=0.06, backward=0.12, optimizer=0.003)

    def test_free_comm_gives_compute(self):
        buckets = [sm.Bucket(b, r) for b, r in BUCKETS]
        r = sm.simulate_step(self.compute, buckets, lambda nb: 0.0)
        self.assertAlmostEqual(r["step_overlap_s"], self.compute.single)
        self.assertAlmostEqual(r["step_no_overlap_s"], self.compute.single)
        self.assertAlmostEqual(r["eff_overlap"], 1.0)

    def test_one_bucket_at_end_overlap_equals_no_overlap(self):
        r = sm.simulate_step(self.compute, [sm.Bucket(1e9, 0.12)], lambda nb: nb / 1e10)
        self.assertAlmostEqual(r["step_overlap_s"], r["step_no_overlap_s"])
        self.assertAlmostEqual(r["step_overlap_s"], self.compute.single + 0.1)

    def test_early_buckets_overlap(self):
        buckets = [sm.Bucket(1e8, 0.02), sm.Bucket(1e8, 0.06), sm.Bucket(1e8, 0.12)]
        r = sm.simulate_step(self.compute, buckets, lambda nb: nb / 1e10)  # 10 ms each
        self.assertLess(r["step_overlap_s"], r["step_no_overlap_s"])
        self.assertAlmostEqual(r["exposed_comm_s"], 0.01)  # only the last bucket sticks out
        self.assertAlmostEqual(r["comm_total_s"], 0.03)

    def test_ready_spread_by_bytes_when_missing(self):
        got = sm.ready_times([sm.Bucket(1.0), sm.Bucket(3.0)], 0.12)
        self.assertAlmostEqual(got[0], 0.03)
        self.assertAlmostEqual(got[1], 0.12)

    def test_compute_step_scaling(self):
        c, b = sm.scale_compute(self.compute, [sm.Bucket(10, 0.06)], 0.5)
        self.assertAlmostEqual(c.forward + c.backward + c.optimizer, 0.0915)
        self.assertAlmostEqual(b[0].ready, 0.03)
        self.assertAlmostEqual(c.data_wait, 0.001)


class ParserTest(Temp):
    def test_last_run_is_used(self):
        path = self.path("two.jsonl")
        write_jsonl(path, run_records(2, 0.5, BREAKDOWN, BUCKETS) + run_records(2, 0.25, BREAKDOWN, BUCKETS))
        self.assertEqual(sm.load_run(path)["median_step_s"], 0.25)
        self.assertEqual(sm.load_run(path, 0)["median_step_s"], 0.5)
        run = sm.load_run(path)
        self.assertEqual([b.ready for b in run["buckets"]], [0.05, 0.09, 0.12])

    def test_unmeasured_ready_times(self):
        path = self.path("one.jsonl")
        write_jsonl(path, run_records(1, 0.2, BREAKDOWN, [(b, 0.0) for b, _ in BUCKETS]))
        self.assertEqual([b.ready for b in sm.load_run(path)["buckets"]], [None] * 3)
        write_jsonl(path, run_records(2, 0.2, BREAKDOWN, BUCKETS, with_ready=False))
        self.assertEqual([b.ready for b in sm.load_run(path)["buckets"]], [None] * 3)

    def test_unfinished_run_after_complete_one_is_skipped(self):
        path = self.path("three.jsonl")
        write_jsonl(path, run_records(2, 0.5, BREAKDOWN, BUCKETS) + run_records(2, 0.25, BREAKDOWN, BUCKETS)[:2])
        self.assertEqual(sm.load_run(path)["median_step_s"], 0.5)

    def test_missing_summary_names_file(self):
        path = self.path("nosummary.jsonl")
        write_jsonl(path, run_records(2, 0.5, BREAKDOWN, BUCKETS)[:-1])
        with self.assertRaisesRegex(sm.InputError, "nosummary.jsonl.*summary"):
            sm.load_run(path)

    def test_malformed_line_names_file_and_line(self):
        path = self.path("bad.jsonl")
        with open(path, "w") as f:
            f.write(json.dumps(run_records(2, 0.5, BREAKDOWN, BUCKETS)[0]) + "\n{not json\n")
        with self.assertRaisesRegex(sm.InputError, "bad.jsonl:2: malformed"):
            sm.load_run(path)


class SelfcheckTest(Temp):
    def make_dir(self):
        # Runs whose measured step is what the model says for a flat ring with ALPHA/BW (+2%).
        for n in (2, 3, 4):
            self.write_json(f"allreduce_np{n}.json", bench_doc(n, noise=0.0))
            bd = dict(BREAKDOWN, forward=0.06 * n, backward=0.12 * n)
            c = sm.Compute(bd["data_wait"], bd["forward"], bd["backward"], bd["optimizer"])
            buckets = [(b, r * n) for b, r in BUCKETS]
            want = sm.simulate_step(c, [sm.Bucket(b, r) for b, r in buckets],
                                    lambda nb, n=n: sm.ring_time(nb, n, ALPHA, BW))["step_overlap_s"]
            # rank 0's phases sum to its mean step, the measurement compared with: 2% above the model
            bd["exposed_comm"] = want * 1.02 - c.single
            write_jsonl(self.path(f"train_np{n}.jsonl"), run_records(n, want, bd, buckets))
        write_jsonl(self.path("train_np1.jsonl"), run_records(1, 0.19, BREAKDOWN, BUCKETS))

    def test_rows_for_2_3_4(self):
        self.make_dir()
        benches = sm._numbered_files(self.dir, r"allreduce_np(\d+)\.json")
        runs = sm._numbered_files(self.dir, r"train_np(\d+)\.jsonl")
        rows = sm.selfcheck(benches, runs)
        self.assertEqual([r["ranks"] for r in rows], [2, 3, 4])
        for r in rows:
            self.assertAlmostEqual(r["error_pct"], 100 * (1 / 1.02 - 1), places=3)
            self.assertLess(r["error_1rank_compute_pct"], r["error_pct"])  # less compute with 1 rank
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = sm.main(["selfcheck", "--bench-dir", self.dir, "--runs-dir", self.dir, "--markdown",
                            "--backend", "ring", "--json", self.path("sc.json")])
        self.assertEqual(code, 0)
        self.assertIn("| 4 |", out.getvalue())
        self.assertEqual(out.getvalue().count("%"), 3 * 3)  # fit error, error, error with 1-rank compute
        with open(self.path("sc.json")) as f:
            self.assertEqual(len(json.load(f)["rows"]), 3)

    def test_slowest_rank_sets_the_pace(self):
        # Rank 1 computes 0.1 s longer than rank 0; rank 0 waits for it inside exposed_comm. The prediction
        # must use rank 1's compute (and report the skew), not rank 0's.
        n = 2
        self.write_json("allreduce_np2.json", bench_doc(n, noise=0.0))
        fast = dict(BREAKDOWN)
        slow = dict(BREAKDOWN, backward=BREAKDOWN["backward"] + 0.1)
        cs = sm.Compute(slow["data_wait"], slow["forward"], slow["backward"], slow["optimizer"])
        stretch = slow["backward"] / fast["backward"]
        want = sm.simulate_step(cs, [sm.Bucket(b, r * stretch) for b, r in BUCKETS],
                                lambda nb: sm.ring_time(nb, n, ALPHA, BW))["step_overlap_s"]
        fast["exposed_comm"] = want - (fast["data_wait"] + fast["forward"] + fast["backward"] + fast["optimizer"])
        records = run_records(n, want, fast, BUCKETS)
        records[-1]["breakdown_by_rank_s"] = [fast, slow]
        write_jsonl(self.path("train_np2.jsonl"), records)
        rows = sm.selfcheck({2: self.path("allreduce_np2.json")}, {2: self.path("train_np2.jsonl")})
        self.assertAlmostEqual(rows[0]["error_pct"], 0.0, places=6)
        self.assertAlmostEqual(rows[0]["rank_skew_s"], 0.1, places=9)
        records[-1]["breakdown_by_rank_s"] = [fast, {"forward": 1}]
        write_jsonl(self.path("train_np2.jsonl"), records)
        with self.assertRaisesRegex(sm.InputError, "train_np2.jsonl: summary.breakdown_by_rank_s"):
            sm.load_run(self.path("train_np2.jsonl"))

    def test_nothing_to_compare(self):
        with self.assertRaisesRegex(sm.InputError, "no world size"):
            sm.selfcheck({2: "x.json"}, {3: "y.jsonl"})


class CliTest(Temp):
    def cli(self, *args):
        return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=60)

    def test_fit(self):
        bench = self.write_json("bench.json", bench_doc(3))
        p = self.cli("fit", bench, "--json", self.path("fit.json"))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("alpha =", p.stdout)
        with open(self.path("fit.json")) as f:
            self.assertAlmostEqual(json.load(f)["bw_gbps"], 3.0, delta=0.15)

    def test_predict(self):
        run = self.path("run.jsonl")
        write_jsonl(run, run_records(2, 0.2, BREAKDOWN, BUCKETS))
        p = self.cli("predict", "--run", run, "--compute-step-s", "0.032", "--markdown")
        self.assertEqual(p.returncode, 0, p.stderr)
        lines = [l for l in p.stdout.splitlines() if l.startswith("| ")]
        self.assertEqual([l.split("|")[1].strip() for l in lines[1:]], [str(2 ** k) for k in range(3, 11)])
        p = self.cli("predict", "--run", run, "--gpus", "1,8,16")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("100.0%", p.stdout)  # 1 GPU: no communication
        # A fixed optimizer share: forward + backward take the rest of the step, in the run's proportion.
        p = self.cli("predict", "--run", run, "--compute-step-s", "0.032", "--optimizer-s", "0.002",
                     "--data-wait-s", "0")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("forward 0.0100 + backward 0.0200 + optimizer 0.0020 = 0.0320 s", p.stdout)
        p = self.cli("predict", "--run", run, "--compute-step-s", "0.032", "--optimizer-s", "0.05")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--optimizer-s 0.05 must be below the compute per step", p.stderr)

    def test_bad_files(self):
        bad = self.path("broken.json")
        with open(bad, "w") as f:
            f.write("{oops")
        p = self.cli("fit", bad)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("broken.json", p.stderr)
        p = self.cli("predict", "--run", self.path("missing.jsonl"))
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("missing.jsonl", p.stderr)


if __name__ == "__main__":
    unittest.main()
