"""Our value of each scenario row, computed from the benchmark's /bench/<family> table (a pandas DataFrame), and
the /repro/<scenario> table that puts it beside the published one.

A selection keeps the rows whose cells match every `where` regular expression in full (cells compared as text)
and takes one column; rows where that column is not a finite number are dropped (NaN marks "does not apply" in
the bench tables). A ratio joins the numerator and denominator selections on the `match` columns and divides (or
combines them as the rule's `combine` says: difference, percent_change, percent_reduction).
The aggregate then reduces the values to one number: geomean (values must be > 0), median, mean, min, max, or
single (exactly one value, else nothing); over seeds (repro/stats.py): paired_mean (the mean of the per-seed
combinations, with its 95% t-interval, the denominator's seed-to-seed spread and the verdict "within noise" when
the interval contains 0) and sd (the sample sd of the values: a noise floor).

Tables of training cells (kind = "train", repro/train_cells.py) carry `status` and `note` columns: the notes of
the cells a rule selects (OOM at the budget, not run and why, a reduced shape) are carried into the row's note, so
that a row without a value says why.
"""

import math
import re

import numpy as np
import pandas as pd

from repro import ladder_metric, stats
from repro.scenario import paper_value

# Columns computed from the stored ones (DataFrame -> Series).
DERIVED = {
    # Bytes of one launch: GB/s x microseconds (the minimal traffic the benchmark counted).
    "bytes": lambda df: df["gbps"] * df["time_us"] * 1e3,
    # Training cells: the measured peak in % of an 80 GiB card whether or not the cell fit its budget (a cell that
    # did not fit was measured again without it; pct_of_80_gib is NaN for it).
    "peak_pct_of_80_gib": lambda df: pd.to_numeric(df["peak_total_gib"], errors="coerce") * 100.0 / 80.0,
    "act_pct_of_80_gib": lambda df: pd.to_numeric(df["peak_act_gib"], errors="coerce") * 100.0 / 80.0,
}

COMBINE = {
    "ratio": lambda n, d: n / d,
    "difference": lambda n, d: n - d,
    "percent_change": lambda n, d: (n / d - 1.0) * 100.0,
    "percent_reduction": lambda n, d: (1.0 - n / d) * 100.0,
}

REPRO_COLUMNS = [("row", "str"), ("paper", "str"), ("paper_source", "str"), ("ours", "f64"), ("ratio", "f64"),
                 ("unit", "str"), ("note", "str"), ("paper_value", "f64"), ("count", "i64"),
                 # over seeds (aggregate paired_mean or sd; NaN and "" otherwise): the 95% t-interval of ours, the
                 # baseline's seed-to-seed spread, and "within noise" / "outside noise" / "1 seed: no interval"
                 ("ci_low", "f64"), ("ci_high", "f64"), ("spread", "str"), ("verdict", "str")]


class RuleError(Exception):
    """A rule that names a column the table does not have."""


def _column(df, name):
    if name in df.columns:
        return pd.to_numeric(df[name], errors="coerce")
    if name in DERIVED:
        try:
            return DERIVED[name](df)
        except KeyError as e:
            raise RuleError(f"derived column '{name}' needs column {e} (the table has: {', '.join(df.columns)})")
    raise RuleError(f"no column '{name}' (the table has: {', '.join(df.columns)}; derived: {', '.join(DERIVED)})")


def where_mask(df, where):
    """Boolean Series: the rows whose cells match every regular expression of `where` in full."""
    mask = pd.Series(True, index=df.index)
    for col, pattern in where.items():
        if col not in df.columns:
            raise RuleError(f"where: no column '{col}' (the table has: {', '.join(df.columns)})")
        rx = re.compile(pattern)
        mask &= df[col].astype(str).map(lambda v: rx.fullmatch(v) is not None)
    return mask


def select(df, sel):
    """DataFrame of the rows matching sel.where, with the value column as `value` (finite values only)."""
    mask = where_mask(df, sel.where)
    out = df[mask].copy()
    out["value"] = _column(df, sel.column)[mask].astype(float)
    return out[np.isfinite(out["value"])]


def values_of(df, rule):
    """The list of values a rule aggregates."""
    if rule.value is not None:
        return select(df, rule.value)["value"].tolist()
    joined = joined_pairs(df, rule)
    return COMBINE[rule.combine](joined["value_num"], joined["value_den"]).tolist()


def joined_pairs(df, rule):
    """DataFrame of the numerator and denominator values (value_num, value_den) joined on rule.match (zero
    denominators dropped unless the rule takes a difference)."""
    num, den = select(df, rule.numerator), select(df, rule.denominator)
    for m in rule.match:
        if m not in df.columns:
            raise RuleError(f"match: no column '{m}' (the table has: {', '.join(df.columns)})")
    if rule.match:
        joined = num.merge(den, on=rule.match, suffixes=("_num", "_den"))
    else:
        if len(num) != 1 or len(den) != 1:
            return pd.DataFrame({"value_num": [], "value_den": []})
        joined = pd.DataFrame({"value_num": num["value"].values, "value_den": den["value"].values})
    if rule.combine != "difference":
        joined = joined[(joined["value_den"] != 0)]
    return joined


def over_seeds(df, rule):
    """(ours, ci_low, ci_high, spread, verdict) of an aggregate over seeds (repro/stats.py):
    paired_mean  the mean of the per-seed combinations with its 95% t-interval; the spread of the denominator
                 over the same seeds ("<denominator's where> sd X (Y% of M), n = k seeds"); the verdict
    sd           the sample sd of the selected values (NaN with one); the spread with its relative sd and n
    NaNs and "" when nothing was selected."""
    none = (math.nan, math.nan, math.nan, "", "")
    if rule.aggregate == "sd":
        values = [v for v in select(df, rule.value)["value"].tolist() if math.isfinite(v)]
        if not values:
            return none
        s = stats.spread(values)
        return s.sd, math.nan, math.nan, s.text(), ""
    joined = joined_pairs(df, rule)
    if joined.empty:
        return none
    diffs = COMBINE[rule.combine](joined["value_num"], joined["value_den"]).tolist()
    p = stats.interval(diffs)
    base = " ".join(str(v) for v in rule.denominator.where.values()) or rule.denominator.column
    return p.mean, p.low, p.high, stats.spread(joined["value_den"].tolist()).text(base), p.verdict


def token_overhead(df, rule):
    """(ours, ci_low, ci_high, spread, verdict, count) of a token_overhead rule (repro/ladder_metric.py): the cells
    the numerator selects (an arm) against those the denominator selects (the baseline), paired on rule.match (which
    includes "seed"), each with status ok and a non-empty eval_curve whose last evaluation is at the run's tokens
    (column tokens, where positive: a run stopped early is left out, not cut at a wrong budget); ours is the mean overhead in % over the seeds that reached
    the target (NaN when none did), the verdict the arm's text (interval, not reached, diverged). All NaN and ""
    when no pair is selected. Raises RuleError for a rule without the eval_curve column, and for curves the metric
    rejects (naming why)."""
    for sel in (rule.numerator, rule.denominator):
        if sel.column != "eval_curve":
            raise RuleError(f"token_overhead reads the column eval_curve, not '{sel.column}'")
    if "eval_curve" not in df.columns:
        raise RuleError(f"no column 'eval_curve' (the table has: {', '.join(df.columns)})")
    for m in rule.match:
        if m not in df.columns:
            raise RuleError(f"match: no column '{m}' (the table has: {', '.join(df.columns)})")
    def finished(sel):  # cells that ran their whole schedule: status ok, the curve ending at the run's tokens
        rows = df[where_mask(df, sel.where) & (df["eval_curve"].astype(str).str.strip() != "")]
        if "status" in rows.columns:
            rows = rows[rows["status"].astype(str) == "ok"]
        if "tokens" in rows.columns:
            last = rows["eval_curve"].map(lambda c: float(str(c).split()[-1].split(":")[0]))
            tokens = pd.to_numeric(rows["tokens"], errors="coerce")
            rows = rows[~(tokens > 0) | (last == tokens)]
        return rows

    num, den = finished(rule.numerator), finished(rule.denominator)
    joined = num.merge(den, on=rule.match, suffixes=("_num", "_den"))
    if joined.empty:
        return math.nan, math.nan, math.nan, "", "", 0
    seeds = joined["seed"] if "seed" in joined.columns else range(len(joined))
    try:
        arm, targets = ladder_metric.arm_from_cells(dict(zip(seeds, joined["eval_curve_den"])),
                                                    dict(zip(seeds, joined["eval_curve_num"])))
    except ValueError as e:
        raise RuleError(f"token overhead: {e}")
    base = " ".join(str(v) for v in rule.denominator.where.values())
    p = arm.interval
    ours, low, high = (p.mean, p.low, p.high) if p is not None else (math.nan, math.nan, math.nan)
    return ours, low, high, targets.text(f"{base} loss at T"), arm.text(), len(joined)


def cell_notes(df, rule):
    """The notes of the training cells a rule selects (status and note columns; [] for a benchmark table), one
    entry per distinct note: "bf16 mla_up_proj v3, fp8 mla_up_proj v3: OOM at 80 GiB ..." (the policy "config", a
    config's own recompute setting, left out of the names). Raises RuleError."""
    if df is None or not {"status", "note", "recipe", "case", "shape"} <= set(df.columns):
        return []
    sels = [rule.value] if rule.value is not None else [rule.numerator, rule.denominator]
    by_note = {}
    for sel in sels:
        for _, r in df[where_mask(df, sel.where)].iterrows():
            if str(r["note"]).strip():
                ids = by_note.setdefault(str(r["note"]).strip(), [])
                cell = " ".join(str(x) for x in (r["recipe"], r["case"], r["shape"]) if x != "config")
                if cell not in ids:
                    ids.append(cell)
    return [f"{', '.join(ids)}: {note}" for note, ids in by_note.items()]


def matched_count(df, rule):
    """How many table rows the rule's selections match, values aside (0 when a column is missing)."""
    sels = [rule.value] if rule.value is not None else [rule.numerator, rule.denominator]
    try:
        return sum(int(where_mask(df, sel.where).sum()) for sel in sels)
    except RuleError:
        return 0


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
    if how in ("single", "paired_mean", "sd", "token_overhead") or not values:
        return ""
    return f"{how} of {len(values)} rows, {min(values):.3g} to {max(values):.3g}"


def repro_rows(scenario, df):
    """The /repro/<scenario> table as a list of dicts with the REPRO_COLUMNS keys. df: the benchmark's table, or
    None when the benchmark wrote none (every ours is then NaN)."""
    out = []
    for r in scenario.rows:
        notes = [r.note] if r.note else []
        values = []
        cells = []
        if df is None:
            notes.append("not measured: the benchmark wrote no table")
        else:
            try:
                values = [] if r.ours.aggregate == "token_overhead" else values_of(df, r.ours)
                cells = cell_notes(df, r.ours)
            except RuleError as e:
                notes.append(f"not computed: {e}")
        seeds = (math.nan, math.nan, math.nan, "", "")
        if r.ours.aggregate == "token_overhead":
            ours = math.nan
            if df is not None:
                try:
                    *seeds, pairs = token_overhead(df, r.ours)
                    ours = seeds[0]
                    values = [ours] * pairs  # one per seed pair: the count column
                except RuleError as e:
                    notes.append(f"not computed: {e}")
        elif r.ours.aggregate in ("paired_mean", "sd"):
            ours = math.nan
            if values:
                seeds = over_seeds(df, r.ours)
                ours = seeds[0]
        else:
            ours = aggregate(values, r.ours.aggregate)
        if df is not None and not values and not (cells and matched_count(df, r.ours)):
            notes.append("not measured at this scale (no matching rows)")
        elif r.ours.aggregate == "single" and len(values) != 1 and values:
            notes.append(f"not computed: {len(values)} rows match a single-row rule")
        else:
            spread = _spread_note(values, r.ours.aggregate)
            if spread:
                notes.append(spread)
        notes += cells
        pv = paper_value(r.paper)
        ratio = ours / pv if r.comparable and math.isfinite(ours) and math.isfinite(pv) and pv != 0 else math.nan
        if not r.comparable:
            notes.append("no ratio: not the same measurement")
        out.append({"row": r.row, "paper": r.paper, "paper_source": r.paper_source, "ours": ours, "ratio": ratio,
                    "unit": r.unit, "note": "; ".join(notes), "paper_value": pv, "count": len(values),
                    "ci_low": seeds[1], "ci_high": seeds[2], "spread": seeds[3], "verdict": seeds[4]})
    return out
