#include "trainer/model/mla.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/attention/attention_checks.h"
#include "kernels/attention/attention_core.h"
#include "kernels/attention/flash_attention.h"
#include "kernels/common/check.h"
#include "kernels/nn/elementwise.h"
#include "kernels/nn/mla_ops.h"
#include "kernels/nn/rope.h"

namespace fp4moe {

namespace {

constexpr float kInitStd = 0.02f;

// Checks the shapes before any parameter is registered; returns the prefix.
std::string validated(const std::string& prefix, const ModelConfig& cfg, int64_t seq_len, int64_t max_tokens) {
  const int64_t nope = cfg.qk_nope_head_dim, rope = cfg.qk_rope_head_dim, dv = cfg.v_head_dim;
  FP4MOE_CHECK(cfg.heads >= 1 && cfg.hidden >= 1 && cfg.kv_lora_rank >= 1 && cfg.q_lora_rank >= 0 && cfg.layers >= 1,
               "MlaAttention {}: expected heads, hidden, kv_lora_rank, layers >= 1 and q_lora_rank >= 0, got heads={} "
               "hidden={} kv_lora_rank={} layers={} q_lora_rank={}",
               prefix, cfg.heads, cfg.hidden, cfg.kv_lora_rank, cfg.layers, cfg.q_lora_rank);
  FP4MOE_CHECK(nope >= 8 && nope % 8 == 0 && rope >= 8 && rope % 8 == 0 && dv >= 8 && dv % 8 == 0,
               "MlaAttention {}: qk_nope_head_dim, qk_rope_head_dim and v_head_dim must be positive multiples of 8 "
               "(16-byte rows and strides of the attention kernels), got {}, {}, {}",
               prefix, nope, rope, dv);
  FP4MOE_CHECK(rope <= kRopeMaxDim, "MlaAttention {}: qk_rope_head_dim={} exceeds the RoPE kernel's {}", prefix, rope,
               kRopeMaxDim);
  FP4MOE_CHECK(attn_detail::is_supported_pair(nope + rope, dv),
               "MlaAttention {}: the attention kernels take (qk head dim, v head dim) in {}, got ({}, {})", prefix,
               attn_detail::supported_pairs_text(), nope + rope, dv);
  FP4MOE_CHECK(cfg.rope_theta > 1.0, "MlaAttention {}: rope_theta must be > 1, got {}", prefix, cfg.rope_theta);
  FP4MOE_CHECK(seq_len >= 1 && max_tokens >= 0 && max_tokens % seq_len == 0,
               "MlaAttention {}: max_tokens={} must be a non-negative multiple of seq_len={} >= 1", prefix, max_tokens,
               seq_len);
  return prefix;
}

std::optional<Linear> maybe_linear(bool present, ParamStore& store, const std::string& name, int64_t in, int64_t out,
                                   Recipe recipe) {
  if (!present) return std::nullopt;
  return Linear(store, name, in, out, recipe, kInitStd);
}

std::optional<RmsNorm> maybe_norm(bool present, ParamStore& store, const std::string& name, int64_t C, float eps,
                                  int64_t max_tokens, DeviceMemory& mem, bool keep_rstd) {
  if (!present) return std::nullopt;
  return RmsNorm(store, name, C, eps, max_tokens, mem, keep_rstd);
}

// q_norm and kv_norm keep nothing (their outputs and rstd are recomputed) under layernorm and full.
bool norms_recomputed(const MlaRecompute& p) { return p.norms || p.whole; }

}  // namespace

MlaAttention::MlaAttention(ParamStore& store, const std::string& prefix, const ModelConfig& cfg, Recipe recipe,
                           int64_t seq_len, int64_t max_tokens, DeviceMemory& mem, MlaRecompute recompute)
    : prefix_(validated(prefix, cfg, seq_len, max_tokens)),
      d_(cfg.hidden),
      H_(cfg.heads),
      nope_(cfg.qk_nope_head_dim),
      rope_(cfg.qk_rope_head_dim),
      dqk_(cfg.qk_nope_head_dim + cfg.qk_rope_head_dim),
      dv_(cfg.v_head_dim),
      r_q_(cfg.q_lora_rank),
      r_kv_(cfg.kv_lora_rank),
      T_(seq_len),
      max_tokens_(max_tokens),
      rope_theta_(static_cast<float>(cfg.rope_theta)),
      core_layout_(core_layout(cfg, cfg.heads)),
      policy_(recompute),
      model_(cfg),
      recipe_(recipe),
      q_down_(maybe_linear(r_q_ > 0, store, prefix + ".q_down", d_, r_q_, recipe)),
      q_norm_(maybe_norm(r_q_ > 0, store, prefix + ".q_norm", r_q_, static_cast<float>(cfg.norm_eps), max_tokens, mem,
                         !norms_recomputed(recompute))),
      q_up_(store, prefix + (r_q_ > 0 ? ".q_up" : ".q_proj"), r_q_ > 0 ? r_q_ : d_, H_ * dqk_, recipe, kInitStd),
      kv_down_(store, prefix + ".kv_down", d_, r_kv_ + rope_, recipe, kInitStd),
      kv_norm_(store, prefix + ".kv_norm", r_kv_, static_cast<float>(cfg.norm_eps), max_tokens, mem,
               !norms_recomputed(recompute)),
      kv_up_(store, prefix + ".kv_up", r_kv_, H_ * (nope_ + dv_), recipe, kInitStd),
      out_(store, prefix + ".out", H_ * dv_, d_, recipe,
           static_cast<float>(0.02 / std::sqrt(2.0 * static_cast<double>(cfg.layers)))),
      last_M_(mem.slots(), -1) {
  plan_ = buffers(cfg, recipe, policy_, max_tokens, max_tokens, H_, seq_len);
  auto kept = [&](auto tag, const char* tensor) {
    using T = decltype(tag);
    return plan_.allocate_kept<T>(mem, tensor, prefix);
  };
  if (r_q_ > 0) {
    c_q_ = kept(bf16{}, "c_q");
    n_q_ = kept(bf16{}, "n_q");
  }
  q_ = kept(bf16{}, "q");
  c_kv_ = kept(bf16{}, "c_kv");
  n_kv_ = kept(bf16{}, "n_kv");
  kv_ = kept(bf16{}, "kv");
  k_ = kept(bf16{}, "k");
  k_pe_ = kept(bf16{}, "k_pe");
  o_ = kept(bf16{}, "o");
  lse_ = kept(float{}, "lse");
  for (Linear* proj : {q_down_ ? &*q_down_ : nullptr, &q_up_, &kv_down_, &kv_up_, &out_})
    if (proj) proj->set_profile_module(ProfileModule::mla_proj);
  scratch_ = scratch(cfg, recipe, policy_, max_tokens, H_, seq_len);
}

BufferPlan MlaAttention::buffers(const ModelConfig& cfg, const Recipe& recipe, const MlaRecompute& p,
                                 int64_t tokens, int64_t seq_share, int64_t heads, int64_t seq_len) {
  FP4MOE_CHECK(tokens >= 0 && seq_share >= 0 && heads >= 1 && seq_len >= 1 && tokens % seq_len == 0,
               "MlaAttention::buffers: expected tokens, seq_share >= 0, heads >= 1 and tokens a multiple of seq_len "
               ">= 1, got {} {} {} {}", tokens, seq_share, heads, seq_len);
  const int64_t N = tokens, d = cfg.hidden, nope = cfg.qk_nope_head_dim, rope = cfg.qk_rope_head_dim;
  const int64_t dqk = nope + rope, dv = cfg.v_head_dim, r_q = cfg.q_lora_rank, r_kv = cfg.kv_lora_rank;
  const bool whole = p.whole, up = p.up_proj, norms = norms_recomputed(p);
  // n_q and n_kv serve backward as q_up's and kv_up's input (bf16 Linears only: fp8/mxfp4 keep their own copy) and
  // as the source of a q or kv recompute (mla_up_proj).
  const bool keep_n = !whole && !p.norms && (recipe == Recipe::bf16 || up);
  BufferPlan b("mla");
  b.add("c_q", N * r_q, ElemType::bf16, !whole);  // no elements without q_lora (r_q = 0: q_proj)
  if (r_q > 0) b.append(RmsNorm::buffers(N, r_q, !norms), "q_norm ");
  b.add("n_q", N * r_q, ElemType::bf16, keep_n);
  b.add("q", N * heads * dqk, ElemType::bf16, !whole && !up);
  b.add("c_kv", N * r_kv, ElemType::bf16, !whole);
  b.append(RmsNorm::buffers(N, r_kv, !norms), "kv_norm ");
  b.add("n_kv", N * r_kv, ElemType::bf16, keep_n);
  b.add("kv", N * heads * (nope + dv), ElemType::bf16, !whole && !up);
  b.add("k", N * heads * dqk, ElemType::bf16, !whole && !up);
  b.add("k_pe", N * rope, ElemType::bf16, !whole && up);
  b.add("o", N * heads * dv, ElemType::bf16, !whole && !p.core_attn);
  b.add("lse", N * heads, ElemType::fp32, !whole && !p.core_attn);
  // Scratch of one pass: kv_down's output in forward; backward's gradients and the attention backward workspace.
  const Lifetime fwd = Lifetime::forward_scratch, bwd = Lifetime::backward_scratch;
  const MemCategory ws = MemCategory::workspace;
  b.add("kvd (kv_down output)", N * (r_kv + rope), ElemType::bf16, true, ws, fwd);
  b.add("d o", N * heads * dv, ElemType::bf16, true, ws, bwd);
  b.add("d q", N * heads * dqk, ElemType::bf16, true, ws, bwd);
  b.add("d k", N * heads * dqk, ElemType::bf16, true, ws, bwd);
  b.add("d kv", N * heads * (nope + dv), ElemType::bf16, true, ws, bwd);
  b.add("d kvd", N * (r_kv + rope), ElemType::bf16, true, ws, bwd);
  b.add("d latent", N * std::max(r_q, r_kv), ElemType::bf16, true, ws, bwd);
  b.add("dx (FP32)", N * d, ElemType::fp32, true, ws, bwd);
  b.add("attention backward workspace",
        N > 0 ? flash_attention_backward_workspace_bytes(core_shape(cfg, N, heads, seq_len)) : 0, ElemType::byte, true,
        ws, bwd);
  // The projections' own copies; the down-projections' Dgrads sum into dx in FP32 (run_backward).
  if (r_q > 0) {
    b.append(Linear::buffers(recipe, seq_share, r_q, d, true), "q_down ");
    b.append(Linear::buffers(recipe, N, heads * dqk, r_q, false), "q_up ");
  } else {
    b.append(Linear::buffers(recipe, seq_share, heads * dqk, d, true), "q_proj ");
  }
  b.append(Linear::buffers(recipe, seq_share, r_kv + rope, d, true), "kv_down ");
  b.append(Linear::buffers(recipe, N, heads * (nope + dv), r_kv, false), "kv_up ");
  b.append(Linear::buffers(recipe, N, d, heads * dv, false), "out ");
  return b;
}

AttentionShape MlaAttention::core_shape(const ModelConfig& cfg, int64_t tokens, int64_t heads, int64_t seq_len) {
  FP4MOE_CHECK(tokens >= 0 && heads >= 1 && seq_len >= 1 && tokens % seq_len == 0,
               "MlaAttention::core_shape: expected tokens >= 0 a multiple of seq_len >= 1 and heads >= 1, got {} {} {}",
               tokens, seq_len, heads);
  const int64_t dqk = cfg.qk_head_dim();
  return AttentionShape{tokens / seq_len, seq_len, heads, dqk, cfg.v_head_dim,
                        static_cast<float>(1.0 / std::sqrt(static_cast<double>(dqk)))};
}

SdpaLayout MlaAttention::core_layout(const ModelConfig& cfg, int64_t heads) {
  const int64_t dqk = cfg.qk_head_dim(), dv = cfg.v_head_dim, w_kv = cfg.qk_nope_head_dim + dv;
  const AttnStrides qk{heads * dqk, dqk}, kv{heads * w_kv, w_kv}, o{heads * dv, dv};
  return SdpaLayout{qk, qk, kv, o, o, qk, qk, kv};  // q, k, v, o, d o, d q, d k, d v
}

void MlaAttention::core_forward(ModelContext& ctx, int64_t M, const Acts& t) {
  const AttentionShape s = core_shape(model_, M, H_, T_);
  const SdpaLayout& l = core_layout_;
  const AttnIn q = attn_in(t.q, l.q), k = attn_in(t.k, l.k), v = attn_in(t.kv + nope_, l.v);
  const AttnOut o = attn_out(t.o, l.o);
  ProfileScope core(ctx, ProfileModule::core_attn);
  // o [M, H, dv], lse [B, H, T]
  if (ctx.attention) ctx.attention->forward(s, q, k, v, o, t.lse, ctx.stream);
  else flash_attention_forward(s, q, k, v, o, t.lse, ctx.stream);
}

MlaAttention::Acts MlaAttention::take_acts(ScratchArena& a, const BufferPlan& p, const MlaRecompute& policy,
                                            bool forward_only, const Acts& kept) {
  auto pick = [&](auto* kept_ptr, const char* tensor, const char* what) {  // kept, else from the scratch
    using T = std::remove_pointer_t<decltype(kept_ptr)>;
    const PlannedBuffer& b = p.at(tensor);
    return b.held ? kept_ptr : take_planned<T>(a, b, what);
  };
  Acts t;
  t.c_q = pick(kept.c_q, "c_q", "MLA c_q");
  // n_q / n_kv not kept: forward needs them; a backward only to rebuild the norms' rstd (layernorm).
  const bool rebuild_n = forward_only || policy.norms;
  t.n_q = p.at("n_q").held ? kept.n_q : rebuild_n ? take_planned<bf16>(a, p.at("n_q"), "MLA n_q") : nullptr;
  t.q = pick(kept.q, "q", "MLA q");
  t.c_kv = pick(kept.c_kv, "c_kv", "MLA c_kv");
  t.n_kv = p.at("n_kv").held ? kept.n_kv : rebuild_n ? take_planned<bf16>(a, p.at("n_kv"), "MLA n_kv") : nullptr;
  t.kv = pick(kept.kv, "kv", "MLA kv");
  t.k = pick(kept.k, "k", "MLA k");
  t.o = pick(kept.o, "o", "MLA o");
  t.lse = pick(kept.lse, "lse", "MLA lse");
  const PlannedBuffer& k_pe = p.at("k_pe");
  t.k_pe = k_pe.held ? kept.k_pe : forward_only ? take_planned<bf16>(a, k_pe, "MLA k_pe") : nullptr;
  t.kvd = forward_only ? take_planned<bf16>(a, p.at("kvd (kv_down output)"), "MLA kv_down output") : nullptr;
  return t;
}

MlaAttention::Acts MlaAttention::kept_acts() const {
  Acts t;
  t.c_q = c_q_.data();
  t.n_q = n_q_.data();
  t.q = q_.data();
  t.c_kv = c_kv_.data();
  t.n_kv = n_kv_.data();
  t.kv = kv_.data();
  t.k = k_.data();
  t.k_pe = k_pe_.data();
  t.o = o_.data();
  t.lse = lse_.data();
  return t;
}

MlaAttention::Acts MlaAttention::bind_acts(ScratchArena& a, int64_t M, bool forward_only) {
  return take_acts(a, plan_for(M), policy_, forward_only, kept_acts());
}

MlaAttention::Grads MlaAttention::take_grads(ScratchArena& a, const BufferPlan& p) {
  Grads g;
  g.d_o = take_planned<bf16>(a, p.at("d o"), "MLA d o");
  g.d_q = take_planned<bf16>(a, p.at("d q"), "MLA d q");
  g.d_k = take_planned<bf16>(a, p.at("d k"), "MLA d k");
  g.d_kv = take_planned<bf16>(a, p.at("d kv"), "MLA d kv");
  g.d_kvd = take_planned<bf16>(a, p.at("d kvd"), "MLA d kvd");
  g.d_lat = take_planned<bf16>(a, p.at("d latent"), "MLA d latent");
  g.dx32 = take_planned<float>(a, p.at("dx (FP32)"), "MLA dx (FP32)");
  g.attn_ws = take_planned<unsigned char>(a, p.at("attention backward workspace"), "MLA attention backward workspace");
  return g;
}

const BufferPlan& MlaAttention::plan_for(int64_t M) {
  if (M != pass_M_) {
    pass_plan_ = buffers(model_, recipe_, policy_, M, M, H_, T_);
    pass_M_ = M;
  }
  return pass_plan_;
}

// The passes' binding code on a measuring arena; the norms' recomputed rstd and backward scratch from RmsNorm.
PassScratch MlaAttention::scratch(const ModelConfig& cfg, const Recipe& recipe, const MlaRecompute& policy,
                                  int64_t tokens, int64_t heads, int64_t seq_len) {
  const BufferPlan p = buffers(cfg, recipe, policy, tokens, tokens, heads, seq_len);
  ScratchArena m;
  auto measure = [&](auto&& bind) {
    const ScratchArena::Mark start = m.mark();
    bind();
    const size_t bytes = m.used() - start.used;
    m.release(start);
    return bytes;
  };
  const size_t whole_acts = measure([&] { take_acts(m, p, policy, true, Acts{}); });
  const size_t some_acts = measure([&] { take_acts(m, p, policy, false, Acts{}); });
  const size_t grads = measure([&] { take_grads(m, p); });
  const bool keep_rstd = !norms_recomputed(policy);
  const PassScratch q_norm =
      cfg.q_lora_rank > 0 ? RmsNorm::scratch(tokens, cfg.q_lora_rank, keep_rstd) : PassScratch{};
  const PassScratch kv_norm = RmsNorm::scratch(tokens, cfg.kv_lora_rank, keep_rstd);
  const size_t norm_rstd = q_norm.recompute + kv_norm.recompute;
  const size_t norm_bwd = std::max(q_norm.backward, kv_norm.backward);
  PassScratch s;
  s.forward = whole_acts;
  s.recompute = whole_acts + norm_rstd;
  const size_t rebuilt = !policy.any() ? 0 : (policy.whole ? whole_acts : some_acts) + norm_rstd;
  s.backward = rebuilt + grads + norm_bwd;
  s.backward_after_recompute = grads + norm_bwd;
  return s;
}

bool MlaAttention::backward_reads_input() const {
  return kv_down_.backward_reads_input() || policy_.whole || (policy_.up_proj && r_q_ == 0);
}

size_t MlaAttention::kept_bytes() const {
  return static_cast<size_t>(plan_.counted_bytes(MemCategory::activations, Lifetime::construction));
}

size_t MlaAttention::kept_norm_bytes() const {
  int64_t sum = plan_.at("n_kv").counted_bytes() + plan_.at("kv_norm rstd").counted_bytes();
  if (r_q_ > 0) sum += plan_.at("n_q").counted_bytes() + plan_.at("q_norm rstd").counted_bytes();
  return static_cast<size_t>(sum);
}

void MlaAttention::check_tokens(const char* what, int64_t M) const {
  FP4MOE_CHECK(M >= 0 && M <= max_tokens_ && M % T_ == 0,
               "MlaAttention {} {}: M must be a multiple of seq_len={} in [0, {}] (max_tokens), got M={}", prefix_,
               what, T_, max_tokens_, M);
}

void MlaAttention::forward(ModelContext& ctx, const bf16* x, int64_t M, bf16* y) {
  check_tokens("forward", M);
  last_M_.get() = M;
  acts_stamp_ = 0;
  if (M == 0) return;
  FP4MOE_CHECK(x && y, "MlaAttention {} forward: x and y [M, {}] must not be null", prefix_, d_);
  ScratchArena& arena = scratch_of(ctx, "MlaAttention " + prefix_);
  ScratchScope scope(arena);
  ProfileScope profile(ctx, ProfileModule::mla_other, ProfilePass::forward);
  acts_ = bind_acts(arena, M, true);
  run_forward(ctx, x, M, acts_, false);
  out_.forward(ctx, acts_.o, M, y);                        // y [M, d]
}

void MlaAttention::recompute_forward(ModelContext& ctx, const bf16* x, int64_t M, bf16* y) {
  check_tokens("recompute_forward", M);
  last_M_.get() = M;
  acts_stamp_ = 0;
  if (M == 0) return;
  FP4MOE_CHECK(x != nullptr, "MlaAttention {} recompute_forward: x [M, {}] must not be null", prefix_, d_);
  ScratchArena& arena = scratch_of(ctx, "MlaAttention " + prefix_);
  ProfileScope profile(ctx, ProfileModule::mla_other, ProfilePass::recompute);
  acts_ = bind_acts(arena, M, true);  // in the caller's scope
  run_forward(ctx, x, M, acts_, true);
  acts_stamp_ = arena.stamp();
  if (y) out_.forward(ctx, acts_.o, M, y);
}

void MlaAttention::run_forward(ModelContext& ctx, const bf16* x, int64_t M, const Acts& t, bool for_backward) {
  cudaStream_t st = ctx.stream;
  const RopeConfig rope_cfg{rope_theta_, 0, T_};
  const int64_t w_kvd = r_kv_ + rope_;
  auto norm = [&](RmsNorm& n, const bf16* in, bf16* out) {
    if (for_backward) n.recompute(ctx, in, M, out);
    else n.forward(ctx, in, M, out);
  };

  // q [M, H, dqk]: q_up(q_norm(q_down(x))), or q_proj(x); then RoPE on each head's rope part, in place.
  if (r_q_ > 0) {
    q_down_->forward(ctx, x, M, t.c_q);                    // c_q [M, r_q]
    norm(*q_norm_, t.c_q, t.n_q);                           // n_q [M, r_q]
    q_up_.forward(ctx, t.n_q, M, t.q);                     // q [M, H * dqk]
  } else {
    q_up_.forward(ctx, x, M, t.q);                         // q [M, H * dqk]
  }
  rope_forward(RopeTensor{t.q + nope_, H_ * dqk_, dqk_}, M, H_, rope_, rope_cfg,
               RopeTensorOut{t.q + nope_, H_ * dqk_, dqk_}, st);

  // kv: the latent c_kv and the RoPE key k_pe out of one down-projection.
  kv_down_.forward(ctx, x, M, t.kvd);                      // kvd [M, r_kv + rope]
  rope_forward(RopeTensor{t.kvd + r_kv_, w_kvd, rope_}, M, 1, rope_, rope_cfg, RopeTensorOut{t.k_pe, rope_, rope_},
               st);                                        // k_pe [M, rope]
  CUDA_CHECK(cudaMemcpy2DAsync(t.c_kv, r_kv_ * sizeof(bf16), t.kvd, w_kvd * sizeof(bf16), r_kv_ * sizeof(bf16), M,
                               cudaMemcpyDeviceToDevice, st));  // c_kv [M, r_kv]
  norm(kv_norm_, t.c_kv, t.n_kv);                           // n_kv [M, r_kv]
  kv_up_.forward(ctx, t.n_kv, M, t.kv);                    // kv [M, H, nope + dv]
  mla_assemble_k(t.kv, t.k_pe, rope_, M, MlaDims{H_, nope_, rope_, dv_}, t.k, st);  // k [M, H, dqk]

  core_forward(ctx, M, t);                                 // o [M, H, dv], lse [B, H, T]
}

}  // namespace fp4moe
