// Argument checks of the Hopper grouped GEMM's MXFP4 Fprop (grouped_fprop_mxfp4_sm90, kernels/gemm/
// grouped_gemm_sm90.h), which run before any CUDA call, so they are testable without a GPU: the device pointers
// below are never dereferenced (a check fails first, or M = 0 reads nothing).
#include <gtest/gtest.h>

#include <cstdint>

#include "kernels/gemm/grouped_gemm_sm90.h"
#include "tests/common/launch_check_util.h"

namespace fp4moe {
namespace {

using test::expect_rejected;
using test::fake_device_pointer;

TEST(GroupedGemmSm90LaunchChecks, MxFpropRejectsBeforeAnyCudaCall) {
  const auto* offsets = fake_device_pointer<const int32_t>(0x10000);
  const Mxfp4RowOperand x{fake_device_pointer<const uint8_t>(0x20000), fake_device_pointer<const uint8_t>(0x30000)};
  const Fp8BlockStack w{fake_device_pointer<const uint8_t>(0x40000), fake_device_pointer<const float>(0x50000)};
  bf16* y = fake_device_pointer<bf16>(0x60000);
  const auto fprop = [&](Mxfp4RowOperand a, int64_t M, int64_t N, int64_t K, int64_t G, const int32_t* o,
                         Sm90GemmConfig config) {
    return [=] { grouped_fprop_mxfp4_sm90(a, w, M, N, K, o, G, y, nullptr, config); };
  };
  expect_rejected(fprop(x, 64, 512, 2080, 8, offsets, {}), "multiples of 128");
  expect_rejected(fprop(x, 64, 576, 2048, 8, offsets, {}), "multiples of 128");
  expect_rejected(fprop(x, 64, 512, 2048, 0, offsets, {}), "groups");
  expect_rejected(fprop(x, -1, 512, 2048, 8, offsets, {}), "M=-1");
  expect_rejected(fprop(x, 64, 512, 2048, 8, nullptr, {}), "offsets");
  expect_rejected(fprop(x, 64, 384, 2048, 8, offsets, {256}), "block_n");
  expect_rejected(fprop(x, 64, 512, 2048, 8, offsets, {256, true}), "overlap_promotion");
  // The scales need 4-byte alignment (one word per row and K block), the codes 16.
  const Mxfp4RowOperand odd_scales{x.codes, fake_device_pointer<const uint8_t>(0x30002)};
  expect_rejected(fprop(odd_scales, 64, 512, 2048, 8, offsets, {}), "scales 4-byte aligned");
  const Mxfp4RowOperand odd_codes{fake_device_pointer<const uint8_t>(0x20008), x.scales};
  expect_rejected(fprop(odd_codes, 64, 512, 2048, 8, offsets, {}), "codes 16-byte");
  const Mxfp4RowOperand no_scales{x.codes, nullptr};
  expect_rejected(fprop(no_scales, 64, 512, 2048, 8, offsets, {}), "non-null");
  // No rows: nothing read, written or launched, whatever the operand pointers.
  EXPECT_NO_THROW(fprop({nullptr, nullptr}, 0, 512, 2048, 8, offsets, {})());
}

}  // namespace
}  // namespace fp4moe
