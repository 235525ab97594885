// Launcher argument checks that run before any CUDA call, so they are testable without a GPU: the pointers below
// are never dereferenced on the host (the check fails first).
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "kernels/common/check.h"
#include "kernels/quant/bf16_to_fp8.h"

namespace fp4moe {
namespace {

template <typename T>
T* fake_device_pointer(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

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

}  // namespace
}  // namespace fp4moe
