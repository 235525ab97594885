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
                                  int64_t max_tokens, DeviceMemory& mem) {
  if (!present) return std::nullopt;
  return RmsNorm(store, name, C, eps, max_tokens, mem);
}

template <typename T>
DeviceArray<T> buffer(DeviceMemory& mem, int64_t n, MemCategory cat, const std::string& what) {
  return DeviceArray<T>(mem, n, cat, what);
}

}  // namespace

MlaAttention::MlaAttention(ParamStore& store, const std::string& prefix, const ModelConfig& cfg, Recipe recipe,
                           int64_t seq_len, int64_t max_tokens, DeviceMemory& mem)
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
      q_down_(maybe_linear(r_q_ > 0, store, prefix + ".q_down", d_, r_q_, recipe)),
      q_norm_(maybe_norm(r_q_ > 0, store, prefix + ".q_norm", r_q_, static_cast<float>(cfg.norm_eps), max_tokens, mem)),
      q_up_(store, prefix + (r_q_ > 0 ? ".q_up" : ".q_proj"), r_q_ > 0 ? r_q_ : d_, H_ * dqk_, recipe, kInitStd),
      kv_down_(store, prefix + ".kv_down", d_, r_kv_ + rope_, recipe, kInitStd),
      kv_norm_(store, prefix + ".kv_norm", r_kv_, static_cast<float>(cfg.norm_eps), max_tokens, mem),
      kv_up_(store, prefix + ".kv_up", r_kv_, H_ * (nope_ + dv_), recipe, kInitStd),
      out_(store, prefix + ".out", H_ * dv_, d_, recipe,
           static_cast<float>(0.02 / std::sqrt(2.0 * static_cast<double>(cfg.layers)))) {
  const int64_t n = max_tokens;
  const MemCategory act = MemCategory::activations, ws = MemCategory::workspace;
  c_q_ = buffer<bf16>(mem, n * r_q_, act, prefix + " c_q");
  n_q_ = buffer<bf16>(mem, n * r_q_, act, prefix + " q_norm output");
  q_ = buffer<bf16>(mem, n * H_ * dqk_, act, prefix + " q");
  c_kv_ = buffer<bf16>(mem, n * r_kv_, act, prefix + " c_kv");
  n_kv_ = buffer<bf16>(mem, n * r_kv_, act, prefix + " kv_norm output");
  kv_ = buffer<bf16>(mem, n * H_ * (nope_ + dv_), act, prefix + " kv_up output");
  k_ = buffer<bf16>(mem, n * H_ * dqk_, act, prefix + " k");
  o_ = buffer<bf16>(mem, n * H_ * dv_, act, prefix + " attention output");
  lse_ = buffer<float>(mem, n * H_, act, prefix + " attention lse");
  kvd_ = buffer<bf16>(mem, n * (r_kv_ + rope_), ws, prefix + " kv_down output / grad");
  k_pe_ = buffer<bf16>(mem, n * rope_, ws, prefix + " k_pe");
  d_o_ = buffer<bf16>(mem, n * H_ * dv_, ws, prefix + " d o");
  d_q_ = buffer<bf16>(mem, n * H_ * dqk_, ws, prefix + " d q");
  d_k_ = buffer<bf16>(mem, n * H_ * dqk_, ws, prefix + " d k");
  d_kv_ = buffer<bf16>(mem, n * H_ * (nope_ + dv_), ws, prefix + " d kv");
  d_lat_ = buffer<bf16>(mem, n * std::max(r_q_, r_kv_), ws, prefix + " d latent");
  dx32_ = buffer<float>(mem, n * d_, ws, prefix + " dx (FP32)");
  const AttentionShape max_shape{n / T_, T_, H_, dqk_, dv_, scale_};
  attn_ws_ = buffer<unsigned char>(mem, flash_attention_backward_workspace_bytes(max_shape), ws,
                                   prefix + " attention backward workspace");
}

void MlaAttention::check_tokens(const char* what, int64_t M) const {
  FP4MOE_CHECK(M >= 0 && M <= max_tokens_ && M % T_ == 0,
               "MlaAttention {} {}: M must be a multiple of seq_len={} in [0, {}] (max_tokens), got M={}", prefix_,
               what, T_, max_tokens_, M);
}

void MlaAttention::forward(ModelContext& ctx, const bf16* x, int64_t M, bf16* y) {
  check_tokens("forward", M);
  last_M_ = M;
  if (M == 0) return;
  FP4MOE_CHECK(x && y, "MlaAttention {} forward: x and y [M, {}] must not be null", prefix_, d_);
  cudaStream_t st = ctx.stream;
  const RopeConfig rope_cfg{rope_theta_, 0, T_};
  const int64_t w_kvd = r_kv_ + rope_, w_kv = nope_ + dv_;

  // q [M, H, dqk]: q_up(q_norm(q_down(x))), or q_proj(x); then RoPE on each head's rope part, in place.
  if (r_q_ > 0) {
    q_down_->forward(ctx, x, M, c_q_.data());              // c_q [M, r_q]
    q_norm_->forward(ctx, c_q_.data(), M, n_q_.data());    // n_q [M, r_q]
    q_up_.forward(ctx, n_q_.data(), M, q_.data());         // q [M, H * dqk]
  } else {
    q_up_.forward(ctx, x, M, q_.data());                   // q [M, H * dqk]
  }
  rope_forward(RopeTensor{q_.data() + nope_, H_ * dqk_, dqk_}, M, H_, rope_, rope_cfg,
               RopeTensorOut{q_.data() + nope_, H_ * dqk_, dqk_}, st);

  // kv: the latent c_kv and the RoPE key k_pe out of one down-projection.
  kv_down_.forward(ctx, x, M, kvd_.data());                // kvd [M, r_kv + rope]
  rope_forward(RopeTensor{kvd_.data() + r_kv_, w_kvd, rope_}, M, 1, rope_, rope_cfg,
               RopeTensorOut{k_pe_.data(), rope_, rope_}, st);  // k_pe [M, rope]
  CUDA_CHECK(cudaMemcpy2DAsync(c_kv_.data(), r_kv_ * sizeof(bf16), kvd_.data(), w_kvd * sizeof(bf16),
                               r_kv_ * sizeof(bf16), M, cudaMemcpyDeviceToDevice, st));  // c_kv [M, r_kv]
  kv_norm_.forward(ctx, c_kv_.data(), M, n_kv_.data());   // n_kv [M, r_kv]
  kv_up_.forward(ctx, n_kv_.data(), M, kv_.data());        // kv [M, H, nope + dv]
  mla_assemble_k(kv_.data(), k_pe_.data(), rope_, M, MlaDims{H_, nope_, rope_, dv_}, k_.data(), st);  // k [M, H, dqk]

  const AttentionShape shape{M / T_, T_, H_, dqk_, dv_, scale_};
  flash_attention_forward(shape, AttnIn{q_.data(), H_ * dqk_, dqk_}, AttnIn{k_.data(), H_ * dqk_, dqk_},
                          AttnIn{kv_.data() + nope_, H_ * w_kv, w_kv}, AttnOut{o_.data(), H_ * dv_, dv_}, lse_.data(),
                          st);                             // o [M, H, dv], lse [B, H, T]
  out_.forward(ctx, o_.data(), M, y);                      // y [M, d]
}

void MlaAttention::backward(ModelContext& ctx, const bf16* dy, const bf16* x, int64_t M, bf16* dx) {
  FP4MOE_CHECK(M == last_M_, "MlaAttention {} backward: expected the last forward's M={}, got M={}", prefix_, last_M_,
               M);
  if (M == 0) return;
  FP4MOE_CHECK(dy && x && dx, "MlaAttention {} backward: dy, x and dx [M, {}] must not be null", prefix_, d_);
  cudaStream_t st = ctx.stream;
  const RopeConfig rope_cfg{rope_theta_, 0, T_};
  const int64_t w_kvd = r_kv_ + rope_, w_kv = nope_ + dv_;
  const MlaDims dims{H_, nope_, rope_, dv_};

  out_.backward(ctx, dy, o_.data(), M, LinearGradOut{d_o_.data(), false, false});  // d o [M, H * dv]
  const AttentionShape shape{M / T_, T_, H_, dqk_, dv_, scale_};
  flash_attention_backward(shape, AttnIn{q_.data(), H_ * dqk_, dqk_}, AttnIn{k_.data(), H_ * dqk_, dqk_},
                           AttnIn{kv_.data() + nope_, H_ * w_kv, w_kv}, AttnIn{o_.data(), H_ * dv_, dv_},
                           AttnIn{d_o_.data(), H_ * dv_, dv_}, lse_.data(), AttnOut{d_q_.data(), H_ * dqk_, dqk_},
                           AttnOut{d_k_.data(), H_ * dqk_, dqk_}, AttnOut{d_kv_.data() + nope_, H_ * w_kv, w_kv},
                           attn_ws_.data(), st);  // d q, d k [M, H, dqk]; d v into d kv's v parts

  // kv path. kvd_ now holds d kvd [M, r_kv + rope]: d k_pe (head sum, then inverse RoPE) in its last rope columns,
  // d c_kv in its first r_kv columns.
  mla_split_dk(d_k_.data(), M, dims, d_kv_.data(), kvd_.data() + r_kv_, w_kvd, st);  // d k_nope -> d kv, d k_pe
  rope_backward(RopeTensor{kvd_.data() + r_kv_, w_kvd, rope_}, M, 1, rope_, rope_cfg,
                RopeTensorOut{kvd_.data() + r_kv_, w_kvd, rope_}, st);
  kv_up_.backward(ctx, d_kv_.data(), n_kv_.data(), M, LinearGradOut{d_lat_.data(), false, false});  // d n_kv
  kv_norm_.backward(ctx, d_lat_.data(), c_kv_.data(), M, d_lat_.data());                             // d c_kv
  CUDA_CHECK(cudaMemcpy2DAsync(kvd_.data(), w_kvd * sizeof(bf16), d_lat_.data(), r_kv_ * sizeof(bf16),
                               r_kv_ * sizeof(bf16), M, cudaMemcpyDeviceToDevice, st));
  kv_down_.backward(ctx, kvd_.data(), x, M, LinearGradOut{dx32_.data(), true, false});  // dx32 = d x (kv path)

  // q path: inverse RoPE on d q's rope parts, in place, then back through q_up, q_norm, q_down (or q_proj).
  rope_backward(RopeTensor{d_q_.data() + nope_, H_ * dqk_, dqk_}, M, H_, rope_, rope_cfg,
                RopeTensorOut{d_q_.data() + nope_, H_ * dqk_, dqk_}, st);
  if (r_q_ > 0) {
    q_up_.backward(ctx, d_q_.data(), n_q_.data(), M, LinearGradOut{d_lat_.data(), false, false});  // d n_q
    q_norm_->backward(ctx, d_lat_.data(), c_q_.data(), M, d_lat_.data());                          // d c_q
    q_down_->backward(ctx, d_lat_.data(), x, M, LinearGradOut{dx32_.data(), true, true});          // dx32 +=
  } else {
    q_up_.backward(ctx, d_q_.data(), x, M, LinearGradOut{dx32_.data(), true, true});               // dx32 +=
  }
  cast_f32_to_bf16(dx32_.data(), M * d_, dx, st);
}

}  // namespace fp4moe
