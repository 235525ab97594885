// Analytic memory estimator (DESIGN.md "Trainer", "Memory"): the bytes one GPU holds per MemCategory
// (trainer/memory/device_memory.h) when a TrainerConfig trains under a ParallelLayout, from formulas, without a device.
//
// On a 1-GPU layout (single_gpu_layout) it counts what trainer/model/* allocate, buffer by buffer, from the same
// buffer plans the layers allocate from, so that the GPU test (suite MemoryEstimateModel*) finds DeviceMemory's
// weights, grads, optimizer and activations to the byte. On a production layout (trainer/memory/estimate_report.h:
// DeepSeek-V3 671B, V2 236B) it gives one GPU's share of the production run under a recipe and recompute policy.
//
// ---- Notation -----------------------------------------------------------------------------------------------
// d hidden, H heads, nope/rope/dv head dims, dqk = nope + rope, r_q q_lora_rank, r_kv kv_lora_rank, F dense_ffn,
// E routed experts, k top_k, f expert_ffn, s shared experts, V vocab. Per GPU of a layout: t = tp, E_l = E / ep,
// H_l = H / t, N = micro_batch x seq_len tokens of one micro-batch, N_s = ceil(N / t) (sequence-parallel share),
// R = ceil(N k routed_load / t) routed rows this GPU's experts receive (routed_row_count,
// trainer/model/layout_emulation.h; exactly N k on one GPU).
//
// ---- Categories (per GPU) -------------------------------------------------------------------------------------
// weights      BF16 parameters: 2 B per element, every tensor padded to 64 elements (ParamStore::allocate);
//              FP32 masters: 4 B per element of this GPU's shard; FP32 state (v3 router bias, E per MoE layer);
//              FP8 weight copies of each fp8/mxfp4 linear (the layers' buffer plans, below)
// grads        FP32: 4 B per element (ZeRO-1 does not shard them); layout.grad_bytes = 2: BF16, 2 B per element
// optimizer    AdamW m and v in train.moments' dtype: FP32 8 B, BF16 4 B per element of this GPU's shard
//              shard (zero1): the shard rule of trainer/model/param_shard.h (zero1_layout, as ParamStore
//              allocates it): each kind's padded tensors as one flat block of B elements, of which a GPU holds
//              round_up(ceil(B / parts), 64); parts = dp for the non-expert tensors, expert_dp = dp t / ep for the
//              routed experts'; without zero1 the whole block
// activations  the layers' held buffers (their plans, below) per micro-batch x in_flight(stage) micro-batches
//              (1F1B: stage s keeps min(pp - s, micro_batches)), plus the model's own (Model::buffers: the last
//              stage's final norm and LM head terms, the model's copies of the tokens and targets); the trainer
//              holds in_flight copies of each (KeptArray, trainer/memory/device_memory.h)
// comm         Model::comm_buffers (trainer/model/model.h), which the emulated layout allocates: ep > 1: one MoE
//              layer's dispatch and combine buffers (send + receive, forward payload by recipe: bf16 2d, fp8
//              d + 4 ceil(d/128), mxfp4 d/2 + d/32 per row; combine BF16 2d; the backward's FP8 or BF16 buffers
//              when larger); pp > 1: the send and receive buffers of one micro-batch's hidden state
// workspace    the shared scratch arena (trainer/memory/scratch.h) at the size the trainer allocates it,
//              Model::scratch_arena_bytes at this GPU's LayerShape: the largest single call of the stage (a decoder
//              layer's forward or backward, its gradient buffers and the activations it does not keep, live while
//              they are made or recomputed, each layer's scopes nested as its passes nest them; the LM head's FP32
//              Dgrad, the final norm's backward, the embedding backward's workspace) + the model's held buffers
//              (residual-stream grads, loss, LM head chunked cross-entropy, batch, gradient-norm partials) + every
//              layer's Linears' own scratch (below). Exact to the byte on one GPU but for cub's sort storage of the
//              embedding backward, which only a device can tell (the estimate takes 0; it sizes the arena only when
//              the embedding backward is the largest call). MemoryEstimate::workspace_all_layers: the same with every
//              layer's and the model's passes each given their own scratch (summed instead of the arena).
//
// ---- Activations, weight copies and the linears' own scratch: the layers' buffer plans ---------------------------
// Every buffer of a decoder layer comes from the plan the layer itself allocates from (trainer/memory/buffer_plan.h;
// DecoderLayer::buffers, which gathers RmsNorm, MlaAttention, SwigluMlp, MoeRouter, MoeRoutedExperts, Linear and
// GroupLinear::buffers), evaluated at this GPU's LayerShape: tokens N, sequence-parallel share N_s, heads H_l, dense
// width F / t, routed rows R, local experts E_l, shared width s f / t. Each layer's header lists its buffers and
// which recompute policy drops which (trainer/model/recompute.h names the policies). The estimate files them as:
//   activations  held entries kept per micro-batch in flight (layer_activation_terms); entries not held are live
//                while a pass makes or rebuilds them, taken from the shared arena (the layers' static scratch
//                functions, PassScratch in trainer/memory/scratch.h, count them with the passes' own scratch)
//   weights      the Linears' and Group Linears' FP8 weight copies (four buffers each), per layer
//   workspace    the Linears' and Group Linears' own scratch (FP8 row and column copies of one pass, the BF16 Dgrad
//                of an FP32 sum), held by every layer
// On one GPU the estimate therefore counts what DeviceMemory counts, to the byte (GPU test MemoryEstimateModel*).
// The Linears' and Group Linears' own buffers come from DeviceMemory at the first forward (MemoryTerm::first_forward)
// and stay allocated under every policy, as the trainer holds them.
// What DeviceMemory does not see (MemoryTerm::device_memory = false): LmHeadCrossEntropy's buffers. Not counted at
// all: cuBLASLt workspaces, the CUDA context, allocator fragmentation, cub's sort storage of the embedding backward
// (the estimate takes its four key and position arrays only; the arena holds the sort storage only when the
// embedding backward is its largest call).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "trainer/config.h"
#include "trainer/memory/device_memory.h"
#include "trainer/model/param_shard.h"

namespace fp4moe {

// How one model replica is spread over GPUs (Megatron-Core terms). gpus = tp x pp x dp; the routed experts of a
// stage are split over ep GPUs of its dp x tp (ep divides dp x tp), the rest replicated over dp.
struct ParallelLayout {
  std::string name;            // for reports ("1 GPU", "DeepSeek-V3 671B, 256 GPUs")
  std::string source;          // where the sizes come from
  int64_t gpus = 1;
  int64_t tp = 1;              // tensor parallel with sequence parallelism: heads, FFN widths, vocabulary split
  int64_t pp = 1;              // pipeline stages (1F1B)
  int64_t dp = 1;              // data-parallel replicas of the non-expert weights
  int64_t ep = 1;              // expert parallel
  int64_t micro_batch = 1;     // rows of seq_len tokens per micro-batch
  int64_t seq_len = 0;         // tokens per row
  std::vector<int64_t> stage_layers;  // decoder layers per stage, pp entries >= 1 summing to model.layers; empty:
                                      // floor(L / pp) each, the last L % pp stages one more
  int64_t micro_batches = 1;   // micro-batches per optimizer step per pipeline (1F1B)
  bool zero1 = false;          // masters, m and v sharded over dp (non-expert) and expert_dp (routed experts)
  double routed_load = 1.0;    // routed rows a GPU receives over the balanced N k / tp (>= 1; 1 on one GPU)
  int64_t grad_bytes = 4;      // bytes per gradient element: 4 FP32 (the trainer as built), 2 BF16 (an assumption
                               // for frameworks that keep BF16 gradients, e.g. the P1 calibration's knob)

  int64_t expert_dp() const { return dp * tp / ep; }
  // The ranks ZeRO-1 splits the optimizer state over (trainer/model/param_shard.h): {dp, expert_dp()} under zero1,
  // else {1, 1}.
  Zero1Parts zero1_parts() const { return zero1 ? Zero1Parts{dp, expert_dp()} : Zero1Parts{}; }
  // Micro-batches whose activations stage s keeps under 1F1B (Narayanan et al. 2021, PipeDream-Flush): stage s runs
  // pp - s forwards before its first backward, or all micro_batches when there are fewer.
  int64_t in_flight(int64_t stage) const { return std::min(pp - stage, micro_batches); }
};

// One GPU: gpus = tp = pp = dp = ep = 1, micro_batch and seq_len from cfg.train, no sharding (cfg.parallel unread).
ParallelLayout single_gpu_layout(const TrainerConfig& cfg);

// The layout of cfg's [parallel] section (trainer/config.h's ParallelConfig): tp, pp, dp, ep, micro_batches, zero1,
// routed_load from it, gpus = tp x pp x dp, micro_batch and seq_len from cfg.train; single_gpu_layout's when the
// section describes one GPU. Does not validate (validate_config does, through validate_layout).
ParallelLayout layout_of(const TrainerConfig& cfg);

// Rejects (fp4moe::Error, naming the field): sizes < 1 (micro_batches included); gpus != tp x pp x dp; ep not dividing dp x tp or (with MoE
// layers) moe.routed_experts; tp not dividing heads, dense_ffn (with dense layers) or shared_experts x expert_ffn;
// pp > model.layers; stage_layers of the wrong length, with an entry < 1 or a sum other than model.layers;
// routed_load < 1 or not finite; grad_bytes other than 2 or 4.
void validate_layout(const TrainerConfig& cfg, const ParallelLayout& layout);

// Decoder layers per stage (layout.stage_layers, or the default split above). Validates first.
std::vector<int64_t> stage_layer_counts(const TrainerConfig& cfg, const ParallelLayout& layout);

// The pipeline stage one GPU of cfg's layout (layout_of) runs or estimates: cfg.parallel.stage, or when it is -1 the
// stage whose estimated total is the largest (estimate_memory(cfg, layout), the first of equals); its decoder layers
// [first_layer, first_layer + layers) (stage_layer_counts); the first stage holds the embedding, the last the final
// norm, LM head and loss. One GPU (no [parallel] section): stage 0 of 1, every layer. The one resolution the trainer
// (Model), the estimator and the 1F1B in-flight count read. Validates cfg (validate_config: parallel.stage in
// [-1, pp)) and its layout.
struct PipelineStage {
  int64_t stage = 0, pp = 1;
  int64_t first_layer = 0, layers = 0;
  bool first() const { return stage == 0; }
  bool last() const { return stage == pp - 1; }
};
PipelineStage pipeline_stage(const TrainerConfig& cfg);
// The same for `stage` of `layout` (0 <= stage < layout.pp, else fp4moe::Error).
PipelineStage pipeline_stage(const TrainerConfig& cfg, const ParallelLayout& layout, int64_t stage);

// Bytes one routed row carries over expert parallelism under a routed-experts recipe (DESIGN.md "Expert
// parallelism"), d = model.hidden: the forward dispatch payload (bf16: BF16 row, 2 d; fp8: FP8 row with FP32 1x128
// scales, d + 4 ceil(d / 128); mxfp4: E2M1 codes with UE8M0 scales per 32, d / 2 + ceil(d / 32)), the combine
// (BF16, 2 d) and the backward's two exchanges: the output gradient dispatched to the experts, which feeds their
// GEMMs (FP8 rows for the fp8 and mxfp4 recipes, BF16 for bf16), and the experts' input gradient combined back,
// which is summed over the token's k slots at its rank (BF16, 2 d), as trainer/comm/ep_exchange.h sends them.
// Rejects d < 1.
struct ExpertParallelRowBytes {
  int64_t dispatch = 0, combine = 0, backward_dispatch = 0, backward_combine = 0;
};
ExpertParallelRowBytes expert_parallel_row_bytes(Recipe routed, int64_t d);

// The workspace term of the shared scratch arena (module "model"): Model::scratch_arena_bytes.
inline constexpr const char* kScratchArenaTerm = "shared scratch arena";

// One counted buffer: a tensor of a module, in one category.
struct MemoryTerm {
  MemCategory category = MemCategory::activations;
  std::string module;         // "params", "layer", "mla", "mlp", "moe.router", "moe.experts", "moe.shared", "model",
                              // "comm", "trainer"
  std::string tensor;         // "q", "xs MXFP4 codes", "FP32 master weights", ...
  int64_t bytes = 0;          // one instance (one layer and micro-batch for activations)
  int64_t instances = 1;      // how many this GPU holds (layers of the stage x micro-batches in flight)
  bool kept = true;           // activations: false when the recipe or recompute policy does not keep it
  bool device_memory = true;  // allocated through DeviceMemory by the trainer as built (see the header)
  bool first_forward = false; // allocated by the first forward, not at construction (Linear's and Group Linear's
                              // own copies of weights and inputs)

  int64_t total() const { return kept ? bytes * instances : 0; }
};

// One parameter tensor as a GPU of the layout holds it (routed experts: E_l of E; TP-split tensors: 1/t).
struct ParamTensor {
  std::string name;     // the ParamStore name ("layers.1.moe.experts.fc1"); states: "layers.1.moe.router_bias"
  int64_t n = 0;        // elements on this GPU
  bool expert = false;  // a routed-expert tensor (is_routed_expert_param; sharded over expert_dp by zero1)
  bool state = false;   // FP32 state (ParamStore::add_state), not a trainable parameter
};

// The tensors of `stage` in ParamStore's registration order: "embed" (stage 0), per layer attn_norm, attn.* (q_down,
// q_norm, q_up or q_proj, kv_down, kv_norm, kv_up, out), ffn_norm, then mlp.fc1/fc2 or moe.router,
// moe.experts.fc1/fc2, moe.shared.fc1/fc2, and "norm", "lm_head" (last stage); states last.
std::vector<ParamTensor> parameter_tensors(const TrainerConfig& cfg, const ParallelLayout& layout, int64_t stage);

// The activation terms of decoder layer `layer` for one micro-batch: every activation buffer of the layer's buffer
// plans (DecoderLayer::buffers at this GPU's shapes) with bytes > 0, `kept` = held under cfg.recipe and
// cfg.recompute, `first_forward` for the Linears' and Group Linears' own copies (instances = 1).
std::vector<MemoryTerm> layer_activation_terms(const TrainerConfig& cfg, const ParallelLayout& layout, int64_t layer);

// A layer's kept activations in the buckets of the trainer's per-layer breakdown, as DeviceMemory counts them
// (terms with device_memory, each rounded up to 256 bytes): residual = h (layer input) + h_mid; norms = the
// attn_norm and ffn_norm outputs, the rstd of the four norms, n_q and n_kv; attn = MLA's other tensors; ffn = the
// dense FFN or the MoE block; routed_experts = the routed experts' part of ffn; quantized_copies = the Linears' and
// Group Linears' own copies of their inputs (first_forward terms, in none of the others), as
// LayerMemory::quantized_copies.
struct LayerActivationBuckets {
  int64_t residual = 0, norms = 0, attn = 0, ffn = 0, routed_experts = 0, quantized_copies = 0;
  int64_t kept() const { return residual + norms + attn + ffn; }
};
LayerActivationBuckets layer_activation_buckets(const TrainerConfig& cfg, const ParallelLayout& layout, int64_t layer);

// What one GPU of one pipeline stage holds.
struct MemoryEstimate {
  ParallelLayout layout;
  int64_t stage = 0;
  int64_t first_layer = 0, layers = 0;  // decoder layers [first_layer, first_layer + layers) of the stage
  int64_t in_flight = 1;                // micro-batches whose activations the stage keeps
  int64_t tokens = 0;                   // N = micro_batch x seq_len
  std::vector<MemoryTerm> terms;        // activations merged over the stage's layers (instances); workspace: the
                                        // Linears' own scratch per layer, the arena and the model's
  std::array<int64_t, kMemCategories> bytes{};          // the sum of kept terms per category
  // DeviceMemory's count for the trainer as built, running this GPU (one GPU, or one emulated GPU of a tp 1 layout:
  // layout_is_emulated, trainer/model/model.h): kept terms allocated through it, each instance rounded up to 256
  // bytes (workspace: cub's sort storage aside, above).
  std::array<int64_t, kMemCategories> device_memory{};
  std::vector<int64_t> layer_activation_bytes;  // kept activation bytes of each layer of the stage, one micro-batch
  int64_t workspace_all_layers = 0;             // workspace with every layer's scratch high-water and the model's
                                                // passes' summed in place of the one arena

  int64_t category(MemCategory c) const { return bytes[static_cast<int>(c)]; }
  int64_t total() const;
  double gib(MemCategory c) const;  // 2^30 bytes
  double total_gib() const;
  double fraction_of(double card_gib) const;  // total over a card of card_gib GiB
  // Kept activation bytes per module, in first-appearance order.
  std::vector<std::pair<std::string, int64_t>> activations_by_module() const;
};

// The stage whose total is the largest (the first of equals). Validates cfg (validate_config) and the layout.
MemoryEstimate estimate_memory(const TrainerConfig& cfg, const ParallelLayout& layout);
// One stage, 0 <= stage < layout.pp.
MemoryEstimate estimate_memory_stage(const TrainerConfig& cfg, const ParallelLayout& layout, int64_t stage);
// cfg's own layout (layout_of) at pipeline_stage(cfg) (what the dry run prints).
MemoryEstimate estimate_memory(const TrainerConfig& cfg);

}  // namespace fp4moe
