// CPU reference of the router weights for a given selection (router_gates.h), from the rules in the header, in the
// operation order of the device kernel; the weights and the balance loss are router_ref.cpp's. Instantiated for float (compared with the GPU) and double.
#include <vector>

#include "kernels/common/check.h"
#include "kernels/nn/router_gates.h"

namespace fp4moe {

template <typename Real>
void router_gates_for_indices_ref(const Real* probs, const int32_t* topk_idx, const int32_t* counts, int64_t T,
                                  int64_t E, const RouterConfig& cfg, Real* topk_weight, Real* aux_loss) {
  const char* what = "router_gates_for_indices_ref";
  const bool loss = detail::check_router_gates(what, probs, topk_idx, counts, T, E, cfg, topk_weight, aux_loss);
  const bool v3 = cfg.style == RouterStyle::v3_sigmoid;
  const int64_t k = cfg.top_k;
  std::vector<int32_t> own_counts(E), own_offsets(E + 1);
  expert_counts_and_offsets_ref(topk_idx, T, k, E, own_counts.data(), own_offsets.data());  // validates topk_idx
  if (loss)
    for (int64_t e = 0; e < E; ++e)
      FP4MOE_CHECK(counts[e] == own_counts[e], "{}: counts[{}] = {} but the selection sends {} tokens to expert {}",
                   what, e, counts[e], own_counts[e], e);
  const Real scale = static_cast<Real>(cfg.routed_scale);
  for (int64_t t = 0; t < T; ++t)
    detail::combine_weights_ref(probs + t * E, topk_idx + t * k, k, v3, scale, topk_weight + t * k);
  if (loss) *aux_loss = detail::balance_loss_ref(probs, counts, T, E, k, cfg.aux_alpha);
}

template void router_gates_for_indices_ref<float>(const float*, const int32_t*, const int32_t*, int64_t, int64_t,
                                                  const RouterConfig&, float*, float*);
template void router_gates_for_indices_ref<double>(const double*, const int32_t*, const int32_t*, int64_t, int64_t,
                                                   const RouterConfig&, double*, double*);

}  // namespace fp4moe
