"""The cells tables of the reproduction suite's training scenarios (repro/train_cells.py; /bench/<family> with the
table attribute kind = "train cells"): a narrower Markdown table and the plots the scenario asks for.

    plot_memory(df, path, title)      per configuration (shape), per recompute policy (case): one bar per recipe,
                                      the peak total memory (GiB) with its activation part drawn darker inside it;
                                      lines at 80 GiB (the paper's H800) and 141 GiB (H200); a cell that ran out of
                                      its budget is hatched ("OOM" and the category; its bar, when drawn, is the
                                      peak measured without the budget), a cell not run says so
    plot_throughput(df, path, title)  the same layout with the median tokens/s per GPU, MFU written on each bar
    plot_loss(runs, df, path, title)  the loss curves of the cells' runs, mean and min-max band over seeds per
                                      recipe (reports/train_report.py plot_loss_bands)
    markdown(df)                      the columns that matter for reading the cells, the empty ones left out
Each plot function returns False (and writes nothing) when no cell has a value to draw.
"""

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from reports import bench_report, train_report  # noqa: E402

SHOWN = ["case", "shape", "recipe", "seed", "status", "peak_total_gib", "peak_act_gib", "pct_of_80_gib",
         "pct_of_141_gib",
         "oom_category", "tokens_per_s", "mfu", "train_loss", "val_loss", "val_tokens", "dispatch_payload_bytes",
         "dispatch_scale_bytes", "dispatch_bytes", "elapsed_s", "run", "note"]
RECIPE_COLORS = {"bf16": "#4C72B0", "fp8": "#DD8452", "mxfp4": "#55A868"}


def is_cells_table(attrs):
    return attrs.get("kind") == "train cells"


def _has_values(series):
    if series.dtype.kind in "fiu":
        v = np.asarray(series, dtype=float)
        return bool(np.isfinite(v).any() and (v != -1).any())
    return bool(series.astype(str).str.strip().ne("").any())


def markdown(df):
    """The SHOWN columns that hold any value, as a Markdown table (NaN and -1 print as "-")."""
    cols = [c for c in SHOWN if c in df.columns and _has_values(df[c])]
    narrow = df[cols].copy()
    for c in cols:
        if narrow[c].dtype.kind in "iu":
            narrow[c] = narrow[c].astype(float).where(narrow[c] != -1, math.nan)
    return bench_report.markdown_table(narrow)


def bar_label(r, height, text=""):
    """The text above a cell's bar: an OOM cell names the budget and the category that did not fit, and says when
    its run without the budget ran out of the device as well (no measured height); a cell that did not run says its
    status; `text` (the plot's own annotation) follows."""
    if r["status"] == "oom":
        budget = _num(r, "budget_gib")
        at = f" at {budget:g} GiB" if math.isfinite(budget) else ""
        label = f"OOM{at}\n({r['oom_category']})" + (f"\n{text}" if text else "")
        if not (math.isfinite(height) and height > 0):
            label += "\nand on this GPU"
        return label
    return text if r["status"] == "ok" else r["status"]


def _grid(df, value, title, ylabel, path, lines=(), annotate=None):
    """Grouped bars per shape (one subplot each): groups = cases, bars = recipes; value(row) -> (height, inner)
    with inner the darker part (or None). annotate(row) -> text above the bar. False when nothing to draw."""
    shapes = list(dict.fromkeys(df["shape"]))
    heights = [value(r)[0] for _, r in df.iterrows()]
    if not shapes or not any(math.isfinite(h) and h > 0 for h in heights):
        return False
    fig, axes = plt.subplots(len(shapes), 1, figsize=(9, 3.6 * len(shapes) + 0.6), squeeze=False)
    for ax, shape in zip(axes[:, 0], shapes):
        sub = df[df["shape"] == shape]
        cases = list(dict.fromkeys(sub["case"]))
        recipes = list(dict.fromkeys(sub["recipe"]))
        width = 0.8 / max(1, len(recipes))
        top = 0.0
        for j, recipe in enumerate(recipes):
            color = RECIPE_COLORS.get(recipe, f"C{j}")
            for i, case in enumerate(cases):
                cell = sub[(sub["case"] == case) & (sub["recipe"] == recipe)]
                if cell.empty:
                    continue
                r = cell.iloc[0]
                x = i + (j - (len(recipes) - 1) / 2) * width
                h, inner = value(r)
                oom = r["status"] == "oom"
                if math.isfinite(h) and h > 0:
                    ax.bar(x, h, width, color=color, alpha=0.45 if inner is not None else 0.9,
                           hatch="//" if oom else None, edgecolor="black" if oom else color,
                           label=recipe if i == 0 else None)
                    if inner is not None and math.isfinite(inner):
                        ax.bar(x, inner, width * 0.6, color=color, alpha=1.0)
                    top = max(top, h)
                else:
                    ax.bar(x, 0, width, color=color, label=recipe if i == 0 else None)
                text = bar_label(r, h, annotate(r) if annotate else "")
                if text:
                    ax.annotate(text, (x, h if math.isfinite(h) and h > 0 else 0), ha="center", va="bottom",
                                fontsize=7, rotation=90 if r["status"] not in ("ok", "oom") else 0,
                                xytext=(0, 2), textcoords="offset points")
        for y, name, style in lines:
            ax.axhline(y, color="black" if "80" in name else "gray", linestyle=style, linewidth=1, label=name)
            top = max(top, y)
        ax.set_ylim(0, top * 1.18 if top > 0 else 1)
        ax.set_xticks(np.arange(len(cases)), cases)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{shape}")
        ax.legend(fontsize=7, loc="upper right")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _num(r, col):
    v = r[col] if col in r else math.nan
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def plot_memory(df, path, title):
    return _grid(df, lambda r: (_num(r, "peak_total_gib"), _num(r, "peak_act_gib")), title,
                 "peak GiB (darker: activations)", path,
                 lines=((80.0, "80 GiB (H100/H800)", "--"), (141.0, "141 GiB (H200)", ":")),
                 annotate=lambda r: f"{_num(r, 'peak_total_gib'):.1f}" if math.isfinite(_num(r, "peak_total_gib"))
                 else "")


def plot_throughput(df, path, title):
    def note(r):
        mfu = _num(r, "mfu")
        return f"MFU {100 * mfu:.0f}%" if math.isfinite(mfu) else ""
    return _grid(df, lambda r: (_num(r, "tokens_per_s"), None), title, "tokens/s per GPU (median)", path,
                 annotate=note)


def plot_loss(runs, df, path, title):
    """runs: {run: {"steps", "eval", "attrs"}} (train_report.load_train_runs); the cells' runs (column `run`),
    grouped over seeds by "<recipe> <case> <shape>": the mean curves with a min-max band
    (train_report.plot_loss_bands)."""
    groups = {}
    for _, r in df.iterrows():
        if r["run"] and r["run"] in runs:
            label = f"{r['recipe']} {r['case']} {r['shape']}".replace(" config", "")
            groups.setdefault(label, []).append(runs[r["run"]])
    if not groups:
        return False
    return train_report.plot_loss_bands(groups, path, title)


PLOTS = {"memory": plot_memory, "throughput": plot_throughput}
