"""reports/bench_report.py on a small result file built with h5py in the schema of results/h5_file.h: root
attributes as the header, each /bench table as Markdown in its column order, NaN as "-", geometric means of the
ratio columns, --out, and the exit codes for a file without tables and an unreadable file."""

import importlib.util
import math
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import h5py
import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SCRIPT = os.path.join(ROOT, "reports", "bench_report.py")

spec = importlib.util.spec_from_file_location("bench_report", SCRIPT)
bench_report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench_report)

STR = h5py.string_dtype("utf-8")


def write_table(f, path, columns):
    """columns: list of (name, values); strings as variable-length UTF-8, numbers as given."""
    g = f.create_group(path)
    for name, values in columns:
        if values and isinstance(values[0], str):
            g.create_dataset(name, data=np.array(values, dtype=object), dtype=STR)
        else:
            g.create_dataset(name, data=np.asarray(values))
    g.attrs.create("columns", [n for n, _ in columns], dtype=STR)


class BenchReport(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="fp4moe_bench_report_")
        self.path = os.path.join(self.tmp, "r.h5")
        rng = np.random.default_rng(7)
        self.fraction = [1.0, float(rng.uniform(0.5, 0.9)), float(rng.uniform(0.5, 0.9))]
        self.speedup = [math.nan, float(rng.uniform(1.2, 2.5)), math.nan]
        with h5py.File(self.path, "w") as f:
            f.attrs["schema_version"] = np.int64(1)
            for k, v in [("git_sha", "abc123"), ("date", "2026-01-31T12:00:00Z"), ("gpu", "NVIDIA H200"),
                         ("driver", "570.86.15 (CUDA 12.8)"), ("cuda", "13.0"), ("cublaslt", "13.1.0"),
                         ("nccl", "2.28.9"), ("host", "node7"), ("command", "bench_quant --h5 'a|b.h5'")]:
                f.attrs.create(k, v, dtype=STR)
            # Column order differs from name order on purpose.
            write_table(f, "/bench/quant", [
                ("case", ["copy", "mxfp4_row_to_fp8_row", "bf16_to_fp8_row"]),
                ("shape", ["123B", "4096x7168", "4096x7168"]),
                ("recipe", ["copy", "mxfp4", "fp8"]),
                ("time_us", [10.0, float(rng.uniform(20, 40)), 31.25]),
                ("tflops", [0.0, 0.0, 0.0]),
                ("gbps", [4000.0, 3000.5, 2800.0]),
                ("fraction_of_copy_bw", self.fraction),
                ("speedup", self.speedup),
            ])
            write_table(f, "/bench/gemm/fp8", [("case", ["dense"]), ("calls", np.array([3], dtype=np.int64))])
            write_table(f, "/train/run0", [("step", np.array([1], dtype=np.int64))])

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_tables_read_back_in_column_order(self):
        attrs, tables = bench_report.read_bench_tables(self.path)
        self.assertEqual(sorted(tables), ["/bench/gemm/fp8", "/bench/quant"])
        df = tables["/bench/quant"]
        self.assertEqual(list(df.columns), ["case", "shape", "recipe", "time_us", "tflops", "gbps",
                                            "fraction_of_copy_bw", "speedup"])
        self.assertEqual(df["case"].tolist(), ["copy", "mxfp4_row_to_fp8_row", "bf16_to_fp8_row"])
        self.assertEqual(df["fraction_of_copy_bw"].tolist(), self.fraction)
        self.assertEqual(attrs["gpu"], "NVIDIA H200")
        self.assertEqual(attrs["schema_version"], 1)

    def test_markdown(self):
        text, n = bench_report.render(self.path)
        self.assertEqual(n, 2)
        lines = text.splitlines()
        self.assertEqual(lines[0], "# Benchmarks: NVIDIA H200")
        self.assertIn("| git_sha | abc123 |", lines)
        self.assertIn("| command | bench_quant --h5 'a\\|b.h5' |", lines)  # '|' escaped
        self.assertIn("## /bench/quant", lines)
        self.assertIn("| case | shape | recipe | time_us | tflops | gbps | fraction_of_copy_bw | speedup |", lines)
        row = next(l for l in lines if l.startswith("| bf16_to_fp8_row |"))
        self.assertEqual(row, f"| bf16_to_fp8_row | 4096x7168 | fp8 | 31.25 | 0 | 2800 | {self.fraction[2]:.4g} | - |")
        # Geometric means over the non-copy rows only.
        g = math.sqrt(self.fraction[1] * self.fraction[2])
        self.assertIn(f"Geometric mean: x copy {g:.3g} over 2 rows; speedup {self.speedup[1]:.3g} over 1 rows.", lines)
        self.assertIn("## /bench/gemm/fp8", lines)
        self.assertIn("| dense | 3 |", lines)
        self.assertNotIn("/train/run0", text)

    def test_command_line_out_and_exit_codes(self):
        out = os.path.join(self.tmp, "report.md")
        r = subprocess.run([sys.executable, SCRIPT, self.path, "--out", out], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(out, encoding="utf-8") as f:
            self.assertEqual(f.read(), bench_report.render(self.path)[0])

        empty = os.path.join(self.tmp, "empty.h5")
        with h5py.File(empty, "w") as f:
            f.attrs["schema_version"] = np.int64(bench_report.result_file.SCHEMA_VERSION)
            f.attrs["git_sha"] = "x"
        r = subprocess.run([sys.executable, SCRIPT, empty], capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertIn("holds no /bench table", r.stderr)

        r = subprocess.run([sys.executable, SCRIPT, os.path.join(self.tmp, "missing.h5")], capture_output=True,
                           text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("cannot read", r.stderr)
        self.assertNotIn("Traceback", r.stderr)

    def test_folders_and_unwritable_outputs_are_one_line_errors(self):
        blocker = os.path.join(self.tmp, "plain_file")
        with open(blocker, "w", encoding="utf-8") as f:
            f.write("x")
        missing, out = os.path.join(self.tmp, "missing.h5"), os.path.join(blocker, "r.md")
        for args, expected in (([self.tmp], f"cannot read '{self.tmp}': not a file"),
                               ([missing], f"cannot read '{missing}': no such file"),
                               ([self.path, "--out", out], f"cannot write '{out}'")):
            with self.subTest(args=args):
                r = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(f"bench_report: {expected}", r.stderr)
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
                self.assertNotIn("Traceback", r.stderr)


if __name__ == "__main__":
    unittest.main()
