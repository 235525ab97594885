// Analytic memory estimator (DESIGN.md "Trainer", "Memory"): the bytes one GPU holds per MemCategory
// (trainer/memory/device_memory.h) when a TrainerConfig trains under a ParallelLayout, from formulas, without a device.
//
// On a 1-GPU layout (single_gpu_layout) it counts what trainer/model/* allocate today, buffer by buffer, so that
// the GPU test (suite MemoryEstimate*) finds DeviceMemory's weights, grads and optimizer to the byte and its
// activations within 5%. On a production layout (trainer/memory/estimate_report.h: DeepSeek-V3 671B, V2 236B) it gives
// one GPU's share of the production run under a recipe and recompute policy.
//
// ---- Notation -----------------------------------------------------------------------------------------------
// d hidden, H heads, nope/rope/dv head dims, dqk = nope + rope, r_q q_lora_rank, r_kv kv_lora_rank, F dense_ffn,
// E routed experts, k top_k, f expert_ffn, s shared experts, V vocab. Per GPU of a layout: t = tp, E_l = E / ep,
// H_l = H / t, N = micro_batch x seq_len tokens of one micro-batch, N_s = ceil(N / t) (sequence-parallel share),
// R = ceil(N k routed_load / t) routed rows this GPU's experts receive (exactly N k on one GPU).
// Q_r(K, G) = bytes a Linear (G = 1) or a Group Linear (G = E_l groups) of a quantized recipe r keeps of its input
// X [M, K] for backward, M the rows (GroupLinear::held_activation_bytes, DESIGN.md "Recipes"):
//   fp8    FP8 column copy: K (M + 15 G) E4M3 codes + 4 K (ceil(M / 128) + G) scale bytes ~ (K + K/32) per row
//   mxfp4  MXFP4 copy: K/2 code bytes + K/32 UE8M0 scale bytes per row
//
// ---- Categories (per GPU) -------------------------------------------------------------------------------------
// weights      BF16 parameters: 2 B per element, every tensor padded to 64 elements (ParamStore::allocate);
//              FP32 masters: 4 B per element / shard; FP32 state (v3 router bias, E per MoE layer);
//              FP8 weight copies of each fp8/mxfp4 linear: W and W^T as E4M3 + FP32 128x128 block scales
//              (GroupLinear::weight_copy_bytes, G = E_l for the routed experts, 1 for a Linear; four buffers)
// grads        FP32: 4 B per element (ZeRO-1 does not shard them)
// optimizer    AdamW m and v FP32: 8 B per element / shard
//              shard (zero1): dp for non-expert tensors, expert_dp = dp t / ep for the routed experts; else 1
// activations  what backward needs, per layer and micro-batch (the table below) x in_flight(stage) micro-batches
//              (1F1B: stage s keeps pp - s), plus the last stage's final norm and LM head terms
// comm         ep > 1: one MoE layer's dispatch and combine buffers (send + receive, forward payload by recipe:
//              bf16 2d, fp8 d + d/32, mxfp4 d/2 + d/32 per row; combine BF16 2d; the backward's FP8 or BF16
//              buffers when larger); pp > 1: the send and receive buffers of one micro-batch's hidden state
// workspace    the largest single layer's scratch (its backward's gradient buffers plus the activations it does
//              not keep, live while they are recomputed) + the model's (residual-stream grads, LM head Dgrad and
//              chunked cross-entropy, embedding backward, batch), as the trainer's one shared scratch arena is
//              sized (trainer/memory/scratch.h); an approximation of the arena's plan, not its exact size.
//              MemoryEstimate::workspace_all_layers sums every layer's instead (per-layer buffers).
//
// ---- Activations kept for backward: bytes per token per layer (one term per (module, tensor)) -----------------
// A term is dropped (kept = false) by any policy in its last column. The policies (cfg.recompute, Megatron-Core's
// module names) as trainer/model/recompute.h defines them for the trainer:
//   mla_up_proj     q, kv, k rebuilt from the kept n_q, n_kv and the rotated k_pe (kept instead)
//   core_attn       o and lse (the attention forward reruns)
//   layernorm       the outputs and rstd of attn_norm, ffn_norm, q_norm and kv_norm
//   moe_act         the routed experts' a (bf16) or its MXFP4 copy (mxfp4); fp8: nothing (Group Linear keeps its
//                   FP8 column copy of a, made by fc2's forward, which is not rerun)
//   moe             the routed experts' h, a (or its copies) and ys, rerun from the kept routing and dispatched
//                   input xs in the routed recipe's storage format (BF16 xs; fp8: its FP8 row copy, kept only under
//                   moe/full, beside fc1's FP8 column copy; MXFP4 xs), and the shared experts' h and a; the router
//                   does not rerun (the block input, the ffn_norm out, stays unless layernorm)
//   mlp, shared_experts   the dense FFN's / shared experts' h and a (fc1 and swiglu rerun; fc2 keeps its copy)
//   full            everything but the layer input h, the Linears' copies that no rerun rebuilds (the FFNs' fc2 X)
//                   and what the MoE block keeps under moe (routing, row_of, dispatched input)
// [/t]: divided by t (sequence-parallel share or head split). Routed terms are per routed row, k rows per token.
//
//   module       tensor                  bytes per token            dropped by
//   layer        h (layer input)         2d [/t]                    never (the residual stream entering the layer)
//                h_mid                   2d [/t]                    full
//                attn_norm out           2d [/t]                    layernorm, full; kept only when MLA's backward
//                                                                   reads it (bf16 projections, or q_proj under
//                                                                   mla_up_proj: fp8/mxfp4 Linears keep a copy)
//                ffn_norm out            2d [/t]                    layernorm, full; dense layer: kept only for a
//                                                                   bf16 fc1 or under mlp (the MoE block reads it)
//                attn_norm rstd, ffn_norm rstd 4 [/t] each          layernorm, full
//   mla          c_q, c_kv               2 r_q, 2 r_kv              full
//                n_q, n_kv               2 r_q, 2 r_kv              layernorm, full; kept only for bf16 attention
//                                                                   or under mla_up_proj
//                q_norm rstd, kv_norm rstd     4 each               layernorm, full
//                q, k                    2 H dqk [/t] each          mla_up_proj, full
//                kv (k_nope | v)         2 H (nope + dv) [/t]       mla_up_proj, full
//                k_pe (rotated)          2 rope                     kept only with mla_up_proj (not full)
//                o                       2 H dv [/t]                core_attn, full
//                lse                     4 H [/t]                   core_attn, full
//                attention != bf16: the Linears' copies of their inputs (trainer/model/linear.h), codes + scales:
//                q_down (q_proj) X, kv_down X  Q(d) each            full
//                q_up X, kv_up X         Q(r_q), Q(r_kv)            mla_up_proj, full
//                out X                   Q(H dv [/t])               full
//   mlp          h                       4F [/t]                    mlp, full
//   (dense)      a                       2F [/t]                    mlp, full; kept only for a bf16 dense recipe
//                fc1 X, fc2 X (!= bf16)  Q(d), Q(F [/t])            fc1: mlp, full; fc2: never (not rerun)
//   moe.router   probs                   4E [/t]                    never
//                topk_weight             4k [/t]                    never
//                topk_idx                4k [/t]                    never
//                counts, offsets, aux    4E + 4(E + 1) + 4 per layer (not per token)   never
//   moe.experts  row_of                  4k                         never
//                xs (BF16)               2dk                        never; kept only for bf16
//                xs FP8 columns (fp8)    Q_fp8(d, E_l) per row      never (Group Linear's codes and scales)
//                xs FP8 rows (fp8)       d + 4 ceil(d/128) per row  kept only under moe, full (codes and FP32
//                                                                   scales, 4 fp8_row_scale_count(R, d) bytes)
//                xs MXFP4 codes, scales  (d/2)k, (d/32)k            never
//                h                       4fk                        moe, full
//                a (BF16)                2fk                        moe_act, moe, full; kept only for bf16
//                a FP8 columns (fp8)     Q_fp8(f, E_l) per row      moe, full (Group Linear's codes and scales)
//                a MXFP4 codes, scales   (f/2)k, (f/32)k            moe_act, moe, full
//                ys                      2dk                        moe, full
//   moe.shared   h                       4sf [/t]                   shared_experts, moe, full
//   (s > 0)      a                       2sf [/t]                   as h; kept only for a bf16 shared recipe
//                fc1 X, fc2 X (!= bf16)  Q(d), Q(sf [/t])           fc1: as h; fc2: never (not rerun)
//   model        h[L] (final norm input), h_out (LM head input)  2d [/t] each;  final norm rstd 4 [/t];
//   (last stage) LM head cross-entropy statistics 16 (FP32 [4, N], kept by LmHeadCrossEntropy outside DeviceMemory)
// e.g. DeepSeek-V3 (bf16, no policy): layer 57,352 + mla 205,320 + MoE router 1,088 + routed experts
// k (4 + 4d + 6f) = 327,712 + shared experts 12,288 bytes per token. Under moe the routed experts keep
// k (4 + 2d) = 114,720 (bf16), k (4 + d + 4 ceil(d/128)) = 59,168 plus fc1's FP8 columns ~ 59,200 (fp8), and
// k (4 + 17d/32) = 30,496 (mxfp4) bytes per token; the router its 1,088.
//
// The Linears' and Group Linears' copies (FP8 weights, FP8 column or MXFP4 copies of X) come from DeviceMemory at
// the first forward (MemoryTerm::first_forward; counted_allocator, linear_quantized.h), each buffer rounded up to
// 256 bytes.
// What DeviceMemory does not see (MemoryTerm::device_memory = false): LmHeadCrossEntropy's buffers and the
// communication buffers (no expert or pipeline parallelism is built). Not counted at all: cuBLASLt workspaces, the
// CUDA context, allocator fragmentation, cub's sort storage of the embedding backward (the estimate takes its four
// key and position arrays only). The estimate counts what backward needs; the trainer's Linears and Group Linears
// hold their copies in buffers that outlive a recompute, so under a policy that reruns them DeviceMemory may count
// more.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "trainer/config.h"
#include "trainer/memory/device_memory.h"

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
  bool zero1 = false;          // FP32 masters, m and v sharded over dp (non-expert) and expert_dp (routed experts)
  double routed_load = 1.0;    // routed rows a GPU receives over the balanced N k / tp (>= 1; 1 on one GPU)

  int64_t expert_dp() const { return dp * tp / ep; }
  int64_t in_flight(int64_t stage) const { return pp - stage; }  // micro-batches whose activations a stage keeps
};

// One GPU: gpus = tp = pp = dp = ep = 1, micro_batch and seq_len from cfg.train, no sharding.
ParallelLayout single_gpu_layout(const TrainerConfig& cfg);

// Rejects (fp4moe::Error, naming the field): sizes < 1; gpus != tp x pp x dp; ep not dividing dp x tp or (with MoE
// layers) moe.routed_experts; tp not dividing heads, dense_ffn (with dense layers) or shared_experts x expert_ffn;
// pp > model.layers; stage_layers of the wrong length, with an entry < 1 or a sum other than model.layers;
// routed_load < 1 or not finite.
void validate_layout(const TrainerConfig& cfg, const ParallelLayout& layout);

// Decoder layers per stage (layout.stage_layers, or the default split above). Validates first.
std::vector<int64_t> stage_layer_counts(const TrainerConfig& cfg, const ParallelLayout& layout);

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
  bool expert = false;  // a routed-expert tensor (sharded over expert_dp by zero1)
  bool state = false;   // FP32 state (ParamStore::add_state), not a trainable parameter
};

// The tensors of `stage` in ParamStore's registration order: "embed" (stage 0), per layer attn_norm, attn.* (q_down,
// q_norm, q_up or q_proj, kv_down, kv_norm, kv_up, out), ffn_norm, then mlp.fc1/fc2 or moe.router,
// moe.experts.fc1/fc2, moe.shared.fc1/fc2, and "norm", "lm_head" (last stage); states last.
std::vector<ParamTensor> parameter_tensors(const TrainerConfig& cfg, const ParallelLayout& layout, int64_t stage);

// The activation terms of decoder layer `layer` for one micro-batch, every (module, tensor) of the table above that
// exists for the layer's kind and recipe, with `kept` set by cfg.recompute and cfg.recipe (instances = 1).
std::vector<MemoryTerm> layer_activation_terms(const TrainerConfig& cfg, const ParallelLayout& layout, int64_t layer);

// A layer's kept activations in the buckets of the trainer's per-layer breakdown, as DeviceMemory counts them
// (terms with device_memory, each rounded up to 256 bytes): residual = h (layer input) + h_mid; norms = the
// attn_norm and ffn_norm outputs, the rstd of the four norms, n_q and n_kv; attn = MLA's other tensors (the
// Linears' copies included); ffn = the dense FFN or the MoE block; routed_experts = the routed experts' part of ffn.
struct LayerActivationBuckets {
  int64_t residual = 0, norms = 0, attn = 0, ffn = 0, routed_experts = 0;
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
                                        // largest layer's and the model's
  std::array<int64_t, kMemCategories> bytes{};          // the sum of kept terms per category
  // DeviceMemory's count for the trainer as built on one GPU: kept terms allocated through it, each instance
  // rounded up to 256 bytes (workspace: the approximation above).
  std::array<int64_t, kMemCategories> device_memory{};
  std::vector<int64_t> layer_activation_bytes;  // kept activation bytes of each layer of the stage, one micro-batch
  int64_t workspace_all_layers = 0;             // every layer's scratch summed + the model's

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

}  // namespace fp4moe
