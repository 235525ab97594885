// The layout planner's Markdown report and result table (trainer/memory/plan.h: format_plan, plan_table).
#include <fmt/format.h>

#include <string>
#include <vector>

#include "kernels/common/check.h"
#include "trainer/memory/estimate_report.h"
#include "trainer/memory/plan.h"

namespace fp4moe {

namespace {

const char* recipe_text(Recipe r) {
  if (r == Recipe::mxfp4) return "mxfp4 (MXFP4 routed experts, FP8 elsewhere)";
  if (r == Recipe::fp8) return "fp8 (FP8 everywhere)";
  return "bf16 (BF16 everywhere)";
}

std::string layout_text(const ParallelLayout& l) {
  return fmt::format("tp {} pp {} dp {} ep {}, m {}", l.tp, l.pp, l.dp, l.ep, l.micro_batches);
}

const PlanCandidate* best_of(const PlanResult& result, Recipe r) {
  for (const PlanCandidate& c : result.fitting)
    if (c.recipe == r) return &c;  // fitting is ranked
  return nullptr;
}

const PlanCandidate* smallest_of(const PlanResult& result, Recipe r) {
  const PlanCandidate* least = nullptr;
  for (const PlanCandidate& c : result.all)
    if (c.recipe == r && (least == nullptr || c.memory_gib < least->memory_gib)) least = &c;
  return least;
}

// The candidate of recipe r at the layout and policy of `at`.
const PlanCandidate* same_cell(const PlanResult& result, const PlanCandidate& at, Recipe r) {
  for (const PlanCandidate& c : result.all)
    if (c.recipe == r && c.policy == at.policy && c.layout.name == at.layout.name) return &c;
  return nullptr;
}

std::string ratio_text(double a, double b) { return fmt::format("{:.3f}x ({:+.1f}%)", a / b, 100.0 * (a / b - 1.0)); }

}  // namespace

std::string format_plan(const PlanResult& result, const PlanRequest& r, int64_t top) {
  FP4MOE_CHECK(top >= 1, "--top must be >= 1, got {}", top);
  const PlanHardware& hw = r.hw;
  std::string s = fmt::format("# Layout plan: {} on {} GPUs of {:g} GiB\n\n", r.title, r.gpus, r.memory_gib);
  const std::string modelled = fmt::format("compute at {:.0f} TFLOP/s x MFU {:.2f} (assumed) for every recipe, "
                                           "recompute reruns counted",
                                           hw.peak_flops / 1e12, hw.mfu);
  if (r.measured_on.empty())
    s += fmt::format("Modelled, not measured (--no-measure; trainer/memory/plan.h): {}", modelled);
  else
    s += fmt::format(
        "Compute measured on the local {} where the compute column says so (trainer/memory/stage_times.h): one "
        "micro-batch, forward + backward with the policy's reruns, of each layer kind at tp 1 (`fp4moe train` on an "
        "emulated middle stage, E/ep local experts fed the balanced load; the LM head as a last stage minus a middle "
        "one; the embedding not counted), summed over the stage's layers; at tp > 1 divided by tp (measured/tp: "
        "perfect scaling, TP collectives not modelled). Those rows rank first; the others are modelled: {}",
        r.measured_on, modelled);
  s += fmt::format(
      "; EP all-to-all and PP transfers at NVLink {:.0f} GB/s "
      "and InfiniBand {:.0f} GB/s per GPU per direction, {} GPUs per node, not overlapped with compute; 1F1B bubble. "
      "Micro-batch {} x {} tokens, global batch {} sequences, ZeRO-1, balanced routing. {} layouts x {} recompute "
      "policies x {} recipes = {} estimates; {} fit in {:g} GiB (the largest stage's estimate).\n\n",
      hw.nvlink_bytes_per_s / 1e9, hw.ib_bytes_per_s / 1e9, hw.gpus_per_node,
      r.micro_batch, r.seq_len, r.global_batch, result.layouts, paper_recompute_policies().size(), r.recipes.size(),
      result.all.size(), result.fitting.size(), r.memory_gib);
  for (Recipe recipe : r.recipes) {
    s += fmt::format("## {}\n\n", recipe_text(recipe));
    if (best_of(result, recipe) == nullptr) {
      const PlanCandidate* least = smallest_of(result, recipe);
      s += least == nullptr
               ? fmt::format("No layout of {} GPUs is valid for this model.\n\n", r.gpus)
               : fmt::format("Nothing fits {:g} GiB under {}: the smallest estimate is {:.2f} GiB ({}, {}).\n\n",
                             r.memory_gib, recipe_name(recipe), least->memory_gib, layout_text(least->layout),
                             least->policy);
      continue;
    }
    s += fmt::format("| rank | tp | pp | dp | ep | m | recompute policy | memory GiB | % of {:g} GiB | compute ms | "
                     "EP ms | PP ms | bubble | compute | tokens/s per GPU |\n",
                     r.memory_gib);
    s += "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    int64_t rank = 0;
    for (const PlanCandidate& c : result.fitting) {
      if (c.recipe != recipe) continue;
      if (++rank > top) break;
      const ParallelLayout& l = c.layout;
      const StageTime& t = c.step.slowest;
      s += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {:.2f} | {:.1f}% | {:.2f} | {:.2f} | {:.2f} | {:.1f}% | "
                       "{} | {:.0f} |\n",
                       rank, l.tp, l.pp, l.dp, l.ep, l.micro_batches, c.policy, c.memory_gib,
                       100.0 * c.memory_gib / r.memory_gib, 1e3 * t.compute_s, 1e3 * t.ep_s, 1e3 * t.pp_s,
                       100.0 * c.step.bubble, c.compute_source, c.step.tokens_per_s_per_gpu);
    }
    s += "\n";
    for (const PlanCandidate& c : result.fitting)
      if (c.recipe == recipe && !c.compute_note.empty())
        s += fmt::format("- {}, {}: not measured, modelled instead ({}).\n", layout_text(c.layout), c.policy,
                         c.compute_note);
    if (s.back() != '\n' || s[s.size() - 2] != '\n') s += "\n";
  }

  s += "## Best tokens/s per GPU by recompute policy\n\n| recompute policy |";
  for (Recipe recipe : r.recipes) s += fmt::format(" {} |", recipe_name(recipe));
  s += "\n|---|";
  for (size_t i = 0; i < r.recipes.size(); ++i) s += "---|";
  s += "\n";
  for (const PaperPolicy& policy : paper_recompute_policies()) {
    s += fmt::format("| {} |", policy.label);
    for (Recipe recipe : r.recipes) {
      const PlanCandidate* best = nullptr;
      for (const PlanCandidate& c : result.fitting)
        if (c.recipe == recipe && c.policy == policy.label) {
          best = &c;
          break;
        }
      s += best == nullptr ? std::string(" - |")
                           : fmt::format(" {:.0f} ({}, {:.2f} GiB) |", best->step.tokens_per_s_per_gpu,
                                         layout_text(best->layout), best->memory_gib);
    }
    s += "\n";
  }
  s += "\n";

  const PlanCandidate* mx = best_of(result, Recipe::mxfp4);
  bool asked_mx = false;
  for (Recipe recipe : r.recipes) asked_mx = asked_mx || recipe == Recipe::mxfp4;
  if (!asked_mx || r.recipes.size() < 2) return s;
  s += "## What mxfp4 buys\n\n";
  if (mx == nullptr) return s + fmt::format("Nothing fits {:g} GiB under mxfp4.\n", r.memory_gib);
  s += fmt::format("mxfp4's best: {}, {}: {:.2f} GiB, {:.0f} tokens/s per GPU.\n", layout_text(mx->layout),
                   mx->policy, mx->memory_gib, mx->step.tokens_per_s_per_gpu);
  for (Recipe other : r.recipes) {
    if (other == Recipe::mxfp4) continue;
    const PlanCandidate* o = best_of(result, other);
    const PlanCandidate* same = same_cell(result, *mx, other);
    std::string line = fmt::format("- over {}: ", recipe_name(other));
    if (o == nullptr) line += fmt::format("{} fits nowhere in {:g} GiB", recipe_name(other), r.memory_gib);
    else
      line += fmt::format("best vs best {} tokens/s per GPU ({} best: {}, {}, {:.2f} GiB)",
                          ratio_text(mx->step.tokens_per_s_per_gpu, o->step.tokens_per_s_per_gpu),
                          recipe_name(other), layout_text(o->layout), o->policy, o->memory_gib);
    if (same != nullptr)
      line += fmt::format("; at mxfp4's layout and policy {} needs {:.2f} GiB ({}, mxfp4 {:+.2f} GiB)",
                          recipe_name(other), same->memory_gib, same->memory_gib <= r.memory_gib ? "fits" : "does not fit",
                          mx->memory_gib - same->memory_gib);
    s += line + ".\n";
  }
  return s;
}

Table plan_table(const PlanResult& result, const PlanRequest& r) {
  Table t;
  for (const char* c : {"recipe", "policy", "compute_source"}) t.add_column(c, ColumnType::str);
  for (const char* c : {"tp", "pp", "dp", "ep", "micro_batches", "memory_stage", "fits", "rank", "slowest_stage"})
    t.add_column(c, ColumnType::i64);
  for (const char* c : {"memory_gib", "compute_s", "ep_s", "pp_s", "bubble", "step_s", "tokens_per_s_per_gpu"})
    t.add_column(c, ColumnType::f64);
  for (const PlanCandidate& c : result.all) {
    const ParallelLayout& l = c.layout;
    const StageTime& s = c.step.slowest;
    int64_t rank = 0, seen = 0;  // the place among the recipe's fitting candidates, as the report ranks them
    for (const PlanCandidate& f : result.fitting) {
      if (f.recipe != c.recipe) continue;
      ++seen;
      if (f.policy == c.policy && f.layout.name == l.name) {
        rank = seen;
        break;
      }
    }
    t.add_row({recipe_name(c.recipe), c.policy, c.compute_source, l.tp, l.pp, l.dp, l.ep, l.micro_batches, c.memory_stage,
               int64_t{c.memory_gib <= r.memory_gib}, rank, c.step.slowest_stage, c.memory_gib, s.compute_s, s.ep_s,
               s.pp_s, c.step.bubble, c.step.step_s, c.step.tokens_per_s_per_gpu});
  }
  t.set_attribute("model", r.title);
  t.set_attribute("gpus", r.gpus);
  t.set_attribute("memory_gib", r.memory_gib);
  t.set_attribute("micro_batch", r.micro_batch);
  t.set_attribute("seq_len", r.seq_len);
  t.set_attribute("global_batch", r.global_batch);
  t.set_attribute("peak_flops", r.hw.peak_flops);
  t.set_attribute("mfu", r.hw.mfu);
  t.set_attribute("nvlink_bytes_per_s", r.hw.nvlink_bytes_per_s);
  t.set_attribute("ib_bytes_per_s", r.hw.ib_bytes_per_s);
  t.set_attribute("gpus_per_node", r.hw.gpus_per_node);
  t.set_attribute("measured", int64_t{!r.measured_on.empty()});
  t.set_attribute("measured_on", r.measured_on.empty() ? std::string("none") : r.measured_on);
  return t;
}

}  // namespace fp4moe
