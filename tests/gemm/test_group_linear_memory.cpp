// Memory accounting of Group Linear (trainer/model/group_linear.h): what each recipe holds between forward and
// backward, against the byte counts of the formats (DESIGN.md "Number formats": E2M1 is 4 bits, one UE8M0 byte
// per 32 elements; E4M3 is 1 byte, one FP32 scale per 128 tokens), and the rejections. No device needed.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>

#include "kernels/common/check.h"
#include "trainer/model/group_linear.h"

namespace fp4moe {
namespace {

using R = Recipe;

TEST(GroupLinearMemory, Bf16AndMxfp4HoldExactlyTheirBitsPerElement) {
  std::mt19937 rng(7);
  for (int i = 0; i < 50; ++i) {
    const int64_t M = std::uniform_int_distribution<int64_t>(0, 70000)(rng);
    const int64_t K = 32 * std::uniform_int_distribution<int64_t>(1, 256)(rng);
    const int64_t G = std::uniform_int_distribution<int64_t>(1, 64)(rng);
    SCOPED_TRACE(testing::Message() << "M=" << M << " K=" << K << " G=" << G);
    // BF16: 16 bits per element. MXFP4: 4 bits per element plus 8 bits per 32 elements = 4.25 bits.
    EXPECT_EQ(GroupLinear::held_activation_bytes(R::bf16, M, K, G) * 8, static_cast<size_t>(M * K * 16));
    EXPECT_EQ(GroupLinear::held_activation_bytes(R::mxfp4, M, K, G) * 32, static_cast<size_t>(M * K * 17));
  }
}

TEST(GroupLinearMemory, Fp8HoldsItsColumnCopyWithPaddingPerGroup) {
  const int64_t K = 7168;
  for (int64_t G : {1, 8, 32}) {
    // Lower bound: one E4M3 byte per element and one FP32 scale per 128 tokens of each feature column.
    // Upper bound: each group padded by at most 15 tokens and one extra partial scale block per group.
    for (int64_t M : {int64_t{0}, int64_t{1}, int64_t{4097}, int64_t{65536}}) {
      const size_t held = GroupLinear::held_activation_bytes(R::fp8, M, K, G);
      const size_t lower = static_cast<size_t>(M * K + 4 * K * ((M + 127) / 128));
      const size_t upper = static_cast<size_t>((M + 15 * G) * K + 4 * K * ((M + 127) / 128 + G));
      EXPECT_GE(held, lower) << "G=" << G << " M=" << M;
      EXPECT_LE(held, upper) << "G=" << G << " M=" << M;
    }
  }
  // At DeepSeek-V3 sizes the recipes order as the paper says: MXFP4 < FP8 < BF16.
  const int64_t M = 16384, G = 8;
  EXPECT_LT(GroupLinear::held_activation_bytes(R::mxfp4, M, K, G), GroupLinear::held_activation_bytes(R::fp8, M, K, G));
  EXPECT_LT(GroupLinear::held_activation_bytes(R::fp8, M, K, G), GroupLinear::held_activation_bytes(R::bf16, M, K, G));
}

TEST(GroupLinearMemory, WeightCopiesAreTwoFp8TensorsWithBlockScales) {
  EXPECT_EQ(GroupLinear::weight_copy_bytes(R::bf16, 8, 4096, 7168), 0u);
  for (int64_t G : {1, 3}) {
    const int64_t N = 256, K = 384;  // 2 x 3 blocks of 128x128 for W, 3 x 2 for W^T
    const size_t codes = static_cast<size_t>(2 * G * N * K);
    const size_t fp8 = GroupLinear::weight_copy_bytes(R::fp8, G, N, K);
    EXPECT_EQ(fp8, GroupLinear::weight_copy_bytes(R::mxfp4, G, N, K));
    // At least one FP32 scale per 128x128 block of W and of W^T (6 + 6 per expert); the row stride may pad more.
    EXPECT_GE(fp8, codes + static_cast<size_t>(G * 12 * 4));
    EXPECT_LE(fp8, codes + static_cast<size_t>(G * 2 * 3 * 4 * 4));
  }
}

TEST(GroupLinearMemory, RejectsImpossibleShapes) {
  EXPECT_THROW(GroupLinear::held_activation_bytes(R::bf16, -1, 64, 1), Error);
  EXPECT_THROW(GroupLinear::held_activation_bytes(R::fp8, 16, 0, 1), Error);
  EXPECT_THROW(GroupLinear::held_activation_bytes(R::fp8, 16, 64, 0), Error);
  EXPECT_THROW(GroupLinear::held_activation_bytes(R::mxfp4, 16, 48, 1), Error);  // K not a multiple of 32
  EXPECT_THROW(GroupLinear::weight_copy_bytes(R::fp8, 0, 64, 64), Error);
}

TEST(GroupLinearMemory, RejectsRecipesOtherThanThePresets) {
  R mx_gemm = R::mxfp4;  // MXFP4 Fprop operands: not built yet
  mx_gemm.fprop = GemmPrecision::mxfp4;
  EXPECT_THROW(GroupLinear::held_activation_bytes(mx_gemm, 16, 64, 1), Error);
  EXPECT_THROW(GroupLinear::weight_copy_bytes(mx_gemm, 1, 64, 64), Error);
  EXPECT_THROW(GroupLinear::check_shape(1, 64, 64, mx_gemm), Error);
  EXPECT_NO_THROW(GroupLinear::check_shape(1, 64, 64, R::mxfp4));
}

}  // namespace
}  // namespace fp4moe
