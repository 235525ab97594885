#!/usr/bin/env python3
"""Side-by-side Markdown comparison of two fp4moe run files.

    reports/compare.py A.h5 B.h5 [--out FILE]

Prints (or writes to FILE) the root attributes of both files; for every /repro table either file has, its rows
matched by `row`: the paper value, ours in A and in B, B - A and B / A; for every /bench table (a table's former name
read as its current one, result_file.RENAMED_TABLES), its rows matched by (case, shape, recipe), and `tuning` and
`direction` where both tables have them: time_us in A and B with B / A, and the table's headline rate (tflops where the table has any
above zero, else gbps) in A and B with B / A. A row or table present in one file only shows "-" for the other. A
table without its key columns, or with a key on two rows, is refused as malformed (rows could not be matched).
Both files must have the schema_version this code reads (result_file.SCHEMA_VERSION); any other is refused, and so
is a result file that holds no /repro or /bench table (e.g. an `fp4moe quantize` output). FILE may not be A or B
(nor a link to either) nor anything but a regular file; it is written under a temporary name and renamed
(reports/output_path.py).
Exit codes: 0 written, 1 a file of another schema or without tables (refused), 2 bad arguments, an unreadable
file, a malformed table (named with its file and column), an output refused or not writable, or no interpreter that
imports numpy, pandas, h5py and matplotlib (reports/interpreter.py).
"""

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if __name__ == "__main__":
    from reports import interpreter

    interpreter.require("compare")

import pandas as pd  # noqa: E402

from reports import output_path, result_file  # noqa: E402
from reports.report import load_run  # noqa: E402

ATTRIBUTES = ["schema_version", "git_sha", "date", "gpu", "driver", "cuda", "cublaslt", "nccl", "host", "scale"]
BENCH_KEY = ["case", "shape", "recipe"]
# Key columns of the tables that have them: bench_grouped_gemm measures each (case, shape, recipe) once per `tuning`,
# bench_ep_comm once per exchange (`direction`).
BENCH_KEY_WHERE_PRESENT = ["tuning", "direction"]


def _num(v):
    return f"{v:.4g}" if result_file.is_number(v) else "-"


def _esc(v):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v).replace("|", "\\|")


def _ratio(a, b):
    return b / a if result_file.is_number(a) and result_file.is_number(b) and a != 0 else math.nan


def _delta(a, b):
    return b - a if result_file.is_number(a) and result_file.is_number(b) else math.nan


def _table(header, rows, numeric_from):
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---:" if i >= numeric_from else "---" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def _outer(a, b, key):
    """Outer join of two DataFrames (None for a missing table) on `key`, suffixes _a and _b, A's order first."""
    empty = pd.DataFrame(columns=key)
    a = a if a is not None else (b.iloc[0:0] if b is not None else empty)
    b = b if b is not None else a.iloc[0:0]
    return a.merge(b, on=key, how="outer", suffixes=("_a", "_b"), sort=False)


def _check_key(tables, key):
    """Raises result_file.TableError unless no DataFrame of `tables` ({"'file' table /path": DataFrame or None})
    holds a key twice (rows are matched by it; load_run has checked that the key columns are there)."""
    for where, df in tables.items():
        if df is None:
            continue
        twice = df[df.duplicated(key, keep="first")]
        if len(twice):
            shown = ", ".join(f"{k}={twice.iloc[0][k]!r}" for k in key)
            raise result_file.TableError(f"{where} column '{key[0]}': key ({shown}) appears more than once, "
                                         f"expected each row's key ({', '.join(key)}) once")


def compare_repro(da, db):
    m = _outer(da, db, ["row"])
    rows = []
    for _, r in m.iterrows():
        paper = r.get("paper_a") if isinstance(r.get("paper_a"), str) else r.get("paper_b")
        oa, ob = r.get("ours_a", math.nan), r.get("ours_b", math.nan)
        rows.append([_esc(r["row"]), _esc(paper or "-"), _num(oa), _num(ob), _num(_delta(oa, ob)),
                     _num(_ratio(oa, ob))])
    return _table(["row", "paper", "ours A", "ours B", "B - A", "B / A"], rows, 2)


def _rate_column(*dfs):
    for df in dfs:
        if df is not None and "tflops" in df.columns and (pd.to_numeric(df["tflops"], errors="coerce") > 0).any():
            return "tflops"
    return "gbps"


def bench_key(da, db):
    """The columns /bench rows are matched by: BENCH_KEY, and those of BENCH_KEY_WHERE_PRESENT that each table given
    (not None) has."""
    tables = [d for d in (da, db) if d is not None]
    return BENCH_KEY + [k for k in BENCH_KEY_WHERE_PRESENT if all(k in d.columns for d in tables)]


def compare_bench(da, db):
    key = bench_key(da, db)
    rate = _rate_column(da, db)
    m = _outer(da, db, key)
    rows = []
    for _, r in m.iterrows():
        ta, tb = r.get("time_us_a", math.nan), r.get("time_us_b", math.nan)
        ra, rb = r.get(f"{rate}_a", math.nan), r.get(f"{rate}_b", math.nan)
        rows.append([_esc(r[k]) for k in key] + [_num(ta), _num(tb), _num(_ratio(ta, tb)), _num(ra), _num(rb),
                                                  _num(_ratio(ra, rb))])
    header = key + ["time_us A", "time_us B", "time B / A", f"{rate} A", f"{rate} B", f"{rate} B / A"]
    return _table(header, rows, len(key))


def render(path_a, path_b):
    """Markdown text comparing two run files. Raises OSError and result_file.SchemaError."""
    a, b = load_run(path_a), load_run(path_b)
    for path, run in ((path_a, a), (path_b, b)):
        if not run["repro"] and not run["bench"]:
            raise result_file.SchemaError(f"'{path}' holds no /repro or /bench table: it is not a run or benchmark "
                                          f"result file")
        try:
            run["bench"] = result_file.current_table_names(run["bench"])  # older files: a table's former name
        except result_file.TableError as e:
            raise result_file.TableError(f"'{path}': {e}") from None
    out = ["# Comparison", "", f"A: `{path_a}`", "", f"B: `{path_b}`", ""]
    out += _table(["attribute", "A", "B"],
                  [[k, _esc(a["attrs"].get(k)), _esc(b["attrs"].get(k))] for k in ATTRIBUTES
                   if k in a["attrs"] or k in b["attrs"]], 3)
    for kind, fn in (("repro", compare_repro), ("bench", compare_bench)):
        for p in sorted(set(a[kind]) | set(b[kind])):
            da, db = (a[kind].get(p, (None,))[0], b[kind].get(p, (None,))[0])
            _check_key({f"'{path_a}' table {p}": da, f"'{path_b}' table {p}": db},
                       ["row"] if kind == "repro" else bench_key(da, db))
            only = "" if da is not None and db is not None else (" (only in A)" if db is None else " (only in B)")
            out += ["", f"## {p}{only}", ""] + fn(da, db)
    return "\n".join(out) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description="side-by-side comparison of two fp4moe run files")
    p.add_argument("a", help="run file A (the reference)")
    p.add_argument("b", help="run file B")
    p.add_argument("--out", help="write the comparison here instead of printing it")
    args = p.parse_args(argv)
    if args.out is not None:
        try:
            output_path.check_file(args.out, [args.a, args.b])
        except output_path.OutputPathError as e:
            print(f"compare: refused --out: {e}", file=sys.stderr)
            return 2
    try:
        text = render(args.a, args.b)
    except result_file.SchemaError as e:
        print(f"compare: refused: {e}", file=sys.stderr)
        return 1
    except result_file.TableError as e:
        print(f"compare: {e}", file=sys.stderr)
        return 2
    except (OSError, KeyError) as e:
        print(f"compare: cannot read the run files: {result_file.one_line(e)}", file=sys.stderr)
        return 2
    if args.out is not None:
        try:
            output_path.write_text(args.out, text, [args.a, args.b])
        except (OSError, output_path.OutputPathError) as e:
            print(f"compare: cannot write '{args.out}': {result_file.one_line(e)}", file=sys.stderr)
            return 2
        print(f"compare: wrote {args.out}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
