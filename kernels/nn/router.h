// MoE router: scores over E routed experts for T tokens, top-k selection, combine weights, per-expert token counts
// and the int32 group offsets [E+1] that the expert GEMMs (kernels/gemm) and quantizers (kernels/quant) take.
//
// Input: router logits [T, E] FP32 (the router GEMM h W_r^T stays in FP32; DESIGN.md "Recipes": the router is not
// quantized). Two styles:
//
//   v3 (DeepSeek-V3, sec. 2.1.1-2.1.2): s = sigmoid(logit) [T, E]; the top-k experts by s + bias (bias FP32 [E],
//      the auxiliary-loss-free balancing bias, used for the selection only); weight_j = scale * s_j / sum_l s_l
//      over the k selected experts. No auxiliary loss, no gradient to the bias (router_bias_update moves it from
//      the counts after each step). V3's group-limited routing (n_group / topk_group) is not applied.
//   v2 (DeepSeek-V2, sec. 2.2.3): p = softmax(logit) over E; the top-k experts by p; weight_j = scale * p_j (not
//      renormalised, V2's norm_topk_prob = false); expert-level balance loss
//         aux = alpha * sum_e f_e P_e,  f_e = E / (k T) * count_e,  P_e = (1/T) sum_t p[t, e],
//      with f_e a constant for the gradient (V2 eq. 12-14).
//
// Tie-breaking (deterministic, CPU and GPU alike): among equal selection scores the lower expert index wins; the
// selected experts are listed in decreasing selection score (ties: increasing index). Logits must be finite
// (not checked on the device; a NaN gives an unspecified selection).
//
// Counts and offsets: counts int32 [E] = number of tokens that selected each expert (an expert may have none);
// offsets int32 [E+1] = exclusive prefix sum (offsets[0] = 0, offsets[E] = T * k): kernels/common/offsets.h.
// With expert parallelism these are the local counts before the dispatch; this file knows one device.
//
// Backward: dweights [T, k] FP32 -> dlogits [T, E] FP32 (zero for the unselected experts in v3; the softmax
// couples every expert in v2), plus for v2 the balance loss gradient aux_grad * dAux/dlogits where aux_grad is
// the upstream gradient of the aux loss (1 when it is added to the loss as is).
//
// Determinism: the device kernels use integer atomics for the counts only (exact, order-free); every floating
// reduction has a fixed order, so results are the same run to run. GPU and CPU differ by rounding only (expf,
// reduction order): the tests compare them with tolerances, the selection exactly.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/check.h"

namespace fp4moe {

enum class RouterStyle : int { v3_sigmoid = 0, v2_softmax = 1 };
const char* router_style_name(RouterStyle s);

struct RouterConfig {
  RouterStyle style = RouterStyle::v3_sigmoid;
  int64_t top_k = 8;
  float routed_scale = 2.5f;  // DeepSeek-V3's routed_scaling_factor (V2: 16 on the 236B model, 1 on V2-Lite)
  float aux_alpha = 0.0f;     // v2 balance loss coefficient (V2: 0.003); ignored for v3
};

// Largest expert count the device kernels take (the scores of one token live in shared memory).
constexpr int64_t kRouterMaxExperts = 1024;

namespace detail {
// Shared by the kernels' launchers and the CPU references: the same rejections with the same messages.
inline void check_router_shape(const char* what, int64_t T, int64_t E, const RouterConfig& cfg) {
  FP4MOE_CHECK(T >= 0, "{}: token count T must be >= 0, got T={}", what, T);
  FP4MOE_CHECK(E >= 1 && E <= kRouterMaxExperts, "{}: expert count E must be in [1, {}], got E={}", what,
               kRouterMaxExperts, E);
  FP4MOE_CHECK(cfg.top_k >= 1 && cfg.top_k <= E,
               "{}: top-k must be in [1, E] (cannot select more experts than exist), got top_k={} with E={}", what,
               cfg.top_k, E);
  FP4MOE_CHECK(cfg.style == RouterStyle::v3_sigmoid || cfg.style == RouterStyle::v2_softmax,
               "{}: unknown router style {}", what, static_cast<int>(cfg.style));
  FP4MOE_CHECK(cfg.routed_scale > 0.0f, "{}: routed_scale must be > 0, got {}", what, cfg.routed_scale);
  FP4MOE_CHECK(cfg.aux_alpha >= 0.0f, "{}: aux_alpha must be >= 0, got {}", what, cfg.aux_alpha);
  FP4MOE_CHECK(T <= (int64_t{1} << 31) / cfg.top_k - 1,
               "{}: T * top_k must fit in int32 (offsets are int32), got T={} top_k={}", what, T, cfg.top_k);
}
inline void check_bias_update(const char* what, const int32_t* counts, int64_t E, int64_t total, float gamma,
                              const float* bias) {
  FP4MOE_CHECK(E >= 1 && E <= kRouterMaxExperts, "{}: expert count E must be in [1, {}], got E={}", what,
               kRouterMaxExperts, E);
  FP4MOE_CHECK(total >= 0, "{}: total_assignments (T * k) must be >= 0, got {}", what, total);
  FP4MOE_CHECK(gamma >= 0.0f && gamma < 3.4e38f, "{}: bias update speed gamma must be finite and >= 0, got {}",
               what, gamma);
  FP4MOE_CHECK(counts != nullptr && bias != nullptr, "{}: counts [E] and bias [E] must not be null", what);
}

// The v2 balance loss alpha * sum_e f_e P_e (above) from probs [T, E] FP32 and counts [E] int32 into aux_loss [1] FP32,
// device memory, asynchronous on `stream`: one thread per expert sums its P_e over the tokens in token order, then one
// thread adds the terms in expert order, one rounding per operation (no FMA). T = 0 writes 0. Shared by router_forward
// and router_gates_for_indices (router_gates.h), which check the arguments (1 <= k <= E <= kRouterMaxExperts).
void launch_balance_loss(const float* probs, const int32_t* counts, int64_t T, int64_t E, int64_t k, float alpha,
                         float* aux_loss, cudaStream_t stream);

// CPU references shared by router_forward_ref and router_gates_for_indices_ref (router_ref.cpp), in the device
// kernels' operation order. The combine weights of one token: p [E] its scores, idx [k] its experts (any order),
// weight [k] = scale * p / 1 (v2) or scale * p / (sum of the k scores in slot order) (v3).
template <typename Real>
void combine_weights_ref(const Real* p, const int32_t* idx, int64_t k, bool v3, Real scale, Real* weight);
// The v2 balance loss above from probs [T, E] and counts [E]; 0 for T = 0.
template <typename Real>
Real balance_loss_ref(const Real* probs, const int32_t* counts, int64_t T, int64_t E, int64_t k, float alpha);
}  // namespace detail

// Forward on the device, asynchronous on `stream`. All pointers device memory:
//   logits   [T, E] FP32 row-major                      (input)
//   bias     [E] FP32, v3 only (null: no bias); ignored by v2
//   probs    [T, E] FP32: s (v3) or p (v2), kept for the backward
//   topk_idx [T, k] int32, topk_weight [T, k] FP32 (order: decreasing selection score, ties lower index first)
//   counts   [E] int32, offsets [E+1] int32
//   aux_loss [1] FP32, v2 only (null: not computed); v3 ignores it
// T = 0 writes counts = 0 and offsets = 0 (and aux_loss = 0) only.
// Rejects (fp4moe::Error, before any launch): the shape and config rules of check_router_shape, null pointers.
void router_forward(const float* logits, const float* bias, int64_t T, int64_t E, const RouterConfig& cfg,
                    float* probs, int32_t* topk_idx, float* topk_weight, int32_t* counts, int32_t* offsets,
                    float* aux_loss, cudaStream_t stream);

// Backward on the device: dweights [T, k] FP32 (gradient of topk_weight) -> dlogits [T, E] FP32 (every element
// written). probs, topk_idx, counts as the forward wrote them. aux_grad: upstream gradient of aux_loss (v2).
// Rejects (fp4moe::Error, before any launch): the rules of check_router_shape and, for T > 0, null pointers.
// T = 0 launches nothing.
void router_backward(const float* probs, const int32_t* topk_idx, const int32_t* counts, const float* dweights,
                     int64_t T, int64_t E, const RouterConfig& cfg, float aux_grad, float* dlogits,
                     cudaStream_t stream);

// Counts and offsets of top-k assignments alone (the router forward calls it): topk_idx [T, k] int32 device,
// entries in [0, E) (not checked on the device) -> counts [E], offsets [E+1] int32 device.
// Rejects: T < 0, k < 1, k > E, E outside [1, kRouterMaxExperts], T * k beyond int32, null counts or offsets, and
// a null topk_idx for T > 0. T = 0 writes zero counts and offsets.
void expert_counts_and_offsets(const int32_t* topk_idx, int64_t T, int64_t k, int64_t E, int32_t* counts,
                               int32_t* offsets, cudaStream_t stream);

// Auxiliary-loss-free balancing (DeepSeek-V3 sec. 2.1.2), once per optimizer step: with mean load
// T k / E (total_assignments = T k over the step), bias[e] -= gamma for an overloaded expert (count_e > mean),
// bias[e] += gamma for an underloaded one (count_e < mean), unchanged at the mean; compared exactly in integers
// (count_e * E against total_assignments). counts [E] int32, bias [E] FP32 updated in place, device memory. With
// expert parallelism the counts must be the global ones (summed over ranks) so that every rank moves alike.
// Rejects gamma < 0 or not finite, E outside [1, kRouterMaxExperts], total_assignments < 0, null pointers.
void router_bias_update(const int32_t* counts, int64_t E, int64_t total_assignments, float gamma, float* bias,
                        cudaStream_t stream);

// The step's expert loads on the device (a step without host synchronisation, moe_router.h): tally[e] += counts[e]
// for e in [0, E), int32 device arrays. Rejects E outside [1, kRouterMaxExperts] and null pointers. The caller keeps
// the sums within int32 (a step's assignments).
void router_tally_counts(const int32_t* counts, int64_t E, int32_t* tally, cudaStream_t stream);
// router_bias_update from a device tally with its total summed on the device (total_assignments = sum_e tally[e],
// in int64), then the tally zeroed for the next step: no host value depends on the step's loads, so a captured step
// replayed any number of times updates from what its replays counted. Same rule, bits and rejections as
// router_bias_update (bar total_assignments).
void router_bias_update_from_tally(int32_t* tally, int64_t E, float gamma, float* bias, cudaStream_t stream);

// ---- CPU references (router_ref.cpp), Real = float or double, host memory, same layouts and rejections -------
// The forward also validates nothing about the values (logits may be anything finite). Written from the rules
// above, sequential sums in index order.
template <typename Real>
void router_forward_ref(const Real* logits, const Real* bias, int64_t T, int64_t E, const RouterConfig& cfg,
                        Real* probs, int32_t* topk_idx, Real* topk_weight, int32_t* counts, int32_t* offsets,
                        Real* aux_loss);

template <typename Real>
void router_backward_ref(const Real* probs, const int32_t* topk_idx, const int32_t* counts, const Real* dweights,
                         int64_t T, int64_t E, const RouterConfig& cfg, Real aux_grad, Real* dlogits);

// Same rule and rejections as router_bias_update; host memory.
void router_bias_update_ref(const int32_t* counts, int64_t E, int64_t total_assignments, float gamma, float* bias);

// Same rules and rejections as router_tally_counts and router_bias_update_from_tally; host memory.
void router_tally_counts_ref(const int32_t* counts, int64_t E, int32_t* tally);
void router_bias_update_from_tally_ref(int32_t* tally, int64_t E, float gamma, float* bias);

// Rejects topk_idx entries outside [0, E) or repeated within a token (message names the token).
void expert_counts_and_offsets_ref(const int32_t* topk_idx, int64_t T, int64_t k, int64_t E, int32_t* counts,
                                   int32_t* offsets);

}  // namespace fp4moe
