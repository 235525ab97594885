// MlaAttention's backward (mla.h): the tensors the recompute policy did not keep are rebuilt in the scratch first,
// then the graph runs in reverse.
#include <algorithm>

#include "kernels/attention/attention_core.h"
#include "kernels/attention/flash_attention.h"
#include "kernels/common/check.h"
#include "kernels/nn/elementwise.h"
#include "kernels/nn/mla_ops.h"
#include "kernels/nn/rope.h"
#include "trainer/model/mla.h"

namespace fp4moe {

void MlaAttention::backward(ModelContext& ctx, const bf16* dy, const bf16* x, int64_t M, bf16* dx) {
  FP4MOE_CHECK(M == last_M_.get(), "MlaAttention {} backward: expected the last forward's M={}, got M={}", prefix_,
               last_M_.get(), M);
  if (M == 0) return;
  FP4MOE_CHECK(dy && dx && (x || !backward_reads_input()),
               "MlaAttention {} backward: dy, dx [M, {}] and x (read by this recipe and policy) must not be null",
               prefix_, d_);
  ScratchArena& arena = scratch_of(ctx, "MlaAttention " + prefix_);
  ScratchScope scope(arena);
  ProfileScope profile(ctx, ProfileModule::mla_other, ProfilePass::backward);
  if (!arena.alive(acts_stamp_)) {  // no recompute_forward left them in a scope still open
    ProfileScope rerun(ctx, ProfileModule::inherit, policy_.any() ? ProfilePass::recompute : ProfilePass::inherit);
    if (policy_.whole) {
      acts_ = bind_acts(arena, M, true);
      run_forward(ctx, x, M, acts_, true);
    } else if (policy_.any()) {
      acts_ = bind_acts(arena, M, false);
      recompute_parts(ctx, x, M, acts_);
    } else {  // everything backward reads is kept (the active slot's); the forward's scratch is gone
      acts_ = bind_acts(arena, M, false);  // takes nothing: n_q, n_kv unless kept, kvd and k_pe stay null
    }
  }
  acts_stamp_ = 0;
  run_backward(ctx, dy, x, M, acts_, bind_grads(arena, M), dx);
}

void MlaAttention::recompute_parts(ModelContext& ctx, const bf16* x, int64_t M, const Acts& t) {
  cudaStream_t st = ctx.stream;
  if (policy_.norms) {  // n_q, n_kv and the norms' rstd, from the kept c_q, c_kv
    if (r_q_ > 0) q_norm_->recompute(ctx, t.c_q, M, t.n_q);
    kv_norm_.recompute(ctx, t.c_kv, M, t.n_kv);
  }
  if (policy_.up_proj) {  // q, kv, k from the kept n_q (or x), n_kv and k_pe
    const RopeConfig rope_cfg{rope_theta_, 0, T_};
    q_up_.forward(ctx, r_q_ > 0 ? t.n_q : x, M, t.q);
    rope_forward(RopeTensor{t.q + nope_, H_ * dqk_, dqk_}, M, H_, rope_, rope_cfg,
                 RopeTensorOut{t.q + nope_, H_ * dqk_, dqk_}, st);
    kv_up_.forward(ctx, t.n_kv, M, t.kv);
    mla_assemble_k(t.kv, t.k_pe, rope_, M, MlaDims{H_, nope_, rope_, dv_}, t.k, st);
  }
  if (policy_.core_attn) core_forward(ctx, M, t);  // o and lse: the attention forward again
}

void MlaAttention::core_backward(ModelContext& ctx, int64_t M, const Acts& t, const Grads& g) {
  const AttentionShape s = core_shape(model_, M, H_, T_);
  const SdpaLayout& l = core_layout_;
  const AttnIn q = attn_in(t.q, l.q), k = attn_in(t.k, l.k), v = attn_in(t.kv + nope_, l.v), o = attn_in(t.o, l.o);
  const AttnIn dout = attn_in(g.d_o, l.dout);
  const AttnOut dq = attn_out(g.d_q, l.dq), dk = attn_out(g.d_k, l.dk), dv = attn_out(g.d_kv + nope_, l.dv);
  ProfileScope core(ctx, ProfileModule::core_attn);
  if (ctx.attention)
    ctx.attention->backward(s, q, k, v, o, dout, t.lse, dq, dk, dv, g.attn_ws, ctx.stream);
  else
    flash_attention_backward(s, q, k, v, o, dout, t.lse, dq, dk, dv, g.attn_ws, ctx.stream);
}

void MlaAttention::run_backward(ModelContext& ctx, const bf16* dy, const bf16* x, int64_t M, const Acts& t,
                                const Grads& g, bf16* dx) {
  cudaStream_t st = ctx.stream;
  const RopeConfig rope_cfg{rope_theta_, 0, T_};
  const int64_t w_kvd = r_kv_ + rope_;
  const MlaDims dims{H_, nope_, rope_, dv_};

  out_.backward(ctx, dy, t.o, M, LinearGradOut{g.d_o, false, false});  // d o [M, H * dv]
  core_backward(ctx, M, t, g);  // d q, d k [M, H, dqk]; d v into d kv's v parts

  // kv path. d kvd [M, r_kv + rope]: d k_pe (head sum, then inverse RoPE) in its last rope columns, d c_kv in its
  // first r_kv columns.
  mla_split_dk(g.d_k, M, dims, g.d_kv, g.d_kvd + r_kv_, w_kvd, st);  // d k_nope -> d kv, d k_pe
  rope_backward(RopeTensor{g.d_kvd + r_kv_, w_kvd, rope_}, M, 1, rope_, rope_cfg,
                RopeTensorOut{g.d_kvd + r_kv_, w_kvd, rope_}, st);
  kv_up_.backward(ctx, g.d_kv, t.n_kv, M, LinearGradOut{g.d_lat, false, false});  // d n_kv
  kv_norm_.backward(ctx, g.d_lat, t.c_kv, M, g.d_lat);                             // d c_kv
  CUDA_CHECK(cudaMemcpy2DAsync(g.d_kvd, w_kvd * sizeof(bf16), g.d_lat, r_kv_ * sizeof(bf16), r_kv_ * sizeof(bf16), M,
                               cudaMemcpyDeviceToDevice, st));
  kv_down_.backward(ctx, g.d_kvd, x, M, LinearGradOut{g.dx32, true, false});  // dx32 = d x (kv path)

  // q path: inverse RoPE on d q's rope parts, in place, then back through q_up, q_norm, q_down (or q_proj).
  rope_backward(RopeTensor{g.d_q + nope_, H_ * dqk_, dqk_}, M, H_, rope_, rope_cfg,
                RopeTensorOut{g.d_q + nope_, H_ * dqk_, dqk_}, st);
  if (r_q_ > 0) {
    q_up_.backward(ctx, g.d_q, t.n_q, M, LinearGradOut{g.d_lat, false, false});  // d n_q
    q_norm_->backward(ctx, g.d_lat, t.c_q, M, g.d_lat);                          // d c_q
    q_down_->backward(ctx, g.d_lat, x, M, LinearGradOut{g.dx32, true, true});    // dx32 +=
  } else {
    q_up_.backward(ctx, g.d_q, x, M, LinearGradOut{g.dx32, true, true});         // dx32 +=
  }
  cast_f32_to_bf16(g.dx32, M * d_, dx, st);
}

}  // namespace fp4moe
