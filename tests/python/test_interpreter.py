"""The entry scripts (reports/report.py, compare.py, bench_report.py, repro/run.py) started by a Python that cannot
import pandas re-run themselves with one that can (reports/interpreter.py), and say which interpreter to use and
`make setup` when none can. Two such Pythons are made here: a virtual environment without the system's packages,
and this interpreter with a `pandas.py` that raises ImportError first on PYTHONPATH."""

import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, ROOT)

import repro_test_util as util  # noqa: E402
from reports import interpreter  # noqa: E402

SCRIPTS = {"report": os.path.join(ROOT, "reports", "report.py"), "compare": os.path.join(ROOT, "reports", "compare.py"),
           "bench_report": os.path.join(ROOT, "reports", "bench_report.py"),
           "repro": os.path.join(ROOT, "repro", "run.py")}


class Interpreter(util.Tmp):
    def setUp(self):
        super().setUp()
        self.run_file = self.path("r.h5")
        util.write_run(self.run_file, [1.5, 3.0])
        # This interpreter imports them (the tests need them): the one the scripts are to find.
        self.env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", interpreter.REEXEC_ENV)}
        self.env["FP4MOE_PYTHON"] = sys.executable

    def venv_python(self):
        """The python of a new virtual environment without the system's site packages (so without pandas)."""
        venv = self.path("venv without pandas")
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, timeout=120)
        python = os.path.join(venv, "bin", "python")
        r = subprocess.run([python, "-c", "import pandas"], capture_output=True, env=self.env, timeout=60)
        self.assertNotEqual(r.returncode, 0, "the virtual environment imports pandas: the test needs one that cannot")
        return python

    def poisoned_path(self):
        """A folder whose pandas.py raises ImportError, as a PYTHONPATH that hides the real pandas."""
        fake = self.path("fake")
        os.mkdir(fake)
        with open(os.path.join(fake, "pandas.py"), "w", encoding="utf-8") as f:
            f.write("raise ImportError('pandas hidden by the test')\n")
        r = subprocess.run([sys.executable, "-c", "import pandas"], capture_output=True, text=True, timeout=60,
                           env={**self.env, "PYTHONPATH": fake})
        self.assertIn("pandas hidden by the test", r.stderr)
        return fake

    def test_a_python_without_pandas_reruns_each_script_with_one_that_has_it(self):
        python = self.venv_python()
        for tool, script in SCRIPTS.items():
            with self.subTest(tool=tool):
                r = subprocess.run([python, script, "--help"], capture_output=True, text=True, env=self.env,
                                   timeout=300)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertNotIn("Traceback", r.stderr)
                self.assertIn("usage:", r.stdout)
        r = subprocess.run([python, SCRIPTS["compare"], self.run_file, self.run_file], capture_output=True, text=True,
                           env=self.env, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(r.stdout.startswith("# Comparison\n"), r.stdout[:200])

    def test_a_pythonpath_that_hides_pandas_is_left_out_of_the_rerun(self):
        env = {**self.env, "PYTHONPATH": self.poisoned_path()}
        out = self.path("report")
        r = subprocess.run([sys.executable, SCRIPTS["report"], self.run_file, "--out", out], capture_output=True,
                           text=True, env=env, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("report: wrote", r.stdout)
        self.assertTrue(os.path.isfile(os.path.join(out, "TABLES.md")))

    def test_without_an_interpreter_that_can_one_line_and_what_to_run(self):
        fake = self.poisoned_path()
        # Already a re-run (the guard against re-running forever): no further attempt.
        env = {**self.env, "PYTHONPATH": fake, interpreter.REEXEC_ENV: "/some/python3"}
        out = self.path("out.md")
        for tool, args in (("report", [self.run_file, "--out", out]),
                           ("compare", [self.run_file, self.run_file, "--out", out])):
            with self.subTest(tool=tool):
                r = subprocess.run([sys.executable, SCRIPTS[tool], *args], capture_output=True, text=True, env=env,
                                   timeout=300)
                self.assert_one_line(r, interpreter.EXIT_CODE, tool,
                                     f"this Python ({sys.executable}) cannot import pandas (ImportError: pandas "
                                     f"hidden by the test) (a re-run: /some/python3 lacked it first)")
                self.assertIn("run `make setup`", r.stderr)
                self.assertIn(f"/usr/bin/python3 {SCRIPTS[tool]}", r.stderr)
                self.assertFalse(os.path.exists(out))

    def test_find_skips_this_interpreter_in_the_environment_it_failed_in(self):
        fake = self.poisoned_path()
        env = {**self.env, "PYTHONPATH": fake}
        found = interpreter.find(["pandas"], env)
        self.assertIsNotNone(found)
        self.assertNotIn("PYTHONPATH", found[1])
        self.assertIsNone(interpreter.missing(["os", "json"]))
        self.assertEqual(interpreter.missing(["os", "no_such_module_here"])[0], "no_such_module_here")


if __name__ == "__main__":
    unittest.main()
