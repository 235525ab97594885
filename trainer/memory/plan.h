// Layout planner (`fp4moe plan`, DESIGN.md "Trainer", "Memory"): for a model on `gpus` GPUs of `memory_gib` each,
// enumerate parallel layouts x recompute policies x recipes, keep those whose memory estimate (trainer/memory/
// estimate.h, the largest stage) fits, and rank them by a modelled tokens/s per GPU. Nothing here needs a device:
// the stage time is modelled from FLOP counts (trainer/flops.h) at an assumed utilisation; trainer/memory/
// stage_times.h replaces the compute part by times measured on the local GPU for the candidates it measures.
//
// ---- Cost model (per GPU, one micro-batch of N = micro_batch x seq_len tokens, one stage) ------------------------
// compute  flops / (peak_flops x mfu), flops = N / tp x sum over the stage's layers of (3 x forward + rerun) per
//          token (layer_flops_per_token; the routed experts' share x routed_load), + 3 x the LM head on the last
//          stage. Training = 3 x forward (Dgrad + Wgrad = 2 x forward) as in flops.h. Rerun: the forward FLOPs of
//          the modules the policy recomputes (recompute_flops_per_token): mla_up_proj the q and kv up-projections,
//          core_attn the attention core, moe the router + routed + shared experts, mlp the dense FFN,
//          shared_experts the shared experts, full the whole layer; layernorm and moe_act are element-wise and
//          count 0 (their memory traffic is not modelled). The same peak for every recipe: FP8 GEMMs could run
//          at the 1979 TFLOP/s FP8 peak, but this trainer's FP8 and MXFP4 paths add quantization passes whose
//          cost is not modelled, so recipes differ here only by the memory they need (hence the policy that fits)
//          and the bytes they send.
// EP       all-to-all bytes this GPU sends per MoE layer: sent rows x (dispatch + backward_dispatch) + received
//          rows x (combine + backward_combine) (expert_parallel_row_bytes; sent = N k / tp, received = sent x
//          routed_load), of which (ep - 1) / ep leave the GPU: (n - 1) / ep to the n = min(ep, gpus_per_node)
//          GPUs of the group in its node over NVLink, (ep - n) / ep to other nodes over InfiniBand (the group's GPUs
//          are consecutive ranks); time = the slower of the two. Recompute re-sends nothing (`moe` keeps the
//          dispatched input).
// PP       the hidden state (BF16, N / tp x d) sent forward by every stage but the last and its gradient sent
//          backward by every stage but the first, over InfiniBand when a stage spans a node or more (gpus / pp >=
//          gpus_per_node), else NVLink.
// Step     communication is not overlapped with compute (an upper bound on time; DeepSeek-V3's DualPipe hides
//          most of it). 1F1B: step = (m + pp - 1) x the slowest stage's micro-batch time, bubble (pp - 1) /
//          (m + pp - 1) (Narayanan et al. 2021); tokens/s per GPU = m N / (step x tp x pp). Not modelled: the
//          data-parallel gradient reduce-scatter and parameter all-gather (once per step), the optimizer step,
//          kernel launch gaps.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "results/table.h"
#include "trainer/config.h"
#include "trainer/flops.h"
#include "trainer/memory/estimate.h"

namespace fp4moe {

// The hardware the plan assumes, per GPU. Defaults (H100/H200 SXM nodes of 8 GPUs):
//   peak_flops          989e12, dense BF16 tensor cores (NVIDIA H100/H200 SXM datasheets)
//   mfu                 0.34: an assumption, the model-FLOPs utilisation this trainer measured on one DeepSeek-V3
//                       MoE layer, BF16, 1 x 4096 tokens, on an H200 (reports/results/h200/trainer-20261129/
//                       train_v3_layer.log: 33.5-33.9%; the PyTorch peer 31.3%); a whole stage adds attention-heavy
//                       dense layers, the LM head and FP8/MXFP4 quantization passes, not measured here
//   nvlink_bytes_per_s  450e9: NVLink 4, 900 GB/s bidirectional per GPU, 450 GB/s per direction (datasheets)
//   ib_bytes_per_s      50e9: one ConnectX-7 InfiniBand NDR port of 400 Gb/s per GPU (NVIDIA ConnectX-7)
//   gpus_per_node       8 (HGX H100/H200)
struct PlanHardware {
  double peak_flops = kH100H200DenseBf16Flops;
  double mfu = 0.34;
  double nvlink_bytes_per_s = 450e9;
  double ib_bytes_per_s = 50e9;
  int64_t gpus_per_node = 8;
};

// Rejects (fp4moe::Error) a non-finite or non-positive peak or bandwidth, mfu outside (0, 1], gpus_per_node < 1.
void validate_hardware(const PlanHardware& hw);

// One micro-batch on one GPU of one stage: a row of the cost table.
struct StageCost {
  double flops = 0;            // FLOPs: 3 x forward + recompute reruns
  double ep_nvlink_bytes = 0;  // EP all-to-all bytes sent to GPUs of the same node, forward + backward
  double ep_ib_bytes = 0;      // EP all-to-all bytes sent to other nodes
  double pp_bytes = 0;         // pipeline bytes sent (hidden state forward, its gradient backward)
  bool pp_over_ib = false;     // the pipeline link is InfiniBand (else NVLink)
};

// Seconds of one micro-batch on one GPU of a stage.
struct StageTime {
  double compute_s = 0, ep_s = 0, pp_s = 0;
  double total() const { return compute_s + ep_s + pp_s; }
};
// compute = flops / (peak x mfu); ep = max(nvlink bytes / nvlink, ib bytes / ib); pp = bytes / its link. Validates hw.
StageTime stage_time(const StageCost& cost, const PlanHardware& hw);

struct StepPrediction {
  StageTime slowest;           // the stage with the largest micro-batch time
  int64_t slowest_stage = 0;
  double bubble = 0;           // (pp - 1) / (m + pp - 1)
  double step_s = 0;           // (m + pp - 1) x slowest.total()
  double tokens_per_s_per_gpu = 0;  // m N / (step_s x tp x pp)
};
// The 1F1B step of `micro_batches` (m >= 1) micro-batches of `tokens` (N >= 1) tokens through stages.size() = pp
// stages, each GPU holding 1/tp of a micro-batch's work. Rejects an empty stage list, m, N or tp < 1, and a stage
// time <= 0.
StepPrediction predict_step(const std::vector<StageTime>& stages, int64_t micro_batches, int64_t tokens, int64_t tp);

// The forward FLOPs per token that the recompute policy reruns in backward for a layer (the model above).
double recompute_flops_per_token(const LayerFlopsPerToken& layer, const RecomputeConfig& recompute);

// The cost table of a layout under cfg's recipe and recompute policy: one StageCost per stage. Validates cfg and
// the layout (validate_config, validate_layout) and hw.
std::vector<StageCost> stage_costs(const TrainerConfig& cfg, const ParallelLayout& layout, const PlanHardware& hw);

// What to plan. model: the shape ([model], [moe]); its recipe, recompute and [parallel] are replaced.
struct PlanRequest {
  TrainerConfig model;
  std::string title;           // "DeepSeek-V3 671B"
  int64_t gpus = 0;
  double memory_gib = 0;       // per GPU
  int64_t micro_batch = 1;     // rows per micro-batch
  int64_t seq_len = 0;
  int64_t global_batch = 0;    // sequences per optimizer step, all replicas: m = global_batch / (dp x micro_batch)
  std::vector<Recipe> recipes;  // paper recipes (paper_recipe)
  std::vector<int64_t> tp_values = {1, 2, 4, 8};  // tensor-parallel sizes to try
  PlanHardware hw;
  std::string measured_on;     // the GPU the stage times are measured on (stage_times.h); "": modelled only
};
// Rejects gpus, micro_batch, seq_len or global_batch < 1, gpus or micro_batch > 2^20, a memory_gib not finite or <= 0, no recipe, no tp value
// or one outside {1, 2, 4, 8}, and what validate_hardware rejects.
void validate_request(const PlanRequest& request);

// The model of `fp4moe plan --config FILE`: the file read as `fp4moe train --config` reads it (ConfigOptions), then
// its [parallel] section replaced by one GPU's, since the plan enumerates the layouts itself (the section's own rules,
// such as train.grad_accum = parallel.micro_batches, do not apply), and validated (validate_config). global_batch
// := the section's micro_batches x dp x train.micro_batch (the sequences of one optimizer step). Throws
// fp4moe::Error for what ConfigOptions and validate_config reject, and for a section whose micro_batches or dp is
// < 1 or whose product overflows.
TrainerConfig plan_config_from_file(const std::string& path, int64_t& global_batch);

// Why request.gpus GPUs admit no layout (enumerate_layouts is empty), in one line: which of tp x pp x dp = gpus
// (tp in request.tp_values, pp in 1..16), dp dividing global_batch / micro_batch, and validate_layout fails first.
// Validates the request.
std::string explain_no_layout(const PlanRequest& request);

// Every layout of request.gpus GPUs: tp in request.tp_values, pp in 1..16 (<= model.layers), dp = gpus / (tp pp)
// integral, ep every divisor of gcd(moe.routed_experts, dp tp) (1 without MoE layers), micro_batches =
// global_batch / (dp micro_batch) integral, ZeRO-1 on, balanced routing; only those validate_layout accepts.
std::vector<ParallelLayout> enumerate_layouts(const PlanRequest& request);

struct PlanCandidate {
  ParallelLayout layout;
  std::string policy;  // PaperPolicy::label
  Recipe recipe = Recipe::bf16;
  double memory_gib = 0;     // the largest stage's estimated total
  int64_t memory_stage = 0;  // that stage
  StepPrediction step;
  std::string compute_source = "modelled";  // "measured", "measured/tp" (tp > 1) or "modelled" (stage_times.h)
  std::string compute_note;                 // why a candidate chosen for measuring kept its modelled time
};

struct PlanResult {
  int64_t layouts = 0;                 // enumerated
  std::vector<PlanCandidate> all;      // layouts x policies x recipes, in enumeration order, fitting or not
  std::vector<PlanCandidate> fitting;  // those of `all` at or under request.memory_gib, best tokens/s first
};

// The configuration of one candidate: request.model with no [parallel] section, the request's micro_batch and
// seq_len, the paper recipe `recipe` and the recompute modules `policy`.
TrainerConfig candidate_config(const PlanRequest& request, Recipe recipe, const std::vector<std::string>& policy);

// Orders candidates with a measured compute time (compute_source not "modelled") before the modelled ones, each
// group by predicted tokens/s per GPU, highest first; equal rates: less memory first; then as given.
void rank_candidates(std::vector<PlanCandidate>& candidates);

// Enumerates, estimates and ranks (rank_candidates). `progress(done, total)` is called after each layout x
// policy (may be empty). Validates the request.
PlanResult plan_layouts(const PlanRequest& request, const std::function<void(int64_t, int64_t)>& progress = {});

// The Markdown report: the assumptions, per recipe the `top` best fitting candidates (layout, policy, memory GiB and
// % of the card, micro-batch time split, bubble, tokens/s per GPU) or a line saying that nothing fits with the
// smallest estimate, the best tokens/s per recompute policy and recipe ("-" where nothing fits), and what mxfp4
// buys over fp8 and bf16 (memory and tokens/s of each recipe's best). With request.measured_on set it says what was
// measured; each row names its compute source, and a line per recipe names each candidate chosen for measuring that
// kept its modelled time and why. Rejects top < 1.
std::string format_plan(const PlanResult& result, const PlanRequest& request, int64_t top);

// Every candidate of result.all as a results/table.h Table (`/plan/candidates` of `fp4moe plan --out`), one row
// each in enumeration order: recipe, policy, compute_source (str); tp, pp, dp, ep, micro_batches, memory_stage, fits (0/1),
// rank (1-based place among the recipe's fitting candidates in result.fitting's order; 0: does not fit),
// slowest_stage (i64); memory_gib, compute_s, ep_s, pp_s (the slowest stage's micro-batch), bubble, step_s,
// tokens_per_s_per_gpu (f64). Attributes: model, gpus, memory_gib, micro_batch, seq_len, global_batch, peak_flops,
// mfu, nvlink_bytes_per_s, ib_bytes_per_s, gpus_per_node, measured (1 when request.measured_on is set, else 0),
// measured_on (the GPU, or "none").
Table plan_table(const PlanResult& result, const PlanRequest& request);

}  // namespace fp4moe
