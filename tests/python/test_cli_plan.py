"""`fp4moe plan`: the modelled plan (--no-measure) of a configuration and of a production preset as Markdown, the
one-line refusal to measure without a GPU (exit 2), of a --cache that is not a stage-time table and of a GPU count
without a layout, a configuration whose [parallel] section the plan replaces, a budget nothing fits (said, exit 0),
and bad arguments. The binary is $FP4MOE_BUILD/fp4moe."""

import os
import re
import subprocess
import tempfile
import unittest

from tests.python.cli_test_util import binary

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class PlanCli(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.exe = binary()
        if not os.access(cls.exe, os.X_OK):
            raise unittest.SkipTest(f"{cls.exe} is not built (set FP4MOE_BUILD to the build folder)")

    def plan(self, *args, expect_rc=0, timeout=600):
        cmd = [self.exe, "plan", *args]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        self.assertEqual(r.returncode, expect_rc, f"{' '.join(cmd)}\nstdout: {r.stdout}\nstderr: {r.stderr}")
        return r

    def rejected(self, *parts, args=()):
        r = self.plan(*args, expect_rc=2)
        lines = r.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertTrue(lines[0].startswith("fp4moe plan: error: "), r.stderr)
        self.assertIsNone(re.search(r"\.cpp:\d+\)", lines[0]), lines[0])
        for p in parts:
            self.assertIn(p, lines[0])
        self.assertEqual(r.stdout, "")

    def plan_without_gpu(self, *args):
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
        return subprocess.run([self.exe, "plan", *args], capture_output=True, text=True, timeout=600, cwd=ROOT,
                              env=env)

    def test_measuring_needs_a_gpu(self):
        with tempfile.TemporaryDirectory() as tmp:
            cache = os.path.join(tmp, "times.tsv")
            r = self.plan_without_gpu("--config", "configs/tiny.toml", "--gpus", "8", "--memory-gib", "80",
                                      "--cache", cache)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertEqual(r.stderr.strip().splitlines(), [r.stderr.strip()])
            self.assertTrue(r.stderr.startswith("fp4moe plan: error: no GPU: use --no-measure"), r.stderr)
            self.assertFalse(os.path.exists(cache))

    def test_a_cache_that_is_not_a_stage_time_table_is_refused(self):
        with tempfile.TemporaryDirectory() as tmp:
            cache = os.path.join(tmp, "times.tsv")
            with open(cache, "w") as f:
                f.write("step\tloss\n1\t2.5\n")
            self.rejected(f"--cache '{cache}' is not a stage-time table of fp4moe plan",
                          args=("--config", "configs/tiny.toml", "--gpus", "8", "--memory-gib", "80",
                                "--cache", cache))
            with open(cache) as f:
                self.assertEqual(f.read(), "step\tloss\n1\t2.5\n")  # left as it was
        self.rejected("--measure-top applies to the measured plan only",
                      args=("--config", "configs/tiny.toml", "--gpus", "8", "--memory-gib", "80", "--no-measure",
                            "--measure-top", "3"))
        self.rejected("--cache applies to the measured plan only",
                      args=("--config", "configs/tiny.toml", "--gpus", "8", "--memory-gib", "80", "--no-measure",
                            "--cache", "x.tsv"))

    def test_a_gpu_count_without_a_layout_is_explained(self):
        self.rejected("no layout of 255 GPUs exists for DeepSeek-V3 671B", "tp x pp x dp = 255",
                      "divides the global batch of 15360 sequences",
                      args=("--model", "v3", "--gpus", "255", "--memory-gib", "80", "--no-measure"))

    def test_config_layout_rules_do_not_apply_to_the_plan(self):
        # grad_accum 1 with [parallel] micro_batches 8: `train` refuses it; the plan only reads its global batch.
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "tiny_pp2.toml")
            with open(os.path.join(ROOT, "configs", "tiny.toml")) as f:
                text = f.read()
            with open(path, "w") as f:
                f.write(text + "\n[parallel]\ntp = 1\npp = 2\ndp = 2\nep = 1\nmicro_batches = 8\n")
            out = self.plan("--config", path, "--gpus", "8", "--memory-gib", "80", "--no-measure", "--top", "1").stdout
            self.assertIn("global batch 64 sequences", out)
            self.assertIn("| compute | tokens/s per GPU |", out)
            self.assertIn("| modelled |", out)

    def test_tiny_plan_ranks_layouts_per_recipe(self):
        out = self.plan("--config", "configs/tiny.toml", "--gpus", "8", "--memory-gib", "80", "--no-measure",
                        "--top", "3").stdout
        self.assertIn("# Layout plan: tiny on 8 GPUs of 80 GiB", out)
        for recipe in ("bf16", "fp8", "mxfp4"):
            self.assertIn(f"## {recipe} (", out)
        self.assertIn("## What mxfp4 buys", out)
        # Three rows per recipe, ranked by the last column.
        for table in out.split("## ")[1:4]:
            rows = [line for line in table.splitlines() if re.match(r"^\| \d+ \|", line)]
            self.assertEqual(len(rows), 3, table)
            rates = [float(r.rstrip(" |").split("|")[-1]) for r in rows]
            self.assertEqual(rates, sorted(rates, reverse=True), table)

    def test_a_budget_nothing_fits_is_said(self):
        out = self.plan("--config", "configs/tiny.toml", "--gpus", "2", "--memory-gib", "0.000001",
                        "--recipes", "fp8", "--no-measure").stdout
        self.assertIn("Nothing fits 1e-06 GiB under fp8: the smallest estimate is", out)
        self.assertNotIn("| rank |", out)

    def test_production_preset(self):
        out = self.plan("--model", "v2", "--gpus", "128", "--memory-gib", "141", "--recipes", "fp8,mxfp4",
                        "--no-measure", "--top", "1").stdout
        self.assertIn("# Layout plan: DeepSeek-V2 236B on 128 GPUs of 141 GiB", out)
        self.assertIn("global batch 9216 sequences", out)
        self.assertIn("- over fp8:", out)
        self.assertIn("| recompute policy | fp8 | mxfp4 |", out)

    def test_tp_restricts_the_layouts(self):
        out = self.plan("--config", "configs/tiny.toml", "--gpus", "8", "--memory-gib", "80", "--no-measure",
                        "--global-batch", "32", "--tp", "1,2", "--top", "100").stdout
        rows = [line.split("|") for line in out.splitlines() if re.match(r"^\| \d+ \|", line)]
        self.assertTrue(rows)
        self.assertEqual({int(r[2]) for r in rows}, {1, 2})

    def test_out_writes_every_candidate(self):
        import tempfile
        import h5py
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "plan.h5")
            out = self.plan("--config", "configs/tiny.toml", "--gpus", "2", "--memory-gib", "80", "--no-measure",
                            "--recipes", "bf16,mxfp4", "--out", path).stdout
            m = re.search(r"(\d+) layouts x 3 recompute policies x 2 recipes = (\d+) estimates", out)
            self.assertIsNotNone(m, out)
            with h5py.File(path, "r") as f:
                g = f["/plan/candidates"]
                self.assertEqual(len(g["tp"]), int(m.group(2)))
                self.assertEqual(set(g["recipe"].asstr()[()]), {"bf16", "mxfp4"})
                self.assertEqual(g.attrs["gpus"], 2)
                self.assertIn("command", f.attrs)
            # A folder is refused before any work, in one line.
            self.rejected("--out", tmp, args=("--config", "configs/tiny.toml", "--gpus", "2", "--memory-gib", "80",
                                              "--no-measure", "--out", tmp))

    def test_bad_arguments(self):
        base = ("--gpus", "8", "--memory-gib", "80", "--no-measure")
        self.rejected("one of --model v3|v2 or --config FILE", args=base)
        self.rejected("one of --model v3|v2 or --config FILE",
                      args=("--model", "v3", "--config", "configs/tiny.toml", *base))
        self.rejected("--recipes", "'fp6'", args=("--config", "configs/tiny.toml", "--recipes", "bf16,fp6", *base))
        self.rejected("--recipes names fp8 twice", args=("--config", "configs/tiny.toml", "--recipes", "fp8,fp8",
                                                         *base))
        self.rejected("mfu must be in (0, 1]", args=("--config", "configs/tiny.toml", "--mfu", "2", *base))
        self.rejected("--memory-gib", args=("--config", "configs/tiny.toml", "--gpus", "8", "--memory-gib", "-1",
                                            "--no-measure"))
        self.rejected("--gpus", args=("--config", "configs/tiny.toml", "--memory-gib", "80", "--no-measure"))
        self.rejected("--tp 3 is not one of 1, 2, 4, 8", args=("--config", "configs/tiny.toml", "--tp", "3", *base))


    def calibration_rows(self, out, heading):
        table = out.split(heading)[1].split("## ")[0]
        return [line.split("|")[1:-1] for line in table.splitlines() if re.match(r"^\| \d+ \|", line)]

    def test_calibrate_p1_ranks_layouts_by_fit_and_predicts_the_light_policy(self):
        out = self.plan("--calibrate-p1", "--top", "4").stdout
        self.assertIn("# P1 memory calibration: DeepSeek-V3 671B on 256 GPUs", out)
        self.assertIn("18 layouts", out)
        self.assertIn("gradients FP32 (4 B per element); framework overhead 0 GiB", out)
        heavy = self.calibration_rows(out, "## Heavy policy")
        self.assertEqual(len(heavy), 4)
        paper = (68.29, 74.20, 59.40)
        errors = []
        for row in heavy:
            tp, pp, dp, ep = (int(row[i]) for i in range(1, 5))
            self.assertEqual(tp * pp * dp, 256)
            ours = [float(row[i]) for i in (6, 7, 8)]
            # The fit column is the largest |ours - P1| over the three recipes.
            self.assertAlmostEqual(float(row[9]), max(abs(a - b) for a, b in zip(ours, paper)), delta=0.011)
            errors.append(float(row[9]))
        self.assertEqual(errors, sorted(errors))
        light = self.calibration_rows(out, "## Light policy")
        self.assertEqual([r[1:5] for r in light], [r[1:5] for r in heavy])
        self.assertIn("## Verdict", out)

    def test_calibrate_p1_knobs_move_the_percentages(self):
        def rows(*args):
            out = self.plan("--calibrate-p1", "--top", "18", *args).stdout
            return out, {tuple(r[1:5]): [float(r[i]) for i in (6, 7, 8)]
                         for r in self.calibration_rows(out, "## Heavy policy")}
        _, base = rows()
        self.assertEqual(len(base), 18)
        out, over = rows("--overhead-gib", "8")
        self.assertIn("framework overhead 8 GiB", out)
        for layout, ours in base.items():  # 8 GiB of an 80 GiB card: 10 points more everywhere
            for a, b in zip(over[layout], ours):
                self.assertAlmostEqual(a, b + 10.0, delta=0.011)
        out, bf16 = rows("--grads", "bf16")
        self.assertIn("gradients BF16 (2 B per element)", out)
        for layout, ours in base.items():  # half the gradient bytes: less memory everywhere
            for a, b in zip(bf16[layout], ours):
                self.assertLess(a, b - 1.0)
        out, mla = rows("--heavy-modules", "mla_up_proj,core_attn,layernorm,moe")
        self.assertIn("read as the modules {mla_up_proj, core_attn, layernorm, moe}", out)
        for layout, ours in base.items():  # the up-projections' outputs recomputed too: less memory everywhere
            for a, b in zip(mla[layout], ours):
                self.assertLess(a, b - 1.0)
        out, tp1 = rows("--tp", "1")
        self.assertIn("tp {1}", out)
        self.assertTrue(tp1 and all(layout[0].strip() == "1" for layout in tp1))
        self.assertEqual(tp1, {k: v for k, v in base.items() if k[0].strip() == "1"})

    def test_calibrate_p1_bad_combinations(self):
        self.rejected("--calibrate-p1", "does not take --gpus", args=("--calibrate-p1", "--gpus", "256"))
        self.rejected("does not take --config", args=("--calibrate-p1", "--config", "configs/tiny.toml"))
        self.rejected("does not take --out", args=("--calibrate-p1", "--out", "x.h5"))
        self.rejected("--model v2 is not calibrated", args=("--calibrate-p1", "--model", "v2"))
        self.rejected("--overhead-gib applies to --calibrate-p1 only",
                      args=("--model", "v3", "--gpus", "256", "--memory-gib", "80", "--no-measure",
                            "--overhead-gib", "2"))
        self.rejected("--grads applies to --calibrate-p1 only",
                      args=("--model", "v3", "--gpus", "256", "--memory-gib", "80", "--no-measure", "--grads", "bf16"))
        self.rejected("--overhead-gib must be a finite number in [0, 80]", args=("--calibrate-p1", "--overhead-gib", "-1"))
        self.rejected("--overhead-gib must be a finite number in [0, 80]", "got 1e+308",
                      args=("--calibrate-p1", "--overhead-gib", "1e308"))
        self.rejected("--grads", "fp16", args=("--calibrate-p1", "--grads", "fp16"))
        self.rejected("--top must be >= 1", args=("--calibrate-p1", "--top", "0"))
        self.rejected("--tp 4 is not one of them", args=("--calibrate-p1", "--tp", "4"))
        self.rejected("--tp names 1 twice", args=("--calibrate-p1", "--tp", "1,1"))
        self.rejected("--tp names 8 twice", args=("--model", "v3", "--gpus", "256", "--memory-gib", "80", "--no-measure",
                                                  "--tp", "8,8"))
        self.rejected("--heavy-modules", "unknown module 'foo'", args=("--calibrate-p1", "--heavy-modules", "foo"))
        self.rejected("--heavy-modules applies to --calibrate-p1 only",
                      args=("--model", "v3", "--gpus", "256", "--memory-gib", "80", "--no-measure",
                            "--heavy-modules", "moe"))
        self.rejected("--memory-gib is required", args=("--model", "v3", "--gpus", "256", "--no-measure"))


if __name__ == "__main__":
    unittest.main()
