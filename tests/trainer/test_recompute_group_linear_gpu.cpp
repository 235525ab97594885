// GroupLinear::fprop_fp8_rows (trainer/model/group_linear.h): the Fprop that the `moe` recompute policy reruns for
// the fp8 routed recipe from the layer's kept FP8 row copy of its dispatched input (trainer/model/moe_experts.h).
// G = 4 experts, N = 64, K = 192 (a partial last 128-block), groups of 5, 0, 133 and 9 rows (an empty group, and
// groups whose row count is not a multiple of 4: the grouped GEMM's tail path):
//   - Y from a row copy made by bf16_to_fp8_row with the layer's scale mode is forward's Y bit for bit;
//   - backward is left as it was: dX and dW after forward + fprop_fp8_rows equal those after forward alone, bit for
//     bit, with the caller's BF16 X overwritten with NaN in between (the FP8 column copy made by forward is what
//     Wgrad reads, and fprop_fp8_rows does not touch it);
//   - it rejects the bf16 and mxfp4 recipes, a call before set_weights, a split of another group count, null codes
//     or scales.
// Run: fp4moe_tests_gpu --gtest_filter='Recompute*'
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "tests/common/gpu_test_util.h"
#include "tests/common/nn_test_util.h"
#include "kernels/common/check.h"
#include "kernels/common/types.h"
#include "kernels/formats/formats.h"
#include "kernels/quant/bf16_to_fp8.h"
#include "kernels/quant/layouts.h"
#include "trainer/model/group_linear.h"

namespace fp4moe {
namespace {

using test::DeviceBuffer;

constexpr int64_t kG = 4, kN = 64, kK = 192, kM = 147;
const std::vector<int32_t> kOffsets = {0, 5, 5, 138, 147};

// An fp8 Group Linear with its inputs on the device and the weights set.
struct Fp8Layer {
  DeviceBuffer<int32_t> offsets{kOffsets.size()};
  DeviceBuffer<bf16> x{kM * kK}, w{kG * kN * kK}, dy{kM * kN}, y{kM * kN}, dx{kM * kK};
  DeviceBuffer<float> dw{kG * kN * kK};
  GroupLinear layer{kG, kN, kK, Recipe::fp8, nullptr};
  GroupSplit split;

  Fp8Layer() {
    offsets.upload(kOffsets);
    x.upload(test::random_bf16(kM * kK, 71));
    w.upload(test::random_bf16(kG * kN * kK, 72, 0.0, 0.02));
    dy.upload(test::random_bf16(kM * kN, 73));
    split = GroupSplit{offsets.ptr, kOffsets.data(), kG};
    layer.set_weights(w.ptr, nullptr);
  }
  void forward() {
    y.poison(0xFF);
    layer.forward(GroupLinearInput{x.ptr, nullptr, nullptr}, split, y.ptr, nullptr);
  }
  void backward() {
    CUDA_CHECK(cudaMemset(dw.ptr, 0, dw.n * sizeof(float)));
    dx.poison(0xFF);
    layer.backward(GroupLinearInput{x.ptr, nullptr, nullptr}, dy.ptr, split, dx.ptr, dw.ptr, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
  }
};

// The FP8 1x128 row copy of x [kM, kK] as the layer quantizes it for its Fprop.
struct RowCopy {
  DeviceBuffer<uint8_t> codes{kM * kK};
  DeviceBuffer<float> scales{static_cast<size_t>(fp8_row_scale_count(kM, kK))};
  RowCopy(const bf16* x, Fp8ScaleMode mode) {
    bf16_to_fp8_row(x, kM, kK, mode, codes.ptr, scales.ptr, nullptr, nullptr);
  }
  Fp8RowOperand operand() const { return Fp8RowOperand{codes.ptr, scales.ptr}; }
};

size_t non_finite(const std::vector<bf16>& v) {
  size_t n = 0;
  for (const bf16& e : v) n += std::isfinite(bf16_bits_to_f32(bf16_bits(e))) ? 0 : 1;
  return n;
}

TEST(RecomputeGroupLinear, Fp8RowsFpropIsForwardsOutputBitForBit) {
  FP4MOE_REQUIRE_DEVICE();
  Fp8Layer s;
  s.forward();
  const RowCopy rows(s.x.ptr, s.layer.scale_mode());
  DeviceBuffer<bf16> y2(kM * kN);
  y2.poison(0xFF);
  s.layer.fprop_fp8_rows(rows.operand(), s.split, y2.ptr, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<bf16> y = s.y.download(), again = y2.download();
  EXPECT_EQ(non_finite(y), 0u) << "forward left rows unwritten";
  EXPECT_EQ(non_finite(again), 0u) << "fprop_fp8_rows left rows unwritten";
  test::expect_bitwise_equal(y, again, "Y");
}

TEST(RecomputeGroupLinear, Fp8RowsFpropLeavesBackwardAsForwardLeftIt) {
  FP4MOE_REQUIRE_DEVICE();
  Fp8Layer ref;
  ref.forward();
  ref.backward();
  Fp8Layer t;
  t.forward();
  const RowCopy rows(t.x.ptr, t.layer.scale_mode());
  t.x.poison(0xFF);  // NaN: neither the rerun nor backward may read the caller's BF16 X
  t.layer.fprop_fp8_rows(rows.operand(), t.split, t.y.ptr, nullptr);
  t.backward();
  test::expect_bitwise_equal(ref.y.download(), t.y.download(), "Y");
  test::expect_bitwise_equal(ref.dx.download(), t.dx.download(), "dX");
  test::expect_bitwise_equal(ref.dw.download(), t.dw.download(), "dW");
  EXPECT_EQ(non_finite(t.dx.download()), 0u);
}

TEST(RecomputeGroupLinear, Fp8RowsFpropRejectsWhatItCannotRun) {
  FP4MOE_REQUIRE_DEVICE();
  Fp8Layer s;
  const RowCopy rows(s.x.ptr, s.layer.scale_mode());
  for (const Recipe other : {Recipe::bf16, Recipe::mxfp4}) {
    GroupLinear layer(kG, kN, kK, other, nullptr);
    layer.set_weights(s.w.ptr, nullptr);
    EXPECT_THROW(layer.fprop_fp8_rows(rows.operand(), s.split, s.y.ptr, nullptr), Error)
        << recipe_name(other);
  }
  GroupLinear unset(kG, kN, kK, Recipe::fp8, nullptr);
  EXPECT_THROW(unset.fprop_fp8_rows(rows.operand(), s.split, s.y.ptr, nullptr), Error) << "before set_weights";
  const GroupSplit three{s.offsets.ptr, kOffsets.data(), kG - 1};
  EXPECT_THROW(s.layer.fprop_fp8_rows(rows.operand(), three, s.y.ptr, nullptr), Error) << "another group count";
  EXPECT_THROW(s.layer.fprop_fp8_rows(Fp8RowOperand{nullptr, rows.scales.ptr}, s.split, s.y.ptr, nullptr), Error);
  EXPECT_THROW(s.layer.fprop_fp8_rows(Fp8RowOperand{rows.codes.ptr, nullptr}, s.split, s.y.ptr, nullptr), Error);
  CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace fp4moe
