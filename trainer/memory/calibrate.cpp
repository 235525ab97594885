// The P1 layout calibration (trainer/memory/calibrate.h).
#include "trainer/memory/calibrate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "kernels/common/check.h"
#include "trainer/memory/estimate_report.h"
#include "trainer/memory/plan.h"

namespace fp4moe {

namespace {

constexpr int64_t kP1Gpus = 256;
constexpr double kGiB = 1073741824.0;

bool contains(const std::vector<int64_t>& v, int64_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

void check_differences(const std::vector<double>& ours, const std::vector<double>& paper) {
  FP4MOE_CHECK(!ours.empty() && ours.size() == paper.size(),
               "calibration fit: expected equal, non-empty lists of percentages, got {} and {}", ours.size(),
               paper.size());
  for (size_t i = 0; i < ours.size(); ++i)
    FP4MOE_CHECK(std::isfinite(ours[i]) && std::isfinite(paper[i]),
                 "calibration fit: entry {} is not finite ({} vs {})", i, ours[i], paper[i]);
}

std::vector<double> percentages(const std::vector<MemoryEstimate>& es, const CalibrationRequest& r) {
  std::vector<double> out;
  for (const MemoryEstimate& e : es) out.push_back(100.0 * (e.total_gib() + r.overhead_gib) / r.card_gib);
  return out;
}

std::vector<MemoryEstimate> estimates(const ParallelLayout& lay, const std::vector<std::string>& modules) {
  std::vector<MemoryEstimate> out;
  const ProductionPreset v3 = production_preset("v3");
  for (const P1MemoryRow& row : p1_memory_rows()) {
    TrainerConfig cfg = v3.config;
    cfg.recipe = paper_recipe(row.recipe);
    cfg.recompute.modules = modules;
    out.push_back(estimate_memory(cfg, lay));
  }
  return out;
}

std::string layout_cells(const ParallelLayout& l) {
  return fmt::format("{} | {} | {} | {} | {}", l.tp, l.pp, l.dp, l.ep, l.micro_batches);
}

std::string light_text(double percent) {
  return percent < 0 ? std::string("out of memory") : fmt::format("{:.2f}%", percent);
}

}  // namespace

const std::vector<P1MemoryRow>& p1_memory_rows() {
  static const std::vector<P1MemoryRow> rows = {
      {Recipe::bf16, 68.29, -1.0}, {Recipe::fp8, 74.20, -1.0}, {Recipe::mxfp4, 59.40, 70.11}};
  return rows;
}

void validate_calibration(const CalibrationRequest& r) {
  FP4MOE_CHECK(!r.tp_values.empty() && !r.pp_values.empty() && !r.ep_values.empty(),
               "calibration: the tp, pp and ep value lists must each name at least one size");
  for (int64_t tp : r.tp_values)
    FP4MOE_CHECK(tp == 1 || tp == 2 || tp == 4 || tp == 8, "calibration: tp {} is not one of 1, 2, 4, 8", tp);
  for (int64_t pp : r.pp_values) FP4MOE_CHECK(pp >= 1 && pp <= 16, "calibration: pp {} is outside [1, 16]", pp);
  for (int64_t ep : r.ep_values) FP4MOE_CHECK(ep >= 1 && ep <= 256, "calibration: ep {} is outside [1, 256]", ep);
  FP4MOE_CHECK(r.grad_bytes == 4 || r.grad_bytes == 2,
               "calibration: gradient bytes must be 4 (fp32) or 2 (bf16), got {}", r.grad_bytes);
  FP4MOE_CHECK(std::isfinite(r.card_gib) && r.card_gib > 0, "calibration: card size must be > 0 GiB, got {}",
               r.card_gib);
  FP4MOE_CHECK(std::isfinite(r.overhead_gib) && r.overhead_gib >= 0 && r.overhead_gib <= r.card_gib,
               "--overhead-gib must be a finite number in [0, {:g}] (the card's GiB: a larger overhead leaves "
               "nothing of it), got {}", r.card_gib, r.overhead_gib);
  FP4MOE_CHECK(std::isfinite(r.tolerance_pp) && r.tolerance_pp > 0,
               "calibration: tolerance must be > 0 percentage points, got {}", r.tolerance_pp);
  FP4MOE_CHECK(!r.heavy_modules.empty(), "calibration: the heavy policy must name at least one recompute module");
  TrainerConfig check = production_preset("v3").config;
  check.recompute.modules = r.heavy_modules;
  try {
    validate_config(check);  // unknown, duplicate or `full` combined: one line naming the module
  } catch (const Error& err) {
    throw Error(fmt::format("calibration: the heavy policy's modules (--heavy-modules): {}", err.what()));
  }
}

std::vector<ParallelLayout> calibration_layouts(const CalibrationRequest& r) {
  validate_calibration(r);
  const ProductionPreset v3 = production_preset("v3");
  PlanRequest plan;
  plan.model = v3.config;
  plan.title = v3.title;
  plan.gpus = kP1Gpus;
  plan.memory_gib = r.card_gib;
  plan.micro_batch = v3.layout.micro_batch;
  plan.seq_len = v3.layout.seq_len;
  plan.global_batch = v3.global_batch;
  plan.recipes = {Recipe::mxfp4};
  plan.tp_values = r.tp_values;
  std::vector<ParallelLayout> out;
  for (ParallelLayout& l : enumerate_layouts(plan)) {
    if (!contains(r.pp_values, l.pp) || !contains(r.ep_values, l.ep)) continue;
    l.grad_bytes = r.grad_bytes;
    l.source = "P1 calibration";
    out.push_back(std::move(l));
  }
  return out;
}

double max_abs_difference(const std::vector<double>& ours, const std::vector<double>& paper) {
  check_differences(ours, paper);
  double worst = 0;
  for (size_t i = 0; i < ours.size(); ++i) worst = std::max(worst, std::abs(ours[i] - paper[i]));
  return worst;
}

double minimax_offset(const std::vector<double>& ours, const std::vector<double>& paper) {
  check_differences(ours, paper);
  double lo = paper[0] - ours[0], hi = lo;
  for (size_t i = 1; i < ours.size(); ++i) {
    lo = std::min(lo, paper[i] - ours[i]);
    hi = std::max(hi, paper[i] - ours[i]);
  }
  return (lo + hi) / 2;
}

std::vector<CalibrationFit> calibrate_p1(const CalibrationRequest& r) {
  validate_calibration(r);
  const std::vector<PaperPolicy>& policies = paper_recompute_policies();
  std::vector<double> paper;
  for (const P1MemoryRow& row : p1_memory_rows()) paper.push_back(row.heavy_percent);
  std::vector<CalibrationFit> fits;
  for (const ParallelLayout& lay : calibration_layouts(r)) {
    CalibrationFit f;
    f.layout = lay;
    f.heavy = estimates(lay, r.heavy_modules);           // "attention + layernorm + experts"
    f.light = estimates(lay, policies.back().modules);   // "mla_up_proj only"
    f.heavy_percent = percentages(f.heavy, r);
    f.light_percent = percentages(f.light, r);
    f.error_pp = max_abs_difference(f.heavy_percent, paper);
    const double offset_pp = minimax_offset(f.heavy_percent, paper);
    f.best_overhead_gib = r.overhead_gib + offset_pp * r.card_gib / 100.0;
    std::vector<double> shifted = f.heavy_percent;
    for (double& p : shifted) p += offset_pp;
    f.error_at_best_pp = max_abs_difference(shifted, paper);
    fits.push_back(std::move(f));
  }
  std::stable_sort(fits.begin(), fits.end(), [](const CalibrationFit& a, const CalibrationFit& b) {
    if (a.error_pp != b.error_pp) return a.error_pp < b.error_pp;
    return a.error_at_best_pp < b.error_at_best_pp;
  });
  return fits;
}

std::string format_calibration(const std::vector<CalibrationFit>& fits, const CalibrationRequest& r, int64_t top) {
  FP4MOE_CHECK(top >= 1, "--top must be >= 1, got {}", top);
  FP4MOE_CHECK(!fits.empty(), "calibration: no layout to report (the searched ranges hold no valid layout)");
  const std::vector<P1MemoryRow>& rows = p1_memory_rows();
  const ProductionPreset v3 = production_preset("v3");
  const auto shown = static_cast<size_t>(std::min<int64_t>(top, static_cast<int64_t>(fits.size())));
  std::string s = "# P1 memory calibration: DeepSeek-V3 671B on 256 GPUs\n\n";
  s += fmt::format(
      "Assumptions: the memory estimator's buffer plans (trainer/memory/estimate.h), the largest pipeline stage; "
      "tp {{{}}}, pp {{{}}}, ep {{{}}} dividing dp x tp, dp = 256 / (tp pp): {} layouts; micro-batch {} x {} tokens, "
      "micro-batches per step = {} / dp, 1F1B, ZeRO-1 over dp (routed experts over dp tp / ep), balanced routing; "
      "gradients {} ({} B per element); framework overhead {:g} GiB added to every estimate; percentages of a "
      "{:g} GiB card (P1's \"% of memory\" of an 80 GB card, its base unstated: an 80e9-byte base would make ours "
      "{:.1f}% larger). P1's numbers: secondary summary, not checked against the paper. Fit: the largest |ours - "
      "P1| in percentage points over bf16, fp8, mxfp4 under recompute \"attention + layernorm + experts\", read as "
      "the modules {{{}}}; best "
      "overhead: the constant (GiB) that would minimise it (negative: ours holds more than P1's framework).\n\n",
      fmt::join(r.tp_values, ", "), fmt::join(r.pp_values, ", "), fmt::join(r.ep_values, ", "), fits.size(),
      v3.layout.micro_batch, v3.layout.seq_len, v3.global_batch, r.grad_bytes == 2 ? "BF16" : "FP32", r.grad_bytes,
      r.overhead_gib, r.card_gib, 100.0 * (r.card_gib * kGiB / 80e9 - 1.0), fmt::join(r.heavy_modules, ", "));
  s += "## Heavy policy (attention + layernorm + experts), best fits\n\n| rank | tp | pp | dp | ep | m |";
  for (const P1MemoryRow& row : rows)
    s += fmt::format(" {} % (P1 {:.2f}) |", recipe_name(row.recipe), row.heavy_percent);
  s += " max diff pp | best overhead GiB | max diff pp at it |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (size_t i = 0; i < shown; ++i) {
    const CalibrationFit& f = fits[i];
    s += fmt::format("| {} | {} |", i + 1, layout_cells(f.layout));
    for (double p : f.heavy_percent) s += fmt::format(" {:.2f} |", p);
    s += fmt::format(" {:.2f} | {:+.2f} | {:.2f} |\n", f.error_pp, f.best_overhead_gib, f.error_at_best_pp);
  }
  s += "\n## Light policy (mla_up_proj only) at those layouts: a prediction\n\n| rank | tp | pp | dp | ep | m |";
  for (const P1MemoryRow& row : rows)
    s += fmt::format(" {} % (P1 {}) |", recipe_name(row.recipe), light_text(row.light_percent));
  s += fmt::format(" fits {:g} GiB (ours) | agrees with P1 |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
                   r.card_gib);
  for (size_t i = 0; i < shown; ++i) {
    const CalibrationFit& f = fits[i];
    std::vector<std::string> fitting;
    bool agrees = true;
    for (size_t k = 0; k < rows.size(); ++k) {
      const bool ours = f.light_percent[k] <= 100.0;
      if (ours) fitting.push_back(recipe_name(rows[k].recipe));
      agrees = agrees && ours == (rows[k].light_percent >= 0);
    }
    s += fmt::format("| {} | {} |", i + 1, layout_cells(f.layout));
    for (double p : f.light_percent) s += fmt::format(" {:.2f} |", p);
    s += fmt::format(" {} | {} |\n", fitting.empty() ? std::string("none") : fmt::format("{}", fmt::join(fitting, ", ")),
                     agrees ? "yes" : "no");
  }
  s += "\n## Verdict\n\n";
  size_t within = 0;
  for (const CalibrationFit& f : fits) within += f.error_pp <= r.tolerance_pp ? 1 : 0;
  const CalibrationFit& best = fits.front();
  if (within > 0)
    return s + fmt::format("{} of {} layouts fit P1's three heavy-policy numbers within {:g} percentage points; the "
                           "best is tp {} pp {} dp {} ep {} (largest difference {:.2f} points).\n",
                           within, fits.size(), r.tolerance_pp, best.layout.tp, best.layout.pp, best.layout.dp,
                           best.layout.ep, best.error_pp);
  s += fmt::format("No layout fits P1's three heavy-policy numbers within {:g} percentage points: the best, tp {} pp "
                   "{} dp {} ep {}, differs by up to {:.2f} points (",
                   r.tolerance_pp, best.layout.tp, best.layout.pp, best.layout.dp, best.layout.ep, best.error_pp);
  for (size_t k = 0; k < rows.size(); ++k)
    s += fmt::format("{}{} {:+.2f} GiB", k ? ", " : "", recipe_name(rows[k].recipe),
                     (best.heavy_percent[k] - rows[k].heavy_percent) * r.card_gib / 100.0);
  s += fmt::format(" over P1); a constant overhead of {:+.2f} GiB would leave {:.2f} points.", best.best_overhead_gib,
                   best.error_at_best_pp);
  const MemoryEstimate& e = best.heavy.back();  // mxfp4
  std::vector<std::pair<double, std::string>> cats;
  for (int c = 0; c < kMemCategories; ++c)
    cats.emplace_back(e.gib(static_cast<MemCategory>(c)), mem_category_name(static_cast<MemCategory>(c)));
  std::sort(cats.rbegin(), cats.rend());
  s += fmt::format(" Its mxfp4 estimate (stage {}, {:.2f} GiB): ", e.stage, e.total_gib());
  for (size_t c = 0; c < 3 && c < cats.size(); ++c)
    s += fmt::format("{}{} {:.2f} GiB", c ? ", " : "", cats[c].second, cats[c].first);
  std::vector<std::pair<int64_t, std::string>> terms;
  for (const MemoryTerm& t : e.terms)
    if (t.total() > 0)
      terms.emplace_back(t.total(), fmt::format("{} {} ({})", t.module, t.tensor,
                                                mem_category_name(t.category)));
  std::sort(terms.rbegin(), terms.rend());
  s += " are its largest categories; its largest terms: ";
  for (size_t i = 0; i < 4 && i < terms.size(); ++i)
    s += fmt::format("{}{} {:.2f} GiB", i ? ", " : "", terms[i].second, static_cast<double>(terms[i].first) / kGiB);
  return s + ".\n";
}

}  // namespace fp4moe
