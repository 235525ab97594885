"""The cells of a train-kind scenario (repro/scenario.py): one `fp4moe train` run per config x recipe x policy,
its command line, its failure read from the log, its results read back, and the row of the cells table
(scenario.TRAIN_COLUMNS) that the scenario's rules compute from.

A cell runs
    <fp4moe> train --config configs/<c>.toml --out <run dir>/train/<run>.h5 --run <run> --train.steps N
        --log-interval K [--synthetic-data] [--data DIR] [--memory-budget GiB] <[train] args> <recipe options>
        <cell args> [--recompute.modules m1 m2 ... | none]
from the repository root (relative config and data paths), its output in <run dir>/logs/train-<run>.log.
--recompute.modules comes last: CLI11 takes its values up to the next option (trainer/config.cpp; "none" is the
empty list); the policy named "config" leaves the config file's modules.

Outcomes (status column):
    ok        the run finished and wrote /train/<run> and /memory/<run>
    oom       the allocator refused an allocation over --memory-budget ("out of the memory budget: <what> needs X
              GiB of <category> but Y of Z GiB are held", trainer/memory/device_memory.cpp), or the device itself
              ran out (cudaMalloc); with [train] retry_without_budget the cell runs again without the budget, and its
              peaks, throughput and losses come from that run (the note says so)
    not run   the trainer refused the cell before training: exit 2 (a configuration it rejects, no token shards, no
              device), or exit 1 with a message that the recipe or policy is not built, supported or implemented
              yet; the note quotes the trainer's line
    failed    anything else (a crash, a non-finite stop, a missing result file): the suite reports the scenario as
              failed
Runs with identical command lines (apart from --out and --run) are run once per suite and shared (cache_key).
"""

import math
import os
import re
import shlex
from dataclasses import dataclass, field

import h5py
import numpy as np

from reports import result_file, train_report
from repro import ladder_metric, process
from repro.scenario import TRAIN_COLUMNS

GIB_80, GIB_141 = 80.0, 141.0  # the H100/H800 card the paper ran on, and the H200's nominal capacity

OOM_BUDGET = re.compile(r"out of the memory budget: (?P<what>.+?) needs (?P<request>[0-9.]+) GiB of "
                        r"(?P<category>[a-z]+) but (?P<held>[0-9.]+) of (?P<budget>[0-9.]+) GiB are held")
OOM_DEVICE = re.compile(r"cudaMalloc failed \((?P<why>[^)]*)\) for (?P<what>.+?): (?P<request>[0-9.]+) GiB of "
                        r"(?P<category>[a-z]+) with (?P<held>[0-9.]+) GiB held")
OOM_UNTRACKED = re.compile(r"cudaErrorMemoryAllocation|\(out of memory\)")
NOT_SUPPORTED = re.compile(r"not (?:built|supported|implemented)|not yet", re.IGNORECASE)
ERROR_LINE = re.compile(r"^fp4moe train: (?:error|failed): (.*)$")
MAX_REASON = 240


@dataclass
class Cell:
    scenario: str
    config: str          # the config's name in the scenario
    config_path: str     # relative to the repository root
    label: str           # the cells table's `shape`
    recipe: str
    policy: str          # "config": the config's own recompute modules
    options: list        # recipe options, then the group's args
    modules: list = None  # recompute modules; None for the policy "config"
    note: str = ""
    seed: int = None      # --train.seed; None: the config's own

    @property
    def id(self):
        return f"{self.label} {self.recipe} {self.policy}" + ("" if self.seed is None else f" seed {self.seed}")


@dataclass
class Outcome:
    status: str                  # ok | oom | not run | failed
    exit_code: int
    elapsed_s: float
    run: str
    out_path: str = ""           # the result file that holds /train/<run> ("" when none was written)
    note: str = ""
    budget_gib: float = math.nan
    oom: dict = field(default_factory=dict)      # category, request_gib, held_gib
    metrics: dict = field(default_factory=dict)  # TRAIN_COLUMNS measured from the result file


def expand(s, scale, seeds=None):
    """The cells of scenario s at `scale`, seed by seed (the scenario's [seeds] at that scale, or `seeds` when
    given), then in file order (groups, configs, recipes, policies): each seed's comparison completes before the
    next seed starts."""
    spec, cells = s.train, []
    for seed in (seeds if seeds is not None else spec.seeds[scale]):
        for g in spec.cells:
            if scale not in g.scales:
                continue
            for c in g.configs:
                for r in g.recipes:
                    for p in g.policies:
                        cells.append(Cell(scenario=s.name, config=c, config_path=spec.configs[c],
                                          label=g.label or c, recipe=r, policy=p,
                                          options=list(spec.recipes[r]) + list(g.args),
                                          modules=None if p == "config" else list(spec.policies[p]), note=g.note,
                                          seed=seed))
    return cells


def cell_args(cell, spec, steps, data_dir=None, budget_gib=None):
    """The arguments after `fp4moe train`, without --out and --run. budget_gib: None for the scenario's budget, 0
    for none."""
    budget = spec.memory_budget_gib if budget_gib is None else budget_gib
    args = ["--config", cell.config_path, "--train.steps", str(steps), "--log-interval", str(max(1, steps // 10))]
    if cell.seed is not None:
        args += ["--train.seed", str(cell.seed)]
    if spec.data == "synthetic":
        args.append("--synthetic-data")
    elif data_dir:
        args += ["--data", data_dir]
    if budget:
        args += ["--memory-budget", f"{budget:g}"]
    args += list(spec.args) + list(cell.options)
    if cell.modules is not None:
        args += ["--recompute.modules"] + (cell.modules or ["none"])
    return args


def cache_key(cell, spec, steps, data_dir=None):
    """What makes two cells the same run: their arguments and retry rule (not their scenario or name)."""
    return tuple(cell_args(cell, spec, steps, data_dir)) + (("retry",) if spec.retry_without_budget else ())


def run_name(cell):
    """The run's group name under /train and /memory: "<scenario>-<label>-<recipe>-<policy>[-s<seed>]"."""
    seed = "" if cell.seed is None else f"-s{cell.seed}"
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{cell.scenario}-{cell.label}-{cell.recipe}-{cell.policy}{seed}")


def _short(text):
    text = " ".join(str(text).split())
    return text if len(text) <= MAX_REASON else text[:MAX_REASON - 3] + "..."


def error_reason(log_text):
    """The trainer's own error line ("fp4moe train: error|failed: <reason>"), else the last non-empty line."""
    lines = [line.strip() for line in log_text.splitlines() if line.strip()]
    for line in reversed(lines):
        m = ERROR_LINE.match(line)
        if m:
            return m.group(1)
    return lines[-1] if lines else ""


def classify_failure(rc, log_text):
    """(status, reason, oom) of a run that exited with rc != 0: status oom, not run or failed (see the module
    docstring); oom: {"category", "request_gib", "held_gib", "budget_gib"} for an out-of-memory failure."""
    m = OOM_BUDGET.search(log_text)
    if m:
        return "oom", _short(m.group(0)), {"category": m.group("category"), "request_gib": float(m.group("request")),
                                           "held_gib": float(m.group("held")), "budget_gib": float(m.group("budget")),
                                           "what": m.group("what")}
    m = OOM_DEVICE.search(log_text)
    if m:
        return "oom", _short(m.group(0)), {"category": m.group("category"), "request_gib": float(m.group("request")),
                                           "held_gib": float(m.group("held")), "budget_gib": math.nan,
                                           "what": m.group("what")}
    reason = error_reason(log_text)
    if OOM_UNTRACKED.search(log_text):
        return "oom", _short(reason), {"category": "untracked", "request_gib": math.nan, "held_gib": math.nan,
                                       "budget_gib": math.nan, "what": ""}
    if rc == 2 or (rc == 1 and NOT_SUPPORTED.search(reason)):
        return "not run", _short(reason), {}
    return "failed", _short(reason or f"exit code {rc}"), {}


def _settled(values):
    """Values after the warm-up steps: the first max(1, n // 10) dropped when there are at least 2."""
    v = np.asarray(values, dtype=float)
    if v.size >= 2:
        v = v[max(1, v.size // 10):]
    v = v[np.isfinite(v)]
    return v


def read_run(path, run):
    """The measured TRAIN_COLUMNS of /train/<run> and /memory/<run> in a result file of `fp4moe train`:
    peaks per category (GiB, from /memory, else the step table's), median tokens/s, MFU and step time over the
    steps after the first (max(1, n // 10) warm-up steps dropped), tokens, final train and validation loss
    (reports/train_report.py summarize), every evaluation as eval_curve (ladder_metric.format_curve), the dispatch payload per routed token (the dispatch_* attributes of
    /memory/<run>; NaN when absent). Raises OSError, KeyError (no such run), result_file.SchemaError or
    result_file.TableError."""
    result_file.check_readable(path)
    with h5py.File(path, "r") as f:
        result_file.check_schema(path, f)
        g = f[f"train/{run}"]
        steps = result_file.read_table(g["steps"])
        evals = result_file.read_table(g["eval"]) if "eval" in g else None
        attrs = {k: result_file.text(v) for k, v in g.attrs.items()}
        mem, mem_attrs = None, {}
        if f"memory/{run}" in f:
            mem = result_file.read_table(f[f"memory/{run}"])
            mem_attrs = result_file.table_attributes(f, f"memory/{run}")
    s = train_report.summarize(steps, evals)
    out = {"tokens": s["tokens"], "train_loss": s["train_loss"], "val_loss": s["val_loss"],
           "val_tokens": float(s["val_tokens"]) if s["val_tokens"] >= 0 else math.nan,
           "eval_curve": ladder_metric.format_curve(evals["tokens"], evals["val_loss"]) if evals is not None else ""}
    peaks = {}
    if mem is not None:
        peaks = {str(c): float(v) for c, v in zip(mem["category"], mem["peak_gib"])}
    out["peak_total_gib"] = peaks.get("total", s["peak_total_gib"])
    out["peak_act_gib"] = peaks.get("activations", s["peak_act_gib"])
    for c in ("weights", "grads", "optimizer", "comm", "workspace"):
        out[f"{c}_gib"] = peaks.get(c, math.nan)
    tps = _settled(steps["tokens_per_s"]) if "tokens_per_s" in steps.columns else np.array([])
    mfu = _settled(steps["mfu"]) if "mfu" in steps.columns else np.array([])
    out["tokens_per_s"] = float(np.median(tps)) if tps.size else math.nan
    out["mfu"] = float(np.median(mfu)) if mfu.size else math.nan
    per_step = attrs.get("train.tokens_per_step")
    out["step_time_s"] = (float(per_step) / out["tokens_per_s"]
                          if result_file.is_number(per_step) and out["tokens_per_s"] > 0 else math.nan)
    out["dispatch_hidden"] = int(mem_attrs["dispatch_hidden"]) if "dispatch_hidden" in mem_attrs else -1
    for col, key in (("dispatch_payload_bytes", "dispatch_payload_bytes_per_token"),
                     ("dispatch_scale_bytes", "dispatch_scale_bytes_per_token"),
                     ("dispatch_bytes", "dispatch_bytes_per_token")):
        out[col] = float(mem_attrs[key]) if result_file.is_number(mem_attrs.get(key)) else math.nan
    return out


def _read_log(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _attempt(fp4moe, args, out, run, log, label, budget_min, root):
    if os.path.exists(out):
        os.remove(out)
    argv = [fp4moe, "train"] + args + ["--out", out, "--run", run]
    rc, took = process.run_logged(argv, log, label, budget_min, process.TrainSteps(), cwd=root)
    return rc, took, _read_log(log)


def run_cell(fp4moe, cell, spec, steps, run_dir, run, label, budget_min, root, data_dir=None):
    """Runs one cell (and, after an OOM at the budget with retry_without_budget, once more without the budget);
    returns its Outcome. Result files go to <run_dir>/train/<run>.h5, logs to <run_dir>/logs/train-<run>[-
    no-budget].log. Paths handed to the trainer are absolute; it runs in `root` (the repository root)."""
    out = os.path.abspath(os.path.join(run_dir, "train", f"{run}.h5"))
    log = os.path.abspath(os.path.join(run_dir, "logs", f"train-{run}.log"))
    os.makedirs(os.path.dirname(out), exist_ok=True)
    os.makedirs(os.path.dirname(log), exist_ok=True)
    budget = spec.memory_budget_gib or math.nan
    rc, took, text = _attempt(fp4moe, cell_args(cell, spec, steps, data_dir), out, run, log, label, budget_min, root)
    notes = []
    oom = {}
    status = "ok"
    if rc != 0:
        status, reason, oom = classify_failure(rc, text)
        if status == "oom":
            where = f"{oom['budget_gib']:g} GiB" if math.isfinite(oom["budget_gib"]) else "device memory"
            asked = (f" ({oom['what']} asked {oom['request_gib']:.2f} GiB with {oom['held_gib']:.2f} GiB held)"
                     if math.isfinite(oom["request_gib"]) else f" ({reason})")
            notes.append(f"OOM at {where}: {oom['category']} did not fit{asked}")
            if spec.retry_without_budget and spec.memory_budget_gib and math.isfinite(oom["budget_gib"]):
                retry_log = log[:-len(".log")] + "-no-budget.log"
                rc2, took2, text2 = _attempt(fp4moe, cell_args(cell, spec, steps, data_dir, budget_gib=0), out, run,
                                             retry_log, label + " (no budget)", budget_min, root)
                took += took2
                if rc2 == 0:
                    notes.append("peaks, throughput and losses measured without the budget")
                else:
                    status2, reason2, _ = classify_failure(rc2, text2)
                    notes.append(f"without the budget: {status2}: {reason2}")
                    if status2 == "failed":
                        status = "failed"
                rc = rc2 if rc2 != 0 else rc
        elif status == "not run":
            notes.append(f"not run: {reason}")
        else:
            notes.append(f"failed (exit {rc}): {reason}; log {os.path.relpath(log, root)}")
    metrics = {}
    if os.path.exists(out):
        try:
            metrics = read_run(out, run)
        except (OSError, KeyError, ValueError, result_file.SchemaError, result_file.TableError) as e:
            status = "failed"
            notes.append(f"cannot read {os.path.basename(out)}: {result_file.one_line(e)}")
    elif status == "ok":
        status = "failed"
        notes.append(f"exit 0 but no result file {os.path.basename(out)}")
    return Outcome(status=status, exit_code=rc, elapsed_s=took, run=run, out_path=out if metrics else "",
                   note="; ".join(notes), budget_gib=budget, oom=oom, metrics=metrics)


def table_row(cell, outcome, spec, steps, data_dir=None):
    """The cells-table row (a dict over TRAIN_COLUMNS) of a cell and the outcome of its (possibly shared) run."""
    row = {c: ("" if kind == "str" else (-1 if kind == "i64" else math.nan)) for c, kind in TRAIN_COLUMNS}
    m = outcome.metrics
    row.update({c: m[c] for c, _ in TRAIN_COLUMNS if c in m})
    peak = row["peak_total_gib"]
    ran_under_80 = math.isfinite(outcome.budget_gib) and outcome.budget_gib <= GIB_80
    fits_80 = outcome.status == "ok" and (ran_under_80 or (math.isfinite(peak) and peak <= GIB_80))
    oom = outcome.oom
    row.update({
        "case": cell.policy, "shape": cell.label, "recipe": cell.recipe, "status": outcome.status,
        "seed": -1 if cell.seed is None else int(cell.seed),
        "note": "; ".join(x for x in [cell.note, outcome.note] if x),
        "run": outcome.run if outcome.out_path else "", "config": cell.config_path,
        "args": shlex.join(cell_args(cell, spec, steps, data_dir)), "steps": int(steps),
        "exit_code": int(outcome.exit_code), "elapsed_s": float(outcome.elapsed_s), "budget_gib": outcome.budget_gib,
        "oom_category": oom.get("category", ""), "oom_request_gib": oom.get("request_gib", math.nan),
        "oom_held_gib": oom.get("held_gib", math.nan),
        "pct_of_80_gib": 100.0 * peak / GIB_80 if fits_80 and math.isfinite(peak) else math.nan,
        "pct_of_141_gib": 100.0 * peak / GIB_141 if math.isfinite(peak) else math.nan,
    })
    return row


def flag_same_policy_peaks(rows):
    """Adds a note to cells whose activation peak is the same under every policy they ran with (same shape and
    recipe, at least two policies other than "config", all ok): the build may not implement the policies yet."""
    groups = {}
    for r in rows:
        if r["case"] != "config" and r["status"] == "ok" and math.isfinite(r["peak_act_gib"]):
            groups.setdefault((r["shape"], r["recipe"]), []).append(r)
    for members in groups.values():
        if len({r["case"] for r in members}) >= 2 and len({round(r["peak_act_gib"], 9) for r in members}) == 1:
            for r in members:
                extra = ("the activation peak is the same under every recompute policy: this build may not "
                         "implement them yet")
                r["note"] = "; ".join(x for x in [r["note"], extra] if x)


def table_columns(rows):
    """[(name, kind, values)] of the cells table for result_file.write_table, in TRAIN_COLUMNS order."""
    return [(c, kind, [r[c] for r in rows]) for c, kind in TRAIN_COLUMNS]


def table_frame(rows):
    """The cells table as a DataFrame (what the scenario's rules read)."""
    import pandas as pd
    return pd.DataFrame({c: [r[c] for r in rows] for c, _ in TRAIN_COLUMNS}, columns=[c for c, _ in TRAIN_COLUMNS])
