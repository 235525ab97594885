// Multi-head latent attention (DeepSeek-V2 sec. 2.1, DeepSeek-V3 sec. 2.1.1) as trained: keys and values are
// materialised per head (the weight absorption of inference is not used). DESIGN.md "Trainer".
//
// With d = hidden, H = heads, nope/rope = qk_nope/qk_rope_head_dim, dqk = nope + rope, dv = v_head_dim,
// r_q = q_lora_rank, r_kv = kv_lora_rank, M = B * T tokens (row b*T + t):
//
//   q path   c_q  [M, r_q]         = x W_qd^T                  "<prefix>.q_down"  [r_q, d]
//            n_q  [M, r_q]         = RMSNorm(c_q)              "<prefix>.q_norm"  [r_q]
//            q    [M, H, dqk]      = n_q W_qu^T                "<prefix>.q_up"    [H * dqk, r_q]
//            (r_q = 0: q = x W_q^T, one Linear                 "<prefix>.q_proj"  [H * dqk, d], as DeepSeek's q_proj)
//            q[:, h, nope:] = RoPE(q[:, h, nope:])             (kernels/nn/rope.h, interleaved pairs, positions
//                                                               0..T-1 in every row of T tokens, rope_theta)
//   kv path  kvd  [M, r_kv + rope] = x W_kvd^T                 "<prefix>.kv_down" [r_kv + rope, d]
//            c_kv [M, r_kv]        = kvd[:, :r_kv]             (the latent)
//            k_pe [M, rope]        = RoPE(kvd[:, r_kv:])       (the decoupled RoPE key, one head shared by all)
//            n_kv [M, r_kv]        = RMSNorm(c_kv)             "<prefix>.kv_norm" [r_kv]
//            kv   [M, H, nope + dv] = n_kv W_kvu^T             "<prefix>.kv_up"   [H * (nope + dv), r_kv]
//                                                              (per head: k_nope | v)
//            k    [M, H, dqk]      = [k_nope_h | k_pe]         (kernels/nn/mla_ops.h)
//   core     o    [M, H, dv]       = causal softmax(q k^T / sqrt(dqk)) v  per row of T tokens
//                                                              (kernels/attention/flash_attention.h)
//   out      y    [M, d]           = o W_o^T                   "<prefix>.out"     [d, H * dv]
//
// Backward runs the same graph in reverse: dk_pe = sum over heads of dk's rope part (fixed head order,
// mla_split_dk) then the inverse RoPE; dk's nope parts and the attention's dv fill d kv; the Dgrads of q_down
// (or q_proj) and kv_down both flow into dx, summed in FP32 (Linear's FP32 accumulate) and cast once to BF16.
// Every parameter grad accumulates (+=, FP32).
//
// Init (model.cpp documents the whole model's): q_down, q_up, q_proj, kv_down, kv_up N(0, 0.02^2); out N(0,
// (0.02 / sqrt(2 * layers))^2) (it writes into the residual stream); norm weights ones (no decay).
// Recipe: the five projections take `recipe` (Linear: bf16 only for now); norms, RoPE and the core stay BF16/FP32.
// Recompute policies (mla_up_proj, core_attn) are not applied: every activation below is kept.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "kernels/common/types.h"
#include "trainer/config.h"
#include "trainer/memory.h"
#include "trainer/model/context.h"
#include "trainer/model/linear.h"
#include "trainer/model/params.h"
#include "trainer/model/rms_norm.h"

namespace fp4moe {

class MlaAttention {
 public:
  // Shapes from `cfg`; seq_len = T tokens per row (RoPE positions and causality restart every T rows);
  // max_tokens = the largest M, a multiple of seq_len. Rejects (fp4moe::Error) nope, rope or dv not multiples of
  // 8 (16-byte rows and strides for the attention kernels), (dqk, dv) pairs the attention kernels lack
  // (kernels/attention/flash_attention.h), ranks and widths Linear rejects, rope above the RoPE kernel's limit.
  MlaAttention(ParamStore& store, const std::string& prefix, const ModelConfig& cfg, Recipe recipe, int64_t seq_len,
               int64_t max_tokens, DeviceMemory& mem);

  // x [M, d] BF16 -> y [M, d] BF16 (overwritten; must not overlap x). M a multiple of seq_len in [0, max_tokens];
  // M = 0 does nothing. Keeps what backward needs; x is not copied (backward takes the same pointer).
  void forward(ModelContext& ctx, const bf16* x, int64_t M, bf16* y);
  // dy [M, d], x as in forward -> dx [M, d] BF16 (overwritten; must not overlap dy or x); every parameter grad +=.
  // M must equal the last forward's.
  void backward(ModelContext& ctx, const bf16* dy, const bf16* x, int64_t M, bf16* dx);

  int64_t hidden() const { return d_; }

 private:
  void check_tokens(const char* what, int64_t M) const;

  std::string prefix_;
  int64_t d_, H_, nope_, rope_, dqk_, dv_, r_q_, r_kv_, T_, max_tokens_;
  float rope_theta_, scale_;
  // Parameters (registration order = checkpoint order): q_down, q_norm, q_up (or q_proj), kv_down, kv_norm, kv_up,
  // out.
  std::optional<Linear> q_down_;    // d -> r_q            (absent when r_q = 0)
  std::optional<RmsNorm> q_norm_;   // [r_q]               (absent when r_q = 0)
  Linear q_up_;                     // r_q -> H * dqk      (q_proj: d -> H * dqk when r_q = 0)
  Linear kv_down_;                  // d -> r_kv + rope
  RmsNorm kv_norm_;                 // [r_kv]
  Linear kv_up_;                    // r_kv -> H * (nope + dv)
  Linear out_;                      // H * dv -> d
  int64_t last_M_ = -1;

  // Kept from forward for backward (MemCategory::activations), max_tokens rows each:
  DeviceArray<bf16> c_q_;    // [max_tokens, r_q]          q_down output, q_norm input (empty when r_q = 0)
  DeviceArray<bf16> n_q_;    // [max_tokens, r_q]          q_norm output, q_up input   (empty when r_q = 0)
  DeviceArray<bf16> q_;      // [max_tokens, H, dqk]       queries, rope part rotated
  DeviceArray<bf16> c_kv_;   // [max_tokens, r_kv]         latent, kv_norm input
  DeviceArray<bf16> n_kv_;   // [max_tokens, r_kv]         kv_norm output, kv_up input
  DeviceArray<bf16> kv_;     // [max_tokens, H, nope + dv] kv_up output: k_nope | v per head
  DeviceArray<bf16> k_;      // [max_tokens, H, dqk]       keys [k_nope_h | k_pe]
  DeviceArray<bf16> o_;      // [max_tokens, H, dv]        attention output, out's input
  DeviceArray<float> lse_;   // [B_max, H, T]              log-sum-exp of the attention rows
  // Scratch (MemCategory::workspace):
  DeviceArray<bf16> kvd_;    // [max_tokens, r_kv + rope]  kv_down output (forward); its gradient (backward)
  DeviceArray<bf16> k_pe_;   // [max_tokens, rope]         rotated RoPE key (forward)
  DeviceArray<bf16> d_o_;    // [max_tokens, H, dv]        d o
  DeviceArray<bf16> d_q_;    // [max_tokens, H, dqk]       d q
  DeviceArray<bf16> d_k_;    // [max_tokens, H, dqk]       d k
  DeviceArray<bf16> d_kv_;   // [max_tokens, H, nope + dv] d kv (k_nope from d k, v from the attention)
  DeviceArray<bf16> d_lat_;  // [max_tokens, max(r_q, r_kv)] d n_kv then d c_kv; d n_q then d c_q
  DeviceArray<float> dx32_;  // [max_tokens, d]            FP32 sum of the two Dgrads into dx
  DeviceArray<unsigned char> attn_ws_;  // flash_attention_backward_workspace_bytes(B_max, T, ...) bytes
};

}  // namespace fp4moe
