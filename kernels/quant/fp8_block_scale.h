// The scale of one FP8 1x128 or 128x128 block from its amax, host and device alike (DESIGN.md "FP8 1x128 block").
// Shared by the BF16 -> FP8 kernels and their CPU references so that both apply the same rule; the rule itself
// is pinned down by hand-computed examples in tests/cpu/test_quant_col_ref.cpp.
#pragma once

#include <cfloat>
#include <cstdint>

#include "kernels/formats/formats.h"

namespace fp4moe {

struct Fp8BlockScale {
  float scale;       // dequantization scale s: value = e4m3(code) * s. NaN for a block holding NaN/Inf.
  float multiplier;  // code_i = E4M3(v_i * multiplier), one fp32 product rounded to nearest, then RNE/satfinite
  bool nonfinite;    // the block holds NaN or +-Inf: every code is 0x7F (E4M3 NaN) and the block is counted
};

// amax = max |v| over the block (NaN when a NaN is present, +Inf when an Inf is).
//   non-finite amax -> s = NaN, nonfinite = true;
//   amax = 0        -> s = 1, multiplier 1 (codes are zeros; a -0 input keeps its sign bit, 0x80);
//   pow2            -> p = fp8_pow2_scale_exponent(amax) (smallest p with amax <= 448 * 2^p, clamped to
//                      [-126, 127]), s = 2^p, multiplier 2^-p (the product is exact);
//   fp32            -> s = amax / 448, multiplier 448 / amax (both fp32 round-to-nearest divisions; a quotient
//                      that overflows to +Inf for tiny amax is saturated to FLT_MAX).
FP4MOE_HD Fp8BlockScale fp8_block_scale(float amax, Fp8ScaleMode mode) {
  if (!f32_is_finite(amax)) return {f32_from_bits(0x7FC00000u), 0.0f, true};
  if (amax == 0.0f) return {1.0f, 1.0f, false};
  if (mode == Fp8ScaleMode::pow2) {
    int p = fp8_pow2_scale_exponent(amax);
    return {exp2_exact(p), exp2_exact(-p), false};
  }
  float multiplier = kE4M3Max / amax;
  if (!f32_is_finite(multiplier)) multiplier = FLT_MAX;
  return {amax / kE4M3Max, multiplier, false};
}

// The canonical NaN written as the scale of a non-finite block (the same bits on host and device).
constexpr uint32_t kFp8NanScaleBits = 0x7FC00000u;

}  // namespace fp4moe
