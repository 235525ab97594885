// Calibration of P1's unknown 256-GPU layout (issue 15 item 4): which plausible DeepSeek-V3 671B layouts of 256 GPUs
// make the memory estimator (trainer/memory/estimate.h) reproduce P1's heavy-policy numbers, and what those layouts
// then predict for the light policy.
//
// P1's numbers (../shared/PAPER-NUMBERS.md, a secondary summary not checked against the paper): "% of memory" of an
// 80 GB card per GPU, recompute "attention + layernorm + experts": bf16 68.29%, fp8 74.20%, mxfp4 59.40%; recompute
// "mla_up_proj only": mxfp4 70.11%, bf16 and fp8 out of memory.
//
// Search: the v3 preset (trainer/memory/estimate_report.h) on 256 GPUs, tp in tp_values, pp in pp_values, dp =
// 256 / (tp pp), ep in ep_values dividing dp tp, micro-batch 1 x 4096 tokens, micro_batches = global batch 15360 /
// dp, ZeRO-1, balanced routing (the planner's enumerate_layouts, restricted). Per layout and recipe the estimate of
// the largest stage plus a constant framework overhead (GiB) is taken as a percentage of a card of card_gib GiB.
// Fit: the largest absolute difference from P1 over the three recipes, in percentage points (max_abs_difference);
// the overhead that would minimise it is reported beside it (minimax_offset, converted to GiB).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trainer/config.h"
#include "trainer/memory/estimate.h"

namespace fp4moe {

// P1's memory numbers for one recipe; light_percent < 0: out of memory.
struct P1MemoryRow {
  Recipe recipe = Recipe::bf16;
  double heavy_percent = 0, light_percent = 0;
};
// bf16, fp8, mxfp4, in that order.
const std::vector<P1MemoryRow>& p1_memory_rows();

struct CalibrationRequest {
  std::vector<int64_t> tp_values = {1, 2};
  std::vector<int64_t> pp_values = {4, 8, 16};
  std::vector<int64_t> ep_values = {8, 16, 32, 64};
  int64_t grad_bytes = 4;     // 4: FP32 gradients as the trainer keeps them; 2: BF16
  double overhead_gib = 0;    // framework overhead added to every estimate (CUDA context, allocator, NCCL buffers)
  double card_gib = 80;       // the card the percentages are of: 80 GiB, the suite's nominal 80 GB card (kCard80GiB)
  double tolerance_pp = 2.0;  // a layout "fits" P1 when its largest difference is at most this many points
  // The recompute modules read for P1's heavy policy "attention + layernorm + experts" (Megatron-Core names): by
  // default paper_recompute_policies()'s {core_attn, layernorm, moe}, "attention" read as the attention core; the
  // other reading recomputes the whole MLA above its down-projections: {mla_up_proj, core_attn, layernorm, moe}.
  std::vector<std::string> heavy_modules = {"core_attn", "layernorm", "moe"};
};

// Rejects (fp4moe::Error, one line): an empty value list; heavy_modules empty or naming a module validate_config
// rejects; tp outside {1, 2, 4, 8}, pp outside [1, 16], ep outside
// [1, 256]; grad_bytes other than 2 or 4; card_gib or tolerance_pp not finite or <= 0; an overhead not finite, < 0 or
// > card_gib.
void validate_calibration(const CalibrationRequest& request);

// The searched layouts, in the planner's enumeration order (tp, pp, ep ascending), grad_bytes set. Validates.
std::vector<ParallelLayout> calibration_layouts(const CalibrationRequest& request);

// max_i |ours[i] - paper[i]|. Rejects empty or different-length lists and non-finite entries.
double max_abs_difference(const std::vector<double>& ours, const std::vector<double>& paper);
// The constant c that minimises max_i |ours[i] + c - paper[i]|: the midpoint of the smallest and largest
// paper[i] - ours[i]. Rejects what max_abs_difference rejects.
double minimax_offset(const std::vector<double>& ours, const std::vector<double>& paper);

struct CalibrationFit {
  ParallelLayout layout;
  std::vector<MemoryEstimate> heavy, light;          // per p1_memory_rows() recipe, the largest stage
  std::vector<double> heavy_percent, light_percent;  // (total + overhead) / card, in %
  double error_pp = 0;                               // max |heavy_percent - P1| at request.overhead_gib
  double best_overhead_gib = 0;                      // the overhead that minimises it (negative: ours is too large)
  double error_at_best_pp = 0;                       // max |difference| with that overhead instead
};

// Every calibration layout, ranked by error_pp (smallest first), equal errors by error_at_best_pp. Validates.
std::vector<CalibrationFit> calibrate_p1(const CalibrationRequest& request);

// The Markdown report: the assumptions, the `top` best fits with their per-recipe percentages beside P1's, the
// light-policy prediction at those layouts against P1's, and a verdict (which layouts fit within tolerance_pp, or
// that none does: by how much, and the largest categories and terms of the best layout's mxfp4 estimate). Rejects top < 1 and an
// empty list of fits.
std::string format_calibration(const std::vector<CalibrationFit>& fits, const CalibrationRequest& request,
                               int64_t top);

}  // namespace fp4moe
