"""Bad output paths and seeds of the convergence tooling: repro/merge_runs.py checks --out and --report-dir before it
writes anything (one line, exit code 2, no merged file left behind), says where its report goes by default and
records the command it ran (options included); repro/run.py / repro/scenario.py refuse a seed fp4moe train cannot
take (above 2^63 - 1). The merges read the two committed seed runs of reports/results/h200/loss-deviation-20261202/
(read only)."""

import os
import shlex
import subprocess
import sys
import tempfile
import unittest
from unittest import mock

import h5py

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, ROOT)

from reports import output_path, report, result_file  # noqa: E402
from repro import merge_runs, scenario  # noqa: E402

MERGE_PY = os.path.join(ROOT, "repro", "merge_runs.py")
RUN_PY = os.path.join(ROOT, "repro", "run.py")
RUNS = os.path.join(ROOT, "reports", "results", "h200", "loss-deviation-20261202")
INPUTS = [os.path.join(RUNS, "20261202-013643-nvidia-h200.h5"), os.path.join(RUNS, "20261202-014420-nvidia-h200.h5")]


class MergeCase(unittest.TestCase):
    """A temporary folder and the committed inputs."""

    def setUp(self):
        for p in INPUTS:
            self.assertTrue(os.path.isfile(p), f"committed seed run {p} is missing")
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)

    def path(self, *parts):
        return os.path.join(self.tmp.name, *parts)


class MergeOutputs(MergeCase):
    def merge(self, *args):
        return subprocess.run([sys.executable, MERGE_PY, *args], capture_output=True, text=True, timeout=600)

    def assert_one_line_refusal(self, r, msg):
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        self.assertIn(msg, r.stderr)

    def test_out_in_a_missing_folder_is_one_clear_line(self):
        out = self.path("no-such-folder", "merged.h5")
        r = self.merge("--out", out, *INPUTS, "--report-dir", self.path("report"))
        self.assert_one_line_refusal(r, f"the folder of '{out}' does not exist")
        self.assertNotIn(".tmp-", r.stderr)  # not the temporary name the user never gave
        self.assertFalse(os.path.exists(self.path("report")))

    def test_report_dir_that_is_a_file_writes_no_merged_file(self):
        out, not_a_folder = self.path("merged.h5"), self.path("notes.txt")
        with open(not_a_folder, "w") as f:
            f.write("kept\n")
        r = self.merge("--out", out, *INPUTS, "--report-dir", not_a_folder)
        self.assert_one_line_refusal(r, "exists and is not a folder")
        self.assertFalse(os.path.exists(out))
        with open(not_a_folder) as f:
            self.assertEqual(f.read(), "kept\n")

    def test_report_dir_default_is_the_one_the_help_names(self):
        r = self.merge("--help")
        self.assertEqual(r.returncode, 0, r.stderr)
        help_text = " ".join(r.stdout.split())
        self.assertIn("default: runs/<stem of --out>/", help_text)
        self.assertNotIn("beside the merged file", help_text)
        runs = self.path("runs")
        with mock.patch.object(report, "RUNS", runs):
            code = merge_runs.main(["--out", self.path("merged.h5"), *INPUTS])
        self.assertEqual(code, 0)
        self.assertTrue(os.path.isfile(os.path.join(runs, "merged", "TABLES.md")))
        self.assertFalse(os.path.exists(self.path("TABLES.md")))


class MergeCommand(MergeCase):
    def test_the_recorded_command_is_the_one_run(self):
        out, rep = self.path("merged.h5"), self.path("report")
        args = ["--out", out, "--report-dir", rep, *INPUTS]
        self.assertEqual(merge_runs.main(args), 0)
        with h5py.File(out, "r") as f:
            self.assertEqual(result_file.text(f.attrs["command"]), shlex.join(["repro/merge_runs.py"] + args))


class AtomicOutput(unittest.TestCase):
    def test_missing_folder_is_refused_before_the_block_runs(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "absent", "x.h5")
            ran = []
            with self.assertRaises(output_path.OutputPathError) as e:
                with output_path.atomic(out) as t:
                    ran.append(t)
            self.assertEqual(ran, [])
            self.assertIn("does not exist", str(e.exception))


class SeedRange(unittest.TestCase):
    def test_seed_beyond_a_signed_64_bit_integer_is_refused(self):
        self.assertEqual(scenario.check_seeds([0, 2**63 - 1], "--seeds"), [0, 2**63 - 1])
        with self.assertRaises(ValueError) as e:
            scenario.check_seeds([1234, 2**63], "--seeds")
        self.assertIn("2^63 - 1", str(e.exception))

    def test_runner_refuses_it_in_one_line(self):
        with tempfile.TemporaryDirectory() as tmp:
            r = subprocess.run([sys.executable, RUN_PY, "--build", os.path.join(tmp, "no-build"), "--out", tmp,
                                "--only", "loss_deviation", "--seeds", f"1234,{2**63}"],
                               capture_output=True, text=True, timeout=600)
            self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
            self.assertIn("--seeds must be a non-empty list of integers >= 0 and <= 2^63 - 1", r.stderr)
            self.assertNotIn("Traceback", r.stderr)
            self.assertEqual(os.listdir(tmp), [])


if __name__ == "__main__":
    unittest.main()
