#!/usr/bin/env python3
"""The reproduction suite behind `make repro-table`: runs each scenario's benchmark (or training cells) on this
machine's Hopper GPU and puts our numbers beside the papers'.

    repro/run.py [--build build] [--scale smoke|default|full] [--out runs] [--only NAME ...]
                 [--scenarios repro/scenarios] [--fp4moe PATH] [--peer-python PATH] [--data DIR]
                 [--parallel N] [--seeds S1,S2,...] [--steps N]

1. Asks `<build>/fp4moe env` for the GPU. Without a CUDA device, or with one that is not a Hopper (sm_90), it says
   so in one line with what to run instead and exits 1.
2. Runs the benchmark of each scenario (repro/scenarios/*.toml, format in repro/scenario.py) with the scenario's
   --benchmark_filter for the scale and --h5, printing "[i/n] name: ..." progress lines with the elapsed time
   (the program's own output goes to the log). A scenario with a peer (a PyTorch program in benchmarks/peers/)
   then runs it with --h5 of the same file and the same filter (--filter); its table joins the benchmark's for the
   scenario's rules. A peer that exits 3 (PyTorch, CUDA or its operators missing) is skipped with a note, not a
   failure; the rows that needed it say why they have no value. Scales: smoke (a few cases, minutes), default (every case the
   benchmark has), full ("everything the scenario has": the same as default until a scenario defines more).
   A train-kind scenario (kind = "train") instead runs `fp4moe train` once per cell of its grid (seed x config x
   recipe x recompute policy at this scale, repro/train_cells.py; --seeds and --steps override the scenario's seeds
   and steps; --parallel N runs N cells at a time on the GPU, each its own process, log and result file, a failure
   in one reported for its cell alone, a progress line as each finishes), each into
   <out>/<date>-<gpu>/train/<run>.h5 with its
   log in logs/train-<run>.log, and reads the runs back into its cells table (/bench/<family>). A cell over its
   memory budget is an "OOM" result with the category that did not fit, and one the trainer refuses (a recipe or
   policy not built yet, no token shards: `make data`) is "not run" with the trainer's reason; neither fails the
   suite. Runs with the same command line are shared between scenarios (e.g. memory and throughput).
   A plan-kind scenario (kind = "plan") runs `fp4moe plan` once per plan at this scale (repro/plan_runs.py), its
   Markdown into <out>/<date>-<gpu>/plan/<name>.md, and reads each plan's candidates back into its plans table
   (/bench/<family>); the measured plans share the stage-time cache plan/stage_times.tsv of the run folder.
3. Merges every benchmark's table, the cells tables, the training runs (/train/<run>, /memory/<run>) and the
   reproduced tables into one file, <out>/<date>-<gpu>.h5 (repro/merge.py; written under a temporary name and
   renamed), e.g. runs/20261129-120000-nvidia-h200.h5.
4. Writes <out>/<date>-<gpu>/TABLES.md and the PNG plots (reports/report.py, the code `make report` runs), beside
   logs/<benchmark>.log and bench/<benchmark>.h5 (each program's own output and result file).

Exit codes: 0 every scenario ran; 1 no suitable GPU, or a benchmark or training cell failed (the run file still holds
what the others measured); 2 bad arguments, a bad scenario file, or no fp4moe binary in the build folder.
"""

import argparse
import concurrent.futures
import datetime
import os
import re
import shlex
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

if __name__ == "__main__":
    from reports import interpreter

    interpreter.require("repro")

import h5py  # noqa: E402

from reports import output_path, report, result_file  # noqa: E402
from repro import merge, ours, plan_runs, process, scenario, train_cells  # noqa: E402
from repro.process import fmt_elapsed  # noqa: E402

GPU_LINE = re.compile(r"^GPU (\d+):\s+(.+?) \(sm_(\d+)\)")
NO_GPU = re.compile(r"no CUDA device(?: \((.*)\))?")
PEER_UNAVAILABLE = 3  # a peer's exit code when this machine lacks what it needs (e.g. PyTorch): skipped, not failed


class RunError(Exception):
    """Stops the run with a one-line message and an exit code."""

    def __init__(self, message, code):
        super().__init__(message)
        self.code = code


def detect_gpu(fp4moe):
    """(GPU name, count) of this machine from `fp4moe env`. Raises RunError: code 2 when the binary is missing or
    fails, code 1 without a CUDA device or with a GPU that is not a Hopper."""
    if not os.access(fp4moe, os.X_OK):
        raise RunError(f"{fp4moe} not found: build first (`make build`, or `make repro-table`, which builds)", 2)
    try:
        r = subprocess.run([fp4moe, "env"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RunError(f"cannot run `{fp4moe} env`: {e}", 2) from None
    if r.returncode != 0:
        raise RunError(f"`{fp4moe} env` failed (exit {r.returncode}): {(r.stderr or r.stdout).strip()[:300]}", 2)
    gpus = [m for m in map(GPU_LINE.match, r.stdout.splitlines()) if m]
    if not gpus:
        m = NO_GPU.search(r.stdout)
        why = m.group(0) if m else "no CUDA device reported by `fp4moe env`"
        raise RunError(f"{why}: the reproduction suite needs a Hopper GPU (H100/H200); on this machine run "
                       f"`make test` instead (CPU tests; GPU tests are reported as skipped)", 1)
    name, sm = gpus[0].group(2), gpus[0].group(3)
    if not sm.startswith("9"):
        raise RunError(f"GPU 0 is {name} (sm_{sm}): the kernels are built for sm_90a, the suite needs a Hopper GPU "
                       f"(H100/H200); on this machine run `make test` instead", 1)
    return name, len(gpus)


def run_stem(gpu_name, gpu_count, now):
    """"20261129-120000-nvidia-h200" (with "-x8" for eight identical GPUs)."""
    slug = re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-") or "gpu"
    if gpu_count > 1:
        slug += f"-x{gpu_count}"
    return f"{now:%Y%m%d-%H%M%S}-{slug}"


def run_benchmark(prog, args, log_path, label, budget_min):
    """Runs prog with args, its output to log_path; prints a progress line every process.HEARTBEAT_S seconds (cases
    done, elapsed) and once if the budget is passed. Returns (exit code, elapsed seconds)."""
    return process.run_logged([prog] + args, log_path, label, budget_min,
                              process.CountLines(r"^[^-].*/manual_time", "cases"))


def read_bench_table(path, family):
    """The /bench/<family> table of a benchmark's result file, or None when absent or unreadable."""
    if not os.path.exists(path):
        return None
    try:
        with h5py.File(path, "r") as f:
            result_file.check_schema(path, f)
            g = f.get(f"bench/{family}")
            return None if g is None else result_file.read_table(g)
    except (OSError, result_file.SchemaError, result_file.TableError) as e:
        print(f"repro: cannot read {path}: {result_file.one_line(e)}", file=sys.stderr)
        return None


def last_line(path):
    """The last non-empty line of a log file ("" when there is none)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = [line.strip() for line in f if line.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


def run_peer(a, s, h5, flt, run_dir, label, budget):
    """Runs the scenario's peer after its benchmark, adding /bench/<peer_family> to the benchmark's file h5.
    Returns (exit code, elapsed seconds, why it did not run or "")."""
    name = os.path.splitext(os.path.basename(s.peer))[0]
    log = os.path.join(run_dir, "logs", f"{name}.log")
    args = [os.path.join(ROOT, s.peer), "--h5", h5] + (["--filter", flt] if flt else [])
    rc, took = run_benchmark(a.peer_python, args, log, label, budget)
    if rc == 0:
        print(f"{label}: peer {name} done in {fmt_elapsed(took)}", flush=True)
        return rc, took, ""
    why = last_line(log) or f"exit code {rc}"
    if rc == PEER_UNAVAILABLE:
        print(f"{label}: peer {name} skipped: {why}", flush=True)
    else:
        print(f"{label}: peer {name} exited with {rc} (log: {log})", flush=True)
    return rc, took, why


def _int_list(text):
    """"1234,1235" -> [1234, 1235]; a word that is not an integer is kept as text (check_seeds names it)."""
    words = [w.strip() for w in text.split(",")]
    return [int(w) if re.fullmatch(r"-?[0-9]+", w) else w for w in words]


def main(argv=None):
    p = argparse.ArgumentParser(description="run the reproduction scenarios on this Hopper GPU")
    p.add_argument("--build", default="build", help="build folder holding fp4moe and benchmarks/ (default: build)")
    p.add_argument("--scale", choices=scenario.SCALES, default="default",
                   help="smoke: a few cases; default: every case; full: everything the scenarios have (= default now)")
    p.add_argument("--out", default="runs", help="folder of run files (default: runs)")
    p.add_argument("--only", nargs="+", metavar="NAME", help="run only these scenarios (file stems)")
    p.add_argument("--scenarios", default=os.path.join(ROOT, "repro", "scenarios"), help="scenario folder")
    p.add_argument("--fp4moe", help="the fp4moe binary asked for the GPU (default: BUILD/fp4moe)")
    p.add_argument("--peer-python", default=sys.executable,
                   help="the Python that runs the PyTorch peers (default: this one)")
    p.add_argument("--data", help="token shards for the training cells that read the corpus (default: each "
                                  "config's train.data_dir, relative to the repository root; `make data` makes them)")
    p.add_argument("--parallel", type=int, default=1, metavar="N",
                   help="training cells run N at a time on the GPU, each its own process and output (default: 1; "
                        "small models leave an H200 mostly idle)")
    p.add_argument("--seeds", metavar="S1,S2,...",
                   help="train scenarios: these --train.seed values instead of the scenario's [seeds] at this scale")
    p.add_argument("--configs", nargs="+", metavar="NAME",
                   help="train scenarios: only the cells of these configurations (names of a scenario's [configs], "
                        "e.g. small); the others are left out of the run, not reported as failed")
    p.add_argument("--steps", type=int, metavar="N",
                   help="train scenarios: N steps per run instead of the scenario's [steps] at this scale")
    a = p.parse_args(argv)
    try:
        a.seeds = None if a.seeds is None else scenario.check_seeds(_int_list(a.seeds), "--seeds")
    except ValueError as e:
        p.error(str(e))
    if a.steps is not None and a.steps < 1:
        p.error(f"--steps must be >= 1, got {a.steps}")
    if a.parallel < 1:
        p.error(f"--parallel must be >= 1, got {a.parallel}")
    command = shlex.join(["repro/run.py"] + (sys.argv[1:] if argv is None else list(argv)))
    try:
        return run(a, command)
    except RunError as e:
        print(f"repro: {e}", file=sys.stderr)
        return e.code
    except scenario.ScenarioError as e:
        print(f"repro: scenario {e}", file=sys.stderr)
        return 2
    except (merge.MergeError, result_file.SchemaError, result_file.TableError, output_path.OutputPathError,
            OSError) as e:
        print(f"repro: cannot write the run file: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("repro: interrupted; no run file written", file=sys.stderr)
        return 130


def run_bench_scenario(a, s, run_dir, label, bench_files, failed):
    """Runs one benchmark scenario (and its peer); returns (its table or None, /repro attributes, peer note)."""
    prog = os.path.join(a.build, "benchmarks", s.benchmark)
    h5 = os.path.join(run_dir, "bench", f"{s.benchmark}.h5")
    log = os.path.join(run_dir, "logs", f"{s.benchmark}.log")
    flt = s.filter[a.scale]
    args = ["--h5", h5] + ([f"--benchmark_filter={flt}"] if flt else [])
    budget = s.budget_gpu_minutes[a.scale]
    print(f"{label}: {s.benchmark}{' (filter ' + flt + ')' if flt else ' (every case)'}, budget {budget:g} "
          f"GPU-minutes; {fmt_elapsed(time.monotonic() - a.t0)} elapsed in all", flush=True)
    if os.path.exists(h5):
        os.remove(h5)
    if not os.access(prog, os.X_OK):
        print(f"{label}: {prog} is not built", flush=True)
        rc, took = 127, 0.0
    else:
        rc, took = run_benchmark(prog, args, log, label, budget)
    df = read_bench_table(h5, s.family)
    rows = len(df) if df is not None else 0
    if rc != 0 or df is None:
        failed.append(s.name)
    print(f"{label}: {'done' if rc == 0 else f'{s.benchmark} exited with {rc} (log: {log})'} in "
          f"{fmt_elapsed(took)}, /bench/{s.family} {rows} rows", flush=True)
    attrs = {"title": s.title, "benchmark": s.benchmark, "family": s.family, "scale": a.scale, "filter": flt,
             "budget_gpu_minutes": float(budget), "elapsed_s": float(took), "exit_code": int(rc),
             "scenario_file": os.path.relpath(s.path, ROOT)}
    table, peer_why = df, ""
    if s.peer:
        prc, ptook, peer_why = run_peer(a, s, h5, flt, run_dir, label, budget)
        if prc not in (0, PEER_UNAVAILABLE):
            failed.append(f"{s.name} (peer)")
        peer_df = read_bench_table(h5, s.peer_family)
        if peer_df is not None:
            import pandas as pd
            table = peer_df if df is None else pd.concat([df, peer_df], ignore_index=True)
        attrs.update({"peer": s.peer, "peer_family": s.peer_family, "peer_exit_code": int(prc),
                      "peer_elapsed_s": float(ptook), "peer_note": peer_why})
    if table is not None and h5 not in bench_files:
        bench_files.append(h5)
    return table, attrs, peer_why


def run_cells(cells, run_one, parallel, report):
    """Runs run_one(i, cell) -> outcome for every cell, `parallel` at a time (separate processes started from
    threads; 1: one after the other, in order), and calls report(i, cell, outcome) as each finishes (in the calling
    thread, in the order they finish). An exception in run_one propagates after the running ones end. Returns the
    outcomes in cell order."""
    outcomes = [None] * len(cells)
    if parallel <= 1:
        for i, cell in enumerate(cells):
            outcomes[i] = run_one(i, cell)
            report(i, cell, outcomes[i])
        return outcomes
    with concurrent.futures.ThreadPoolExecutor(max_workers=parallel) as pool:
        futures = {pool.submit(run_one, i, cell): i for i, cell in enumerate(cells)}
        for f in concurrent.futures.as_completed(futures):
            i = futures[f]
            outcomes[i] = f.result()
            report(i, cells[i], outcomes[i])
    return outcomes


def run_train_scenario(a, s, run_dir, label, shared, train_files, failed):
    """Runs the training cells of one train scenario (a.parallel at a time; sharing identical runs through
    `shared`: cache key -> Outcome); adds the result files of its runs to train_files ({path: (run, [scenarios])}).
    a.seeds and a.steps (None: the scenario's) override its seeds and steps at a.scale. Returns (cells table rows,
    /repro attributes)."""
    spec = s.train
    steps = a.steps or spec.steps[a.scale]
    cells = train_cells.expand(s, a.scale, a.seeds)
    if a.configs:
        cells = [c for c in cells if c.config in a.configs]
    budget = s.budget_gpu_minutes[a.scale]
    seeds = sorted({c.seed for c in cells if c.seed is not None})
    print(f"{label}: {len(cells)} training cell(s) of {steps} steps"
          f"{f', seeds {seeds[0]}..{seeds[-1]} ({len(seeds)})' if seeds else ''}, {a.parallel} at a time, budget "
          f"{budget:g} GPU-minutes; {fmt_elapsed(time.monotonic() - a.t0)} elapsed in all", flush=True)
    start = time.monotonic()
    data_dir = os.path.abspath(a.data) if a.data else None
    keys = [train_cells.cache_key(cell, spec, steps, data_dir) for cell in cells]
    todo = [i for i, k in enumerate(keys) if k not in shared and keys.index(k) == i]  # first of each new run
    done, warned = [0], [False]

    def cell_label(i):
        return f"{label}: cell {i + 1}/{len(cells)} {cells[i].id}"

    def run_one(j, cell):
        i = todo[j]
        return train_cells.run_cell(a.fp4moe_path, cell, spec, steps, run_dir, train_cells.run_name(cell),
                                    cell_label(i), budget, ROOT, data_dir)

    def report(j, cell, outcome):
        i = todo[j]
        shared[keys[i]] = outcome
        done[0] += 1
        print(f"{cell_label(i)}: {outcome.status} in {fmt_elapsed(outcome.elapsed_s)}"
              f"{'' if outcome.status == 'ok' else ': ' + outcome.note} ({done[0]}/{len(todo)} runs done, "
              f"{fmt_elapsed(time.monotonic() - start)} elapsed)", flush=True)
        if not warned[0] and time.monotonic() - start > 60 * budget:
            print(f"{label}: past its budget of {budget:g} GPU-minutes, still running", flush=True)
            warned[0] = True

    run_cells([cells[i] for i in todo], run_one, a.parallel, report)
    rows = []
    for i, cell in enumerate(cells):
        outcome = shared[keys[i]]
        if i not in todo:
            print(f"{cell_label(i)}: {outcome.status}, the run {outcome.run} (shared)", flush=True)
        if outcome.status == "failed" and s.name not in failed:
            failed.append(s.name)
        if outcome.out_path:
            names = train_files.setdefault(outcome.out_path, (outcome.run, []))[1]
            if s.name not in names:
                names.append(s.name)
        rows.append(train_cells.table_row(cell, outcome, spec, steps, data_dir))
    train_cells.flag_same_policy_peaks(rows)
    took = time.monotonic() - start
    counts = {st: sum(r["status"] == st for r in rows) for st in ("ok", "oom", "not run", "failed")}
    print(f"{label}: done in {fmt_elapsed(took)}: " + ", ".join(f"{n} {st}" for st, n in counts.items() if n),
          flush=True)
    attrs = {"title": s.title, "kind": "train", "family": s.family, "plot": s.plot, "scale": a.scale,
             "steps": int(steps), "seeds": " ".join(str(x) for x in seeds), "parallel": int(a.parallel),
             "cells": len(rows), "cells_ok": counts["ok"], "cells_oom": counts["oom"],
             "cells_not_run": counts["not run"], "cells_failed": counts["failed"],
             "memory_budget_gib": float(spec.memory_budget_gib), "data": spec.data,
             "budget_gpu_minutes": float(budget), "elapsed_s": float(took),
             "exit_code": int(1 if counts["failed"] else 0), "scenario_file": os.path.relpath(s.path, ROOT),
             "configs": " ".join(a.configs) if a.configs else "all"}
    return rows, attrs


def run_plan_scenario(a, s, run_dir, label, failed):
    """Runs the plans of one plan scenario; returns (plans table rows, /repro attributes)."""
    budget = s.budget_gpu_minutes[a.scale]
    plans = plan_runs.expand(s, a.scale)
    print(f"{label}: {len(plans)} plan(s), budget {budget:g} GPU-minutes; "
          f"{fmt_elapsed(time.monotonic() - a.t0)} elapsed in all", flush=True)
    rows, outcome = plan_runs.run_plans(a.fp4moe_path, s, a.scale, run_dir, ROOT, label)
    if outcome["failed"]:
        failed.append(s.name)
    attrs = {"title": s.title, "kind": "plan", "family": s.family, "scale": a.scale,
             "plans": " ".join(p.name for p in plans), "budget_gpu_minutes": float(budget),
             "elapsed_s": float(outcome["elapsed_s"]), "exit_code": int(1 if outcome["failed"] else 0),
             "scenario_file": os.path.relpath(s.path, ROOT)}
    return rows, attrs


def run(a, command):
    scenarios = scenario.load_all(a.scenarios, a.only)
    if a.configs:
        known = sorted({c for s in scenarios if s.kind == "train" for c in s.train.configs})
        unknown = [c for c in a.configs if c not in known]
        if unknown:
            raise RunError(f"--configs {' '.join(unknown)}: not a configuration of the training scenarios run "
                           f"(they have: {', '.join(known) or 'none'})", 2)
    a.fp4moe_path = os.path.abspath(a.fp4moe or os.path.join(a.build, "fp4moe"))
    gpu, count = detect_gpu(a.fp4moe_path)
    now = datetime.datetime.now()
    stem = run_stem(gpu, count, now)
    run_dir = os.path.join(a.out, stem)
    for sub in ("logs", "bench"):
        os.makedirs(os.path.join(run_dir, sub), exist_ok=True)
    n = len(scenarios)
    total_budget = sum(s.budget_gpu_minutes[a.scale] for s in scenarios)
    print(f"repro: {n} scenario(s) on {gpu}{f' x{count}' if count > 1 else ''}, scale {a.scale}, "
          f"budget {total_budget:g} GPU-minutes; output {run_dir}.h5 and {run_dir}/", flush=True)

    a.t0 = time.monotonic()
    bench_files, repro_tables, cell_tables, failed = [], [], [], []
    train_files, shared = {}, {}
    for i, s in enumerate(scenarios, 1):
        label = f"[{i}/{n}] {s.name}"
        if s.kind == "plan":
            rows, attrs = run_plan_scenario(a, s, run_dir, label, failed)
            cell_tables.append((f"/bench/{s.family}", plan_runs.table_columns(rows),
                                {"scenario": s.name, "kind": "plan candidates", "scale": a.scale}))
            repro_tables.append((s.name, ours.repro_rows(s, plan_runs.table_frame(rows)), attrs))
            continue
        if s.kind == "train":
            rows, attrs = run_train_scenario(a, s, run_dir, label, shared, train_files, failed)
            cell_tables.append((f"/bench/{s.family}", train_cells.table_columns(rows),
                                {"scenario": s.name, "kind": "train cells", "scale": a.scale}))
            repro_tables.append((s.name, ours.repro_rows(s, train_cells.table_frame(rows)), attrs))
            continue
        table, attrs, peer_why = run_bench_scenario(a, s, run_dir, label, bench_files, failed)
        computed = ours.repro_rows(s, table)
        if peer_why:
            for r in computed:
                if r["count"] == 0:
                    r["note"] = "; ".join(x for x in [r["note"], f"the peer did not run: {peer_why}"] if x)
        repro_tables.append((s.name, computed, attrs))

    if not bench_files and not cell_tables:
        raise RunError(f"no benchmark wrote a result file ({', '.join(failed)} failed; logs in {run_dir}/logs)", 1)
    run_path = f"{run_dir}.h5"
    root = {"command": command, "scale": a.scale}
    if not bench_files and not train_files:  # only refused or failed cells: the file still says why
        root.update({"gpu": gpu, "date": now.astimezone().isoformat(timespec="seconds")})
    merge.merge_run(run_path, bench_files, repro_tables, root, tables=cell_tables,
                    train_runs=[(p, r, " ".join(dict.fromkeys(names))) for p, (r, names) in train_files.items()])
    md, pngs, _ = report.write_report(run_path, run_dir)
    print(f"repro: wrote {run_path}, {md} and {len(pngs)} plot(s) in {fmt_elapsed(time.monotonic() - a.t0)}",
          flush=True)
    if failed:
        print(f"repro: failed: {', '.join(failed)} (see {run_dir}/logs)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
