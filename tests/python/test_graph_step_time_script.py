"""scripts/graph_step_time.sh without a GPU: its argument checks (exit code 2, one line saying what was expected),
and its runs and summary against a stand-in fp4moe (BUILD=<a folder holding a script named fp4moe>) that writes the
result file a training run writes, with tokens/s chosen per mode: the CSV must hold each mode's median, their ratio,
each mode's lowest and highest run and the first step's losses."""

import csv
import os
import stat
import subprocess
import sys
import tempfile
import textwrap
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "graph_step_time.sh")

# `fp4moe train ... --run NAME --out FILE ... --train.cuda_graph true|false --train.steps N`: writes
# /train/NAME/steps/{tokens_per_s, loss} with N rows. Eager runs take 100 + r tokens/s, graph runs 250 + r, where r is
# the run's number (the last character of NAME), so the medians over the runs are checkable; the first steps (which
# the script leaves out) take 1 tokens/s.
FAKE = textwrap.dedent("""\
    #!{python}
    import sys
    import h5py
    import numpy as np
    args = sys.argv[1:]
    value = lambda key: args[args.index(key) + 1]
    run, out, steps = value("--run"), value("--out"), int(value("--train.steps"))
    graph = value("--train.cuda_graph") == "true"
    rate = (250.0 if graph else 100.0) + int(run[-1])
    tps = np.full(steps, rate)
    tps[:5] = 1.0
    with h5py.File(out, "w") as f:
        g = f.create_group(f"train/{{run}}/steps")
        g["tokens_per_s"] = tps
        g["loss"] = np.full(steps, 10.5 if graph else 10.25)
    """)


class GraphStepTimeScript(unittest.TestCase):
    def run_script(self, *args, build=None):
        env = dict(os.environ)
        if build is not None:
            env["BUILD"] = build
        env["PYTHON"] = sys.executable
        return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, timeout=120, env=env)

    def test_bad_arguments_exit_2_at_once(self):
        for args, expected in ((["--out"], "--out needs a folder"), ([], "--out DIR is required"),
                               (["--out", "x", "--steps", "9"], "--steps needs an integer >= 10"),
                               (["--out", "x", "--repeats", "0"], "--repeats needs a positive integer"),
                               (["--out", "x", "--bogus"], "unknown argument '--bogus'")):
            with self.subTest(args=args):
                r = self.run_script(*args)
                self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
                self.assertIn(f"graph_step_time.sh: {expected}", r.stderr)

    def test_missing_binary_and_preset_are_named(self):
        with tempfile.TemporaryDirectory() as tmp:
            r = self.run_script("--out", os.path.join(tmp, "o"), build=os.path.join(tmp, "nothing"))
            self.assertEqual(r.returncode, 2)
            self.assertIn("graph_step_time.sh: no fp4moe in", r.stderr)
            self.write_fake(tmp)
            r = self.run_script("--out", os.path.join(tmp, "o"), "--configs", "nope", build=tmp)
            self.assertEqual(r.returncode, 2)
            self.assertIn("graph_step_time.sh: no preset configs/nope.toml", r.stderr)

    def write_fake(self, folder):
        path = os.path.join(folder, "fp4moe")
        with open(path, "w") as f:
            f.write(FAKE.format(python=sys.executable))
        os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)

    def test_summary_of_the_runs(self):
        with tempfile.TemporaryDirectory() as tmp:
            self.write_fake(tmp)
            out = os.path.join(tmp, "o")
            r = self.run_script("--out", out, "--configs", "tiny small", "--recipes", "fp8", "--repeats", "3",
                                "--steps", "12", build=tmp)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            with open(os.path.join(out, "step_time.csv")) as f:
                rows = list(csv.DictReader(f))
            self.assertEqual([(row["config"], row["recipe"]) for row in rows], [("tiny", "fp8"), ("small", "fp8")])
            for row in rows:
                self.assertEqual(float(row["eager_tokens_per_s"]), 102.0)  # runs 1, 2, 3: 101, 102, 103
                self.assertEqual(float(row["graph_tokens_per_s"]), 252.0)
                self.assertEqual(row["graph_over_eager"], f"{252.0 / 102.0:.3f}")
                self.assertEqual(row["runs_per_mode"], "3")
                self.assertEqual((float(row["eager_min"]), float(row["eager_max"])), (101.0, 103.0))
                self.assertEqual((float(row["graph_min"]), float(row["graph_max"])), (251.0, 253.0))
                self.assertEqual((float(row["eager_step1_loss"]), float(row["graph_step1_loss"])), (10.25, 10.5))
            self.assertEqual(len([n for n in os.listdir(out) if n.endswith(".h5")]), 2 * 2 * 3)


if __name__ == "__main__":
    unittest.main()
