"""Our value of each scenario row, computed from the benchmark's /bench/<family> table (a pandas DataFrame), and
the /repro/<scenario> table that puts it beside the published one.

A selection keeps the rows whose cells match every `where` regular expression in full (cells compared as text)
and takes one column; rows where that column is not a finite number are dropped (NaN marks "does not apply" in
the bench tables). A ratio joins the numerator and denominator selections on the `match` columns and divides.
The aggregate then reduces the values to one number: geomean (values must be > 0), median, mean, min, max, or
single (exactly one value, else nothing).
"""

import math
import re

import numpy as np
import pandas as pd

from repro.scenario import paper_value

# Columns computed from the stored ones (DataFrame -> Series).
DERIVED = {
    # Bytes of one launch: GB/s x microseconds (the minimal traffic the benchmark counted).
    "bytes": lambda df: df["gbps"] * df["time_us"] * 1e3,
}

REPRO_COLUMNS = [("row", "str"), ("paper", "str"), ("paper_source", "str"), ("ours", "f64"), ("ratio", "f64"),
                 ("unit", "str"), ("note", "str"), ("paper_value", "f64"), ("count", "i64")]


class RuleError(Exception):
    """A rule that names a column the table does not have."""


def _column(df, name):
    if name in df.columns:
        return pd.to_numeric(df[name], errors="coerce")
    if name in DERIVED:
        return DERIVED[name](df)
    raise RuleError(f"no column '{name}' (the table has: {', '.join(df.columns)}; derived: {', '.join(DERIVED)})")


def select(df, sel):
    """DataFrame of the rows matching sel.where, with the value column as `value` (finite values only)."""
    mask = pd.Series(True, index=df.index)
    for col, pattern in sel.where.items():
        if col not in df.columns:
            raise RuleError(f"where: no column '{col}' (the table has: {', '.join(df.columns)})")
        rx = re.compile(pattern)
        mask &= df[col].astype(str).map(lambda v: rx.fullmatch(v) is not None)
    out = df[mask].copy()
    out["value"] = _column(df, sel.column)[mask].astype(float)
    return out[np.isfinite(out["value"])]


def values_of(df, rule):
    """The list of values a rule aggregates."""
    if rule.value is not None:
        return select(df, rule.value)["value"].tolist()
    num, den = select(df, rule.numerator), select(df, rule.denominator)
    for m in rule.match:
        if m not in df.columns:
            raise RuleError(f"match: no column '{m}' (the table has: {', '.join(df.columns)})")
    if rule.match:
        joined = num.merge(den, on=rule.match, suffixes=("_num", "_den"))
    else:
        if len(num) != 1 or len(den) != 1:
            return []
        joined = pd.DataFrame({"value_num": num["value"].values, "value_den": den["value"].values})
    joined = joined[(joined["value_den"] != 0)]
    return (joined["value_num"] / joined["value_den"]).tolist()


def aggregate(values, how):
    """One number from `values` (NaN when there is nothing to aggregate)."""
    v = [float(x) for x in values if math.isfinite(x)]
    if how == "single":
        return v[0] if len(v) == 1 else math.nan
    if not v:
        return math.nan
    if how == "geomean":
        if any(x <= 0 for x in v):
            return math.nan
        return math.exp(sum(math.log(x) for x in v) / len(v))
    return float({"median": np.median, "mean": np.mean, "min": np.min, "max": np.max}[how](v))


def _spread_note(values, how):
    if how == "single" or not values:
        return ""
    return f"{how} of {len(values)} rows, {min(values):.3g} to {max(values):.3g}"


def repro_rows(scenario, df):
    """The /repro/<scenario> table as a list of dicts with the REPRO_COLUMNS keys. df: the benchmark's table, or
    None when the benchmark wrote none (every ours is then NaN)."""
    out = []
    for r in scenario.rows:
        notes = [r.note] if r.note else []
        values = []
        if df is None:
            notes.append("not measured: the benchmark wrote no table")
        else:
            try:
                values = values_of(df, r.ours)
            except RuleError as e:
                notes.append(f"not computed: {e}")
        ours = aggregate(values, r.ours.aggregate)
        if df is not None and not values:
            notes.append("not measured at this scale (no matching rows)")
        elif r.ours.aggregate == "single" and len(values) != 1 and values:
            notes.append(f"not computed: {len(values)} rows match a single-row rule")
        else:
            spread = _spread_note(values, r.ours.aggregate)
            if spread:
                notes.append(spread)
        pv = paper_value(r.paper)
        ratio = ours / pv if r.comparable and math.isfinite(ours) and math.isfinite(pv) and pv != 0 else math.nan
        if not r.comparable:
            notes.append("no ratio: not the same measurement")
        out.append({"row": r.row, "paper": r.paper, "paper_source": r.paper_source, "ours": ours, "ratio": ratio,
                    "unit": r.unit, "note": "; ".join(notes), "paper_value": pv, "count": len(values)})
    return out
