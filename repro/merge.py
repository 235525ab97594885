"""One run file from the benchmark programs' result files, the training runs and the reproduced tables (DESIGN.md
"Results").

    /                      root attributes of the first benchmark file, else of the first training run's file
                           (schema_version, git_sha, date, gpu, ...), else schema_version alone; `command` replaced
                           by the reproduction's own, plus any extra given (e.g. scale)
    /bench/<family>        every table under /bench of each benchmark file, copied as it is, with the attribute
                           `command` holding the benchmark program's command line; and the cells tables of the
                           train scenarios (repro/train_cells.py), written from their columns
    /train/<run>           each training run's group (configuration attributes, steps and eval tables), copied from
    /memory/<run>          the file `fp4moe train` wrote, with the attributes `command` (its command line) and
                           `repro_scenarios` (the scenarios whose cells read it, space-separated)
    /repro/<scenario>      row, paper, paper_source, ours, ratio, unit, note, paper_value, count (repro/ours.py),
                           with the scenario's description as attributes

Written under a temporary name and renamed (reports/output_path.py), so a failure never leaves a half-written run
file; a run file path that is one of the files merged, or not a regular file, is refused.
"""

import h5py

from reports import output_path, result_file
from repro.ours import REPRO_COLUMNS


class MergeError(Exception):
    """A benchmark file that cannot be merged (unreadable, other schema, no /bench table, a table seen twice)."""


def _copy_bench_tables(src, src_path, out):
    bench = out.require_group("bench")
    names = []
    if "bench" not in src:
        raise MergeError(f"'{src_path}' holds no /bench group")
    command = result_file.text(src.attrs.get("command", ""))
    for name in src["bench"]:
        if name in bench:
            raise MergeError(f"/bench/{name} appears in more than one benchmark file (again in '{src_path}')")
        src.copy(src["bench"][name], bench, name=name)
        result_file.set_attribute(bench[name], "command", str(command))
        names.append(name)
    if not names:
        raise MergeError(f"'{src_path}' holds an empty /bench group")
    return names


def _copy_train_run(src_path, run, scenarios, out, first):
    """Copies /train/<run> and /memory/<run> of one `fp4moe train` result file; the root attributes too when
    `first`. Returns the paths copied."""
    try:
        src = h5py.File(src_path, "r")
    except OSError as e:
        raise MergeError(f"cannot read training result file '{src_path}': {e}") from None
    copied = []
    with src:
        try:
            result_file.check_schema(src_path, src)
        except result_file.SchemaError as e:
            raise MergeError(str(e)) from None
        if f"train/{run}" not in src:
            raise MergeError(f"'{src_path}' holds no /train/{run}")
        if first:
            for k, v in result_file.root_attributes(src).items():
                result_file.set_attribute(out, k, v)
        command = str(result_file.text(src.attrs.get("command", "")))
        for kind in ("train", "memory"):
            if f"{kind}/{run}" not in src:
                continue
            if f"{kind}/{run}" in out:
                raise MergeError(f"/{kind}/{run} appears in more than one training result file (again in "
                                 f"'{src_path}')")
            src.copy(src[f"{kind}/{run}"], out.require_group(kind), name=run)
            result_file.set_attribute(out[f"{kind}/{run}"], "command", command)
            result_file.set_attribute(out[f"{kind}/{run}"], "repro_scenarios", scenarios)
            copied.append(f"/{kind}/{run}")
    return copied


def merge_run(path, bench_files, repro_tables, root_attributes=None, tables=(), train_runs=()):
    """Writes the run file `path`.

    bench_files: benchmark result files in order; the first gives the root attributes.
    repro_tables: list of (scenario name, rows as repro/ours.py repro_rows() returns them, {attribute: value}).
    root_attributes: {name: str | int | float} set on the root after the copied ones (replacing them).
    tables: list of (table path, [(column, kind, values)], {attribute: value}) written as they are (the train
    scenarios' cells tables, "/bench/<family>").
    train_runs: list of (result file of `fp4moe train`, run name, scenario names) whose /train/<run> and
    /memory/<run> are copied; without benchmark files the first gives the root attributes.
    At least one benchmark file, table or training run is needed. Returns the list of tables and groups copied.
    Raises MergeError, output_path.OutputPathError (`path` is one of the files merged or not a regular file) or
    OSError, and leaves no file behind."""
    if not bench_files and not tables and not train_runs:
        raise MergeError("no benchmark result file to merge")
    copied = []
    with output_path.atomic(path, list(bench_files) + [p for p, _, _ in train_runs]) as tmp:
        with h5py.File(tmp, "w") as out:
            if not bench_files and not train_runs:
                result_file.set_attribute(out, "schema_version", result_file.SCHEMA_VERSION)
            for i, bench_path in enumerate(bench_files):
                try:
                    src = h5py.File(bench_path, "r")
                except OSError as e:
                    raise MergeError(f"cannot read benchmark file '{bench_path}': {e}") from None
                with src:
                    try:
                        result_file.check_schema(bench_path, src)
                    except result_file.SchemaError as e:
                        raise MergeError(str(e)) from None
                    if i == 0:
                        for k, v in result_file.root_attributes(src).items():
                            result_file.set_attribute(out, k, v)
                    copied += [f"/bench/{n}" for n in _copy_bench_tables(src, bench_path, out)]
            for i, (train_path, run, scenarios) in enumerate(train_runs):
                copied += _copy_train_run(train_path, run, scenarios, out, first=not bench_files and i == 0)
            for table_path, columns, attrs in tables:
                if table_path in out:
                    raise MergeError(f"{table_path} is both a benchmark's table and a scenario's cells table")
                result_file.write_table(out, table_path, columns, attrs)
                copied.append(table_path)
            for k, v in (root_attributes or {}).items():
                result_file.set_attribute(out, k, v)
            for name, rows, attrs in repro_tables:
                columns = [(c, kind, [r[c] for r in rows]) for c, kind in REPRO_COLUMNS]
                result_file.write_table(out, f"/repro/{name}", columns, attrs)
    return copied
