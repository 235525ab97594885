// The P1 layout calibration (trainer/memory/calibrate.h), no device: the searched layouts counted by hand on the
// default and restricted ranges, the fit metric and the best overhead on hand numbers, one fit recomputed from the
// estimator directly (percentages, overhead shift, best overhead), the ranking, the report's verdict both ways, and
// the rejected requests.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "tests/common/trainer_test_util.h"
#include "trainer/memory/calibrate.h"
#include "trainer/memory/estimate_report.h"

namespace fp4moe {
namespace {

using test::expect_error_with;

CalibrationRequest restricted(std::vector<int64_t> tp, std::vector<int64_t> pp, std::vector<int64_t> ep) {
  CalibrationRequest r;
  r.tp_values = std::move(tp);
  r.pp_values = std::move(pp);
  r.ep_values = std::move(ep);
  return r;
}

TEST(P1Calibration, LayoutsCountedByHand) {
  // dp = 256 / (tp pp); ep of {8, 16, 32, 64} dividing dp tp: (tp, pp) = (1, 4) dp tp 64: 4; (1, 8) 32: 3;
  // (1, 16) 16: 2; (2, 4) 64: 4; (2, 8) 32: 3; (2, 16) 16: 2. 18 layouts; 15360 / dp is integral for every dp.
  const std::vector<ParallelLayout> all = calibration_layouts(CalibrationRequest{});
  EXPECT_EQ(all.size(), 18u);
  for (const ParallelLayout& l : all) {
    EXPECT_EQ(l.tp * l.pp * l.dp, 256) << l.name;
    EXPECT_EQ((l.dp * l.tp) % l.ep, 0) << l.name;
    EXPECT_GE(l.ep, 8) << l.name;
    EXPECT_EQ(l.micro_batches * l.dp, 15360) << l.name;
    EXPECT_TRUE(l.zero1);
    EXPECT_EQ(l.grad_bytes, 4);
    EXPECT_EQ(l.micro_batch * l.seq_len, 4096);
  }
  // tp 1, pp 8: dp 32, ep 8, 16, 32 (64 does not divide 32).
  CalibrationRequest r = restricted({1}, {8}, {8, 16, 32, 64});
  r.grad_bytes = 2;
  const std::vector<ParallelLayout> three = calibration_layouts(r);
  ASSERT_EQ(three.size(), 3u);
  EXPECT_EQ(three[0].ep, 8);
  EXPECT_EQ(three[2].ep, 32);
  for (const ParallelLayout& l : three) EXPECT_EQ(l.grad_bytes, 2);
  // tp 2, pp 16: dp 8, dp tp 16: ep 64 does not divide it.
  EXPECT_TRUE(calibration_layouts(restricted({2}, {16}, {64})).empty());
  // pp 5 does not divide 256.
  EXPECT_TRUE(calibration_layouts(restricted({1, 2}, {5}, {8})).empty());
}

TEST(P1Calibration, FitMetricAndBestOffsetOnHandNumbers) {
  const std::vector<double> paper = {68.29, 74.20, 59.40}, ours = {70.0, 70.0, 60.0};
  // Differences 1.71, -4.20, 0.60: the largest is 4.20.
  EXPECT_NEAR(max_abs_difference(ours, paper), 4.20, 1e-12);
  // paper - ours = -1.71, 4.20, -0.60: midpoint of -1.71 and 4.20 = 1.245; shifted, the largest difference is 2.955.
  const double c = minimax_offset(ours, paper);
  EXPECT_NEAR(c, 1.245, 1e-12);
  EXPECT_NEAR(max_abs_difference({71.245, 71.245, 61.245}, paper), 2.955, 1e-12);
  EXPECT_NEAR(max_abs_difference(paper, paper), 0.0, 0.0);
  expect_error_with([&] { max_abs_difference({}, {}); }, {"non-empty"});
  expect_error_with([&] { minimax_offset({1.0}, paper); }, {"got 1 and 3"});
  expect_error_with([&] { max_abs_difference({1.0, std::nan(""), 2.0}, paper); }, {"entry 1 is not finite"});
}

TEST(P1Calibration, OneFitRecomputedFromTheEstimator) {
  CalibrationRequest r = restricted({1}, {4}, {64});
  r.overhead_gib = 4.0;
  const std::vector<CalibrationFit> fits = calibrate_p1(r);
  ASSERT_EQ(fits.size(), 1u);
  const CalibrationFit& f = fits[0];
  const ProductionPreset v3 = production_preset("v3");
  const std::vector<double> paper = {68.29, 74.20, 59.40};
  std::vector<double> heavy;
  const Recipe recipes[] = {Recipe::bf16, Recipe::fp8, Recipe::mxfp4};
  for (size_t i = 0; i < 3; ++i) {
    TrainerConfig cfg = v3.config;
    cfg.recipe = paper_recipe(recipes[i]);
    cfg.recompute.modules = {"core_attn", "layernorm", "moe"};
    const double h = 100.0 * (estimate_memory(cfg, f.layout).total_gib() + 4.0) / 80.0;
    cfg.recompute.modules = {"mla_up_proj"};
    const double l = 100.0 * (estimate_memory(cfg, f.layout).total_gib() + 4.0) / 80.0;
    EXPECT_NEAR(f.heavy_percent[i], h, 1e-9) << i;
    EXPECT_NEAR(f.light_percent[i], l, 1e-9) << i;
    heavy.push_back(h);
  }
  EXPECT_NEAR(f.error_pp, max_abs_difference(heavy, paper), 1e-9);
  // The best overhead moves every percentage by minimax_offset points: 4 GiB + offset x 80 / 100.
  EXPECT_NEAR(f.best_overhead_gib, 4.0 + minimax_offset(heavy, paper) * 0.8, 1e-9);
  // No overhead: every percentage 5 points lower (4 GiB of 80).
  r.overhead_gib = 0;
  const CalibrationFit g = calibrate_p1(r).front();
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(g.heavy_percent[i], f.heavy_percent[i] - 5.0, 1e-9) << i;
  EXPECT_NEAR(g.best_overhead_gib, f.best_overhead_gib, 1e-9);
  EXPECT_NEAR(g.error_at_best_pp, f.error_at_best_pp, 1e-9);
}

TEST(P1Calibration, RankedByFitAndTheVerdictSaysWhetherAnyFits) {
  CalibrationRequest r = restricted({1, 2}, {4, 16}, {8, 16, 64});
  const std::vector<CalibrationFit> fits = calibrate_p1(r);
  ASSERT_GE(fits.size(), 2u);
  for (size_t i = 1; i < fits.size(); ++i) EXPECT_LE(fits[i - 1].error_pp, fits[i].error_pp) << i;
  r.tolerance_pp = fits.front().error_pp / 2;
  const std::string none = format_calibration(fits, r, 2);
  EXPECT_NE(none.find("No layout fits P1's three heavy-policy numbers"), std::string::npos) << none;
  EXPECT_NE(none.find("are its largest categories"), std::string::npos) << none;
  EXPECT_NE(none.find("its largest terms: "), std::string::npos) << none;
  EXPECT_NE(none.find("| 2 | "), std::string::npos) << none;
  EXPECT_EQ(none.find("| 3 | "), std::string::npos) << none;  // top 2
  r.tolerance_pp = fits.front().error_pp;
  const std::string one = format_calibration(fits, r, 2);
  EXPECT_NE(one.find("1 of " + std::to_string(fits.size()) + " layouts fit"), std::string::npos) << one;
  expect_error_with([&] { format_calibration(fits, r, 0); }, {"--top must be >= 1"});
  expect_error_with([&] { format_calibration({}, r, 1); }, {"no layout to report"});
}

// An overhead larger than the card (1e308 GiB overflowed the percentages into an internal message) is refused with
// the bound.
TEST(P1Calibration, OverheadBeyondTheCardIsRefusedWithTheBound) {
  CalibrationRequest r;
  r.overhead_gib = 1e308;
  expect_error_with([&] { calibrate_p1(r); }, {"--overhead-gib must be a finite number in [0, 80]", "got 1e+308"});
  r.overhead_gib = 80.5;
  expect_error_with([&] { calibrate_p1(r); }, {"--overhead-gib", "[0, 80]", "got 80.5"});
}

TEST(P1Calibration, RejectsBadRequests) {
  expect_error_with([] { calibration_layouts(restricted({}, {4}, {8})); }, {"at least one size"});
  expect_error_with([] { calibration_layouts(restricted({3}, {4}, {8})); }, {"tp 3 is not one of 1, 2, 4, 8"});
  expect_error_with([] { calibration_layouts(restricted({1}, {17}, {8})); }, {"pp 17 is outside [1, 16]"});
  expect_error_with([] { calibration_layouts(restricted({1}, {4}, {0})); }, {"ep 0 is outside [1, 256]"});
  CalibrationRequest r;
  r.grad_bytes = 3;
  expect_error_with([&] { calibrate_p1(r); }, {"gradient bytes must be 4 (fp32) or 2 (bf16), got 3"});
  r = CalibrationRequest{};
  r.overhead_gib = -1;
  expect_error_with([&] { calibrate_p1(r); }, {"--overhead-gib must be a finite number in [0, 80]", "got -1"});
  r.overhead_gib = std::numeric_limits<double>::infinity();
  expect_error_with([&] { calibrate_p1(r); }, {"--overhead-gib"});
  r = CalibrationRequest{};
  r.card_gib = 0;
  expect_error_with([&] { calibrate_p1(r); }, {"card size"});
  r = CalibrationRequest{};
  r.tolerance_pp = 0;
  expect_error_with([&] { calibrate_p1(r); }, {"tolerance"});
}

}  // namespace
}  // namespace fp4moe
