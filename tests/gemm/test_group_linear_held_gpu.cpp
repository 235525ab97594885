// What Group Linear keeps from forward to backward (GroupLinear::held_activation_bytes, group_linear.h): the
// accessor after a forward equals the count for the forward's tokens and groups, and the statements behind the
// count hold on the device: the bf16 and mxfp4 recipes' Wgrad reads the caller's X (BF16, or MXFP4) after forward
// (zeroed after forward, dW comes out zero), while the fp8 recipe's reads only its own FP8 column copy (the caller's
// BF16 X overwritten with NaN after forward, dW comes out finite and the same as without).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "tests/common/gpu_test_util.h"
#include "tests/common/param_printers.h"
#include "kernels/common/check.h"
#include "kernels/common/types.h"
#include "kernels/formats/formats.h"
#include "kernels/gemm/grouped_gemm_ref.h"
#include "kernels/quant/bf16_to_mxfp4_row.h"
#include "kernels/quant/layouts.h"
#include "trainer/model/group_linear.h"

namespace fp4moe {
namespace {

using test::DeviceBuffer;

constexpr int64_t kG = 3, kN = 128, kK = 256;
const std::vector<int32_t> kOffsets = {0, 100, 100, 317};  // groups of 100, 0 and 217 tokens
constexpr int64_t kM = 317;

std::vector<bf16> random_bf16(int64_t n, float stddev, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<bf16> v(static_cast<size_t>(n));
  for (auto& e : v) e = bf16_from_bits(f32_to_bf16_bits(normal(rng)));
  return v;
}

// One layer with its inputs on the device; X is the caller's (BF16, and its MXFP4 copy for the mxfp4 recipe).
struct LayerOnDevice {
  Recipe recipe;
  DeviceBuffer<int32_t> offsets{kOffsets.size()};
  DeviceBuffer<bf16> x{kM * kK}, w{kG * kN * kK}, dy{kM * kN}, y{kM * kN}, dx{kM * kK};
  DeviceBuffer<uint8_t> mx_codes{kM * kK / 2}, mx_scales{kM * kK / kMxBlock};
  DeviceBuffer<float> dw{kG * kN * kK};
  GroupLinear layer;
  GroupSplit split;

  explicit LayerOnDevice(Recipe r) : recipe(r), layer(kG, kN, kK, r, nullptr) {
    offsets.upload(kOffsets);
    x.upload(random_bf16(kM * kK, 1.0f, 1));
    w.upload(random_bf16(kG * kN * kK, 0.02f, 2));
    dy.upload(random_bf16(kM * kN, 1.0f, 3));
    bf16_to_mxfp4_row(x.ptr, kM, kK, mx_codes.ptr, mx_scales.ptr, MxQuantConfig{}, nullptr, nullptr);
    split = GroupSplit{offsets.ptr, kOffsets.data(), kG};
    layer.set_weights(w.ptr, nullptr);
  }
  GroupLinearInput input() const {
    return recipe == Recipe::mxfp4 ? GroupLinearInput{nullptr, mx_codes.ptr, mx_scales.ptr}
                                   : GroupLinearInput{x.ptr, nullptr, nullptr};
  }
  void forward() { layer.forward(input(), split, y.ptr, nullptr); }
  // dW from zero, after whatever happened to the caller's X since forward (backward is given the same X).
  std::vector<float> backward_dw() {
    CUDA_CHECK(cudaMemset(dw.ptr, 0, dw.n * sizeof(float)));
    dx.poison(0xFF);
    layer.backward(input(), dy.ptr, split, dx.ptr, dw.ptr, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    return dw.download();
  }
};

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float e : v) m = std::isnan(e) ? INFINITY : std::max(m, static_cast<double>(std::fabs(e)));
  return m;
}

class GroupLinearHeld : public ::testing::TestWithParam<Recipe> {};

TEST_P(GroupLinearHeld, AccessorAfterForwardIsTheCountOfItsTokens) {
  FP4MOE_REQUIRE_DEVICE();
  LayerOnDevice s(GetParam());
  EXPECT_THROW(s.layer.held_activation_bytes(), Error);  // nothing held before a forward
  s.forward();
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(s.layer.held_activation_bytes(), GroupLinear::held_activation_bytes(GetParam(), kM, kK, kG));
  EXPECT_GT(s.layer.held_activation_bytes(), 0u);
}

TEST_P(GroupLinearHeld, WgradReadsExactlyWhatIsCountedAsHeld) {
  FP4MOE_REQUIRE_DEVICE();
  const Recipe recipe = GetParam();
  SCOPED_TRACE(std::string("recipe ") + recipe_name(recipe));
  LayerOnDevice s(recipe);
  s.forward();
  const std::vector<float> intact = s.backward_dw();
  ASSERT_GT(max_abs(intact), 0.0);
  ASSERT_TRUE(std::isfinite(max_abs(intact)));

  LayerOnDevice t(recipe);
  t.forward();
  if (recipe == Recipe::fp8) {
    // The caller's BF16 X is not held: NaN in it after forward changes nothing.
    t.x.poison(0xFF);
    const std::vector<float> after = t.backward_dw();
    ASSERT_EQ(after.size(), intact.size());
    EXPECT_TRUE(std::isfinite(max_abs(after))) << "fp8 recipe: dW read the caller's BF16 X (NaN) after forward";
    EXPECT_LT(relative_l2_error(after.data(), intact.data(), static_cast<int64_t>(after.size())), 1e-6)
        << "fp8 recipe: dW changed after the caller's BF16 X was overwritten following forward";
  } else {
    // The caller's X (BF16 for bf16, MXFP4 for mxfp4) is what Wgrad reads, as backward is given it: zeroed after
    // forward, dW = dY^T 0 = 0.
    if (recipe == Recipe::mxfp4) {
      t.mx_codes.poison(0x00);
    } else {
      t.x.poison(0x00);
    }
    EXPECT_EQ(max_abs(t.backward_dw()), 0.0) << "dW did not come from the caller's X given to backward";
  }
}

INSTANTIATE_TEST_SUITE_P(AllRecipes, GroupLinearHeld,
                         ::testing::Values(Recipe::bf16, Recipe::fp8, Recipe::mxfp4),
                         [](const ::testing::TestParamInfo<Recipe>& info) {
                           return std::string(recipe_name(info.param));
                         });

}  // namespace
}  // namespace fp4moe
