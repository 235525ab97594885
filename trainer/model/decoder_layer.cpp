#include "trainer/model/decoder_layer.h"

#include <cmath>

#include "kernels/common/check.h"
#include "kernels/nn/elementwise.h"
#include "trainer/model/model.h"

namespace fp4moe {

namespace {

float eps_of(const TrainerConfig& cfg) { return static_cast<float>(cfg.model.norm_eps); }

DeviceArray<bf16> kept_rows(bool keep, DeviceMemory& mem, int64_t n, const std::string& what) {
  return keep ? DeviceArray<bf16>(mem, n, MemCategory::activations, what) : DeviceArray<bf16>();
}

// What the layer's fp8/mxfp4 Linears and fp8 Group Linears keep of their inputs under MemCategory::activations
// from their first forward on (Linear / GroupLinear::held_activation_bytes, unrounded); bf16 ones keep nothing
// of their own (their input is the layer's, counted in its kept bytes), nor does an mxfp4 Group Linear (the
// layer's MXFP4 copy).
size_t quantized_copy_bytes(const TrainerConfig& cfg, int64_t l, int64_t M) {
  const ModelConfig& m = cfg.model;
  auto linear = [&](Recipe r, int64_t K) {
    return r == Recipe::bf16 ? size_t{0} : Linear::held_activation_bytes(r, M, K);
  };
  const Recipe ra = cfg.recipe.attention, rd = cfg.recipe.dense_mlp;
  size_t b = linear(ra, m.hidden) + linear(ra, m.kv_lora_rank) + linear(ra, m.heads * m.v_head_dim);  // kv, out
  b += m.q_lora_rank > 0 ? linear(ra, m.hidden) + linear(ra, m.q_lora_rank) : linear(ra, m.hidden);    // q path
  if (!cfg.is_moe_layer(l)) return b + linear(rd, m.hidden) + linear(rd, m.dense_ffn);
  const int64_t fs = cfg.moe.shared_experts * cfg.moe.expert_ffn;
  if (fs > 0) b += linear(cfg.recipe.shared_experts, m.hidden) + linear(cfg.recipe.shared_experts, fs);
  if (cfg.recipe.routed_experts == Recipe::fp8) {
    const int64_t R = M * cfg.moe.top_k, E = cfg.moe.routed_experts;
    b += GroupLinear::held_activation_bytes(Recipe::fp8, R, m.hidden, E) +
         GroupLinear::held_activation_bytes(Recipe::fp8, R, cfg.moe.expert_ffn, E);
  }
  return b;
}

}  // namespace

DecoderLayer::DecoderLayer(ParamStore& store, const TrainerConfig& cfg, int64_t l, int64_t max_tokens,
                           DeviceMemory& mem)
    : index_(l),
      d_(cfg.model.hidden),
      rc_(layer_recompute(cfg.recompute)),
      attn_norm_(store, name(l, "attn_norm"), cfg.model.hidden, eps_of(cfg), max_tokens, mem, !rc_.norms),
      attn_(store, name(l, "attn"), cfg.model, cfg.recipe.attention, cfg.train.seq_len, max_tokens, mem, rc_.mla),
      ffn_norm_(store, name(l, "ffn_norm"), cfg.model.hidden, eps_of(cfg), max_tokens, mem, !rc_.norms) {
  if (cfg.is_moe_layer(l)) {
    moe_.emplace(store, name(l, "moe"), cfg, max_tokens, mem);
  } else {
    const float fc2_std = static_cast<float>(0.02 / std::sqrt(2.0 * static_cast<double>(cfg.model.layers)));
    mlp_.emplace(store, name(l, "mlp"), cfg.model.hidden, cfg.model.dense_ffn, cfg.recipe.dense_mlp, max_tokens, mem,
                 fc2_std, rc_.dense_mlp);
  }
  // The norm outputs serve backward as the branches' inputs: kept unless recomputed (layernorm, full) or not read
  // (fp8/mxfp4 projections without a recompute from x; the MoE block always reads its input: the router).
  keep_a_in_ = !rc_.norms && attn_.backward_reads_input();
  keep_f_in_ = !rc_.norms && (moe_ || mlp_->backward_reads_input());
  const int64_t n = max_tokens * d_;
  h_mid_ = kept_rows(!rc_.full, mem, n, name(l, "h_mid") + " (residual after attention)");
  a_in_ = kept_rows(keep_a_in_, mem, n, name(l, "attn_norm") + " output");
  f_in_ = kept_rows(keep_f_in_, mem, n, name(l, "ffn_norm") + " output");
  plan_scratch(max_tokens);
  quantized_copies_ = quantized_copy_bytes(cfg, l, max_tokens);
}

// The passes below, for M = max_tokens: every scope's takes, with the sub-layers' own scopes on top.
void DecoderLayer::plan_scratch(int64_t max_tokens) {
  const size_t n = ScratchArena::rounded(static_cast<size_t>(max_tokens * d_) * sizeof(bf16));
  const size_t r_attn = attn_norm_.recompute_bytes(), r_ffn = ffn_norm_.recompute_bytes();
  const size_t ffn_fwd = moe_ ? moe_->forward_bytes() : mlp_->forward_bytes();
  const size_t ffn_bwd = moe_ ? moe_->backward_bytes() : mlp_->backward_bytes();
  fwd_bytes_ = (rc_.full ? n : 0) +  // h_mid, then a_in and f_in when not kept
               std::max((keep_a_in_ ? 0 : n) + attn_.forward_bytes(), (keep_f_in_ ? 0 : n) + ffn_fwd);
  const size_t base = rc_.full ? n + r_attn + attn_.recompute_bytes() + n : 0;
  const size_t ffn_half = (rc_.norms ? n + r_ffn : 0) + std::max(ffn_bwd, ffn_norm_.backward_bytes());
  const size_t attn_half =
      (rc_.norms && !rc_.full ? n + r_attn : 0) +
      std::max(rc_.full ? attn_.backward_after_recompute_bytes() : attn_.backward_bytes(), attn_norm_.backward_bytes());
  bwd_bytes_ = base + std::max(ffn_half, attn_half);
}

void DecoderLayer::forward(ModelContext& ctx, const bf16* h, int64_t M, bf16* tmp, bf16* h_next) {
  const int64_t n = M * d_;
  ScratchArena& arena = scratch_of(ctx, name(index_, "forward"));
  ScratchScope layer_scope(arena);
  bf16* h_mid = rc_.full ? arena.take<bf16>(n, "layer h_mid (not kept)") : h_mid_.data();
  {
    ScratchScope scope(arena);
    bf16* a_in = keep_a_in_ ? a_in_.data() : arena.take<bf16>(n, "layer attn_norm output (not kept)");
    attn_norm_.forward(ctx, h, M, a_in);                 // a_in [M, d]
    attn_.forward(ctx, a_in, M, tmp);                    // MLA out [M, d]
    add_bf16(h, tmp, n, h_mid, ctx.stream);              // h_mid = h + MLA
  }
  {
    ScratchScope scope(arena);
    bf16* f_in = keep_f_in_ ? f_in_.data() : arena.take<bf16>(n, "layer ffn_norm output (not kept)");
    ffn_norm_.forward(ctx, h_mid, M, f_in);              // f_in [M, d]
    if (moe_) moe_->forward(ctx, f_in, M, tmp);          // FFN out [M, d]
    else mlp_->forward(ctx, f_in, M, tmp);
    add_bf16(h_mid, tmp, n, h_next, ctx.stream);         // h' = h_mid + FFN
  }
}

void DecoderLayer::backward(ModelContext& ctx, const bf16* h, int64_t M, bf16* d_res, bf16* tmp,
                            float aux_grad_scale) {
  const int64_t n = M * d_;
  ScratchArena& arena = scratch_of(ctx, name(index_, "backward"));
  ScratchScope layer_scope(arena);
  if (moe_) moe_->set_aux_grad_scale(aux_grad_scale);
  bf16* h_mid = h_mid_.data();
  bf16* a_in = a_in_.data();  // null when neither kept nor read (fp8/mxfp4 projections)
  if (rc_.full) {  // the forward again up to h_mid; MLA's tensors stay in this scope for its backward
    a_in = arena.take<bf16>(n, "layer attn_norm output (recomputed)");
    attn_norm_.recompute(ctx, h, M, a_in);
    attn_.recompute_forward(ctx, a_in, M, tmp);
    h_mid = arena.take<bf16>(n, "layer h_mid (recomputed)");
    add_bf16(h, tmp, n, h_mid, ctx.stream);
  }
  {
    ScratchScope scope(arena);
    bf16* f_in = f_in_.data();  // null when neither kept nor read (an fp8/mxfp4 dense fc1)
    if (rc_.norms) {  // recomputed for the norm's rstd (and the branch's input)
      f_in = arena.take<bf16>(n, "layer ffn_norm output (recomputed)");
      ffn_norm_.recompute(ctx, h_mid, M, f_in);
    }
    if (moe_) moe_->backward(ctx, d_res, f_in, M, tmp);  // d f_in
    else mlp_->backward(ctx, d_res, f_in, M, tmp);
    ffn_norm_.backward(ctx, tmp, h_mid, M, tmp);          // the FFN branch's d h_mid
    add_bf16(d_res, tmp, n, d_res, ctx.stream);           // d h_mid
  }
  {
    ScratchScope scope(arena);
    if (rc_.norms && !rc_.full) {
      a_in = arena.take<bf16>(n, "layer attn_norm output (recomputed)");
      attn_norm_.recompute(ctx, h, M, a_in);
    }
    attn_.backward(ctx, d_res, a_in, M, tmp);             // d a_in
    attn_norm_.backward(ctx, tmp, h, M, tmp);             // the attention branch's d h
    add_bf16(d_res, tmp, n, d_res, ctx.stream);           // d h
  }
}

LayerMemory DecoderLayer::memory(size_t input_bytes) const {
  LayerMemory m;
  m.layer = index_;
  m.moe = moe_.has_value();
  m.residual = input_bytes + counted_bytes(h_mid_);
  m.norms = counted_bytes(a_in_) + counted_bytes(f_in_) + attn_norm_.kept_bytes() + ffn_norm_.kept_bytes() +
            attn_.kept_norm_bytes();
  m.attn = attn_.kept_bytes() - attn_.kept_norm_bytes();
  m.ffn = moe_ ? moe_->kept_bytes() : mlp_->kept_bytes();
  m.routed_experts = moe_ ? moe_->experts().kept_bytes() : 0;
  m.quantized_copies = quantized_copies_;
  m.scratch_forward = fwd_bytes_;
  m.scratch_backward = bwd_bytes_;
  return m;
}

}  // namespace fp4moe
