"""Small result files for the reproduction-suite tests, written with h5py alone in the layout of results/h5_file.h
(independently of reports/result_file.py, which the tests check), from seeded random benchmark tables shaped like
those of bench_quant and bench_grouped_gemm."""

import math
import os
import shutil
import tempfile
import textwrap
import unittest

import h5py
import numpy as np

STR = h5py.string_dtype("utf-8")
ROOT_ATTRS = {"git_sha": "0123abcd", "date": "2026-11-29T12:00:00Z", "gpu": "NVIDIA H200",
              "driver": "570.86.15 (CUDA 12.8)", "cuda": "13.0", "cublaslt": "13.1.0", "nccl": "2.28.3",
              "host": "node7", "command": "bench --h5 x.h5"}


def write_table(f, path, columns, attrs=None):
    """columns: {name: list}; strings stored as variable-length UTF-8, ints as int64, floats as float64."""
    g = f.create_group(path)
    for name, values in columns.items():
        if values and isinstance(values[0], str):
            g.create_dataset(name, data=np.array(values, dtype=object), dtype=STR)
        elif values and isinstance(values[0], (int, np.integer)):
            g.create_dataset(name, data=np.asarray(values, dtype=np.int64))
        else:
            g.create_dataset(name, data=np.asarray(values, dtype=np.float64))
    g.attrs.create("columns", list(columns), dtype=STR)
    for k, v in (attrs or {}).items():
        g.attrs.create(k, v, dtype=STR) if isinstance(v, str) else g.attrs.create(k, v)
    return g


def write_root(f, schema_version=1, **overrides):
    if schema_version is not None:
        f.attrs["schema_version"] = np.int64(schema_version)
    for k, v in {**ROOT_ATTRS, **overrides}.items():
        f.attrs.create(k, v, dtype=STR)


def quant_table(seed):
    """/bench/quant columns: conversion kernels over two row shapes and two grouped column shapes, plus copies."""
    rng = np.random.default_rng(seed)
    cols = {c: [] for c in ["case", "shape", "recipe", "time_us", "tflops", "gbps", "fraction_of_copy_bw", "speedup"]}

    def add(case, shape, recipe, speedup=math.nan):
        cols["case"].append(case)
        cols["shape"].append(shape)
        cols["recipe"].append(recipe)
        cols["time_us"].append(float(rng.uniform(20, 400)))
        cols["tflops"].append(0.0)
        cols["gbps"].append(float(rng.uniform(1500, 4000)))
        cols["fraction_of_copy_bw"].append(1.0 if recipe == "copy" else float(rng.uniform(0.4, 0.95)))
        cols["speedup"].append(speedup)

    for shape in ["4096x7168", "16384x2048"]:
        add("bf16_to_mxfp4_row/floor_rne", shape, "mxfp4")
        add("mxfp4_row_to_fp8_row", shape, "mxfp4", float(rng.uniform(1.3, 2.2)))
        add("mxfp4_row_to_fp8_row_naive", shape, "mxfp4")
        add("bf16_to_fp8_row", shape, "fp8")
    for shape in ["4096x7168/g8", "16384x2048/g32"]:
        add("mxfp4_row_to_fp8_col", shape, "mxfp4", float(rng.uniform(1.3, 2.2)))
        add("mxfp4_row_to_fp8_col_naive", shape, "mxfp4")
        add("bf16_to_fp8_col", shape, "fp8")
    for b in ["1000000B", "5000000B"]:
        add("copy", b, "copy")
    return cols


def gemm_table(seed):
    """/bench/grouped_gemm columns: Fprop/Dgrad/Wgrad x BF16/FP8 over three grouped shapes (ragged 8 and 32
    experts, even 8) and their dense ceilings, each grouped shape on one stream (tuning "none") and two ("s2"); the
    Hopper kernel (fp8_sm90) at the grouped shapes in its default variant (tuning "none") and one other, and MXFP4
    Fprop read directly and converted first (mxfp4_sm90, mxfp4_cvt_sm90) at the ragged ones."""
    rng = np.random.default_rng(seed)
    cols = {c: [] for c in ["case", "shape", "recipe", "time_us", "tflops", "gbps", "fraction_of_copy_bw", "speedup",
                            "fraction_of_dense", "experts", "n", "k", "tuning"]}
    for op in ["fprop", "dgrad", "wgrad"]:
        for name, n, k in [("up", 4096, 7168), ("down", 7168, 2048)]:
            for experts, shape, dense, tuning in [
                    (8, f"{name} 8x2048", False, "none"), (32, f"{name} 32x512", False, "none"),
                    (8, f"{name} 8x2048 even", False, "none"), (1, f"{name} 1x16384", True, "none"),
                    (8, f"{name} 8x2048", False, "s2"), (32, f"{name} 32x512", False, "s2"),
                    (8, f"{name} 8x2048 even", False, "s2")]:
                t_bf16 = float(rng.uniform(500, 900))
                for recipe in ["bf16", "fp8"]:
                    t = t_bf16 if recipe == "bf16" else t_bf16 / float(rng.uniform(1.2, 1.9))
                    cols["case"].append(op + ("_dense" if dense else ""))
                    cols["shape"].append(shape)
                    cols["recipe"].append(recipe)
                    cols["time_us"].append(t)
                    cols["tflops"].append(2 * 16384 * n * k / t * 1e-6)
                    cols["gbps"].append(math.nan)
                    cols["fraction_of_copy_bw"].append(math.nan)
                    cols["speedup"].append(t_bf16 / t if recipe == "fp8" else math.nan)
                    cols["fraction_of_dense"].append(math.nan if dense else float(rng.uniform(0.6, 1.0)))
                    cols["experts"].append(experts)
                    cols["n"].append(n)
                    cols["k"].append(k)
                    cols["tuning"].append(tuning)
    # The Hopper kernel's rows (bench_grouped_gemm's fp8_sm90 at its default variant, tuning "none") beside the
    # one-stream cuBLASLt FP8 rows of the grouped shapes, and the MXFP4 Fprop rows read directly (mxfp4_sm90) and
    # converted first (mxfp4_cvt_sm90).
    fp8 = [i for i in range(len(cols["case"])) if cols["recipe"][i] == "fp8" and cols["tuning"][i] == "none"
           and not cols["case"][i].endswith("_dense")]
    # Each fp8_sm90 row has a variant beside it (a forced tile width, or the Wgrad kernel's serial promotion), which
    # the rows of the default variant must leave out.
    for i in fp8:
        variant = "serial" if cols["case"][i] == "wgrad" else "n128"
        recipes = [("fp8_sm90", "none", cols["time_us"][i] / float(rng.uniform(0.6, 1.3))),
                   ("fp8_sm90", variant, cols["time_us"][i] / float(rng.uniform(0.6, 1.3)))]
        if cols["case"][i] == "fprop" and not cols["shape"][i].endswith("even"):
            t_cvt = cols["time_us"][i] / float(rng.uniform(0.8, 1.2))
            recipes += [("mxfp4_cvt_sm90", "none", t_cvt), ("mxfp4_sm90", "none", t_cvt / float(rng.uniform(0.4, 1.1)))]
        for recipe, tuning, t in recipes:
            for c in cols:
                cols[c].append(cols[c][i])
            cols["recipe"][-1] = recipe
            cols["tuning"][-1] = tuning
            cols["time_us"][-1] = t
            cols["tflops"][-1] = 2 * 16384 * cols["n"][i] * cols["k"][i] / t * 1e-6
            cols["speedup"][-1] = math.nan
            cols["fraction_of_dense"][-1] = math.nan
    return cols


def write_bench_file(path, family, columns, schema_version=1, **root):
    with h5py.File(path, "w") as f:
        write_root(f, schema_version, **root)
        write_table(f, f"/bench/{family}", columns, {"note": f"{family} test table"})


def geomean(values):
    v = np.asarray(values, dtype=np.float64)
    return float(np.exp(np.mean(np.log(v))))


def rows_where(columns, **conds):
    """Indices of the rows whose cells equal every condition."""
    n = len(columns["case"])
    return [i for i in range(n) if all(columns[c][i] == v for c, v in conds.items())]


def write_run(path, ours_values, time_scale=1.0, schema_version=1, extra_row=False, quant_family="quant"):
    """A run file as repro/run.py writes it, made with h5py alone: /bench/<quant_family> (bench_quant's table;
    "convert" in run files of its former name bench_convert), /bench/grouped_gemm and one /repro table with the given
    ours values."""
    conv, gemm = quant_table(31), gemm_table(32)
    conv["time_us"] = [t * time_scale for t in conv["time_us"]]
    with h5py.File(path, "w") as f:
        write_root(f, schema_version, scale="default")
        write_table(f, f"/bench/{quant_family}", conv, {"command": f"bench_{quant_family} --h5 x.h5"})
        write_table(f, "/bench/grouped_gemm", gemm)
        rows = ["fused over unfused", "bytes"] + (["only in B"] if extra_row else [])
        write_table(f, "/repro/conversion_kernels", {
            "row": rows, "paper": ["1.6-1.9", "~3"] + ([""] if extra_row else []),
            "paper_source": ["P1, secondary summary", "P1"] + (["none: x"] if extra_row else []),
            "ours": list(ours_values), "ratio": [ours_values[0] / 1.75, ours_values[1] / 3] + ([math.nan] if extra_row
                                                                                              else []),
            "unit": ["x"] * len(rows), "note": ["n"] * len(rows)},
            {"title": "Conversion kernels", "benchmark": f"bench_{quant_family}", "budget_gpu_minutes": 15.0,
             "elapsed_s": 120.0, "exit_code": 0, "filter": ""})
    return conv, gemm


class Tmp(unittest.TestCase):
    """A test case with its own temporary folder (removed after each test)."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="fp4moe_test_")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def path(self, *parts):
        return os.path.join(self.tmp, *parts)

    def assert_one_line(self, r, code, tool, expected):
        """The finished process `r` exited with `code` and wrote one line "<tool>: ...expected..." to stderr, no
        traceback."""
        self.assertEqual(r.returncode, code, r.stdout + r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        self.assertTrue(r.stderr.startswith(f"{tool}: "), r.stderr)
        self.assertIn(expected, r.stderr)

    def write_toml(self, text):
        """Writes the dedented text to bad.toml in the folder and returns its path (scenario files under test)."""
        p = self.path("bad.toml")
        with open(p, "w", encoding="utf-8") as f:
            f.write(textwrap.dedent(text))
        return p
