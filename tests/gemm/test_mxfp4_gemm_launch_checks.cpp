// Argument checks of the grouped MXFP4 Wgrad (kernels/gemm/mxfp4_gemm.h) and of GroupedGemm::wgrad_fp8's token
// padding, which run before any CUDA call, so they are testable without a GPU: the device pointers below are never
// dereferenced on the host (the check fails first), and a GroupedGemm makes no CUDA call until it launches.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "kernels/common/check.h"
#include "kernels/gemm/grouped_gemm.h"
#include "kernels/gemm/mxfp4_gemm.h"
#include "tests/common/launch_check_util.h"

namespace fp4moe {
namespace {

using test::expect_rejected;
using test::fake_device_pointer;

TEST(Mxfp4GemmLaunchChecks, GroupedWgradRejectsBeforeAnyConversion) {
  GroupedGemm gg;
  const int32_t host_offsets[3] = {0, 40, 100};
  const int32_t bad_offsets[3] = {0, 50, 40};
  const auto* d_offsets = fake_device_pointer<const int32_t>(0x10000);
  const Mxfp4ColOperand dy{fake_device_pointer<const uint8_t>(0x20000), fake_device_pointer<const uint8_t>(0x30000)};
  const Mxfp4ColOperand x{fake_device_pointer<const uint8_t>(0x40000), fake_device_pointer<const uint8_t>(0x50000)};
  void* ws = fake_device_pointer<void>(0x100000);
  const int64_t N = 64, K = 128;
  const size_t bytes = mxfp4_wgrad_workspace_bytes(100, N, K, 2);
  const GroupSplit split{d_offsets, host_offsets, 2};
  const GemmOutput dw{fake_device_pointer<void>(0x900000), GemmOutType::fp32, false};
  auto run = [&](int64_t n, const GroupSplit& s, Mxfp4ColOperand a, size_t ws_bytes, GemmOutput out) {
    mxfp4_wgrad_grouped(gg, a, x, n, K, s, ws, ws_bytes, out, nullptr);
  };
  expect_rejected([&] { run(40, split, dy, bytes, dw); }, "N and K must be positive multiples of 16");
  expect_rejected([&] { run(N, GroupSplit{d_offsets, bad_offsets, 2}, dy, bytes, dw); }, "mxfp4_wgrad_grouped");
  expect_rejected([&] { run(N, GroupSplit{nullptr, host_offsets, 2}, dy, bytes, dw); }, "device and host offsets");
  expect_rejected([&] { run(N, split, dy, bytes - 1, dw); }, "too small");
  expect_rejected([&] { run(N, split, Mxfp4ColOperand{dy.codes + 8, dy.scales}, bytes, dw); }, "dY needs");
  expect_rejected([&] { run(N, split, dy, bytes, GemmOutput{dw.data, GemmOutType::bf16, true}); },
                  "accumulation needs an FP32 output");
  // 32 tokens per group for 100 tokens over 2 groups: 64 + 96 padded tokens at most (M + 31 G).
  EXPECT_GE(bytes, static_cast<size_t>((N + K) * (100 + 31 * 2)));
}

TEST(Mxfp4GemmLaunchChecks, WgradFp8TakesTokenPadding16Or32Only) {
  GroupedGemm gg;
  const int32_t host_offsets[2] = {0, 64};
  const auto* d_offsets = fake_device_pointer<const int32_t>(0x10000);
  const Fp8ColOperand op{fake_device_pointer<const uint8_t>(0x20000), fake_device_pointer<const float>(0x30000)};
  const GemmOutput dw{fake_device_pointer<void>(0x900000), GemmOutType::fp32, false};
  expect_rejected([&] { gg.wgrad_fp8(op, op, 64, 64, GroupSplit{d_offsets, host_offsets, 1}, dw, nullptr, 8); },
                  "token_pad must be 16");
}

}  // namespace
}  // namespace fp4moe
