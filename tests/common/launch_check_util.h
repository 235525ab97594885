// Helpers of the CPU tests of GPU launchers' argument checks: the checks run before any CUDA call, so a launcher
// may be handed addresses no device memory backs and must reject the bad argument without touching them.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>

#include "kernels/common/check.h"

namespace fp4moe::test {

// A non-null pointer of type T at `address` (never dereferenced: the launchers reject before any CUDA call).
template <typename T>
T* fake_device_pointer(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

// Runs `launch`, expects fp4moe::Error whose message holds `part`.
inline void expect_rejected(const std::function<void()>& launch, const std::string& part) {
  try {
    launch();
    FAIL() << "accepted; expected an error mentioning '" << part << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

}  // namespace fp4moe::test
