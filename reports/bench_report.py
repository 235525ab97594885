#!/usr/bin/env python3
"""Markdown report of one fp4moe result file's benchmark tables.

    reports/bench_report.py RESULT.h5 [--out REPORT.md]

Reads the root attributes (git_sha, date, gpu, driver, cuda, cublaslt, nccl, host, command) as the report's header
and every table under /bench (one group per table: one 1-D dataset per column, the attribute `columns` giving
their order; results/h5_file.h) as a Markdown table, followed by the geometric means of its ratio columns
(fraction_of_copy_bw, speedup) where it has them. NaN cells (not applicable) print as "-".
REPORT.md may not be RESULT.h5 (nor a link to it) nor anything but a regular file; it is written under a temporary
name and renamed (reports/output_path.py).
Exit codes: 0 written, 1 no /bench table in the file, 2 bad arguments, an unreadable file, another schema_version (result_file.check_schema)
or a malformed table, an
output refused, or no interpreter that imports numpy, pandas and h5py (reports/interpreter.py).
"""

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if __name__ == "__main__":
    from reports import interpreter

    interpreter.require("bench_report", ("numpy", "pandas", "h5py"))

import h5py  # noqa: E402

from reports import output_path, result_file  # noqa: E402

ROOT_ATTRIBUTES = ["git_sha", "date", "gpu", "driver", "cuda", "cublaslt", "nccl", "host", "command"]
RATIO_COLUMNS = {"fraction_of_copy_bw": "x copy", "speedup": "speedup"}
_text = result_file.text


def read_bench_tables(path):
    """(root attributes, {table path: DataFrame}) for every table group under /bench, in name order. Raises
    OSError, result_file.SchemaError (another schema_version) and result_file.TableError (a malformed table)."""
    with h5py.File(path, "r") as f:
        result_file.check_schema(path, f)
        return result_file.root_attributes(f), result_file.tables_under(f, "bench")


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
    if a.out is not None:
        try:
            output_path.check_file(a.out, [a.result])
        except output_path.OutputPathError as e:
            print(f"bench_report: refused --out: {e}", file=sys.stderr)
            return 2
    try:
        text, n = render(a.result)
    except (result_file.SchemaError, result_file.TableError) as e:
        print(f"bench_report: {e}", file=sys.stderr)
        return 2
    except (OSError, KeyError) as e:
        print(f"bench_report: cannot read '{a.result}': {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    if n == 0:
        print(f"bench_report: '{a.result}' holds no /bench table", file=sys.stderr)
        return 1
    if a.out is not None:
        try:
            output_path.write_text(a.out, text, [a.result])
        except (OSError, output_path.OutputPathError) as e:
            print(f"bench_report: cannot write '{a.out}': {' '.join(str(e).split())}", file=sys.stderr)
            return 2
        print(f"bench_report: wrote {a.out} ({n} tables)")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
