// Argument checks of the Hopper grouped Wgrad (grouped_wgrad_fp8_sm90, kernels/gemm/grouped_wgrad_sm90.h), which run
// before any CUDA call, so they are testable without a GPU: the device pointers below are never dereferenced (a
// check fails first).
#include <gtest/gtest.h>

#include <cstdint>

#include "kernels/gemm/grouped_wgrad_sm90.h"
#include "tests/common/launch_check_util.h"

namespace fp4moe {
namespace {

using test::expect_rejected;
using test::fake_device_pointer;

TEST(GroupedWgradSm90LaunchChecks, RejectsBeforeAnyCudaCall) {
  const auto* offsets = fake_device_pointer<const int32_t>(0x10000);
  const Fp8ColOperand dy{fake_device_pointer<const uint8_t>(0x20000), fake_device_pointer<const float>(0x30000)};
  const Fp8ColOperand x{fake_device_pointer<const uint8_t>(0x40000), fake_device_pointer<const float>(0x50000)};
  const GemmOutput fp32{fake_device_pointer<float>(0x60000), GemmOutType::fp32, false};
  const auto wgrad = [&](Fp8ColOperand a, int64_t M, int64_t N, int64_t K, int64_t G, const int32_t* o, GemmOutput out,
                         int64_t pad) {
    return [=] { grouped_wgrad_fp8_sm90(a, x, M, N, K, o, G, out, nullptr, pad); };
  };
  expect_rejected(wgrad(dy, 64, 512, 2080, 8, offsets, fp32, 16), "multiples of 128");
  expect_rejected(wgrad(dy, 64, 576, 2048, 8, offsets, fp32, 16), "multiples of 128");
  expect_rejected(wgrad(dy, 64, 512, 2048, 0, offsets, fp32, 16), "groups");
  expect_rejected(wgrad(dy, 64, 512, 2048, 1025, offsets, fp32, 16), "groups");
  expect_rejected(wgrad(dy, 64, 512, 2048, 8, offsets, fp32, 64), "token_pad");
  expect_rejected(wgrad(dy, -1, 512, 2048, 8, offsets, fp32, 16), "M=-1");
  expect_rejected(wgrad(dy, kWgradSm90MaxTokens + 1, 512, 2048, 8, offsets, fp32, 16), "tokens");
  expect_rejected(wgrad(dy, 64, 512, 2048, 8, nullptr, fp32, 16), "offsets");
  expect_rejected(wgrad(dy, 64, 512, 2048, 8, fake_device_pointer<const int32_t>(0x10002), fp32, 16),
                  "4-byte aligned");
  expect_rejected(wgrad(dy, 64, int64_t{1} << 18, int64_t{1} << 18, 1024, offsets, fp32, 16), "fit int32");
  expect_rejected(wgrad(dy, 64, 512, 2048, 8, offsets, GemmOutput{fp32.data, GemmOutType::bf16, true}, 16),
                  "accumulation");
  const Fp8ColOperand odd_codes{fake_device_pointer<const uint8_t>(0x20008), dy.scales};
  expect_rejected(wgrad(odd_codes, 64, 512, 2048, 8, offsets, fp32, 16), "16-byte aligned");
  const Fp8ColOperand no_scales{dy.codes, nullptr};
  expect_rejected(wgrad(no_scales, 64, 512, 2048, 8, offsets, fp32, 16), "16-byte aligned");
  expect_rejected(wgrad(dy, 64, 512, 2048, 8, offsets, GemmOutput{nullptr, GemmOutType::fp32, false}, 16),
                  "16-byte aligned");
}

}  // namespace
}  // namespace fp4moe
