"""Statistics of results over seeds: Student's t quantile, paired differences with their 95% confidence interval,
and the seed-to-seed spread of one recipe (the noise floor a deviation is judged against).

Method of the quantile: the t distribution's CDF from the regularized incomplete beta function,
    P(T <= t) = 1 - I_{df / (df + t^2)}(df / 2, 1/2) / 2   for t >= 0,
with I_x(a, b) evaluated by its continued fraction (modified Lentz; the series of Numerical Recipes 6.4, switched
to 1 - I_{1-x}(b, a) when x > (a + 1) / (a + b + 2)); the quantile is the bisection of that CDF on [0, 1e7] down
to an interval of 1e-12 (the CDF is increasing). Exact to the printed digits of the tables (t_{0.975,1} = 12.706,
t_{0.975,4} = 2.776, t_{0.975,30} = 2.042).

paired(numerators, denominators): per seed the relative difference d_i = (num_i / den_i - 1) x 100 (%); the mean,
the sample standard deviation s (n - 1 in the denominator), and the 95% t-interval mean +- t_{0.975,n-1} s / sqrt(n).
"within noise" when that interval contains 0. One seed: no interval (None), "1 seed: no interval".
"""

import math
from dataclasses import dataclass

WITHIN = "within noise"
OUTSIDE = "outside noise"
ONE_SEED = "1 seed: no interval"


def _beta_cf(a, b, x):
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 1000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def regularized_beta(x, a, b):
    """I_x(a, b) for 0 <= x <= 1 and a, b > 0. Raises ValueError outside that domain."""
    if not (a > 0 and b > 0) or not 0.0 <= x <= 1.0:
        raise ValueError(f"regularized_beta: needs 0 <= x <= 1 and a, b > 0, got x={x}, a={a}, b={b}")
    if x in (0.0, 1.0):
        return x
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_cf(a, b, x) / a
    return 1.0 - front * _beta_cf(b, a, 1.0 - x) / b


def t_cdf(t, df):
    """P(T <= t) for Student's t with df > 0 degrees of freedom. Raises ValueError for df <= 0."""
    if not df > 0:
        raise ValueError(f"t_cdf: degrees of freedom must be > 0, got {df}")
    tail = 0.5 * regularized_beta(df / (df + t * t), df / 2.0, 0.5)
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p, df):
    """The t with P(T <= t) = p (0 < p < 1, df > 0), by bisection of t_cdf. Raises ValueError outside that domain."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_quantile: p must be in (0, 1), got {p}")
    if not df > 0:
        raise ValueError(f"t_quantile: degrees of freedom must be > 0, got {df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1e7
    while hi - lo > 1e-12 * max(1.0, lo):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


@dataclass
class Spread:
    """Seed-to-seed spread of one quantity: n values, their mean, sample sd (NaN for n < 2) and sd / mean in %."""
    n: int
    mean: float
    sd: float
    rel_sd_pct: float

    def text(self, name="", digits=4):
        who = f"{name} " if name else ""
        if self.n < 2:
            return f"{who}1 seed: no spread"
        return f"{who}sd {self.sd:.{digits}g} ({self.rel_sd_pct:.2f}% of {self.mean:.{digits}g}), n = {self.n} seeds"


def spread(values):
    """Spread of finite `values` (at least one). Raises ValueError for none."""
    v = [float(x) for x in values if math.isfinite(x)]
    if not v:
        raise ValueError("spread: no finite value")
    n = len(v)
    mean = sum(v) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in v) / (n - 1)) if n >= 2 else math.nan
    return Spread(n, mean, sd, 100.0 * sd / abs(mean) if n >= 2 and mean != 0 else math.nan)


@dataclass
class Paired:
    """Mean paired difference over n seeds with its 95% t-interval (low, high: NaN with one seed) and verdict."""
    n: int
    mean: float
    low: float
    high: float
    verdict: str


def interval(diffs, level=0.95):
    """Mean of the per-seed differences `diffs` with the two-sided `level` t-interval (n - 1 degrees of freedom).
    Raises ValueError for no difference."""
    s = spread(diffs)
    if s.n < 2:
        return Paired(1, s.mean, math.nan, math.nan, ONE_SEED)
    half = t_quantile(0.5 + level / 2.0, s.n - 1) * s.sd / math.sqrt(s.n)
    low, high = s.mean - half, s.mean + half
    return Paired(s.n, s.mean, low, high, WITHIN if low <= 0.0 <= high else OUTSIDE)


def paired_percent(numerators, denominators, level=0.95):
    """The relative differences (num_i / den_i - 1) x 100 of seed-paired values and their interval. Raises
    ValueError for lists of different lengths, none, or a denominator of 0."""
    if len(numerators) != len(denominators):
        raise ValueError(f"paired_percent: {len(numerators)} numerators but {len(denominators)} denominators")
    if any(d == 0 for d in denominators):
        raise ValueError("paired_percent: a denominator is 0")
    return interval([(n / d - 1.0) * 100.0 for n, d in zip(numerators, denominators)], level)
