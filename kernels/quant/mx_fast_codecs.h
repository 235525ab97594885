// Cheaper formulations of two rules of formats.h, used by the BF16 -> MXFP4 row kernel
// (bf16_to_mxfp4_row.cu): the same results bit for bit, computed with fewer integer-pipe instructions.
// Host and device alike, so that the CPU tests compare them with formats.h exhaustively (tests/gpu/
// test_quant_row.cpp, host-only tests that run without a device).
#pragma once

#include <cstdint>

#include "kernels/formats/formats.h"

namespace fp4moe::detail {

// The E2M1 magnitude code (0..7) of a finite a >= 0 with a < 2^105, rounded to nearest even with saturation:
// the magnitude code of f32_to_e2m1_rne(a). One fp32 addition does the rounding: the E2M1 grid near a has step
// 2^max(E-1, -1), E = floor(log2 a), which is the ulp of M = 2^max(E+22, 22); a + M rounds a to that step
// (round to nearest even, as the hardware adds), and the low bits of a + M minus M count the steps, q. The code
// is q plus 2 max(E, 0) (q in 0..4 below 2, in 2..4 above; the codes of 1, 2, 4 are 2, 4, 6), clamped at 7.
// In an MX block a = |v| 2^-e < 8 always (e >= floor(log2 amax) - 2).
FP4MOE_HD uint32_t e2m1_rne_magnitude_by_add(float a) {
  const uint32_t ua = f32_bits(a);
  const uint32_t scaled = (ua & 0x7F800000u) + (22u << 23);  // 2^(E+22) (a normal: its fraction bits are 0)
  const uint32_t magic = scaled > 0x4A800000u ? scaled : 0x4A800000u;  // at least 2^22
  const float t = a + f32_from_bits(magic);
  const uint32_t code = (f32_bits(t) - magic) + ((magic - 0x4A800000u) >> 22);
  return code < 7u ? code : 7u;
}

// uniform_from_counter(seed, index) (formats.h) with two steps of the outer splitmix64 finaliser dropped that
// cannot change its top 24 bits: h >> 40 = (z ^ (z >> 31)) >> 40 = z >> 40 (z >> 71 is 0), and only the high
// word of the last 64-bit product is needed (lo * C_lo's high half plus the two cross products' low halves).
// Returns the 24-bit integer k; the uniform is k * 2^-24.
FP4MOE_HD uint32_t counter_bits24(uint64_t seed, uint64_t index) {
  uint64_t z = seed ^ mix64(index + 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z ^= z >> 27;
  constexpr uint32_t kC2Lo = 0x133111EBu, kC2Hi = 0x94D049BBu;  // 0x94D049BB133111EB
  const uint32_t lo = static_cast<uint32_t>(z), hi = static_cast<uint32_t>(z >> 32);
#if defined(__CUDA_ARCH__)
  const uint32_t lo_lo_high = __umulhi(lo, kC2Lo);
#else
  const uint32_t lo_lo_high = static_cast<uint32_t>((uint64_t{lo} * kC2Lo) >> 32);
#endif
  const uint32_t top = lo_lo_high + lo * kC2Hi + hi * kC2Lo;  // bits 32..63 of z * C2 (mod 2^64)
  return top >> 8;
}

// The same float as uniform_from_counter(seed, index): k < 2^24 converts exactly and the product is exact.
FP4MOE_HD float uniform_from_counter_fast(uint64_t seed, uint64_t index) {
  return static_cast<float>(counter_bits24(seed, index)) * (1.0f / 16777216.0f);
}

}  // namespace fp4moe::detail
