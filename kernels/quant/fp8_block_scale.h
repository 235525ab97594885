// The scale of one FP8 1x128 or 128x128 block from its amax, host and device alike (DESIGN.md "FP8 1x128 block").
// Shared by the BF16 -> FP8 kernels and their CPU references so that both apply the same rule; the rule itself
// is pinned down by hand-computed examples in tests/quant/test_quant_col_ref.cpp and checked over the whole fp32
// range in tests/quant/test_fp8_scale_range.cpp.
#pragma once

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
//   otherwise       -> the pow2 or fp32 rule stated at Fp8ScaleMode in formats.h: s >= 2^-126 normal, multiplier
//                      <= 2^126 normal, s * multiplier = 1 to fp32 rounding for every finite amax.
FP4MOE_HD Fp8BlockScale fp8_block_scale(float amax, Fp8ScaleMode mode) {
  if (!f32_is_finite(amax)) return {f32_from_bits(0x7FC00000u), 0.0f, true};
  if (amax == 0.0f) return {1.0f, 1.0f, false};
  // 448 * 2^-126 = 1.75 * 2^-118, exact: below it the fp32 quotient amax / 448 is not a normal fp32.
  const float floor_amax = kE4M3Max * exp2_exact(kFp8MinScaleExponent);
  if (mode == Fp8ScaleMode::pow2 || amax < floor_amax) {
    int p = fp8_pow2_scale_exponent(amax);  // kFp8MinScaleExponent when amax < floor_amax
    return {exp2_exact(p), exp2_exact(-p), false};
  }
  return {amax / kE4M3Max, kE4M3Max / amax, false};
}

// The canonical NaN written as the scale of a non-finite block (the same bits on host and device).
constexpr uint32_t kFp8NanScaleBits = 0x7FC00000u;

}  // namespace fp4moe
