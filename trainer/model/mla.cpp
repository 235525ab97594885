#include "trainer/model/mla.h"

#include <algorithm>
#include <cmath>

#include "kernels/attention/attention_checks.h"
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

// A kept buffer of n elements (activations), or an empty one when the policy does not keep it.
template <typename T>
DeviceArray<T> kept(bool keep, DeviceMemory& mem, int64_t n, const std::string& what) {
  return keep ? DeviceArray<T>(mem, n, MemCategory::activations, what) : DeviceArray<T>();
}

// The kept buffer, or n elements of the scratch.
template <typename T>
T* pick(const DeviceArray<T>& kept_buffer, bool keep, ScratchArena& arena, int64_t n, const char* what) {
  return keep ? kept_buffer.data() : arena.take<T>(n, what);
}

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
      scale_(static_cast<float>(1.0 / std::sqrt(static_cast<double>(dqk_)))),
      policy_(recompute),
      q_down_(maybe_linear(r_q_ > 0, store, prefix + ".q_down", d_, r_q_, recipe)),
      q_norm_(maybe_norm(r_q_ > 0, store, prefix + ".q_norm", r_q_, static_cast<float>(cfg.norm_eps), max_tokens, mem,
                         !norms_recomputed(recompute))),
      q_up_(store, prefix + (r_q_ > 0 ? ".q_up" : ".q_proj"), r_q_ > 0 ? r_q_ : d_, H_ * dqk_, recipe, kInitStd),
      kv_down_(store, prefix + ".kv_down", d_, r_kv_ + rope_, recipe, kInitStd),
      kv_norm_(store, prefix + ".kv_norm", r_kv_, static_cast<float>(cfg.norm_eps), max_tokens, mem,
               !norms_recomputed(recompute)),
      kv_up_(store, prefix + ".kv_up", r_kv_, H_ * (nope_ + dv_), recipe, kInitStd),
      out_(store, prefix + ".out", H_ * dv_, d_, recipe,
           static_cast<float>(0.02 / std::sqrt(2.0 * static_cast<double>(cfg.layers)))) {
  const int64_t n = max_tokens;
  const MlaRecompute& p = policy_;
  c_q_ = kept<bf16>(!p.whole, mem, n * r_q_, prefix + " c_q");
  // n_q and n_kv serve backward as q_up's and kv_up's input (bf16 Linears only: fp8/mxfp4 keep their own copy) and
  // as the source of a q or kv recompute (mla_up_proj).
  keep_n_q_ = !p.whole && !p.norms && (q_up_.backward_reads_input() || p.up_proj);
  keep_n_kv_ = !p.whole && !p.norms && (kv_up_.backward_reads_input() || p.up_proj);
  n_q_ = kept<bf16>(keep_n_q_, mem, n * r_q_, prefix + " q_norm output");
  q_ = kept<bf16>(!p.whole && !p.up_proj, mem, n * H_ * dqk_, prefix + " q");
  c_kv_ = kept<bf16>(!p.whole, mem, n * r_kv_, prefix + " c_kv");
  n_kv_ = kept<bf16>(keep_n_kv_, mem, n * r_kv_, prefix + " kv_norm output");
  kv_ = kept<bf16>(!p.whole && !p.up_proj, mem, n * H_ * (nope_ + dv_), prefix + " kv_up output");
  k_ = kept<bf16>(!p.whole && !p.up_proj, mem, n * H_ * dqk_, prefix + " k");
  k_pe_ = kept<bf16>(!p.whole && p.up_proj, mem, n * rope_, prefix + " k_pe");
  o_ = kept<bf16>(!p.whole && !p.core_attn, mem, n * H_ * dv_, prefix + " attention output");
  lse_ = kept<float>(!p.whole && !p.core_attn, mem, n * H_, prefix + " attention lse");
  plan_scratch();
}

MlaAttention::Acts MlaAttention::bind_acts(ScratchArena& a, int64_t M, bool forward_only) {
  const MlaRecompute& p = policy_;
  Acts t;
  t.c_q = pick(c_q_, !p.whole, a, M * r_q_, "MLA c_q");
  // n_q / n_kv not kept: forward needs them; a backward only to rebuild the norms' rstd (layernorm).
  const bool rebuild_n = forward_only || p.norms;
  t.n_q = keep_n_q_ ? n_q_.data() : rebuild_n ? a.take<bf16>(M * r_q_, "MLA n_q") : nullptr;
  t.q = pick(q_, !p.whole && !p.up_proj, a, M * H_ * dqk_, "MLA q");
  t.c_kv = pick(c_kv_, !p.whole, a, M * r_kv_, "MLA c_kv");
  t.n_kv = keep_n_kv_ ? n_kv_.data() : rebuild_n ? a.take<bf16>(M * r_kv_, "MLA n_kv") : nullptr;
  t.kv = pick(kv_, !p.whole && !p.up_proj, a, M * H_ * (nope_ + dv_), "MLA kv");
  t.k = pick(k_, !p.whole && !p.up_proj, a, M * H_ * dqk_, "MLA k");
  t.o = pick(o_, !p.whole && !p.core_attn, a, M * H_ * dv_, "MLA o");
  t.lse = pick(lse_, !p.whole && !p.core_attn, a, M * H_, "MLA lse");
  const bool keep_k_pe = !p.whole && p.up_proj;
  t.k_pe = keep_k_pe ? k_pe_.data() : forward_only ? a.take<bf16>(M * rope_, "MLA k_pe") : nullptr;
  t.kvd = forward_only ? a.take<bf16>(M * (r_kv_ + rope_), "MLA kv_down output") : nullptr;
  return t;
}

MlaAttention::Grads MlaAttention::bind_grads(ScratchArena& a, int64_t M) {
  Grads g;
  g.d_o = a.take<bf16>(M * H_ * dv_, "MLA d o");
  g.d_q = a.take<bf16>(M * H_ * dqk_, "MLA d q");
  g.d_k = a.take<bf16>(M * H_ * dqk_, "MLA d k");
  g.d_kv = a.take<bf16>(M * H_ * (nope_ + dv_), "MLA d kv");
  g.d_kvd = a.take<bf16>(M * (r_kv_ + rope_), "MLA d kvd");
  g.d_lat = a.take<bf16>(M * std::max(r_q_, r_kv_), "MLA d latent");
  g.dx32 = a.take<float>(M * d_, "MLA dx (FP32)");
  const AttentionShape shape{M / T_, T_, H_, dqk_, dv_, scale_};
  g.attn_ws = a.take<unsigned char>(M > 0 ? flash_attention_backward_workspace_bytes(shape) : 0,
                                    "MLA attention backward workspace");
  return g;
}

// The same binding code as the passes, on a measuring arena, for M = max_tokens.
void MlaAttention::plan_scratch() {
  ScratchArena m;
  const int64_t M = max_tokens_;
  auto measure = [&](auto&& bind) {
    const ScratchArena::Mark start = m.mark();
    bind();
    const size_t bytes = m.used() - start.used;
    m.release(start);
    return bytes;
  };
  const size_t whole_acts = measure([&] { bind_acts(m, M, true); });
  const size_t some_acts = measure([&] { bind_acts(m, M, false); });
  const size_t grads = measure([&] { bind_grads(m, M); });
  const size_t norm_rstd = (q_norm_ ? q_norm_->recompute_bytes() : 0) + kv_norm_.recompute_bytes();
  const size_t norm_bwd = std::max(q_norm_ ? q_norm_->backward_bytes() : 0, kv_norm_.backward_bytes());
  fwd_bytes_ = whole_acts;
  recompute_bytes_ = whole_acts + norm_rstd;
  const size_t rebuilt = !policy_.any() ? 0 : (policy_.whole ? whole_acts : some_acts) + norm_rstd;
  bwd_bytes_ = rebuilt + grads + norm_bwd;
  bwd_ready_bytes_ = grads + norm_bwd;
}

bool MlaAttention::backward_reads_input() const {
  return kv_down_.backward_reads_input() || policy_.whole || (policy_.up_proj && r_q_ == 0);
}

size_t MlaAttention::scratch_bytes() const {
  return std::max({fwd_bytes_, recompute_bytes_ + bwd_ready_bytes_, bwd_bytes_});
}

size_t MlaAttention::kept_bytes() const {
  return counted_bytes(c_q_) + counted_bytes(q_) + counted_bytes(c_kv_) + counted_bytes(kv_) + counted_bytes(k_) +
         counted_bytes(k_pe_) + counted_bytes(o_) + counted_bytes(lse_) + kept_norm_bytes();
}

size_t MlaAttention::kept_norm_bytes() const {
  return counted_bytes(n_q_) + counted_bytes(n_kv_) + (q_norm_ ? q_norm_->kept_bytes() : 0) + kv_norm_.kept_bytes();
}

void MlaAttention::check_tokens(const char* what, int64_t M) const {
  FP4MOE_CHECK(M >= 0 && M <= max_tokens_ && M % T_ == 0,
               "MlaAttention {} {}: M must be a multiple of seq_len={} in [0, {}] (max_tokens), got M={}", prefix_,
               what, T_, max_tokens_, M);
}

void MlaAttention::forward(ModelContext& ctx, const bf16* x, int64_t M, bf16* y) {
  check_tokens("forward", M);
  last_M_ = M;
  acts_stamp_ = 0;
  if (M == 0) return;
  FP4MOE_CHECK(x && y, "MlaAttention {} forward: x and y [M, {}] must not be null", prefix_, d_);
  ScratchArena& arena = scratch_of(ctx, "MlaAttention " + prefix_);
  ScratchScope scope(arena);
  acts_ = bind_acts(arena, M, true);
  run_forward(ctx, x, M, acts_, false);
  out_.forward(ctx, acts_.o, M, y);                        // y [M, d]
}

void MlaAttention::recompute_forward(ModelContext& ctx, const bf16* x, int64_t M, bf16* y) {
  check_tokens("recompute_forward", M);
  last_M_ = M;
  acts_stamp_ = 0;
  if (M == 0) return;
  FP4MOE_CHECK(x != nullptr, "MlaAttention {} recompute_forward: x [M, {}] must not be null", prefix_, d_);
  ScratchArena& arena = scratch_of(ctx, "MlaAttention " + prefix_);
  acts_ = bind_acts(arena, M, true);  // in the caller's scope
  run_forward(ctx, x, M, acts_, true);
  acts_stamp_ = arena.stamp();
  if (y) out_.forward(ctx, acts_.o, M, y);
}

void MlaAttention::run_forward(ModelContext& ctx, const bf16* x, int64_t M, const Acts& t, bool for_backward) {
  cudaStream_t st = ctx.stream;
  const RopeConfig rope_cfg{rope_theta_, 0, T_};
  const int64_t w_kvd = r_kv_ + rope_, w_kv = nope_ + dv_;
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

  const AttentionShape shape{M / T_, T_, H_, dqk_, dv_, scale_};
  flash_attention_forward(shape, AttnIn{t.q, H_ * dqk_, dqk_}, AttnIn{t.k, H_ * dqk_, dqk_},
                          AttnIn{t.kv + nope_, H_ * w_kv, w_kv}, AttnOut{t.o, H_ * dv_, dv_}, t.lse,
                          st);                             // o [M, H, dv], lse [B, H, T]
}

}  // namespace fp4moe
