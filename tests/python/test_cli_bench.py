"""`fp4moe bench NAME ARGS...` hands ARGS to benchmarks/bench_NAME untouched and in order (`--h5 PATH` must stay
`--h5 PATH`; `--help` after the name asks the program for its options, before it `fp4moe bench` for its own help),
and the benchmark programs check their --h5 path before they run and answer --help with their options. For the first, the binary is
copied with a stand-in benchmark program beside it (fp4moe finds benchmarks/ next to its own executable), which
prints each argument it receives on its own line. The binary is $FP4MOE_BUILD/fp4moe."""

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_test_util import binary  # noqa: E402

ECHO_PROGRAM = '#!/bin/sh\nfor a in "$@"; do printf "[%s]\\n" "$a"; done\n'


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
            ["--h5", "runs/quant.h5"],  # the README's command
            ["--h5=runs/quant.h5"],
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
        r = self.bench("--benchmark_filter=x")
        self.assertEqual((r.returncode, r.stdout), (2, ""))
        self.assertIn("unknown option '--benchmark_filter=x' before the benchmark's name", r.stderr)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)


    def test_help_after_the_name_reaches_the_program(self):
        for args in (["--help"], ["-h"], ["--benchmark_filter=x", "--help"]):
            with self.subTest(args=args):
                r = self.bench("echo", *args)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertEqual(r.stdout.splitlines(), [f"[{a}]" for a in args])

    def test_help_before_the_name_says_how_to_run_the_programs(self):
        for flag in ("--help", "-h"):
            with self.subTest(flag=flag):
                r = self.bench(flag)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertIn("fp4moe bench NAME --help", r.stdout)
                self.assertIn("programs: echo", r.stdout)


class BenchProgramHelp(unittest.TestCase):
    """Each benchmark program answers -h/--help, also through `fp4moe bench NAME --help`, with its own options: its
    flags, --h5 PATH and Google Benchmark's flags; no GPU needed."""

    OWN_FLAGS = {"bench_group_linear": ["--all", "--list_splits"]}

    def test_every_program_lists_its_options(self):
        exe = binary()
        bench_dir = os.path.join(os.path.dirname(exe), "benchmarks")
        programs = sorted(p for p in (os.listdir(bench_dir) if os.path.isdir(bench_dir) else [])
                          if p.startswith("bench_") and os.access(os.path.join(bench_dir, p), os.X_OK))
        if not programs or not os.access(exe, os.X_OK):
            self.skipTest(f"fp4moe or the benchmark programs are not built in {os.path.dirname(exe)}")
        for prog in programs:
            for command in ([os.path.join(bench_dir, prog), "--help"], [os.path.join(bench_dir, prog), "-h"],
                            [exe, "bench", prog[len("bench_"):], "--help"]):
                with self.subTest(command=command[1:]):
                    r = subprocess.run(command, capture_output=True, text=True, timeout=60)
                    self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                    self.assertIn(f"usage: {prog} ", r.stdout)
                    for flag in [*self.OWN_FLAGS.get(prog, []), "--h5 PATH", "--benchmark_filter=",
                                 "--benchmark_list_tests"]:
                        self.assertIn(flag, r.stdout)


class BenchResultPath(unittest.TestCase):
    """--h5 PATH is checked before any benchmark runs (the file is written only after all of them): a missing
    folder is created, a path that cannot be written ends the program with exit code 2 and one line. The check
    comes before the GPU is looked for, so it runs on any machine."""

    PROGRAMS = ("bench_quant", "bench_grouped_gemm", "bench_nn")

    def setUp(self):
        self.build = os.path.dirname(binary())
        self.tmp = tempfile.mkdtemp(prefix="fp4moe_bench_h5_")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def programs(self):
        found = [p for p in self.PROGRAMS if os.access(os.path.join(self.build, "benchmarks", p), os.X_OK)]
        if not found:
            self.skipTest(f"no benchmark program built in {self.build}/benchmarks")
        return found

    def run_program(self, prog, *args):
        return subprocess.run([os.path.join(self.build, "benchmarks", prog), *args], capture_output=True, text=True,
                              timeout=120)

    def test_unwritable_paths_fail_at_once(self):
        blocker = os.path.join(self.tmp, "plain_file")
        with open(blocker, "w", encoding="utf-8") as f:
            f.write("x")
        cases = [(os.path.join(blocker, "sub", "r.h5"), f"': cannot create the folder '{blocker}/sub': "
                                                        f"'{blocker}' is not a folder"),
                 (self.tmp, "' is a folder, expected a regular file or a path that does not exist yet"),
                 ("/dev/null", "' is a character device, expected a regular file")]
        for prog in self.programs():
            for path, expected in cases:
                for args in (["--h5", path], [f"--h5={path}"]):
                    with self.subTest(prog=prog, args=args):
                        r = self.run_program(prog, *args, "--benchmark_filter=^$")
                        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
                        self.assertIn(f"--h5 '{path}{expected}", r.stderr)
                        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
            # Google Benchmark's own output file is another output of the program: the HDF5 rename would replace it.
            same = os.path.join(self.tmp, "r.h5")
            r = self.run_program(prog, "--h5", same, f"--benchmark_out={self.tmp}/./r.h5", "--benchmark_filter=^$")
            self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
            self.assertIn(f"--h5 '{same}' is the same file as --benchmark_out '{self.tmp}/./r.h5'", r.stderr)
            r = self.run_program(prog, "--h5=")
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("--h5 is empty, expected the path of the file to write", r.stderr)
            self.assertTrue(stat.S_ISCHR(os.stat("/dev/null").st_mode))

    def test_a_missing_folder_is_created_before_the_run(self):
        for prog in self.programs():
            with self.subTest(prog=prog):
                folder = os.path.join(self.tmp, prog, "runs")
                self.run_program(prog, "--h5", os.path.join(folder, "r.h5"), "--benchmark_list_tests")
                self.assertTrue(os.path.isdir(folder))



class BenchNnCases(unittest.TestCase):
    """bench_nn lists its cases without a device (--benchmark_list_tests): every kernel of kernels/nn it measures at
    both of the trainer's scales, named <kernel>/<scale>/<dims>, and the copies it compares them with."""

    KERNELS = ("rmsnorm_fwd", "rmsnorm_bwd", "rope_fwd", "rope_bwd", "swiglu_fwd", "swiglu_bwd", "router_fwd",
               "router_bwd", "permute_map", "permute_fwd", "permute_bwd", "unpermute_fwd", "unpermute_bwd",
               "embedding_fwd", "embedding_bwd", "cross_entropy_fwd", "cross_entropy_bwd", "adamw")

    def test_lists_every_kernel_at_both_scales(self):
        prog = os.path.join(os.path.dirname(binary()), "benchmarks", "bench_nn")
        if not os.access(prog, os.X_OK):
            self.skipTest(f"{prog} is not built")
        r = subprocess.run([prog, "--benchmark_list_tests"], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        # Google Benchmark appends the run options: rmsnorm_fwd/small/8192x768/min_time:0.050/manual_time.
        names = [n.split("/min_time:")[0] for n in r.stdout.split()]
        for kernel in self.KERNELS:
            for scale in ("small", "v3"):
                with self.subTest(kernel=kernel, scale=scale):
                    self.assertEqual(sum(n.startswith(f"{kernel}/{scale}/") for n in names), 1, names)
        self.assertIn("rmsnorm_fwd/small/8192x768", names)
        self.assertIn("rmsnorm_fwd/v3/4096x7168", names)
        self.assertIn("router_fwd/v3/4096x16/top8", names)
        self.assertIn("cross_entropy_fwd/v3/4096/V32768/chunk8192", names)
        self.assertTrue(any(n.startswith("copy/") for n in names), names)
        self.assertEqual(len(names), len(set(names)), "case names must be unique")


if __name__ == "__main__":
    unittest.main()
