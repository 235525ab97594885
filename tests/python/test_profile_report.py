"""reports/profile_report.py on result files made here with /train/<run>/profile tables in the layout of
trainer/train/step_profile.h: the "run" range, the Markdown table across runs, the stacked-bar plot, the full report
(TABLES.md section and train_profile.png), and the refusal of a profile table without its columns."""

import os
import tempfile
import unittest

import h5py
import numpy as np

from reports import profile_report, report, result_file, train_report
from tests.python.test_train_report import write_run

# (module, pass, ms per step) of one range; the step's total is their sum.
ROWS = [("rmsnorm", "forward", 0.5), ("core_attn", "forward", 2.0), ("core_attn", "backward", 5.0),
        ("routed_experts", "forward", 3.0), ("routed_experts", "recompute", 1.5), ("optimizer", "update", 1.0),
        ("other", "-", 0.5)]


def write_profile(f, name, scale, ranges=(("interval", 1, 10), ("interval", 11, 20), ("run", 3, 20))):
    cols = {c: [] for c in ("range", "first_step", "last_step", "steps", "module", "pass", "ms_per_step", "share",
                            "calls_per_step")}
    for rng, first, last in ranges:
        total = scale * sum(ms for _, _, ms in ROWS)
        for module, pass_, ms in ROWS + [("step", "-", None)]:
            v = total if ms is None else scale * ms
            for c, x in (("range", rng), ("first_step", first), ("last_step", last), ("steps", last - first + 1),
                         ("module", module), ("pass", pass_), ("ms_per_step", v), ("share", v / total),
                         ("calls_per_step", 0.0 if ms is None else 2.0)):
                cols[c].append(x)
    kinds = {"range": "str", "module": "str", "pass": "str", "first_step": "i64", "last_step": "i64", "steps": "i64"}
    result_file.write_table(f, f"train/{name}/profile", [(c, kinds.get(c, "f64"), v) for c, v in cols.items()],
                            {"interval": 10, "warmup_steps": 2})


class ProfileReportTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.tmp.name, "run.h5")
        with h5py.File(self.path, "w") as f:
            result_file.set_attribute(f, "schema_version", result_file.SCHEMA_VERSION)
            result_file.set_attribute(f, "gpu", "NVIDIA H200")
            for name, scale in (("bf16", 1.0), ("mxfp4", 0.8)):
                write_run(f, name, np.linspace(10, 4, 20), [5.0, 4.0], recipe=name)
                write_profile(f, name, scale)
            write_run(f, "unprofiled", np.linspace(10, 4, 20), [5.0, 4.0])

    def tearDown(self):
        self.tmp.cleanup()

    def test_run_range_and_markdown(self):
        runs = train_report.load_train_runs(self.path)
        self.assertIsNone(runs["unprofiled"]["profile"])
        rows = profile_report.run_rows(runs["bf16"]["profile"])
        self.assertEqual(set(rows["range"]), {"run"})
        self.assertEqual(len(rows), len(ROWS) + 1)
        self.assertAlmostEqual(float(rows[rows["module"] != "step"]["share"].sum()), 1.0)
        self.assertEqual(sorted(profile_report.profiled(runs)), ["bf16", "mxfp4"])

        md = profile_report.markdown(runs).splitlines()
        self.assertEqual(md[0], "| module | pass | bf16 ms/step (share) | mxfp4 ms/step (share) |")
        self.assertIn("| core_attn | backward | 5 (37.0%) | 4 (37.0%) |", md)
        self.assertIn("| routed_experts | recompute | 1.5 (11.1%) | 1.2 (11.1%) |", md)
        self.assertEqual(md[-1], "| **step** | - | 13.5 (steps 3-20) | 10.8 (steps 3-20) |")
        self.assertEqual(len(md), 2 + len(ROWS) + 1)
        self.assertEqual(profile_report.markdown({"x": runs["unprofiled"]}), "")

    def test_plot_and_report(self):
        runs = train_report.load_train_runs(self.path)
        png = os.path.join(self.tmp.name, "p.png")
        self.assertTrue(profile_report.plot_stacked(runs, png, "t"))
        self.assertGreater(os.path.getsize(png), 1000)
        self.assertFalse(profile_report.plot_stacked({"x": runs["unprofiled"]}, os.path.join(self.tmp.name, "q.png")))
        self.assertFalse(os.path.exists(os.path.join(self.tmp.name, "q.png")))

        out = os.path.join(self.tmp.name, "report")
        md, pngs, _ = report.write_report(self.path, out)
        self.assertIn(os.path.join(out, "train_profile.png"), pngs)
        with open(md, encoding="utf-8") as f:
            text = f.read()
        self.assertIn("### Step profile", text)
        self.assertIn("![step profile](train_profile.png)", text)
        self.assertIn("| **step** | - | 13.5 (steps 3-20) | 10.8 (steps 3-20) |", text)

    def test_a_profile_without_its_columns_is_refused(self):
        with h5py.File(self.path, "a") as f:
            del f["train/bf16/profile/share"]
            f["train/bf16/profile"].attrs.create("columns", ["range", "first_step", "last_step", "steps", "module",
                                                             "pass", "ms_per_step"], dtype=result_file.STR)
        with self.assertRaises(result_file.TableError) as e:
            train_report.load_train_runs(self.path)
        self.assertIn("column 'share': absent", str(e.exception))


if __name__ == "__main__":
    unittest.main()
