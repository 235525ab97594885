// CPU reference of the grouped expert GEMMs (kernels/gemm/grouped_gemm_ref.h): hand-computed values, the adjoint
// identities that tie Fprop, Dgrad and Wgrad together, row sampling, empty groups and argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/gemm/grouped_gemm_ref.h"

namespace fp4moe {
namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

TEST(GroupedGemmRef, HandComputedThreeGroupsWithAnEmptyOne) {
  // Groups: rows {0, 1} -> expert 0, no rows -> expert 1, row {2} -> expert 2. N = 2, K = 3.
  const int32_t offsets[] = {0, 2, 2, 3};
  const std::vector<float> x = {1, 2, 3,   //
                                -1, 0, 2,  //
                                4, -2, 1};
  const std::vector<float> w = {1, 0, 0, 0, 1, 1,     // expert 0: rows (1,0,0), (0,1,1)
                                9, 9, 9, 9, 9, 9,     // expert 1 (no tokens)
                                2, 1, 0, -1, 0, 3};   // expert 2: rows (2,1,0), (-1,0,3)
  std::vector<float> y(3 * 2, kNaN);
  grouped_fprop_ref(x.data(), w.data(), 3, 2, 3, offsets, 3, y.data());
  EXPECT_EQ(y, (std::vector<float>{1, 5, -1, 2, 6, -1}));

  const std::vector<float> dy = {1, -1,  //
                                 2, 0,   //
                                 0.5f, 1};
  std::vector<float> dx(3 * 3, kNaN);
  grouped_dgrad_ref(dy.data(), w.data(), 3, 2, 3, offsets, 3, dx.data());
  // row 0: 1*(1,0,0) - 1*(0,1,1); row 1: 2*(1,0,0); row 2: 0.5*(2,1,0) + 1*(-1,0,3)
  EXPECT_EQ(dx, (std::vector<float>{1, -1, -1, 2, 0, 0, 0, 0.5f, 3}));

  std::vector<float> dw(3 * 2 * 3, kNaN);
  grouped_wgrad_ref(dy.data(), x.data(), 3, 2, 3, offsets, 3, dw.data());
  // expert 0: dy0^T x0 + dy1^T x1; expert 1: zero; expert 2: dy2^T x2
  EXPECT_EQ(dw, (std::vector<float>{1 * 1 + 2 * -1, 1 * 2 + 2 * 0, 1 * 3 + 2 * 2,  //
                                    -1 * 1 + 0, -1 * 2 + 0, -1 * 3 + 0,           //
                                    0, 0, 0, 0, 0, 0,                             //
                                    0.5f * 4, 0.5f * -2, 0.5f * 1, 4, -2, 1}));
}

// <Fprop(X), dY> = <X, Dgrad(dY)> = sum_g <W_g, Wgrad_g>: all three are the same bilinear form.
TEST(GroupedGemmRef, AdjointIdentitiesHoldOnARaggedSplit) {
  const int64_t N = 16, K = 24, G = 5;
  const int32_t offsets[] = {0, 5, 5, 12, 13, 20};
  const int64_t M = offsets[G];
  const auto x = random_values(M * K, 1), w = random_values(G * N * K, 2), dy = random_values(M * N, 3);
  std::vector<float> y(M * N), dx(M * K), dw(G * N * K);
  grouped_fprop_ref(x.data(), w.data(), M, N, K, offsets, G, y.data());
  grouped_dgrad_ref(dy.data(), w.data(), M, N, K, offsets, G, dx.data());
  grouped_wgrad_ref(dy.data(), x.data(), M, N, K, offsets, G, dw.data());
  const double a = dot(y, dy), b = dot(x, dx), c = dot(w, dw);
  EXPECT_NEAR(a, b, 1e-5 * std::fabs(a));
  EXPECT_NEAR(a, c, 1e-5 * std::fabs(a));
  // Wgrad of the empty expert 1 is exactly zero.
  for (int64_t i = 0; i < N * K; ++i) ASSERT_EQ(dw[N * K + i], 0.0f) << "element " << i;
}

TEST(GroupedGemmRef, ScaledIdentityWeightsReproduceTheInput) {
  const int64_t N = 8, K = 8, G = 3;
  const int32_t offsets[] = {0, 3, 4, 9};
  const int64_t M = offsets[G];
  const auto x = random_values(M * K, 4);
  std::vector<float> w(G * N * K, 0.0f);
  const float c[] = {1.0f, -2.0f, 0.25f};
  for (int64_t g = 0; g < G; ++g)
    for (int64_t i = 0; i < N; ++i) w[(g * N + i) * K + i] = c[g];
  std::vector<float> y(M * N, kNaN);
  grouped_fprop_ref(x.data(), w.data(), M, N, K, offsets, G, y.data());
  for (int64_t g = 0; g < G; ++g)
    for (int64_t r = offsets[g]; r < offsets[g + 1]; ++r)
      for (int64_t k = 0; k < K; ++k) ASSERT_EQ(y[r * N + k], c[g] * x[r * K + k]) << "row " << r << " col " << k;
}

TEST(GroupedGemmRef, RowSubsetMatchesFullResultAndLeavesOtherRowsUntouched) {
  const int64_t N = 12, K = 20, G = 4;
  const int32_t offsets[] = {0, 4, 4, 10, 11};
  const int64_t M = offsets[G];
  const auto x = random_values(M * K, 5), w = random_values(G * N * K, 6), dy = random_values(M * N, 7);
  const std::vector<int64_t> rows = {0, 4, 10};

  std::vector<float> y_full(M * N), y_part(M * N, kNaN);
  grouped_fprop_ref(x.data(), w.data(), M, N, K, offsets, G, y_full.data());
  grouped_fprop_ref(x.data(), w.data(), M, N, K, offsets, G, y_part.data(), rows);
  for (int64_t r = 0; r < M; ++r) {
    const bool listed = r == 0 || r == 4 || r == 10;
    for (int64_t n = 0; n < N; ++n) {
      if (listed) ASSERT_EQ(y_part[r * N + n], y_full[r * N + n]);
      else ASSERT_TRUE(std::isnan(y_part[r * N + n])) << "row " << r << " was written";
    }
  }

  std::vector<float> dx_full(M * K), dx_part(M * K, kNaN);
  grouped_dgrad_ref(dy.data(), w.data(), M, N, K, offsets, G, dx_full.data());
  grouped_dgrad_ref(dy.data(), w.data(), M, N, K, offsets, G, dx_part.data(), rows);
  for (int64_t k = 0; k < K; ++k) {
    EXPECT_EQ(dx_part[4 * K + k], dx_full[4 * K + k]);
    EXPECT_TRUE(std::isnan(dx_part[5 * K + k]));
  }

  const std::vector<int64_t> wrows = {1, 11};
  std::vector<float> dw_full(G * N * K), dw_part(G * N * K, kNaN);
  grouped_wgrad_ref(dy.data(), x.data(), M, N, K, offsets, G, dw_full.data());
  grouped_wgrad_ref(dy.data(), x.data(), M, N, K, offsets, G, dw_part.data(), wrows);
  for (int64_t g = 0; g < G; ++g)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) {
        const int64_t i = (g * N + n) * K + k;
        if (n == 1 || n == 11) ASSERT_EQ(dw_part[i], dw_full[i]);
        else ASSERT_TRUE(std::isnan(dw_part[i])) << "dW[" << g << "] row " << n << " was written";
      }
}

TEST(GroupedGemmRef, AllTokensOnOneExpertEqualsAPlainGemm) {
  const int64_t N = 16, K = 32, G = 4, M = 9;
  const int32_t offsets[] = {0, 0, 0, 9, 9};
  const auto x = random_values(M * K, 8), w = random_values(G * N * K, 9);
  std::vector<float> y(M * N);
  grouped_fprop_ref(x.data(), w.data(), M, N, K, offsets, G, y.data());
  const float* w2 = w.data() + 2 * N * K;
  for (int64_t r = 0; r < M; ++r)
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0.0;
      for (int64_t k = 0; k < K; ++k) acc += static_cast<double>(x[r * K + k]) * w2[n * K + k];
      ASSERT_EQ(y[r * N + n], static_cast<float>(acc));
    }
}

TEST(GroupedGemmRef, RejectsInvalidSplitsShapesAndRows) {
  const std::vector<float> a(64, 1.0f), b(64, 1.0f);
  std::vector<float> out(64);
  const int32_t not_ending_at_m[] = {0, 1, 2};
  const int32_t decreasing[] = {0, 3, 2};
  const int32_t not_starting_at_zero[] = {1, 2, 3};
  EXPECT_THROW(grouped_fprop_ref(a.data(), b.data(), 3, 2, 2, not_ending_at_m, 2, out.data()), Error);
  EXPECT_THROW(grouped_dgrad_ref(a.data(), b.data(), 2, 2, 2, decreasing, 2, out.data()), Error);
  EXPECT_THROW(grouped_wgrad_ref(a.data(), b.data(), 3, 2, 2, not_starting_at_zero, 2, out.data()), Error);
  const int32_t ok[] = {0, 1, 3};
  EXPECT_THROW(grouped_fprop_ref(a.data(), b.data(), 3, 0, 2, ok, 2, out.data()), Error);
  EXPECT_THROW(grouped_fprop_ref(nullptr, b.data(), 3, 2, 2, ok, 2, out.data()), Error);
  // No tokens: nothing is read, so the operands may be null; Wgrad still writes its zeros, so its output may not.
  const int32_t none[] = {0, 0, 0};
  std::vector<float> dw(2 * 2 * 2, 7.0f);
  EXPECT_NO_THROW(grouped_wgrad_ref(nullptr, nullptr, 0, 2, 2, none, 2, dw.data()));
  EXPECT_EQ(dw, std::vector<float>(dw.size(), 0.0f)) << "an empty group's dW is zero";
  EXPECT_THROW(grouped_wgrad_ref(nullptr, nullptr, 0, 2, 2, none, 2, nullptr), Error);
  EXPECT_NO_THROW(grouped_fprop_ref(nullptr, nullptr, 0, 2, 2, none, 2, nullptr));
  EXPECT_THROW(grouped_wgrad_ref(a.data(), nullptr, 3, 2, 2, ok, 2, out.data()), Error);
  const std::vector<int64_t> bad_rows = {3};
  EXPECT_THROW(grouped_fprop_ref(a.data(), b.data(), 3, 2, 2, ok, 2, out.data(), bad_rows), Error);
  const std::vector<int64_t> bad_wrows = {2};
  EXPECT_THROW(grouped_wgrad_ref(a.data(), b.data(), 3, 2, 2, ok, 2, out.data(), bad_wrows), Error);
}

TEST(GroupedGemmRef, RelativeL2Error) {
  const std::vector<float> want = {3, 4, 0};
  const std::vector<float> same = want;
  const std::vector<float> off = {3, 4, 0.5f};
  const std::vector<float> poisoned = {3, kNaN, 0};
  const std::vector<float> zeros = {0, 0, 0};
  EXPECT_EQ(relative_l2_error(same.data(), want.data(), 3), 0.0);
  EXPECT_DOUBLE_EQ(relative_l2_error(off.data(), want.data(), 3), 0.1);
  EXPECT_TRUE(std::isnan(relative_l2_error(poisoned.data(), want.data(), 3)));
  EXPECT_EQ(relative_l2_error(zeros.data(), zeros.data(), 3), 0.0);
  EXPECT_TRUE(std::isinf(relative_l2_error(want.data(), zeros.data(), 3)));
}

}  // namespace
}  // namespace fp4moe
