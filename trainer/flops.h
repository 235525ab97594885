// Parameter counts, model FLOPs per token and MFU of the reference trainer's architecture (DESIGN.md "Trainer").
//
// Parameters (weights of the model as built, DeepSeek-V2/V3 naming; d = hidden, H = heads, dq = qk_nope + qk_rope,
// dv = v_head_dim, r = qk_rope_head_dim, E = routed experts, S = shared experts, k = top_k, f = expert_ffn):
//   embedding                vocab x d                        (untied from the LM head)
//   per layer   MLA          q: d x q_lora + q_lora (norm) + q_lora x H dq   (or d x H dq when q_lora_rank = 0)
//                            kv: d x (kv_lora + r) + kv_lora (norm) + kv_lora x H (qk_nope + dv)
//                            out: H dv x d
//               norms        2 d
//               dense FFN    3 d dense_ffn                    (SwiGLU: gate, up, down)
//            or MoE          router E x d (+ E bias for v3), (E + S) experts of 3 d f
//   final norm d, LM head vocab x d.
// Activated per token: the same with k routed experts instead of E and one embedding row (d) instead of the
// table, as the lookup touches one row. With this convention DeepSeek-V3's shape (61 layers, 3 dense, 256
// experts, vocab 129280) gives 671.0e9 total and 36.6e9 activated (published: 671B and 37B), DeepSeek-V2's
// 235.7e9 and 20.9e9 (published: 236B and 21B); counting the whole embedding table as activated would give 37.6e9
// for V3, which does not round to the published 37B.
//
// Model FLOPs per token (forward), the convention of PaLM / Megatron MFU: 2 per multiply-add of every GEMM with
// a weight (every activated weight except norms, the embedding row and the router bias: 2 x activated matmul
// parameters, the router's E x d GEMM included), plus attention's two batched GEMMs, causal: a token at position
// t (0-based) attends to t + 1 keys, so a sequence of T tokens has T (T + 1) / 2 (query, key) pairs, each costing
// 2 H dq (Q K^T) + 2 H dv (P V) FLOPs:
//     attention per token per layer = (T + 1) / 2 x 2 H (dq + dv) = H (dq + dv) (T + 1).
// MLA is counted as trained (keys and values up-projected, not absorbed into the queries). At T = 4096 this gives
// 250.5e9 training FLOPs per token for DeepSeek-V3 and 155.3e9 for V2, DeepSeek's published 250 and 155 GFLOPs
// ("Insights into DeepSeek-V3", ISCA 2025, table 2). Element-wise work
// (norms, RoPE, softmax, SwiGLU, router top-k, cross-entropy) is left out. Training = 3 x forward (backward =
// Dgrad + Wgrad = 2 x forward). Recomputation is not counted (model FLOPs, not hardware FLOPs).
//
// MFU = (training FLOPs per token x tokens per second) / peak FLOP/s, the peak passed in: e.g. 989e12 for the
// dense BF16 tensor cores of H100/H200 SXM (1979e12 FP8). Quoting it against the BF16 peak whatever the recipe
// keeps recipes comparable.
#pragma once

#include <cstdint>

#include "trainer/config.h"

namespace fp4moe {

struct ParameterCounts {
  int64_t embedding = 0;       // vocab x d
  int64_t attention = 0;       // all layers: MLA projections and their norms
  int64_t norms = 0;           // all layers' two RMSNorms and the final norm
  int64_t dense_ffn = 0;       // all dense layers
  int64_t router = 0;          // all MoE layers: weights (and the v3 bias)
  int64_t routed_experts = 0;  // all MoE layers, all routed experts
  int64_t shared_experts = 0;  // all MoE layers
  int64_t lm_head = 0;         // vocab x d
  int64_t total = 0;           // the sum of the above
  int64_t activated = 0;       // per token: k routed experts of each MoE layer, one embedding row
  int64_t activated_matmul = 0;  // the activated weights that enter a GEMM (no norms, embedding row or bias)
};

// Throws fp4moe::Error when validate_config's shape rules fail (only the model and moe sections matter).
ParameterCounts count_parameters(const TrainerConfig& cfg);

// Per layer, per token, forward, causal attention over sequences of seq_len tokens (formula above).
double attention_flops_per_token(const ModelConfig& m, int64_t seq_len);

struct FlopsPerToken {
  double forward = 0;     // 2 x activated_matmul + attention over all layers
  double attention = 0;   // the attention part of `forward`
  double training = 0;    // 3 x forward
};
FlopsPerToken model_flops_per_token(const TrainerConfig& cfg, int64_t seq_len);

// One decoder layer's forward FLOPs per token by module (the terms model_flops_per_token sums: 2 per multiply-add of
// each GEMM with a weight, causal attention over seq_len tokens), for the planner's per-stage time and its recompute
// reruns (trainer/memory/plan.h). Element-wise modules (norms, SwiGLU) count 0. Summed over every layer with
// lm_head_flops_per_token they give model_flops_per_token's forward. Rejects a layer outside [0, model.layers) and
// seq_len < 1.
struct LayerFlopsPerToken {
  double mla_down = 0;        // q down (or the direct q projection) and kv down: 2 d (q_lora + kv_lora + rope)
  double mla_up = 0;          // q up and kv up: 2 (q_lora H dq + kv_lora H (nope + dv)); 0 without q_lora for q
  double mla_out = 0;         // output projection: 2 H dv d
  double attention_core = 0;  // attention_flops_per_token
  double dense_ffn = 0;       // 6 d dense_ffn (dense layers)
  double router = 0;          // 2 E d (MoE layers)
  double routed_experts = 0;  // 6 d f k (MoE layers)
  double shared_experts = 0;  // 6 d f s (MoE layers)
  double total() const {
    return mla_down + mla_up + mla_out + attention_core + dense_ffn + router + routed_experts + shared_experts;
  }
};
LayerFlopsPerToken layer_flops_per_token(const TrainerConfig& cfg, int64_t layer, int64_t seq_len);

// The LM head's forward FLOPs per token: 2 vocab d.
double lm_head_flops_per_token(const ModelConfig& m);

// achieved / peak: training FLOPs per token x tokens_per_second / peak_flops. Throws for peak_flops <= 0 or
// tokens_per_second < 0.
double model_flops_utilization(const TrainerConfig& cfg, int64_t seq_len, double tokens_per_second,
                               double peak_flops);

inline constexpr double kH100H200DenseBf16Flops = 989e12;  // NVIDIA H100/H200 SXM, dense BF16

}  // namespace fp4moe
