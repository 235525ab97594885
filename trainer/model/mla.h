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
//                                                              (kernels/attention/flash_attention.h, or cuDNN's:
//                                                              model.attention_backend, attention_core.h)
//   out      y    [M, d]           = o W_o^T                   "<prefix>.out"     [d, H * dv]
//
// Backward runs the same graph in reverse: dk_pe = sum over heads of dk's rope part (fixed head order,
// mla_split_dk) then the inverse RoPE; dk's nope parts and the attention's dv fill d kv; the Dgrads of q_down
// (or q_proj) and kv_down both flow into dx, summed in FP32 (Linear's FP32 accumulate) and cast once to BF16.
// Every parameter grad accumulates (+=, FP32).
//
// Init (model.cpp documents the whole model's): q_down, q_up, q_proj, kv_down, kv_up N(0, 0.02^2); out N(0,
// (0.02 / sqrt(2 * layers))^2) (it writes into the residual stream); norm weights ones (no decay).
// Recipe: the five projections take `recipe` (Linear); norms, RoPE and the core stay BF16/FP32.
//
// Memory. Kept from forward to backward (MemCategory::activations, max_tokens rows; bytes per token, BF16 = 2):
//   c_q 2 r_q, n_q 2 r_q, q 2 H dqk, c_kv 2 r_kv, n_kv 2 r_kv, kv 2 H (nope + dv), k 2 H dqk, o 2 H dv,
//   lse 4 H, and the rstd of q_norm and kv_norm (4 each; q_norm's only with r_q > 0)
// (n_q and n_kv only with the bf16 recipe, whose q_up and kv_up read their input in backward, or under
// mla_up_proj: fp8/mxfp4 Linears keep their own FP8/MXFP4 copy of it, counted by Linear, linear.h), minus what
// the recompute policy (trainer/model/recompute.h) drops, rebuilt in backward in the shared scratch:
//   mla_up_proj  q, kv, k       (q = q_up(n_q) + RoPE, or q_proj(x); kv = kv_up(n_kv); k = [k_nope | k_pe]);
//                keeps k_pe 2 rope instead (the rotated RoPE key, else forward-only scratch)
//   core_attn    o, lse         (the attention forward reruns)
//   layernorm    n_q, n_kv and the two rstd (q_norm, kv_norm rerun from c_q, c_kv)
//   full         everything (nothing kept; the model reruns the layer's forward with recompute_forward)
// e.g. V3 (H 128, dqk 192, dv 128, r_q 1536, r_kv 512, rope 64): 205,320 bytes per token kept without a policy;
// mla_up_proj drops 163,840 (and keeps 128 of k_pe), core_attn 33,280, layernorm 4,104.
// Scratch (ModelContext::scratch, per call): forward: the tensors not kept, kvd [M, r_kv + rope] and k_pe when not
// kept; backward: the tensors not kept (recomputed), and d o, d q, d k, d kv, d kvd, d latent, dx FP32 [M, d] and the
// attention backward workspace (our kernels'; where the cuDNN backend runs, it works in the model's workspace instead,
// ModelContext::attention). scratch() states the most each call takes; scratch_bytes() the most at max_tokens.
// In-flight micro-batches (trainer/memory/device_memory.h): the kept tensors and the token count have one copy per
// slot; backward binds the active slot's (the pointers a forward bound belong to its slot).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "kernels/attention/cudnn_sdpa.h"
#include "kernels/common/types.h"
#include "trainer/config.h"
#include "trainer/memory/device_memory.h"
#include "trainer/memory/scratch.h"
#include "trainer/model/context.h"
#include "trainer/model/linear.h"
#include "trainer/model/params.h"
#include "trainer/model/recompute.h"
#include "trainer/model/rms_norm.h"

namespace fp4moe {

class MlaAttention {
 public:
  // Shapes from `cfg`; seq_len = T tokens per row (RoPE positions and causality restart every T rows);
  // max_tokens = the largest M, a multiple of seq_len; `recompute`: what backward recomputes (above). Rejects
  // (fp4moe::Error) nope, rope or dv not multiples of 8 (16-byte rows and strides for the attention kernels),
  // (dqk, dv) pairs the attention kernels lack (kernels/attention/flash_attention.h), ranks and widths Linear
  // rejects, rope above the RoPE kernel's limit.
  MlaAttention(ParamStore& store, const std::string& prefix, const ModelConfig& cfg, Recipe recipe, int64_t seq_len,
               int64_t max_tokens, DeviceMemory& mem, MlaRecompute recompute = {});

  // x [M, d] BF16 -> y [M, d] BF16 (overwritten; must not overlap x). M a multiple of seq_len in [0, max_tokens];
  // M = 0 does nothing. Keeps what the policy keeps; x is not copied (backward takes the same pointer).
  void forward(ModelContext& ctx, const bf16* x, int64_t M, bf16* y);
  // The same forward for a backward in the caller's current scratch scope (the `full` policy: the model reruns the
  // layer): the tensors not kept are taken from ctx.scratch and left in the caller's scope (recompute_bytes), so
  // that backward reads them instead of recomputing; y may be null (no output projection).
  void recompute_forward(ModelContext& ctx, const bf16* x, int64_t M, bf16* y);
  // dy [M, d], x as in forward (may be null when !backward_reads_input()) -> dx [M, d] BF16 (overwritten; must not
  // overlap dy or x); every parameter grad +=. M must equal the last forward's. Rebuilds the tensors not kept
  // first, unless a recompute_forward in a scratch scope still open left them.
  void backward(ModelContext& ctx, const bf16* dy, const bf16* x, int64_t M, bf16* dx);

  int64_t hidden() const { return d_; }
  const MlaRecompute& recompute() const { return policy_; }
  // Whether backward reads x: the bf16 recipe's q_down/kv_down (or q_proj) Wgrad, or a recompute from x (full;
  // mla_up_proj with q_proj). With fp8/mxfp4 projections otherwise not: backward then takes x = null, and the
  // caller need not keep it.
  bool backward_reads_input() const;
  // Activation bytes kept from forward to backward (as DeviceMemory counts them), all of them and the part that
  // belongs to the q and kv norms (n_q, n_kv and their rstd).
  size_t kept_bytes() const;
  size_t kept_norm_bytes() const;
  // Every buffer of the layer (trainer/memory/buffer_plan.h; module "mla") for `tokens` rows of attention on
  // `heads` heads (this GPU's share), the down-projections' inputs holding `seq_share` rows (the sequence-parallel
  // share of a tensor-parallel layout; `tokens` on one GPU), under `recipe` and `recompute`: the kept tensors of
  // the Memory paragraph above by name ("c_q", "n_q", "q", "c_kv", "n_kv", "kv", "k", "k_pe", "o", "lse"; c_q and
  // n_q without elements when r_q = 0), the scratch of the passes ("kvd (kv_down output)" in forward; "d o", "d q",
  // "d k", "d kv", "d kvd", "d latent", "dx (FP32)", "attention backward workspace" in backward; rows of seq_len
  // tokens), the norms' RmsNorm::buffers prefixed "q_norm " and "kv_norm ", and the five Linears' Linear::buffers
  // prefixed "q_down ", "q_up " (or "q_proj "), "kv_down ", "kv_up ", "out ". Rejects negative sizes and tokens
  // that are not a multiple of seq_len.
  static BufferPlan buffers(const ModelConfig& cfg, const Recipe& recipe, const MlaRecompute& recompute,
                            int64_t tokens, int64_t seq_share, int64_t heads, int64_t seq_len);
  // The shared scratch of the passes (trainer/memory/scratch.h) for `tokens` rows of attention on `heads` heads
  // under `recipe` and `recompute` (the scratch tensors of buffers(), all of `tokens` rows): forward the tensors not
  // kept, kvd and k_pe; recompute what recompute_forward leaves in the caller's scope (those tensors and the
  // norms' recomputed rstd); backward the tensors it rebuilds (none without a policy), its gradients and the larger
  // norm backward; backward_after_recompute the same without the rebuild. Counted by the passes' binding code on a
  // measuring arena. Rejects what buffers() rejects.
  static PassScratch scratch(const ModelConfig& cfg, const Recipe& recipe, const MlaRecompute& recompute,
                             int64_t tokens, int64_t heads, int64_t seq_len);
  // The attention core of `tokens` rows (B = tokens / seq_len sequences) on `heads` heads: (B, seq_len, heads,
  // dqk, dv, 1/sqrt(dqk)). Rejects what buffers() rejects.
  static AttentionShape core_shape(const ModelConfig& cfg, int64_t tokens, int64_t heads, int64_t seq_len);
  // The strides the layer gives the attention core (kernels/attention/cudnn_sdpa.h): q, k, dq, dk dense
  // [M, heads, dqk]; v and dv the v parts of kv and d kv [M, heads, nope + dv] (head stride nope + dv); o, d o
  // dense [M, heads, dv].
  static SdpaLayout core_layout(const ModelConfig& cfg, int64_t heads);
  // scratch() for M = max_tokens; scratch_bytes() its high_water().
  size_t forward_bytes() const { return scratch_.forward; }
  size_t recompute_bytes() const { return scratch_.recompute; }
  size_t backward_bytes() const { return scratch_.backward; }
  size_t backward_after_recompute_bytes() const { return scratch_.backward_after_recompute; }
  size_t scratch_bytes() const { return scratch_.high_water(); }

 private:
  // The layer's tensors for one pass: kept buffers, or pieces of the scratch.
  struct Acts {
    bf16 *c_q = nullptr, *n_q = nullptr, *q = nullptr, *c_kv = nullptr, *n_kv = nullptr, *kv = nullptr, *k = nullptr;
    bf16 *k_pe = nullptr, *o = nullptr, *kvd = nullptr;
    float* lse = nullptr;
  };
  struct Grads {
    bf16 *d_o = nullptr, *d_q = nullptr, *d_k = nullptr, *d_kv = nullptr, *d_kvd = nullptr, *d_lat = nullptr;
    float* dx32 = nullptr;
    unsigned char* attn_ws = nullptr;
  };
  void check_tokens(const char* what, int64_t M) const;
  // The tensors of plan `p` (buffers() for one pass): `kept`'s pointer for the held ones, takes from `arena` for
  // the rest under `policy`: with `forward_only` also kvd and (when not kept) k_pe, which only a whole forward
  // needs. A measuring arena gives null pointers and counts (scratch()).
  static Acts take_acts(ScratchArena& arena, const BufferPlan& p, const MlaRecompute& policy, bool forward_only,
                        const Acts& kept);
  static Grads take_grads(ScratchArena& arena, const BufferPlan& p);
  // take_acts and take_grads for M tokens with the active slot's kept tensors.
  Acts bind_acts(ScratchArena& arena, int64_t M, bool forward_only);
  Grads bind_grads(ScratchArena& arena, int64_t M) { return take_grads(arena, plan_for(M)); }
  Acts kept_acts() const;
  // buffers() for M tokens on this GPU (kept from the last call with the same M): the sizes the passes take.
  const BufferPlan& plan_for(int64_t M);
  // Everything up to the attention output o (and lse) into t; `for_backward`: norms through recompute().
  void run_forward(ModelContext& ctx, const bf16* x, int64_t M, const Acts& t, bool for_backward);
  // The tensors the policy does not keep, for backward (not under `full`): norms, up-projections, attention.
  void recompute_parts(ModelContext& ctx, const bf16* x, int64_t M, const Acts& t);
  void run_backward(ModelContext& ctx, const bf16* dy, const bf16* x, int64_t M, const Acts& t, const Grads& g,
                    bf16* dx);
  // The attention core, o and lse from q, k and kv's v parts, and its backward into d q, d k and d kv's v parts, on
  // the context's backend (ModelContext::attention, which picks per shape: our kernels, or cuDNN with the model's
  // workspace; null: our kernels).
  void core_forward(ModelContext& ctx, int64_t M, const Acts& t);
  void core_backward(ModelContext& ctx, int64_t M, const Acts& t, const Grads& g);

  std::string prefix_;
  int64_t d_, H_, nope_, rope_, dqk_, dv_, r_q_, r_kv_, T_, max_tokens_;
  float rope_theta_;
  SdpaLayout core_layout_;          // core_layout(model_, H_)
  MlaRecompute policy_;
  ModelConfig model_;
  Recipe recipe_;
  // Parameters (registration order = checkpoint order): q_down, q_norm, q_up (or q_proj), kv_down, kv_norm, kv_up,
  // out.
  std::optional<Linear> q_down_;    // d -> r_q            (absent when r_q = 0)
  std::optional<RmsNorm> q_norm_;   // [r_q]               (absent when r_q = 0)
  Linear q_up_;                     // r_q -> H * dqk      (q_proj: d -> H * dqk when r_q = 0)
  Linear kv_down_;                  // d -> r_kv + rope
  RmsNorm kv_norm_;                 // [r_kv]
  Linear kv_up_;                    // r_kv -> H * (nope + dv)
  Linear out_;                      // H * dv -> d
  KeptValue<int64_t> last_M_;       // per slot: tokens of its forward (-1: none)
  BufferPlan plan_{"mla"};           // buffers() at max_tokens
  BufferPlan pass_plan_{"mla"};      // plan_for's
  int64_t pass_M_ = -1;
  Acts acts_;                       // the tensors of the last forward or recompute_forward (its slot's)
  uint64_t acts_stamp_ = 0;         // scratch stamp of the last recompute_forward (0: none)
  PassScratch scratch_;             // scratch() at max_tokens

  // Kept from forward to backward (MemCategory::activations), max_tokens rows each, one copy per in-flight slot;
  // empty when not kept:
  KeptArray<bf16> c_q_;      // [max_tokens, r_q]          q_down output, q_norm input (r_q > 0; not under full)
  KeptArray<bf16> n_q_;      // [max_tokens, r_q]          q_norm output, q_up input   (not layernorm / full)
  KeptArray<bf16> q_;        // [max_tokens, H, dqk]       queries, rope part rotated  (not mla_up_proj / full)
  KeptArray<bf16> c_kv_;     // [max_tokens, r_kv]         latent, kv_norm input       (not full)
  KeptArray<bf16> n_kv_;     // [max_tokens, r_kv]         kv_norm output, kv_up input (not layernorm / full)
  KeptArray<bf16> kv_;       // [max_tokens, H, nope + dv] kv_up output: k_nope | v  (not mla_up_proj / full)
  KeptArray<bf16> k_;        // [max_tokens, H, dqk]       keys [k_nope_h | k_pe]      (not mla_up_proj / full)
  KeptArray<bf16> k_pe_;     // [max_tokens, rope]         rotated RoPE key            (mla_up_proj only)
  KeptArray<bf16> o_;        // [max_tokens, H, dv]        attention output, out's input (not core_attn / full)
  KeptArray<float> lse_;     // [B_max, H, T]              log-sum-exp of the attention rows (as o)
};

}  // namespace fp4moe
