"""`fp4moe repro <scenario>...` hands the scenarios to repro/run.py with the binary's build folder: --list names
every scenario file, an unknown scenario or none at all is refused with the list (exit 2), and the runner is
reached with the arguments in order (checked with a stand-in interpreter given through FP4MOE_PYTHON, which prints
each argument it receives). The binary is $FP4MOE_BUILD/fp4moe."""

import os
import stat
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_test_util import binary  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCENARIOS = sorted(f[:-5] for f in os.listdir(os.path.join(ROOT, "repro", "scenarios")) if f.endswith(".toml"))


class ReproCli(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.exe = binary()
        if not os.access(cls.exe, os.X_OK):
            raise unittest.SkipTest(f"{cls.exe} is not built (set FP4MOE_BUILD to the build folder)")

    def run_cli(self, *args, env=None):
        return subprocess.run([self.exe, "repro", *args], capture_output=True, text=True, timeout=60,
                              env={**os.environ, **(env or {})})

    def test_list_names_every_scenario(self):
        r = self.run_cli("--list")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split(), SCENARIOS)

    def test_unknown_or_missing_scenario_is_refused_with_the_list(self):
        for args in (("no_such_table",), ()):
            r = self.run_cli(*args)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("memory_per_policy", r.stderr)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)

    def test_bad_scale_is_refused(self):
        r = self.run_cli("comm_volume", "--scale", "huge")
        self.assertEqual(r.returncode, 2)

    def test_runner_gets_the_scenarios_and_options_in_order(self):
        with tempfile.TemporaryDirectory() as tmp:
            echo = os.path.join(tmp, "python-echo")
            with open(echo, "w") as f:
                f.write('#!/bin/sh\nfor a in "$@"; do printf "[%s]\\n" "$a"; done\n')
            os.chmod(echo, os.stat(echo).st_mode | stat.S_IEXEC)
            r = self.run_cli("loss_deviation", "comm_volume", "--scale", "smoke", "--out", "somewhere",
                             env={"FP4MOE_PYTHON": echo})
            self.assertEqual(r.returncode, 0, r.stderr)
            got = [line.strip("[]") for line in r.stdout.split()]
            build = os.path.dirname(os.path.realpath(self.exe))
            self.assertEqual(got, [os.path.join(ROOT, "repro", "run.py"), "--build", build, "--scale", "smoke",
                                   "--out", "somewhere", "--only", "loss_deviation", "comm_volume"])
            r = self.run_cli("loss_deviation", "--parallel", "3", "--seeds", "1234,1235", "--steps", "200",
                             "--configs", "small", "dense_small", env={"FP4MOE_PYTHON": echo})
            self.assertEqual(r.returncode, 0, r.stderr)
            got = [line.strip("[]") for line in r.stdout.split()]
            self.assertEqual(got[got.index("--out") + 2:], ["--parallel", "3", "--seeds", "1234,1235", "--steps", "200",
                                                             "--configs", "small", "dense_small",
                                                             "--only", "loss_deviation"])

    def test_bad_parallel_or_steps_are_refused(self):
        for args in (["--parallel", "0"], ["--steps", "-5"]):
            with self.subTest(args=args):
                r = self.run_cli("loss_deviation", *args)
                self.assertEqual(r.returncode, 2)
                self.assertIn("not in range 1 to", r.stderr)
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)


if __name__ == "__main__":
    unittest.main()
