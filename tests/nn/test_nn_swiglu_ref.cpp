// CPU reference of SwiGLU (kernels/nn/swiglu.h): hand-computed values of silu(gate) * up on the packed gate|up
// layout, the double backward against central finite differences, the BF16 reference as one rounding of the double
// formulas, and rejections (references and GPU launchers).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/nn/swiglu.h"
#include "tests/common/nn_ref_test_util.h"

namespace fp4moe {
namespace {

using test::bf16_to_f64;
using test::to_bf16;
using test::to_f64;

TEST(NnRefSwiGlu, HandComputedPackedLayout) {
  // M = 2, F = 2: row 0 = gate [0, 1] | up [5, 2]; row 1 = gate [-30, 2] | up [1, -1].
  const auto in = to_bf16({0, 1, 5, 2, -30, 2, 1, -1});
  std::vector<bf16> y(4);
  swiglu_forward_ref(in.data(), 2, 2, y.data());
  const double sig1 = 1 / (1 + std::exp(-1.0)), sig2 = 1 / (1 + std::exp(-2.0));
  EXPECT_EQ(bf16_to_f64(y[0]), 0.0);                                  // silu(0) = 0
  EXPECT_NEAR(bf16_to_f64(y[1]), 1 * sig1 * 2, 1.4621 / 256);         // 1.4621
  EXPECT_NEAR(bf16_to_f64(y[2]), -30 / (1 + std::exp(30.0)), 1e-14);  // about -2.8e-12
  EXPECT_NEAR(bf16_to_f64(y[3]), -2 * sig2, 1.7616 / 256);

  // Backward at gate 0: s = 1/2, d gate = dy * up / 2, d up = 0.
  const auto dy = to_bf16({2, 0, 0, 1});
  std::vector<bf16> din(8);
  swiglu_backward_ref(dy.data(), in.data(), 2, 2, din.data());
  EXPECT_EQ(bf16_to_f64(din[0]), 5.0);  // 2 * 5 * 0.5 * (1 + 0)
  EXPECT_EQ(bf16_to_f64(din[2]), 0.0);  // 2 * silu(0)
  EXPECT_EQ(bf16_to_f64(din[1]), 0.0);  // dy = 0
  EXPECT_EQ(bf16_to_f64(din[3]), 0.0);
  // Row 1, f = 1: gate 2, up -1, dy 1: d gate = -s (1 + 2 (1 - s)), d up = 2 s.
  EXPECT_NEAR(bf16_to_f64(din[5]), -sig2 * (1 + 2 * (1 - sig2)), 1.0 / 128);
  EXPECT_NEAR(bf16_to_f64(din[7]), 2 * sig2, 1.0 / 128);
}

TEST(NnRefSwiGlu, BackwardMatchesFiniteDifferences) {
  const int64_t M = 3, F = 5;
  std::vector<double> in = test::normal_values(M * 2 * F, 11, 0.0, 2.0);
  const std::vector<double> G = test::normal_values(M * F, 12);
  std::vector<double> y(M * F), din(M * 2 * F);
  auto loss = [&] {
    swiglu_forward_f64(in.data(), M, F, y.data());
    return test::dot(y, G);
  };
  swiglu_backward_f64(G.data(), in.data(), M, F, din.data());
  test::expect_gradient_matches(din, test::finite_difference_gradient(in, loss), "dinput");
}

TEST(NnRefSwiGlu, Bf16ReferenceRoundsTheDoubleFormulasOnce) {
  const int64_t M = 4, F = 13;
  const auto in = to_bf16(test::normal_values(M * 2 * F, 13, 0.0, 3.0)), dy = to_bf16(test::normal_values(M * F, 14));
  std::vector<bf16> y(M * F), din(M * 2 * F);
  swiglu_forward_ref(in.data(), M, F, y.data());
  swiglu_backward_ref(dy.data(), in.data(), M, F, din.data());
  const std::vector<double> ind = to_f64(in), dyd = to_f64(dy);
  std::vector<double> y64(M * F), din64(M * 2 * F);
  swiglu_forward_f64(ind.data(), M, F, y64.data());
  swiglu_backward_f64(dyd.data(), ind.data(), M, F, din64.data());
  for (int64_t i = 0; i < M * F; ++i) EXPECT_NEAR(bf16_to_f64(y[i]), y64[i], std::fabs(y64[i]) / 256) << i;
  for (int64_t i = 0; i < M * 2 * F; ++i)
    EXPECT_NEAR(bf16_to_f64(din[i]), din64[i], std::fabs(din64[i]) / 256) << i;
}

TEST(NnRefSwiGlu, RejectsBadArguments) {
  std::vector<bf16> buf(64);
  test::expect_error_mentions([&] { swiglu_forward_ref(buf.data(), 2, 0, buf.data()); },
                              {"swiglu_forward_ref", "F must be >= 1", "F=0"});
  test::expect_error_mentions([&] { swiglu_backward_ref(buf.data(), buf.data(), -3, 4, buf.data()); },
                              {"swiglu_backward_ref", "M must be >= 0", "M=-3"});
  test::expect_error_mentions([] { swiglu_forward(nullptr, 4, 0, nullptr, nullptr); },
                              {"swiglu_forward", "F must be >= 1"});
  test::expect_error_mentions([] { swiglu_forward(nullptr, 4, 8, nullptr, nullptr); },
                              {"swiglu_forward", "input is null"});
  const bf16* odd = reinterpret_cast<const bf16*>(uintptr_t{0x2001});
  test::expect_error_mentions([&] { swiglu_backward(odd, odd, 4, 8, nullptr, nullptr); },
                              {"swiglu_backward", "dy must be 2-byte aligned"});
  test::expect_error_mentions([] { swiglu_forward(nullptr, int64_t{1} << 40, int64_t{1} << 22, nullptr, nullptr); },
                              {"exceed 2^62"});
}

}  // namespace
}  // namespace fp4moe
