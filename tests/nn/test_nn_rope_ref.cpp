// CPU reference of decoupled RoPE (kernels/nn/rope.h): the interleaved pair convention on hand-computed rotations,
// the frequencies theta^(-2i/D), positions (offset, restart every seq_len), strided views inside a wider q tensor,
// the backward as the transpose of the forward (finite differences) and its inverse, and rejections.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/nn/rope.h"
#include "tests/common/nn_ref_test_util.h"

namespace fp4moe {
namespace {

using test::bf16_to_f64;
using test::to_bf16;
using test::to_f64;

RopeTensor dense_in(const std::vector<bf16>& v, int64_t H, int64_t D) { return {v.data(), H * D, D}; }
RopeTensorOut dense_out(std::vector<bf16>& v, int64_t H, int64_t D) { return {v.data(), H * D, D}; }

TEST(NnRefRope, InverseFrequencies) {
  EXPECT_EQ(rope_inv_freq(10000.0, 64, 0), 1.0f);
  EXPECT_EQ(rope_inv_freq(10000.0, 64, 16), static_cast<float>(0.01));  // 10000^(-32/64)
  EXPECT_EQ(rope_inv_freq(10000.0, 4, 1), static_cast<float>(0.01));
  EXPECT_EQ(rope_inv_freq(10000.0, 64, 31), static_cast<float>(std::pow(10000.0, -62.0 / 64)));
}

TEST(NnRefRope, InterleavedPairsRotateByPositionTimesFrequency) {
  // D = 4, H = 1, T = 3 positions 0, 1, 2. Row t: x = [1, 0, 0, 1]: pair 0 = (1, 0) turns by t rad,
  // pair 1 = (0, 1) by 0.01 t rad. A rotate-half convention would pair elements 0 and 2 instead.
  const int64_t T = 3, H = 1, D = 4;
  const auto x = to_bf16({1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1});
  std::vector<bf16> y(T * D);
  rope_ref(dense_in(x, H, D), T, H, D, RopeConfig{}, dense_out(y, H, D), false);
  for (int t = 0; t < T; ++t) {
    const double a0 = static_cast<float>(t) * 1.0f, a1 = static_cast<float>(t) * static_cast<float>(0.01);
    const double expected[4] = {std::cos(a0), std::sin(a0), -std::sin(a1), std::cos(a1)};
    for (int d = 0; d < 4; ++d)
      EXPECT_NEAR(bf16_to_f64(y[t * D + d]), expected[d], 1.0 / 256 + 1e-12) << "t=" << t << " d=" << d;
  }
  EXPECT_EQ(bf16_to_f64(y[0]), 1.0);  // position 0 is the identity
  EXPECT_EQ(bf16_to_f64(y[1]), 0.0);
}

TEST(NnRefRope, PositionOffsetAndSequenceRestart) {
  const int64_t T = 6, H = 2, D = 8;
  std::vector<double> row = test::normal_values(H * D, 21);
  std::vector<double> xd;
  for (int t = 0; t < T; ++t) xd.insert(xd.end(), row.begin(), row.end());  // the same token at every row
  const auto x = to_bf16(xd);
  std::vector<bf16> one_seq(T * H * D), two_seqs(T * H * D), offset(T * H * D);
  rope_ref(dense_in(x, H, D), T, H, D, RopeConfig{}, dense_out(one_seq, H, D), false);
  rope_ref(dense_in(x, H, D), T, H, D, RopeConfig{10000.0f, 0, 3}, dense_out(two_seqs, H, D), false);
  rope_ref(dense_in(x, H, D), T, H, D, RopeConfig{10000.0f, 2, 0}, dense_out(offset, H, D), false);
  for (int64_t i = 0; i < 3 * H * D; ++i) {
    EXPECT_EQ(bf16_bits(two_seqs[i]), bf16_bits(one_seq[i])) << i;             // first sequence: positions 0..2
    EXPECT_EQ(bf16_bits(two_seqs[3 * H * D + i]), bf16_bits(one_seq[i])) << i;  // second restarts at 0
  }
  for (int64_t i = 0; i < 4 * H * D; ++i) EXPECT_EQ(bf16_bits(offset[i]), bf16_bits(one_seq[2 * H * D + i])) << i;
}

TEST(NnRefRope, StridedViewOfTheRopePartOfQ) {
  // q [T, H, 192]: nope 128 | rope 64 per head. Rotating the view in place equals rotating a dense copy, and the
  // nope part is untouched.
  const int64_t T = 5, H = 3, D = 64, QK = 192;
  const auto q0 = to_bf16(test::normal_values(T * H * QK, 22));
  std::vector<bf16> q = q0, dense(T * H * D), rotated(T * H * D);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t d = 0; d < D; ++d) dense[(t * H + h) * D + d] = q0[(t * H + h) * QK + 128 + d];
  const RopeConfig cfg{10000.0f, 7, 0};
  rope_ref(dense_in(dense, H, D), T, H, D, cfg, dense_out(rotated, H, D), false);
  rope_ref(RopeTensor{q.data() + 128, H * QK, QK}, T, H, D, cfg, RopeTensorOut{q.data() + 128, H * QK, QK}, false);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t d = 0; d < QK; ++d) {
        const int64_t i = (t * H + h) * QK + d;
        const uint16_t expected = d < 128 ? bf16_bits(q0[i]) : bf16_bits(rotated[(t * H + h) * D + d - 128]);
        EXPECT_EQ(bf16_bits(q[i]), expected) << "t=" << t << " h=" << h << " d=" << d;
      }
}

TEST(NnRefRope, BackwardIsTheTransposeAndTheInverse) {
  const int64_t T = 4, H = 2, D = 6;
  const RopeConfig cfg{500.0f, 3, 0};
  std::vector<double> x = test::normal_values(T * H * D, 23);
  const std::vector<double> G = test::normal_values(T * H * D, 24);
  std::vector<double> y(T * H * D), dx(T * H * D), back(T * H * D);
  auto loss = [&] {
    rope_f64(x.data(), T, H, D, cfg, y.data(), false);
    return test::dot(y, G);
  };
  rope_f64(G.data(), T, H, D, cfg, dx.data(), true);
  test::expect_gradient_matches(dx, test::finite_difference_gradient(x, loss), "dx");
  rope_f64(x.data(), T, H, D, cfg, y.data(), false);
  rope_f64(y.data(), T, H, D, cfg, back.data(), true);
  for (int64_t i = 0; i < T * H * D; ++i) EXPECT_NEAR(back[i], x[i], 1e-12) << i;
}

TEST(NnRefRope, RejectsBadArguments) {
  std::vector<bf16> a(4096), b(4096);
  auto call = [&](int64_t T, int64_t H, int64_t D, RopeConfig cfg, int64_t ts, int64_t hs) {
    rope_ref(RopeTensor{a.data(), ts, hs}, T, H, D, cfg, RopeTensorOut{b.data(), ts, hs}, false);
  };
  test::expect_error_mentions([&] { call(2, 2, 7, {}, 14, 7); }, {"rope_forward_ref", "D must be even", "D=7"});
  test::expect_error_mentions([&] { call(2, 2, 0, {}, 14, 7); }, {"D must be >= 2"});
  test::expect_error_mentions([&] { call(2, 1, 258, {}, 258, 258); }, {"D=258 exceeds the supported 256"});
  test::expect_error_mentions([&] { call(2, 2, 8, {}, 16, 6); }, {"x.head_stride=6 is below D=8"});
  test::expect_error_mentions([&] { call(2, 2, 8, {}, 12, 8); }, {"x.token_stride=12 is below the 16 elements"});
  test::expect_error_mentions([&] { call(2, 2, 8, {}, 16, 9); }, {"strides must be even"});
  test::expect_error_mentions([&] { call(2, 2, 8, {1.0f, 0, 0}, 16, 8); }, {"theta must be finite and > 1"});
  test::expect_error_mentions([&] { call(2, 2, 8, {10000.0f, -1, 0}, 16, 8); }, {"position_offset must be >= 0"});
  test::expect_error_mentions([&] { call(2, 2, 8, {10000.0f, 0, -4}, 16, 8); }, {"seq_len must be >= 0"});
  test::expect_error_mentions([&] { call(2, 2, 8, {10000.0f, (1 << 24) - 1, 0}, 16, 8); }, {"below 2^24"});
  test::expect_error_mentions([&] { call(0, 0, 8, {}, 16, 8); }, {"H must be >= 1"});
  // GPU launchers: the same checks, plus pointers, before any CUDA call.
  test::expect_error_mentions(
      [] { rope_forward(RopeTensor{nullptr, 64, 64}, 2, 1, 64, {}, RopeTensorOut{nullptr, 64, 64}, nullptr); },
      {"rope_forward", "x is null"});
  const bf16* odd = reinterpret_cast<const bf16*>(uintptr_t{0x3002});
  test::expect_error_mentions(
      [&] { rope_backward(RopeTensor{odd, 64, 64}, 2, 1, 64, {}, RopeTensorOut{nullptr, 64, 64}, nullptr); },
      {"rope_backward", "y is null"});
  test::expect_error_mentions(
      [&] {
        rope_backward(RopeTensor{odd, 64, 64}, 2, 1, 64, {}, RopeTensorOut{const_cast<bf16*>(odd), 64, 64}, nullptr);
      },
      {"rope_backward", "x must be 4-byte aligned"});
}

}  // namespace
}  // namespace fp4moe
