// Device pieces of the direct MXFP4 -> FP8 1x128 row rule (mxfp4_row_to_fp8_row.h states the rule; DESIGN.md
// "Direct MXFP4 -> FP8 (row)"), shared by the conversion kernel (mxfp4_row_to_fp8_row.cu) and the Hopper grouped
// GEMM's MXFP4 operand (kernels/gemm/grouped_gemm_sm90.cu), so that both give the same bytes. Integer operations
// only: one byte permute through the per-shift table of e2m1_e4m3_lut.h per four codes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/formats/formats.h"
#include "kernels/quant/e2m1_e4m3_lut.h"

namespace fp4moe::detail {

// Sign bits of four E2M1 codes moved to bit 7 of their E4M3 bytes. `dup` holds the two code bytes as
// [b0, b0, b1, b1]: element 0 is b0's low nibble (sign at bit 3), element 1 b0's high nibble (bit 15 of dup),
// element 2 b1's low nibble (bit 19), element 3 b1's high nibble (bit 31).
__device__ __forceinline__ uint32_t e2m1x4_signs_to_e4m3(uint32_t dup) {
  return ((dup << 4) & 0x00800080u) | (dup & 0x80008000u);
}

// 16 E2M1 codes (w0: elements 0..7, w1: 8..15, packed as layouts.h's MXFP4 codes) of one MX block -> 16 E4M3
// codes (byte i = element i) with the block's table.
__device__ __forceinline__ uint4 convert16(uint32_t w0, uint32_t w1, E2M1ToE4M3Lut t) {
  const uint32_t w[2] = {w0, w1};
  uint32_t out[4];
#pragma unroll
  for (int h = 0; h < 4; ++h) {
    const uint32_t word = w[h / 2];
    const uint32_t quad = (h & 1) ? (word >> 16) : word;  // four codes in the low 16 bits
    const uint32_t magnitudes = __byte_perm(t.lo, t.hi, quad & 0x7777u);
    out[h] = magnitudes | e2m1x4_signs_to_e4m3(__byte_perm(quad, 0u, 0x1100u));
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// s = direct_group_scale_exponent(E) of a group whose four scale bytes are `group_scales` (byte i = MX block i;
// 0xFF for NaN blocks and for blocks past a short last group), 0 when every block is NaN. Packed byte maxima:
// byte b + 1 (mod 256) puts NaN (0xFF) at 0, below every finite exponent byte (0..254 -> 1..255).
__device__ __forceinline__ int group_scale_exponent(uint32_t group_scales) {
  const uint32_t biased = __vadd4(group_scales, 0x01010101u);
  uint32_t top = __vmaxu4(biased, biased >> 16);
  top = max(top & 0xFFu, (top >> 8) & 0xFFu);
  return top == 0u ? 0 : direct_group_scale_exponent(static_cast<int>(top) - 1 - kUE8M0Bias);
}

// 16 E4M3 codes of 16 E2M1 codes (w0: elements 0..7, w1: 8..15) of an MX block with scale byte `own` in a group
// of scale exponent s: 0x7F (E4M3 NaN) everywhere for a NaN block.
__device__ __forceinline__ uint4 convert16_block(uint32_t w0, uint32_t w1, uint32_t own, int s) {
  if (own == kUE8M0NaN) return make_uint4(0x7F7F7F7Fu, 0x7F7F7F7Fu, 0x7F7F7F7Fu, 0x7F7F7F7Fu);
  return convert16(w0, w1, e2m1_to_e4m3_lut(static_cast<int>(own) - kUE8M0Bias - s));
}

}  // namespace fp4moe::detail
