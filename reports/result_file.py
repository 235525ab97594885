"""Reading and writing fp4moe HDF5 result files from Python, in the layout of results/h5_file.h.

    /                      root attributes: schema_version (int64), git_sha, date, gpu, driver, cuda, cublaslt,
                           nccl, host, command (UTF-8 strings); results/run_info.h
    /<group>/.../<table>   one group per table: one 1-D dataset per column (float64, int64 or variable-length
                           UTF-8 strings, all of the table's length), the group attribute `columns` (the column
                           order, variable-length UTF-8 strings) and the table's own attributes

SCHEMA_VERSION is the layout this code reads and writes; it must equal kResultSchemaVersion in
results/run_info.h (tests/python/test_repro.py checks that). check_schema() refuses any other version.
"""

import math
import os

import h5py
import numpy as np
import pandas as pd

from reports import output_path

SCHEMA_VERSION = 1
ROOT_ATTRIBUTES = ["schema_version", "git_sha", "date", "gpu", "driver", "cuda", "cublaslt", "nccl", "host", "command"]
STR = h5py.string_dtype("utf-8")
# Columns the reports compute with, numbers (float64 or int64) in every table that has them: the benchmark columns
# of benchmarks/bench_util.cuh, the /repro columns of repro/ours.py, the training steps and eval tables and the
# cells tables (repro/scenario.py TRAIN_COLUMNS), the step profile (trainer/train/step_profile.h).
NUMERIC_COLUMNS = frozenset([
    "time_us", "tflops", "gbps", "fraction_of_copy_bw", "speedup", "fraction_of_dense",
    "ours", "ratio", "paper_value", "count",
    "step", "steps", "tokens", "loss", "val_loss", "train_loss", "best_val_loss", "lr", "grad_norm", "tokens_per_s",
    "mfu", "skipped", "peak_act_gib", "peak_total_gib", "pct_of_80_gib", "pct_of_141_gib", "elapsed_s", "exit_code",
    "first_step", "last_step", "ms_per_step", "share", "calls_per_step"])
# Numeric columns that count (steps, tokens, skipped steps, a process's exit code): integers, or floats that hold
# whole numbers only (no NaN), so that reports may cast them to int.
INTEGER_COLUMNS = frozenset(["step", "steps", "tokens", "skipped", "exit_code", "first_step", "last_step"])
# Columns that name a row (the keys reports/compare.py matches rows by): strings in every table that has them.
KEY_COLUMNS = frozenset(["case", "shape", "recipe", "row", "tuning", "direction"])
# Tables renamed since older run files were written, {former path: current path}: bench_convert became bench_quant
# (kernels/quant), and its table /bench/convert became /bench/quant. Run files keep the name they were written with;
# readers that match tables across files (reports/compare.py) read the former name as the current one.
RENAMED_TABLES = {"/bench/convert": "/bench/quant"}


class SchemaError(Exception):
    """A result file whose schema_version is missing or not SCHEMA_VERSION."""


class TableError(Exception):
    """A table group that does not have the layout of results/h5_file.h (message: file, table, column, what)."""


def text(v):
    """An attribute value as plain Python (bytes decoded, numpy scalars unwrapped). Raises UnicodeError for bytes
    that are not UTF-8 and for a str that holds undecodable bytes (h5py reads those as surrogate escapes)."""
    if isinstance(v, bytes):
        return v.decode("utf-8")
    if isinstance(v, str):
        v.encode("utf-8")
        return v
    if isinstance(v, np.generic):
        return v.item()
    return v


def attributes(obj, leave_out=()):
    """{name: value} of the attributes of an open file, group or dataset, `leave_out` left out. Raises TableError,
    naming the file, the object and the attribute, for a string attribute that is not valid UTF-8."""
    out = {}
    for k in obj.attrs:
        if k in leave_out:
            continue
        try:
            out[k] = text(obj.attrs[k])
        except UnicodeError:
            where = "root" if obj.name == "/" else obj.name
            raise TableError(f"'{obj.file.filename}' {where} attribute '{k}': not valid UTF-8, expected a UTF-8 "
                             f"string") from None
    return out


def root_attributes(f):
    """{name: value} of an open file's root attributes. Raises TableError for one that is not valid UTF-8."""
    return attributes(f)


def group_at(f, name):
    """The group `name` (e.g. "train") of an open file, or None when absent. Raises TableError when it is a
    dataset."""
    obj = f.get(name)
    if obj is not None and not isinstance(obj, h5py.Group):
        raise TableError(f"'{f.filename}' /{name}: a dataset, expected a group of tables (results/h5_file.h)")
    return obj


def _strings(ds, what):
    """A string column's values as str. Raises TableError naming `what` for a value that is not valid UTF-8."""
    values = ds[()]
    try:
        return np.array([text(v) for v in values], dtype=object)
    except UnicodeError:
        bad = next(i for i, v in enumerate(values) if not _is_utf8(v))
        raise TableError(f"{what}: row {bad} is not valid UTF-8, expected UTF-8 strings") from None


def _is_utf8(v):
    try:
        text(v)
        return True
    except UnicodeError:
        return False


def check_schema(path, f):
    """Raises SchemaError unless the open file `f` (read from `path`) has schema_version == SCHEMA_VERSION."""
    if "schema_version" not in f.attrs:
        raise SchemaError(f"'{path}' has no schema_version root attribute: it is not an fp4moe result file, or one "
                          f"older than schema version {SCHEMA_VERSION}")
    v = text(f.attrs["schema_version"])
    if not isinstance(v, int) or isinstance(v, bool):
        raise SchemaError(f"'{path}' has schema_version {v!r} stored as {type(v).__name__}, expected an int64 "
                          f"attribute (results/run_info.h)")
    if v != SCHEMA_VERSION:
        raise SchemaError(f"'{path}' has schema_version {v}; this code reads version {SCHEMA_VERSION} only "
                          f"(results/run_info.h kResultSchemaVersion): use the reports/ of the fp4moe version that "
                          f"wrote the file")


def read_table(group, required=()):
    """One table group -> DataFrame, columns in the order of its `columns` attribute. Raises TableError, naming the
    file, the table and the column, unless `columns` is a 1-D list of distinct names, holding every name of
    `required`, each naming a 1-D dataset of numbers or UTF-8 strings, all of one length, with the NUMERIC_COLUMNS
    among them numbers, the INTEGER_COLUMNS whole numbers and the KEY_COLUMNS strings."""
    where = f"'{group.file.filename}' table {group.name}"
    if not isinstance(group, h5py.Group) or "columns" not in group.attrs:
        raise TableError(f"{where}: " + ("a group" if isinstance(group, h5py.Group) else "a dataset") +
                         " without the attribute `columns`, expected a table group (results/h5_file.h)")
    columns = group.attrs["columns"]
    if np.ndim(columns) != 1 or not all(isinstance(c, (str, bytes)) and _is_utf8(c) for c in columns):
        shown = " ".join(repr(np.asarray(columns).tolist()).split())[:120]
        raise TableError(f"{where}: attribute `columns` is {shown}, expected a 1-D list of UTF-8 column names")
    columns = [text(c) for c in columns]
    twice = next((c for i, c in enumerate(columns) if c in columns[:i]), None)
    if twice is not None:
        raise TableError(f"{where} column '{twice}': named twice in the attribute `columns`, expected distinct "
                         f"column names")
    missing = next((c for c in required if c not in columns), None)
    if missing is not None:
        raise TableError(f"{where} column '{missing}': absent, expected it in every table of this kind (columns: "
                         f"{', '.join(columns)})")
    data, length = {}, None
    for c in columns:
        ds = group.get(c)
        what = f"{where} column '{c}'"
        if not isinstance(ds, h5py.Dataset):
            raise TableError(f"{what}: " + ("absent" if ds is None else "is a group") + ", expected a 1-D dataset "
                             "(the table's `columns` attribute names it)")
        if ds.ndim != 1:
            raise TableError(f"{what}: shape {ds.shape}, expected a 1-D dataset")
        is_str = h5py.check_string_dtype(ds.dtype) is not None
        if not is_str and ds.dtype.kind not in "fiu":
            raise TableError(f"{what}: dtype {ds.dtype}, expected float64, int64 or UTF-8 strings")
        if is_str and c in NUMERIC_COLUMNS:
            raise TableError(f"{what}: strings, expected numbers (float64 or int64)")
        if not is_str and c in KEY_COLUMNS:
            raise TableError(f"{what}: dtype {ds.dtype}, expected UTF-8 strings (a key column names rows)")
        if length is not None and ds.shape[0] != length[1]:
            raise TableError(f"{what}: {ds.shape[0]} rows, but column '{length[0]}' has {length[1]} (ragged "
                             f"columns), expected one length")
        length = length or (c, ds.shape[0])
        data[c] = _strings(ds, what) if is_str else ds[()]
        if c in INTEGER_COLUMNS and ds.dtype.kind == "f":
            bad = np.flatnonzero(~np.isfinite(data[c]) | (data[c] != np.round(data[c])))
            if bad.size:
                raise TableError(f"{what}: row {bad[0]} is {data[c][bad[0]]}, expected whole numbers (a count)")
    return pd.DataFrame(data, columns=columns)


def tables_under(f, prefix, required=()):
    """{"/<prefix>/<name>": DataFrame} for every table group under the group `prefix` of an open file, in name order
    (empty when the group is absent); each table read by read_table(group, required). A group that holds a dataset
    is a table and must have `columns`. Raises TableError for a malformed table and for `prefix` stored as a
    dataset."""
    tables = {}
    top = group_at(f, prefix)
    if top is not None:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset) and "columns" not in obj.parent.attrs:
                read_table(obj.parent)  # raises: a group of datasets without `columns`
            if isinstance(obj, h5py.Group) and "columns" in obj.attrs:
                tables[f"/{prefix}/{name}"] = read_table(obj, required)
        top.visititems(visit)
    return dict(sorted(tables.items()))


def current_table_names(tables):
    """`tables` ({table path: value}) with each former name of RENAMED_TABLES replaced by the current one. Raises
    TableError when a file holds a table under both names (the two cannot be told apart)."""
    out = {}
    for path, value in tables.items():
        name = RENAMED_TABLES.get(path, path)
        if name in out:
            raise TableError(f"tables {name} and {next(p for p, n in RENAMED_TABLES.items() if n == name)} hold the "
                             f"same benchmark (the second is the first's former name); expected one of them")
        out[name] = value
    return dict(sorted(out.items()))


def table_attributes(f, path):
    """{name: value} of a table group's attributes, `columns` left out. Raises TableError as attributes()."""
    return attributes(f[path], ("columns",))


def set_attribute(obj, name, value):
    """Writes one attribute as results/h5_file.h does: str -> variable-length UTF-8, int -> int64, float -> float64."""
    if isinstance(value, str):
        obj.attrs.create(name, value, dtype=STR)
    elif isinstance(value, (bool, np.bool_)):
        raise TypeError(f"attribute '{name}': booleans are not part of the result schema (use int or str)")
    elif isinstance(value, (int, np.integer)):
        obj.attrs.create(name, np.int64(value))
    elif isinstance(value, (float, np.floating)):
        obj.attrs.create(name, np.float64(value))
    else:
        raise TypeError(f"attribute '{name}': expected str, int or float, got {type(value).__name__}")


def write_table(f, path, columns, attributes=None):
    """Writes a table group at `path` of an open, writable file.

    columns: list of (name, kind, values) with kind "str", "f64" or "i64" and values of one length.
    attributes: {name: str | int | float} set on the group. Rejects mismatched lengths and unknown kinds."""
    lengths = {len(values) for _, _, values in columns}
    if len(lengths) > 1:
        raise ValueError(f"table '{path}': columns of different lengths {sorted(lengths)}")
    g = f.create_group(path)
    for name, kind, values in columns:
        if kind == "str":
            g.create_dataset(name, data=np.array([str(v) for v in values], dtype=object), dtype=STR)
        elif kind == "f64":
            g.create_dataset(name, data=np.asarray(values, dtype=np.float64).reshape(-1))
        elif kind == "i64":
            g.create_dataset(name, data=np.asarray(values, dtype=np.int64).reshape(-1))
        else:
            raise ValueError(f"table '{path}', column '{name}': kind must be str, f64 or i64, not '{kind}'")
    g.attrs.create("columns", [name for name, _, _ in columns], dtype=STR)
    for k, v in (attributes or {}).items():
        set_attribute(g, k, v)
    return g


def one_line(error):
    """An exception's message on one line (h5py's messages may span several), for "tool: what was wrong" lines."""
    return " ".join(str(error).split())


def check_readable(path):
    """Raises FileNotFoundError / IsADirectoryError with a one-line message unless `path` is an existing file, so
    that a missing run file or a folder is named plainly rather than through h5py's low-level message."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"'{path}' does not exist")
    if not os.path.isfile(path):
        raise IsADirectoryError(f"'{path}' is not a file")


def is_number(v):
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) and math.isfinite(v)


def replace_table(path, table_path, columns, attributes, new_file_root, inputs=()):
    """Adds (or replaces) the table at `table_path` (e.g. "/bench/attention_torch") in the result file `path`, or
    creates the file with the root attributes `new_file_root()` (called only then). columns and attributes as in
    write_table; inputs: other files the command read (never written over). Atomic (reports/output_path.py): the
    file is copied to a temporary name, changed there, synced and renamed over `path`, so a crash leaves the old file
    whole. Raises output_path.OutputPathError for a `path` that is an input or not a regular file, SchemaError for an
    existing file of another schema (nothing written either way)."""
    import shutil

    with output_path.atomic(path, inputs) as tmp:
        if os.path.exists(path):
            with h5py.File(path, "r") as f:
                check_schema(path, f)
            shutil.copyfile(path, tmp)
        with h5py.File(tmp, "r+" if os.path.exists(tmp) else "w") as f:
            if "schema_version" not in f.attrs:
                for k, v in new_file_root().items():
                    set_attribute(f, k, v)
            if table_path.lstrip("/") in f:
                del f[table_path.lstrip("/")]
            write_table(f, table_path, columns, attributes)


def unwritable(path, inputs=()):
    """Why the result file `path` cannot be written ("" when it can), checked before anything is measured: one of
    `inputs` (files the command reads), a folder or anything else that is not a regular file, a folder that cannot
    be created or written. Creates its folder when missing."""
    if os.path.isdir(path):
        return "is a folder, expected the path of a file to write"
    try:
        output_path.check_file(path, inputs)
    except output_path.OutputPathError as e:
        return str(e).replace(f"'{path}' ", "", 1)
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        return f"cannot create the folder '{folder}': {e.strerror}"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"the folder '{folder}' is not writable"
    return ""
