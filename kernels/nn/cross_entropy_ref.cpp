// CPU reference of the fused LM-head cross-entropy (cross_entropy.h): the same chunked online softmax as the
// device path, in Real arithmetic, logits computed one chunk at a time and thrown away.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/nn/cross_entropy.h"

namespace fp4moe {
namespace {

void check_ref_args(const char* what, int64_t T, int64_t C, int64_t V, int64_t chunk, const void* h, const void* w,
                    const void* targets) {
  FP4MOE_CHECK(T >= 0 && C >= 1 && V >= 1 && chunk >= 1,
               "{}: expected T >= 0, C >= 1, V >= 1 and chunk >= 1, got T={} C={} V={} chunk={}", what, T, C, V, chunk);
  FP4MOE_CHECK(T == 0 || (h && w && targets), "{}: h [T, C], w [V, C] and targets [T] must not be null", what);
}

template <typename Real>
Real logit(const Real* h, const Real* w, int64_t t, int64_t v, int64_t C) {
  Real acc = 0;
  for (int64_t c = 0; c < C; ++c) acc += h[t * C + c] * w[v * C + c];
  return acc;
}

bool counted(int32_t target) { return target != kIgnoreIndex; }

}  // namespace

template <typename Real>
Real cross_entropy_forward_ref(const Real* h, const Real* w, const int32_t* targets, int64_t T, int64_t C, int64_t V,
                               int64_t chunk, Real* loss_per_token) {
  check_ref_args("cross_entropy_forward_ref", T, C, V, chunk, h, w, targets);
  Real total = 0;
  int64_t n_valid = 0;
  std::vector<Real> z(chunk);
  for (int64_t t = 0; t < T; ++t) {
    Real m = -std::numeric_limits<Real>::infinity(), s = 0, zt = std::numeric_limits<Real>::quiet_NaN();
    for (int64_t v0 = 0; v0 < V; v0 += chunk) {
      const int64_t width = std::min(chunk, V - v0);
      Real cmax = -std::numeric_limits<Real>::infinity();
      for (int64_t i = 0; i < width; ++i) {
        z[i] = logit(h, w, t, v0 + i, C);
        cmax = z[i] > cmax ? z[i] : cmax;
      }
      const Real m_new = cmax > m ? cmax : m;
      Real csum = 0;
      for (int64_t i = 0; i < width; ++i) csum += std::exp(z[i] - m_new);
      s = s * std::exp(m - m_new) + csum;
      m = m_new;
      if (targets[t] >= v0 && targets[t] < v0 + width) zt = z[targets[t] - v0];
    }
    const Real loss = counted(targets[t]) ? (m + std::log(s)) - zt : Real(0);
    if (loss_per_token) loss_per_token[t] = loss;
    if (counted(targets[t])) {
      total += loss;
      ++n_valid;
    }
  }
  return n_valid ? total / static_cast<Real>(n_valid) : Real(0);
}

template <typename Real>
void cross_entropy_backward_ref(const Real* h, const Real* w, const int32_t* targets, int64_t T, int64_t C, int64_t V,
                                Real dloss, Real* dh, Real* dw) {
  check_ref_args("cross_entropy_backward_ref", T, C, V, 1, h, w, targets);
  if (dh)
    for (int64_t i = 0; i < T * C; ++i) dh[i] = 0;
  if (dw)
    for (int64_t i = 0; i < V * C; ++i) dw[i] = 0;
  int64_t n_valid = 0;
  for (int64_t t = 0; t < T; ++t) n_valid += counted(targets[t]) ? 1 : 0;
  if (n_valid == 0) return;
  const Real g = dloss / static_cast<Real>(n_valid);
  std::vector<Real> z(V);
  for (int64_t t = 0; t < T; ++t) {
    if (!counted(targets[t])) continue;
    Real m = -std::numeric_limits<Real>::infinity();
    for (int64_t v = 0; v < V; ++v) {
      z[v] = logit(h, w, t, v, C);
      m = z[v] > m ? z[v] : m;
    }
    Real s = 0;
    for (int64_t v = 0; v < V; ++v) s += std::exp(z[v] - m);
    const Real lse = m + std::log(s);
    for (int64_t v = 0; v < V; ++v) {
      const Real dz = (std::exp(z[v] - lse) - (v == targets[t] ? Real(1) : Real(0))) * g;
      for (int64_t c = 0; c < C; ++c) {
        if (dh) dh[t * C + c] += dz * w[v * C + c];
        if (dw) dw[v * C + c] += dz * h[t * C + c];
      }
    }
  }
}

template float cross_entropy_forward_ref<float>(const float*, const float*, const int32_t*, int64_t, int64_t,
                                                int64_t, int64_t, float*);
template double cross_entropy_forward_ref<double>(const double*, const double*, const int32_t*, int64_t, int64_t,
                                                  int64_t, int64_t, double*);
template void cross_entropy_backward_ref<float>(const float*, const float*, const int32_t*, int64_t, int64_t,
                                                int64_t, float, float*, float*);
template void cross_entropy_backward_ref<double>(const double*, const double*, const int32_t*, int64_t, int64_t,
                                                 int64_t, double, double*, double*);

}  // namespace fp4moe
