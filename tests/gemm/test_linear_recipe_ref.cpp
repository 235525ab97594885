// Linear's recipes on the CPU (trainer/model/linear.h, linear_ref.h), no device needed:
//   - the reference recipes' error against the bf16 recipe, on seeded data (normal values, tokens of different
//     magnitude 2^[-3, 3]): fp8 ~0.037 relative L2 in Fprop, Dgrad and Wgrad (E4M3's 3 mantissa bits on both
//     operands), mxfp4 ~0.12 in Fprop and Wgrad (E2M1 X) and exactly fp8's Dgrad (DESIGN.md "Recipes": "as fp8");
//     the bands checked here, [0.02, 0.06] and [0.08, 0.2], are the ones the GPU tests hold the layer to;
//   - mxfp4 keeps one copy of X: Fprop's and Wgrad's X are the same MXFP4 values (the direct conversions are
//     exact at these exponent spreads), and not X itself;
//   - M = 0, and the bytes each recipe keeps from forward to backward (Linear::held_activation_bytes) and of its
//     weight copies;
//   - the constructor's shape rejections, before anything is registered.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/formats/formats.h"
#include "kernels/gemm/grouped_gemm_ref.h"
#include "kernels/quant/layouts.h"
#include "trainer/model/linear.h"
#include "trainer/model/linear_ref.h"
#include "trainer/model/params.h"

namespace fp4moe {
namespace {

// Seeded BF16 values: normal(0, stddev), each row times a power of two in 2^[-row_spread, row_spread].
std::vector<bf16> random_rows(int64_t rows, int64_t cols, float stddev, int row_spread, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  std::uniform_int_distribution<int> row_exp(-row_spread, row_spread);
  std::vector<bf16> v(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float s = exp2_exact(row_exp(rng));
    for (int64_t c = 0; c < cols; ++c) v[r * cols + c] = bf16_from_bits(f32_to_bf16_bits(normal(rng) * s));
  }
  return v;
}

struct Results {
  std::vector<float> y, dx, dw;
};

struct Problem {
  int64_t M, N, K;
  std::vector<bf16> x, w, dy;
  Problem(int64_t m, int64_t n, int64_t k, uint32_t seed)
      : M(m), N(n), K(k), x(random_rows(m, k, 1.0f, 3, seed)), w(random_rows(n, k, 0.02f, 0, seed + 1)),
        dy(random_rows(m, n, 1.0f, 3, seed + 2)) {}
  LinearRecipeOperands operands(Recipe r) const {
    return linear_recipe_operands(r, x.data(), w.data(), dy.data(), M, N, K);
  }
  Results run(Recipe r) const {
    Results out;
    linear_recipe_ref(operands(r), M, N, K, out.y, out.dx, out.dw);
    return out;
  }
};

double rel(const std::vector<float>& got, const std::vector<float>& want) {
  return relative_l2_error(got.data(), want.data(), static_cast<int64_t>(want.size()));
}

TEST(LinearRecipeRef, Bf16OperandsAreTheInputsThemselves) {
  const Problem p(5, 32, 64, 3);
  const LinearRecipeOperands ops = p.operands(Recipe::bf16);
  for (int64_t i = 0; i < p.M * p.K; ++i) {
    ASSERT_EQ(ops.x_fprop[i], bf16_bits_to_f32(bf16_bits(p.x[i])));
    ASSERT_EQ(ops.x_wgrad[i], ops.x_fprop[i]);
  }
  for (int64_t i = 0; i < p.N * p.K; ++i) ASSERT_EQ(ops.w_dgrad[i], bf16_bits_to_f32(bf16_bits(p.w[i])));
}

TEST(LinearRecipeRef, ErrorAgainstBf16IsTheRecipes) {
  for (const int64_t M : {int64_t{301}, int64_t{1024}}) {
    for (const uint32_t seed : {1u, 42u}) {
      SCOPED_TRACE("M=" + std::to_string(M) + " seed=" + std::to_string(seed));
      const Problem p(M, 192, 320, seed);  // K = 320: a short last 1x128 block
      const Results bf = p.run(Recipe::bf16), f8 = p.run(Recipe::fp8), mx = p.run(Recipe::mxfp4);
      using Err = std::pair<const char*, double>;
      const Err fp8_errors[] = {{"fp8 Fprop", rel(f8.y, bf.y)}, {"fp8 Dgrad", rel(f8.dx, bf.dx)},
                                {"fp8 Wgrad", rel(f8.dw, bf.dw)}};
      for (const auto& [what, err] : fp8_errors) {
        EXPECT_GT(err, 0.02) << what;
        EXPECT_LT(err, 0.06) << what;
      }
      for (const auto& [what, err] : {Err{"mxfp4 Fprop", rel(mx.y, bf.y)}, Err{"mxfp4 Wgrad", rel(mx.dw, bf.dw)}}) {
        EXPECT_GT(err, 0.08) << what;
        EXPECT_LT(err, 0.2) << what;
      }
      EXPECT_EQ(std::memcmp(mx.dx.data(), f8.dx.data(), f8.dx.size() * sizeof(float)), 0) << "mxfp4 Dgrad is fp8's";
    }
  }
}

TEST(LinearRecipeRef, Mxfp4FpropAndWgradSeeTheSameMxfp4Values) {
  const Problem p(300, 64, 256, 9);
  const LinearRecipeOperands mx = p.operands(Recipe::mxfp4), f8 = p.operands(Recipe::fp8);
  int64_t differs_from_x = 0;
  for (int64_t i = 0; i < p.M * p.K; ++i) {
    ASSERT_EQ(mx.x_fprop[i], mx.x_wgrad[i]) << "element " << i;
    differs_from_x += mx.x_fprop[i] != bf16_bits_to_f32(bf16_bits(p.x[i]));
  }
  EXPECT_GT(differs_from_x, p.M * p.K / 2) << "E2M1 keeps 1 mantissa bit: most values change";
  EXPECT_EQ(mx.dy_dgrad, f8.dy_dgrad);
  EXPECT_EQ(mx.dy_wgrad, f8.dy_wgrad);
  EXPECT_EQ(mx.w_fprop, f8.w_fprop);
  EXPECT_EQ(mx.w_dgrad, f8.w_dgrad);
}

TEST(LinearRecipeRef, EmptyBatchGivesEmptyOutputsAndZeroWeightGradient) {
  const std::vector<bf16> w = random_rows(32, 64, 0.02f, 0, 1);
  for (const Recipe r : {Recipe::bf16, Recipe::fp8, Recipe::mxfp4}) {
    std::vector<float> y, dx, dw;
    linear_recipe_ref(linear_recipe_operands(r, nullptr, w.data(), nullptr, 0, 32, 64), 0, 32, 64, y, dx, dw);
    EXPECT_TRUE(y.empty() && dx.empty()) << recipe_name(r);
    ASSERT_EQ(dw.size(), 32u * 64u);
    for (float v : dw) ASSERT_EQ(v, 0.0f);
  }
  EXPECT_THROW(linear_recipe_operands(Recipe::mxfp4, nullptr, w.data(), nullptr, 0, 32, 48), Error);  // K % 32
}

TEST(LinearRecipeMemory, HeldBytesAreEachRecipesCopyOfX) {
  for (const int64_t M : {int64_t{0}, int64_t{1}, int64_t{4096}, int64_t{8195}}) {
    for (const int64_t K : {int64_t{64}, int64_t{7168}}) {
      SCOPED_TRACE("M=" + std::to_string(M) + " K=" + std::to_string(K));
      EXPECT_EQ(Linear::held_activation_bytes(Recipe::bf16, M, K), static_cast<size_t>(2 * M * K));
      EXPECT_EQ(Linear::held_activation_bytes(Recipe::mxfp4, M, K) * 32, static_cast<size_t>(17 * M * K));
      // One group's FP8 column tensor capacity (layouts.h): K (M + 15) codes, K (ceil(M/128) + 1) FP32 scales.
      EXPECT_EQ(Linear::held_activation_bytes(Recipe::fp8, M, K),
                static_cast<size_t>(K * (M + 15) + 4 * K * (ceil_div(M, 128) + 1)));
    }
  }
  // At a DeepSeek-V3 width the recipes order as the paper's: MXFP4 < FP8 < BF16.
  const auto held = [](Recipe r) { return Linear::held_activation_bytes(r, 8192, 7168); };
  EXPECT_LT(held(Recipe::mxfp4), held(Recipe::fp8));
  EXPECT_LT(held(Recipe::fp8), held(Recipe::bf16));
  EXPECT_THROW(Linear::held_activation_bytes(Recipe::fp8, -1, 64), Error);
  EXPECT_THROW(Linear::held_activation_bytes(Recipe::mxfp4, 16, 48), Error);

  EXPECT_EQ(Linear::weight_copy_bytes(Recipe::bf16, 1536, 7168), 0u);
  // W and W^T as E4M3 plus one FP32 scale per 128x128 block, the k-blocks padded to 4 (layouts.h).
  const int64_t N = 1536, K = 7168;  // 12 x 56 blocks; W^T 56 x 12 (padded to 12)
  EXPECT_EQ(Linear::weight_copy_bytes(Recipe::fp8, N, K), static_cast<size_t>(2 * N * K + 4 * (12 * 56 + 56 * 12)));
  EXPECT_EQ(Linear::weight_copy_bytes(Recipe::mxfp4, N, K), Linear::weight_copy_bytes(Recipe::fp8, N, K));
}

TEST(LinearRecipeShapes, RejectedBeforeAnythingIsRegistered) {
  ParamStore store;
  // bf16: multiples of 8; fp8 and mxfp4: multiples of 16; mxfp4: in_features a multiple of 32.
  EXPECT_THROW(Linear(store, "a", 12, 64, Recipe::bf16, 0.02f), Error);
  EXPECT_THROW(Linear(store, "b", 24, 64, Recipe::fp8, 0.02f), Error);
  EXPECT_THROW(Linear(store, "c", 64, 40, Recipe::fp8, 0.02f), Error);
  EXPECT_THROW(Linear(store, "d", 48, 64, Recipe::mxfp4, 0.02f), Error);
  EXPECT_TRUE(store.params().empty());
  try {
    Linear(store, "layers.0.attn.q_down", 48, 64, Recipe::mxfp4, 0.02f);
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("layers.0.attn.q_down"), std::string::npos) << msg;
    EXPECT_NE(msg.find("32"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace fp4moe
