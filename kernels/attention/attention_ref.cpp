// CPU references of causal attention (flash_attention.h): the full score matrix of each (sequence, head), softmax
// with the row max subtracted, everything in Real.
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <vector>

#include "kernels/attention/attention_checks.h"
#include "kernels/attention/flash_attention.h"
#include "kernels/common/check.h"

namespace fp4moe {
namespace {

// Dense [B*T, H, D] indexing.
struct Dense {
  int64_t T, H, D;
  int64_t at(int64_t b, int64_t t, int64_t h) const { return ((b * T + t) * H + h) * D; }
};

template <typename Real>
Real dot(const Real* x, const Real* y, int64_t n) {
  Real s = 0;
  for (int64_t i = 0; i < n; ++i) s += x[i] * y[i];
  return s;
}

// P [T][T] of sequence b, head h: row t is softmax_j<=t(scale q_t . k_j), zeros after the diagonal; lse[t] its
// log-sum-exp (may be null).
template <typename Real>
void probabilities(const AttentionShape& s, const Real* q, const Real* k, int64_t b, int64_t h, std::vector<Real>& P,
                   Real* lse) {
  const int64_t T = s.T;
  const Dense qk{T, s.H, s.Dqk};
  P.assign(static_cast<size_t>(T * T), Real(0));
  for (int64_t t = 0; t < T; ++t) {
    Real* row = &P[t * T];
    Real mx = -std::numeric_limits<Real>::infinity();
    for (int64_t j = 0; j <= t; ++j) {
      row[j] = static_cast<Real>(s.scale) * dot(q + qk.at(b, t, h), k + qk.at(b, j, h), s.Dqk);
      mx = std::max(mx, row[j]);
    }
    Real sum = 0;
    for (int64_t j = 0; j <= t; ++j) sum += (row[j] = std::exp(row[j] - mx));
    for (int64_t j = 0; j <= t; ++j) row[j] /= sum;
    if (lse) lse[t] = mx + std::log(sum);
  }
}

template <typename Real>
void check_arrays(const char* what, std::initializer_list<const Real*> arrays) {
  for (const Real* a : arrays) FP4MOE_CHECK(a != nullptr, "{}: an input or output array is null", what);
}

}  // namespace

template <typename Real>
void attention_forward_ref(const AttentionShape& s, const Real* q, const Real* k, const Real* v, Real* o, Real* lse) {
  const char* what = "attention_forward_ref";
  if (!attn_detail::check_shape_ref(what, s)) return;
  check_arrays<Real>(what, {q, k, v, o});
  const int64_t T = s.T;
  const Dense dv{T, s.H, s.Dv};
  std::vector<Real> P;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h) {
      probabilities(s, q, k, b, h, P, lse ? lse + (b * s.H + h) * T : nullptr);
      for (int64_t t = 0; t < T; ++t) {
        Real* out = o + dv.at(b, t, h);
        std::fill(out, out + s.Dv, Real(0));
        for (int64_t j = 0; j <= t; ++j) {
          const Real* vj = v + dv.at(b, j, h);
          for (int64_t d = 0; d < s.Dv; ++d) out[d] += P[t * T + j] * vj[d];
        }
      }
    }
}

template <typename Real>
void attention_backward_ref(const AttentionShape& s, const Real* q, const Real* k, const Real* v, const Real* dout,
                            Real* dq, Real* dk, Real* dv) {
  const char* what = "attention_backward_ref";
  if (!attn_detail::check_shape_ref(what, s)) return;
  check_arrays<Real>(what, {q, k, v, dout, dq, dk, dv});
  const int64_t T = s.T;
  const Dense qk{T, s.H, s.Dqk}, vo{T, s.H, s.Dv};
  const Real scale = static_cast<Real>(s.scale);
  std::vector<Real> P, dS(static_cast<size_t>(T * T));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h) {
      probabilities(s, q, k, b, h, P, static_cast<Real*>(nullptr));
      for (int64_t t = 0; t < T; ++t) {
        std::fill(dq + qk.at(b, t, h), dq + qk.at(b, t, h) + s.Dqk, Real(0));
        std::fill(dk + qk.at(b, t, h), dk + qk.at(b, t, h) + s.Dqk, Real(0));
        std::fill(dv + vo.at(b, t, h), dv + vo.at(b, t, h) + s.Dv, Real(0));
      }
      // dP[t][j] = dO_t . v_j; D[t] = sum_j P dP (= dO_t . O_t); dS = P (dP - D)
      for (int64_t t = 0; t < T; ++t) {
        const Real* g = dout + vo.at(b, t, h);
        Real D = 0;
        for (int64_t j = 0; j <= t; ++j) {
          dS[t * T + j] = dot(g, v + vo.at(b, j, h), s.Dv);
          D += P[t * T + j] * dS[t * T + j];
        }
        for (int64_t j = 0; j <= t; ++j) dS[t * T + j] = P[t * T + j] * (dS[t * T + j] - D);
      }
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j <= t; ++j) {
          const Real p = P[t * T + j], ds = scale * dS[t * T + j];
          const Real* g = dout + vo.at(b, t, h);
          Real* dvj = dv + vo.at(b, j, h);
          for (int64_t d = 0; d < s.Dv; ++d) dvj[d] += p * g[d];
          const Real* qt = q + qk.at(b, t, h);
          const Real* kj = k + qk.at(b, j, h);
          Real* dqt = dq + qk.at(b, t, h);
          Real* dkj = dk + qk.at(b, j, h);
          for (int64_t d = 0; d < s.Dqk; ++d) {
            dqt[d] += ds * kj[d];
            dkj[d] += ds * qt[d];
          }
        }
    }
}

template void attention_forward_ref<float>(const AttentionShape&, const float*, const float*, const float*, float*,
                                           float*);
template void attention_forward_ref<double>(const AttentionShape&, const double*, const double*, const double*,
                                            double*, double*);
template void attention_backward_ref<float>(const AttentionShape&, const float*, const float*, const float*,
                                            const float*, float*, float*, float*);
template void attention_backward_ref<double>(const AttentionShape&, const double*, const double*, const double*,
                                             const double*, double*, double*, double*);

}  // namespace fp4moe
