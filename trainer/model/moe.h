// The MoE feed-forward layer of the decoder (DESIGN.md "Trainer"; DeepSeek-V2 sec. 2.2, DeepSeek-V3 sec. 2.1.2):
// a router, E routed SwiGLU experts of width expert_ffn (dropless, top-k per token) and shared experts.
//
//   forward   router (trainer/model/moe_router.h): logits = x W_r^T (FP32), top-k, weights, counts, offsets;
//             ONE device-to-host copy of the offsets [E+1] (and the v2 loss) into pinned memory and one stream
//             synchronisation per layer forward: the grouped expert GEMMs need every expert's token count on the
//             host (GroupSplit, kernels/gemm/grouped_gemm.h)
//             routed experts (trainer/model/moe_experts.h): permute, fc1 GroupLinear, swiglu, fc2 GroupLinear,
//             unpermute with the top-k weights (which already include routed_scale) -> y_routed [M, d]
//             shared experts: SwigluMlp "<prefix>.shared" of width shared_experts * expert_ffn (when > 0)
//             y = y_routed + y_shared (add_bf16: one FP32 add, one BF16 rounding)
//   backward  routed: unpermute_backward -> d rows and d weights, expert GEMMs, permute_backward -> dx_routed BF16;
//             dx32 [M, d] FP32 = dx_routed; shared fc1 Dgrad += into dx32; router_backward -> dlogits (FP32,
//             cast to BF16) -> router Dgrad += into dx32, router Wgrad; dx = BF16(dx32).
//
// Expert parallelism (cfg.parallel.ep > 1, the emulated layout of trainer/model/model.h): the block holds
// E_l = E / ep routed experts (local_routed_experts) and the router hands them its local routing (moe_router.h); the
// router itself stays over all E. Below, E in the routed experts' shapes is E_l.
//
// Parameters (under `prefix`, e.g. "layers.1.moe"): "<prefix>.router" [E, d]; "<prefix>.experts.fc1" [E, 2f, d]
// (per expert gate | up rows, swiglu.h); "<prefix>.experts.fc2" [E, d, f]; "<prefix>.shared.fc1"
// [2 s f, d] and "<prefix>.shared.fc2" [d, s f] (s = shared_experts); v3 state "<prefix>.router_bias" [E] FP32.
// Init: N(0, 0.02^2), except the fc2 of routed and shared experts (they write into the residual stream):
// N(0, (0.02 / sqrt(2 * model.layers))^2).
//
// Recipes: routed experts cfg.recipe.routed_experts (bf16, fp8, mxfp4 through GroupLinear); shared experts
// cfg.recipe.shared_experts (Linear: bf16 only for now); the router stays BF16 x BF16 -> FP32.
//
// Memory. Kept from forward to backward (MemCategory::activations, sized at construction for max_tokens tokens): the
// router's (moe_router.h), the routed experts' (moe_experts.h) and the shared experts' (swiglu_mlp.h). The block's
// input x [M, d] BF16 is the caller's: backward reads it for the router's Wgrad and the shared experts (bf16 fc1's
// Wgrad, or their rerun); DecoderLayer keeps it (the ffn_norm output f_in, 2 d per token) unless `layernorm` or
// `full`, under which it reruns ffn_norm from the kept residual h_mid (recomputed itself under full) before it calls
// this backward. MoeLayer::buffers (below) gathers the sub-layers' buffer plans, which state every buffer and its
// size under each recipe and policy. In-flight micro-batches (trainer/memory/device_memory.h): the held buffers, the
// routing (device and pinned host) and the token counts have one copy per slot; backward reads the active slot's.
// Recompute (trainer/model/recompute.h, MoeRecompute):
//   moe_act         drops the routed experts' a (mxfp4: its MXFP4 copy)
//   shared_experts  drops the shared experts' h and a
//   moe, full       keep the routing and the dispatched expert input in the routed recipe's storage format (xs:
//                   BF16, the FP8 row copy, or MXFP4 codes + scales; what an expert-parallel dispatch delivers, so
//                   the recompute repeats neither the routing nor the all-to-all); backward reruns the routed
//                   experts alone (fc1 from the kept input, swiglu, fc2: h, a, ys into the scratch, bit for bit) and
//                   the shared experts' fc1 and swiglu. Megatron-Core's `moe` module checkpoints the whole MoE layer
//                   from its input (router, dispatch, experts, combine, shared experts): the shared experts are
//                   covered here as there, the router and the dispatch are not rerun here.
// Scratch (ModelContext::scratch, per call): forward the router's and experts' takes and the shared output [M, d]
// BF16; backward the experts' recomputed tensors, dx_routed [M, d] BF16, dx32 [M, d] FP32, dweights [M, k] FP32,
// then the larger of the routed experts', shared experts' and router's backward scratch. M = 0 is a no-op (no device
// work); experts with no token are skipped.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/common/types.h"
#include "trainer/config.h"
#include "trainer/memory/device_memory.h"
#include "trainer/memory/scratch.h"
#include "trainer/model/context.h"
#include "trainer/model/moe_experts.h"
#include "trainer/model/moe_router.h"
#include "trainer/model/params.h"
#include "trainer/model/recompute.h"
#include "trainer/model/swiglu_mlp.h"

namespace fp4moe {

struct LayerShape;  // trainer/model/decoder_layer.h

// What MoeLayer's constructor checks first, before it registers or allocates anything (fp4moe::Error naming the
// option): model.hidden and moe.expert_ffn positive multiples of 16 (Group Linear; 32 with an mxfp4 routed recipe),
// model.layers >= 1, moe.routed_experts in [1, kRouterMaxExperts], moe.top_k in [1, routed_experts], moe.shared_experts
// >= 0, moe.routed_scale > 0, moe.aux_alpha >= 0, moe.bias_update_rate >= 0, max_tokens >= 0 and max_tokens * top_k
// below 2^31 (int32 row indices).
void check_moe_layer_config(const TrainerConfig& cfg, int64_t max_tokens, const std::string& prefix);

// Init std of the expert fc2 weights (routed and shared), which write into the residual stream:
// 0.02 / sqrt(2 * model.layers). Rejects model.layers < 1.
float moe_fc2_init_std(const TrainerConfig& cfg);

class MoeLayer {
 public:
  // Shapes from cfg.model.hidden and cfg.moe, recompute policy from cfg.recompute (layer_recompute); rejects
  // (fp4moe::Error) what check_moe_layer_config rejects, before registering or allocating anything, and later a
  // shared-experts recipe that Linear does not build.
  MoeLayer(ParamStore& store, const std::string& prefix, const TrainerConfig& cfg, int64_t max_tokens,
           DeviceMemory& mem);

  // x [M, d] BF16 -> y [M, d] BF16 (overwritten; must not overlap x). 0 <= M <= max_tokens. Synchronises the
  // stream once (the routing counts, above).
  void forward(ModelContext& ctx, const bf16* x, int64_t M, bf16* y);
  // dy [M, d], x the pointer forward saw (the same values) -> dx [M, d] BF16 (overwritten, written last); every
  // parameter grad of the layer += (FP32). M must equal the last forward's. Recomputes first what the policy did
  // not keep. The v2 balance loss is differentiated with upstream gradient aux_grad_scale (set_aux_grad_scale).
  void backward(ModelContext& ctx, const bf16* dy, const bf16* x, int64_t M, bf16* dx);

  // The v2 balance loss of the last forward (alpha already applied; 0 for v3 and for M = 0). Host value, no sync.
  float aux_loss_host() const { return router_.aux_loss_host(); }
  // Upstream gradient of the v2 balance loss used by backward (default 1: the loss is added to the objective as
  // is). A model that scales its loss by grad_scale = 1 / grad_accum sets the same factor here.
  void set_aux_grad_scale(float g) { aux_grad_scale_ = g; }
  // Once per optimizer step: v3 bias update from the expert counts of the step's micro-batches (those whose
  // backward ran), then the counts restart; v2: nothing.
  void end_step(ModelContext& ctx) { router_.end_step(ctx); }
  // Device [M, top_k] int32: the experts of the last forward (forced or not).
  const int32_t* topk_idx() const { return router_.topk_idx(); }
  // Parity checks: later forwards take the experts from this device [M, top_k] int32 array (entries in [0, E),
  // distinct per token; kept alive by the caller) instead of the router's top-k; scores and weights are computed as
  // usual for those experts (kernels/nn/router_gates.h). null restores normal routing.
  void force_routing(const int32_t* topk_or_null) { router_.force_routing(topk_or_null); }

  const MoeRouter& router() const { return router_; }
  const MoeRoutedExperts& experts() const { return experts_; }
  const SwigluMlp* shared() const { return shared_.get(); }  // null without shared experts
  const MoeRecompute& recompute() const { return policy_; }

  // Activations kept from forward to backward (router, routed and shared experts), as DeviceMemory counts them.
  size_t kept_bytes() const;
  // Every buffer of the block (trainer/memory/buffer_plan.h) at one GPU's `shape` (trainer/model/decoder_layer.h):
  // block_buffers ("moe"), MoeRouter::buffers for its seq_share rows ("moe.router"), MoeRoutedExperts::buffers for its
  // routed rows and local experts ("moe.experts"), and with shared experts SwigluMlp::buffers ("moe.shared", its Dgrad
  // summed in FP32), under cfg's recipes and recompute policy.
  static std::vector<BufferPlan> buffers(const TrainerConfig& cfg, const LayerShape& shape);
  // The block's own scratch for `tokens` rows (module "moe"): forward's "shared experts output" [tokens, d] BF16
  // (with shared experts); backward's "routed experts dx" [tokens, d] BF16, "dx (FP32)" [tokens, d] and "top-k
  // weights grad" [tokens, k] FP32. The first of buffers()' plans.
  static BufferPlan block_buffers(int64_t tokens, int64_t d, int64_t k, bool shared);
  // The shared scratch of the block's passes (trainer/memory/scratch.h) at one GPU's `shape`, as buffers() sizes
  // them: forward the router's logits, the routed experts' forward, the shared experts' output and their forward,
  // one above the other; backward the routed experts' recompute, the block's own backward buffers, then the largest
  // of the routed experts', shared experts' and router's backward. No recompute of the block itself.
  static PassScratch scratch(const TrainerConfig& cfg, const LayerShape& shape);
  // scratch() on this GPU (LayerShape::one_gpu at max_tokens); scratch_bytes() the larger.
  size_t forward_bytes() const { return scratch_.forward; }
  size_t backward_bytes() const { return scratch_.backward; }
  size_t scratch_bytes() const { return std::max(scratch_.forward, scratch_.backward); }

 private:
  std::string prefix_;
  int64_t d_, k_, max_tokens_;
  MoeRecompute policy_;
  float aux_grad_scale_ = 1.0f;
  KeptValue<int64_t> last_M_;  // per in-flight slot (trainer/memory/device_memory.h): tokens of its forward
  MoeRouter router_;
  MoeRoutedExperts experts_;
  std::unique_ptr<SwigluMlp> shared_;
  PassScratch scratch_;
};

}  // namespace fp4moe
