"""Scenario files: one per reproduced paper table (repro/scenarios/<name>.toml, read with tomllib).

A scenario names the benchmark program that measures it, what that program's table is called in the result file,
its budget and benchmark filter per scale, and the rows of the table with the published value beside a rule that
computes ours from the benchmark's table:

    title = "..."                         # one line
    benchmark = "bench_quant"             # program in <build>/benchmarks/, run with --h5 PATH
    family = "quant"                      # it writes the table /bench/<family>
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

A numerator/denominator rule may say how the two combine (default "ratio"):
    combine = "difference"                # numerator - denominator
    combine = "percent_change"            # (numerator / denominator - 1) x 100, e.g. a loss deviation in %
    combine = "percent_reduction"         # (1 - numerator / denominator) x 100, e.g. memory saved in %
Published values may also be signed percentages ("+0.29%", "-14.8%", "59.40%") or bounds ("<0.5", ">50%"): the
number is what paper_value() returns; "OOM" or any other text has no number.

kind = "train" (the default is "bench", above): the table is not a benchmark's but one row per training run
("cell") of `fp4moe train`, which repro/train_cells.py runs and reads back (/train/<run>/steps, /memory/<run>):

    title = "..."
    kind = "train"
    family = "train_memory"               # the cells table, stored as /bench/<family> (columns: TRAIN_COLUMNS)
    plot = "memory"                       # optional: the report's plot of the cells (memory, throughput, loss)
    [budget_gpu_minutes]                  # as above
    [steps]                               # --train.steps of every cell, per scale (integers >= 1)
    smoke = 3
    default = 5
    full = 5
    [seeds]                               # optional: --train.seed values per scale (lists of distinct integers
    smoke = [1234]                        #   >= 0); every cell runs once per seed, so that recipes compare
    default = [1234, 1235, 1236]          #   paired (same seed: same initial weights and data order); absent:
    full = [1234, 1235, 1236]             #   one run per cell with the config's own seed (seed column -1)
    [train]
    data = "synthetic"                    # synthetic (--synthetic-data) or shards (the config's token shards)
    memory_budget_gib = 80                # optional: --memory-budget of every cell (absent or 0: none)
    retry_without_budget = true           # optional: a cell over the budget runs again without it (its peaks)
    args = ["--train.eval_interval", "0"] # optional: options of every cell
    [configs]                             # name -> TOML file, relative to the repository root
    v3 = "configs/v3.toml"
    [recipes]                             # name -> the options that select it
    mxfp4 = ["--recipe.routed_experts", "mxfp4"]
    [policies]                            # optional: name -> recompute modules ([] = none); a cell without
    mla_up_proj = ["mla_up_proj"]         #   policies keeps its config's, under the name "config"
    [[cells]]                             # one or more: the grid config x recipe x policy, at the given scales
    configs = ["v3"]
    recipes = ["bf16", "mxfp4"]
    policies = ["mla_up_proj"]            # optional
    scales = ["default", "full"]
    args = ["--model.layers", "2"]        # optional: options of these cells only
    label = "v3"                          # optional: the cells' `shape` (default the config's name)
    note = "reduced shape"                # optional: carried into the cells' notes and the rows they feed

kind = "plan": the table is the layout planner's (`fp4moe plan`, repro/plan_runs.py): one row per candidate each plan
prints (per recipe its first `top`), the plans run one after the other, measuring on this GPU unless their options
say --no-measure, all sharing one stage-time cache in the run folder (<run dir>/plan/stage_times.tsv):

    title = "..."
    kind = "plan"
    family = "plan_layouts"               # the plans table, /bench/<family> (columns: PLAN_COLUMNS)
    [budget_gpu_minutes]                  # as above
    [plan]
    top = 5                               # --top of every plan: rows per recipe in the table
    [[plans]]                             # one or more
    name = "v3_h100"                      # the table's `case` (lower case, digits, _; each once)
    args = ["--model", "v3", "--gpus", "256", "--memory-gib", "80"]   # options of `fp4moe plan` (not PLAN_OPTIONS)
    scales = ["default", "full"]
    note = "..."                          # optional

A cell's options may not include those the runner sets itself (RUNNER_OPTIONS). Rules read the cells table:
case = the policy, shape = the label, recipe, seed, status ("ok", "oom", "not run", "failed") and the measured
columns.

Aggregates over seeds (repro/stats.py states the method):
    aggregate = "paired_mean"             # a numerator/denominator rule whose `match` includes "seed": the mean
                                          #   over seeds of the per-seed combination (e.g. percent_change) with
                                          #   its 95% t-interval, the denominator's seed-to-seed spread beside it,
                                          #   and "within noise" when the interval contains 0
    aggregate = "token_overhead"          # a numerator/denominator rule on the column eval_curve whose `match`
                                          #   includes "seed": the arm's (numerator's) token overhead in % to the
                                          #   baseline's (denominator's) loss at its budget, per seed, with its
                                          #   95% t-interval, not-reached and diverged seeds counted
                                          #   (repro/ladder_metric.py arm_from_cells: every run trains 1.5 x the
                                          #   budget), the baseline's spread of that loss beside it
    aggregate = "sd"                      # a column rule: the sample sd over the selected cells (the noise floor
                                          #   of a baseline over seeds), its relative sd and n in the spread

load() checks all of this and raises ScenarioError naming the file and what was wrong.
"""

import math
import os
import re
import tomllib
from dataclasses import dataclass, field

SCALES = ("smoke", "default", "full")
AGGREGATES = ("geomean", "median", "mean", "min", "max", "single", "paired_mean", "sd", "token_overhead")
PAIRED = ("paired_mean", "token_overhead")  # aggregates over a numerator and a denominator paired per seed
COMBINES = ("ratio", "difference", "percent_change", "percent_reduction")
KINDS = ("bench", "train", "plan")
PLOTS = ("", "memory", "throughput", "loss")
DATA = ("synthetic", "shards")
# Options of `fp4moe train` that repro/train_cells.py sets for every cell; a scenario may not give them.
RUNNER_OPTIONS = ("--config", "--out", "--run", "--train.steps", "--train.seed", "--memory-budget", "--synthetic-data",
                  "--recompute.modules", "--resume", "--dry-run", "--no-data-check", "--data", "--log-interval")
# The cells table of a train scenario (repro/train_cells.py writes it; rules read these columns).
TRAIN_COLUMNS = [
    ("case", "str"), ("shape", "str"), ("recipe", "str"),     # policy, label, recipe
    ("seed", "i64"),                                          # --train.seed (-1: the config's own)
    ("status", "str"), ("note", "str"), ("run", "str"),       # ok | oom | not run | failed; why; /train/<run>
    ("config", "str"), ("args", "str"), ("steps", "i64"), ("exit_code", "i64"), ("elapsed_s", "f64"),
    ("budget_gib", "f64"), ("oom_category", "str"), ("oom_request_gib", "f64"), ("oom_held_gib", "f64"),
    ("peak_total_gib", "f64"), ("peak_act_gib", "f64"), ("weights_gib", "f64"), ("grads_gib", "f64"),
    ("optimizer_gib", "f64"), ("comm_gib", "f64"), ("workspace_gib", "f64"),
    ("pct_of_80_gib", "f64"), ("pct_of_141_gib", "f64"),
    ("tokens_per_s", "f64"), ("mfu", "f64"), ("step_time_s", "f64"), ("tokens", "i64"),
    ("train_loss", "f64"), ("val_loss", "f64"), ("val_tokens", "f64"),  # val_tokens: of the last evaluation
                                                                        # (NaN: not measured)
    ("dispatch_hidden", "i64"), ("dispatch_payload_bytes", "f64"), ("dispatch_scale_bytes", "f64"),
    ("dispatch_bytes", "f64"),
    ("eval_curve", "str"),  # every evaluation, "tokens:val_loss ..." (repro/ladder_metric.py format_curve; "": none)
]
# Options of `fp4moe plan` that repro/plan_runs.py sets for every plan; a scenario may not give them.
PLAN_OPTIONS = ("--out", "--cache", "--top", "--calibrate-p1")
# The plans table of a plan scenario (repro/plan_runs.py writes it; rules read these columns). compute_ms, ep_ms and
# pp_ms are the slowest stage's per micro-batch; compute is measured, measured/tp or modelled.
PLAN_COLUMNS = [
    ("case", "str"), ("shape", "str"), ("recipe", "str"),     # plan name, layout "tp 1 pp 16 dp 16 ep 16, m 60"
    ("rank", "i64"), ("policy", "str"), ("status", "str"), ("note", "str"),   # status: ok | failed
    ("memory_gib", "f64"), ("compute_ms", "f64"), ("ep_ms", "f64"), ("pp_ms", "f64"), ("bubble", "f64"),
    ("compute", "str"), ("tokens_per_s_per_gpu", "f64"), ("measured_on", "str"),
]
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
    numerator: Selection = None    # a combination (COMBINES) of two selections
    denominator: Selection = None
    match: list = field(default_factory=list)
    combine: str = "ratio"


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
class CellGroup:
    configs: list
    recipes: list
    policies: list      # ["config"]: the config's own recompute setting
    scales: list
    args: list = field(default_factory=list)
    label: str = ""     # "" = the config's name
    note: str = ""


@dataclass
class TrainSpec:
    steps: dict                 # scale -> --train.steps
    seeds: dict                 # scale -> [--train.seed values]; [None]: the config's own seed
    data: str                   # synthetic | shards
    memory_budget_gib: float    # 0: none
    retry_without_budget: bool
    args: list
    configs: dict               # name -> path relative to the repository root
    recipes: dict               # name -> [options]
    policies: dict              # name -> [recompute modules]
    cells: list                 # [CellGroup]


@dataclass
class PlanSpec:
    top: int                    # --top of every plan
    plans: list                 # [PlanRun]


@dataclass
class PlanRun:
    name: str
    args: list
    scales: list
    note: str = ""


@dataclass
class Scenario:
    name: str          # the file's stem
    path: str
    title: str
    benchmark: str     # bench kind: the program ("" for train)
    family: str
    budget_gpu_minutes: dict
    filter: dict       # bench kind: per scale ({} for train)
    rows: list
    peer: str = ""         # path of the peer program relative to the repository root ("" without one)
    peer_family: str = ""  # its table under /bench
    kind: str = "bench"
    plot: str = ""
    train: TrainSpec = None
    plan: PlanSpec = None


def paper_value(text):
    """The number a published value stands for: "1.5" -> 1.5, "~3" -> 3.0, "1.43-1.53" -> 1.48 (the middle of the
    range), "+0.29%" -> 0.29, "-14.8%" -> -14.8, "<0.5" -> 0.5 (a bound); NaN for "", "OOM" or anything else (a
    sign needs the '%': "-3" has no number)."""
    t = text.strip()
    m = re.fullmatch(rf"([~<>]?)\s*([+-]?)\s*({_NUMBER})\s*(%?)", t)
    if m and (m.group(4) or not m.group(2)):
        return -float(m.group(3)) if m.group(2) == "-" else float(m.group(3))
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
        if "combine" in t or "match" in t:
            _fail(path, f"{where}: ours.combine and ours.match apply to a numerator and a denominator, not to 'column'")
        if agg in PAIRED:
            _fail(path, f"{where}: aggregate '{agg}' needs a numerator and a denominator (paired per seed)")
        return OursRule(agg, value=_selection(path, t, f"{where} ours"))
    if "numerator" not in t or "denominator" not in t:
        _fail(path, f"{where}: ours needs 'column' (and 'where'), or 'numerator' and 'denominator'")
    match = t.get("match", [])
    if not isinstance(match, list) or not all(isinstance(m, str) for m in match):
        _fail(path, f"{where}: ours.match must be a list of column names")
    if agg in PAIRED and "seed" not in match:
        _fail(path, f"{where}: aggregate '{agg}' pairs cells by seed: ours.match must include \"seed\", "
                    f"got {match!r}")
    if agg == "sd":
        _fail(path, f"{where}: aggregate 'sd' takes one 'column' (the spread of one quantity), not a numerator and a "
                    f"denominator")
    if agg == "token_overhead":
        for side in ("numerator", "denominator"):
            if not isinstance(t[side], dict) or t[side].get("column") != "eval_curve":
                _fail(path, f"{where}: aggregate 'token_overhead' reads the evaluation curves: ours.{side}.column must "
                            f"be \"eval_curve\"")
        if "combine" in t:
            _fail(path, f"{where}: aggregate 'token_overhead' combines the curves itself (repro/ladder_metric.py); "
                        f"ours.combine does not apply")
    combine = t.get("combine", "ratio")
    if combine not in COMBINES:
        _fail(path, f"{where}: ours.combine must be one of {', '.join(COMBINES)}, got {combine!r}")
    return OursRule(agg, numerator=_selection(path, t["numerator"], f"{where} ours.numerator"),
                    denominator=_selection(path, t["denominator"], f"{where} ours.denominator"), match=match,
                    combine=combine)


def _rows(path, doc):
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
    return parsed


def _family(path, doc):
    family = _string(path, doc, "family", "")
    if not re.fullmatch(r"[a-z0-9_]+", family):
        _fail(path, f"'family' must be the table name under /bench (lower case, digits, _), got {family!r}")
    return family


def _options(path, v, where):
    """A list of command-line words (strings) that sets none of RUNNER_OPTIONS."""
    if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
        _fail(path, f"{where} must be a list of non-empty strings (command-line words), got {v!r}")
    for x in v:
        if x.split("=", 1)[0] in RUNNER_OPTIONS:
            _fail(path, f"{where} sets {x.split('=', 1)[0]}, which the runner sets for every cell")
    return list(v)


def _names(path, v, known, where):
    if not isinstance(v, list) or not v or not all(isinstance(x, str) for x in v):
        _fail(path, f"{where} must be a non-empty list of names")
    unknown = [x for x in v if x not in known]
    if unknown:
        _fail(path, f"{where}: unknown {', '.join(unknown)} (known: {', '.join(known) or 'none'})")
    if len(set(v)) != len(v):
        _fail(path, f"{where} lists a name twice")
    return list(v)


def _named_table(path, doc, key, check, required=True):
    t = doc.get(key, None if required else {})
    if not isinstance(t, dict) or (required and not t):
        _fail(path, f"[{key}] must be a table of name = value entries")
    out = {}
    for name, v in t.items():
        if not re.fullmatch(r"[a-z0-9_]+", name) or name == "config":
            _fail(path, f"[{key}] name {name!r}: lower case, digits and _ only, not 'config'")
        out[name] = check(v, f"[{key}] {name}")
    return out


# The largest --train.seed fp4moe train accepts (it reads train.seed as a signed 64-bit integer >= 0).
MAX_SEED = 2**63 - 1


def check_seeds(seeds, where):
    """A list of distinct integers in [0, MAX_SEED] (at least one), as a list; raises ValueError saying what was
    wrong."""
    if (not isinstance(seeds, list) or not seeds
            or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= MAX_SEED for x in seeds)):
        raise ValueError(f"{where} must be a non-empty list of integers >= 0 and <= 2^63 - 1 (--train.seed values), "
                         f"got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"{where} lists a seed twice: {seeds!r}")
    return list(seeds)


def _seeds(path, t):
    """[seeds] per scale; absent: [None] (the config's own seed) at every scale."""
    if t is None:
        return {s: [None] for s in SCALES}
    if not isinstance(t, dict) or set(t) != set(SCALES):
        _fail(path, f"[seeds] must give {', '.join(SCALES)}, each a list of seeds, got {t!r}")
    try:
        return {s: check_seeds(t[s], f"[seeds] {s}") for s in SCALES}
    except ValueError as e:
        _fail(path, str(e))


def _train_spec(path, doc):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    steps = doc.get("steps")
    if not isinstance(steps, dict) or set(steps) != set(SCALES) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in steps.values()):
        _fail(path, f"[steps] must give {', '.join(SCALES)} as integers >= 1 (--train.steps per scale), got {steps!r}")
    seeds = _seeds(path, doc.get("seeds"))
    t = doc.get("train", {})
    if not isinstance(t, dict):
        _fail(path, "[train] must be a table")
    unknown = sorted(set(t) - {"data", "memory_budget_gib", "retry_without_budget", "args"})
    if unknown:
        _fail(path, f"[train] has unknown keys {unknown}")
    data = t.get("data", "synthetic")
    if data not in DATA:
        _fail(path, f"[train] data must be one of {', '.join(DATA)}, got {data!r}")
    budget = t.get("memory_budget_gib", 0)
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget >= 0:
        _fail(path, f"[train] memory_budget_gib must be a number of GiB >= 0 (0: none), got {budget!r}")
    retry = t.get("retry_without_budget", False)
    if not isinstance(retry, bool):
        _fail(path, "[train] retry_without_budget must be true or false")

    def config_file(v, where):
        if not isinstance(v, str) or not re.fullmatch(r"configs/[a-z0-9_]+\.toml", v):
            _fail(path, f"{where} must name a file configs/<name>.toml, got {v!r}")
        if not os.path.isfile(os.path.join(root, v)):
            _fail(path, f"{where}: {v} does not exist")
        return v

    def modules(v, where):
        if not isinstance(v, list) or not all(isinstance(x, str) and re.fullmatch(r"[a-z_]+", x) for x in v):
            _fail(path, f"{where} must be a list of recompute module names ([] for none), got {v!r}")
        return list(v)

    configs = _named_table(path, doc, "configs", config_file)
    recipes = _named_table(path, doc, "recipes", lambda v, w: _options(path, v, w))
    policies = _named_table(path, doc, "policies", modules, required=False)
    groups = doc.get("cells")
    if not isinstance(groups, list) or not groups:
        _fail(path, "needs at least one [[cells]] entry")
    cells = []
    for i, g in enumerate(groups, 1):
        where = f"cells {i}"
        unknown = sorted(set(g) - {"configs", "recipes", "policies", "scales", "args", "label", "note"})
        if unknown:
            _fail(path, f"{where} has unknown keys {unknown}")
        pols = _names(path, g["policies"], list(policies), f"{where} policies") if "policies" in g else ["config"]
        label = g.get("label", "")
        if not isinstance(label, str) or (label and not re.fullmatch(r"[a-z0-9_]+", label)):
            _fail(path, f"{where} label must be lower case, digits and _, got {label!r}")
        note = g.get("note", "")
        if not isinstance(note, str):
            _fail(path, f"{where} note must be a string")
        cells.append(CellGroup(configs=_names(path, g.get("configs"), list(configs), f"{where} configs"),
                               recipes=_names(path, g.get("recipes"), list(recipes), f"{where} recipes"),
                               policies=pols, scales=_names(path, g.get("scales"), list(SCALES), f"{where} scales"),
                               args=_options(path, g.get("args", []), f"{where} args"), label=label, note=note))
    for scale in SCALES:
        if not any(scale in c.scales for c in cells):
            _fail(path, f"no [[cells]] entry runs at scale {scale}")
    return TrainSpec(steps=dict(steps), seeds=seeds, data=data, memory_budget_gib=float(budget),
                     retry_without_budget=retry,
                     args=_options(path, t.get("args", []), "[train] args"), configs=configs, recipes=recipes,
                     policies=policies, cells=cells)


def _plan_spec(path, doc):
    t = doc.get("plan", {})
    if not isinstance(t, dict) or sorted(set(t) - {"top"}):
        _fail(path, "[plan] must be a table with at most the key top")
    top = t.get("top", 5)
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        _fail(path, f"[plan] top must be an integer >= 1, got {top!r}")
    runs = doc.get("plans")
    if not isinstance(runs, list) or not runs:
        _fail(path, "needs at least one [[plans]] entry")
    plans, names = [], set()
    for i, g in enumerate(runs, 1):
        where = f"plans {i}"
        unknown = sorted(set(g) - {"name", "args", "scales", "note"})
        if unknown:
            _fail(path, f"{where} has unknown keys {unknown}")
        name = g.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[a-z0-9_]+", name) or name in names:
            _fail(path, f"{where} name must be lower case, digits and _, each once, got {name!r}")
        names.add(name)
        args = g.get("args")
        if not isinstance(args, list) or not args or not all(isinstance(x, str) for x in args):
            _fail(path, f"{where} args must be a non-empty list of strings (options of fp4moe plan), got {args!r}")
        for x in args:
            if x.split("=", 1)[0] in PLAN_OPTIONS:
                _fail(path, f"{where} args: {x} is set by the runner (repro/plan_runs.py)")
        note = g.get("note", "")
        if not isinstance(note, str):
            _fail(path, f"{where} note must be a string")
        plans.append(PlanRun(name=name, args=list(args), scales=_names(path, g.get("scales"), list(SCALES),
                                                                       f"{where} scales"), note=note))
    for scale in SCALES:
        if not any(scale in p.scales for p in plans):
            _fail(path, f"no [[plans]] entry runs at scale {scale}")
    return PlanSpec(top=top, plans=plans)


def load(path):
    """Reads and checks one scenario file; returns a Scenario."""
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as e:
        _fail(path, f"cannot read: {e.strerror}")
    except tomllib.TOMLDecodeError as e:
        _fail(path, f"not valid TOML: {e}")
    kind = doc.get("kind", "bench")
    if kind not in KINDS:
        _fail(path, f"'kind' must be one of {', '.join(KINDS)}, got {kind!r}")
    rows = _rows(path, doc)
    name = os.path.splitext(os.path.basename(path))[0]
    title = _string(path, doc, "title", "")
    budget = _per_scale(path, doc, "budget_gpu_minutes", "budget")
    if kind == "train":
        for key in ("benchmark", "filter", "peer", "peer_family"):
            if key in doc:
                _fail(path, f"'{key}' belongs to benchmark scenarios, not to kind = \"train\"")
        plot = doc.get("plot", "")
        if plot not in PLOTS:
            _fail(path, f"'plot' must be one of {', '.join(p for p in PLOTS if p)} (or absent), got {plot!r}")
        return Scenario(name=name, path=path, title=title, benchmark="", family=_family(path, doc),
                        budget_gpu_minutes=budget, filter={}, rows=rows, kind=kind, plot=plot,
                        train=_train_spec(path, doc))
    if kind == "plan":
        for key in ("benchmark", "filter", "peer", "peer_family", "plot"):
            if key in doc:
                _fail(path, f"'{key}' does not belong to kind = \"plan\"")
        return Scenario(name=name, path=path, title=title, benchmark="", family=_family(path, doc),
                        budget_gpu_minutes=budget, filter={}, rows=rows, kind=kind, plan=_plan_spec(path, doc))
    benchmark = _string(path, doc, "benchmark", "")
    if not re.fullmatch(r"bench_[a-z0-9_]+", benchmark):
        _fail(path, f"'benchmark' must name a program bench_<family> in the build's benchmarks/, got {benchmark!r}")
    family = _family(path, doc)
    peer, peer_family = doc.get("peer", ""), doc.get("peer_family", "")
    if peer or peer_family:
        if not isinstance(peer, str) or not re.fullmatch(r"benchmarks/peers/[a-z0-9_]+\.py", peer):
            _fail(path, f"'peer' must name a program benchmarks/peers/<name>.py, got {peer!r}")
        if not isinstance(peer_family, str) or not re.fullmatch(r"[a-z0-9_]+", peer_family) or peer_family == family:
            _fail(path, f"'peer_family' must be the peer's table name under /bench (lower case, digits, _; not the "
                        f"benchmark's own '{family}'), got {peer_family!r}")
    return Scenario(name=name, path=path, title=title, benchmark=benchmark, family=family,
                    budget_gpu_minutes=budget, filter=_per_scale(path, doc, "filter", "filter"), rows=rows, peer=peer,
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
