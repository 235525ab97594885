"""The MXFP4 ladder's metric (repro/ladder_metric.py): tokens to the target loss, the divergence rule, the token
overhead with the 1.5 T limit, and the per-arm interval over seeds paired with the FP8 baseline, on hand-computed
curves."""

import math
import os
import sys
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, ROOT)

from repro import ladder_metric as lm  # noqa: E402

T_975_2 = 4.302653  # Student's t, 0.975 quantile, 2 degrees of freedom (printed tables: 4.303)


class TokensToTarget(unittest.TestCase):
    TOKENS = [100, 200, 300]
    LOSSES = [5.0, 4.0, 3.2]

    def test_interpolates_between_the_two_evaluations_around_the_crossing(self):
        # 3.8 lies between 4.0 (200 tokens) and 3.2 (300): 200 + (4.0 - 3.8) / (4.0 - 3.2) x 100 = 225
        self.assertAlmostEqual(lm.tokens_to_target(self.TOKENS, self.LOSSES, 3.8), 225.0, places=9)
        # 4.75 between 5.0 (100) and 4.0 (200): 100 + 0.25 / 1.0 x 100 = 125
        self.assertAlmostEqual(lm.tokens_to_target(self.TOKENS, self.LOSSES, 4.75), 125.0, places=9)

    def test_reached_exactly_at_an_evaluation(self):
        self.assertEqual(lm.tokens_to_target(self.TOKENS, self.LOSSES, 4.0), 200.0)
        self.assertEqual(lm.tokens_to_target(self.TOKENS, self.LOSSES, 3.2), 300.0)
        self.assertEqual(lm.tokens_to_target(self.TOKENS, self.LOSSES, 5.0), 100.0)  # at the first evaluation
        self.assertEqual(lm.tokens_to_target(self.TOKENS, self.LOSSES, 6.0), 100.0)  # below it from the start

    def test_never_reached(self):
        self.assertIsNone(lm.tokens_to_target(self.TOKENS, self.LOSSES, 3.19))

    def test_the_first_crossing_counts_not_a_later_one(self):
        # down to 2.9 at 200, back up to 3.5, down again: the first crossing of 3.0, 100 + 1.0 / 1.1 x 100
        tokens, losses = [100, 200, 300, 400], [4.0, 2.9, 3.5, 2.0]
        self.assertAlmostEqual(lm.tokens_to_target(tokens, losses, 3.0), 100 + 100 / 1.1, places=9)

    def test_rejects_a_non_finite_loss_and_malformed_curves(self):
        for losses in ([5.0, math.nan, 3.0], [5.0, math.inf, 3.0]):
            with self.assertRaisesRegex(ValueError, "divergence first"):
                lm.tokens_to_target(self.TOKENS, losses, 3.5)
        with self.assertRaisesRegex(ValueError, "3 token counts but 2 losses"):
            lm.tokens_to_target(self.TOKENS, [5.0, 4.0], 3.5)
        with self.assertRaisesRegex(ValueError, "strictly increasing"):
            lm.tokens_to_target([100, 100, 300], self.LOSSES, 3.5)
        with self.assertRaisesRegex(ValueError, "no evaluation"):
            lm.tokens_to_target([], [], 3.5)
        with self.assertRaisesRegex(ValueError, "target nan"):
            lm.tokens_to_target(self.TOKENS, self.LOSSES, math.nan)


class Divergence(unittest.TestCase):
    def test_a_non_finite_loss_diverges_where_it_appears(self):
        self.assertEqual(lm.divergence_index([5.0, 4.0, math.nan, 3.0]), 2)
        self.assertEqual(lm.divergence_index([5.0, math.inf]), 1)
        self.assertEqual(lm.divergence_index([-math.inf]), 0)

    def test_three_consecutive_evaluations_over_5_percent_above_the_running_minimum(self):
        # minimum 2.0 at evaluation 1; threshold 2.1: 2.2, 2.3, 2.4 are the three rising evaluations
        self.assertEqual(lm.divergence_index([3.0, 2.0, 2.2, 2.3, 2.4, 2.5]), 4)

    def test_a_rise_that_falls_back_or_stays_within_the_margin_is_not_divergence(self):
        self.assertIsNone(lm.divergence_index([3.0, 2.0, 2.2, 2.3]))             # only two rising
        self.assertIsNone(lm.divergence_index([3.0, 2.0, 2.2, 2.05, 2.3, 2.4]))  # 2.05 within 5%: the run restarts
        self.assertIsNone(lm.divergence_index([3.0, 2.0, 2.1, 2.1, 2.1, 2.1]))   # exactly 5% above is not "more"
        self.assertIsNone(lm.divergence_index([3.0, 2.9, 2.8, 2.7]))

    def test_the_minimum_is_over_all_evaluations_before(self):
        # the minimum 2.0 stays the reference while the loss rises slowly: 2.08 (within), 2.12, 2.16, 2.2 (three over)
        self.assertEqual(lm.divergence_index([3.0, 2.0, 2.08, 2.12, 2.16, 2.2]), 5)

    def test_margin_and_count_are_parameters(self):
        self.assertEqual(lm.divergence_index([3.0, 2.0, 2.2], margin=0.05, evals=1), 2)
        self.assertIsNone(lm.divergence_index([3.0, 2.0, 2.2, 2.3, 2.4], margin=0.25))
        with self.assertRaisesRegex(ValueError, "evals 0"):
            lm.divergence_index([3.0], evals=0)
        with self.assertRaisesRegex(ValueError, "margin -0.1"):
            lm.divergence_index([3.0], margin=-0.1)


class TokenOverhead(unittest.TestCase):
    def test_percent_against_the_baseline(self):
        self.assertAlmostEqual(lm.token_overhead(108.0, 100.0, 100.0), 8.0, places=9)
        self.assertAlmostEqual(lm.token_overhead(90.0, 100.0, 100.0), -10.0, places=9)
        self.assertAlmostEqual(lm.token_overhead(135.0, 90.0, 100.0), 50.0, places=9)  # against the baseline's tokens

    def test_not_reached_beyond_one_and_a_half_budgets(self):
        self.assertAlmostEqual(lm.token_overhead(150.0, 100.0, 100.0), 50.0, places=9)  # 1.5 T: still reached
        self.assertEqual(lm.token_overhead(150.5, 100.0, 100.0), lm.NOT_REACHED)
        self.assertEqual(lm.token_overhead(140.0, 80.0, 90.0), lm.NOT_REACHED)  # the limit is 1.5 x budget, 135
        self.assertEqual(lm.token_overhead(None, 100.0, 100.0), lm.NOT_REACHED)

    def test_rejects_counts_that_are_not_counts(self):
        with self.assertRaisesRegex(ValueError, "baseline_tokens 0"):
            lm.token_overhead(10.0, 0, 100.0)
        with self.assertRaisesRegex(ValueError, "budget nan"):
            lm.token_overhead(10.0, 100.0, math.nan)
        with self.assertRaisesRegex(ValueError, "arm_tokens -1"):
            lm.token_overhead(-1.0, 100.0, 100.0)


BASE = ([100, 200], [4.0, 3.0])  # T = 200, target 3.0, reached at 200


class SeedResult(unittest.TestCase):
    def test_reached_with_its_overhead(self):
        r = lm.seed_result(1, BASE, ([100, 200, 300], [4.5, 3.5, 2.5]))  # 200 + 0.5 / 1.0 x 100 = 250
        self.assertEqual((r.status, r.target, r.baseline_tokens), (lm.REACHED, 3.0, 200.0))
        self.assertAlmostEqual(r.tokens, 250.0, places=9)
        self.assertAlmostEqual(r.overhead_pct, 25.0, places=9)

    def test_the_one_and_a_half_budget_rule(self):
        at_limit = lm.seed_result(1, BASE, ([100, 200, 300], [4.5, 3.5, 3.0]))  # 300 = 1.5 x 200
        self.assertEqual(at_limit.status, lm.REACHED)
        self.assertAlmostEqual(at_limit.overhead_pct, 50.0, places=9)
        late = lm.seed_result(1, BASE, ([100, 200, 300, 400], [4.5, 3.5, 3.1, 2.9]))  # 350 > 300
        self.assertEqual((late.status, late.tokens, late.overhead_pct), (lm.NOT_REACHED, None, None))

    def test_the_baselines_own_first_crossing_is_the_reference(self):
        # the baseline dips to 2.9 before ending at 3.0: it reached 3.0 at 100 + 1.0 / 1.1 x 100 tokens
        r = lm.seed_result(1, ([100, 200, 300], [4.0, 2.9, 3.0]), ([100, 200, 300], [4.0, 3.5, 3.0]))
        self.assertAlmostEqual(r.baseline_tokens, 100 + 100 / 1.1, places=9)
        self.assertAlmostEqual(r.overhead_pct, (300 / (100 + 100 / 1.1) - 1) * 100, places=9)

    def test_a_nan_before_the_target_is_divergence_after_it_is_not(self):
        nan = lm.seed_result(1, BASE, ([100, 200, 300], [4.0, math.nan, 2.0]))
        self.assertEqual((nan.status, nan.tokens), (lm.DIVERGED, None))
        after = lm.seed_result(1, BASE, ([100, 200, 300], [4.0, 3.0, math.nan]))
        self.assertEqual((after.status, after.tokens), (lm.REACHED, 200.0))

    def test_a_rising_curve_diverges_and_a_late_divergence_is_not_reached(self):
        rising = lm.seed_result(1, BASE, ([50, 100, 150, 200, 250, 300], [4.0, 3.5, 3.8, 3.9, 4.0, 2.0]))
        self.assertEqual(rising.status, lm.DIVERGED)  # 3 evaluations over 3.675 end at 250, within 300
        late = lm.seed_result(1, BASE, ([100, 200, 300, 400], [4.0, 3.5, 3.4, math.nan]))  # NaN at 400 > 300
        self.assertEqual(late.status, lm.NOT_REACHED)

    def test_rejects_a_diverged_baseline(self):
        with self.assertRaisesRegex(ValueError, "seed 7: the baseline diverged at evaluation 1"):
            lm.seed_result(7, ([100, 200], [4.0, math.nan]), BASE)


class ArmOverSeeds(unittest.TestCase):
    # seed -> (baseline, arm); targets and overheads by hand:
    #   1: target 3.0, baseline 200; arm 200 + 0.5 / 1.0 x 100 = 250 -> +25%
    #   2: target 3.2, baseline 200; arm 200 + 0.1 / 0.5 x 100 = 220 -> +10%
    #   3: target 2.5, baseline 400; arm 400 + 0.3 / 0.75 x 200 = 480 -> +20%
    BASELINES = {1: ([100, 200], [4.0, 3.0]), 2: ([100, 200], [4.0, 3.2]), 3: ([100, 200, 400], [4.0, 3.0, 2.5])}
    ARM = {1: ([100, 200, 300], [4.5, 3.5, 2.5]), 2: ([100, 200, 300], [3.6, 3.3, 2.8]),
           3: ([100, 200, 400, 600], [4.0, 3.0, 2.8, 2.05])}

    def test_paired_interval_over_three_seeds_against_a_hand_computation(self):
        arm = lm.arm_result(self.BASELINES, self.ARM)
        self.assertEqual([r.seed for r in arm.seeds], [1, 2, 3])
        for r, pct in zip(arm.seeds, (25.0, 10.0, 20.0)):
            self.assertAlmostEqual(r.overhead_pct, pct, places=9)
        # mean 55 / 3; deviations +20/3, -25/3, +5/3; s^2 = (400 + 625 + 25) / 9 / 2 = 175 / 3
        mean, half = 55.0 / 3.0, T_975_2 * math.sqrt(175.0 / 3.0 / 3.0)
        self.assertEqual(arm.interval.n, 3)
        self.assertAlmostEqual(arm.interval.mean, mean, places=9)
        self.assertAlmostEqual(arm.interval.low, mean - half, places=4)   # -0.640
        self.assertAlmostEqual(arm.interval.high, mean + half, places=4)  # +37.307
        self.assertEqual(arm.counts, {lm.REACHED: 3, lm.NOT_REACHED: 0, lm.DIVERGED: 0})
        self.assertEqual(arm.text(), "+18.3% [-0.6, +37.3], 3 seeds")

    def test_not_reached_and_diverged_seeds_are_counted_and_left_out_of_the_interval(self):
        baselines = {**self.BASELINES, 4: BASE, 5: BASE}
        arms = {**self.ARM, 4: ([100, 200, 300], [4.0, 3.5, 3.2]), 5: ([100, 200], [4.0, math.inf])}
        arm = lm.arm_result(baselines, arms)
        self.assertEqual(arm.counts, {lm.REACHED: 3, lm.NOT_REACHED: 1, lm.DIVERGED: 1})
        self.assertEqual(arm.interval.n, 3)
        self.assertAlmostEqual(arm.interval.mean, 55.0 / 3.0, places=9)
        self.assertEqual(arm.text(), "+18.3% [-0.6, +37.3] over the 3 of 5 seeds that reached it; 1 not reached, "
                                     "1 diverged")

    def test_no_seed_reached(self):
        arm = lm.arm_result({1: BASE, 2: BASE}, {1: ([100, 300], [4.0, 3.5]), 2: ([100], [math.nan])})
        self.assertIsNone(arm.interval)
        self.assertEqual(arm.text(), "not reached (1 of 2 seeds), diverged (1 of 2 seeds)")

    def test_one_seed_has_no_interval(self):
        arm = lm.arm_result(self.BASELINES, {2: self.ARM[2]})
        self.assertEqual(arm.text(), "+10.0% (1 seed: no interval), 1 seed")

    def test_rejects_an_arm_seed_without_its_baseline_and_no_seed(self):
        with self.assertRaisesRegex(ValueError, r"seeds \[9\] have no baseline run"):
            lm.arm_result(self.BASELINES, {9: BASE})
        with self.assertRaisesRegex(ValueError, "no seed"):
            lm.arm_result(self.BASELINES, {})


class CellsCurves(unittest.TestCase):
    """The eval_curve text of the cells table, the budget cut and the arm computed from cells (1.5 T runs)."""

    def test_curve_text_round_trips_and_a_later_evaluation_at_the_same_tokens_replaces_the_earlier(self):
        text = lm.format_curve([100, 200, 200], [4.25, 3.5, 3.4999])
        self.assertEqual(text, "100:4.25 200:3.4999")
        self.assertEqual(lm.parse_curve(text), ([100.0, 200.0], [4.25, 3.4999]))
        self.assertEqual(lm.format_curve([], []), "")
        self.assertEqual(lm.parse_curve("100:nan 200:inf")[0], [100.0, 200.0])

    def test_bad_curves_are_rejected(self):
        for tokens, losses, why in (([100, 50], [1, 2], "non-decreasing"), ([1.5], [1], "whole count"),
                                    ([100], [1, 2], "1 token counts but 2 losses")):
            with self.assertRaisesRegex(ValueError, why):
                lm.format_curve(tokens, losses)
        for text, why in (("100-4.0", "not tokens:loss"), ("1.5:4", "not tokens:loss"), ("", "no evaluation"),
                          ("200:4 100:3", "strictly increasing")):
            with self.assertRaisesRegex(ValueError, why):
                lm.parse_curve(text)

    def test_the_baseline_is_cut_at_two_thirds_of_its_run(self):
        self.assertEqual(lm.cut_at_budget([100, 200, 300], [4.0, 3.0, 2.5]), ([100.0, 200.0], [4.0, 3.0]))
        with self.assertRaisesRegex(ValueError, "no evaluation at the budget T = 266.667"):
            lm.cut_at_budget([100, 200, 400], [4.0, 3.0, 2.5])

    def test_arm_from_cells_pairs_seeds_against_the_baselines_loss_at_t(self):
        base = lm.format_curve([100, 200, 300], [4.0, 3.0, 2.5])  # target 3.0 at T = 200
        baselines = {1: base, 2: base, 3: lm.format_curve([100, 200, 300], [4.0, 3.2, 2.5])}
        arms = {1: lm.format_curve([100, 200, 300], [4.2, 3.2, 2.8]),   # 200 + 0.2 / 0.4 x 100 = 250: +25%
                2: lm.format_curve([100, 200, 300], [4.1, 3.0, 2.9]),   # 200: 0%
                3: lm.format_curve([100, 200, 300], [4.5, 3.5, 3.3])}   # target 3.2 never reached: not reached
        arm, targets = lm.arm_from_cells(baselines, arms)
        self.assertEqual(arm.counts, {lm.REACHED: 2, lm.NOT_REACHED: 1, lm.DIVERGED: 0})
        self.assertAlmostEqual(arm.interval.mean, 12.5, places=9)
        self.assertEqual([r.target for r in arm.seeds], [3.0, 3.0, 3.2])
        self.assertEqual(targets.n, 3)
        self.assertAlmostEqual(targets.mean, 3.2 / 3 + 2.0, places=9)


if __name__ == "__main__":
    unittest.main()
