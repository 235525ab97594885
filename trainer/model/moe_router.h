// The router of one MoE layer (part of MoeLayer, trainer/model/moe.h): the router GEMM with FP32 logits, the
// top-k selection and combine weights (kernels/nn/router.h), the routing counts brought to the host once per
// forward, the v2 balance loss and the v3 aux-loss-free bias.
//
//   logits = x W_r^T     x [M, d] BF16, W_r "<prefix>.router" [E, d] BF16 (N(0, 0.02^2), decay), logits [M, E]
//                        FP32 (cuBLASLt, BF16 operands, FP32 accumulation and output: the router is not quantized)
//   router_forward       probs [M, E], topk_idx [M, k], topk_weight [M, k] (routed_scale already applied),
//                        counts [E], offsets [E+1]; v3 selects by probs + bias ("<prefix>.router_bias" [E] FP32
//                        state, ParamStore::add_state), v2 writes the balance loss aux [1]
//   host copy            ONE device-to-host copy of offsets [E+1] (plus the aux loss [1] for v2) into pinned
//                        host memory and one cudaStreamSynchronize per forward: the expert GEMMs need the token
//                        count of every expert on the host (GroupSplit, kernels/gemm/grouped_gemm.h)
//   backward             router_backward: dweights [M, k] FP32 -> dlogits [M, E] FP32 -> BF16 ->
//                        Dgrad dx32 [M, d] FP32 += dlogits W_r, Wgrad W_r.grad [E, d] FP32 += dlogits^T x
//
// Forced routing (force_routing): the selection is copied from a caller's device array instead of the router's
// top-k; counts and offsets are recounted (expert_counts_and_offsets) and the weights and the v2 loss recomputed for
// that selection (kernels/nn/router_gates.h); the backward differentiates the forced selection.
//
// Memory. Kept from forward to backward (MemCategory::activations) under every recompute policy, bytes per token:
// probs 4 E (what router_backward differentiates: v3 sigmoid scores, v2 softmax probabilities), topk_idx 4 k,
// topk_weight 4 k; per layer counts, offsets and the aux loss (tiny). The router is never rerun: under `moe` and
// `full` the routing is kept with the dispatched expert input (trainer/model/recompute.h), so that the experts'
// recompute neither routes nor dispatches again (in expert parallelism a second dispatch would repeat the
// all-to-all). Backward reads the block input x [M, d] BF16 again (Wgrad), which the caller keeps or recomputes.
// Scratch (ModelContext::scratch): forward takes logits [M, E] FP32 in the caller's scope; backward takes dlogits
// [M, E] FP32 and BF16 in its own.
//
// Expert parallelism (cfg.parallel.ep > 1, emulated: trainer/model/layout_emulation.h): the router scores, selects
// and tallies over all E experts as above (replicated under expert parallelism); forward then maps the selection to
// this GPU's E_l = E / ep local experts (local_expert_routing: local id = expert mod E_l, counts and offsets over
// E_l), kept for backward, and routing() hands the routed experts that local routing. The host copy then brings the
// local offsets [E_l + 1] beside the offsets [E+1], under the same one synchronisation. With ep = 1 no mapping runs.
// A skewed routed load (parallel.routed_load r > 1, layout_emulation.h) extends the local routing to the
// R = routed_row_count(M k, r) rows the hottest rank's experts receive: the M k real rows, then R - M k extra rows
// spread over the local experts (combine weight 0, no gate gradient); routing() hands the experts all R. The
// router's own outputs (probs, top-k, weights, counts, the tally) stay those of the M tokens.
//
// Expert loads for the v3 bias: the counts of a forward join the step's tally when its backward runs (so that
// evaluation forwards do not move the bias); end_step applies router_bias_update with the tally (gamma =
// moe.bias_update_rate) and clears it.
// Without host synchronisation (ModelContext::host_sync_free): forward skips the host copy and its synchronisation
// (and the check of the offsets' end, which a forced selection could fail); routing() then hands no host offsets
// (the expert GEMMs read the device ones, GroupSplit::rows = R); the v2 loss is not read (aux_loss_host() NaN); the
// v3 tally is kept on the device ("<prefix> router step tally", [E] int32 under MemCategory::workspace, allocated by
// the mode's first backward, which must run eagerly; not in buffers(): only this mode holds it), router_tally_counts
// per backward, and end_step in the mode updates the bias from it and its total summed on the device
// (router_bias_update_from_tally, which zeroes it), with the same bits as from the host tally: a captured step
// replayed any number of times updates from what its replays counted. The mode is switched between optimizer steps
// (after end_step); end_step in the mode rejects a step with micro-batches counted on the host (and drops them).
// step_counts() holds the host tally only. The device tally is int32: a step's assignments per expert stay below
// 2^31 (the host path checks it; the device one does not).
// In-flight micro-batches (trainer/memory/device_memory.h): what a forward writes and its backward reads has one copy
// per slot: probs, topk_idx, topk_weight, counts, offsets, aux (device), the pinned host offsets, the token count and
// the host counts; routing() and backward read the active slot's. One copy: the step's tally (host, and the device one without host synchronisation), the v2 loss read
// back at the forward (aux_loss_host, its pinned copy).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/common/types.h"
#include "kernels/nn/router.h"
#include "trainer/config.h"
#include "trainer/memory/buffer_plan.h"
#include "trainer/memory/device_memory.h"
#include "trainer/memory/scratch.h"
#include "trainer/model/context.h"
#include "trainer/model/params.h"

namespace fp4moe {

// The routed experts one GPU of cfg's layout holds: moe.routed_experts / parallel.ep (all of them on one GPU; that
// ep divides routed_experts is validate_layout's rule). Rejects (fp4moe::Error) parallel.ep < 1.
int64_t local_routed_experts(const TrainerConfig& cfg);

// The routing of the active slot's forward, as the routed experts read it (E: this GPU's local experts, ids local).
// Pointers stay valid until that slot's next forward.
struct MoeRouting {
  int64_t M = 0, E = 0, k = 0;
  int64_t rows = 0;                       // R: rows the experts process, M k, or more under a skewed routed load
                                          // (the extra ones after the M k real assignments, layout_emulation.h)
  const int32_t* topk_idx = nullptr;      // device [rows]: expert of each assignment ([M, k] for the real ones:
                                          // token, slot)
  const float* topk_weight = nullptr;     // device [M, k] FP32 combine weights
  const int32_t* offsets = nullptr;       // device [E+1], exclusive prefix sum of the counts
  const int32_t* host_offsets = nullptr;  // pinned host [E+1], the same values
};

// Pinned host memory (cudaMallocHost), freed on destruction. Move-only.
class PinnedHost {
 public:
  PinnedHost() = default;
  explicit PinnedHost(size_t bytes);
  ~PinnedHost();
  PinnedHost(PinnedHost&& o) noexcept : p_(o.p_) { o.p_ = nullptr; }
  PinnedHost& operator=(PinnedHost&& o) noexcept;
  PinnedHost(const PinnedHost&) = delete;
  PinnedHost& operator=(const PinnedHost&) = delete;
  void* get() const { return p_; }

 private:
  void* p_ = nullptr;
};

class MoeRouter {
 public:
  // Registers "<prefix>.router" and, for v3, the state "<prefix>.router_bias"; allocates for max_tokens tokens.
  // Rejects (fp4moe::Error) routed experts outside [1, kRouterMaxExperts], top_k outside [1, E], max_tokens < 0,
  // hidden not a positive multiple of 8, and max_tokens * top_k (the routed rows routed_row_count(max_tokens top_k,
  // parallel.routed_load) when the load is skewed) beyond int32.
  MoeRouter(ParamStore& store, const std::string& prefix, const TrainerConfig& cfg, int64_t max_tokens,
            DeviceMemory& mem);

  // x [M, d] BF16, 0 <= M <= max_tokens. Ends with the one host synchronisation (above). M = 0 touches no device
  // memory: the host offsets become zeros and the aux loss 0. Takes its logits in the caller's scope (not read
  // once forward returns: the routing itself is kept); a second forward on the same x gives the same routing bit
  // for bit.
  void forward(ModelContext& ctx, const bf16* x, int64_t M);
  // dweights [M, k] FP32 (the gradient of topk_weight), x as in forward (the same values) -> dx32 [M, d] FP32 +=
  // router Dgrad; W_r.grad += router Wgrad. aux_grad: upstream gradient of the v2 balance loss (ignored by v3). Adds
  // the forward's counts to the step's tally. M must equal the last forward's.
  void backward(ModelContext& ctx, const float* dweights, const bf16* x, int64_t M, float aux_grad, float* dx32);
  // v3: bias update from the tally, then the tally restarts (no-op without tokens); v2: nothing.
  void end_step(ModelContext& ctx);

  // topk: device [M, top_k] int32 read by every later forward (the caller keeps it alive and sized for the M it
  // passes), or null for the router's own top-k. Entries must lie in [0, E) and be distinct within a token.
  void force_routing(const int32_t* topk) { forced_ = topk; }

  MoeRouting routing() const;  // the active slot's
  // v2 loss of the last forward (0 for v3 and M = 0; NaN without host synchronisation)
  float aux_loss_host() const { return aux_host_; }
  const int32_t* topk_idx() const { return topk_idx_.data(); }  // the active slot's
  const RouterConfig& config() const { return rcfg_; }
  const Param& weight() const { return *w_; }
  const StateTensor* bias() const { return bias_; }                  // null for v2
  const std::vector<int64_t>& step_counts() const { return tally_; }  // [E] tokens per expert over the step
  // Replaces the step's tally before end_step (an expert-parallel rank's, summed over the ranks:
  // moe_expert_parallel.h). Rejects (fp4moe::Error) a size other than E and negative counts.
  void set_step_counts(std::vector<int64_t> counts);
  size_t kept_bytes() const;  // activations kept from forward to backward (buffers()), as DeviceMemory counts them
  // The router's buffers (trainer/memory/buffer_plan.h; module "moe.router") for `tokens` rows, E experts, top-k,
  // E_local of them on this GPU receiving `rows` routed rows (R: tokens k, more under a skewed load), all held under
  // every policy (the router does not rerun): "probs" [tokens, E] FP32, "topk_weight" [tokens, k] FP32, "topk_idx"
  // [tokens, k] int32, "counts" [E] int32, "offsets" [E + 1] int32, "aux" [1] FP32; with E_local < E the local
  // routing "local topk_idx" [rows], "local counts" [E_local] and "local offsets" [E_local + 1] int32 (no elements
  // when E_local = E); the scratch "logits (FP32)" [tokens, E] (forward), "dlogits (FP32)" and "dlogits (BF16)"
  // [tokens, E] (backward). Rejects tokens < 0, E < 1, k < 1, E_local outside [1, E] or not dividing E, rows < 0.
  static BufferPlan buffers(int64_t tokens, int64_t E, int64_t k, int64_t E_local, int64_t rows);
  // The shared scratch of the passes (trainer/memory/scratch.h) for `tokens` rows: forward "logits (FP32)", left in
  // the caller's scope; backward "dlogits (FP32)" and "dlogits (BF16)" in its own (independent of the routed rows).
  // Rejects what buffers() rejects.
  static PassScratch scratch(int64_t tokens, int64_t E, int64_t k, int64_t E_local);
  // scratch() for M = max_tokens.
  size_t forward_bytes() const { return scratch_.forward; }
  size_t backward_bytes() const { return scratch_.backward; }

 private:
  std::string prefix_;
  RouterConfig rcfg_;
  int64_t d_, E_, El_, max_tokens_;  // El_: local experts (E_ on one GPU)
  double routed_load_;                // parallel.routed_load: R = routed_row_count(M k, routed_load_) local rows
  int64_t max_rows_;                  // R at max_tokens
  float gamma_;
  Param* w_;
  StateTensor* bias_ = nullptr;
  const int32_t* forced_ = nullptr;
  KeptValue<int64_t> last_M_;               // per slot: tokens of its forward (-1: none)
  float aux_host_ = 0.0f;
  KeptValue<std::vector<int64_t>> last_counts_;  // per slot: [E] its forward's counts (from the host offsets)
  KeptValue<int> sync_free_;                     // per slot: 1 when its forward ran without host synchronisation
  std::vector<int64_t> tally_;        // [E] counts of the step's micro-batches whose backward ran
  DeviceArray<int32_t> step_tally_;   // [E] the same on the device, without host synchronisation (workspace; v3)
  PassScratch scratch_;               // scratch() at max_tokens

  // Per in-flight slot (KeptArray, KeptValue):
  KeptArray<float> probs_;         // [max_tokens, E] FP32 s (v3) or p (v2)                    (activations)
  KeptArray<int32_t> topk_idx_;    // [max_tokens, k] selected experts                        (activations)
  KeptArray<float> topk_weight_;   // [max_tokens, k] FP32 combine weights                     (activations)
  KeptArray<int32_t> counts_;      // [E] tokens per expert (router_backward reads them); in end_step the step's
                                   // tally (the active slot's copy: every backward has run)  (activations)
  KeptArray<int32_t> offsets_;     // [E+1] exclusive prefix sum of counts                    (activations)
  KeptArray<float> aux_;           // [1] v2 balance loss                                     (activations)
  KeptArray<int32_t> local_idx_;      // [max_rows] local expert of each row    (activations, El_ < E_)
  KeptArray<int32_t> local_counts_;   // [El] rows per local expert             (activations, El_ < E_)
  KeptArray<int32_t> local_offsets_;  // [El+1] their exclusive prefix sum      (activations, El_ < E_)
  KeptValue<PinnedHost> host_offsets_;        // host [E+1] int32: offsets of the slot's forward
  KeptValue<PinnedHost> host_local_offsets_;  // host [El+1] int32: local offsets of the slot's forward (El_ < E_)
  PinnedHost host_aux_;            // host [1] FP32: aux of the last forward (v2)
};

}  // namespace fp4moe
