"""`fp4moe bench NAME ARGS...` hands ARGS to benchmarks/bench_NAME untouched and in order (`--h5 PATH` must stay
`--h5 PATH`). The binary is copied with a stand-in benchmark program beside it (fp4moe finds benchmarks/ next to
its own executable), which prints each argument it receives on its own line. The binary is $FP4MOE_BUILD/fp4moe."""

import os
import shutil
import stat
import subprocess
import tempfile
import unittest

ECHO_PROGRAM = '#!/bin/sh\nfor a in "$@"; do printf "[%s]\\n" "$a"; done\n'


def binary():
    build = os.environ.get("FP4MOE_BUILD", os.path.join(os.path.dirname(__file__), "..", "..", "build"))
    return os.path.join(build, "fp4moe")


class BenchCli(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        exe = binary()
        if not os.access(exe, os.X_OK):
            raise unittest.SkipTest(f"{exe} is not built (set FP4MOE_BUILD to the build folder)")
        cls.tmp = tempfile.mkdtemp(prefix="fp4moe_cli_bench_")
        cls.exe = os.path.join(cls.tmp, "fp4moe")
        shutil.copy2(exe, cls.exe)
        os.mkdir(os.path.join(cls.tmp, "benchmarks"))
        prog = os.path.join(cls.tmp, "benchmarks", "bench_echo")
        with open(prog, "w", encoding="utf-8") as f:
            f.write(ECHO_PROGRAM)
        os.chmod(prog, os.stat(prog).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def bench(self, *args):
        return subprocess.run([self.exe, "bench", *args], capture_output=True, text=True, timeout=60)

    def test_arguments_reach_the_program_in_order(self):
        cases = [
            ["--h5", "runs/convert.h5"],  # the README's command
            ["--h5=runs/convert.h5"],
            ["--benchmark_filter=mxfp4", "--h5", "out.h5", "--benchmark_min_time=0.1s"],
            ["a", "b", "--c", "d"],
            ["--h5", "x.h5", "tail", "--benchmark_repetitions", "3"],
            [],
        ]
        for args in cases:
            with self.subTest(args=args):
                r = self.bench("echo", *args)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertEqual(r.stdout.splitlines(), [f"[{a}]" for a in args])

    def test_list_and_unknown_names(self):
        r = self.bench("--list")
        self.assertEqual((r.returncode, r.stdout.split()), (0, ["echo"]))
        r = self.bench("nope", "--h5", "x.h5")
        self.assertEqual(r.returncode, 2)
        self.assertIn("no benchmark 'nope'", r.stderr)
        self.assertIn("available: echo", r.stderr)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        r = self.bench()
        self.assertEqual(r.returncode, 2)
        self.assertIn("name a benchmark (available: echo) or pass --list", r.stderr)


if __name__ == "__main__":
    unittest.main()
