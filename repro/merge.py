"""One run file from the benchmark programs' result files and the reproduced tables (DESIGN.md "Results").

    /                      root attributes of the first benchmark file (schema_version, git_sha, date, gpu, ...),
                           `command` replaced by the reproduction's own, plus any extra given (e.g. scale)
    /bench/<family>        every table under /bench of each benchmark file, copied as it is, with the attribute
                           `command` holding the benchmark program's command line
    /repro/<scenario>      row, paper, paper_source, ours, ratio, unit, note, paper_value, count (repro/ours.py),
                           with the scenario's description as attributes

Written to `<path>.tmp-<pid>` and renamed, so a failure never leaves a half-written run file.
"""

import os

import h5py

from reports import result_file
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


def merge_run(path, bench_files, repro_tables, root_attributes=None):
    """Writes the run file `path`.

    bench_files: benchmark result files in order (at least one); the first gives the root attributes.
    repro_tables: list of (scenario name, rows as repro/ours.py repro_rows() returns them, {attribute: value}).
    root_attributes: {name: str | int | float} set on the root after the copied ones (replacing them).
    Returns the list of /bench tables copied. Raises MergeError (or OSError) and leaves no file behind."""
    if not bench_files:
        raise MergeError("no benchmark result file to merge")
    tmp = f"{path}.tmp-{os.getpid()}"
    copied = []
    try:
        with h5py.File(tmp, "w") as out:
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
            for k, v in (root_attributes or {}).items():
                result_file.set_attribute(out, k, v)
            for name, rows, attrs in repro_tables:
                columns = [(c, kind, [r[c] for r in rows]) for c, kind in REPRO_COLUMNS]
                result_file.write_table(out, f"/repro/{name}", columns, attrs)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return copied
