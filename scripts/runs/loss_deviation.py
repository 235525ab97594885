#!/usr/bin/env python3
"""The two Python steps of scripts/runs/loss_deviation.sh (paper 1's loss deviation: FP8 +0.29%, MXFP4 +0.61% against
BF16 at equal tokens).

    loss_deviation.py merge OUT.h5 RUN1.h5 RUN2.h5 ...   one result file holding the /train/<run> and /memory/<run>
                                                          groups of every input (`fp4moe train --out F` replaces F,
                                                          so each run writes its own file first); root attributes of
                                                          the first input; refuses a run name seen twice
    loss_deviation.py summary FILE.h5 [--baseline bf16]  per run: steps, tokens, last validation loss and its
                                                          deviation from the baseline's (reports/train_report.py
                                                          deviation()), beside the paper's value

Written to `OUT.tmp-<pid>` and renamed, so a failure never leaves a half-written file. Exit codes: 0 done, 1 a run
is missing, has no finite validation loss, or the file is unreadable (summary); 2 an unreadable input, another
schema or a duplicate run (merge).
"""

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import h5py  # noqa: E402

from reports import result_file, train_report  # noqa: E402

# Paper 1 (FP4 storage and communication with FP8 compute, DeepSeek-V3 671B after 160B tokens): relative deviation of
# the loss from BF16's.
PAPER_DEVIATION = {"fp8": 0.0029, "mxfp4": 0.0061}


class MergeError(Exception):
    """An input that cannot be merged: unreadable, another schema, no /train run, a run name seen twice."""


def merge_train_runs(out_path, inputs):
    """Writes `out_path` with every /train/<run> and /memory/<run> group of `inputs` (in order) and the first input's
    root attributes. Returns the run names. Raises MergeError and leaves no file behind."""
    if not inputs:
        raise MergeError("no input file to merge")
    tmp = f"{out_path}.tmp-{os.getpid()}"
    runs = []
    try:
        with h5py.File(tmp, "w") as out:
            for i, path in enumerate(inputs):
                try:
                    result_file.check_readable(path)
                    src = h5py.File(path, "r")
                except OSError as e:
                    raise MergeError(f"cannot read '{path}': {e}") from None
                with src:
                    try:
                        result_file.check_schema(path, src)
                    except result_file.SchemaError as e:
                        raise MergeError(str(e)) from None
                    if i == 0:
                        for k, v in result_file.root_attributes(src).items():
                            result_file.set_attribute(out, k, v)
                    names = list(src["train"]) if "train" in src else []
                    if not names:
                        raise MergeError(f"'{path}' holds no /train run")
                    for kind in ("train", "memory"):
                        if kind not in src:
                            continue
                        group = out.require_group(kind)
                        for name in src[kind]:
                            if name in group:
                                raise MergeError(f"/{kind}/{name} appears in more than one input (again in '{path}')")
                            src.copy(src[kind][name], group, name=name)
                    runs += names
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, out_path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return runs


def summary_lines(path, baseline="bf16"):
    """Markdown lines: one row per run with its last validation loss, its deviation from the baseline's and the paper's.
    Raises ValueError when the baseline run is missing."""
    runs = train_report.load_train_runs(path)
    if baseline not in runs:
        raise ValueError(f"no /train/{baseline} run in '{path}' (runs: {', '.join(sorted(runs)) or 'none'})")
    dev = train_report.deviation(runs, baseline)
    lines = ["| run | steps | tokens | val loss | vs " + baseline + " | paper |", "|---|---:|---:|---:|---:|---:|"]
    for name, r in runs.items():
        s = train_report.summarize(r["steps"], r["eval"])
        v = s["val_loss"]
        d = dev.get(name)
        paper = PAPER_DEVIATION.get(name)
        lines.append(f"| {name} | {s['steps']} | {s['tokens']:,} | "
                     f"{'-' if not math.isfinite(v) else f'{v:.4f}'} | "
                     f"{'-' if d is None else f'{100 * d:+.2f}%'} | "
                     f"{'-' if paper is None else f'{100 * paper:+.2f}%'} |")
    return lines, dev


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("merge", help="one file from several fp4moe train result files")
    m.add_argument("out")
    m.add_argument("inputs", nargs="+")
    s = sub.add_parser("summary", help="the loss deviation of each run from the baseline's")
    s.add_argument("file")
    s.add_argument("--baseline", default="bf16")
    a = ap.parse_args(argv)
    if a.cmd == "merge":
        try:
            runs = merge_train_runs(a.out, a.inputs)
        except MergeError as e:
            print(f"loss_deviation.py merge: {e}", file=sys.stderr)
            return 2
        print(f"{a.out}: runs {', '.join(runs)}")
        return 0
    try:
        lines, dev = summary_lines(a.file, a.baseline)
    except (ValueError, OSError, result_file.SchemaError) as e:
        print(f"loss_deviation.py summary: {e}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    missing = [name for name, d in dev.items() if d is None]
    if missing:
        print(f"loss_deviation.py summary: no finite validation loss for {', '.join(missing)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
