// GPU SwiGLU (kernels/nn/swiglu.h) against its CPU reference on the packed gate|up layout: forward y and backward
// dinput, 16-byte and scalar paths. Shapes: 1 x 1, primes, the DeepSeek-V3 expert width 2048 and dense FFN 18432,
// the tiny model's FFN and expert widths. Outputs are NaN-poisoned and guarded.
// Tolerances (FP32 against the double reference): y within one BF16 ulp (2^-7 relative; silu is a product of
// accurate FP32 factors, no cancellation); d up within one ulp; d gate within one ulp + 2^-20 |dy up| (1 + |gate|)
// (the factor 1 + gate (1 - s) cancels near gate = -1.28).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tests/common/nn_test_util.h"
#include "kernels/nn/swiglu.h"

namespace fp4moe {
namespace {

using test::Guarded;
using test::TinyShapes;
using test::value_of;

struct Case {
  int64_t M, F;
  size_t shift;  // 1: tensors shifted by one element (scalar path)
};

const Case kCases[] = {{1, 1, 0},       {1, 2048, 0},    {7, 13, 0},    {TinyShapes::tokens, TinyShapes::ffn, 0},
                       {TinyShapes::tokens, TinyShapes::expert_ffn, 0}, {131, 2048, 0}, {4099, 7, 0},
                       {257, 18432, 0}, {1024, 2048, 0}, {97, 2048, 1}, {5, 8, 1}};

TEST(NnSwiGlu, MatchesReference) {
  FP4MOE_REQUIRE_DEVICE();
  for (const Case& tc : kCases) {
    const int64_t M = tc.M, F = tc.F;
    SCOPED_TRACE("M=" + std::to_string(M) + " F=" + std::to_string(F) + (tc.shift ? " (shifted)" : ""));
    const auto in = test::random_bf16(M * 2 * F, 500 + M, 0.0, 3.0), dy = test::random_bf16(M * F, 600 + F);
    std::vector<bf16> y_ref(M * F), din_ref(M * 2 * F);
    swiglu_forward_ref(in.data(), M, F, y_ref.data());
    swiglu_backward_ref(dy.data(), in.data(), M, F, din_ref.data());

    Guarded<bf16> in_d(M * 2 * F, tc.shift), y_d(M * F, tc.shift), dy_d(M * F, tc.shift), din_d(M * 2 * F, tc.shift);
    in_d.upload(in);
    dy_d.upload(dy);
    swiglu_forward(in_d.ptr(), M, F, y_d.ptr(), nullptr);
    swiglu_backward(dy_d.ptr(), in_d.ptr(), M, F, din_d.ptr(), nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());

    test::expect_close(y_d.download(), y_ref, test::kBf16Rtol, [](size_t) { return 1e-30; }, "y");
    test::expect_close(
        din_d.download(), din_ref, test::kBf16Rtol,
        [&](size_t i) {
          const int64_t m = static_cast<int64_t>(i) / (2 * F), f = static_cast<int64_t>(i) % (2 * F);
          if (f >= F) return 1e-30;  // d up
          const double g = value_of(in[m * 2 * F + f]), u = value_of(in[m * 2 * F + F + f]);
          return std::ldexp(1.0, -20) * std::fabs(value_of(dy[m * F + f]) * u) * (1 + std::fabs(g)) + 1e-30;
        },
        "dinput");
    for (auto* g : {&in_d, &y_d, &dy_d, &din_d}) EXPECT_TRUE(g->guards_intact());
  }
}

TEST(NnSwiGlu, NoRowsLaunchNothing) {
  FP4MOE_REQUIRE_DEVICE();
  swiglu_forward(nullptr, 0, 2048, nullptr, nullptr);
  swiglu_backward(nullptr, nullptr, 0, 2048, nullptr, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace fp4moe
