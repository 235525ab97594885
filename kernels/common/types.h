// Element types shared by kernels, references and tests.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>

namespace fp4moe {

using bf16 = __nv_bfloat16;  // 2 bytes, the bits of an IEEE fp32's top half

// The 16 bits of a BF16 value and back (a reinterpretation, no rounding).
inline uint16_t bf16_bits(bf16 x) {
  uint16_t b;
  std::memcpy(&b, static_cast<const void*>(&x), 2);
  return b;
}
inline bf16 bf16_from_bits(uint16_t b) {
  bf16 x;
  std::memcpy(static_cast<void*>(&x), &b, 2);
  return x;
}

// For a >= 0 and b > 0 (not checked): ceil(a / b), and a rounded up to a multiple of b.
constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
constexpr int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

}  // namespace fp4moe
