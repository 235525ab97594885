// Packed lookup table for the direct MXFP4 -> FP8 rule: the E4M3 codes of the eight E2M1 magnitudes scaled by
// 2^shift, byte i = e2m1_to_e4m3_shifted(i, shift) (formats.h). All elements of one MX block share one shift,
// so a kernel builds one table per (token, MX block) and converts four codes at a time with one byte permute.
// Integer operations only. Checked against e2m1_to_e4m3_shifted for every shift in tests/quant/test_quant_col_ref.cpp.
#pragma once

#include <cstdint>

#include "kernels/formats/formats.h"

namespace fp4moe {

struct E2M1ToE4M3Lut {
  uint32_t lo;  // bytes 0..3: magnitudes 0, 0.5, 1, 1.5
  uint32_t hi;  // bytes 4..7: magnitudes 2, 3, 4, 6
};

// shift <= 6 (the direct rule never exceeds it). For -5 <= shift <= 6 every nonzero magnitude stays an E4M3
// normal and its code is the shift-0 code plus 8 * shift in the exponent field (one packed add, no carries
// between bytes); below, results reach the E4M3 subnormals and each byte comes from e2m1_to_e4m3_shifted.
FP4MOE_HD E2M1ToE4M3Lut e2m1_to_e4m3_lut(int shift) {
  // Codes at shift 0: 0 -> 0x00, 0.5 -> 0x30, 1 -> 0x38, 1.5 -> 0x3C, 2 -> 0x40, 3 -> 0x44, 4 -> 0x48, 6 -> 0x4C.
  constexpr uint32_t kLo0 = 0x3C383000u, kHi0 = 0x4C484440u;
  if (shift >= -5) {
    uint32_t d = static_cast<uint32_t>(shift * 8);  // modulo 2^32: a negative d subtracts from each byte
    return {kLo0 + d * 0x01010100u, kHi0 + d * 0x01010101u};
  }
  E2M1ToE4M3Lut t{0u, 0u};
  for (uint32_t i = 1; i < 4; ++i) t.lo |= static_cast<uint32_t>(e2m1_to_e4m3_shifted(static_cast<uint8_t>(i), shift)) << (8 * i);
  for (uint32_t i = 0; i < 4; ++i)
    t.hi |= static_cast<uint32_t>(e2m1_to_e4m3_shifted(static_cast<uint8_t>(4 + i), shift)) << (8 * i);
  return t;
}

}  // namespace fp4moe
