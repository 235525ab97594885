#include "trainer/flops.h"

#include "kernels/common/check.h"

namespace fp4moe {

namespace {

// One MLA block's weights: projections (GEMMs) and the two low-rank norms.
struct MlaParams {
  int64_t matmul = 0;
  int64_t norms = 0;
};

MlaParams mla_params(const ModelConfig& m) {
  const int64_t d = m.hidden, H = m.heads;
  MlaParams p;
  if (m.q_lora_rank > 0) {
    p.matmul += d * m.q_lora_rank + m.q_lora_rank * H * m.qk_head_dim();  // q_a, q_b
    p.norms += m.q_lora_rank;                                             // q_a_layernorm
  } else {
    p.matmul += d * H * m.qk_head_dim();  // q_proj
  }
  p.matmul += d * (m.kv_lora_rank + m.qk_rope_head_dim);                 // kv_a (with the shared RoPE key)
  p.norms += m.kv_lora_rank;                                              // kv_a_layernorm
  p.matmul += m.kv_lora_rank * H * (m.qk_nope_head_dim + m.v_head_dim);  // kv_b
  p.matmul += H * m.v_head_dim * d;                                       // o_proj
  return p;
}

}  // namespace

ParameterCounts count_parameters(const TrainerConfig& cfg) {
  const ModelConfig& m = cfg.model;
  const MoeConfig& e = cfg.moe;
  FP4MOE_CHECK(m.hidden >= 1 && m.layers >= 1 && m.vocab_size >= 1 && m.n_dense_layers >= 0 &&
                   m.n_dense_layers <= m.layers,
               "count_parameters: needs hidden, layers, vocab_size >= 1 and 0 <= n_dense_layers <= layers, got "
               "hidden={} layers={} vocab_size={} n_dense_layers={}",
               m.hidden, m.layers, m.vocab_size, m.n_dense_layers);
  const int64_t d = m.hidden;
  const int64_t dense = m.n_dense_layers, moe = m.layers - m.n_dense_layers;
  if (moe > 0)
    FP4MOE_CHECK(e.top_k >= 1 && e.top_k <= e.routed_experts,
                 "count_parameters: needs 1 <= moe.top_k <= moe.routed_experts, got top_k={} routed_experts={}",
                 e.top_k, e.routed_experts);
  const MlaParams mla = mla_params(m);
  const int64_t expert = 3 * d * e.expert_ffn;
  const int64_t router_bias = e.router == RouterStyle::v3_sigmoid ? e.routed_experts : 0;

  ParameterCounts c;
  c.embedding = m.vocab_size * d;
  c.lm_head = m.vocab_size * d;
  c.attention = m.layers * (mla.matmul + mla.norms);
  c.norms = m.layers * 2 * d + d;
  c.dense_ffn = dense * 3 * d * m.dense_ffn;
  c.router = moe * (e.routed_experts * d + router_bias);
  c.routed_experts = moe * e.routed_experts * expert;
  c.shared_experts = moe * e.shared_experts * expert;
  c.total = c.embedding + c.attention + c.norms + c.dense_ffn + c.router + c.routed_experts + c.shared_experts +
            c.lm_head;

  c.activated_matmul = m.layers * mla.matmul + c.dense_ffn + moe * e.routed_experts * d +
                       moe * (e.top_k + e.shared_experts) * expert + c.lm_head;
  c.activated = c.activated_matmul + m.layers * mla.norms + c.norms + moe * router_bias + d;
  return c;
}

double attention_flops_per_token(const ModelConfig& m, int64_t seq_len) {
  FP4MOE_CHECK(seq_len >= 1, "attention_flops_per_token: seq_len must be >= 1, got {}", seq_len);
  // (T + 1) / 2 keys on average per query, 2 H (dq + dv) FLOPs per (query, key) pair.
  return static_cast<double>(m.heads) * static_cast<double>(m.qk_head_dim() + m.v_head_dim) *
         static_cast<double>(seq_len + 1);
}

FlopsPerToken model_flops_per_token(const TrainerConfig& cfg, int64_t seq_len) {
  const ParameterCounts c = count_parameters(cfg);
  FlopsPerToken f;
  f.attention = static_cast<double>(cfg.model.layers) * attention_flops_per_token(cfg.model, seq_len);
  f.forward = 2.0 * static_cast<double>(c.activated_matmul) + f.attention;
  f.training = 3.0 * f.forward;
  return f;
}

LayerFlopsPerToken layer_flops_per_token(const TrainerConfig& cfg, int64_t layer, int64_t seq_len) {
  const ModelConfig& m = cfg.model;
  const MoeConfig& e = cfg.moe;
  FP4MOE_CHECK(layer >= 0 && layer < m.layers, "layer_flops_per_token: layer {} is outside [0, model.layers = {})",
               layer, m.layers);
  const double d = static_cast<double>(m.hidden), H = static_cast<double>(m.heads);
  const double dq = static_cast<double>(m.qk_head_dim()), dv = static_cast<double>(m.v_head_dim);
  const double rkv = static_cast<double>(m.kv_lora_rank), rq = static_cast<double>(m.q_lora_rank);
  LayerFlopsPerToken f;
  const double q_direct = m.q_lora_rank > 0 ? 0.0 : d * H * dq;
  f.mla_down = 2.0 * (d * rq + q_direct + d * (rkv + static_cast<double>(m.qk_rope_head_dim)));
  f.mla_up = 2.0 * (rq * H * dq + rkv * H * static_cast<double>(m.qk_nope_head_dim + m.v_head_dim));
  f.mla_out = 2.0 * H * dv * d;
  f.attention_core = attention_flops_per_token(m, seq_len);
  const double expert = 6.0 * d * static_cast<double>(e.expert_ffn);
  if (!cfg.is_moe_layer(layer)) {
    f.dense_ffn = 6.0 * d * static_cast<double>(m.dense_ffn);
  } else {
    f.router = 2.0 * static_cast<double>(e.routed_experts) * d;
    f.routed_experts = static_cast<double>(e.top_k) * expert;
    f.shared_experts = static_cast<double>(e.shared_experts) * expert;
  }
  return f;
}

double lm_head_flops_per_token(const ModelConfig& m) {
  return 2.0 * static_cast<double>(m.vocab_size) * static_cast<double>(m.hidden);
}

double model_flops_utilization(const TrainerConfig& cfg, int64_t seq_len, double tokens_per_second,
                               double peak_flops) {
  FP4MOE_CHECK(peak_flops > 0, "MFU: peak FLOP/s must be > 0, got {}", peak_flops);
  FP4MOE_CHECK(tokens_per_second >= 0, "MFU: tokens per second must be >= 0, got {}", tokens_per_second);
  return model_flops_per_token(cfg, seq_len).training * tokens_per_second / peak_flops;
}

}  // namespace fp4moe
