// What each layer recomputes in backward instead of keeping from forward, from the config's [recompute] modules
// (Megatron-Core's --recompute-modules names; DESIGN.md "Trainer"). The layers' headers say what they keep under each
// flag, in bytes per token; the buffers they do not keep come from the shared scratch (trainer/memory/scratch.h) and
// are rebuilt there by a rerun of the forward pieces in backward. The kernels are deterministic, so gradients are
// bitwise the same under every policy (tests/trainer/test_recompute_gpu.cpp).
//
//   module          recomputed in backward
//   mla_up_proj     MLA's q (q_up + RoPE, or q_proj), kv (kv_up) and assembled k, from the kept n_q, n_kv and k_pe
//   core_attn       the attention output o and its lse (the attention forward reruns)
//   layernorm       the outputs and rstd of attn_norm, ffn_norm, MLA's q_norm and kv_norm (from their inputs)
//   moe_act         the routed experts' SwiGLU output a = swiglu(h) (bf16 recipe: a; mxfp4: its MXFP4 copy; fp8:
//                   nothing, the layer never keeps a, Group Linear keeps its own FP8 column copy)
//   moe             the MoE block's expert computation: the routed experts' h, a and ys (fc1 reruns from the kept
//                   dispatched input, then swiglu and fc2) and the shared experts' h and a (as shared_experts).
//                   Kept: the routing (the router's probs, top-k ids and weights, counts, offsets: the router does
//                   not rerun), the permutation (row_of) and the dispatched expert input xs in the routed recipe's
//                   storage format: bf16 BF16 xs, fp8 the FP8 1x128 row copy of xs (the operand of fc1's Fprop; its
//                   Group Linear also keeps, under every policy, the FP8 column copy its Wgrad reads), mxfp4 the MXFP4
//                   codes + scales of xs. In expert parallelism these are what the all-to-all delivers: the recompute
//                   does not dispatch again. The block input x (the ffn_norm output) is kept by DecoderLayer, or,
//                   with layernorm, recomputed by ffn_norm from the layer's kept h_mid (the router's and the shared
//                   experts' backward read it).
//   mlp             the dense SwiGLU FFN's h and a
//   shared_experts  the shared experts' h and a
//   full            the whole decoder layer from its input h[l] (attn_norm, MLA, h_mid, ffn_norm rerun), except the
//                   MoE block, which keeps what it keeps under moe (routing, row_of, dispatched input)
// Each layer's buffers() (trainer/memory/buffer_plan.h) states what it keeps under each flag, with its size.
// Independently of the policy, a layer keeps a Linear's input only when that Linear's backward reads it (the bf16
// recipe): fp8/mxfp4 Linears and Group Linears keep their own FP8/MXFP4 copy from their forward, in their own
// buffers, which stay allocated under every policy (Model::layer_memory's quantized_copies).
#pragma once

#include "trainer/config.h"

namespace fp4moe {

// MlaAttention (trainer/model/mla.h).
struct MlaRecompute {
  bool up_proj = false;    // mla_up_proj
  bool core_attn = false;  // core_attn
  bool norms = false;      // layernorm: q_norm and kv_norm
  bool whole = false;      // full: every tensor of the layer
  bool any() const { return up_proj || core_attn || norms || whole; }
};

// The MoE block (trainer/model/moe.h).
struct MoeRecompute {
  bool whole = false;           // moe or full: the experts rerun from the kept routing and dispatched input
  bool act = false;             // moe_act (also set by moe and full)
  bool shared_experts = false;  // shared_experts, moe or full
};

// One decoder layer (trainer/model/model.cpp).
struct LayerRecompute {
  bool full = false;       // full: only the layer input is kept
  bool norms = false;      // layernorm or full: attn_norm and ffn_norm outputs and rstd
  MlaRecompute mla;
  bool dense_mlp = false;  // mlp or full
  MoeRecompute moe;
};

// The flags of every layer for `rc` (the module names are checked by validate_config, not here).
LayerRecompute layer_recompute(const RecomputeConfig& rc);

}  // namespace fp4moe
