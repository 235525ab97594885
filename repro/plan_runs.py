"""The plans of a plan-kind scenario (repro/scenario.py): one `fp4moe plan` run per plan at the scale, their
candidates read back into the plans table (scenario.PLAN_COLUMNS) that the scenario's rules compute from.

A plan runs
    <fp4moe> plan <its args> --top K --out <run dir>/plan/<name>.h5 [--cache <run dir>/plan/stage_times.tsv]
from the repository root, --cache unless its args say --no-measure (every measured plan of the run shares the
cache: a stage time measured for one is reused by the next); its Markdown report goes to <run dir>/plan/<name>.md,
its stderr (the measurement's progress lines) to <run dir>/logs/plan-<name>.log. The table keeps, per plan and
recipe, the candidates ranked 1..K (/plan/candidates' rank column, trainer/memory/plan.h); a plan that fails is one
row with status "failed" and the last line of its log.
"""

import math
import os
import subprocess
import time

import h5py

from reports import result_file
from repro.process import fmt_elapsed
from repro.scenario import PLAN_COLUMNS


def expand(s, scale):
    """The scenario's plans that run at `scale`, in file order."""
    return [p for p in s.plan.plans if scale in p.scales]


def command(fp4moe, plan, top, out_h5, cache):
    """The command line of one plan."""
    cmd = [fp4moe, "plan", *plan.args, "--top", str(top), "--out", out_h5]
    if "--no-measure" not in plan.args:
        cmd += ["--cache", cache]
    return cmd


def _last_line(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = [line.strip() for line in f.read().replace("\r", "\n").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


def _failed_row(plan, why):
    row = {c: (math.nan if kind == "f64" else 0 if kind == "i64" else "") for c, kind in PLAN_COLUMNS}
    row.update({"case": plan.name, "status": "failed", "note": why[:240]})
    return row


def read_rows(plan, h5, top):
    """The plans-table rows of one plan's --out file: per recipe the candidates ranked 1..top, by rank."""
    with h5py.File(h5, "r") as f:
        result_file.check_schema(h5, f)
        t = result_file.read_table(f["plan/candidates"])
        attrs = f["plan/candidates"].attrs
        measured_on = result_file.text(attrs.get("measured_on", "none"))
    t = t[(t["rank"] >= 1) & (t["rank"] <= top)].sort_values(["recipe", "rank"], kind="stable")
    rows = []
    for _, c in t.iterrows():
        rows.append({
            "case": plan.name,
            "shape": f"tp {c['tp']} pp {c['pp']} dp {c['dp']} ep {c['ep']}, m {c['micro_batches']}",
            "recipe": c["recipe"], "rank": int(c["rank"]), "policy": c["policy"], "status": "ok", "note": plan.note,
            "memory_gib": float(c["memory_gib"]), "compute_ms": 1e3 * float(c["compute_s"]),
            "ep_ms": 1e3 * float(c["ep_s"]), "pp_ms": 1e3 * float(c["pp_s"]), "bubble": float(c["bubble"]),
            "compute": c["compute_source"], "tokens_per_s_per_gpu": float(c["tokens_per_s_per_gpu"]),
            "measured_on": measured_on,
        })
    return rows


def run_plans(fp4moe, s, scale, run_dir, root, label):
    """Runs the scenario's plans at `scale`; returns (rows, {"failed": [names], "elapsed_s": seconds})."""
    plan_dir = os.path.join(run_dir, "plan")
    os.makedirs(plan_dir, exist_ok=True)
    os.makedirs(os.path.join(run_dir, "logs"), exist_ok=True)
    cache = os.path.join(plan_dir, "stage_times.tsv")
    plans = expand(s, scale)
    rows, failed, start = [], [], time.monotonic()
    for i, plan in enumerate(plans, 1):
        h5 = os.path.join(plan_dir, f"{plan.name}.h5")
        md = os.path.join(plan_dir, f"{plan.name}.md")
        log = os.path.join(run_dir, "logs", f"plan-{plan.name}.log")
        cmd = command(fp4moe, plan, s.plan.top, h5, cache)
        print(f"{label}: plan {i}/{len(plans)} {plan.name}: {' '.join(cmd[2:])}", flush=True)
        t0 = time.monotonic()
        with open(md, "w", encoding="utf-8") as out, open(log, "w", encoding="utf-8") as err:
            rc = subprocess.run(cmd, stdout=out, stderr=err, cwd=root).returncode
        took = time.monotonic() - t0
        if rc == 0 and os.path.exists(h5):
            got = read_rows(plan, h5, s.plan.top)
            rows += got
            print(f"{label}: plan {plan.name} done in {fmt_elapsed(took)}, {len(got)} rows", flush=True)
        else:
            why = _last_line(log) or f"exit code {rc}"
            failed.append(plan.name)
            rows.append(_failed_row(plan, why))
            print(f"{label}: plan {plan.name} failed (exit {rc}): {why} (log: {log})", flush=True)
    return rows, {"failed": failed, "elapsed_s": time.monotonic() - start}


def table_columns(rows):
    """[(name, kind, values)] of the plans table for result_file.write_table, in PLAN_COLUMNS order."""
    return [(c, kind, [r[c] for r in rows]) for c, kind in PLAN_COLUMNS]


def table_frame(rows):
    """The plans table as a DataFrame (what the scenario's rules read)."""
    import pandas as pd
    return pd.DataFrame({c: [r[c] for r in rows] for c, _ in PLAN_COLUMNS}, columns=[c for c, _ in PLAN_COLUMNS])
