// CPU reference of RMSNorm (kernels/nn/rmsnorm.h): hand-computed cases, the double backward against central finite
// differences, the BF16 reference against the double formulas (one rounding), dweight accumulation, and rejections
// (references and GPU launchers reject before touching memory or the device).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/nn/rmsnorm.h"
#include "tests/common/nn_ref_test_util.h"

namespace fp4moe {
namespace {

using test::bf16_to_f64;
using test::to_bf16;
using test::to_f64;

TEST(NnRefRmsNorm, HandComputedForward) {
  // mean x^2 = 4, rstd = 1 / sqrt(4 + 1e-6) = 0.49999994; y = x * rstd * w rounds to the BF16 values below.
  const auto x = to_bf16({2, -2, 2, -2}), w = to_bf16({1, 0.5, 2, -1});
  std::vector<bf16> y(4);
  float rstd = 0;
  rmsnorm_forward_ref(x.data(), w.data(), 1, 4, 1e-6f, y.data(), &rstd);
  EXPECT_NEAR(rstd, 1.0 / std::sqrt(4.000001), 1e-8);
  const double expected[4] = {1, -0.5, 2, 1};
  for (int c = 0; c < 4; ++c) EXPECT_EQ(bf16_to_f64(y[c]), expected[c]) << c;
}

TEST(NnRefRmsNorm, HandComputedBackward) {
  // x = [3, 4], w = [1, 1], dy = [1, 0]: r = 1/sqrt(12.5); mean(g * xhat) = 1.5 r;
  // dx = r * ([1, 0] - [3r, 4r] * 1.5r) = r * [0.64, -0.48]; dweight = dy * xhat = [3r, 0].
  const auto x = to_bf16({3, 4}), w = to_bf16({1, 1}), dy = to_bf16({1, 0});
  std::vector<bf16> y(2), dx(2);
  float rstd = 0;
  rmsnorm_forward_ref(x.data(), w.data(), 1, 2, 1e-30f, y.data(), &rstd);
  const double r = 1 / std::sqrt(12.5);
  EXPECT_NEAR(rstd, r, 1e-7);
  std::vector<float> dweight = {123, 456};  // overwritten
  rmsnorm_backward_ref(dy.data(), x.data(), w.data(), &rstd, 1, 2, dx.data(), dweight.data(), false);
  EXPECT_NEAR(bf16_to_f64(dx[0]), 0.64 * r, 0.64 * r / 256);
  EXPECT_NEAR(bf16_to_f64(dx[1]), -0.48 * r, 0.48 * r / 256);
  EXPECT_NEAR(dweight[0], 3 * r, 1e-6);
  EXPECT_EQ(dweight[1], 0.0f);
}

TEST(NnRefRmsNorm, BackwardMatchesFiniteDifferences) {
  const int64_t N = 3, C = 7;
  const double eps = 1e-3;  // large enough to matter in the derivative
  std::vector<double> x = test::normal_values(N * C, 1), w = test::normal_values(C, 2, 1.0, 0.3);
  const std::vector<double> G = test::normal_values(N * C, 3);  // dL/dy
  std::vector<double> y(N * C), rstd(N);
  auto loss = [&] {
    rmsnorm_forward_f64(x.data(), w.data(), N, C, eps, y.data(), nullptr);
    return test::dot(y, G);
  };
  rmsnorm_forward_f64(x.data(), w.data(), N, C, eps, y.data(), rstd.data());
  std::vector<double> dx(N * C), dw(C);
  rmsnorm_backward_f64(G.data(), x.data(), w.data(), rstd.data(), N, C, dx.data(), dw.data());
  test::expect_gradient_matches(dx, test::finite_difference_gradient(x, loss), "dx");
  test::expect_gradient_matches(dw, test::finite_difference_gradient(w, loss), "dweight");
}

TEST(NnRefRmsNorm, Bf16ReferenceRoundsTheDoubleFormulasOnce) {
  const int64_t N = 5, C = 33;
  const auto x = to_bf16(test::normal_values(N * C, 4, 0.0, 3.0)), w = to_bf16(test::normal_values(C, 5, 1.0, 0.2));
  const auto dy = to_bf16(test::normal_values(N * C, 6));
  std::vector<bf16> y(N * C), dx(N * C);
  std::vector<float> rstd(N), dweight(C, 0.0f);
  rmsnorm_forward_ref(x.data(), w.data(), N, C, 1e-6f, y.data(), rstd.data());
  rmsnorm_backward_ref(dy.data(), x.data(), w.data(), rstd.data(), N, C, dx.data(), dweight.data(), false);

  const std::vector<double> xd = to_f64(x), wd = to_f64(w), dyd = to_f64(dy);
  std::vector<double> y64(N * C), r64(N), dx64(N * C), dw64(C);
  rmsnorm_forward_f64(xd.data(), wd.data(), N, C, 1e-6f, y64.data(), r64.data());
  std::vector<double> rstd_f(rstd.begin(), rstd.end());
  rmsnorm_backward_f64(dyd.data(), xd.data(), wd.data(), rstd_f.data(), N, C, dx64.data(), dw64.data());
  for (int64_t i = 0; i < N * C; ++i) {
    EXPECT_NEAR(bf16_to_f64(y[i]), y64[i], std::fabs(y64[i]) / 256) << i;
    EXPECT_NEAR(bf16_to_f64(dx[i]), dx64[i], std::fabs(dx64[i]) / 256) << i;
  }
  for (int64_t n = 0; n < N; ++n) EXPECT_NEAR(rstd[n], r64[n], r64[n] * 1e-7) << n;
  for (int64_t c = 0; c < C; ++c) EXPECT_NEAR(dweight[c], dw64[c], 1e-6 * std::max(1.0, std::fabs(dw64[c]))) << c;

  // Accumulation adds this micro-batch's dweight to what is there.
  std::vector<float> acc(C, 0.5f);
  rmsnorm_backward_ref(dy.data(), x.data(), w.data(), rstd.data(), N, C, dx.data(), acc.data(), true);
  for (int64_t c = 0; c < C; ++c) EXPECT_NEAR(acc[c], 0.5 + dw64[c], 1e-6 * std::max(1.0, std::fabs(dw64[c]))) << c;
}

TEST(NnRefRmsNorm, RejectsBadArguments) {
  std::vector<bf16> x(16), w(8), y(16);
  std::vector<float> rstd(2), dw(8);
  test::expect_error_mentions([&] { rmsnorm_forward_ref(x.data(), w.data(), 2, 0, 1e-6f, y.data(), rstd.data()); },
                              {"rmsnorm_forward_ref", "C must be >= 1", "C=0"});
  test::expect_error_mentions([&] { rmsnorm_forward_ref(x.data(), w.data(), -1, 8, 1e-6f, y.data(), rstd.data()); },
                              {"N must be >= 0", "N=-1"});
  test::expect_error_mentions([&] { rmsnorm_forward_ref(x.data(), w.data(), 2, 8, 0.0f, y.data(), rstd.data()); },
                              {"eps must be finite and > 0"});
  test::expect_error_mentions([&] { rmsnorm_forward_ref(x.data(), w.data(), 2, 8, NAN, y.data(), rstd.data()); },
                              {"eps"});
  test::expect_error_mentions(
      [&] { rmsnorm_backward_ref(y.data(), x.data(), w.data(), nullptr, 2, 8, y.data(), dw.data(), false); },
      {"rmsnorm_backward_ref", "rstd is null"});
  test::expect_error_mentions(
      [&] { rmsnorm_forward_ref(x.data(), w.data(), int64_t{1} << 40, int64_t{1} << 40, 1e-6f, y.data(), nullptr); },
      {"exceed 2^62"});
}

// The GPU launchers check before any CUDA call, so they can be tested without a device.
TEST(NnRefRmsNorm, GpuLaunchersRejectBeforeLaunch) {
  test::expect_error_mentions([] { rmsnorm_forward(nullptr, nullptr, 4, 0, 1e-6f, nullptr, nullptr, nullptr); },
                              {"rmsnorm_forward", "C must be >= 1"});
  test::expect_error_mentions([] { rmsnorm_forward(nullptr, nullptr, 4, 8, 1e-6f, nullptr, nullptr, nullptr); },
                              {"rmsnorm_forward", "x is null"});
  const bf16* odd = reinterpret_cast<const bf16*>(uintptr_t{0x1001});
  test::expect_error_mentions([&] { rmsnorm_forward(odd, odd, 4, 8, 1e-6f, nullptr, nullptr, nullptr); },
                              {"x must be 2-byte aligned"});
  test::expect_error_mentions([] { rmsnorm_forward(nullptr, nullptr, 4, 8, -1.0f, nullptr, nullptr, nullptr); },
                              {"eps must be finite and > 0, got -1"});
  float* f = reinterpret_cast<float*>(uintptr_t{0x1000});
  test::expect_error_mentions(
      [&] { rmsnorm_backward(nullptr, nullptr, nullptr, nullptr, 4, 8, nullptr, f, false, f, nullptr); },
      {"rmsnorm_backward", "rstd is null"});
  test::expect_error_mentions([] { rmsnorm_backward_workspace_floats(-2, 8); }, {"N must be >= 0"});
  EXPECT_GE(rmsnorm_backward_workspace_floats(4099, 7168), 7168);
}

}  // namespace
}  // namespace fp4moe
