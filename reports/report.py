#!/usr/bin/env python3
"""TABLES.md and PNG plots of one run file (`make report RUN=runs/<date>-<gpu>.h5`; repro/run.py calls the same
write_report after a run).

    reports/report.py RUN.h5 [--out DIR | --runs RUNS]

DIR (default: RUNS/<stem of RUN>/, RUNS the repository's runs/ folder, e.g. runs/20261129-120000-nvidia-h200/;
so a committed run under reports/results/ is never written over unless --out names its folder) receives
    TABLES.md                           the run's root attributes; for each /repro/<scenario> table the paper value,
                                        ours and their ratio with the source of each row; then every /bench table
                                        in full with the geometric means of its ratio columns (bench_report.py)
    <family>_fraction_of_copy.png       per kernel: bandwidth as a fraction of the copy's measured in the same run
                                        (geometric mean over shapes, whiskers from the lowest to the highest)
    <family>_tflops.png                 per case and shape: TFLOP/s, one bar per recipe
    <scenario>_<plot>.png               per training scenario (attribute kind = "train" of /repro/<scenario>): the
                                        plot it names (memory, throughput or loss) from its cells table
                                        /bench/<family> (reports/cells_report.py)
A plot is drawn for each /bench table that has the values for it (fraction_of_copy_bw on non-copy rows; tflops
above zero). Files whose schema_version is not result_file.SCHEMA_VERSION are refused.
For /train/<run> groups (fp4moe train): a summary row per run and train_loss.png (reports/train_report.py) of the
runs that no reproduction scenario made (those carry the attribute repro_scenarios and are plotted per scenario);
for the runs with a step profile (--profile) its table and train_profile.png, a stacked bar per run
(reports/profile_report.py).
A cells table is shown with the columns that matter for reading it (cells_report.markdown).
Every file is written under a temporary name and renamed; none may be the run file (nor a link to it) or anything
but a regular file (reports/output_path.py).
Exit codes: 0 written, 1 no /repro, /bench or /train table in the file, 2 an unreadable file, another schema, a
malformed table (named with its column), an output refused or not writable, or no interpreter that imports numpy,
pandas, h5py and matplotlib (reports/interpreter.py).
"""

import argparse
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

if __name__ == "__main__":
    from reports import interpreter

    interpreter.require("report")

import h5py  # noqa: E402
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from reports import bench_report, cells_report, output_path, profile_report, result_file, train_report  # noqa: E402

RUNS = os.path.join(ROOT, "runs")
REPRO_SHOWN = [("row", "row"), ("paper", "paper"), ("ours", "ours"), ("ratio", "ours / paper"), ("unit", "unit"),
               ("paper_source", "source"), ("note", "note")]
# The columns every table of a kind has (repro/ours.py, benchmarks/bench_util.cuh): the report and compare.py use them.
REQUIRED = {"repro": tuple(c for c, _ in REPRO_SHOWN), "bench": ("case", "shape", "recipe")}


def load_run(path):
    """{"attrs", "repro": {path: (DataFrame, attrs)}, "bench": {path: (DataFrame, attrs)}} of a run file.
    Raises OSError naming the file for a missing or unreadable file, result_file.SchemaError for another schema and
    result_file.TableError for a malformed table (one without the REQUIRED columns of its kind among them)."""
    result_file.check_readable(path)
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise OSError(f"'{path}' is not a readable HDF5 file: {result_file.one_line(e)}") from None
    with f:
        result_file.check_schema(path, f)
        run = {"attrs": result_file.root_attributes(f), "repro": {}, "bench": {}}
        for kind in ("repro", "bench"):
            for p, df in result_file.tables_under(f, kind, REQUIRED[kind]).items():
                run[kind][p] = (df, result_file.table_attributes(f, p))
    run["train"] = train_report.load_train_runs(path)
    return run


def _num(v, digits=3):
    return "-" if not result_file.is_number(v) else f"{v:.{digits}g}"


def _esc(v):
    return str(v).replace("|", "\\|").replace("\n", " ")


# Columns of rows over seeds (repro/ours.py paired_mean, sd), shown when any row has one (older run files lack them).
SEED_METHOD = ("Over seeds: ours is the mean of the per-seed paired deviations (same seed: same initial weights and "
               "data order for every recipe); the interval is the 95% Student-t interval of that mean (n - 1 degrees "
               "of freedom, repro/stats.py); \"within noise\" when it contains 0; the spread is the baseline's sample "
               "sd over the same seeds (its noise floor). The loss plot draws the mean over seeds and a min-max band.")
SEED_SHOWN = [("interval", "95% interval (t, over seeds)"), ("spread", "spread over seeds"), ("verdict", "verdict")]


def _interval(r):
    low, high = r.get("ci_low", math.nan), r.get("ci_high", math.nan)
    if not (result_file.is_number(low) and result_file.is_number(high)):
        return "-"
    return f"[{low:+.3g}, {high:+.3g}]"


def repro_markdown(df):
    seeds = any(c in df.columns and df[c].astype(str).str.strip().ne("").any() for c in ("spread", "verdict"))
    shown = REPRO_SHOWN[:3] + (SEED_SHOWN if seeds else []) + REPRO_SHOWN[3:]
    align = {"ours": "---:", "ratio": "---:"}
    lines = ["| " + " | ".join(h for _, h in shown) + " |", "|" + "|".join(align.get(c, "---") for c, _ in shown) + "|"]
    for _, r in df.iterrows():
        cells = []
        for c, _ in shown:
            if c == "interval":
                cells.append(_interval(r))
                continue
            v = r[c] if c in r else ""
            cells.append(_num(v, 4 if c == "ours" else 3) if c in ("ours", "ratio") else (_esc(v) if v != "" else "-"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def family_of(table_path):
    """"/bench/quant" -> "quant", "/bench/gemm/fp8" -> "gemm_fp8"."""
    return table_path.split("/", 2)[2].replace("/", "_")


def _geomean_min_max(values):
    v = [x for x in values if math.isfinite(x) and x > 0]
    return (math.exp(sum(math.log(x) for x in v) / len(v)), min(v), max(v)) if v else None


def plot_fraction_of_copy(df, title, path):
    """Bars per case: geometric mean of fraction_of_copy_bw over its shapes, whiskers min..max. False when the
    table has nothing to plot."""
    if "fraction_of_copy_bw" not in df.columns:
        return False
    rows = df[df["recipe"] != "copy"] if "recipe" in df.columns else df
    cases, means, lo, hi = [], [], [], []
    for case in dict.fromkeys(rows["case"]):
        g = _geomean_min_max(rows[rows["case"] == case]["fraction_of_copy_bw"].astype(float).tolist())
        if g:
            cases.append(case)
            means.append(g[0])
            lo.append(g[0] - g[1])
            hi.append(g[2] - g[0])
    if not cases:
        return False
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(cases) + 1.6))
    y = np.arange(len(cases))
    ax.barh(y, means, xerr=[lo, hi], color="#4C72B0", capsize=3)
    ax.axvline(1.0, color="black", linewidth=1, linestyle="--", label="device-to-device copy")
    ax.set_yticks(y, cases)
    ax.invert_yaxis()
    ax.set_xlabel("bandwidth / copy bandwidth (geometric mean over shapes; whiskers: min to max)")
    ax.set_title(title)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_tflops(df, title, path):
    """Horizontal bars: TFLOP/s per (case, shape), one bar per recipe. False when no row has tflops > 0."""
    if "tflops" not in df.columns:
        return False
    rows = df[np.isfinite(df["tflops"].astype(float)) & (df["tflops"].astype(float) > 0)]
    if rows.empty:
        return False
    labels = list(dict.fromkeys(f"{c} {s}" for c, s in zip(rows["case"], rows["shape"])))
    recipes = list(dict.fromkeys(rows["recipe"])) if "recipe" in rows.columns else [""]
    height = 0.8 / len(recipes)
    fig, ax = plt.subplots(figsize=(9, 0.4 * len(labels) * max(1, len(recipes) / 2) + 1.6))
    y = np.arange(len(labels))
    for i, recipe in enumerate(recipes):
        sub = rows[rows["recipe"] == recipe] if recipe else rows
        values = {f"{c} {s}": t for c, s, t in zip(sub["case"], sub["shape"], sub["tflops"].astype(float))}
        ax.barh(y + (i - (len(recipes) - 1) / 2) * height, [values.get(lb, 0.0) for lb in labels], height,
                label=recipe or None)
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    ax.set_xlabel("TFLOP/s")
    ax.set_title(title)
    if recipes != [""]:
        ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_plots(run, out_dir):
    """Draws every plot the run's /bench tables allow into out_dir; returns {table path: [file names]}."""
    gpu = run["attrs"].get("gpu", "unknown GPU")
    plots = {}
    for p, (df, _) in run["bench"].items():
        fam = family_of(p)
        names = []
        name = f"{fam}_fraction_of_copy.png"
        if plot_fraction_of_copy(df, f"{p}: bandwidth vs copy ({gpu})", os.path.join(out_dir, name)):
            names.append(name)
        name = f"{fam}_tflops.png"
        if plot_tflops(df, f"{p}: TFLOP/s ({gpu})", os.path.join(out_dir, name)):
            names.append(name)
        plots[p] = names
    for p, (_, a) in run["repro"].items():
        plot, cells = a.get("plot", ""), run["bench"].get(f"/bench/{a.get('family', '')}")
        if a.get("kind") != "train" or not plot or cells is None:
            continue
        name = f"{p.split('/', 2)[2]}_{plot}.png"
        title = f"{p.split('/', 2)[2]} ({gpu}, scale {a.get('scale', '?')})"
        if plot == "loss":
            drawn = cells_report.plot_loss(run.get("train", {}), cells[0], os.path.join(out_dir, name), title)
        else:
            drawn = cells_report.PLOTS[plot](cells[0], os.path.join(out_dir, name), title)
        if drawn:
            plots[p] = [name]
    own = {k: r for k, r in run.get("train", {}).items() if not r["attrs"].get("repro_scenarios")}
    if own:
        name = "train_loss.png"
        if train_report.plot_loss(own, os.path.join(out_dir, name), f"training runs ({gpu})"):
            plots["/train"] = [name]
    name = "train_profile.png"
    if profile_report.plot_stacked(run.get("train", {}), os.path.join(out_dir, name), f"step profile ({gpu})"):
        plots["/train/profile"] = [name]
    return plots


def _train_facts(a):
    """The sentence under a training scenario's heading: its cells and what became of them."""
    counts = [(a.get("cells_ok"), "ok"), (a.get("cells_oom"), "OOM"), (a.get("cells_not_run"), "not run"),
              (a.get("cells_failed"), "failed")]
    text = f"Training cells of `fp4moe train`: {a.get('cells', 0)} (" + ", ".join(
        f"{n} {what}" for n, what in counts if isinstance(n, int) and n) + ")"
    if a.get("steps"):
        text += f", {a['steps']} steps each"
    seeds = str(a.get("seeds", "")).split()
    if seeds:
        text += f", {len(seeds)} seed{'s' if len(seeds) > 1 else ''} ({', '.join(seeds)})"
    if a.get("parallel", 1) not in (1, "1"):
        text += f", {a['parallel']} runs at a time"
    if a.get("merged_from"):
        text += f", merged from {a['merged_from']}"
    if result_file.is_number(a.get("memory_budget_gib")) and a["memory_budget_gib"] > 0:
        text += f", memory budget {_num(a['memory_budget_gib'])} GiB"
    if a.get("data"):
        text += {"shards": ", token shards", "synthetic": ", synthetic tokens"}.get(a["data"], f", data {a['data']}")
    return text.replace(" ()", "")


def render_markdown(run, plots, run_name=""):
    """TABLES.md text of a loaded run; plots: {table path: [png file names]} linked under each table."""
    attrs = run["attrs"]
    out = [f"# Reproduction tables: {attrs.get('gpu', 'unknown GPU')}", ""]
    if run_name:
        out += [f"Run file `{run_name}`" + (f", scale `{attrs['scale']}`." if "scale" in attrs else "."), ""]
    out += ["| attribute | value |", "|---|---|"]
    known = result_file.ROOT_ATTRIBUTES
    for k in known + sorted(k for k in attrs if k not in known):
        if k in attrs:
            out.append(f"| {k} | {_esc(attrs[k])} |")
    for p, (df, a) in run["repro"].items():
        name = p.split("/", 2)[2]
        out += ["", f"## {name}: {a.get('title', '')}".rstrip(": "), ""]
        facts = [_train_facts(a)] if a.get("kind") == "train" else []
        if "benchmark" in a:
            flt = a.get("filter", "")
            facts.append(f"benchmark `{a['benchmark']}`" + (f" with `--benchmark_filter={flt}`" if flt else
                                                            " (every case)"))
        if "budget_gpu_minutes" in a:
            took = a.get("elapsed_s")
            facts.append(f"budget {_num(a['budget_gpu_minutes'])} GPU-minutes" +
                         (f", took {_num(took / 60)} min" if result_file.is_number(took) else ""))
        if "exit_code" in a:
            facts.append(f"exit code {a['exit_code']}")
        if facts:
            sentence = "; ".join(facts)
            out += [sentence[0].upper() + sentence[1:] + ".", ""]
        out.append(repro_markdown(df))
        if "verdict" in df.columns and df["verdict"].astype(str).str.strip().ne("").any():
            out += ["", SEED_METHOD]
        for png in plots.get(p, []):
            out += ["", f"![{name}]({png})"]
    if run.get("train"):
        out += ["", "## Training runs", "", train_report.markdown(run["train"])]
        for png in plots.get("/train", []):
            out += ["", f"![training runs]({png})"]
        profile = profile_report.markdown(run["train"])
        if profile:
            out += ["", "### Step profile", "", "GPU stream time per step after the warm-up steps (`fp4moe train "
                    "--profile`; CUDA events around each module, a module's time without its nested modules'; other: "
                    "time inside no module).", "", profile]
        for png in plots.get("/train/profile", []):
            out += ["", f"![step profile]({png})"]
    if run["bench"]:
        out += ["", "## Benchmark tables"]
    for p, (df, a) in run["bench"].items():
        if cells_report.is_cells_table(a):
            out += ["", f"### {p}", "", f"{len(df)} training cells of scenario `{a.get('scenario', '')}` (the full "
                    f"table, with each cell's command line, is in the run file).", "", cells_report.markdown(df)]
            continue
        out += ["", f"### {p}", "", f"{len(df)} rows" + (f"; `{_esc(a['command'])}`." if a.get("command") else "."),
                "", bench_report.markdown_table(df)]
        summary = bench_report.ratio_summary(df)
        if summary:
            out += ["", summary]
        for png in plots.get(p, []):
            out += ["", f"![{p}]({png})"]
    return "\n".join(out) + "\n"


def default_out_dir(run_path, runs=None):
    """runs/<stem of run_path>/ ("runs/20261129-120000-nvidia-h200/" for any ".../20261129-120000-nvidia-h200.h5"),
    under `runs` (default: RUNS, the repository's runs/ folder): never beside a committed run file."""
    name = os.path.basename(run_path)
    stem = name[:-3] if name.endswith(".h5") and len(name) > 3 else name + ".report"
    return os.path.join(RUNS if runs is None else runs, stem)


class ReportWriteError(OSError):
    """The run file was read but the report could not be written (a folder that cannot be created or written)."""


def write_report(run_path, out_dir=None, runs=None):
    """Writes TABLES.md and the plots of `run_path` into out_dir (default_out_dir(run_path, runs) when None); returns
    (TABLES.md path, [png paths], number of tables); writes nothing and returns (None, [], 0) for a file without
    /repro, /bench or /train tables. Everything is drawn into a temporary folder inside out_dir first, then each
    file is checked (output_path.check_file: not the run file, not anything but a regular file) and renamed into
    place, so a refusal replaces nothing. Raises output_path.OutputPathError (out_dir or one of its files would be
    the run file or is not a folder / regular file), ReportWriteError when writing fails, OSError,
    result_file.SchemaError and result_file.TableError (reading)."""
    import shutil
    import tempfile

    out_dir = out_dir or default_out_dir(run_path, runs)
    output_path.check_folder(out_dir, [run_path])
    run = load_run(run_path)
    if not run["repro"] and not run["bench"] and not run["train"]:
        return None, [], 0
    try:
        os.makedirs(out_dir, exist_ok=True)
        stage = tempfile.mkdtemp(prefix=".report.tmp-", dir=out_dir)
    except OSError as e:
        raise ReportWriteError(f"cannot write the report into '{out_dir}': {result_file.one_line(e)}") from None
    try:
        plots = write_plots(run, stage)
        with open(os.path.join(stage, "TABLES.md"), "w", encoding="utf-8") as f:
            f.write(render_markdown(run, plots, os.path.basename(run_path)))
        names = ["TABLES.md"] + [n for files in plots.values() for n in files]
        for n in names:
            output_path.check_file(os.path.join(out_dir, n), [run_path])
        for n in names:
            os.replace(os.path.join(stage, n), os.path.realpath(os.path.join(out_dir, n)))
    except OSError as e:
        raise ReportWriteError(f"cannot write the report into '{out_dir}': {result_file.one_line(e)}") from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    pngs = [os.path.join(out_dir, n) for n in names[1:]]
    return os.path.join(out_dir, "TABLES.md"), pngs, len(run["repro"]) + len(run["bench"]) + len(run["train"])


def main(argv=None):
    p = argparse.ArgumentParser(description="TABLES.md and plots of one fp4moe run file")
    p.add_argument("run", help="HDF5 run file (repro/run.py writes runs/<date>-<gpu>.h5)")
    p.add_argument("--out", help="folder for TABLES.md and the plots (default: RUNS/<run file's name without .h5>)")
    p.add_argument("--runs", help="the folder whose <run stem>/ receives the report when --out is not given "
                                  "(default: runs/ of the repository)")
    a = p.parse_args(argv)
    try:
        md, pngs, n = write_report(a.run, a.out, a.runs)
    except output_path.OutputPathError as e:
        print(f"report: refused output: {e}", file=sys.stderr)
        return 2
    except (result_file.SchemaError, result_file.TableError, ReportWriteError) as e:
        print(f"report: {e}", file=sys.stderr)
        return 2
    except (OSError, KeyError) as e:
        print(f"report: cannot read '{a.run}': {result_file.one_line(e)}", file=sys.stderr)
        return 2
    if n == 0:
        print(f"report: '{a.run}' holds no /repro, /bench or /train table", file=sys.stderr)
        return 1
    print(f"report: wrote {md} and {len(pngs)} plot(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
