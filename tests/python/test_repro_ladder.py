"""The mxfp4_ladder scenario's rules (repro/ours.py token_overhead over repro/ladder_metric.py): the token overhead of
each arm from the cells table's eval_curve column, paired per seed with the FP8 baseline cut at its budget, the
step-throughput rows, and the scenario format's checks of the aggregate."""

import math
import os
import sys
import tempfile
import unittest

import pandas as pd

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, ROOT)

from repro import ladder_metric as lm  # noqa: E402
from repro import ours, scenario, stats  # noqa: E402

LADDER = os.path.join(ROOT, "repro", "scenarios", "mxfp4_ladder.toml")
CURVE_TOKENS = [100, 200, 300]


def cell(recipe, seed, losses, tps, shape="dense_small"):
    return {"case": "config", "shape": shape, "recipe": recipe, "seed": seed, "status": "ok", "note": "",
            "tokens_per_s": tps, "eval_curve": lm.format_curve(CURVE_TOKENS, losses)}


def row_named(rows, start):
    (r,) = [r for r in rows if r["row"].startswith(start)]
    return r


class LadderRows(unittest.TestCase):
    def setUp(self):
        self.s = scenario.load(LADDER)

    def frame(self):
        cells = [cell("fp8", 1, [4.0, 3.0, 2.5], 100.0), cell("fp8", 2, [4.0, 3.0, 2.5], 110.0),
                 cell("fp8", 3, [4.0, 3.2, 2.5], 90.0),
                 # fprop: seed 1 +25% (250 tokens), seed 2 +0%, seed 3 never below 3.2: not reached
                 cell("fprop", 1, [4.2, 3.2, 2.8], 80.0), cell("fprop", 2, [4.1, 3.0, 2.9], 88.0),
                 cell("fprop", 3, [4.5, 3.5, 3.3], 72.0),
                 # wgrad_sr: a non-finite loss before the target on every seed
                 cell("wgrad_sr", 1, [4.0, math.nan, math.nan], 50.0), cell("wgrad_sr", 2, [4.0, math.inf, 1.0], 55.0)]
        return pd.DataFrame(cells)

    def test_token_overhead_per_arm_with_its_interval_counts_and_the_baselines_spread(self):
        rows = ours.repro_rows(self.s, self.frame())
        r = row_named(rows, "dense_small: MXFP4 Fprop, token overhead")
        p = stats.interval([25.0, 0.0])
        self.assertAlmostEqual(r["ours"], 12.5, places=9)
        self.assertAlmostEqual(r["ci_low"], p.low, places=9)
        self.assertAlmostEqual(r["ci_high"], p.high, places=9)
        self.assertEqual(r["count"], 3)
        self.assertIn("over the 2 of 3 seeds that reached it; 1 not reached", r["verdict"])
        self.assertEqual(r["spread"], stats.spread([3.0, 3.0, 3.2]).text("fp8 dense_small loss at T"))
        self.assertAlmostEqual(r["ratio"], 12.5 / 8.5, places=9)  # P2's 8-9%: the range's midpoint
        sr = row_named(rows, "dense_small: + Wgrad, stochastic rounding of the gradients, token overhead")
        self.assertTrue(math.isnan(sr["ours"]))
        self.assertEqual(sr["verdict"], "diverged (2 of 2 seeds)")
        self.assertEqual(sr["count"], 2)
        missing = row_named(rows, "small: MXFP4 Fprop, token overhead")
        self.assertTrue(math.isnan(missing["ours"]))
        self.assertIn("not measured at this scale", missing["note"])

    def test_runs_that_stopped_early_or_failed_are_left_out(self):
        # Seed 3's baseline stopped at 300 of 600 tokens (its curve would put T at 200): left out, not cut there; an
        # arm cell that failed is left out too. Seeds 1 and 2 remain: +25% and 0%.
        df = self.frame()
        df["tokens"] = 300
        df.loc[(df["recipe"] == "fp8") & (df["seed"] == 3), "tokens"] = 600
        r = row_named(ours.repro_rows(self.s, df), "dense_small: MXFP4 Fprop, token overhead")
        self.assertEqual(r["count"], 2)
        self.assertAlmostEqual(r["ours"], 12.5, places=9)
        df = self.frame()
        df.loc[(df["recipe"] == "fprop") & (df["seed"] == 2), "status"] = "failed"
        r = row_named(ours.repro_rows(self.s, df), "dense_small: MXFP4 Fprop, token overhead")
        self.assertEqual(r["count"], 2)
        self.assertAlmostEqual(r["ours"], 25.0, places=9)
        self.assertIn("1 not reached", r["verdict"])

    def test_step_throughput_over_fp8_is_the_geomean_of_the_seed_ratios(self):
        rows = ours.repro_rows(self.s, self.frame())
        r = row_named(rows, "dense_small: MXFP4 Fprop, step throughput")
        self.assertAlmostEqual(r["ours"], (0.8 * 0.8 * 0.8) ** (1 / 3), places=9)
        self.assertEqual(r["count"], 3)

    def test_a_baseline_without_an_evaluation_at_t_is_named_in_the_note(self):
        df = self.frame()
        df.loc[df["recipe"] == "fp8", "eval_curve"] = lm.format_curve([100, 200, 400], [4.0, 3.0, 2.5])
        r = row_named(ours.repro_rows(self.s, df), "dense_small: MXFP4 Fprop, token overhead")
        self.assertTrue(math.isnan(r["ours"]))
        self.assertIn("not computed: token overhead: curve: no evaluation at the budget T", r["note"])

    def test_the_scenario_checks_the_aggregates_rule(self):
        with open(LADDER, encoding="utf-8") as f:
            text = f.read()
        cases = [(text.replace('match = ["seed", "shape"]\nnumerator = { column = "eval_curve"',
                               'match = ["shape"]\nnumerator = { column = "eval_curve"', 1), 'must include "seed"'),
                 (text.replace('numerator = { column = "eval_curve"', 'numerator = { column = "val_loss"', 1),
                  'ours.numerator.column must be "eval_curve"'),
                 (text.replace('aggregate = "token_overhead"\n', 'aggregate = "token_overhead"\ncombine = "ratio"\n', 1),
                  "ours.combine does not apply")]
        for bad, why in cases:
            with self.subTest(why), tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "mxfp4_ladder.toml")
                with open(path, "w", encoding="utf-8") as f:
                    f.write(bad)
                with self.assertRaises(scenario.ScenarioError) as e:
                    scenario.load(path)
                self.assertIn(why, str(e.exception))


if __name__ == "__main__":
    unittest.main()
