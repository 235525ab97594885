// CPU reference of the trainer's SwiGLU MLP and MoE layer (trainer/model/swiglu_mlp.h, moe.h), composed of the
// kernels' CPU references (router_forward_ref, router_gates_for_indices_ref, router_backward_ref, permute refs,
// swiglu_*_f64) and plain GEMMs in double. With `round` the tensors the GPU stores in BF16 are rounded to BF16
// (RNE) at the same points, so that the GPU test compares like with like; without it everything stays in double,
// for the finite-difference check of the reference itself (test_moe_layer_ref.cpp). Used by the CPU test and by
// tests/trainer/test_moe_layer_gpu.cpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "kernels/common/types.h"
#include "kernels/formats/formats.h"
#include "kernels/nn/permute.h"
#include "kernels/nn/router.h"
#include "kernels/nn/router_gates.h"
#include "kernels/nn/swiglu.h"

namespace fp4moe::test {

using Vec = std::vector<double>;

inline double round_bf16(double v) { return bf16_bits_to_f32(f32_to_bf16_bits(static_cast<float>(v))); }
inline Vec maybe_round(Vec v, bool round) {
  if (round)
    for (double& x : v) x = round_bf16(x);
  return v;
}

// C [M, N] = A [M, K] B[N, K]^T (rows of A and B given by pointers, so that expert slices can be passed).
inline void gemm_nt(const double* A, const double* B, int64_t M, int64_t N, int64_t K, double* C) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += A[m * K + k] * B[n * K + k];
      C[m * N + n] = s;
    }
}
// C [M, K] = A [M, N] B [N, K]
inline void gemm_nn(const double* A, const double* B, int64_t M, int64_t N, int64_t K, double* C) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) {
      double s = 0;
      for (int64_t n = 0; n < N; ++n) s += A[m * N + n] * B[n * K + k];
      C[m * K + k] = s;
    }
}
// C [N, K] += A [M, N]^T B [M, K]
inline void gemm_tn_acc(const double* A, const double* B, int64_t M, int64_t N, int64_t K, double* C) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      double s = 0;
      for (int64_t m = 0; m < M; ++m) s += A[m * N + n] * B[m * K + k];
      C[n * K + k] += s;
    }
}

// ---- SwiGLU MLP: h = x W1^T [M, 2f], a = swiglu(h) [M, f], y = a W2^T [M, d] ---------------------------------
struct MlpRefForward {
  Vec h, a, y;
};
struct MlpRefGrads {
  Vec dx, gw1, gw2;  // dx [M, d] (not rounded: the caller decides), gw1 [2f, d], gw2 [d, f]
};

inline MlpRefForward mlp_ref_forward(const Vec& x, const Vec& w1, const Vec& w2, int64_t M, int64_t d, int64_t f,
                                     bool round) {
  MlpRefForward o;
  o.h.assign(M * 2 * f, 0);
  o.a.assign(M * f, 0);
  o.y.assign(M * d, 0);
  gemm_nt(x.data(), w1.data(), M, 2 * f, d, o.h.data());
  o.h = maybe_round(o.h, round);
  swiglu_forward_f64(o.h.data(), M, f, o.a.data());
  o.a = maybe_round(o.a, round);
  gemm_nt(o.a.data(), w2.data(), M, d, f, o.y.data());
  o.y = maybe_round(o.y, round);
  return o;
}

inline MlpRefGrads mlp_ref_backward(const Vec& x, const Vec& w1, const Vec& w2, const MlpRefForward& fw,
                                    const Vec& dy, int64_t M, int64_t d, int64_t f, bool round) {
  MlpRefGrads g;
  Vec da(M * f), dh(M * 2 * f);
  g.dx.assign(M * d, 0);
  g.gw1.assign(2 * f * d, 0);
  g.gw2.assign(d * f, 0);
  gemm_nn(dy.data(), w2.data(), M, d, f, da.data());
  da = maybe_round(da, round);
  gemm_tn_acc(dy.data(), fw.a.data(), M, d, f, g.gw2.data());
  swiglu_backward_f64(da.data(), fw.h.data(), M, f, dh.data());
  dh = maybe_round(dh, round);
  gemm_tn_acc(dh.data(), x.data(), M, 2 * f, d, g.gw1.data());
  gemm_nn(dh.data(), w1.data(), M, 2 * f, d, g.dx.data());
  return g;
}

// ---- MoE layer -------------------------------------------------------------------------------------------------
struct MoeRefShape {
  int64_t M, d, E, k, f, shared_f;  // shared_f = shared_experts * f (0: no shared experts)
  RouterConfig router;
};

struct MoeRefParams {
  Vec wr;    // [E, d]
  Vec bias;  // [E] (v3; empty: none)
  Vec w1;    // [E, 2f, d]
  Vec w2;    // [E, d, f]
  Vec ws1;   // [2 shared_f, d]
  Vec ws2;   // [d, shared_f]
};

struct MoeRefForward {
  Vec logits, probs;                 // [M, E]
  std::vector<int32_t> own_idx;      // [M, k] the router's own selection
  Vec margin;                        // [M] smallest gap between neighbouring selection scores among the top k + 1
                                     // (sorted): below rounding level, GPU and CPU may pick or order differently
  std::vector<int32_t> idx;          // [M, k] the selection used (own or forced)
  Vec weight;                        // [M, k]
  double aux = 0;                    // v2 balance loss of the selection used
  std::vector<int32_t> counts, offsets, row_of, assignment_of;
  Vec xs, h1, a, ys, y_routed;       // [R, d], [R, 2f], [R, f], [R, d], [M, d]
  MlpRefForward shared;
  Vec y;                             // [M, d]
};

struct MoeRefGrads {
  Vec dx, gwr, gw1, gw2, gws1, gws2;
};

inline int64_t expert_rows(const std::vector<int32_t>& offsets, int64_t e) { return offsets[e + 1] - offsets[e]; }

// `forced`: the selection to use ([M, k]); null: the router's own.
inline MoeRefForward moe_ref_forward(const MoeRefShape& s, const MoeRefParams& p, const Vec& x,
                                     const std::vector<int32_t>* forced, bool round) {
  const int64_t M = s.M, d = s.d, E = s.E, k = s.k, f = s.f, R = M * k;
  const bool v3 = s.router.style == RouterStyle::v3_sigmoid;
  MoeRefForward o;
  o.logits.assign(M * E, 0);
  gemm_nt(x.data(), p.wr.data(), M, E, d, o.logits.data());
  o.probs.assign(M * E, 0);
  o.own_idx.assign(M * k, 0);
  Vec own_weight(M * k);
  std::vector<int32_t> own_counts(E), own_offsets(E + 1);
  double own_aux = 0;
  const double* bias = v3 && !p.bias.empty() ? p.bias.data() : nullptr;
  router_forward_ref<double>(o.logits.data(), bias, M, E, s.router, o.probs.data(), o.own_idx.data(),
                             own_weight.data(), own_counts.data(), own_offsets.data(), &own_aux);
  o.margin.assign(M, INFINITY);
  for (int64_t t = 0; t < M; ++t) {
    Vec sel(E);
    for (int64_t e = 0; e < E; ++e) sel[e] = o.probs[t * E + e] + (bias ? bias[e] : 0.0);
    std::sort(sel.begin(), sel.end(), std::greater<double>());
    for (int64_t j = 0; j < k && j + 1 < E; ++j) o.margin[t] = std::min(o.margin[t], sel[j] - sel[j + 1]);
  }
  o.idx = forced ? *forced : o.own_idx;
  o.counts.assign(E, 0);
  o.offsets.assign(E + 1, 0);
  o.row_of.assign(R, 0);
  o.assignment_of.assign(R, 0);
  permute_map_ref(o.idx.data(), M, k, E, o.counts.data(), o.offsets.data(), o.row_of.data(), o.assignment_of.data());
  o.weight.assign(M * k, 0);
  router_gates_for_indices_ref<double>(o.probs.data(), o.idx.data(), o.counts.data(), M, E, s.router,
                                       o.weight.data(), &o.aux);
  if (v3) o.aux = 0;

  o.xs.assign(R * d, 0);
  o.h1.assign(R * 2 * f, 0);
  o.a.assign(R * f, 0);
  o.ys.assign(R * d, 0);
  permute_forward_ref<double>(x.data(), o.assignment_of.data(), M, k, d, o.xs.data());
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = o.offsets[e], n = expert_rows(o.offsets, e);
    gemm_nt(o.xs.data() + r0 * d, p.w1.data() + e * 2 * f * d, n, 2 * f, d, o.h1.data() + r0 * 2 * f);
  }
  o.h1 = maybe_round(o.h1, round);
  swiglu_forward_f64(o.h1.data(), R, f, o.a.data());
  o.a = maybe_round(o.a, round);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = o.offsets[e], n = expert_rows(o.offsets, e);
    gemm_nt(o.a.data() + r0 * f, p.w2.data() + e * d * f, n, d, f, o.ys.data() + r0 * d);
  }
  o.ys = maybe_round(o.ys, round);
  o.y_routed.assign(M * d, 0);
  unpermute_forward_ref<double>(o.ys.data(), o.weight.data(), o.row_of.data(), M, k, d, o.y_routed.data());
  o.y_routed = maybe_round(o.y_routed, round);
  o.y = o.y_routed;
  if (s.shared_f > 0) {
    o.shared = mlp_ref_forward(x, p.ws1, p.ws2, M, d, s.shared_f, round);
    for (int64_t i = 0; i < M * d; ++i) o.y[i] += o.shared.y[i];
  }
  o.y = maybe_round(o.y, round);
  return o;
}

// dy [M, d]; aux_grad: upstream gradient of the v2 balance loss.
inline MoeRefGrads moe_ref_backward(const MoeRefShape& s, const MoeRefParams& p, const Vec& x,
                                    const MoeRefForward& fw, const Vec& dy, double aux_grad, bool round) {
  const int64_t M = s.M, d = s.d, E = s.E, k = s.k, f = s.f, R = M * k;
  MoeRefGrads g;
  g.gw1.assign(E * 2 * f * d, 0);
  g.gw2.assign(E * d * f, 0);
  Vec dys(R * d), dw(M * k), da(R * f), dh1(R * 2 * f), dxs(R * d), dxr(M * d);
  unpermute_backward_ref<double>(dy.data(), fw.ys.data(), fw.weight.data(), fw.row_of.data(), M, k, d, dys.data(),
                                 dw.data());
  dys = maybe_round(dys, round);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = fw.offsets[e], n = expert_rows(fw.offsets, e);
    gemm_nn(dys.data() + r0 * d, p.w2.data() + e * d * f, n, d, f, da.data() + r0 * f);
    gemm_tn_acc(dys.data() + r0 * d, fw.a.data() + r0 * f, n, d, f, g.gw2.data() + e * d * f);
  }
  da = maybe_round(da, round);
  swiglu_backward_f64(da.data(), fw.h1.data(), R, f, dh1.data());
  dh1 = maybe_round(dh1, round);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = fw.offsets[e], n = expert_rows(fw.offsets, e);
    gemm_nn(dh1.data() + r0 * 2 * f, p.w1.data() + e * 2 * f * d, n, 2 * f, d, dxs.data() + r0 * d);
    gemm_tn_acc(dh1.data() + r0 * 2 * f, fw.xs.data() + r0 * d, n, 2 * f, d, g.gw1.data() + e * 2 * f * d);
  }
  dxs = maybe_round(dxs, round);
  permute_backward_ref<double>(dxs.data(), fw.row_of.data(), M, k, d, dxr.data());
  dxr = maybe_round(dxr, round);

  g.dx = dxr;
  if (s.shared_f > 0) {
    const MlpRefGrads sg = mlp_ref_backward(x, p.ws1, p.ws2, fw.shared, dy, M, d, s.shared_f, round);
    for (int64_t i = 0; i < M * d; ++i) g.dx[i] += sg.dx[i];
    g.gws1 = sg.gw1;
    g.gws2 = sg.gw2;
  }
  Vec dlogits(M * E);
  router_backward_ref<double>(fw.probs.data(), fw.idx.data(), fw.counts.data(), dw.data(), M, E, s.router, aux_grad,
                              dlogits.data());
  dlogits = maybe_round(dlogits, round);
  Vec dxrt(M * d);
  gemm_nn(dlogits.data(), p.wr.data(), M, E, d, dxrt.data());
  g.gwr.assign(E * d, 0);
  gemm_tn_acc(dlogits.data(), x.data(), M, E, d, g.gwr.data());
  for (int64_t i = 0; i < M * d; ++i) g.dx[i] += dxrt[i];
  g.dx = maybe_round(g.dx, round);
  return g;
}

// ||a - b|| / ||b|| (0 when both are zero).
inline double relative_l2(const Vec& a, const Vec& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  if (a.size() != b.size()) return INFINITY;
  return den == 0 ? (num == 0 ? 0 : INFINITY) : std::sqrt(num / den);
}

}  // namespace fp4moe::test
