"""Training runs in a result file (`/train/<run>`, DESIGN.md "Results"): a summary table and loss-curve plots.

    /train/<run>/steps   one row per optimizer step: step, tokens, loss, lr, grad_norm, tokens_per_s, mfu,
                         peak_act_gib, peak_total_gib, skipped (columns other than step/tokens/loss are optional)
    /train/<run>/eval    one row per evaluation: step, tokens, val_loss, val_tokens (validation tokens evaluated:
                         a fixed subset periodically, the whole split at the end; absent in older files)
    /train/<run>/profile with --profile only: the step profile (reports/profile_report.py)
    attributes           of /train/<run> or of its tables: the run's config (recipe, model name, ...)

summarize(steps, evals) -> dict of the numbers a report quotes; markdown(runs) -> a Markdown table with one row per
run; plot_loss(runs, path) -> training loss (a running mean over `smooth` steps) and validation loss against
tokens, one colour per run; plot_loss_bands(groups, path) -> the same per group of runs (a recipe over seeds): the
mean curve with a min-max band. Relative deviations (paper 1: fp8 +0.29%, mxfp4 +0.61% vs bf16) come from
deviation(runs, baseline), on the last validation loss of runs that saw the same tokens.
"""

import math

import h5py
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from reports import profile_report, result_file  # noqa: E402


STEPS_REQUIRED = ("step", "tokens", "loss")
EVAL_REQUIRED = ("step", "tokens", "val_loss")


def load_train_runs(path):
    """{run name: {"steps": DataFrame, "eval": DataFrame or None, "profile": DataFrame or None, "attrs": {...}}} for
    every /train/<run> group of a result file (schema-checked); empty when the file has none. Raises
    result_file.SchemaError, and TableError for /train stored as a dataset, a malformed table or one without
    STEPS_REQUIRED / EVAL_REQUIRED / profile_report.PROFILE_REQUIRED columns."""
    result_file.check_readable(path)
    runs = {}
    with h5py.File(path, "r") as f:
        result_file.check_schema(path, f)
        train = result_file.group_at(f, "train")
        if train is None:
            return runs
        for name, g in train.items():
            if not isinstance(g, h5py.Group) or "steps" not in g:
                continue
            attrs = result_file.attributes(g)
            steps = result_file.read_table(g["steps"], STEPS_REQUIRED)
            evals = result_file.read_table(g["eval"], EVAL_REQUIRED) if "eval" in g else None
            profile = (result_file.read_table(g["profile"], profile_report.PROFILE_REQUIRED) if "profile" in g
                       else None)
            attrs.update(result_file.attributes(g["steps"], ("columns",)))
            runs[name] = {"steps": steps, "eval": evals, "profile": profile, "attrs": attrs}
    return runs


def _finite(values):
    v = np.asarray(values, dtype=float)
    return v[np.isfinite(v)]


def summarize(steps, evals, tail=None):
    """Numbers of one run: steps, tokens, final train loss (mean of the last `tail` finite losses, default 5% of the
    steps, at least 1), last and best validation loss, the validation tokens of the last evaluation (val_tokens;
    -1 when the eval table has no such column: files written before the trainer kept it), median tokens/s and MFU over the steps after the first 10%
    (warm-up of clocks and caches), peak memory, skipped steps."""
    n = len(steps)
    out = {"steps": int(steps["step"].max()) if n else 0, "tokens": int(steps["tokens"].max()) if n else 0}
    losses = _finite(steps["loss"]) if n else np.array([])
    k = tail or max(1, n // 20)
    out["train_loss"] = float(losses[-k:].mean()) if losses.size else math.nan
    if evals is not None and len(evals):
        v = _finite(evals["val_loss"])
        out["val_loss"] = float(v[-1]) if v.size else math.nan
        out["best_val_loss"] = float(v.min()) if v.size else math.nan
        out["val_tokens"] = int(evals["val_tokens"].iloc[-1]) if "val_tokens" in evals.columns else -1
    else:
        out["val_loss"] = out["best_val_loss"] = math.nan
        out["val_tokens"] = -1
    settled = steps.iloc[n // 10:] if n >= 10 else steps
    for col in ("tokens_per_s", "mfu"):
        vals = _finite(settled[col]) if col in steps.columns and len(settled) else np.array([])
        out[col] = float(np.median(vals)) if vals.size else math.nan
    for col in ("peak_act_gib", "peak_total_gib"):
        vals = _finite(steps[col]) if col in steps.columns and n else np.array([])
        out[col] = float(vals.max()) if vals.size else math.nan
    out["skipped"] = int(steps["skipped"].astype(int).max()) if "skipped" in steps.columns and n else 0
    return out


def deviation(runs, baseline):
    """{run: relative deviation of its last validation loss from the baseline run's} (None when either is
    missing); the paper's loss-deviation row: (L_run - L_bf16) / L_bf16."""
    base = summarize(runs[baseline]["steps"], runs[baseline]["eval"])["val_loss"] if baseline in runs else math.nan
    out = {}
    for name, r in runs.items():
        v = summarize(r["steps"], r["eval"])["val_loss"]
        out[name] = (v - base) / base if math.isfinite(v) and math.isfinite(base) and base else None
    return out


def _fmt(v, digits=4):
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.{digits}g}"


def markdown(runs):
    """One row per run: steps, tokens, train loss, validation loss (last, its tokens, best), tokens/s, MFU, peaks,
    skipped."""
    head = ("| run | steps | tokens | train loss | val loss | val tokens | best val | tokens/s | MFU | peak act GiB | "
            "peak total GiB | skipped |")
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in runs.items():
        s = summarize(r["steps"], r["eval"])
        mfu = f"{100 * s['mfu']:.1f}%" if math.isfinite(s["mfu"]) else "-"
        lines.append(f"| {name} | {s['steps']} | {s['tokens']:,} | {_fmt(s['train_loss'])} | {_fmt(s['val_loss'])} | "
                     f"{format(s['val_tokens'], ',') if s['val_tokens'] >= 0 else '-'} | "
                     f"{_fmt(s['best_val_loss'])} | {_fmt(s['tokens_per_s'], 3)} | {mfu} | "
                     f"{_fmt(s['peak_act_gib'], 3)} | {_fmt(s['peak_total_gib'], 3)} | {s['skipped']} |")
    return "\n".join(lines)


def _smoothed(r, smooth):
    """(tokens, running mean of the finite training losses over `smooth` steps) of one run; None without any."""
    st = r["steps"]
    loss = np.asarray(st["loss"], dtype=float)
    ok = np.isfinite(loss)
    if not ok.any():
        return None
    tokens = np.asarray(st["tokens"], dtype=float)[ok]
    w = max(1, min(smooth, int(ok.sum())))
    return tokens[w - 1:], np.convolve(loss[ok], np.ones(w) / w, mode="valid")


def _band(curves):
    """(x, mean, min, max) over curves [(x, y)] on the x of the shortest one (runs of one cell share their x)."""
    n = min(len(x) for x, _ in curves)
    ys = np.vstack([y[:n] for _, y in curves])
    return curves[0][0][:n], ys.mean(axis=0), ys.min(axis=0), ys.max(axis=0)


def _finish_loss_plot(fig, ax, drawn, path, title):
    """Labels, title, grid and legend of a loss plot against tokens, saved to `path` (PNG) and closed; False (and
    nothing written) when nothing was drawn."""
    if not drawn:
        plt.close(fig)
        return False
    ax.set_xlabel("tokens")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_loss_bands(groups, path, title="loss", smooth=20):
    """Per group (e.g. a recipe over seeds: {label: [run, ...]}, runs as load_train_runs gives them): the mean
    training loss (running mean over `smooth` steps, thin) and mean validation loss (markers) against tokens, each
    with a shaded band from the minimum to the maximum over the group's runs; a group of one run is its curve. The
    legend gives n per group. False when no run has a finite loss."""
    fig, ax = plt.subplots(figsize=(8, 4.8))
    drawn = False
    for i, (name, runs) in enumerate(groups.items()):
        color = f"C{i % 10}"
        n = f" (n={len(runs)})" if len(runs) > 1 else ""
        train = [c for c in (_smoothed(r, smooth) for r in runs) if c is not None]
        if train:
            x, mean, lo, hi = _band(train)
            ax.plot(x, mean, color=color, linewidth=1.0, alpha=0.8, label=f"{name} train{n}")
            if len(train) > 1:
                ax.fill_between(x, lo, hi, color=color, alpha=0.15, linewidth=0)
            drawn = True
        evals = [(np.asarray(r["eval"]["tokens"], dtype=float), np.asarray(r["eval"]["val_loss"], dtype=float))
                 for r in runs if r["eval"] is not None and len(r["eval"])]
        if evals:
            x, mean, lo, hi = _band(evals)
            ax.plot(x, mean, "o--", color=color, markersize=3.5, linewidth=0.8, label=f"{name} val{n}")
            if len(evals) > 1:
                ax.fill_between(x, lo, hi, color=color, alpha=0.25, linewidth=0)
            drawn = True
    banded = any(len(r) > 1 for r in groups.values())
    full_title = f"{title} (mean over seeds, band: min to max)" if banded else title
    return _finish_loss_plot(fig, ax, drawn, path, full_title)


def plot_loss(runs, path, title="loss", smooth=20):
    """Training loss (running mean over `smooth` steps, thin) and validation loss (markers) against tokens.
    False when no run has a finite loss."""
    fig, ax = plt.subplots(figsize=(8, 4.8))
    drawn = False
    for i, (name, r) in enumerate(runs.items()):
        color = f"C{i % 10}"
        st = r["steps"]
        loss = np.asarray(st["loss"], dtype=float)
        ok = np.isfinite(loss)
        if ok.any():
            tokens = np.asarray(st["tokens"], dtype=float)[ok]
            w = max(1, min(smooth, int(ok.sum())))
            mean = np.convolve(loss[ok], np.ones(w) / w, mode="valid")
            ax.plot(tokens[w - 1:], mean, color=color, linewidth=1.0, alpha=0.8, label=f"{name} train")
            drawn = True
        ev = r["eval"]
        if ev is not None and len(ev):
            ax.plot(np.asarray(ev["tokens"], dtype=float), np.asarray(ev["val_loss"], dtype=float), "o--",
                    color=color, markersize=3.5, linewidth=0.8, label=f"{name} val")
            drawn = True
    return _finish_loss_plot(fig, ax, drawn, path, title)
