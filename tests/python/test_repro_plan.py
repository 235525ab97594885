"""The reproduction suite's plan scenario without a GPU (repro/scenario.py kind = "plan", repro/plan_runs.py): the
scenario file parses, fits its budgets and gives every plan options the built `fp4moe plan` accepts; bad plan
entries are refused naming the file; each plan's command line; the plans table read back from a real `fp4moe plan
--out` file (per recipe the first `top`, in rank order); repro/run.py end to end with a fake `fp4moe` whose `plan`
runs the built one with --no-measure (no GPU here): the run file holds the plans table and the reproduced rows,
TABLES.md shows them, each plan's Markdown is in the run folder."""

import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

import h5py

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, ROOT)

import train_cells_test_util as fake  # noqa: E402
from reports import result_file  # noqa: E402
from repro import plan_runs, scenario  # noqa: E402

SCENARIO = os.path.join(ROOT, "repro", "scenarios", "plan.toml")
RUN_PY = os.path.join(ROOT, "repro", "run.py")
BUILD = os.environ.get("FP4MOE_BUILD", os.path.join(ROOT, "build"))
FP4MOE = os.path.join(BUILD, "fp4moe")


def built():
    return os.access(FP4MOE, os.X_OK)


class PlanScenarioFile(unittest.TestCase):
    def test_parses_with_budgets_and_plans_per_scale(self):
        s = scenario.load(SCENARIO)
        self.assertEqual(s.kind, "plan")
        self.assertEqual(s.family, "plan_layouts")
        self.assertLessEqual(s.budget_gpu_minutes["smoke"], 2)
        self.assertLessEqual(s.budget_gpu_minutes["default"], 10)
        names = {scale: [p.name for p in plan_runs.expand(s, scale)] for scale in scenario.SCALES}
        self.assertEqual(names["smoke"], ["tiny_8"])
        self.assertEqual(names["default"], ["v3_h100", "v3_h100_modelled", "v3_h200", "v3_h200_modelled"])
        self.assertTrue(set(names["default"]) < set(names["full"]))
        for p in s.plan.plans:
            measured = "--no-measure" not in p.args
            cmd = plan_runs.command("fp4moe", p, s.plan.top, "x.h5", "c.tsv")
            self.assertEqual("--cache" in cmd, measured, p.name)
            self.assertIn("--out", cmd)
        # Every measured plan has its modelled twin at the same scales (default and full).
        for p in s.plan.plans:
            if p.name.endswith("_modelled"):
                (twin,) = [q for q in s.plan.plans if q.name == p.name[:-len("_modelled")]]
                self.assertEqual(twin.scales, p.scales)
        self.assertTrue(all(r.paper_source for r in s.rows))

    @unittest.skipUnless(built(), f"{FP4MOE} is not built")
    def test_every_plans_options_are_accepted_by_fp4moe_plan(self):
        s = scenario.load(SCENARIO)
        for p in s.plan.plans:
            args = [a for a in p.args if a != "--no-measure"]
            if "--measure-top" in args:
                i = args.index("--measure-top")
                args = args[:i] + args[i + 2:]
            with self.subTest(p.name):
                r = subprocess.run([FP4MOE, "plan", *args, "--no-measure", "--top", "1"], capture_output=True,
                                   text=True, timeout=300, cwd=ROOT)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertIn("# Layout plan:", r.stdout)

    def bad(self, text, *parts):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "p.toml")
            with open(path, "w") as f:
                f.write(text)
            with self.assertRaises(scenario.ScenarioError) as e:
                scenario.load(path)
            for part in parts:
                self.assertIn(part, str(e.exception))

    GOOD = textwrap.dedent("""\
        title = "t"
        kind = "plan"
        family = "plan_x"
        [budget_gpu_minutes]
        smoke = 1
        default = 2
        full = 2
        [[plans]]
        name = "a"
        args = ["--model", "v3", "--gpus", "256", "--memory-gib", "80"]
        scales = ["smoke", "default", "full"]
        [[rows]]
        row = "r"
        paper = ""
        paper_source = "none"
        unit = "x"
        [rows.ours]
        aggregate = "max"
        column = "tokens_per_s_per_gpu"
        """)

    def test_bad_plan_entries_are_refused(self):
        s = None
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "p.toml")
            with open(path, "w") as f:
                f.write(self.GOOD)
            s = scenario.load(path)
        self.assertEqual(s.plan.top, 5)
        self.bad(self.GOOD.replace('"80"]', '"80", "--out", "x.h5"]'), "p.toml", "--out is set by the runner")
        self.bad(self.GOOD.replace('"80"]', '"80", "--cache=x.tsv"]'), "--cache=x.tsv is set by the runner")
        self.bad(self.GOOD.replace('name = "a"', 'name = "A b"'), "name must be lower case")
        self.bad(self.GOOD.replace('"smoke", "default", "full"', '"default", "full"'),
                 "no [[plans]] entry runs at scale smoke")
        self.bad(self.GOOD.replace('kind = "plan"', 'kind = "plan"\nbenchmark = "bench_x"'),
                 "'benchmark' does not belong")
        self.bad(self.GOOD + '[plan]\ntop = 0\n', "[plan] top must be an integer >= 1")
        self.bad(self.GOOD.replace("[[plans]]", "[[plans]]\nextra = 1"), "unknown keys ['extra']")


@unittest.skipUnless(built(), f"{FP4MOE} is not built")
class PlansTable(unittest.TestCase):
    def test_rows_are_each_recipes_first_top_in_rank_order(self):
        s = scenario.load(SCENARIO)
        (plan,) = [p for p in s.plan.plans if p.name == "tiny_8"]
        with tempfile.TemporaryDirectory() as tmp:
            h5 = os.path.join(tmp, "tiny.h5")
            r = subprocess.run([FP4MOE, "plan", "--config", "configs/tiny.toml", "--gpus", "8", "--memory-gib", "80",
                                "--recipes", "fp8,mxfp4", "--no-measure", "--out", h5], capture_output=True,
                               text=True, timeout=300, cwd=ROOT)
            self.assertEqual(r.returncode, 0, r.stderr)
            rows = plan_runs.read_rows(plan, h5, 3)
            with h5py.File(h5) as f:
                t = result_file.read_table(f["plan/candidates"])
        self.assertEqual([(x["recipe"], x["rank"]) for x in rows],
                         [("fp8", 1), ("fp8", 2), ("fp8", 3), ("mxfp4", 1), ("mxfp4", 2), ("mxfp4", 3)])
        self.assertTrue(all(x["compute"] == "modelled" and x["measured_on"] == "none" for x in rows))
        best = t[(t["recipe"] == "mxfp4") & (t["rank"] == 1)]
        self.assertEqual(rows[3]["tokens_per_s_per_gpu"], float(best["tokens_per_s_per_gpu"].iloc[0]))
        self.assertEqual(rows[3]["tokens_per_s_per_gpu"], t[t["recipe"] == "mxfp4"]["tokens_per_s_per_gpu"].max())
        self.assertTrue(rows[0]["shape"].startswith("tp "))
        self.assertEqual([c for c, _ in scenario.PLAN_COLUMNS], list(rows[0]))


FAKE = """#!{python}
import os, sys
argv = sys.argv[1:]
if argv[:1] == ["env"]:
    print({env!r}, end="")
    sys.exit(0)
if argv[:1] != ["plan"]:
    sys.exit(2)
args, i = [], 1
while i < len(argv):  # no GPU here: the built plan with --no-measure, without the measurement's options
    if argv[i] in ("--cache", "--measure-top"):
        i += 2
        continue
    if argv[i] != "--no-measure":
        args.append(argv[i])
    i += 1
os.execv({real!r}, [{real!r}, "plan", *args, "--no-measure"])
"""


@unittest.skipUnless(built(), f"{FP4MOE} is not built")
class RunPlanScenario(unittest.TestCase):
    def test_run_py_writes_the_plans_table_and_report(self):
        with tempfile.TemporaryDirectory() as tmp:
            build = os.path.join(tmp, "build")
            os.makedirs(build)
            exe = os.path.join(build, "fp4moe")
            with open(exe, "w") as f:
                f.write(FAKE.format(python=sys.executable, env=fake.H200_ENV, real=os.path.abspath(FP4MOE)))
            os.chmod(exe, 0o755)
            runs = os.path.join(tmp, "runs")
            r = subprocess.run([sys.executable, RUN_PY, "--build", build, "--out", runs, "--scale", "smoke",
                                "--only", "plan"], capture_output=True, text=True, timeout=600)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("plan 1/1 tiny_8", r.stdout)
            (h5,) = [n for n in os.listdir(runs) if n.endswith(".h5")]
            run_dir = os.path.join(runs, h5[:-3])
            with h5py.File(os.path.join(runs, h5)) as f:
                table = result_file.read_table(f["bench/plan_layouts"])
                repro = result_file.read_table(f["repro/plan"])
                self.assertEqual(result_file.text(f["repro/plan"].attrs["kind"]), "plan")
            self.assertEqual(set(table["case"]), {"tiny_8"})
            self.assertEqual(set(table["recipe"]), {"fp8", "mxfp4"})
            self.assertEqual(sorted(table[table["recipe"] == "mxfp4"]["rank"]), [1, 2, 3, 4, 5])
            self.assertEqual(len(repro), len(scenario.load(SCENARIO).rows))
            with open(os.path.join(run_dir, "plan", "tiny_8.md")) as f:
                self.assertIn("# Layout plan: tiny on 8 GPUs of 80 GiB", f.read())
            with open(os.path.join(run_dir, "TABLES.md")) as f:
                md = f.read()
            self.assertIn("## plan: Layout plans of DeepSeek-V3 671B", md)
            self.assertIn("### /bench/plan_layouts", md)
            self.assertIn("tiny_8", md)


if __name__ == "__main__":
    unittest.main()
