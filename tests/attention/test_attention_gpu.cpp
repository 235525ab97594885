// GPU causal flash attention (kernels/attention/flash_attention.h) against the FP64 CPU reference on the same BF16
// inputs: forward (O, lse) and backward (dQ, dK, dV, from the kernel's own O and lse) through the public functions,
// every instantiated (Dqk, Dv) pair at (B, T, H) = (1, 1, 1), (2, 37, 3), (1, 128, 2), (2, 200, 4), (2, 100, 9),
// plus (1, 1024, 2) for (192, 128). The pairs cover both kernel families of attention_heuristics.h: Dqk < 128 runs
// the key64 forward and the column_split backward, Dqk >= 128 the key32 forward and the role_split backward (whose
// head-grouped block order (2, 100, 9) exercises with 18 sequence-heads: three groups, the last one partial).
// Inputs N(0, 1) (seeded); the large-score case adds 150 / scale on dim 0 of every query and 1 (keys from token 64
// on) or 2/3 (earlier keys) on dim 0 of the keys: scores around 100 and 150 (e^150 overflows FP32, so the running
// max must be subtracted), and a jump of 50 in the row max between key blocks (the rescaling of the online softmax).
// Strided views: q and dq inside [B*T, H, Dqk + 8] buffers (head stride Dqk + 8), v and dk at an offset of 8
// elements with token stride H * D + 16, o inside [B*T, H, Dv + 8]; they must give the same bits as dense tensors,
// and the elements between them must stay untouched. Every output buffer (and the backward workspace) is
// NaN-poisoned before each run, with poisoned guards on both sides.
// Tolerances, relative L2 per tensor: O < 1e-2 (BF16 rounding of P and O), dQ, dK, dV < 2e-2 (BF16 rounding of P
// and dS, D from the BF16 O); the reference norm is floored at an RMS of 1e-3 (T = 1 has dQ = dK = 0 exactly).
// lse: |error| <= 1e-4 max(1, |lse|) (FP32 scores). Forward and backward run twice and must give the same bits (no
// atomics), and backward again three times on shapes with many more thread blocks than SMs.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "tests/common/nn_test_util.h"
#include "kernels/attention/attention_heuristics.h"
#include "kernels/attention/flash_attention.h"

namespace fp4moe {
namespace {

using test::Guarded;
using test::value_of;

constexpr double kOutTol = 1e-2, kGradTol = 2e-2, kLseTol = 1e-4, kRmsFloor = 1e-3;
constexpr int kPairs[][2] = {{32, 16}, {32, 32}, {64, 64}, {96, 64}, {128, 128}, {192, 128}, {192, 192}};

struct Btth {
  int64_t B, T, H;
};
// (2, 100, 9): 18 sequence-heads, three groups of the head-grouped block order (the last one partial).
constexpr Btth kShapes[] = {{1, 1, 1}, {2, 37, 3}, {1, 128, 2}, {2, 200, 4}, {2, 100, 9}};

// Where a [rows, H, D] tensor lies in its buffer: element (r, h, d) at offset + r * ts + h * hs + d.
struct Layout {
  int64_t rows, H, D, ts, hs, offset;
  int64_t at(int64_t r, int64_t h, int64_t d) const { return offset + r * ts + h * hs + d; }
  int64_t elements() const { return at(rows - 1, H - 1, D); }
};
Layout dense(int64_t rows, int64_t H, int64_t D) { return {rows, H, D, H * D, D, 0}; }
Layout wide_heads(int64_t rows, int64_t H, int64_t D) { return {rows, H, D, H * (D + 8), D + 8, 0}; }
Layout shifted(int64_t rows, int64_t H, int64_t D) { return {rows, H, D, H * D + 16, D, 8}; }

// A device tensor in its layout: a guarded buffer, NaN everywhere the tensor does not cover.
struct DevTensor {
  Layout L;
  Guarded<bf16> buf;
  explicit DevTensor(const Layout& l) : L(l), buf(static_cast<size_t>(l.elements())) {}
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

std::vector<double> to_f64(const std::vector<bf16>& v) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = value_of(v[i]);
  return out;
}

// ||gpu - ref|| / max(||ref||, kRmsFloor sqrt(n)); NaN anywhere gives +inf.
double rel_l2(const std::vector<bf16>& gpu, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double e = value_of(gpu[i]) - ref[i];
    num += e * e;
    den += ref[i] * ref[i];
  }
  if (!std::isfinite(num)) return INFINITY;
  return std::sqrt(num / std::max(den, kRmsFloor * kRmsFloor * static_cast<double>(ref.size())));
}

std::vector<uint16_t> bits_of(const std::vector<bf16>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = bf16_bits(v[i]);
  return b;
}

// The kernels the public functions run for (Dqk, Dv) (attention_heuristics.h), for traces.
std::string kernels_of(int Dqk, int Dv) {
  const bool key32 = attn::forward_kernel_for(Dqk, Dv) == attn::FwdKernel::key32;
  const bool role_split = attn::backward_kernels_for(Dqk, Dv) == attn::BwdKernels::role_split;
  return fmt::format("forward {}, backward {}", key32 ? "key32" : "key64", role_split ? "role_split" : "column_split");
}

struct Case {
  int Dqk, Dv;
  Btth shape;
  bool strided = false, large_scores = false;
  std::string name() const {
    return fmt::format("(Dqk, Dv) = ({}, {}), B={} T={} H={}{}{} [{}]", Dqk, Dv, shape.B, shape.T, shape.H,
                       strided ? ", strided" : "", large_scores ? ", large scores" : "", kernels_of(Dqk, Dv));
  }
};

// Output bits of a forward and backward.
struct Outputs {
  std::vector<uint16_t> o, dq, dk, dv;
  std::vector<uint32_t> lse;
};

std::vector<uint32_t> f32_bits_of(const std::vector<float>& v) {
  std::vector<uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

// Forward and backward of one case on the GPU through the public functions, checked against the reference, each run
// twice (the same bits both times); returns the bits.
Outputs run_and_check(const Case& c) {
  SCOPED_TRACE(c.name());
  const int64_t B = c.shape.B, T = c.shape.T, H = c.shape.H;
  const int64_t rows = B * T;
  const AttentionShape s{B, T, H, c.Dqk, c.Dv, static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.Dqk)))};
  const uint32_t seed = static_cast<uint32_t>(1000 * c.Dqk + 10 * c.Dv + T + 7 * B + H);
  std::vector<bf16> q = test::random_bf16(rows * H * c.Dqk, seed), k = test::random_bf16(rows * H * c.Dqk, seed + 1);
  const std::vector<bf16> v = test::random_bf16(rows * H * c.Dv, seed + 2);
  const std::vector<bf16> dout = test::random_bf16(rows * H * c.Dv, seed + 3);
  if (c.large_scores) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t h = 0; h < H; ++h) {
        q[(r * H + h) * c.Dqk] = bf16_from_bits(f32_to_bf16_bits(static_cast<float>(150.0 / s.scale)));
        k[(r * H + h) * c.Dqk] = bf16_from_bits(f32_to_bf16_bits(r % T >= 64 ? 1.0f : 2.0f / 3.0f));
      }
  }

  // The layout of a tensor: dense, or `when_strided` in the strided case.
  const auto lay = [&](int64_t D, Layout (*when_strided)(int64_t, int64_t, int64_t)) {
    return c.strided ? when_strided(rows, H, D) : dense(rows, H, D);
  };
  DevTensor q_d(lay(c.Dqk, wide_heads)), k_d(lay(c.Dqk, dense)), v_d(lay(c.Dv, shifted)), dout_d(lay(c.Dv, dense));
  DevTensor o_d(lay(c.Dv, wide_heads)), dq_d(lay(c.Dqk, wide_heads)), dk_d(lay(c.Dqk, shifted)), dv_d(lay(c.Dv, dense));
  Guarded<float> lse_d(static_cast<size_t>(B * H * T));
  test::DeviceBuffer<unsigned char> ws(static_cast<size_t>(flash_attention_backward_workspace_bytes(s)));
  q_d.upload(q);
  k_d.upload(k);
  v_d.upload(v);
  dout_d.upload(dout);

  const std::vector<double> qr = to_f64(q), kr = to_f64(k), vr = to_f64(v), gr = to_f64(dout);
  std::vector<double> o_ref(vr.size()), lse_ref(static_cast<size_t>(B * H * T)), dq_ref(qr.size()),
      dk_ref(kr.size()), dv_ref(vr.size());
  attention_forward_ref<double>(s, qr.data(), kr.data(), vr.data(), o_ref.data(), lse_ref.data());
  attention_backward_ref<double>(s, qr.data(), kr.data(), vr.data(), gr.data(), dq_ref.data(), dk_ref.data(),
                                 dv_ref.data());
  const auto inputs_untouched = [&] {
    for (DevTensor* t : {&q_d, &k_d, &v_d, &dout_d})
      EXPECT_TRUE(t->untouched_outside()) << "a kernel wrote into an input or outside its elements";
  };

  Outputs out;
  const auto forward = [&] {
    o_d.buf.poison();
    lse_d.poison();
    flash_attention_forward(s, q_d.in(), k_d.in(), v_d.in(), o_d.out(), lse_d.ptr(), nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
  };
  forward();
  const std::vector<bf16> o = o_d.download();
  const std::vector<float> lse = lse_d.download();
  EXPECT_LT(rel_l2(o, o_ref), kOutTol) << "O";
  size_t bad_lse = 0;
  for (size_t i = 0; i < lse.size(); ++i)
    if (!(std::fabs(lse[i] - lse_ref[i]) <= kLseTol * std::max(1.0, std::fabs(lse_ref[i]))) && bad_lse++ < 3)
      ADD_FAILURE() << "lse[" << i << "] = " << lse[i] << ", reference " << lse_ref[i];
  EXPECT_EQ(bad_lse, 0u) << "lse elements out of tolerance";
  EXPECT_TRUE(o_d.untouched_outside()) << "the forward wrote outside O's elements";
  EXPECT_TRUE(lse_d.guards_intact()) << "lse guard";
  inputs_untouched();
  out.o = bits_of(o);
  out.lse = f32_bits_of(lse);
  forward();
  EXPECT_EQ(bits_of(o_d.download()), out.o) << "O differs between two identical forward runs";
  EXPECT_EQ(f32_bits_of(lse_d.download()), out.lse) << "lse differs between two identical forward runs";

  // Backward on the O and lse of the forward (the same bits both times).
  const auto backward = [&] {
    for (DevTensor* t : {&dq_d, &dk_d, &dv_d}) t->buf.poison();
    ws.poison(test::kNanPoison);
    flash_attention_backward(s, q_d.in(), k_d.in(), v_d.in(), o_d.in(), dout_d.in(), lse_d.ptr(), dq_d.out(),
                             dk_d.out(), dv_d.out(), ws.ptr, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
  };
  backward();
  const std::vector<bf16> dq = dq_d.download(), dk = dk_d.download(), dv = dv_d.download();
  EXPECT_LT(rel_l2(dq, dq_ref), kGradTol) << "dQ";
  EXPECT_LT(rel_l2(dk, dk_ref), kGradTol) << "dK";
  EXPECT_LT(rel_l2(dv, dv_ref), kGradTol) << "dV";
  for (DevTensor* t : {&o_d, &dq_d, &dk_d, &dv_d})
    EXPECT_TRUE(t->untouched_outside()) << "a kernel wrote outside a tensor's elements (or into O)";
  EXPECT_TRUE(lse_d.guards_intact()) << "lse guard";
  inputs_untouched();
  out.dq = bits_of(dq);
  out.dk = bits_of(dk);
  out.dv = bits_of(dv);
  backward();
  EXPECT_EQ(bits_of(dq_d.download()), out.dq) << "dQ differs between two identical backward runs";
  EXPECT_EQ(bits_of(dk_d.download()), out.dk) << "dK differs between two identical backward runs";
  EXPECT_EQ(bits_of(dv_d.download()), out.dv) << "dV differs between two identical backward runs";
  return out;
}

TEST(AttentionGpu, ForwardBackwardMatchReference) {
  FP4MOE_REQUIRE_DEVICE();
  for (const auto& p : kPairs)
    for (const Btth& shape : kShapes) run_and_check({p[0], p[1], shape});
  run_and_check({192, 128, {1, 1024, 2}});
}

TEST(AttentionGpu, LargeScoresUseTheOnlineMax) {
  FP4MOE_REQUIRE_DEVICE();
  for (const auto& p : kPairs) {
    run_and_check({p[0], p[1], {1, 128, 2}, false, true});
    run_and_check({p[0], p[1], {2, 200, 4}, false, true});
  }
}

TEST(AttentionGpu, StridedViewsGiveTheSameBitsAsDenseTensors) {
  FP4MOE_REQUIRE_DEVICE();
  for (const auto& p : kPairs)
    for (const Btth& shape : {Btth{2, 37, 3}, Btth{1, 128, 2}}) {
      SCOPED_TRACE(fmt::format("({}, {}) T={}", p[0], p[1], shape.T));
      const Outputs a = run_and_check({p[0], p[1], shape, false});
      const Outputs b = run_and_check({p[0], p[1], shape, true});
      EXPECT_EQ(a.o, b.o) << "O";
      EXPECT_EQ(a.lse, b.lse) << "lse";
      EXPECT_EQ(a.dq, b.dq) << "dQ";
      EXPECT_EQ(a.dk, b.dk) << "dK";
      EXPECT_EQ(a.dv, b.dv) << "dV";
    }
}

// Backward on more thread blocks than the GPU runs at once (48 sequence-heads x 24 key blocks at (192, 128), the
// role_split kernels in the head-grouped order; 192 x 6 at (32, 16), the column_split kernels): every output written
// (finite, nothing outside the tensors) and the same bits over three runs.
TEST(AttentionGpu, BackwardIsDeterministicWithManyBlocksInFlight) {
  FP4MOE_REQUIRE_DEVICE();
  for (const Case& c : {Case{192, 128, {2, 1536, 24}}, Case{32, 16, {2, 333, 96}}}) {
    SCOPED_TRACE(c.name());
    const int64_t B = c.shape.B, T = c.shape.T, H = c.shape.H, rows = B * T;
    const AttentionShape s{B, T, H, c.Dqk, c.Dv, static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.Dqk)))};
    DevTensor q_d(dense(rows, H, c.Dqk)), k_d(dense(rows, H, c.Dqk)), v_d(dense(rows, H, c.Dv));
    DevTensor dout_d(dense(rows, H, c.Dv)), o_d(dense(rows, H, c.Dv));
    DevTensor dq_d(dense(rows, H, c.Dqk)), dk_d(dense(rows, H, c.Dqk)), dv_d(dense(rows, H, c.Dv));
    Guarded<float> lse_d(static_cast<size_t>(B * H * T));
    test::DeviceBuffer<unsigned char> ws(static_cast<size_t>(flash_attention_backward_workspace_bytes(s)));
    q_d.upload(test::random_bf16(rows * H * c.Dqk, 71));
    k_d.upload(test::random_bf16(rows * H * c.Dqk, 72));
    v_d.upload(test::random_bf16(rows * H * c.Dv, 73));
    dout_d.upload(test::random_bf16(rows * H * c.Dv, 74));
    flash_attention_forward(s, q_d.in(), k_d.in(), v_d.in(), o_d.out(), lse_d.ptr(), nullptr);
    const auto backward = [&] {
      for (DevTensor* t : {&dq_d, &dk_d, &dv_d}) t->buf.poison();
      ws.poison(test::kNanPoison);
      flash_attention_backward(s, q_d.in(), k_d.in(), v_d.in(), o_d.in(), dout_d.in(), lse_d.ptr(), dq_d.out(),
                               dk_d.out(), dv_d.out(), ws.ptr, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      return Outputs{{}, bits_of(dq_d.download()), bits_of(dk_d.download()), bits_of(dv_d.download()), {}};
    };
    const Outputs first = backward();
    for (const auto* bits : {&first.dq, &first.dk, &first.dv}) {
      size_t nonfinite = 0;
      for (uint16_t b : *bits) nonfinite += (b & 0x7F80) == 0x7F80;  // BF16 exponent all ones: Inf or NaN
      EXPECT_EQ(nonfinite, 0u) << "NaN/Inf (unwritten) elements in a gradient";
    }
    for (int run = 0; run < 2; ++run) {
      const Outputs again = backward();
      EXPECT_EQ(again.dq, first.dq) << "dQ differs between identical runs";
      EXPECT_EQ(again.dk, first.dk) << "dK differs between identical runs";
      EXPECT_EQ(again.dv, first.dv) << "dV differs between identical runs";
    }
    for (DevTensor* t : {&dq_d, &dk_d, &dv_d}) EXPECT_TRUE(t->untouched_outside()) << "a write outside the tensor";
  }
}

TEST(AttentionGpu, BadInputsAreRejectedBeforeAnyLaunch) {
  FP4MOE_REQUIRE_DEVICE();
  const int64_t B = 1, T = 16, H = 2, Dqk = 96, Dv = 64;
  const AttentionShape s{B, T, H, Dqk, Dv, 0.1f};
  DevTensor q(dense(B * T, H, Dqk)), k(dense(B * T, H, Dqk)), v(dense(B * T, H, Dv)), o(dense(B * T, H, Dv));
  Guarded<float> lse(static_cast<size_t>(B * H * T));
  const auto expect_rejected = [&](const AttentionShape& shape, AttnIn qi, AttnIn vi, float* l,
                                   std::initializer_list<const char*> parts) {
    try {
      flash_attention_forward(shape, qi, k.in(), vi, o.out(), l, nullptr);
      ADD_FAILURE() << "expected fp4moe::Error mentioning " << *parts.begin();
    } catch (const Error& e) {
      for (const char* part : parts) EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  AttentionShape unsupported = s;
  unsupported.Dqk = 100;
  expect_rejected(unsupported, q.in(), v.in(), lse.ptr(), {"(100,64)", "(96,64)", "(192,128)"});
  AttnIn bad_stride = q.in();
  bad_stride.token_stride += 4;
  expect_rejected(s, bad_stride, v.in(), lse.ptr(), {"q.token_stride", "multiple of 8"});
  AttnIn bad_pointer = v.in();
  bad_pointer.data += 1;
  expect_rejected(s, q.in(), bad_pointer, lse.ptr(), {"v.data", "16-byte aligned"});
  expect_rejected(s, q.in(), v.in(), nullptr, {"lse is null"});
  AttentionShape empty = s;
  empty.T = 0;
  EXPECT_NO_THROW(flash_attention_forward(empty, q.in(), k.in(), v.in(), o.out(), lse.ptr(), nullptr));
  CUDA_CHECK(cudaDeviceSynchronize());
  for (bf16 x : o.buf.download()) ASSERT_EQ(bf16_bits(x), 0xFFFF) << "a rejected or empty call wrote the output";
  for (float x : lse.download()) ASSERT_TRUE(std::isnan(x)) << "a rejected or empty call wrote lse";
}

}  // namespace
}  // namespace fp4moe
