"""scripts/runs/loss_deviation.py (merge, summary) on small result files made here, and scripts/runs/loss_deviation.sh
end to end with a stand-in for `fp4moe train` (a Python script that records its arguments and writes a result file
as the trainer does), so the script's runs, recipes, seed, merge, table and report are checked without a GPU."""

import importlib.util
import os
import stat
import subprocess
import sys
import tempfile
import unittest

import h5py
import numpy as np

from reports import result_file, train_report

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "runs", "loss_deviation.sh")
_spec = importlib.util.spec_from_file_location("loss_deviation", os.path.join(ROOT, "scripts", "runs",
                                                                              "loss_deviation.py"))
loss_deviation = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(loss_deviation)


def write_result(path, run, val_loss, steps=20):
    """A result file as fp4moe train writes it: root attributes, /train/<run>/steps and /eval, /memory/<run>."""
    with h5py.File(path, "w") as f:
        for k in result_file.ROOT_ATTRIBUTES:
            result_file.set_attribute(f, k, result_file.SCHEMA_VERSION if k == "schema_version" else f"test {k}")
        s = np.arange(1, steps + 1)
        result_file.write_table(f, f"train/{run}/steps", [
            ("step", "i64", s), ("tokens", "i64", s * 100), ("loss", "f64", np.linspace(10, val_loss, steps)),
            ("lr", "f64", np.full(steps, 1e-3)), ("grad_norm", "f64", np.ones(steps)),
            ("tokens_per_s", "f64", np.full(steps, 1e5)), ("mfu", "f64", np.full(steps, 0.1)),
            ("peak_act_gib", "f64", np.full(steps, 1.0)), ("peak_total_gib", "f64", np.full(steps, 2.0)),
            ("skipped", "i64", np.zeros(steps))])
        result_file.write_table(f, f"train/{run}/eval", [
            ("step", "i64", np.array([steps])), ("tokens", "i64", np.array([steps * 100])),
            ("val_loss", "f64", np.array([val_loss]))])
        result_file.write_table(f, f"memory/{run}", [
            ("category", "str", ["activations", "total"]), ("peak_bytes", "i64", np.array([1 << 30, 2 << 30])),
            ("peak_gib", "f64", np.array([1.0, 2.0]))])


class LossDeviationPyTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def path(self, name):
        return os.path.join(self.dir, name)

    def test_merge_and_summary(self):
        for run, v in (("bf16", 4.0), ("fp8", 4.0116), ("mxfp4", 4.0244)):
            write_result(self.path(f"{run}.h5"), run, v)
        out = self.path("all.h5")
        runs = loss_deviation.merge_train_runs(out, [self.path(f"{r}.h5") for r in ("bf16", "fp8", "mxfp4")])
        self.assertEqual(runs, ["bf16", "fp8", "mxfp4"])
        with h5py.File(out, "r") as f:
            self.assertEqual(sorted(f["train"]), ["bf16", "fp8", "mxfp4"])
            self.assertEqual(sorted(f["memory"]), ["bf16", "fp8", "mxfp4"])
            self.assertEqual(result_file.text(f.attrs["git_sha"]), "test git_sha")
        dev = train_report.deviation(train_report.load_train_runs(out), "bf16")
        self.assertAlmostEqual(dev["fp8"], 0.0029, places=6)
        self.assertAlmostEqual(dev["mxfp4"], 0.0061, places=6)
        lines, _ = loss_deviation.summary_lines(out)
        text = "\n".join(lines)
        self.assertIn("| fp8 | 20 | 2,000 | 4.0116 | +0.29% | +0.29% |", text)
        self.assertIn("| mxfp4 | 20 | 2,000 | 4.0244 | +0.61% | +0.61% |", text)
        self.assertIn("| bf16 | 20 | 2,000 | 4.0000 | +0.00% | - |", text)
        self.assertEqual(os.listdir(self.dir).count("all.h5"), 1)

    def test_merge_refuses_a_duplicate_run_and_leaves_nothing(self):
        write_result(self.path("a.h5"), "bf16", 4.0)
        write_result(self.path("b.h5"), "bf16", 4.1)
        out = self.path("all.h5")
        with self.assertRaises(loss_deviation.MergeError):
            loss_deviation.merge_train_runs(out, [self.path("a.h5"), self.path("b.h5")])
        self.assertFalse([n for n in os.listdir(self.dir) if n.startswith("all.h5")])
        self.assertEqual(loss_deviation.main(["merge", out, self.path("a.h5"), self.path("missing.h5")]), 2)

    def test_summary_without_baseline_fails(self):
        write_result(self.path("fp8.h5"), "fp8", 4.0)
        self.assertEqual(loss_deviation.main(["summary", self.path("fp8.h5")]), 1)


# Stands in for `fp4moe train`: appends its arguments to ARGS_LOG, writes --out with --run, the validation loss
# chosen by the routed and attention recipes; fails when FAIL_RUN names the run.
STUB = r'''#!{python}
import os, sys
sys.path.insert(0, {root!r})
sys.path.insert(0, {here!r})
from test_loss_deviation import write_result
args = sys.argv[1:]
with open(os.environ["ARGS_LOG"], "a") as f:
    f.write(" ".join(args) + "\n")
opt = {{args[i]: args[i + 1] for i in range(1, len(args) - 1) if args[i].startswith("--")}}
run = opt["--run"]
if os.environ.get("FAIL_RUN") == run:
    sys.exit(3)
loss = {{"bf16": 4.0, "fp8": 4.0116}}[opt["--recipe.attention"]] + (0.0128 if opt["--recipe.routed_experts"] == "mxfp4" else 0)
write_result(opt["--out"], run, loss)
'''


class LossDeviationScriptTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.build = os.path.join(self.tmp.name, "build")
        os.makedirs(self.build)
        exe = os.path.join(self.build, "fp4moe")
        with open(exe, "w") as f:
            f.write(STUB.format(python=sys.executable, root=ROOT, here=os.path.dirname(os.path.abspath(__file__))))
        os.chmod(exe, os.stat(exe).st_mode | stat.S_IXUSR)
        self.args_log = os.path.join(self.tmp.name, "args.log")
        self.out = os.path.join(self.tmp.name, "out")

    def tearDown(self):
        self.tmp.cleanup()

    def run_script(self, *extra, fail_run=""):
        env = dict(os.environ, BUILD=self.build, ARGS_LOG=self.args_log, FAIL_RUN=fail_run, PYTHON=sys.executable)
        return subprocess.run(["bash", SCRIPT, "--out", self.out, "--seed", "77", "--", "--synthetic-data", *extra],
                              env=env, capture_output=True, text=True, timeout=300)

    def test_three_runs_same_seed_merged_with_report(self):
        r = self.run_script()
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(self.args_log) as f:
            calls = [line.split() for line in f.read().splitlines()]
        self.assertEqual(len(calls), 3)
        want = {"bf16": ("bf16", "bf16", "bf16", "bf16"), "fp8": ("fp8", "fp8", "fp8", "fp8"),
                "mxfp4": ("fp8", "fp8", "fp8", "mxfp4")}
        for call in calls:
            self.assertEqual(call[0], "train")
            opt = {call[i]: call[i + 1] for i in range(1, len(call) - 1) if call[i].startswith("--")}
            run = opt["--run"]
            self.assertEqual(tuple(opt[f"--recipe.{c}"] for c in ("attention", "dense_mlp", "shared_experts",
                                                                  "routed_experts")), want[run])
            self.assertEqual(opt["--config"], "configs/small.toml")
            self.assertEqual(opt["--train.seed"], "77")
            self.assertEqual(opt["--train.checkpoint_interval"], "0")
            self.assertEqual(opt["--out"], os.path.join(self.out, f"{run}.h5"))
            self.assertIn("--synthetic-data", call)
        merged = os.path.join(self.out, "loss_deviation.h5")
        self.assertEqual(sorted(train_report.load_train_runs(merged)), ["bf16", "fp8", "mxfp4"])
        with open(os.path.join(self.out, "deviation.md")) as f:
            table = f.read()
        self.assertIn("| fp8 | 20 | 2,000 | 4.0116 | +0.29% | +0.29% |", table)
        self.assertIn("| mxfp4 | 20 | 2,000 | 4.0244 | +0.61% | +0.61% |", table)
        self.assertTrue(os.path.exists(os.path.join(self.out, "report", "TABLES.md")))

    def test_a_failed_run_is_reported_and_the_others_merged(self):
        r = self.run_script(fail_run="fp8")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("failed runs: fp8", r.stderr)
        merged = os.path.join(self.out, "loss_deviation.h5")
        self.assertEqual(sorted(train_report.load_train_runs(merged)), ["bf16", "mxfp4"])

    def test_a_failed_baseline_stops(self):
        r = self.run_script(fail_run="bf16")
        self.assertEqual(r.returncode, 1)
        self.assertIn("bf16 baseline failed", r.stderr)
        with open(self.args_log) as f:
            self.assertEqual(len(f.read().splitlines()), 1)


if __name__ == "__main__":
    unittest.main()
