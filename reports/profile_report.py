"""The step profile of training runs (`fp4moe train --profile`: /train/<run>/profile, trainer/train/step_profile.h):
a Markdown table and a stacked bar per run.

    /train/<run>/profile   one row per (range, module, pass): range ("interval": a log interval; "run": the run after
                           its warm-up steps), first_step, last_step, steps, module, pass (forward, backward,
                           recompute, update, "-"), ms_per_step (GPU stream time between CUDA events, a module's
                           time without its nested modules'), share (of the step, 0..1), calls_per_step; the row
                           (step, -) is the step's total, the others sum to it

run_rows(profile) -> the "run" range's rows; markdown(runs) -> one row per (module, pass), one column per run;
plot_stacked(runs, path) -> one bar per run (a recipe's run), its modules stacked in ms per step.
"""

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

PROFILE_REQUIRED = ("range", "first_step", "last_step", "steps", "module", "pass", "ms_per_step", "share")
STEP = "step"  # the module name of the step's total


def run_rows(profile):
    """The rows of the "run" range of a profile table (DataFrame), the (step, -) row included; empty when none."""
    return profile[profile["range"] == "run"].reset_index(drop=True)


def profiled(runs):
    """{run name: the "run" range's rows} of the runs (load_train_runs' dict) that hold a profile with that range."""
    out = {}
    for name, r in runs.items():
        p = r.get("profile")
        if p is not None and len(p):
            rows = run_rows(p)
            if len(rows):
                out[name] = rows
    return out


def _modules(rows_by_run):
    """The (module, pass) keys in the order the tables give them (the trainer's module order), the total left out."""
    keys = {}
    for rows in rows_by_run.values():
        for m, p in zip(rows["module"], rows["pass"]):
            if m != STEP:
                keys[(m, p)] = None
    return list(keys)


def _cell(rows, module, pass_):
    hit = rows[(rows["module"] == module) & (rows["pass"] == pass_)]
    if not len(hit):
        return "-"
    ms, share = float(hit["ms_per_step"].iloc[0]), float(hit["share"].iloc[0])
    return f"{ms:.3g} ({100 * share:.1f}%)" if math.isfinite(ms) else "-"


def markdown(runs):
    """One row per (module, pass), one column per profiled run: ms per step (share of the step) over the run's range
    after warm-up; a last row with the step's total and the steps it covers. "" when no run has a profile."""
    rows_by_run = profiled(runs)
    if not rows_by_run:
        return ""
    names = list(rows_by_run)
    lines = ["| module | pass | " + " | ".join(f"{n} ms/step (share)" for n in names) + " |",
             "|---|---|" + "---:|" * len(names)]
    for m, p in _modules(rows_by_run):
        lines.append(f"| {m} | {p} | " + " | ".join(_cell(rows_by_run[n], m, p) for n in names) + " |")
    totals = []
    for n in names:
        step = rows_by_run[n][rows_by_run[n]["module"] == STEP]
        if len(step):
            r = step.iloc[0]
            totals.append(f"{float(r['ms_per_step']):.4g} (steps {int(r['first_step'])}-{int(r['last_step'])})")
        else:
            totals.append("-")
    lines.append("| **step** | - | " + " | ".join(totals) + " |")
    return "\n".join(lines)


def plot_stacked(runs, path, title="step profile"):
    """One vertical bar per profiled run: ms per step of each module (its passes summed) stacked in the trainer's
    module order, one colour per module, the step's total written above the bar. False (nothing written) when no
    run has a profile."""
    rows_by_run = profiled(runs)
    if not rows_by_run:
        return False
    names = list(rows_by_run)
    modules = list(dict.fromkeys(m for m, _ in _modules(rows_by_run)))
    cmap = plt.get_cmap("tab20")
    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(names) + 3.5), 5.2))
    x = np.arange(len(names))
    bottom = np.zeros(len(names))
    for i, m in enumerate(modules):
        ms = np.array([float(rows_by_run[n].loc[rows_by_run[n]["module"] == m, "ms_per_step"].sum()) for n in names])
        ax.bar(x, ms, 0.6, bottom=bottom, color=cmap(i % 20), label=m, edgecolor="white", linewidth=0.4)
        bottom += ms
    for xi, n in zip(x, names):
        step = rows_by_run[n].loc[rows_by_run[n]["module"] == STEP, "ms_per_step"]
        total = float(step.iloc[0]) if len(step) else float(bottom[xi])
        ax.annotate(f"{total:.3g} ms", (xi, bottom[xi]), ha="center", va="bottom", fontsize=8,
                    xytext=(0, 2), textcoords="offset points")
    ax.set_xticks(x, names, rotation=20 if len(names) > 3 else 0, ha="right" if len(names) > 3 else "center")
    ax.set_ylabel("ms per step (GPU stream time, after warm-up)")
    ax.set_title(title)
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], labels[::-1], fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # as stacked
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
