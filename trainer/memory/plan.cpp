// The layout planner's cost model, enumeration and ranking (trainer/memory/plan.h).
#include "trainer/memory/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include <CLI/CLI.hpp>

#include "kernels/common/check.h"
#include "trainer/memory/estimate_report.h"

namespace fp4moe {

namespace {

bool positive(double v) { return std::isfinite(v) && v > 0; }

// The forward FLOPs per token of a layer on one GPU, the routed experts' share scaled by the routed load.
LayerFlopsPerToken loaded_layer_flops(const TrainerConfig& cfg, const ParallelLayout& lay, int64_t layer) {
  LayerFlopsPerToken f = layer_flops_per_token(cfg, layer, lay.seq_len);
  f.routed_experts *= lay.routed_load;
  return f;
}

}  // namespace

void validate_hardware(const PlanHardware& hw) {
  FP4MOE_CHECK(positive(hw.peak_flops), "peak FLOP/s must be a finite number > 0, got {}", hw.peak_flops);
  FP4MOE_CHECK(std::isfinite(hw.mfu) && hw.mfu > 0 && hw.mfu <= 1, "mfu must be in (0, 1], got {}", hw.mfu);
  FP4MOE_CHECK(positive(hw.nvlink_bytes_per_s), "NVLink bandwidth must be a finite number > 0, got {} B/s",
               hw.nvlink_bytes_per_s);
  FP4MOE_CHECK(positive(hw.ib_bytes_per_s), "InfiniBand bandwidth must be a finite number > 0, got {} B/s",
               hw.ib_bytes_per_s);
  FP4MOE_CHECK(hw.gpus_per_node >= 1, "GPUs per node must be >= 1, got {}", hw.gpus_per_node);
}

StageTime stage_time(const StageCost& c, const PlanHardware& hw) {
  validate_hardware(hw);
  StageTime t;
  t.compute_s = c.flops / (hw.peak_flops * hw.mfu);
  t.ep_s = std::max(c.ep_nvlink_bytes / hw.nvlink_bytes_per_s, c.ep_ib_bytes / hw.ib_bytes_per_s);
  t.pp_s = c.pp_bytes / (c.pp_over_ib ? hw.ib_bytes_per_s : hw.nvlink_bytes_per_s);
  return t;
}

StepPrediction predict_step(const std::vector<StageTime>& stages, int64_t m, int64_t tokens, int64_t tp) {
  FP4MOE_CHECK(!stages.empty(), "predict_step: needs at least one stage");
  FP4MOE_CHECK(m >= 1 && tokens >= 1 && tp >= 1,
               "predict_step: micro-batches, tokens and tp must be >= 1, got {}, {}, {}", m, tokens, tp);
  StepPrediction p;
  for (size_t s = 0; s < stages.size(); ++s) {
    FP4MOE_CHECK(std::isfinite(stages[s].total()) && stages[s].total() > 0,
                 "predict_step: stage {} takes {} s per micro-batch, expected > 0", s, stages[s].total());
    if (stages[s].total() > p.slowest.total()) {
      p.slowest = stages[s];
      p.slowest_stage = static_cast<int64_t>(s);
    }
  }
  const auto pp = static_cast<double>(stages.size()), md = static_cast<double>(m);
  p.bubble = (pp - 1) / (md + pp - 1);
  p.step_s = (md + pp - 1) * p.slowest.total();
  p.tokens_per_s_per_gpu = md * static_cast<double>(tokens) / (p.step_s * static_cast<double>(tp) * pp);
  return p;
}

double recompute_flops_per_token(const LayerFlopsPerToken& f, const RecomputeConfig& r) {
  if (r.has("full")) return f.total();
  double rerun = 0;
  if (r.has("mla_up_proj")) rerun += f.mla_up;
  if (r.has("core_attn")) rerun += f.attention_core;
  if (r.has("mlp")) rerun += f.dense_ffn;
  if (r.has("moe")) rerun += f.router + f.routed_experts + f.shared_experts;
  else if (r.has("shared_experts")) rerun += f.shared_experts;
  return rerun;  // layernorm, moe_act: element-wise, 0 GEMM FLOPs
}

std::vector<StageCost> stage_costs(const TrainerConfig& cfg, const ParallelLayout& lay, const PlanHardware& hw) {
  validate_config(cfg);
  validate_hardware(hw);
  const std::vector<int64_t> counts = stage_layer_counts(cfg, lay);  // validates the layout
  const double N = static_cast<double>(lay.micro_batch * lay.seq_len), tp = static_cast<double>(lay.tp);
  const double Ns = N / tp, d = static_cast<double>(cfg.model.hidden);

  // EP: bytes one GPU sends per MoE layer and micro-batch, split by link (plan.h).
  const ExpertParallelRowBytes row = expert_parallel_row_bytes(cfg.recipe.routed_experts, cfg.model.hidden);
  const double sent = Ns * static_cast<double>(cfg.moe.top_k), received = sent * lay.routed_load;
  const double ep_bytes = sent * static_cast<double>(row.dispatch + row.backward_dispatch) +
                          received * static_cast<double>(row.combine + row.backward_combine);
  const double ep = static_cast<double>(lay.ep), in_node = static_cast<double>(std::min(lay.ep, hw.gpus_per_node));
  const double ep_nvlink = ep_bytes * (in_node - 1) / ep, ep_ib = ep_bytes * (ep - in_node) / ep;
  const double hidden_bytes = 2.0 * Ns * d;
  const bool pp_over_ib = lay.gpus / lay.pp >= hw.gpus_per_node;

  std::vector<StageCost> out;
  int64_t first = 0;
  for (int64_t s = 0; s < lay.pp; ++s) {
    StageCost c;
    double per_token = 0;
    for (int64_t l = first; l < first + counts[static_cast<size_t>(s)]; ++l) {
      const LayerFlopsPerToken f = loaded_layer_flops(cfg, lay, l);
      per_token += 3.0 * f.total() + recompute_flops_per_token(f, cfg.recompute);
      if (cfg.is_moe_layer(l) && lay.ep > 1) {
        c.ep_nvlink_bytes += ep_nvlink;
        c.ep_ib_bytes += ep_ib;
      }
    }
    if (s == lay.pp - 1) per_token += 3.0 * lm_head_flops_per_token(cfg.model);
    c.flops = Ns * per_token;
    c.pp_bytes = (s < lay.pp - 1 ? hidden_bytes : 0.0) + (s > 0 ? hidden_bytes : 0.0);
    c.pp_over_ib = pp_over_ib;
    out.push_back(c);
    first += counts[static_cast<size_t>(s)];
  }
  return out;
}

void validate_request(const PlanRequest& r) {
  constexpr int64_t kMaxGpus = int64_t{1} << 20;  // as [parallel] (trainer/config.h)
  FP4MOE_CHECK(r.gpus >= 1 && r.gpus <= kMaxGpus, "--gpus must be in [1, {}], got {}", kMaxGpus, r.gpus);
  FP4MOE_CHECK(positive(r.memory_gib), "--memory-gib must be a finite number > 0, got {}", r.memory_gib);
  FP4MOE_CHECK(r.micro_batch >= 1 && r.seq_len >= 1, "micro_batch and seq_len must be >= 1, got {} and {}",
               r.micro_batch, r.seq_len);
  FP4MOE_CHECK(r.global_batch >= 1, "--global-batch must be >= 1, got {}", r.global_batch);
  FP4MOE_CHECK(r.micro_batch <= kMaxGpus, "micro_batch {} exceeds {} rows", r.micro_batch, kMaxGpus);
  FP4MOE_CHECK(!r.recipes.empty(), "--recipes names no recipe (expected some of bf16, fp8, mxfp4)");
  FP4MOE_CHECK(!r.tp_values.empty(), "--tp names no tensor-parallel size (expected some of 1, 2, 4, 8)");
  for (int64_t tp : r.tp_values)
    FP4MOE_CHECK(tp == 1 || tp == 2 || tp == 4 || tp == 8, "--tp {} is not one of 1, 2, 4, 8", tp);
  validate_hardware(r.hw);
}

std::vector<ParallelLayout> enumerate_layouts(const PlanRequest& r) {
  validate_request(r);
  const TrainerConfig& cfg = r.model;
  const bool has_moe = cfg.model.n_dense_layers < cfg.model.layers;
  std::vector<ParallelLayout> out;
  for (int64_t tp : r.tp_values)
    for (int64_t pp = 1; pp <= std::min<int64_t>(16, cfg.model.layers); ++pp) {
      if (r.gpus % (tp * pp) != 0) continue;
      const int64_t dp = r.gpus / (tp * pp);
      if (r.global_batch % (dp * r.micro_batch) != 0) continue;
      const int64_t experts = has_moe ? std::gcd(cfg.moe.routed_experts, dp * tp) : 1;
      for (int64_t ep = 1; ep <= experts; ++ep) {
        if (experts % ep != 0) continue;
        ParallelLayout l;
        l.name = fmt::format("tp {} pp {} dp {} ep {}", tp, pp, dp, ep);
        l.source = "fp4moe plan";
        l.gpus = r.gpus;
        l.tp = tp;
        l.pp = pp;
        l.dp = dp;
        l.ep = ep;
        l.micro_batch = r.micro_batch;
        l.seq_len = r.seq_len;
        l.micro_batches = r.global_batch / (dp * r.micro_batch);
        l.zero1 = true;
        try {
          validate_layout(cfg, l);
        } catch (const Error&) {
          continue;  // tp not dividing a width, ...: not a layout of this model
        }
        out.push_back(std::move(l));
      }
    }
  return out;
}

TrainerConfig plan_config_from_file(const std::string& path, int64_t& global_batch) {
  TrainerConfig cfg;
  CLI::App app{"trainer configuration"};
  ConfigOptions options(app, cfg);
  try {
    app.parse(std::vector<std::string>{path, "--config"});  // CLI11 takes the arguments in reverse order
  } catch (const CLI::ParseError& err) {
    FP4MOE_CHECK(false, "command line: {}", err.what());
  }
  options.load_config_file();
  const ParallelConfig& p = cfg.parallel;
  FP4MOE_CHECK(p.micro_batches >= 1 && p.dp >= 1, "[parallel] micro_batches and dp must be >= 1, got {} and {}",
               p.micro_batches, p.dp);
  int64_t sequences = 0;
  FP4MOE_CHECK(!__builtin_mul_overflow(p.micro_batches, p.dp, &sequences) &&
                   !__builtin_mul_overflow(sequences, cfg.train.micro_batch, &sequences),
               "[parallel] micro_batches {} x dp {} x train.micro_batch {} overflows", p.micro_batches, p.dp,
               cfg.train.micro_batch);
  global_batch = sequences;
  cfg.parallel = ParallelConfig{};
  validate_config(cfg);
  return cfg;
}

std::string explain_no_layout(const PlanRequest& r) {
  validate_request(r);
  const int64_t max_pp = std::min<int64_t>(16, r.model.model.layers);
  std::vector<std::string> splits;  // "tp 1 pp 3 dp 85"
  std::vector<int64_t> dps;
  std::string rejected;
  for (int64_t tp : r.tp_values)
    for (int64_t pp = 1; pp <= max_pp; ++pp) {
      if (r.gpus % (tp * pp) != 0) continue;
      const int64_t dp = r.gpus / (tp * pp);
      splits.push_back(fmt::format("tp {} pp {} dp {}", tp, pp, dp));
      if (r.global_batch % (dp * r.micro_batch) != 0) {
        if (std::find(dps.begin(), dps.end(), dp) == dps.end()) dps.push_back(dp);
      } else if (rejected.empty()) {
        rejected = fmt::format("tp {} pp {} dp {}", tp, pp, dp);
      }
    }
  std::string s = fmt::format("no layout of {} GPUs exists for {}: tp x pp x dp = {} with tp in {{{}}} and pp in 1..{}",
                              r.gpus, r.title, r.gpus, fmt::join(r.tp_values, ", "), max_pp);
  if (splits.empty()) return s + " has no solution";
  s += fmt::format(" gives {} ({})", splits.size() == 1 ? "one" : fmt::format("{}", splits.size()),
                   fmt::join(splits, ", "));
  if (rejected.empty())
    return s + fmt::format(", and no dp of them ({}) divides the global batch of {} sequences into micro-batches of "
                           "{} (set --global-batch to a multiple of dp x micro-batch)",
                           fmt::join(dps, ", "), r.global_batch, r.micro_batch);
  return s + fmt::format(", and the model rejects each one whose dp divides the global batch (such as {}: tp must "
                         "divide the heads and widths, ep the routed experts)", rejected);
}

PlanResult plan_layouts(const PlanRequest& r, const std::function<void(int64_t, int64_t)>& progress) {
  validate_request(r);
  PlanResult result;
  const std::vector<ParallelLayout> layouts = enumerate_layouts(r);
  const std::vector<PaperPolicy>& policies = paper_recompute_policies();
  result.layouts = static_cast<int64_t>(layouts.size());
  const int64_t total = result.layouts * static_cast<int64_t>(policies.size());
  int64_t done = 0;
  for (const ParallelLayout& lay : layouts)
    for (const PaperPolicy& policy : policies) {
      for (size_t i = 0; i < r.recipes.size(); ++i) {
        const TrainerConfig cfg = candidate_config(r, r.recipes[i], policy.modules);
        const MemoryEstimate e = estimate_memory(cfg, lay);
        PlanCandidate c;
        c.layout = lay;
        c.policy = policy.label;
        c.recipe = r.recipes[i];
        c.memory_gib = e.total_gib();
        c.memory_stage = e.stage;
        std::vector<StageTime> times;
        for (const StageCost& sc : stage_costs(cfg, lay, r.hw)) times.push_back(stage_time(sc, r.hw));
        c.step = predict_step(times, lay.micro_batches, lay.micro_batch * lay.seq_len, lay.tp);
        if (c.memory_gib <= r.memory_gib) result.fitting.push_back(c);
        result.all.push_back(std::move(c));
      }
      if (progress) progress(++done, total);
    }
  rank_candidates(result.fitting);
  return result;
}

TrainerConfig candidate_config(const PlanRequest& r, Recipe recipe, const std::vector<std::string>& policy) {
  TrainerConfig cfg = r.model;
  cfg.parallel = ParallelConfig{};
  cfg.train.micro_batch = r.micro_batch;
  cfg.train.seq_len = r.seq_len;
  cfg.recipe = paper_recipe(recipe);
  cfg.recompute.modules = policy;
  return cfg;
}

void rank_candidates(std::vector<PlanCandidate>& candidates) {
  std::stable_sort(candidates.begin(), candidates.end(), [](const PlanCandidate& a, const PlanCandidate& b) {
    const bool a_measured = a.compute_source != "modelled", b_measured = b.compute_source != "modelled";
    if (a_measured != b_measured) return a_measured;
    if (a.step.tokens_per_s_per_gpu != b.step.tokens_per_s_per_gpu)
      return a.step.tokens_per_s_per_gpu > b.step.tokens_per_s_per_gpu;
    return a.memory_gib < b.memory_gib;
  });
}

}  // namespace fp4moe
