"""reports/train_report.py on small result files made here: the summary numbers, the Markdown row, the loss
deviation and the loss plot."""

import math
import os
import tempfile
import unittest

import h5py
import numpy as np

from reports import result_file, train_report


def write_run(f, name, losses, val, tokens_per_step=1000, recipe="bf16"):
    n = len(losses)
    steps = np.arange(1, n + 1)
    result_file.write_table(f, f"train/{name}/steps", [
        ("step", "i64", steps), ("tokens", "i64", steps * tokens_per_step), ("loss", "f64", losses),
        ("lr", "f64", np.full(n, 1e-3)), ("grad_norm", "f64", np.ones(n)),
        ("tokens_per_s", "f64", np.linspace(100, 200, n)), ("mfu", "f64", np.full(n, 0.25)),
        ("peak_act_gib", "f64", np.full(n, 1.5)), ("peak_total_gib", "f64", np.full(n, 3.0)),
        ("skipped", "i64", np.zeros(n))])
    ev_steps = np.array([n // 2, n])
    result_file.write_table(f, f"train/{name}/eval", [
        ("step", "i64", ev_steps), ("tokens", "i64", ev_steps * tokens_per_step), ("val_loss", "f64", val)])
    result_file.set_attribute(f[f"train/{name}"], "recipe", recipe)


class TrainReportTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.tmp.name, "run.h5")
        with h5py.File(self.path, "w") as f:
            result_file.set_attribute(f, "schema_version", result_file.SCHEMA_VERSION)
            write_run(f, "bf16", np.linspace(10, 4, 100), [5.0, 4.0])
            write_run(f, "mxfp4", np.concatenate([np.linspace(10, 4.1, 99), [math.nan]]), [5.1, 4.04],
                      recipe="mxfp4")

    def tearDown(self):
        self.tmp.cleanup()

    def test_summary_numbers(self):
        runs = train_report.load_train_runs(self.path)
        self.assertEqual(sorted(runs), ["bf16", "mxfp4"])
        self.assertEqual(runs["mxfp4"]["attrs"]["recipe"], "mxfp4")
        s = train_report.summarize(runs["bf16"]["steps"], runs["bf16"]["eval"])
        self.assertEqual(s["steps"], 100)
        self.assertEqual(s["tokens"], 100000)
        self.assertAlmostEqual(s["train_loss"], np.linspace(10, 4, 100)[-5:].mean())
        self.assertEqual(s["val_loss"], 4.0)
        self.assertEqual(s["best_val_loss"], 4.0)
        self.assertAlmostEqual(s["tokens_per_s"], float(np.median(np.linspace(100, 200, 100)[10:])))
        self.assertEqual(s["peak_total_gib"], 3.0)
        # A non-finite loss (a skipped step) is left out of the mean, not propagated.
        m = train_report.summarize(runs["mxfp4"]["steps"], runs["mxfp4"]["eval"])
        self.assertTrue(math.isfinite(m["train_loss"]))

    def test_deviation_and_markdown(self):
        runs = train_report.load_train_runs(self.path)
        dev = train_report.deviation(runs, "bf16")
        self.assertAlmostEqual(dev["bf16"], 0.0)
        self.assertAlmostEqual(dev["mxfp4"], 0.01)
        md = train_report.markdown(runs)
        self.assertIn("| bf16 | 100 | 100,000 |", md)
        self.assertIn("25.0%", md)
        self.assertIsNone(train_report.deviation(runs, "missing")["bf16"])

    def test_plot(self):
        runs = train_report.load_train_runs(self.path)
        png = os.path.join(self.tmp.name, "loss.png")
        self.assertTrue(train_report.plot_loss(runs, png))
        self.assertGreater(os.path.getsize(png), 1000)

    def test_file_without_train_runs(self):
        empty = os.path.join(self.tmp.name, "empty.h5")
        with h5py.File(empty, "w") as f:
            result_file.set_attribute(f, "schema_version", result_file.SCHEMA_VERSION)
        self.assertEqual(train_report.load_train_runs(empty), {})


if __name__ == "__main__":
    unittest.main()


class ReportWithTrainingTest(unittest.TestCase):
    def test_report_renders_training_runs(self):
        from reports import report
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "train.h5")
            with h5py.File(path, "w") as f:
                result_file.set_attribute(f, "schema_version", result_file.SCHEMA_VERSION)
                result_file.set_attribute(f, "gpu", "test GPU")
                write_run(f, "small-bf16", np.linspace(10, 4, 50), [5.0, 4.2])
            md, pngs, n = report.write_report(path, os.path.join(tmp, "out"))
            self.assertEqual(n, 1)
            with open(md, encoding="utf-8") as fh:
                text = fh.read()
            self.assertIn("## Training runs", text)
            self.assertIn("| small-bf16 | 50 |", text)
            self.assertEqual([os.path.basename(p) for p in pngs], ["train_loss.png"])
