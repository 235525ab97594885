"""Scenario files: one per reproduced paper table (repro/scenarios/<name>.toml, read with tomllib).

A scenario names the benchmark program that measures it, what that program's table is called in the result file,
its budget and benchmark filter per scale, and the rows of the table with the published value beside a rule that
computes ours from the benchmark's table:

    title = "..."                         # one line
    benchmark = "bench_convert"           # program in <build>/benchmarks/, run with --h5 PATH
    family = "convert"                    # it writes the table /bench/<family>
    peer = "benchmarks/peers/x_torch.py"  # optional: a peer program (Python, run after the benchmark with --h5 of
    peer_family = "x_torch"               #   the same file and --filter REGEX) adding /bench/<peer_family>; its
                                          #   rows join the benchmark's for the rules below (repro/run.py)
    [budget_gpu_minutes]                  # wall-clock GPU-minutes per scale (numbers > 0)
    smoke = 3
    default = 15
    full = 15
    [filter]                              # --benchmark_filter per scale; "" runs every case
    smoke = '^copy/'
    default = ""
    full = ""                             # full: everything the scenario has (today the same as default)

    [[rows]]                              # one or more
    row = "what is compared"
    paper = "1.6-1.9"                     # as published: "", a number, "~N" or a range "A-B"
    paper_source = "P1: ..."              # where the value comes from (never empty; "none: ..." without one)
    unit = "x"
    note = "..."                          # optional
    comparable = true                     # optional; false: ours measures something else, no ratio is given
    [rows.ours]                           # how ours is computed from the /bench/<family> table (repro/ours.py)
    aggregate = "geomean"                 # geomean, median, mean, min, max, or single (exactly one row)
    column = "speedup"                    # a column of the table, or a derived one (repro/ours.py DERIVED)
    where = { case = "mxfp4_row_to_fp8_row" }   # column -> regular expression matching the whole cell
    # or a ratio of two selections, joined on the `match` columns, then aggregated:
    # match = ["shape"]
    # [rows.ours.numerator]   column = "bytes", where = {...}
    # [rows.ours.denominator] column = "bytes", where = {...}

load() checks all of this and raises ScenarioError naming the file and what was wrong.
"""

import math
import os
import re
import tomllib
from dataclasses import dataclass, field

SCALES = ("smoke", "default", "full")
AGGREGATES = ("geomean", "median", "mean", "min", "max", "single")
_NUMBER = r"[0-9]+(?:\.[0-9]+)?"


class ScenarioError(Exception):
    """A scenario file that cannot be read or does not follow the format above."""


@dataclass
class Selection:
    column: str
    where: dict = field(default_factory=dict)  # column -> regular expression (full match)


@dataclass
class OursRule:
    aggregate: str
    value: Selection = None        # a plain selection, or
    numerator: Selection = None    # a ratio of two selections
    denominator: Selection = None
    match: list = field(default_factory=list)


@dataclass
class Row:
    row: str
    paper: str
    paper_source: str
    unit: str
    ours: OursRule
    note: str = ""
    comparable: bool = True


@dataclass
class Scenario:
    name: str          # the file's stem
    path: str
    title: str
    benchmark: str
    family: str
    budget_gpu_minutes: dict
    filter: dict
    rows: list
    peer: str = ""         # path of the peer program relative to the repository root ("" without one)
    peer_family: str = ""  # its table under /bench


def paper_value(text):
    """The number a published value stands for: "1.5" -> 1.5, "~3" -> 3.0, "1.43-1.53" -> 1.48 (the middle of the
    range); NaN for "" or anything else."""
    t = text.strip()
    m = re.fullmatch(rf"~?\s*({_NUMBER})", t)
    if m:
        return float(m.group(1))
    m = re.fullmatch(rf"({_NUMBER})\s*-\s*({_NUMBER})", t)
    if m:
        return (float(m.group(1)) + float(m.group(2))) / 2
    return math.nan


def _fail(path, what):
    raise ScenarioError(f"{os.path.basename(path)}: {what}")


def _string(path, table, key, where, allow_empty=False):
    v = table.get(key)
    if not isinstance(v, str) or (not allow_empty and not v.strip()):
        _fail(path, f"{where}'{key}' must be a{'' if allow_empty else ' non-empty'} string, got {v!r}")
    return v


def _per_scale(path, doc, key, kind):
    t = doc.get(key)
    if not isinstance(t, dict):
        _fail(path, f"[{key}] must be a table with keys {', '.join(SCALES)}")
    out = {}
    for s in SCALES:
        v = t.get(s)
        if kind == "budget":
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                _fail(path, f"[{key}] {s} must be a number of GPU-minutes > 0, got {v!r}")
        else:
            if not isinstance(v, str):
                _fail(path, f"[{key}] {s} must be a string (a --benchmark_filter regular expression, \"\" for all)")
            try:
                re.compile(v)
            except re.error as e:
                _fail(path, f"[{key}] {s}: not a regular expression ({e}): {v!r}")
        out[s] = v
    unknown = sorted(set(t) - set(SCALES))
    if unknown:
        _fail(path, f"[{key}] has unknown scales {unknown}; the scales are {', '.join(SCALES)}")
    return out


def _selection(path, t, where):
    if not isinstance(t, dict):
        _fail(path, f"{where} must be a table with 'column' and 'where'")
    column = _string(path, t, "column", where + " ")
    cond = t.get("where", {})
    if not isinstance(cond, dict) or not all(isinstance(v, str) for v in cond.values()):
        _fail(path, f"{where} 'where' must map column names to regular expressions (strings)")
    for k, v in cond.items():
        try:
            re.compile(v)
        except re.error as e:
            _fail(path, f"{where} where.{k}: not a regular expression ({e}): {v!r}")
    return Selection(column, dict(cond))


def _ours(path, t, where):
    if not isinstance(t, dict):
        _fail(path, f"{where}: [rows.ours] is missing")
    agg = t.get("aggregate")
    if agg not in AGGREGATES:
        _fail(path, f"{where}: ours.aggregate must be one of {', '.join(AGGREGATES)}, got {agg!r}")
    if "column" in t:
        if "numerator" in t or "denominator" in t:
            _fail(path, f"{where}: ours has both 'column' and a numerator/denominator; give one of the two")
        return OursRule(agg, value=_selection(path, t, f"{where} ours"))
    if "numerator" not in t or "denominator" not in t:
        _fail(path, f"{where}: ours needs 'column' (and 'where'), or 'numerator' and 'denominator'")
    match = t.get("match", [])
    if not isinstance(match, list) or not all(isinstance(m, str) for m in match):
        _fail(path, f"{where}: ours.match must be a list of column names")
    return OursRule(agg, numerator=_selection(path, t["numerator"], f"{where} ours.numerator"),
                    denominator=_selection(path, t["denominator"], f"{where} ours.denominator"), match=match)


def load(path):
    """Reads and checks one scenario file; returns a Scenario."""
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as e:
        _fail(path, f"cannot read: {e.strerror}")
    except tomllib.TOMLDecodeError as e:
        _fail(path, f"not valid TOML: {e}")
    rows = doc.get("rows")
    if not isinstance(rows, list) or not rows:
        _fail(path, "needs at least one [[rows]] entry")
    parsed = []
    for i, r in enumerate(rows, 1):
        where = f"row {i}: "
        comparable = r.get("comparable", True)
        if not isinstance(comparable, bool):
            _fail(path, f"{where}'comparable' must be true or false")
        parsed.append(Row(row=_string(path, r, "row", where), paper=_string(path, r, "paper", where, allow_empty=True),
                          paper_source=_string(path, r, "paper_source", where), unit=_string(path, r, "unit", where),
                          ours=_ours(path, r.get("ours"), f"row {i}"),
                          note=_string(path, r, "note", where, allow_empty=True) if "note" in r else "",
                          comparable=comparable))
    benchmark = _string(path, doc, "benchmark", "")
    if not re.fullmatch(r"bench_[a-z0-9_]+", benchmark):
        _fail(path, f"'benchmark' must name a program bench_<family> in the build's benchmarks/, got {benchmark!r}")
    family = _string(path, doc, "family", "")
    if not re.fullmatch(r"[a-z0-9_]+", family):
        _fail(path, f"'family' must be the table name under /bench (lower case, digits, _), got {family!r}")
    peer, peer_family = doc.get("peer", ""), doc.get("peer_family", "")
    if peer or peer_family:
        if not isinstance(peer, str) or not re.fullmatch(r"benchmarks/peers/[a-z0-9_]+\.py", peer):
            _fail(path, f"'peer' must name a program benchmarks/peers/<name>.py, got {peer!r}")
        if not isinstance(peer_family, str) or not re.fullmatch(r"[a-z0-9_]+", peer_family) or peer_family == family:
            _fail(path, f"'peer_family' must be the peer's table name under /bench (lower case, digits, _; not the "
                        f"benchmark's own '{family}'), got {peer_family!r}")
    return Scenario(name=os.path.splitext(os.path.basename(path))[0], path=path, title=_string(path, doc, "title", ""),
                    benchmark=benchmark, family=family,
                    budget_gpu_minutes=_per_scale(path, doc, "budget_gpu_minutes", "budget"),
                    filter=_per_scale(path, doc, "filter", "filter"), rows=parsed, peer=peer,
                    peer_family=peer_family)


def load_all(folder, only=None):
    """Every <folder>/*.toml in name order (or those whose stem is in `only`). Raises ScenarioError for a bad file,
    an unknown name in `only`, or an empty folder."""
    try:
        names = sorted(f for f in os.listdir(folder) if f.endswith(".toml"))
    except OSError as e:
        raise ScenarioError(f"cannot list scenario folder '{folder}': {e.strerror}")
    stems = [os.path.splitext(n)[0] for n in names]
    if only:
        unknown = [o for o in only if o not in stems]
        if unknown:
            raise ScenarioError(f"no scenario {', '.join(unknown)} in '{folder}' (there: {', '.join(stems) or 'none'})")
        names = [n for n, s in zip(names, stems) if s in only]
    if not names:
        raise ScenarioError(f"no scenario files (*.toml) in '{folder}'")
    return [load(os.path.join(folder, n)) for n in names]
