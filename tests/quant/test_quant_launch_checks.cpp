// Launcher argument checks that run before any CUDA call, so they are testable without a GPU: the pointers below
// are never dereferenced on the host (the check fails first).
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "kernels/common/check.h"
#include "kernels/quant/bf16_to_fp8.h"
#include "kernels/quant/bf16_to_mxfp4_col.h"
#include "tests/common/launch_check_util.h"

namespace fp4moe {
namespace {

using test::expect_rejected;
using test::fake_device_pointer;

void expect_counter_rejected(const std::function<void()>& launch, const std::string& what) {
  try {
    launch();
    FAIL() << what << ": a misaligned nonfinite_blocks counter was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nonfinite_blocks must be null or an 8-byte aligned"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(QuantLaunchChecks, Fp8QuantizersRejectAMisalignedNonfiniteCounterBeforeLaunch) {
  const auto* x = fake_device_pointer<const bf16>(0x10000);
  auto* codes = fake_device_pointer<uint8_t>(0x20000);
  auto* scales = fake_device_pointer<float>(0x30000);
  const auto* offsets = fake_device_pointer<const int32_t>(0x40000);
  auto* counter = fake_device_pointer<unsigned long long>(0x50004);  // 4-byte aligned only
  const int32_t host_offsets[2] = {0, 128};
  expect_counter_rejected(
      [&] { bf16_to_fp8_row(x, 128, 256, Fp8ScaleMode::pow2, codes, scales, counter, nullptr); }, "bf16_to_fp8_row");
  expect_counter_rejected(
      [&] {
        bf16_to_fp8_col(x, 128, 256, offsets, 1, host_offsets, Fp8ScaleMode::pow2, codes, scales, counter, nullptr);
      },
      "bf16_to_fp8_col");
  expect_counter_rejected(
      [&] { bf16_to_fp8_block128(x, 128, 256, Fp8ScaleMode::pow2, false, codes, scales, counter, nullptr); },
      "bf16_to_fp8_block128");
}

TEST(QuantLaunchChecks, Mxfp4ColumnQuantizersRejectBeforeLaunch) {
  const auto* x = fake_device_pointer<const bf16>(0x10000);
  auto* codes = fake_device_pointer<uint8_t>(0x20000);
  auto* scales = fake_device_pointer<uint8_t>(0x30000);
  const auto* offsets = fake_device_pointer<const int32_t>(0x40000);
  const MxQuantConfig cfg;
  const int32_t host_offsets[3] = {0, 100, 90};  // decreasing
  expect_rejected([&] { bf16_to_mxfp4_col(x, 48, 256, codes, scales, cfg, nullptr, nullptr); }, "[48, 256]");
  expect_rejected([&] { bf16_to_mxfp4_col(x, 64, 12, codes, scales, cfg, nullptr, nullptr); }, "[64, 12]");
  expect_rejected([&] { bf16_to_mxfp4_col(x + 1, 64, 256, codes, scales, cfg, nullptr, nullptr); },
                  "x must be 16-byte aligned");
  expect_rejected([&] { bf16_to_mxfp4_col(x, 64, 256, codes + 4, scales, cfg, nullptr, nullptr); },
                  "codes must be 16-byte aligned");
  expect_rejected(
      [&] {
        bf16_to_mxfp4_col(x, 64, 256, codes, scales, cfg, fake_device_pointer<unsigned long long>(0x50004), nullptr);
      },
      "nonfinite_blocks must be 8-byte aligned");
  expect_rejected(
      [&] { bf16_to_mxfp4_col_ragged(x, 90, 256, offsets, 2, host_offsets, codes, scales, cfg, nullptr, nullptr); },
      "bf16_to_mxfp4_col_ragged");
  expect_rejected(
      [&] { bf16_to_mxfp4_col_ragged(x, 90, 256, nullptr, 2, nullptr, codes, scales, cfg, nullptr, nullptr); },
      "device group offsets are null");
  expect_rejected(
      [&] { bf16_to_mxfp4_col_ragged(x, 90, 256, offsets, 1025, nullptr, codes, scales, cfg, nullptr, nullptr); },
      "G must be in [1, 1024]");
}

}  // namespace
}  // namespace fp4moe
