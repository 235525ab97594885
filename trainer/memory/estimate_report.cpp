// Production presets, paper 1's policies x recipes table and the dry run's text (trainer/memory/estimate_report.h).
#include "trainer/memory/estimate_report.h"

#include <fmt/format.h>

#include <algorithm>

#include "kernels/common/check.h"
#include "trainer/model/model.h"

namespace fp4moe {

namespace {

constexpr double kGiB = 1073741824.0;

// A schedule that validate_config accepts; the estimate reads none of it.
TrainingConfig production_training(double lr) {
  TrainingConfig t;
  t.data_dir = "data/cache/shards";
  t.seq_len = 4096;
  t.micro_batch = 1;
  t.steps = 1;
  t.lr = lr;
  t.min_lr = lr / 10;
  t.weight_decay = 0.1;
  return t;
}

ProductionPreset v3_preset() {
  ProductionPreset p;
  p.name = "v3";
  p.title = "DeepSeek-V3 671B";
  ModelConfig& m = p.config.model;
  m = ModelConfig{"v3-671b", 129280, 7168, 61, 3, 128, 1536, 512, 128, 64, 128, 18432, 10000.0, 1e-6};
  p.config.moe = MoeConfig{256, 1, 8, 2048, RouterStyle::v3_sigmoid, 2.5, 0.0, 0.001};
  p.config.train = production_training(2.2e-4);
  ParallelLayout& l = p.layout;
  l.name = "DeepSeek-V3 671B, 256 GPUs";
  l.source = "P1 (arXiv 2603.02731): 256 Hopper GPUs; EP 64 as configs/v3.toml reads the paper, hence PP 4, TP 1, "
             "DP 64; ZeRO-1 as DeepSeek-V3 trains; micro-batch 1 x 4096 tokens";
  l.gpus = 256;
  l.pp = 4;
  l.dp = 64;
  l.ep = 64;
  l.micro_batch = 1;
  l.seq_len = 4096;
  l.zero1 = true;
  p.global_batch = 15360;
  l.micro_batches = p.global_batch / (l.dp * l.micro_batch);
  return p;
}

ProductionPreset v2_preset() {
  ProductionPreset p;
  p.name = "v2";
  p.title = "DeepSeek-V2 236B";
  ModelConfig& m = p.config.model;
  m = ModelConfig{"v2-236b", 102400, 5120, 60, 1, 128, 1536, 512, 128, 64, 128, 12288, 10000.0, 1e-6};
  p.config.moe = MoeConfig{160, 2, 6, 1536, RouterStyle::v2_softmax, 16.0, 0.003, 0.0};
  p.config.train = production_training(2.4e-4);
  ParallelLayout& l = p.layout;
  l.name = "DeepSeek-V2 236B, 128 GPUs";
  l.source = "DeepSeek-V2 report sec. 3.1.3: PP 16, EP 8, ZeRO-1 DP; DP = EP = 8 (P1's GPU count for 236B is not "
             "known here); micro-batch 1 x 4096 tokens";
  l.gpus = 128;
  l.pp = 16;
  l.dp = 8;
  l.ep = 8;
  l.micro_batch = 1;
  l.seq_len = 4096;
  l.zero1 = true;
  p.global_batch = 9216;
  l.micro_batches = p.global_batch / (l.dp * l.micro_batch);
  return p;
}

std::string modules_text(const std::vector<std::string>& modules) {
  return modules.empty() ? std::string("none") : fmt::format("{}", fmt::join(modules, " "));
}

// Bytes in the largest unit that keeps the number >= 1 (KiB, MiB or GiB).
std::string human(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= kGiB) return fmt::format("{:.3f} GiB", b / kGiB);
  if (b >= 1048576.0) return fmt::format("{:.2f} MiB", b / 1048576.0);
  return fmt::format("{:.1f} KiB", b / 1024.0);
}

// P1's number for a cell of the DeepSeek-V3 table (secondary summary, not checked against the paper).
std::string paper_cell(const std::string& preset, size_t policy, Recipe r) {
  if (preset != "v3") return "";
  if (policy == 0) return r == Recipe::bf16 ? "68.29%" : r == Recipe::fp8 ? "74.20%" : "59.40%";
  if (policy == 2) return r == Recipe::mxfp4 ? "70.11%" : "out of memory";
  return "";
}

}  // namespace

ProductionPreset production_preset(const std::string& name) {
  if (name == "v3") return v3_preset();
  if (name == "v2") return v2_preset();
  FP4MOE_CHECK(false, "production preset '{}': expected v3 (DeepSeek-V3 671B) or v2 (DeepSeek-V2 236B)", name);
  return {};
}

TrainerConfig with_production_shape(const TrainerConfig& cfg, const ProductionPreset& preset) {
  TrainerConfig out = cfg;
  out.model = preset.config.model;
  out.moe = preset.config.moe;
  out.train.micro_batch = preset.layout.micro_batch;
  out.train.seq_len = preset.layout.seq_len;
  return out;
}

const std::vector<PaperPolicy>& paper_recompute_policies() {
  static const std::vector<PaperPolicy> policies = {
      {"attention + layernorm + experts", {"core_attn", "layernorm", "moe"}},
      {"moe_act + mla_up_proj", {"moe_act", "mla_up_proj"}},
      {"mla_up_proj only", {"mla_up_proj"}},
  };
  return policies;
}

RecipeConfig paper_recipe(Recipe recipe) {
  const Recipe rest = recipe == Recipe::bf16 ? Recipe::bf16 : Recipe::fp8;
  return RecipeConfig{rest, rest, rest, recipe};
}

std::vector<PolicyRecipeCell> paper_policy_table(const ProductionPreset& preset) {
  std::vector<PolicyRecipeCell> cells;
  const std::vector<PaperPolicy>& policies = paper_recompute_policies();
  for (size_t i = 0; i < policies.size(); ++i)
    for (Recipe r : {Recipe::bf16, Recipe::fp8, Recipe::mxfp4}) {
      TrainerConfig cfg = preset.config;
      cfg.recipe = paper_recipe(r);
      cfg.recompute.modules = policies[i].modules;
      cells.push_back(PolicyRecipeCell{policies[i].label, r, estimate_memory(cfg, preset.layout),
                                       paper_cell(preset.name, i, r)});
    }
  return cells;
}

std::string format_paper_policy_table(const std::vector<PolicyRecipeCell>& cells, const ProductionPreset& preset) {
  const ParallelLayout& l = preset.layout;
  std::string s = fmt::format(
      "P1's recompute policies x recipes on {} ({}: pp {}, tp {}, dp {}, ep {}{}), the stage with the largest "
      "total:\n\n",
      preset.title, l.name, l.pp, l.tp, l.dp, l.ep, l.zero1 ? ", ZeRO-1" : "");
  s += "| policy | recompute | recipe | stage | activations GiB | total GiB | % of 80 GiB | fits 80 GiB | "
       "% of 141 GiB | P1 (% of memory) |\n";
  s += "|---|---|---|---|---|---|---|---|---|---|\n";
  const std::vector<PaperPolicy>& policies = paper_recompute_policies();
  for (const PolicyRecipeCell& c : cells) {
    std::string modules;
    for (const PaperPolicy& p : policies)
      if (p.label == c.policy) modules = modules_text(p.modules);
    const MemoryEstimate& e = c.estimate;
    s += fmt::format("| {} | {} | {} | {} | {:.2f} | {:.2f} | {:.1f}% | {} | {:.1f}% | {} |\n", c.policy, modules,
                     recipe_name(c.recipe), e.stage, e.gib(MemCategory::activations), e.total_gib(),
                     100.0 * e.fraction_of(kCard80GiB), e.total_gib() <= kCard80GiB ? "yes" : "no",
                     100.0 * e.fraction_of(kCard141GiB), c.paper.empty() ? "-" : c.paper);
  }
  s += "\n";
  if (preset.name == "v3")
    s += "P1 column: P1, secondary summary (not checked against the paper): device memory in use per GPU.\n";
  for (const PaperPolicy& p : policies) {
    const MemoryEstimate *fp8 = nullptr, *mx = nullptr;
    for (const PolicyRecipeCell& c : cells) {
      if (c.policy != p.label) continue;
      if (c.recipe == Recipe::fp8) fp8 = &c.estimate;
      if (c.recipe == Recipe::mxfp4) mx = &c.estimate;
    }
    if (!fp8 || !mx) continue;
    const double a8 = fp8->gib(MemCategory::activations), a4 = mx->gib(MemCategory::activations);
    s += fmt::format("mxfp4 vs fp8 activations, {}: {:+.1f}% ({:+.2f} GiB); total {:+.1f}%\n", p.label,
                     100.0 * (a4 / a8 - 1.0), a4 - a8, 100.0 * (mx->total_gib() / fp8->total_gib() - 1.0));
  }
  s += preset.name == "v3"
           ? "P1 (671B): peak activation memory -14.8% (11.8 GB) with MXFP4 storage (abstract).\n"
           : "P1 (236B): about 7-11% less memory than FP8 and BF16 (abstract summaries); -6.9% / -7.2% vs FP8 "
             "(secondary summary, not checked against the paper).\n";
  return s;
}

std::string format_memory_estimate(const MemoryEstimate& e, const TrainerConfig& cfg) {
  const ParallelLayout& l = e.layout;
  std::string s = fmt::format("memory estimate, {} ({})\n", l.name, l.source);
  s += fmt::format("  layout: {} GPU{}, pp {} tp {} dp {} ep {}{}{}; stage {} (layers {}-{}), {} micro-batch{} of {} "
                   "tokens in flight ({} per step); recipe attention {}, dense_mlp {}, shared_experts {}, "
                   "routed_experts {}; recompute {}\n",
                   l.gpus, l.gpus == 1 ? "" : "s", l.pp, l.tp, l.dp, l.ep, l.zero1 ? ", ZeRO-1" : "",
                   l.routed_load == 1.0 ? "" : fmt::format(", routed load {:g}", l.routed_load), e.stage,
                   e.first_layer, e.first_layer + e.layers - 1, e.in_flight, e.in_flight == 1 ? "" : "es", e.tokens,
                   l.micro_batches,
                   recipe_name(cfg.recipe.attention), recipe_name(cfg.recipe.dense_mlp),
                   recipe_name(cfg.recipe.shared_experts), recipe_name(cfg.recipe.routed_experts),
                   modules_text(cfg.recompute.modules));
  for (int c = 0; c < kMemCategories; ++c) {
    const auto cat = static_cast<MemCategory>(c);
    std::string detail;
    for (const MemoryTerm& t : e.terms)
      if (t.category == cat && t.module == "params" && t.total() > 0)
        detail += fmt::format("{}{} {}", detail.empty() ? "" : ", ", t.tensor, human(t.total()));
    if (cat == MemCategory::activations) {
      int64_t largest = 0;
      for (int64_t b : e.layer_activation_bytes) largest = std::max(largest, b);
      detail = fmt::format("largest layer {} per micro-batch", human(largest));
      for (const auto& [module, bytes] : e.activations_by_module())
        detail += fmt::format(", {} {}", module, human(bytes));
    }
    if (cat == MemCategory::workspace) {
      int64_t arena = 0;
      for (const MemoryTerm& t : e.terms)
        if (t.category == cat && t.tensor == kScratchArenaTerm) arena += t.total();
      detail = fmt::format("shared scratch arena {} (the largest pass) + held buffers; with every layer's scratch "
                           "summed instead: {}",
                           human(arena), human(e.workspace_all_layers));
    }
    s += fmt::format("  {:<12} {:>12}{}\n", mem_category_name(cat), human(e.category(cat)),
                     detail.empty() ? "" : "  (" + detail + ")");
  }
  s += fmt::format("  {:<12} {:>12}  ({:.1f}% of an 80 GiB card, {:.1f}% of a 141 GiB card)\n", "total",
                   human(e.total()), 100.0 * e.fraction_of(kCard80GiB), 100.0 * e.fraction_of(kCard141GiB));
  if (layout_is_emulated(l)) {  // the trainer runs this GPU (one GPU, or one emulated GPU of the layout)
    std::string dm;
    for (int c = 0; c < kMemCategories; ++c)
      dm += fmt::format("{}{} {}", c ? ", " : "", mem_category_name(static_cast<MemCategory>(c)),
                        human(e.device_memory[c]));
    s += fmt::format("  DeviceMemory's count when the trainer runs this GPU (256-byte allocations): {}\n", dm);
  }
  return s;
}

}  // namespace fp4moe
