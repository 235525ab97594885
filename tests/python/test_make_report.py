"""The Makefile's `report` target and the quoting of its variables: paths with spaces and quotes in RUN, RUNS, OUT,
BUILD, DATA_CACHE and PYTHON reach the commands as one word each (make -n, split as the shell splits); `make report`
on a run file in a folder with spaces writes RUNS/<stem>/ or OUT; on a committed run (reports/results/) it writes
under RUNS and leaves the committed report files as they are."""

import os
import shlex
import shutil
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, ROOT)

import repro_test_util as util  # noqa: E402
from reports import report  # noqa: E402

COMMITTED_RUN = os.path.join("reports", "results", "h200", "20261129-092050-nvidia-h200.h5")


def make(*args):
    """`make *args` in the repository root, outside any make that runs these tests (its MAKEFLAGS left out)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    return subprocess.run(["make", "--no-print-directory", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)


def command_of(dry_run, word):
    """The words of the one command line of a `make -n` output that contains `word`, split as the shell splits."""
    lines = [l for l in dry_run.splitlines() if word in l]
    assert len(lines) == 1, dry_run
    return shlex.split(lines[0])


def tree_state(folder):
    """{file: (inode, mtime, size)} of every file under `folder`."""
    out = {}
    for base, _, files in os.walk(folder):
        for n in files:
            st = os.stat(os.path.join(base, n))
            out[os.path.join(base, n)] = (st.st_ino, st.st_mtime_ns, st.st_size)
    return out


@unittest.skipIf(shutil.which("make") is None, "make is not installed")
class MakeReport(util.Tmp):
    def test_variables_reach_the_commands_as_one_word_each(self):
        run, runs, out, python = "a b/c'd e.h5", "r s", "o \"u\"/t", "/opt/my python/bin/python3"
        r = make("-n", "report", f"RUN={run}", f"RUNS={runs}", f"OUT={out}", f"PYTHON={python}")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(command_of(r.stdout, "reports/report.py"),
                         [python, "reports/report.py", run, "--runs", runs, "--out", out])
        r = make("-n", "report", f"RUN={run}", f"PYTHON={python}")
        self.assertEqual(command_of(r.stdout, "reports/report.py"),
                         [python, "reports/report.py", run, "--runs", "runs"])
        r = make("-n", "data", "DATA_CACHE=x y", "JOBS=3")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(command_of(r.stdout, "build_data.py")[2:], ["--cache", "x y", "--jobs", "3"])
        r = make("-n", "repro-table", "BUILD=b u", f"RUNS={runs}", f"PYTHON={python}")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(command_of(r.stdout, "repro/run.py"),
                         [python, "repro/run.py", "--build", "b u", "--scale", "default", "--out", runs])
        r = make("-n", "clean", "BUILD=b u")
        self.assertEqual(command_of(r.stdout, "rm "), ["rm", "-rf", "b u"])
        r = make("-n", "cmake-configure", "BUILD=b u", f"PYTHON={python}")
        words = command_of(r.stdout, "cmake -S")
        self.assertEqual(words[words.index("-B") + 1], "b u")
        self.assertIn(f"-DFP4MOE_PYTHON={python}", words)

    def test_make_report_in_folders_with_spaces(self):
        run = self.path("run dir", "20261129-120000-nvidia h200.h5")
        os.mkdir(os.path.dirname(run))
        util.write_run(run, [1.5, 3.0])
        runs = self.path("runs dir")
        r = make("report", f"RUN={run}", f"RUNS={runs}", f"PYTHON={sys.executable}")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertTrue(os.path.isfile(os.path.join(runs, "20261129-120000-nvidia h200", "TABLES.md")))
        self.assertEqual(os.listdir(self.path("run dir")), [os.path.basename(run)])  # nothing beside the run
        out = self.path("out dir", "it's here")
        r = make("report", f"RUN={run}", f"OUT={out}", f"PYTHON={sys.executable}")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("TABLES.md", os.listdir(out))
        r = make("report", f"PYTHON={sys.executable}")
        self.assertEqual(r.returncode, 2)
        self.assertIn("make report: name the run file", r.stderr)

    def test_a_committed_run_is_read_and_its_report_files_left_alone(self):
        committed = os.path.join(ROOT, COMMITTED_RUN)
        beside = committed[:-3]
        self.assertTrue(os.path.isfile(os.path.join(beside, "TABLES.md")), "the committed run's report is missing")
        self.assertEqual(report.default_out_dir(committed), os.path.join(ROOT, "runs", os.path.basename(beside)))
        before = tree_state(beside)
        runs = self.path("runs")
        r = make("report", f"RUN={COMMITTED_RUN}", f"RUNS={runs}", f"PYTHON={sys.executable}")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(tree_state(beside), before)
        self.assertTrue(os.path.isfile(os.path.join(runs, os.path.basename(beside), "TABLES.md")))


if __name__ == "__main__":
    unittest.main()
