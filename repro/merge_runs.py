#!/usr/bin/env python3
"""One table from training scenarios run at different times: merges the cells of the train scenarios in several run
files (repro/run.py's <out>/<date>-<gpu>.h5, e.g. seeds 1234-1237 one day and 1238-1241 the next) into one run file,
recomputes each scenario's rows over all the seeds (repro/ours.py), and writes its TABLES.md and plots.

    repro/merge_runs.py --out runs/merged.h5 RUN.h5 RUN.h5 [...] [--scenarios repro/scenarios] [--report-dir DIR]

What may merge: cells of one scenario whose command lines agree apart from --train.seed (same config file,
steps, recipe, policy, data, options). Anything else is refused with what differs, e.g. "loss_deviation small bf16: steps
1000 in a.h5 but 500 in b.h5"; so is one seed of one cell in two files (it would count twice), and a scenario
whose file is gone. Benchmark (non-train) scenarios are left out (said on the console). The merged file holds
/repro/<scenario> (rows over every seed), /bench/<family> (the cells of every input, with a `run_file` column
naming the input), /train/<run> and /memory/<run> of each run, the first input's root attributes plus
`merged_from` (the inputs), `command`, and `merged_git_shas` when the inputs come from different commits (allowed,
said on the console: the command lines agree, the code may not). Written under a temporary name and renamed
(repro/merge.py). TABLES.md and the plots go to --report-dir, by default runs/<stem of --out>/ in the repository
(reports/report.py's default_out_dir); both output paths are checked before anything is written.

Exit codes: 0 written; 1 nothing to merge; 2 bad arguments, an unreadable input, or inputs that do not agree.
"""

import argparse
import os
import re
import shlex
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

if __name__ == "__main__":
    from reports import interpreter

    interpreter.require("repro")

import pandas as pd  # noqa: E402

from reports import output_path, report, result_file  # noqa: E402
from repro import merge, ours, scenario, train_cells  # noqa: E402

SEED_OPTION = re.compile(r"(?:^| )--train\.seed [0-9]+")
AGREE = ("config", "steps", "args")  # the cells columns that must agree between inputs (args without the seed)
KEY = ("shape", "recipe", "case")


class MergeRunsError(Exception):
    """Inputs that cannot be merged (code 2: cells that disagree, the message says what differs) or nothing to merge
    (code 1)."""

    def __init__(self, message, code=2):
        super().__init__(message)
        self.code = code


def _complete(df):
    """The cells table with every TRAIN_COLUMNS column (those of older files filled: "" / -1 / NaN)."""
    out = df.copy()
    for c, kind in scenario.TRAIN_COLUMNS:
        if c not in out.columns:
            out[c] = "" if kind == "str" else (-1 if kind == "i64" else float("nan"))
    return out


def _agreeing(row):
    return {"config": row["config"], "steps": int(row["steps"]), "args": SEED_OPTION.sub("", str(row["args"]))}


def merge_cells(tables):
    """One cells table from [(input name, DataFrame)] of one scenario. Raises MergeRunsError when a cell
    (shape, recipe, case) has other AGREE columns in two inputs, or one seed of a cell appears twice."""
    seen, first, frames = {}, {}, []
    for name, df in tables:
        for _, r in df.iterrows():
            key = tuple(str(r[k]) for k in KEY)
            cell = " ".join(k for k in key if k != "config")
            agree = _agreeing(r)
            if key in first:
                other, theirs = first[key]
                for col in AGREE:
                    if agree[col] != theirs[col]:
                        raise MergeRunsError(f"{cell}: {col} {theirs[col]!r} in {other} but {agree[col]!r} in {name}")
            else:
                first[key] = (name, agree)
            seed = int(r["seed"]) if "seed" in df.columns else -1
            if (key, seed) in seen:
                which = f"seed {seed}" if seed >= 0 else "the config's own seed"
                raise MergeRunsError(f"{cell} with {which} is in both {seen[(key, seed)]} and {name}: it would count "
                                     f"twice")
            seen[(key, seed)] = name
        frames.append(_complete(df).assign(run_file=name))
    return pd.concat(frames, ignore_index=True)


def merge_runs(out_path, inputs, scenarios_dir, command=None):
    """Writes the merged run file (see the module docstring), its `command` attribute `command` (default: the
    merge of `inputs` into `out_path`); returns the scenario names merged. Raises
    MergeRunsError, OSError, result_file.SchemaError / TableError, scenario.ScenarioError, merge.MergeError."""
    if len(inputs) < 1:
        raise MergeRunsError("no run file to merge", 1)
    by_scenario, runs, root, shas, scales = {}, [], None, {}, {}
    for path in inputs:
        run = report.load_run(path)
        name = os.path.basename(path)
        root = root or run["attrs"]
        shas.setdefault(str(run["attrs"].get("git_sha", "")), []).append(name)
        for p, (_, a) in run["repro"].items():
            sname = p.split("/", 2)[2]
            if a.get("kind") != "train":
                print(f"merge: {name}: {sname} is a benchmark scenario, left out", file=sys.stderr)
                continue
            cells = run["bench"].get(f"/bench/{a.get('family', '')}")
            if cells is None:
                raise MergeRunsError(f"{name}: scenario {sname} has no cells table /bench/{a.get('family', '')}")
            by_scenario.setdefault(sname, []).append((name, cells[0]))
            scales.setdefault(sname, set()).add(str(a.get("scale", root.get("scale", ""))))
            runs += [(path, str(r)) for r in cells[0]["run"] if str(r) and (path, str(r)) not in runs]
    if not by_scenario:
        raise MergeRunsError("no training scenario in the run files", 1)
    repro_tables, tables = [], []
    for sname, parts in by_scenario.items():
        s = scenario.load(os.path.join(scenarios_dir, f"{sname}.toml"))
        cells = merge_cells(parts)
        columns = train_cells.table_columns(cells.to_dict("records")) + [("run_file", "str", list(cells["run_file"]))]
        tables.append((f"/bench/{s.family}", columns, {"scenario": sname, "kind": "train cells"}))
        seeds = sorted({int(x) for x in cells["seed"] if int(x) >= 0}) if "seed" in cells.columns else []
        repro_tables.append((sname, ours.repro_rows(s, cells),
                             {"title": s.title, "kind": "train", "family": s.family, "plot": s.plot,
                              "steps": int(cells["steps"].iloc[0]), "seeds": " ".join(map(str, seeds)),
                              "cells": len(cells), "cells_ok": int((cells["status"] == "ok").sum()),
                              "cells_oom": int((cells["status"] == "oom").sum()),
                              "cells_not_run": int((cells["status"] == "not run").sum()),
                              "cells_failed": int((cells["status"] == "failed").sum()),
                              "merged_from": " ".join(name for name, _ in parts),
                              "scale": " + ".join(sorted(x for x in scales[sname] if x)) or "?",
                              "scenario_file": os.path.relpath(s.path, ROOT)}))
    attrs = {k: v for k, v in root.items() if k != "command"}
    attrs.update({"command": command or shlex.join(["repro/merge_runs.py", "--out", out_path] + list(inputs)),
                  "merged_from": " ".join(os.path.basename(p) for p in inputs)})
    if len(shas) > 1:  # allowed (the cells' command lines agree), but said
        attrs["merged_git_shas"] = "; ".join(f"{sha or 'unknown'}: {', '.join(names)}" for sha, names in shas.items())
        print(f"merge: note: the inputs come from different commits ({attrs['merged_git_shas']})", file=sys.stderr)
    merge.merge_run(out_path, [], repro_tables, attrs, tables=tables,
                    train_runs=[(p, r, " ".join(by_scenario)) for p, r in runs])
    return list(by_scenario)


def main(argv=None):
    p = argparse.ArgumentParser(description="merge the training scenarios of several run files into one table")
    p.add_argument("--out", required=True, help="the merged run file to write (.h5)")
    p.add_argument("runs", nargs="+", help="run files of repro/run.py")
    p.add_argument("--scenarios", default=os.path.join(ROOT, "repro", "scenarios"), help="scenario folder")
    p.add_argument("--report-dir", help="where TABLES.md and the plots go (default: runs/<stem of --out>/ in the "
                                        "repository)")
    a = p.parse_args(argv)
    try:
        output_path.check_file(a.out, a.runs)  # both outputs before the merged file is written
        output_path.check_folder(a.report_dir or report.default_out_dir(a.out), a.runs + [a.out])
        command = shlex.join(["repro/merge_runs.py"] + (sys.argv[1:] if argv is None else list(argv)))
        names = merge_runs(a.out, a.runs, a.scenarios, command)
        md, pngs, _ = report.write_report(a.out, a.report_dir)
    except MergeRunsError as e:
        print(f"merge: cannot merge: {e}", file=sys.stderr)
        return e.code
    except (scenario.ScenarioError, merge.MergeError, result_file.SchemaError, result_file.TableError,
            output_path.OutputPathError, OSError) as e:
        print(f"merge: {result_file.one_line(e)}", file=sys.stderr)
        return 2
    print(f"merge: wrote {a.out} ({', '.join(names)}), {md} and {len(pngs)} plot(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
