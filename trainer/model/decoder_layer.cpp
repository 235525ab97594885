#include "trainer/model/decoder_layer.h"

#include <cmath>

#include "kernels/common/check.h"
#include "kernels/nn/elementwise.h"
#include "trainer/model/layout_emulation.h"
#include "trainer/model/model.h"
#include "trainer/model/profile.h"

namespace fp4moe {

namespace {

float eps_of(const TrainerConfig& cfg) { return static_cast<float>(cfg.model.norm_eps); }

}  // namespace

DecoderLayer::DecoderLayer(ParamStore& store, const TrainerConfig& cfg, int64_t l, int64_t max_tokens,
                           DeviceMemory& mem, EpTransport* transport)
    : index_(l),
      d_(cfg.model.hidden),
      rc_(layer_recompute(cfg.recompute)),
      attn_norm_(store, name(l, "attn_norm"), cfg.model.hidden, eps_of(cfg), max_tokens, mem, !rc_.norms),
      attn_(store, name(l, "attn"), cfg.model, cfg.recipe.attention, cfg.train.seq_len, max_tokens, mem, rc_.mla),
      ffn_norm_(store, name(l, "ffn_norm"), cfg.model.hidden, eps_of(cfg), max_tokens, mem, !rc_.norms) {
  if (cfg.is_moe_layer(l) && transport) {
    ep_moe_ = std::make_unique<ExpertParallelMoeLayer>(store, name(l, "moe"), cfg, max_tokens, mem, *transport);
  } else if (cfg.is_moe_layer(l)) {
    moe_.emplace(store, name(l, "moe"), cfg, max_tokens, mem);
  } else {
    const float fc2_std = static_cast<float>(0.02 / std::sqrt(2.0 * static_cast<double>(cfg.model.layers)));
    mlp_.emplace(store, name(l, "mlp"), cfg.model.hidden, cfg.model.dense_ffn, cfg.recipe.dense_mlp, max_tokens, mem,
                 fc2_std, rc_.dense_mlp);
  }
  cfg_ = cfg;
  const LayerShape shape = transport ? LayerShape::expert_parallel_rank(cfg, max_tokens, transport->world_size())
                                     : LayerShape::one_gpu(cfg, max_tokens);
  plans_ = buffers(cfg, l, shape);
  const BufferPlan& own = plans_.front();
  keep_a_in_ = own.at("attn_norm out").held;
  keep_f_in_ = own.at("ffn_norm out").held;
  FP4MOE_CHECK(keep_a_in_ == (!rc_.norms && attn_.backward_reads_input()) &&
                   keep_f_in_ == (!rc_.norms && (has_moe() || mlp_->backward_reads_input())),
               "DecoderLayer {}: the buffer plan keeps the norm outputs otherwise than the layer's backward reads them",
               l);
  h_mid_ = own.allocate_kept<bf16>(mem, "h_mid", name(l, "h_mid") + " (residual after attention)");
  a_in_ = own.allocate_kept<bf16>(mem, "attn_norm out", name(l, "attn_norm"));
  f_in_ = own.allocate_kept<bf16>(mem, "ffn_norm out", name(l, "ffn_norm"));
  scratch_ = scratch(cfg, l, shape);
}

const BufferPlan& DecoderLayer::plan_for(int64_t M) {
  if (M != pass_M_) {
    pass_plan_ = own_buffers(cfg_, index_, M);
    pass_M_ = M;
  }
  return pass_plan_;
}

LayerShape LayerShape::one_gpu(const TrainerConfig& cfg, int64_t max_tokens) {
  LayerShape s;
  s.tokens = s.seq_share = max_tokens;
  s.seq_len = cfg.train.seq_len;
  s.heads = cfg.model.heads;
  s.dense_ffn = cfg.model.dense_ffn;
  s.routed_rows = routed_row_count(max_tokens * cfg.moe.top_k, cfg.parallel.routed_load);  // skewed or not
  s.local_experts = local_routed_experts(cfg);  // the expert-parallel share (emulated, moe_router.h)
  s.shared_ffn = cfg.moe.shared_experts * cfg.moe.expert_ffn;
  return s;
}

LayerShape LayerShape::expert_parallel_rank(const TrainerConfig& cfg, int64_t max_tokens, int ranks) {
  FP4MOE_CHECK(ranks >= 1, "LayerShape::expert_parallel_rank: ranks must be >= 1, got {}", ranks);
  LayerShape s = one_gpu(cfg, max_tokens);
  s.ep_ranks = ranks;
  s.local_experts = cfg.moe.routed_experts / ranks;
  s.routed_rows = ExpertParallelMoeLayer::max_received_rows(cfg, max_tokens, ranks);
  return s;
}

BufferPlan DecoderLayer::own_buffers(const TrainerConfig& cfg, int64_t l, int64_t seq_share) {
  const LayerRecompute rc = layer_recompute(cfg.recompute);
  const ModelConfig& m = cfg.model;
  // The norm outputs serve backward as the branches' inputs: kept unless recomputed (layernorm, full) or not read
  // (fp8/mxfp4 projections without a recompute from x, MlaAttention::backward_reads_input; the MoE block always
  // reads its input: the router's Wgrad and the shared experts).
  const bool attn_reads =
      cfg.recipe.attention == Recipe::bf16 || rc.mla.whole || (rc.mla.up_proj && m.q_lora_rank == 0);
  const bool ffn_reads = cfg.is_moe_layer(l) || rc.dense_mlp || cfg.recipe.dense_mlp == Recipe::bf16;
  const int64_t n = seq_share * m.hidden;
  BufferPlan own("layer");
  own.add("h (layer input)", n, ElemType::bf16);
  own.add("h_mid", n, ElemType::bf16, !rc.full);
  own.add("attn_norm out", n, ElemType::bf16, !rc.norms && attn_reads);
  own.append(RmsNorm::buffers(seq_share, m.hidden, !rc.norms), "attn_norm ");
  own.add("ffn_norm out", n, ElemType::bf16, !rc.norms && ffn_reads);
  own.append(RmsNorm::buffers(seq_share, m.hidden, !rc.norms), "ffn_norm ");
  return own;
}

std::vector<BufferPlan> DecoderLayer::buffers(const TrainerConfig& cfg, int64_t l, const LayerShape& s) {
  FP4MOE_CHECK(l >= 0 && l < cfg.model.layers, "DecoderLayer::buffers: layer {} is outside [0, model.layers = {})", l,
               cfg.model.layers);
  const LayerRecompute rc = layer_recompute(cfg.recompute);
  const ModelConfig& m = cfg.model;
  const bool moe = cfg.is_moe_layer(l);
  BufferPlan own = own_buffers(cfg, l, s.seq_share);
  std::vector<BufferPlan> plans{std::move(own),
                                MlaAttention::buffers(m, cfg.recipe.attention, rc.mla, s.tokens, s.seq_share, s.heads,
                                                      s.seq_len)};
  if (moe) {
    for (BufferPlan& p : s.ep_ranks > 0 ? ExpertParallelMoeLayer::buffers(cfg, s.seq_share, s.routed_rows,
                                                                          s.local_experts)
                                        : MoeLayer::buffers(cfg, s))
      plans.push_back(std::move(p));
  } else {
    plans.push_back(SwigluMlp::buffers("mlp", s.tokens, s.seq_share, m.hidden, s.dense_ffn, cfg.recipe.dense_mlp,
                                       rc.dense_mlp, false));
  }
  return plans;
}

// The passes below: every scope's takes, with the sub-layers' own scopes on top.
PassScratch DecoderLayer::scratch(const TrainerConfig& cfg, int64_t l, const LayerShape& s) {
  FP4MOE_CHECK(l >= 0 && l < cfg.model.layers, "DecoderLayer::scratch: layer {} is outside [0, model.layers = {})", l,
               cfg.model.layers);
  const LayerRecompute rc = layer_recompute(cfg.recompute);
  const BufferPlan own = own_buffers(cfg, l, s.seq_share);
  const bool keep_a_in = own.at("attn_norm out").held, keep_f_in = own.at("ffn_norm out").held;
  // h_mid, a_in and f_in have the same size: one row of d per token
  const size_t n = ScratchArena::rounded(static_cast<size_t>(own.at("h_mid").bytes()));
  const int64_t d = cfg.model.hidden;
  const PassScratch norm = RmsNorm::scratch(s.seq_share, d, !rc.norms);  // attn_norm and ffn_norm alike
  const PassScratch attn =
      MlaAttention::scratch(cfg.model, cfg.recipe.attention, rc.mla, s.tokens, s.heads, s.seq_len);
  const PassScratch ffn =
      !cfg.is_moe_layer(l) ? SwigluMlp::scratch(s.tokens, d, s.dense_ffn, cfg.recipe.dense_mlp, rc.dense_mlp)
      : s.ep_ranks > 0     ? ExpertParallelMoeLayer::scratch(cfg, s.seq_share, s.routed_rows, s.local_experts)
                           : MoeLayer::scratch(cfg, s);
  PassScratch out;
  out.forward = (rc.full ? n : 0) +  // h_mid, then a_in and f_in when not kept
                std::max((keep_a_in ? 0 : n) + attn.forward, (keep_f_in ? 0 : n) + ffn.forward);
  const size_t base = rc.full ? n + norm.recompute + attn.recompute + n : 0;
  const size_t ffn_half = (rc.norms ? n + norm.recompute : 0) + std::max(ffn.backward, norm.backward);
  const size_t attn_half = (rc.norms && !rc.full ? n + norm.recompute : 0) +
                           std::max(rc.full ? attn.backward_after_recompute : attn.backward, norm.backward);
  out.backward = base + std::max(ffn_half, attn_half);
  return out;
}

void DecoderLayer::forward(ModelContext& ctx, const bf16* h, int64_t M, bf16* tmp, bf16* h_next) {
  const int64_t n = M * d_;
  const BufferPlan& own = plan_for(M);
  ScratchArena& arena = scratch_of(ctx, name(index_, "forward"));
  ScratchScope layer_scope(arena);
  bf16* h_mid = rc_.full ? take_planned<bf16>(arena, own.at("h_mid"), "layer h_mid (not kept)") : h_mid_.data();
  {
    ScratchScope scope(arena);
    bf16* a_in = keep_a_in_ ? a_in_.data()
                            : take_planned<bf16>(arena, own.at("attn_norm out"), "layer attn_norm output (not kept)");
    attn_norm_.forward(ctx, h, M, a_in);                 // a_in [M, d]
    attn_.forward(ctx, a_in, M, tmp);                    // MLA out [M, d]
    add_bf16(h, tmp, n, h_mid, ctx.stream);              // h_mid = h + MLA
  }
  {
    ScratchScope scope(arena);
    bf16* f_in = keep_f_in_ ? f_in_.data()
                            : take_planned<bf16>(arena, own.at("ffn_norm out"), "layer ffn_norm output (not kept)");
    ffn_norm_.forward(ctx, h_mid, M, f_in);              // f_in [M, d]
    if (moe_) {
      moe_->forward(ctx, f_in, M, tmp);                  // FFN out [M, d]
    } else if (ep_moe_) {
      ep_moe_->forward(ctx, f_in, M, tmp);
    } else {
      ProfileScope profile(ctx, ProfileModule::dense_mlp, ProfilePass::forward);
      mlp_->forward(ctx, f_in, M, tmp);
    }
    add_bf16(h_mid, tmp, n, h_next, ctx.stream);         // h' = h_mid + FFN
  }
}

void DecoderLayer::backward(ModelContext& ctx, const bf16* h, int64_t M, bf16* d_res, bf16* tmp,
                            float aux_grad_scale) {
  const int64_t n = M * d_;
  const BufferPlan& own = plan_for(M);
  ScratchArena& arena = scratch_of(ctx, name(index_, "backward"));
  ScratchScope layer_scope(arena);
  if (moe_) moe_->set_aux_grad_scale(aux_grad_scale);
  if (ep_moe_) ep_moe_->set_aux_grad_scale(aux_grad_scale);
  bf16* h_mid = h_mid_.data();
  bf16* a_in = a_in_.data();  // null when neither kept nor read (fp8/mxfp4 projections)
  if (rc_.full) {  // the forward again up to h_mid; MLA's tensors stay in this scope for its backward
    a_in = take_planned<bf16>(arena, own.at("attn_norm out"), "layer attn_norm output (recomputed)");
    attn_norm_.recompute(ctx, h, M, a_in);
    attn_.recompute_forward(ctx, a_in, M, tmp);
    h_mid = take_planned<bf16>(arena, own.at("h_mid"), "layer h_mid (recomputed)");
    add_bf16(h, tmp, n, h_mid, ctx.stream);
  }
  {
    ScratchScope scope(arena);
    bf16* f_in = f_in_.data();  // null when neither kept nor read (an fp8/mxfp4 dense fc1)
    if (rc_.norms) {  // recomputed for the norm's rstd (and the branch's input)
      f_in = take_planned<bf16>(arena, own.at("ffn_norm out"), "layer ffn_norm output (recomputed)");
      ffn_norm_.recompute(ctx, h_mid, M, f_in);
    }
    if (moe_) {
      moe_->backward(ctx, d_res, f_in, M, tmp);          // d f_in
    } else if (ep_moe_) {
      ep_moe_->backward(ctx, d_res, f_in, M, tmp);
    } else {
      ProfileScope profile(ctx, ProfileModule::dense_mlp, ProfilePass::backward);
      mlp_->backward(ctx, d_res, f_in, M, tmp);
    }
    ffn_norm_.backward(ctx, tmp, h_mid, M, tmp);          // the FFN branch's d h_mid
    add_bf16(d_res, tmp, n, d_res, ctx.stream);           // d h_mid
  }
  {
    ScratchScope scope(arena);
    if (rc_.norms && !rc_.full) {
      a_in = take_planned<bf16>(arena, own.at("attn_norm out"), "layer attn_norm output (recomputed)");
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
  m.moe = has_moe();
  m.residual = input_bytes + counted_bytes(h_mid_);
  m.norms = counted_bytes(a_in_) + counted_bytes(f_in_) + attn_norm_.kept_bytes() + ffn_norm_.kept_bytes() +
            attn_.kept_norm_bytes();
  m.attn = attn_.kept_bytes() - attn_.kept_norm_bytes();
  m.ffn = moe_ ? moe_->kept_bytes() : ep_moe_ ? ep_moe_->kept_bytes() : mlp_->kept_bytes();
  m.routed_experts = moe_ ? moe_->experts().kept_bytes() : ep_moe_ ? ep_moe_->experts().kept_bytes() : 0;
  for (const BufferPlan& p : plans_)
    m.quantized_copies += static_cast<size_t>(p.counted_bytes(MemCategory::activations, Lifetime::first_forward));
  m.scratch_forward = scratch_.forward;
  m.scratch_backward = scratch_.backward;
  return m;
}

float DecoderLayer::moe_aux_loss_host() const {
  return moe_ ? moe_->aux_loss_host() : ep_moe_ ? ep_moe_->aux_loss_host() : 0.0f;
}

void DecoderLayer::moe_end_step(ModelContext& ctx) {
  if (moe_) moe_->end_step(ctx);
  if (ep_moe_) ep_moe_->end_step(ctx);
}

const int32_t* DecoderLayer::moe_topk_idx() const {
  return moe_ ? moe_->topk_idx() : ep_moe_ ? ep_moe_->topk_idx() : nullptr;
}

void DecoderLayer::moe_force_routing(const int32_t* topk_or_null) {
  FP4MOE_CHECK(has_moe(), "DecoderLayer {}: force_routing on a dense layer (no router)", index_);
  if (moe_) moe_->force_routing(topk_or_null);
  else ep_moe_->force_routing(topk_or_null);
}

DispatchBytes DecoderLayer::moe_dispatch_bytes() const {
  FP4MOE_CHECK(has_moe(), "DecoderLayer {}: a dense layer has no routed experts' dispatch", index_);
  return moe_ ? moe_->experts().dispatch_bytes() : ep_moe_->experts().dispatch_bytes();
}

}  // namespace fp4moe
