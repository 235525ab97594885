// Router combine weights for a GIVEN expert selection (router.h computes the selection itself): the MoE layer's
// forced routing, used by the parity check against the PyTorch model, where both sides must route every token to
// the same experts even when BF16/FP32 rounding would tip a near-tie the other way.
//
// From the scores probs [T, E] of router_forward (v3: s = sigmoid(logit); v2: p = softmax(logit)) and the
// selection topk_idx [T, k] (k distinct experts per token, any order), with the same rules as router.h:
//   v3: weight[t, j] = scale * (s[t, idx_j] / S_t),  S_t = sum_j s[t, idx_j] in slot order j = 0..k-1
//   v2: weight[t, j] = scale * p[t, idx_j]           (computed as scale * (p / 1), exactly what router.h does)
//   v2 balance loss (aux_loss non-null): alpha * sum_e f_e P_e, f_e = E / (k T) * counts[e], P_e = (1/T) sum_t p,
//       with counts [E] those of the given selection (expert_counts_and_offsets on the same topk_idx).
// FP32 with one rounding per operation in the orders above (no FMA): for the router's own selection the weights
// and the loss are bitwise what router_forward wrote, and the CPU reference with Real = float gives the same bits.
// The backward is router_backward with the same topk_idx and counts (it takes any selection).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/nn/router.h"

namespace fp4moe {

namespace detail {
// The rejections shared by router_gates_for_indices and its reference (same messages); returns whether the v2 balance
// loss is computed (v2 with a non-null aux_loss).
inline bool check_router_gates(const char* what, const void* probs, const int32_t* topk_idx, const int32_t* counts,
                               int64_t T, int64_t E, const RouterConfig& cfg, const void* topk_weight,
                               const void* aux_loss) {
  check_router_shape(what, T, E, cfg);
  const bool loss = cfg.style != RouterStyle::v3_sigmoid && aux_loss != nullptr;
  FP4MOE_CHECK(T == 0 || (probs && topk_idx && topk_weight),
               "{}: probs [T, E], topk_idx [T, k] and topk_weight [T, k] must not be null for T={}", what, T);
  FP4MOE_CHECK(!loss || counts != nullptr, "{}: the v2 balance loss needs the selection's counts [E], got null",
               what);
  return loss;
}
}  // namespace detail

// Device, asynchronous on `stream`. probs [T, E] FP32, topk_idx [T, k] int32 (entries in [0, E), distinct within
// a token; not checked on the device: an entry outside [0, E) gives NaN weights for that token, a repeated one a
// wrong normalisation), counts [E] int32 (v2 loss only; may be null when aux_loss is null) -> topk_weight [T, k]
// FP32, aux_loss [1] FP32 (v2 only, null: not computed; v3 ignores it). T = 0 writes aux_loss = 0 only.
// Rejects (fp4moe::Error, before any launch): the rules of check_router_shape (router.h); null probs, topk_idx or
// topk_weight for T > 0; a null counts with a non-null aux_loss for v2.
void router_gates_for_indices(const float* probs, const int32_t* topk_idx, const int32_t* counts, int64_t T,
                              int64_t E, const RouterConfig& cfg, float* topk_weight, float* aux_loss,
                              cudaStream_t stream);

// CPU reference (router_gates_ref.cpp), Real = float or double, host memory: the same contract, and it rejects
// entries of topk_idx outside [0, E) or repeated within a token (the message names the token), and counts that
// differ from the selection's.
template <typename Real>
void router_gates_for_indices_ref(const Real* probs, const int32_t* topk_idx, const int32_t* counts, int64_t T,
                                  int64_t E, const RouterConfig& cfg, Real* topk_weight, Real* aux_loss);

}  // namespace fp4moe
