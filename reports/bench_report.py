#!/usr/bin/env python3
"""Markdown report of one fp4moe result file's benchmark tables.

    reports/bench_report.py RESULT.h5 [--out REPORT.md]

Reads the root attributes (git_sha, date, gpu, driver, cuda, cublaslt, nccl, host, command) as the report's header
and every table under /bench (one group per table: one 1-D dataset per column, the attribute `columns` giving
their order; results/h5_file.h) as a Markdown table, followed by the geometric means of its ratio columns
(fraction_of_copy_bw, speedup) where it has them. NaN cells (not applicable) print as "-".
Exit codes: 0 written, 1 no /bench table in the file, 2 bad arguments or unreadable file.
"""

import argparse
import math
import os
import sys

import h5py
import numpy as np
import pandas as pd

ROOT_ATTRIBUTES = ["git_sha", "date", "gpu", "driver", "cuda", "cublaslt", "nccl", "host", "command"]
RATIO_COLUMNS = {"fraction_of_copy_bw": "x copy", "speedup": "speedup"}


def _text(v):
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, np.generic):
        return v.item()
    return v


def read_table(group):
    """One table group -> DataFrame, columns in the order of its `columns` attribute."""
    columns = [_text(c) for c in group.attrs["columns"]]
    data = {}
    for c in columns:
        ds = group[c]
        data[c] = ds.asstr()[()] if ds.dtype.kind == "O" else ds[()]
    return pd.DataFrame(data, columns=columns)


def read_bench_tables(path):
    """(root attributes, {table path: DataFrame}) for every table group under /bench, in name order."""
    tables = {}
    with h5py.File(path, "r") as f:
        attrs = {k: _text(v) for k, v in f.attrs.items()}
        if "bench" in f:
            def visit(name, obj):
                if isinstance(obj, h5py.Group) and "columns" in obj.attrs:
                    tables["/bench/" + name] = read_table(obj)
            f["bench"].visititems(visit)
    return attrs, tables


def _cell(v):
    v = _text(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        return f"{v:.4g}" if abs(v) < 1e6 else f"{v:.4e}"
    return str(v).replace("|", "\\|").replace("\n", " ")


def markdown_table(df):
    lines = ["| " + " | ".join(df.columns) + " |",
             "|" + "|".join("---:" if df[c].dtype.kind in "fiu" else "---" for c in df.columns) + "|"]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(_cell(v) for v in row) + " |")
    return "\n".join(lines)


def geomean(values):
    v = [x for x in values if isinstance(x, (float, int)) and x > 0 and math.isfinite(x)]
    return (math.exp(sum(math.log(x) for x in v) / len(v)), len(v)) if v else (float("nan"), 0)


def ratio_summary(df):
    parts = []
    for col, label in RATIO_COLUMNS.items():
        if col not in df.columns:
            continue
        rows = df if "recipe" not in df.columns else df[df["recipe"] != "copy"]
        g, n = geomean(rows[col].tolist())
        if n:
            parts.append(f"{label} {g:.3g} over {n} rows")
    return ("Geometric mean: " + "; ".join(parts) + ".") if parts else ""


def render(path):
    attrs, tables = read_bench_tables(path)
    out = [f"# Benchmarks: {attrs.get('gpu', 'unknown GPU')}", "", "| attribute | value |", "|---|---|"]
    for k in ROOT_ATTRIBUTES + sorted(k for k in attrs if k not in ROOT_ATTRIBUTES):
        if k in attrs:
            out.append(f"| {k} | {_cell(attrs[k])} |")
    for name, df in tables.items():
        out += ["", f"## {name}", "", f"{len(df)} rows.", "", markdown_table(df)]
        summary = ratio_summary(df)
        if summary:
            out += ["", summary]
    return "\n".join(out) + "\n", len(tables)


def main(argv=None):
    p = argparse.ArgumentParser(description="Markdown tables of a result file's /bench tables")
    p.add_argument("result", help="HDF5 result file")
    p.add_argument("--out", help="write the report here instead of printing it")
    a = p.parse_args(argv)
    if not os.path.isfile(a.result):
        why = "not a file" if os.path.exists(a.result) else "no such file"
        print(f"bench_report: cannot read '{a.result}': {why}", file=sys.stderr)
        return 2
    try:
        text, n = render(a.result)
    except (OSError, KeyError) as e:
        print(f"bench_report: cannot read '{a.result}': {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    if n == 0:
        print(f"bench_report: '{a.result}' holds no /bench table", file=sys.stderr)
        return 1
    if a.out:
        try:
            with open(a.out, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as e:
            print(f"bench_report: cannot write '{a.out}': {' '.join(str(e).split())}", file=sys.stderr)
            return 2
        print(f"bench_report: wrote {a.out} ({n} tables)")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
