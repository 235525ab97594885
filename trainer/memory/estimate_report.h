// The production configurations of paper 1 for the memory estimator (trainer/memory/estimate.h), its recompute
// policies x recipes table, and the text `fp4moe train --dry-run` prints.
//
// Presets (production_preset), each a full TrainerConfig of the production shape (recipe bf16, no recompute: a
// caller applies its own with with_production_shape) and a ParallelLayout:
//   v3  DeepSeek-V3 671B (V3 report sec. 4.2: 61 layers, 3 dense, 256 routed experts top-8, 1 shared, vocabulary
//       129280) on 256 GPUs, the setting of paper 1 (P1, arXiv 2603.02731). Expert parallelism 64 (4 experts per
//       GPU, as configs/v3.toml reads the paper); 256 GPUs then leave pp x tp = 4: pp 4, tp 1, dp 64, ZeRO-1 over
//       dp (V3 report sec. 3.2: ZeRO-1 data parallelism). configs/v3.toml's "61 layers over 16 stages" together
//       with EP 64 would take 1024 GPUs (DeepSeek's own 2048-GPU layout: PP 16, EP 64). Micro-batch 1 x 4096
//       tokens (V3's pre-training sequence length). Global batch 15360 sequences (V3 report sec. 4.2, the batch
//       size after its ramp), hence 15360 / dp 64 = 240 micro-batches per step per pipeline. 1F1B: stage 0 keeps
//       4 micro-batches of its 15 layers.
//   v2  DeepSeek-V2 236B (V2 report sec. 3.1.2: 60 layers, 1 dense, 160 routed experts top-6, 2 shared,
//       vocabulary 102400) with V2's published parallelism (V2 report sec. 3.1.3: 16-way pipeline, 8-way expert
//       parallelism, ZeRO-1 data parallelism). P1 does not state, in the material this project has, the GPU count
//       of its 236B runs: dp = ep = 8 (the smallest data-parallel size that holds EP 8) gives 128 GPUs.
//       Micro-batch 1 x 4096 tokens; global batch 9216 sequences (V2 report sec. 3.1.2, after its ramp), hence
//       9216 / dp 8 = 1152 micro-batches per step per pipeline.
// Layers split over stages as stage_layer_counts does (the later stages take the remainder).
//
// Paper policies (paper_recompute_policies, P1's three settings named in Megatron-Core's modules):
//   "attention + layernorm + experts"   core_attn layernorm moe
//   "moe_act + mla_up_proj"             moe_act mla_up_proj
//   "mla_up_proj only"                  mla_up_proj
// Paper recipes (paper_recipe): bf16 everywhere; fp8 everywhere (the FP8 baseline); mxfp4 = P1's recipe, MXFP4
// routed experts with FP8 everywhere else (configs/v3.toml).
#pragma once

#include <string>
#include <vector>

#include "trainer/config.h"
#include "trainer/memory/estimate.h"

namespace fp4moe {

inline constexpr double kCard80GiB = 80.0;    // H100/H800 80 GB, taken as 80 GiB (nominal)
inline constexpr double kCard141GiB = 141.0;  // H200 141 GB, taken as 141 GiB (nominal)

struct ProductionPreset {
  std::string name;      // "v3" or "v2"
  std::string title;     // "DeepSeek-V3 671B"
  TrainerConfig config;  // the production shape; recipe bf16, no recompute
  ParallelLayout layout;
  int64_t global_batch = 0;  // sequences of layout.seq_len tokens per optimizer step, all replicas together
};

// "v3" or "v2" (above); throws fp4moe::Error naming the choices for anything else.
ProductionPreset production_preset(const std::string& name);

// `cfg` with the preset's [model] and [moe] sections and the layout's micro_batch and seq_len as train.micro_batch
// and train.seq_len; cfg's recipe, recompute and schedule are kept.
TrainerConfig with_production_shape(const TrainerConfig& cfg, const ProductionPreset& preset);

struct PaperPolicy {
  std::string label;                 // "attention + layernorm + experts"
  std::vector<std::string> modules;  // cfg.recompute.modules
};
const std::vector<PaperPolicy>& paper_recompute_policies();

// bf16: every class bf16; fp8: every class fp8; mxfp4: routed experts mxfp4, the other classes fp8.
RecipeConfig paper_recipe(Recipe recipe);

// One cell of the policies x recipes table.
struct PolicyRecipeCell {
  std::string policy;      // PaperPolicy::label
  Recipe recipe = Recipe::bf16;
  MemoryEstimate estimate;
  std::string paper;       // P1's number for the cell ("59.40%", "out of memory") or "" when it has none
};

// Every paper policy x {bf16, fp8, mxfp4} on the preset's shape and layout (policy-major order).
std::vector<PolicyRecipeCell> paper_policy_table(const ProductionPreset& preset);

// A Markdown table of the cells (activations, total, fraction of an 80 and a 141 GiB card, whether it fits under
// 80 GiB, P1's number and its source) followed by one line per policy: mxfp4's activation memory against fp8's.
std::string format_paper_policy_table(const std::vector<PolicyRecipeCell>& cells, const ProductionPreset& preset);

// Lines for the dry run: the layout, each category in GiB with the total's fraction of an 80 and a 141 GiB card,
// the activations per module, and, where the trainer runs that GPU (layout_is_emulated, trainer/model/model.h: one
// GPU or one emulated GPU of a tp 1 layout), what its DeviceMemory counts. `cfg` is the configuration estimated.
std::string format_memory_estimate(const MemoryEstimate& estimate, const TrainerConfig& cfg);

}  // namespace fp4moe
