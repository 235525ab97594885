// CPU references of the MoE router (router.h): written from the rules in the header, one token at a time,
// sums in index order. Instantiated for float (compared with the GPU) and double (finite differences).
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/nn/router.h"

namespace fp4moe {

const char* router_style_name(RouterStyle s) {
  switch (s) {
    case RouterStyle::v3_sigmoid: return "v3_sigmoid";
    case RouterStyle::v2_softmax: return "v2_softmax";
  }
  return "unknown";
}

void expert_counts_and_offsets_ref(const int32_t* topk_idx, int64_t T, int64_t k, int64_t E, int32_t* counts,
                                   int32_t* offsets) {
  const char* what = "expert_counts_and_offsets_ref";
  FP4MOE_CHECK(T >= 0 && k >= 1 && E >= 1 && k <= E, "{}: expected T >= 0 and 1 <= k <= E, got T={} k={} E={}",
               what, T, k, E);
  FP4MOE_CHECK(counts != nullptr && offsets != nullptr && (T == 0 || topk_idx != nullptr), "{}: null pointer",
               what);
  for (int64_t e = 0; e < E; ++e) counts[e] = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = topk_idx[t * k + j];
      FP4MOE_CHECK(e >= 0 && e < E, "{}: token {} slot {} selects expert {}, expected an index in [0, {})", what, t,
                   j, e, E);
      for (int64_t l = 0; l < j; ++l)
        FP4MOE_CHECK(topk_idx[t * k + l] != e, "{}: token {} selects expert {} twice (slots {} and {})", what, t, e,
                     l, j);
      ++counts[e];
    }
  offsets[0] = 0;
  for (int64_t e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + counts[e];
}

void router_bias_update_ref(const int32_t* counts, int64_t E, int64_t total_assignments, float gamma, float* bias) {
  detail::check_bias_update("router_bias_update_ref", counts, E, total_assignments, gamma, bias);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t load = static_cast<int64_t>(counts[e]) * E;  // compared with the mean times E
    if (load > total_assignments) bias[e] -= gamma;
    else if (load < total_assignments) bias[e] += gamma;
  }
}

void router_tally_counts_ref(const int32_t* counts, int64_t E, int32_t* tally) {
  FP4MOE_CHECK(E >= 1 && E <= kRouterMaxExperts, "router_tally_counts_ref: E must be in [1, {}], got E={}",
               kRouterMaxExperts, E);
  FP4MOE_CHECK(counts != nullptr && tally != nullptr, "router_tally_counts_ref: null counts or tally");
  for (int64_t e = 0; e < E; ++e) tally[e] += counts[e];
}

void router_bias_update_from_tally_ref(int32_t* tally, int64_t E, float gamma, float* bias) {
  detail::check_bias_update("router_bias_update_from_tally_ref", tally, E, 0, gamma, bias);
  int64_t total = 0;
  for (int64_t e = 0; e < E; ++e) total += tally[e];
  router_bias_update_ref(tally, E, total, gamma, bias);
  for (int64_t e = 0; e < E; ++e) tally[e] = 0;
}

template <typename Real>
void detail::combine_weights_ref(const Real* p, const int32_t* idx, int64_t k, bool v3, Real scale, Real* weight) {
  Real denom = 1;
  if (v3) {
    denom = 0;
    for (int64_t j = 0; j < k; ++j) denom += p[idx[j]];
  }
  for (int64_t j = 0; j < k; ++j) weight[j] = scale * (p[idx[j]] / denom);
}

template <typename Real>
Real detail::balance_loss_ref(const Real* probs, const int32_t* counts, int64_t T, int64_t E, int64_t k,
                              float alpha) {
  Real loss = 0;
  for (int64_t e = 0; e < E && T > 0; ++e) {
    Real P = 0;
    for (int64_t t = 0; t < T; ++t) P += probs[t * E + e];
    P /= static_cast<Real>(T);
    const Real f = static_cast<Real>(E) * static_cast<Real>(counts[e]) / static_cast<Real>(k * T);
    loss += f * P;
  }
  return static_cast<Real>(alpha) * loss;
}

template <typename Real>
void router_forward_ref(const Real* logits, const Real* bias, int64_t T, int64_t E, const RouterConfig& cfg,
                        Real* probs, int32_t* topk_idx, Real* topk_weight, int32_t* counts, int32_t* offsets,
                        Real* aux_loss) {
  const char* what = "router_forward_ref";
  detail::check_router_shape(what, T, E, cfg);
  FP4MOE_CHECK(counts != nullptr && offsets != nullptr, "{}: counts and offsets must not be null", what);
  FP4MOE_CHECK(T == 0 || (logits && probs && topk_idx && topk_weight), "{}: null logits/probs/topk pointer", what);
  const int64_t k = cfg.top_k;
  const bool v3 = cfg.style == RouterStyle::v3_sigmoid;
  const Real scale = static_cast<Real>(cfg.routed_scale);
  std::vector<Real> sel(E);
  std::vector<char> taken(E);
  for (int64_t t = 0; t < T; ++t) {
    const Real* x = logits + t * E;
    Real* p = probs + t * E;
    if (v3) {
      for (int64_t e = 0; e < E; ++e) p[e] = Real(1) / (Real(1) + std::exp(-x[e]));
    } else {
      Real m = x[0];
      for (int64_t e = 1; e < E; ++e) m = x[e] > m ? x[e] : m;
      Real sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += std::exp(x[e] - m);
      for (int64_t e = 0; e < E; ++e) p[e] = std::exp(x[e] - m) / sum;
    }
    for (int64_t e = 0; e < E; ++e) {
      sel[e] = p[e] + ((v3 && bias) ? bias[e] : Real(0));
      taken[e] = 0;
    }
    for (int64_t j = 0; j < k; ++j) {  // k rounds of argmax; a strict > keeps the lower index on ties
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e)
        if (!taken[e] && (best < 0 || sel[e] > sel[best])) best = e;
      taken[best] = 1;
      topk_idx[t * k + j] = static_cast<int32_t>(best);
    }
    detail::combine_weights_ref(p, topk_idx + t * k, k, v3, scale, topk_weight + t * k);
  }
  expert_counts_and_offsets_ref(topk_idx, T, k, E, counts, offsets);
  if (!v3 && aux_loss) *aux_loss = detail::balance_loss_ref(probs, counts, T, E, k, cfg.aux_alpha);
}

template <typename Real>
void router_backward_ref(const Real* probs, const int32_t* topk_idx, const int32_t* counts, const Real* dweights,
                         int64_t T, int64_t E, const RouterConfig& cfg, Real aux_grad, Real* dlogits) {
  const char* what = "router_backward_ref";
  detail::check_router_shape(what, T, E, cfg);
  FP4MOE_CHECK(T == 0 || (probs && topk_idx && counts && dweights && dlogits), "{}: null pointer", what);
  const int64_t k = cfg.top_k;
  const Real scale = static_cast<Real>(cfg.routed_scale);
  std::vector<Real> dp(E);
  for (int64_t t = 0; t < T; ++t) {
    const Real* p = probs + t * E;
    const int32_t* idx = topk_idx + t * k;
    const Real* dw = dweights + t * k;
    Real* dx = dlogits + t * E;
    if (cfg.style == RouterStyle::v3_sigmoid) {
      // w_j = c s_j / S: ds_i = c / S * (dw_i - sum_l dw_l s_l / S) for selected i; ds/dlogit = s (1 - s).
      Real S = 0, dot = 0;
      for (int64_t j = 0; j < k; ++j) S += p[idx[j]];
      for (int64_t j = 0; j < k; ++j) dot += dw[j] * p[idx[j]];
      for (int64_t e = 0; e < E; ++e) dx[e] = 0;
      for (int64_t j = 0; j < k; ++j) {
        const Real s = p[idx[j]];
        const Real ds = scale / S * (dw[j] - dot / S);
        dx[idx[j]] = ds * (s * (Real(1) - s));
      }
    } else {
      // dp_e = c dw_j (e selected at slot j) + aux_grad * alpha * f_e / T; dlogit = p (dp - sum_e p_e dp_e).
      for (int64_t e = 0; e < E; ++e) {
        const Real f = static_cast<Real>(E) * static_cast<Real>(counts[e]) / static_cast<Real>(k * T);
        dp[e] = aux_grad * static_cast<Real>(cfg.aux_alpha) * f / static_cast<Real>(T);
      }
      for (int64_t j = 0; j < k; ++j) dp[idx[j]] += scale * dw[j];
      Real dot = 0;
      for (int64_t e = 0; e < E; ++e) dot += p[e] * dp[e];
      for (int64_t e = 0; e < E; ++e) dx[e] = p[e] * (dp[e] - dot);
    }
  }
}

template void detail::combine_weights_ref<float>(const float*, const int32_t*, int64_t, bool, float, float*);
template void detail::combine_weights_ref<double>(const double*, const int32_t*, int64_t, bool, double, double*);
template float detail::balance_loss_ref<float>(const float*, const int32_t*, int64_t, int64_t, int64_t, float);
template double detail::balance_loss_ref<double>(const double*, const int32_t*, int64_t, int64_t, int64_t, float);
template void router_forward_ref<float>(const float*, const float*, int64_t, int64_t, const RouterConfig&, float*,
                                        int32_t*, float*, int32_t*, int32_t*, float*);
template void router_forward_ref<double>(const double*, const double*, int64_t, int64_t, const RouterConfig&,
                                         double*, int32_t*, double*, int32_t*, int32_t*, double*);
template void router_backward_ref<float>(const float*, const int32_t*, const int32_t*, const float*, int64_t,
                                         int64_t, const RouterConfig&, float, float*);
template void router_backward_ref<double>(const double*, const int32_t*, const int32_t*, const double*, int64_t,
                                          int64_t, const RouterConfig&, double, double*);

}  // namespace fp4moe
