// GPU RMSNorm (kernels/nn/rmsnorm.h) against its CPU reference: forward y and rstd, backward dx and dweight
// (overwritten and accumulated), the 16-byte and scalar paths, in place, determinism, N = 0.
// Shapes: 1 row and 1 feature, primes, the DeepSeek-V3 widths (hidden 7168, q_lora 1536, kv_lora 512, V2 hidden
// 5120) and the tiny model's. Outputs are NaN-poisoned and guarded.
// Tolerances (FP32 arithmetic against the double reference): with eps_C = (C/32 + 8) * 2^-24 (the longest chain of
// FP32 additions in a row sum: C/32 per lane, then the warp tree),
//   rstd:    relative 2 eps_C
//   y:       one BF16 ulp (2^-7 relative): the FP32 error is far below half an ulp, so at most the rounding differs
//   dx:      one BF16 ulp + 4 eps_C * rstd * max|dy w| * (1 + max|xhat|^2) per row (the mean term may cancel)
//   dweight: 1e-5 * sum_n |dy xhat| (at most ~100 FP32 additions in a chain: 32 rows per lane, 8 warps, 64 splits)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "tests/common/nn_test_util.h"
#include "kernels/nn/rmsnorm.h"

namespace fp4moe {
namespace {

using test::Guarded;
using test::TinyShapes;
using test::value_of;

struct Case {
  int64_t N, C;
  size_t shift;  // 0: 16-byte aligned tensors; 1: shifted by one element (scalar path)
};

const Case kCases[] = {{1, 1, 0},      {1, 7168, 0},   {3, 7, 0},         {13, 127, 0},      {127, 7168, 0},
                       {TinyShapes::tokens, TinyShapes::hidden, 0},       {TinyShapes::tokens, TinyShapes::q_lora, 0},
                       {TinyShapes::tokens, TinyShapes::kv_lora, 1},      {131, 1536, 0},    {4099, 512, 0},
                       {257, 5120, 0}, {1024, 7168, 0}, {61, 7168, 1},    {2, 8, 1}};

std::string name_of(const Case& c) {
  return "N=" + std::to_string(c.N) + " C=" + std::to_string(c.C) + (c.shift ? " (shifted)" : "");
}

// x [N, C] with rows scaled by 2^k, k in [-8, 8], so that rstd varies over the rows.
std::vector<bf16> activations(int64_t N, int64_t C, uint32_t seed) {
  std::vector<bf16> x = test::random_bf16(N * C, seed);
  for (int64_t n = 0; n < N; ++n) {
    const float s = std::ldexp(1.0f, static_cast<int>(n % 17) - 8);
    for (int64_t c = 0; c < C; ++c)
      x[n * C + c] = bf16_from_bits(f32_to_bf16_bits(static_cast<float>(value_of(x[n * C + c])) * s));
  }
  return x;
}

double eps_c(int64_t C) { return (static_cast<double>(C) / 32 + 8) * std::ldexp(1.0, -24); }

TEST(NnRmsNorm, MatchesReference) {
  FP4MOE_REQUIRE_DEVICE();
  const float eps = 1e-6f;
  for (const Case& tc : kCases) {
    SCOPED_TRACE(name_of(tc));
    const int64_t N = tc.N, C = tc.C;
    const auto x = activations(N, C, 100 + N), w = test::random_bf16(C, 200 + C, 1.0, 0.2);
    const auto dy = test::random_bf16(N * C, 300 + N);
    std::vector<bf16> y_ref(N * C), dx_ref(N * C);
    std::vector<float> rstd_ref(N), dw_ref(C);
    rmsnorm_forward_ref(x.data(), w.data(), N, C, eps, y_ref.data(), rstd_ref.data());
    // The backward reference takes the GPU's rstd (below), so dx and dweight are checked on the same statistics.

    Guarded<bf16> x_d(N * C, tc.shift), w_d(C, tc.shift), y_d(N * C, tc.shift), dy_d(N * C, tc.shift),
        dx_d(N * C, tc.shift);
    Guarded<float> rstd_d(N), dw_d(C), ws_d(rmsnorm_backward_workspace_floats(N, C));
    x_d.upload(x);
    w_d.upload(w);
    dy_d.upload(dy);
    rmsnorm_forward(x_d.ptr(), w_d.ptr(), N, C, eps, y_d.ptr(), rstd_d.ptr(), nullptr);
    rmsnorm_backward(dy_d.ptr(), x_d.ptr(), w_d.ptr(), rstd_d.ptr(), N, C, dx_d.ptr(), dw_d.ptr(), false,
                     ws_d.ptr(), nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    const auto y = y_d.download(), dx = dx_d.download();
    const auto rstd = rstd_d.download(), dw = dw_d.download();

    const double ec = eps_c(C);
    test::expect_close(rstd, rstd_ref, 2 * ec, [](size_t) { return 0.0; }, "rstd");
    test::expect_close(y, y_ref, test::kBf16Rtol, [](size_t) { return 1e-30; }, "y");

    rmsnorm_backward_ref(dy.data(), x.data(), w.data(), rstd.data(), N, C, dx_ref.data(), dw_ref.data(), false);
    std::vector<double> row_atol(N), col_atol(C, 1e-30);
    for (int64_t n = 0; n < N; ++n) {
      double max_g = 0, max_xhat = 0;
      for (int64_t c = 0; c < C; ++c) {
        const double xhat = value_of(x[n * C + c]) * rstd[n];
        max_g = std::max(max_g, std::fabs(value_of(dy[n * C + c]) * value_of(w[c])));
        max_xhat = std::max(max_xhat, std::fabs(xhat));
        col_atol[c] += 1e-5 * std::fabs(value_of(dy[n * C + c]) * xhat);
      }
      row_atol[n] = 4 * ec * rstd[n] * max_g * (1 + max_xhat * max_xhat) + 1e-30;
    }
    test::expect_close(dx, dx_ref, test::kBf16Rtol, [&](size_t i) { return row_atol[i / C]; }, "dx");
    test::expect_close(dw, dw_ref, 0.0, [&](size_t c) { return col_atol[c]; }, "dweight");
    for (auto* g : {&x_d, &w_d, &y_d, &dy_d, &dx_d}) EXPECT_TRUE(g->guards_intact()) << "BF16 tensor guard";
    EXPECT_TRUE(rstd_d.guards_intact()) << "rstd guard";
    EXPECT_TRUE(dw_d.guards_intact()) << "dweight guard";

    // Accumulation adds to dweight; a second run gives the same bits (no atomics).
    const auto base = test::random_f32(C, 400 + C);
    dw_d.upload(base);
    rmsnorm_backward(dy_d.ptr(), x_d.ptr(), w_d.ptr(), rstd_d.ptr(), N, C, dx_d.ptr(), dw_d.ptr(), true, ws_d.ptr(),
                     nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    const auto acc = dw_d.download();
    std::vector<float> acc_ref(C);
    for (int64_t c = 0; c < C; ++c) acc_ref[c] = base[c] + dw[c];
    test::expect_close(acc, acc_ref, std::ldexp(1.0, -23), [](size_t) { return 1e-30; }, "dweight accumulated");
    test::expect_bitwise_equal(dx_d.download(), dx, "dx, second run");
  }
}

TEST(NnRmsNorm, InPlace) {
  FP4MOE_REQUIRE_DEVICE();
  const int64_t N = 37, C = 7168;
  const auto x = activations(N, C, 7), w = test::random_bf16(C, 8, 1.0, 0.2), dy = test::random_bf16(N * C, 9);
  Guarded<bf16> x_d(N * C), w_d(C), y_d(N * C), dy_d(N * C), dx_d(N * C), inplace_d(N * C);
  Guarded<float> rstd_d(N), dw_d(C), dw2_d(C), ws_d(rmsnorm_backward_workspace_floats(N, C));
  x_d.upload(x);
  w_d.upload(w);
  dy_d.upload(dy);
  rmsnorm_forward(x_d.ptr(), w_d.ptr(), N, C, 1e-6f, y_d.ptr(), rstd_d.ptr(), nullptr);
  rmsnorm_backward(dy_d.ptr(), x_d.ptr(), w_d.ptr(), rstd_d.ptr(), N, C, dx_d.ptr(), dw_d.ptr(), false, ws_d.ptr(),
                   nullptr);
  inplace_d.upload(x);  // y written over x
  rmsnorm_forward(inplace_d.ptr(), w_d.ptr(), N, C, 1e-6f, inplace_d.ptr(), nullptr, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  test::expect_bitwise_equal(inplace_d.download(), y_d.download(), "y in place");
  inplace_d.upload(dy);  // dx written over dy; dweight must still see dy
  rmsnorm_backward(inplace_d.ptr(), x_d.ptr(), w_d.ptr(), rstd_d.ptr(), N, C, inplace_d.ptr(), dw2_d.ptr(), false,
                   ws_d.ptr(), nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  test::expect_bitwise_equal(inplace_d.download(), dx_d.download(), "dx in place");
  test::expect_bitwise_equal(dw2_d.download(), dw_d.download(), "dweight with dx in place");
}

TEST(NnRmsNorm, NoRowsZeroesOrKeepsDweight) {
  FP4MOE_REQUIRE_DEVICE();
  const int64_t C = 96;
  Guarded<float> dw_d(C), ws_d(rmsnorm_backward_workspace_floats(0, C)), rstd_d(1);
  rmsnorm_backward(nullptr, nullptr, nullptr, rstd_d.ptr(), 0, C, nullptr, dw_d.ptr(), false, ws_d.ptr(), nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  for (float v : dw_d.download()) ASSERT_EQ(v, 0.0f);
  const auto base = test::random_f32(C, 5);
  dw_d.upload(base);
  rmsnorm_backward(nullptr, nullptr, nullptr, rstd_d.ptr(), 0, C, nullptr, dw_d.ptr(), true, ws_d.ptr(), nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  test::expect_bitwise_equal(dw_d.download(), base, "dweight accumulated over no rows");
  EXPECT_TRUE(dw_d.guards_intact());
}

}  // namespace
}  // namespace fp4moe
