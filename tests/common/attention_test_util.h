// Helpers of the attention core's GPU tests (tests/attention/test_attention_gpu.cpp: our kernels,
// test_cudnn_sdpa_gpu.cpp: the cuDNN backend, test_attention_core_gpu.cpp: the choice between them), one code for
// both backends: tensors in dense or strided layouts inside NaN-poisoned buffers, the FP64 CPU reference
// (kernels/attention/attention_ref.cpp) and the tolerances flash_attention.h states, a forward + backward check
// against it, the repeatability check of a backward, and the first statement of the cuDNN backend's tests
// (FP4MOE_REQUIRE_CUDNN).
//
// Tolerances, relative L2 per tensor: O < 1e-2 (BF16 rounding of P and O), dQ, dK, dV < 2e-2 (BF16 rounding of P
// and dS, D from the BF16 O); the reference norm is floored at an RMS of 1e-3 (T = 1 has dQ = dK = 0 exactly).
// lse: |error| <= 1e-4 max(1, |lse|) (FP32 scores).
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "kernels/attention/cudnn_sdpa.h"
#include "kernels/attention/flash_attention.h"
#include "tests/common/nn_test_util.h"

namespace fp4moe::test {

constexpr double kAttnOutTol = 1e-2, kAttnGradTol = 2e-2, kAttnLseTol = 1e-4, kAttnRmsFloor = 1e-3;

// Where a [rows, H, D] tensor lies in its buffer: element (r, h, d) at offset + r * ts + h * hs + d.
struct AttnLayout {
  int64_t rows, H, D, ts, hs, offset;
  int64_t at(int64_t r, int64_t h, int64_t d) const { return offset + r * ts + h * hs + d; }
  int64_t elements() const { return at(rows - 1, H - 1, D); }
};
inline AttnLayout dense_layout(int64_t rows, int64_t H, int64_t D) { return {rows, H, D, H * D, D, 0}; }
// Heads 8 elements apart (the nope/rope or k/v slices of a wider projection output).
inline AttnLayout wide_heads(int64_t rows, int64_t H, int64_t D) { return {rows, H, D, H * (D + 8), D + 8, 0}; }
// 8 elements in, tokens 16 elements apart beyond the heads.
inline AttnLayout shifted(int64_t rows, int64_t H, int64_t D) { return {rows, H, D, H * D + 16, D, 8}; }

// A device tensor in its layout: a guarded buffer, NaN everywhere the tensor does not cover.
struct AttnDevTensor {
  AttnLayout L;
  Guarded<bf16> buf;
  explicit AttnDevTensor(const AttnLayout& l) : L(l), buf(static_cast<size_t>(l.elements())) {}
  void upload(const std::vector<bf16>& values) {  // values dense [rows, H, D]
    std::vector<bf16> h(static_cast<size_t>(L.elements()), bf16_from_bits(0xFFFF));
    for (int64_t r = 0; r < L.rows; ++r)
      for (int64_t hh = 0; hh < L.H; ++hh)
        for (int64_t d = 0; d < L.D; ++d) h[L.at(r, hh, d)] = values[(r * L.H + hh) * L.D + d];
    buf.upload(h);
  }
  std::vector<bf16> download() {  // dense [rows, H, D]
    const std::vector<bf16> h = buf.download();
    std::vector<bf16> v(static_cast<size_t>(L.rows * L.H * L.D));
    for (int64_t r = 0; r < L.rows; ++r)
      for (int64_t hh = 0; hh < L.H; ++hh)
        for (int64_t d = 0; d < L.D; ++d) v[(r * L.H + hh) * L.D + d] = h[L.at(r, hh, d)];
    return v;
  }
  // The elements between the tensor's rows and heads still hold the poison, and so do the guards.
  bool untouched_outside() {
    const std::vector<bf16> h = buf.download();
    std::vector<char> inside(h.size(), 0);
    for (int64_t r = 0; r < L.rows; ++r)
      for (int64_t hh = 0; hh < L.H; ++hh) std::fill_n(inside.begin() + L.at(r, hh, 0), L.D, 1);
    for (size_t i = 0; i < h.size(); ++i)
      if (!inside[i] && bf16_bits(h[i]) != 0xFFFF) return false;
    return buf.guards_intact();
  }
  AttnIn in() { return {buf.ptr() + L.offset, L.ts, L.hs}; }
  AttnOut out() { return {buf.ptr() + L.offset, L.ts, L.hs}; }
};

inline std::vector<double> to_f64(const std::vector<bf16>& v) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = value_of(v[i]);
  return out;
}

// ||gpu - ref|| / max(||ref||, kAttnRmsFloor sqrt(n)); NaN anywhere gives +inf.
inline double attn_rel_l2(const std::vector<bf16>& gpu, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double e = value_of(gpu[i]) - ref[i];
    num += e * e;
    den += ref[i] * ref[i];
  }
  if (!std::isfinite(num)) return INFINITY;
  return std::sqrt(num / std::max(den, kAttnRmsFloor * kAttnRmsFloor * static_cast<double>(ref.size())));
}

// Elements of lse outside |lse - ref| <= kAttnLseTol max(1, |ref|) (NaN counts), the first three reported.
inline size_t count_lse_errors(const std::vector<float>& lse, const std::vector<double>& ref) {
  size_t bad = 0;
  for (size_t i = 0; i < lse.size(); ++i)
    if (!(std::fabs(lse[i] - ref[i]) <= kAttnLseTol * std::max(1.0, std::fabs(ref[i]))) && bad++ < 3)
      ADD_FAILURE() << "lse[" << i << "] = " << lse[i] << ", reference " << ref[i];
  return bad;
}

inline std::vector<uint16_t> bits_of(const std::vector<bf16>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = bf16_bits(v[i]);
  return b;
}

inline std::vector<uint32_t> f32_bits_of(const std::vector<float>& v) {
  std::vector<uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

// One implementation of the attention core under test (flash_attention.h's contract). Both calls are synchronous;
// backward brings and poisons its own workspace.
struct AttentionImpl {
  std::string name;
  std::function<void(const AttentionShape&, AttnIn q, AttnIn k, AttnIn v, AttnOut o, float* lse)> forward;
  std::function<void(const AttentionShape&, AttnIn q, AttnIn k, AttnIn v, AttnIn o, AttnIn dout, const float* lse,
                     AttnOut dq, AttnOut dk, AttnOut dv)>
      backward;
  bool deterministic_backward = true;  // the same bits on every run of the same backward
};

struct AttnCase {
  int Dqk, Dv;
  int64_t B, T, H;
  bool strided = false, large_scores = false;
  AttentionShape shape() const {
    return {B, T, H, Dqk, Dv, static_cast<float>(1.0 / std::sqrt(static_cast<double>(Dqk)))};
  }
  std::string name() const {
    return fmt::format("(Dqk, Dv) = ({}, {}), B={} T={} H={}{}{}", Dqk, Dv, B, T, H, strided ? ", strided" : "",
                       large_scores ? ", large scores" : "");
  }
};

// Output bits of a forward and backward.
struct AttnOutputs {
  std::vector<uint16_t> o, dq, dk, dv;
  std::vector<uint32_t> lse;
};

// The inputs of a case, N(0, 1) (seeded by the shape); with large_scores, 150 / scale on dim 0 of every query and 1
// (keys from token 64 on) or 2/3 (earlier keys) on dim 0 of the keys: scores around 100 and 150 (e^150 overflows
// FP32, so the running max must be subtracted), and a jump of 50 in the row max between key blocks.
struct AttnInputs {
  std::vector<bf16> q, k, v, dout;
  explicit AttnInputs(const AttnCase& c) {
    const int64_t rows = c.B * c.T, H = c.H;
    const uint32_t seed = static_cast<uint32_t>(1000 * c.Dqk + 10 * c.Dv + c.T + 7 * c.B + H);
    q = random_bf16(rows * H * c.Dqk, seed);
    k = random_bf16(rows * H * c.Dqk, seed + 1);
    v = random_bf16(rows * H * c.Dv, seed + 2);
    dout = random_bf16(rows * H * c.Dv, seed + 3);
    if (!c.large_scores) return;
    const float scale = c.shape().scale;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t h = 0; h < H; ++h) {
        q[(r * H + h) * c.Dqk] = bf16_from_bits(f32_to_bf16_bits(static_cast<float>(150.0 / scale)));
        k[(r * H + h) * c.Dqk] = bf16_from_bits(f32_to_bf16_bits(r % c.T >= 64 ? 1.0f : 2.0f / 3.0f));
      }
  }
};

// Forward and backward of one case through `impl`, checked against the FP64 reference: outputs poisoned before each
// run (guards and the gaps of strided layouts too: nothing written outside the tensors, inputs untouched); q and dq
// inside [B*T, H, Dqk + 8] buffers, v and dk shifted by 8 with token stride H * D + 16, o inside [B*T, H, Dv + 8]
// when strided. Forward runs twice and must give the same bits; so must backward when impl.deterministic_backward.
// Returns the bits of the first runs.
inline AttnOutputs run_and_check(const AttnCase& c, const AttentionImpl& impl) {
  SCOPED_TRACE(c.name() + " [" + impl.name + "]");
  const int64_t rows = c.B * c.T, H = c.H;
  const AttentionShape s = c.shape();
  const AttnInputs in(c);
  const auto lay = [&](int64_t D, AttnLayout (*when_strided)(int64_t, int64_t, int64_t)) {
    return c.strided ? when_strided(rows, H, D) : dense_layout(rows, H, D);
  };
  AttnDevTensor q_d(lay(c.Dqk, wide_heads)), k_d(lay(c.Dqk, dense_layout)), v_d(lay(c.Dv, shifted));
  AttnDevTensor dout_d(lay(c.Dv, dense_layout)), o_d(lay(c.Dv, wide_heads)), dq_d(lay(c.Dqk, wide_heads));
  AttnDevTensor dk_d(lay(c.Dqk, shifted)), dv_d(lay(c.Dv, dense_layout));
  Guarded<float> lse_d(static_cast<size_t>(c.B * H * c.T));
  q_d.upload(in.q);
  k_d.upload(in.k);
  v_d.upload(in.v);
  dout_d.upload(in.dout);

  const std::vector<double> qr = to_f64(in.q), kr = to_f64(in.k), vr = to_f64(in.v), gr = to_f64(in.dout);
  std::vector<double> o_ref(vr.size()), lse_ref(static_cast<size_t>(c.B * H * c.T)), dq_ref(qr.size()),
      dk_ref(kr.size()), dv_ref(vr.size());
  attention_forward_ref<double>(s, qr.data(), kr.data(), vr.data(), o_ref.data(), lse_ref.data());
  attention_backward_ref<double>(s, qr.data(), kr.data(), vr.data(), gr.data(), dq_ref.data(), dk_ref.data(),
                                 dv_ref.data());
  const auto inputs_untouched = [&] {
    for (AttnDevTensor* t : {&q_d, &k_d, &v_d, &dout_d})
      EXPECT_TRUE(t->untouched_outside()) << "a kernel wrote into an input or outside its elements";
  };

  AttnOutputs out;
  const auto forward = [&] {
    o_d.buf.poison();
    lse_d.poison();
    impl.forward(s, q_d.in(), k_d.in(), v_d.in(), o_d.out(), lse_d.ptr());
  };
  forward();
  const std::vector<bf16> o = o_d.download();
  const std::vector<float> lse = lse_d.download();
  EXPECT_LT(attn_rel_l2(o, o_ref), kAttnOutTol) << "O";
  EXPECT_EQ(count_lse_errors(lse, lse_ref), 0u) << "lse elements out of tolerance";
  EXPECT_TRUE(o_d.untouched_outside()) << "the forward wrote outside O's elements";
  EXPECT_TRUE(lse_d.guards_intact()) << "lse guard";
  inputs_untouched();
  out.o = bits_of(o);
  out.lse = f32_bits_of(lse);
  forward();
  EXPECT_EQ(bits_of(o_d.download()), out.o) << "O differs between two identical forward runs";
  EXPECT_EQ(f32_bits_of(lse_d.download()), out.lse) << "lse differs between two identical forward runs";

  // Backward on the O and lse of the forward.
  const auto backward = [&] {
    for (AttnDevTensor* t : {&dq_d, &dk_d, &dv_d}) t->buf.poison();
    impl.backward(s, q_d.in(), k_d.in(), v_d.in(), o_d.in(), dout_d.in(), lse_d.ptr(), dq_d.out(), dk_d.out(),
                  dv_d.out());
  };
  backward();
  const std::vector<bf16> dq = dq_d.download(), dk = dk_d.download(), dv = dv_d.download();
  EXPECT_LT(attn_rel_l2(dq, dq_ref), kAttnGradTol) << "dQ";
  EXPECT_LT(attn_rel_l2(dk, dk_ref), kAttnGradTol) << "dK";
  EXPECT_LT(attn_rel_l2(dv, dv_ref), kAttnGradTol) << "dV";
  for (AttnDevTensor* t : {&o_d, &dq_d, &dk_d, &dv_d})
    EXPECT_TRUE(t->untouched_outside()) << "a kernel wrote outside a tensor's elements (or into O)";
  EXPECT_TRUE(lse_d.guards_intact()) << "lse guard";
  inputs_untouched();
  out.dq = bits_of(dq);
  out.dk = bits_of(dk);
  out.dv = bits_of(dv);
  if (impl.deterministic_backward) {
    backward();
    EXPECT_EQ(bits_of(dq_d.download()), out.dq) << "dQ differs between two identical backward runs";
    EXPECT_EQ(bits_of(dk_d.download()), out.dk) << "dK differs between two identical backward runs";
    EXPECT_EQ(bits_of(dv_d.download()), out.dv) << "dV differs between two identical backward runs";
  }
  return out;
}

// Backward through `impl` on a shape with many more thread blocks than SMs (dense tensors, forward's own O and lse):
// every gradient written (finite, nothing outside the tensors) and, when impl.deterministic_backward, the same bits
// over three runs.
inline void check_backward_repeatable(const AttnCase& c, const AttentionImpl& impl) {
  SCOPED_TRACE(c.name() + " [" + impl.name + "]");
  const int64_t rows = c.B * c.T, H = c.H;
  const AttentionShape s = c.shape();
  AttnDevTensor q_d(dense_layout(rows, H, c.Dqk)), k_d(dense_layout(rows, H, c.Dqk)), v_d(dense_layout(rows, H, c.Dv));
  AttnDevTensor dout_d(dense_layout(rows, H, c.Dv)), o_d(dense_layout(rows, H, c.Dv));
  AttnDevTensor dq_d(dense_layout(rows, H, c.Dqk)), dk_d(dense_layout(rows, H, c.Dqk)), dv_d(dense_layout(rows, H, c.Dv));
  Guarded<float> lse_d(static_cast<size_t>(c.B * H * c.T));
  const AttnInputs in(c);
  q_d.upload(in.q);
  k_d.upload(in.k);
  v_d.upload(in.v);
  dout_d.upload(in.dout);
  impl.forward(s, q_d.in(), k_d.in(), v_d.in(), o_d.out(), lse_d.ptr());
  const auto backward = [&] {
    for (AttnDevTensor* t : {&dq_d, &dk_d, &dv_d}) t->buf.poison();
    impl.backward(s, q_d.in(), k_d.in(), v_d.in(), o_d.in(), dout_d.in(), lse_d.ptr(), dq_d.out(), dk_d.out(),
                  dv_d.out());
    return AttnOutputs{{}, bits_of(dq_d.download()), bits_of(dk_d.download()), bits_of(dv_d.download()), {}};
  };
  const AttnOutputs first = backward();
  for (const auto* bits : {&first.dq, &first.dk, &first.dv}) {
    size_t nonfinite = 0;
    for (uint16_t b : *bits) nonfinite += (b & 0x7F80) == 0x7F80;  // BF16 exponent all ones: Inf or NaN
    EXPECT_EQ(nonfinite, 0u) << "NaN/Inf (unwritten) elements in a gradient";
  }
  for (int run = 0; run < 2 && impl.deterministic_backward; ++run) {
    const AttnOutputs again = backward();
    EXPECT_EQ(again.dq, first.dq) << "dQ differs between identical runs";
    EXPECT_EQ(again.dk, first.dk) << "dK differs between identical runs";
    EXPECT_EQ(again.dv, first.dv) << "dV differs between identical runs";
  }
  for (AttnDevTensor* t : {&dq_d, &dk_d, &dv_d}) EXPECT_TRUE(t->untouched_outside()) << "a write outside the tensor";
}

}  // namespace fp4moe::test

// First statement of a test of the cuDNN backend: a usable device and a build with cuDNN, else the test skips with
// the reason.
#define FP4MOE_REQUIRE_CUDNN()                                                                \
  do {                                                                                        \
    FP4MOE_REQUIRE_DEVICE();                                                                  \
    if (!::fp4moe::cudnn_sdpa_built()) GTEST_SKIP() << ::fp4moe::cudnn_sdpa_version_text();   \
  } while (0)
