"""Convergence results over seeds: Student's t quantile, paired differences with their 95% interval, the "within
noise" verdict and the one-seed case (repro/stats.py, repro/ours.py), seeds in train scenarios and the runner's
--seeds/--steps/--parallel (repro/scenario.py, repro/run.py), merging seed runs made at different times
(repro/merge_runs.py), and the report's interval columns and loss bands (reports/)."""

import json
import math
import os
import subprocess
import sys
import threading
import time
import unittest

import h5py
import pandas as pd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, ROOT)

import repro_test_util as util  # noqa: E402
import train_cells_test_util as fake  # noqa: E402
from reports import report, result_file, train_report  # noqa: E402
from repro import merge_runs, ours, run, scenario, stats, train_cells  # noqa: E402

SCENARIOS = os.path.join(ROOT, "repro", "scenarios")
RUN_PY = os.path.join(ROOT, "repro", "run.py")
MERGE_PY = os.path.join(ROOT, "repro", "merge_runs.py")


def loss_deviation():
    return scenario.load(os.path.join(SCENARIOS, "loss_deviation.toml"))


def row_named(rows, start):
    (r,) = [r for r in rows if r["row"].startswith(start)]
    return r


class TQuantile(unittest.TestCase):
    def test_known_quantiles(self):
        # Two-sided 95% critical values of Student's t (any table): df 1, 2, 4, 10, 30.
        for df, t in ((1, 12.706), (2, 4.303), (4, 2.776), (10, 2.228), (30, 2.042)):
            self.assertAlmostEqual(stats.t_quantile(0.975, df), t, places=3, msg=f"df {df}")
        self.assertAlmostEqual(stats.t_quantile(0.995, 5), 4.032, places=3)
        self.assertAlmostEqual(stats.t_quantile(0.025, 4), -2.776, places=3)
        self.assertAlmostEqual(stats.t_quantile(0.5, 7), 0.0, places=9)

    def test_cdf(self):
        self.assertAlmostEqual(stats.t_cdf(0.0, 3), 0.5)
        self.assertAlmostEqual(stats.t_cdf(1.0, 1), 0.75)  # Cauchy: 1/2 + atan(1)/pi
        self.assertAlmostEqual(stats.t_cdf(-2.0, 7), 0.0428, places=4)
        self.assertAlmostEqual(stats.t_cdf(stats.t_quantile(0.9, 6), 6), 0.9, places=10)
        self.assertAlmostEqual(stats.regularized_beta(0.3, 1.0, 1.0), 0.3)  # uniform

    def test_bad_arguments(self):
        for f in (lambda: stats.t_quantile(1.0, 3), lambda: stats.t_quantile(0.0, 3),
                  lambda: stats.t_quantile(0.9, 0), lambda: stats.t_cdf(1.0, -1),
                  lambda: stats.regularized_beta(1.5, 1, 1)):
            with self.assertRaises(ValueError):
                f()


class PairedIntervals(unittest.TestCase):
    def test_hand_computed_interval_within_noise(self):
        # d = 1, 2, 3 %: mean 2, sd 1, t_{0.975,2} = 4.3027 -> 2 -+ 4.3027 / sqrt(3) = [-0.484, 4.484]
        p = stats.paired_percent([101.0, 102.0, 103.0], [100.0, 100.0, 100.0])
        self.assertEqual(p.n, 3)
        self.assertAlmostEqual(p.mean, 2.0)
        self.assertAlmostEqual(p.low, -0.4841, places=3)
        self.assertAlmostEqual(p.high, 4.4841, places=3)
        self.assertEqual(p.verdict, "within noise")

    def test_hand_computed_interval_outside_noise(self):
        # d = 2, 2.5, 1.5, 2 %: mean 2, sd sqrt(0.5 / 3) = 0.40825, t_{0.975,3} = 3.1824 -> half 0.6496
        p = stats.paired_percent([102.0, 102.5, 101.5, 102.0], [100.0] * 4)
        self.assertAlmostEqual(p.low, 1.3504, places=3)
        self.assertAlmostEqual(p.high, 2.6496, places=3)
        self.assertEqual(p.verdict, "outside noise")

    def test_one_seed_has_no_interval(self):
        p = stats.paired_percent([101.0], [100.0])
        self.assertAlmostEqual(p.mean, 1.0)
        self.assertTrue(math.isnan(p.low) and math.isnan(p.high))
        self.assertEqual(p.verdict, "1 seed: no interval")
        self.assertEqual(stats.spread([4.8]).text("bf16"), "bf16 1 seed: no spread")

    def test_spread(self):
        s = stats.spread([4.0, 6.0])
        self.assertEqual((s.n, s.mean), (2, 5.0))
        self.assertAlmostEqual(s.sd, math.sqrt(2.0))
        self.assertAlmostEqual(s.rel_sd_pct, 100 * math.sqrt(2.0) / 5)
        with self.assertRaises(ValueError):
            stats.paired_percent([1.0], [1.0, 2.0])


def seed_cells(val):
    """The loss_deviation cells table at default scale with val_loss[(recipe, seed)] from `val`."""
    s = loss_deviation()
    spec = s.train
    rows = []
    for c in train_cells.expand(s, "default", sorted({seed for _, seed in val})):
        o = train_cells.Outcome(status="ok", exit_code=0, elapsed_s=1.0, run=train_cells.run_name(c), out_path="x",
                                metrics={"val_loss": val[(c.recipe, c.seed)], "train_loss": val[(c.recipe, c.seed)],
                                         "val_tokens": 65536})
        rows.append(train_cells.table_row(c, o, spec, 1000))
    return s, train_cells.table_frame(rows)


class SeedRows(unittest.TestCase):
    def test_paired_rows_noise_floor_and_tokens(self):
        base = {1234: 4.80, 1235: 4.90, 1236: 5.00}
        val = {}
        for seed, b in base.items():
            val[("bf16", seed)] = b
            val[("fp8", seed)] = b * (1 + {1234: 0.01, 1235: 0.02, 1236: 0.03}[seed])    # +1, +2, +3 %
            val[("mxfp4", seed)] = b * (1 + {1234: 0.020, 1235: 0.025, 1236: 0.015}[seed])  # +2, +2.5, +1.5 %
        s, df = seed_cells(val)
        rows = ours.repro_rows(s, df)
        fp8 = row_named(rows, "fp8 against bf16: final validation loss")
        self.assertAlmostEqual(fp8["ours"], 2.0)
        self.assertAlmostEqual(fp8["ci_low"], -0.4841, places=3)
        self.assertEqual((fp8["verdict"], fp8["count"]), ("within noise", 3))
        self.assertIn("bf16 sd 0.1 (2.04% of 4.9), n = 3 seeds", fp8["spread"])
        mx = row_named(rows, "mxfp4 against bf16: final validation loss")
        sd = math.sqrt(((2 - 2) ** 2 + (2.5 - 2) ** 2 + (1.5 - 2) ** 2) / 2)
        half = stats.t_quantile(0.975, 2) * sd / math.sqrt(3)
        self.assertAlmostEqual(mx["ci_high"], 2 + half, places=9)
        self.assertEqual(mx["verdict"], "outside noise")
        floor = row_named(rows, "noise floor")
        self.assertAlmostEqual(floor["ours"], 0.1)
        self.assertIn("n = 3 seeds", floor["spread"])
        self.assertEqual(row_named(rows, "validation tokens")["ours"], 65536)
        self.assertAlmostEqual(row_named(rows, "bf16: final validation loss, mean")["ours"], 4.9)

    def test_one_seed_says_so(self):
        s, df = seed_cells({("bf16", 1234): 4.8, ("fp8", 1234): 4.848, ("mxfp4", 1234): 4.8})
        fp8 = row_named(ours.repro_rows(s, df), "fp8 against bf16: final validation loss")
        self.assertAlmostEqual(fp8["ours"], 1.0)
        self.assertEqual(fp8["verdict"], "1 seed: no interval")
        self.assertTrue(math.isnan(fp8["ci_low"]))

    def test_report_shows_interval_spread_and_verdict(self):
        s, df = seed_cells({(r, seed): 4.8 + 0.01 * (seed - 1234) + (0.02 if r == "fp8" else 0)
                            for r in ("bf16", "fp8", "mxfp4") for seed in (1234, 1235)})
        md = report.repro_markdown(pd.DataFrame(ours.repro_rows(s, df)))
        self.assertIn("95% interval (t, over seeds)", md)
        self.assertIn("within noise", md)  # mxfp4 = bf16 exactly: interval [0, 0]
        line = [x for x in md.splitlines() if x.startswith("| fp8 against bf16: final validation")][0]
        self.assertIn("outside noise", line)
        self.assertRegex(line, r"\[\+0\.4\d*, \+0\.4\d*\]")


class ScenarioSeeds(util.Tmp):
    def write(self, text):
        path = self.path("s.toml")
        with open(path, "w") as f:
            f.write(text)
        return path

    def base(self, seeds="", rule=None):
        with open(os.path.join(SCENARIOS, "loss_deviation.toml")) as f:
            text = f.read()
        text = text.replace("[seeds]\nsmoke = [1234, 1235]", "[seeds]\n" + seeds + "\nsmoke = [1234, 1235]", 1) \
            if seeds else text
        return text if rule is None else text.replace('match = ["shape", "case", "seed"]', rule, 1)

    def test_seeds_per_scale_and_their_cells(self):
        s = loss_deviation()
        cells = train_cells.expand(s, "smoke")
        self.assertEqual([(c.seed, c.recipe) for c in cells], [(1234, "bf16"), (1234, "fp8"), (1234, "mxfp4"),
                                                                (1235, "bf16"), (1235, "fp8"), (1235, "mxfp4")])
        args = train_cells.cell_args(cells[3], s.train, 60)
        self.assertEqual(args[args.index("--train.seed") + 1], "1235")
        self.assertEqual(train_cells.run_name(cells[3]), "loss_deviation-small-bf16-config-s1235")
        self.assertEqual([c.seed for c in train_cells.expand(s, "smoke", [7])], [7, 7, 7])

    def test_bad_seeds_and_rules_are_refused(self):
        text = self.base()
        for old, new, msg in (
                ("smoke = [1234, 1235]", "smoke = []", "[seeds] smoke must be a non-empty list of integers >= 0"),
                ("smoke = [1234, 1235]", "smoke = [1234, 1234]", "[seeds] smoke lists a seed twice"),
                ("smoke = [1234, 1235]", "smoke = [-1]", "integers >= 0"),
                ('match = ["shape", "case", "seed"]', 'match = ["shape", "case"]', 'must include "seed"'),
                ('args = ["--train.checkpoint_interval", "0"]', 'args = ["--train.seed", "3"]',
                 "sets --train.seed, which the runner sets")):
            with self.subTest(new=new):
                with self.assertRaises(scenario.ScenarioError) as e:
                    scenario.load(self.write(text.replace(old, new, 1)))
                self.assertIn(msg, str(e.exception))


class ParallelCells(unittest.TestCase):
    def test_cells_overlap_and_report_as_they_finish(self):
        running, peak, lock, reported = [0], [0], threading.Lock(), []

        def run_one(i, cell):
            with lock:
                running[0] += 1
                peak[0] = max(peak[0], running[0])
            time.sleep(0.3 if i == 0 else 0.05)
            with lock:
                running[0] -= 1
            return f"outcome {cell}"

        out = run.run_cells(["a", "b", "c", "d"], run_one, 3, lambda i, c, o: reported.append(i))
        self.assertEqual(out, ["outcome a", "outcome b", "outcome c", "outcome d"])
        self.assertEqual(peak[0], 3)
        self.assertEqual(sorted(reported), [0, 1, 2, 3])
        self.assertNotEqual(reported[0], 0)  # the slow first cell finished last, reported when it did
        reported.clear()
        run.run_cells(["a", "b"], run_one, 1, lambda i, c, o: reported.append(i))
        self.assertEqual(reported, [0, 1])


class RunSeedsWithFakeTrainer(util.Tmp):
    def fake_build(self, **behaviour):
        build = self.path("build")
        os.makedirs(build, exist_ok=True)
        cfg = self.path("fake.json")
        with open(cfg, "w") as f:
            json.dump({"argv_log": self.path("argv.jsonl"), **behaviour}, f)
        fake.write_fake_fp4moe(os.path.join(build, "fp4moe"), cfg)
        shards = self.path("shards")
        os.makedirs(shards, exist_ok=True)
        open(os.path.join(shards, "train_000.bin"), "wb").close()
        return build, shards

    def run_py(self, build, shards, out, *args):
        return subprocess.run([sys.executable, RUN_PY, "--build", build, "--out", self.path(out), "--scale", "smoke",
                               "--only", "loss_deviation", "--data", shards, *args],
                              capture_output=True, text=True, timeout=600)

    def run_file(self, out):
        (h5,) = [n for n in os.listdir(self.path(out)) if n.endswith(".h5")]
        return self.path(out, h5)

    def test_parallel_seeds_with_one_failing_recipe(self):
        build, shards = self.fake_build(crash_recipes=["mxfp4"], seed_val_shift={"1235": 0.1})
        r = self.run_py(build, shards, "runs", "--parallel", "3", "--seeds", "1234,1235", "--steps", "4")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)  # a crashed cell fails the suite, not the file
        self.assertNotIn("Traceback", r.stderr)
        self.assertIn("3 at a time", r.stdout)
        self.assertIn("(6/6 runs done", r.stdout)
        with h5py.File(self.run_file("runs"), "r") as f:
            cells = result_file.read_table(f["bench/train_loss"])
            rows = result_file.read_table(f["repro/loss_deviation"])
            self.assertEqual(len(f["train"]), 4)  # the bf16 and fp8 runs of both seeds
        self.assertEqual(sorted(cells["seed"]), [1234, 1234, 1234, 1235, 1235, 1235])
        self.assertEqual(set(cells["steps"]), {4})
        crashed = cells[cells["recipe"] == "mxfp4"]
        self.assertEqual(set(crashed["status"]), {"failed"})
        self.assertTrue(all("Segmentation fault" in n for n in crashed["note"]))
        ok = cells[cells["recipe"] != "mxfp4"]
        self.assertEqual(set(ok["status"]), {"ok"})
        self.assertEqual(set(ok["val_tokens"]), {65536})
        fp8 = rows[rows["row"].str.startswith("fp8 against bf16: final validation")].iloc[0]
        # fake: bf16 4.80 + shift, fp8 4.82 + shift; shifts 0 and 0.1 -> d = (4.82/4.80 - 1), (4.92/4.90 - 1)
        d = [(4.82 / 4.80 - 1) * 100, (4.92 / 4.90 - 1) * 100]
        self.assertAlmostEqual(fp8["ours"], sum(d) / 2)
        self.assertEqual(fp8["verdict"], "outside noise")
        mx = rows[rows["row"].str.startswith("mxfp4 against bf16: final validation")].iloc[0]
        self.assertTrue(math.isnan(mx["ours"]))
        self.assertIn("failed", mx["note"])

    def test_bad_overrides_are_one_line_errors(self):
        build, shards = self.fake_build()
        for args, msg in ((["--seeds", "1234,x"], "--seeds must be a non-empty list of integers >= 0"),
                          (["--seeds", "5,5"], "--seeds lists a seed twice"),
                          (["--steps", "0"], "--steps must be >= 1"),
                          (["--parallel", "0"], "--parallel must be >= 1")):
            with self.subTest(args=args):
                r = self.run_py(build, shards, "runs", *args)
                self.assertEqual(r.returncode, 2)
                self.assertIn(msg, r.stderr)
                self.assertNotIn("Traceback", r.stderr)

    def test_configs_keeps_only_the_named_configurations_cells(self):
        build, shards = self.fake_build()
        ladder = ["--build", build, "--scale", "smoke", "--only", "mxfp4_ladder", "--data", shards, "--steps", "6"]
        r = subprocess.run([sys.executable, RUN_PY, "--out", self.path("runs"), *ladder, "--configs", "small"],
                           capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("2 training cell(s)", r.stdout)  # smoke: fp8 and + Wgrad H16 of small, not of dense_small
        with h5py.File(self.run_file("runs"), "r") as f:
            cells = result_file.read_table(f["bench/train_ladder"])
            self.assertEqual(result_file.text(f["repro/mxfp4_ladder"].attrs["configs"]), "small")
        self.assertEqual(set(cells["shape"]), {"small"})
        self.assertEqual(sorted(cells["recipe"]), ["fp8", "wgrad_h16"])
        r = subprocess.run([sys.executable, RUN_PY, "--out", self.path("bad"), *ladder, "--configs", "smal"],
                           capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--configs smal: not a configuration of the training scenarios run (they have: dense_small, "
                      "small)", r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        self.assertFalse(os.path.exists(self.path("bad")) and any(n.endswith(".h5") for n in os.listdir(self.path("bad"))))

    def test_seed_runs_of_different_days_merge_and_disagreeing_ones_are_refused(self):
        build, shards = self.fake_build(seed_val_shift={"1235": 0.1, "1236": 0.05},
                                        recipe_seed_shift={"fp8 1236": 0.03})
        for out, seeds, steps in (("day1", "1234,1235", "4"), ("day2", "1236", "4"), ("other", "1237", "6"),
                                  ("again", "1235", "4")):
            r = self.run_py(build, shards, out, "--seeds", seeds, "--steps", steps, "--parallel", "2")
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with h5py.File(self.run_file("day2"), "r+") as f:  # a run of another commit merges, with a note
            f.attrs["git_sha"] = "0123abc"
        merged = self.path("merged.h5")
        r = subprocess.run([sys.executable, MERGE_PY, "--out", merged, self.run_file("day1"), self.run_file("day2"),
                            "--report-dir", self.path("report")], capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("the inputs come from different commits", r.stderr)
        with h5py.File(merged, "r") as f:
            self.assertIn("0123abc: " + os.path.basename(self.run_file("day2")),
                          result_file.text(f.attrs["merged_git_shas"]))
            cells = result_file.read_table(f["bench/train_loss"])
            rows = result_file.read_table(f["repro/loss_deviation"])
            self.assertEqual(len(f["train"]), 9)
            # the inputs' scale, which the plots' titles read
            self.assertEqual(result_file.text(f["repro/loss_deviation"].attrs["scale"]), "smoke")
        self.assertEqual(sorted(set(cells["seed"])), [1234, 1235, 1236])
        fp8 = rows[rows["row"].str.startswith("fp8 against bf16: final validation")].iloc[0]
        d = [(4.82 / 4.80 - 1) * 100, (4.92 / 4.90 - 1) * 100, (4.90 / 4.85 - 1) * 100]
        self.assertAlmostEqual(fp8["ours"], sum(d) / 3)
        self.assertEqual(fp8["count"], 3)
        with open(self.path("report", "TABLES.md")) as f:
            tables = f.read()
        self.assertIn("n = 3 seeds", tables)
        self.assertIn("3 seeds (1234, 1235, 1236), merged from", tables)
        self.assertIn(report.SEED_METHOD, tables)
        self.assertTrue(os.path.exists(self.path("report", "loss_deviation_loss.png")))

        for other, msg in (("other", "steps 4 in"), ("again", "seed 1235 is in both")):
            with self.subTest(other=other):
                out = self.path(f"refused-{other}.h5")
                r = subprocess.run([sys.executable, MERGE_PY, "--out", out, self.run_file("day1"),
                                    self.run_file(other)], capture_output=True, text=True, timeout=600)
                self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
                self.assertIn(msg, r.stderr)
                self.assertNotIn("Traceback", r.stderr)
                self.assertFalse(os.path.exists(out))


class LossBands(util.Tmp):
    def test_mean_and_band_over_seeds(self):
        def one(shift):
            steps = pd.DataFrame({"step": [1, 2, 3], "tokens": [10, 20, 30], "loss": [5.0 + shift, 4.0 + shift,
                                                                                      3.0 + shift]})
            ev = pd.DataFrame({"step": [3], "tokens": [30], "val_loss": [3.5 + shift]})
            return {"steps": steps, "eval": ev, "attrs": {}}
        path = self.path("bands.png")
        self.assertTrue(train_report.plot_loss_bands({"bf16": [one(0.0), one(0.2)], "fp8": [one(0.1)]}, path,
                                                     smooth=1))
        with open(path, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
        x, mean, lo, hi = train_report._band([(pd.Series([1, 2]).values, pd.Series([1.0, 2.0]).values),
                                              (pd.Series([1, 2, 3]).values, pd.Series([3.0, 4.0, 5.0]).values)])
        self.assertEqual(list(mean), [2.0, 3.0])
        self.assertEqual((list(lo), list(hi)), ([1.0, 2.0], [3.0, 4.0]))
        self.assertFalse(train_report.plot_loss_bands({}, self.path("none.png")))


if __name__ == "__main__":
    unittest.main()
