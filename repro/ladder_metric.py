"""The MXFP4 training ladder's metric (paper 2): tokens to reach the FP8 baseline's validation loss, per seed, and
each arm's token overhead against FP8 with its 95% t-interval over seeds (repro/stats.py).

A curve is the evaluations of one run: eval_tokens (training tokens seen at each evaluation, strictly increasing)
and eval_losses (validation loss there, every evaluation on the same data: the full validation split).

Rules:
- Target (per seed, paired): the FP8 baseline's validation loss after its token budget T (its last evaluation's
  tokens; for runs that all train LIMIT_FACTOR x T tokens under one learning-rate schedule, cut_at_budget first). The baseline's own tokens to target are its first crossing of that loss (T when its curve
  falls monotonically); an arm's overhead is against those tokens of the same seed.
- Tokens to target: the first evaluation at or below the target; from the evaluation before it, linear
  interpolation in tokens between the two (tokens_to_target).
- Divergence (divergence_index): an evaluation whose loss is non-finite, or the RISE_EVALS-th of consecutive
  evaluations each above the minimum of all evaluations before it by more than RISE_MARGIN (relative).
  Only the evaluations before the divergence count towards the target.
- Limit: an arm that reaches the target after LIMIT_FACTOR x T tokens (or never) is "not reached"; one whose run
  diverges within LIMIT_FACTOR x T before reaching it is "diverged".
- Overhead (token_overhead): (arm tokens / baseline tokens - 1) x 100 (%). Over seeds: the mean and the 95% t-interval
  of the reached seeds' overheads (stats.interval), with the count of not-reached and diverged seeds beside them.
"""

import math
from dataclasses import dataclass, field

from repro import stats

REACHED = "reached"
NOT_REACHED = "not reached"
DIVERGED = "diverged"
RISE_MARGIN = 0.05  # a loss more than 5% above its running minimum is rising
RISE_EVALS = 3      # for this many consecutive evaluations
LIMIT_FACTOR = 1.5  # an arm gets 1.5 T tokens to reach the target


def check_curve(eval_tokens, eval_losses):
    """The curve as two lists of floats. Rejects (ValueError) lists of different lengths, no evaluation, and tokens
    that are not finite, negative or not strictly increasing. Losses may be non-finite (divergence)."""
    tokens, losses = [float(t) for t in eval_tokens], [float(v) for v in eval_losses]
    if len(tokens) != len(losses):
        raise ValueError(f"curve: {len(tokens)} token counts but {len(losses)} losses; expected one per evaluation")
    if not tokens:
        raise ValueError("curve: no evaluation; expected at least one")
    for i, t in enumerate(tokens):
        if not math.isfinite(t) or t < 0:
            raise ValueError(f"curve: tokens {t} at evaluation {i}; expected a finite count >= 0")
        if i and t <= tokens[i - 1]:
            raise ValueError(f"curve: tokens {t} at evaluation {i} after {tokens[i - 1]}; expected strictly increasing")
    return tokens, losses


def format_curve(eval_tokens, eval_losses):
    """The curve as the text of a cells-table column (repro/scenario.py TRAIN_COLUMNS eval_curve): "tokens:loss"
    pairs separated by spaces, tokens as integers, losses with 9 significant digits (nan, inf as Python writes
    them). Evaluations at the tokens of an earlier one replace it (the final evaluation of a run that also
    evaluated periodically at its last step). "" without evaluations. Rejects (ValueError) lists of different
    lengths and non-integral, negative or decreasing tokens."""
    tokens, losses = [float(t) for t in eval_tokens], [float(v) for v in eval_losses]
    if len(tokens) != len(losses):
        raise ValueError(f"curve: {len(tokens)} token counts but {len(losses)} losses; expected one per evaluation")
    kept = []
    for t, v in zip(tokens, losses):
        if not (math.isfinite(t) and t >= 0 and t == int(t)):
            raise ValueError(f"curve: tokens {t}; expected a whole count >= 0")
        if kept and t < kept[-1][0]:
            raise ValueError(f"curve: tokens {t} after {kept[-1][0]}; expected non-decreasing")
        if kept and t == kept[-1][0]:
            kept.pop()
        kept.append((int(t), v))
    return " ".join(f"{t}:{v:.9g}" for t, v in kept)


def parse_curve(text):
    """(eval_tokens, eval_losses) of a format_curve text, checked (check_curve). Rejects (ValueError) a malformed
    pair and an empty text."""
    tokens, losses = [], []
    for pair in str(text).split():
        t, sep, v = pair.partition(":")
        try:
            if not sep:
                raise ValueError
            tokens.append(float(int(t)))
            losses.append(float(v))
        except ValueError:
            raise ValueError(f"curve: '{pair}' is not tokens:loss") from None
    return check_curve(tokens, losses)


def cut_at_budget(eval_tokens, eval_losses):
    """The baseline's curve up to its token budget T = (its last evaluation's tokens) / LIMIT_FACTOR, for runs in
    which every arm, the baseline included, trains LIMIT_FACTOR x T tokens under the same learning-rate schedule:
    the evaluations at or below T (T itself must be one: the evaluation interval has to divide the steps up to T).
    Rejects (ValueError) a malformed curve and one without an evaluation at T."""
    tokens, losses = check_curve(eval_tokens, eval_losses)
    budget = tokens[-1] / LIMIT_FACTOR
    kept = [i for i, t in enumerate(tokens) if t <= budget * (1 + 1e-9)]
    if not kept or abs(tokens[kept[-1]] - budget) > 1e-9 * budget:
        raise ValueError(f"curve: no evaluation at the budget T = {budget:g} tokens (the last of {tokens[-1]:g} / "
                         f"{LIMIT_FACTOR:g}); expected evaluations whose interval divides the steps up to T")
    return tokens[:kept[-1] + 1], losses[:kept[-1] + 1]


def tokens_to_target(eval_tokens, eval_losses, target):
    """The tokens at which the validation-loss curve first reaches `target` (loss <= target): the tokens of the first
    evaluation at or below it if that is the first evaluation, else the linear interpolation between it and the
    evaluation before, t_prev + (loss_prev - target) / (loss_prev - loss) x (t - t_prev). None when no evaluation
    reaches it. Rejects (ValueError) a malformed curve (check_curve), a non-finite target and a non-finite loss
    (cut the curve at divergence_index first)."""
    tokens, losses = check_curve(eval_tokens, eval_losses)
    if not math.isfinite(target):
        raise ValueError(f"tokens_to_target: target {target}; expected a finite loss")
    for i, loss in enumerate(losses):
        if not math.isfinite(loss):
            raise ValueError(f"tokens_to_target: loss {loss} at evaluation {i}; cut the curve at its divergence first")
        if loss <= target:
            if i == 0:
                return tokens[0]
            prev = losses[i - 1]  # > target >= loss
            return tokens[i - 1] + (prev - target) / (prev - loss) * (tokens[i] - tokens[i - 1])
    return None


def divergence_index(eval_losses, margin=RISE_MARGIN, evals=RISE_EVALS):
    """The index of the evaluation at which the run is judged diverged, or None: the first non-finite loss, or the
    `evals`-th of consecutive evaluations each above (1 + margin) x the minimum of all evaluations before it.
    Rejects (ValueError) margin < 0 and evals < 1."""
    if not margin >= 0:
        raise ValueError(f"divergence_index: margin {margin}; expected >= 0")
    if evals < 1:
        raise ValueError(f"divergence_index: evals {evals}; expected >= 1")
    best, rising = math.inf, 0
    for i, loss in enumerate(float(v) for v in eval_losses):
        if not math.isfinite(loss):
            return i
        rising = rising + 1 if loss > (1.0 + margin) * best else 0
        if rising >= evals:
            return i
        best = min(best, loss)
    return None


def token_overhead(arm_tokens, baseline_tokens, budget):
    """The arm's token overhead against the baseline in %, (arm_tokens / baseline_tokens - 1) x 100, or NOT_REACHED
    when arm_tokens is None or above LIMIT_FACTOR x budget (budget: T, the baseline's token budget). Rejects
    (ValueError) a baseline_tokens or budget that is not finite and > 0, and a negative or non-finite arm_tokens."""
    for name, v in (("baseline_tokens", baseline_tokens), ("budget", budget)):
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"token_overhead: {name} {v}; expected a finite count > 0")
    if arm_tokens is None:
        return NOT_REACHED
    if not (math.isfinite(arm_tokens) and arm_tokens >= 0):
        raise ValueError(f"token_overhead: arm_tokens {arm_tokens}; expected a finite count >= 0 or None")
    if arm_tokens > LIMIT_FACTOR * budget:
        return NOT_REACHED
    return (arm_tokens / baseline_tokens - 1.0) * 100.0


@dataclass
class SeedResult:
    """One seed of an arm: status (REACHED, NOT_REACHED or DIVERGED), the target, the arm's and the baseline's tokens
    to it (arm's None unless reached) and the overhead in % (None unless reached)."""
    seed: int
    status: str
    target: float
    tokens: float
    baseline_tokens: float
    overhead_pct: float


def seed_result(seed, baseline_curve, arm_curve):
    """One seed, paired: the target is the baseline's final loss. Each curve is (eval_tokens, eval_losses). Rejects
    (ValueError) a malformed curve and a baseline that diverged (divergence_index) or ends on a non-finite loss."""
    b_tokens, b_losses = check_curve(*baseline_curve)
    bad = divergence_index(b_losses)
    if bad is not None:
        raise ValueError(f"seed {seed}: the baseline diverged at evaluation {bad}; expected a baseline that trains")
    budget, target = b_tokens[-1], b_losses[-1]
    baseline_tokens = tokens_to_target(b_tokens, b_losses, target)
    a_tokens, a_losses = check_curve(*arm_curve)
    end = divergence_index(a_losses)
    stop = len(a_losses) if end is None else end
    reached = tokens_to_target(a_tokens[:stop], a_losses[:stop], target) if stop else None
    overhead = token_overhead(reached, baseline_tokens, budget)
    if overhead != NOT_REACHED:
        return SeedResult(seed, REACHED, target, reached, baseline_tokens, overhead)
    diverged = end is not None and a_tokens[end] <= LIMIT_FACTOR * budget
    return SeedResult(seed, DIVERGED if diverged else NOT_REACHED, target, None, baseline_tokens, None)


@dataclass
class ArmResult:
    """An arm over seeds: the per-seed results, the counts per status, and the interval (stats.Paired: mean, low,
    high, verdict) of the reached seeds' overheads, None when no seed reached the target."""
    seeds: list = field(default_factory=list)
    counts: dict = field(default_factory=dict)
    interval: stats.Paired = None

    def text(self, digits=1):
        """E.g. "+8.5% [+6.1, +10.9], 3 seeds", "+8.5% [..] over the 2 of 3 seeds that reached it; 1 not reached",
        "not reached (2 of 3 seeds), diverged (1 of 3 seeds)"."""
        n, reached = len(self.seeds), self.counts[REACHED]
        misses = [f"{self.counts[s]} {s}" for s in (NOT_REACHED, DIVERGED) if self.counts[s]]
        if self.interval is None:
            return ", ".join(f"{s} ({self.counts[s]} of {n} seeds)" for s in (NOT_REACHED, DIVERGED) if self.counts[s])
        p = self.interval
        value = f"{p.mean:+.{digits}f}%"
        value += f" [{p.low:+.{digits}f}, {p.high:+.{digits}f}]" if p.n >= 2 else f" ({stats.ONE_SEED})"
        if not misses:
            return f"{value}, {n} seed{'s' if n > 1 else ''}"
        return f"{value} over the {reached} of {n} seeds that reached it; {', '.join(misses)}"


def arm_result(baseline_curves, arm_curves, level=0.95):
    """An arm against the baseline, paired by seed: {seed: (eval_tokens, eval_losses)} for each. Rejects
    (ValueError) no arm seed, an arm seed the baseline lacks, and what seed_result rejects."""
    if not arm_curves:
        raise ValueError("arm_result: no seed; expected at least one run of the arm")
    missing = sorted(set(arm_curves) - set(baseline_curves))
    if missing:
        raise ValueError(f"arm_result: seeds {missing} have no baseline run; expected the baseline on every seed")
    seeds = [seed_result(s, baseline_curves[s], arm_curves[s]) for s in sorted(arm_curves)]
    counts = {s: sum(r.status == s for r in seeds) for s in (REACHED, NOT_REACHED, DIVERGED)}
    overheads = [r.overhead_pct for r in seeds if r.status == REACHED]
    return ArmResult(seeds, counts, stats.interval(overheads, level) if overheads else None)


def arm_from_cells(baseline_curves, arm_curves, level=0.95):
    """An arm against the baseline from the cells table's eval_curve texts, {seed: text} each, for runs that all
    trained LIMIT_FACTOR x T tokens: the baseline's curves cut at T (cut_at_budget), then arm_result. Returns
    (ArmResult, stats.Spread of the baseline's targets over the arm's seeds: its own seed-to-seed noise). Rejects
    (ValueError) what parse_curve, cut_at_budget and arm_result reject."""
    baseline = {seed: cut_at_budget(*parse_curve(text)) for seed, text in baseline_curves.items()}
    arm = {seed: parse_curve(text) for seed, text in arm_curves.items()}
    result = arm_result(baseline, arm, level)
    return result, stats.spread([r.target for r in result.seeds])
