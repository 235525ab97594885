// CPU reference of add_bf16_into_f32 (kernels/nn/elementwise.h): y[i] += float(x[i]) with one FP32 rounding,
// the step that brings Linear's BF16 Dgrad of the fp8/mxfp4 recipes into an FP32 sum.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/formats/formats.h"
#include "kernels/nn/elementwise.h"

namespace fp4moe {
namespace {

TEST(NnElementwiseRef, AddBf16IntoF32RoundsOnceInFp32) {
  const std::vector<bf16> x = {bf16_from_bits(f32_to_bf16_bits(1.0f)), bf16_from_bits(f32_to_bf16_bits(-2.5f)),
                               bf16_from_bits(f32_to_bf16_bits(0x1.0p-30f)), bf16_from_bits(0x7FC0)};  // NaN
  std::vector<float> y = {0.5f, 2.5f, 1.0f, 3.0f};
  add_bf16_into_f32_ref(x.data(), 4, y.data());
  EXPECT_EQ(y[0], 1.5f);
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_EQ(y[2], 1.0f) << "1 + 2^-30 rounds to 1 in FP32 (RNE)";
  EXPECT_TRUE(std::isnan(y[3]));
  // Ties: 1 + 2^-24 is exactly between 1 and 1 + 2^-23; RNE keeps the even 1.
  std::vector<float> one = {1.0f};
  const std::vector<bf16> tie = {bf16_from_bits(f32_to_bf16_bits(0x1.0p-24f))};
  add_bf16_into_f32_ref(tie.data(), 1, one.data());
  EXPECT_EQ(one[0], 1.0f);
  add_bf16_into_f32_ref(nullptr, 0, nullptr);
  EXPECT_THROW(add_bf16_into_f32_ref(x.data(), -1, y.data()), Error);
}

}  // namespace
}  // namespace fp4moe
