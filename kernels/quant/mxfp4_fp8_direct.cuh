// Device pieces of the direct MXFP4 -> FP8 1x128 row rule (mxfp4_row_to_fp8_row.h states the rule; DESIGN.md
// "Direct MXFP4 -> FP8 (row)"), shared by the conversion kernel (mxfp4_row_to_fp8_row.cu) and the Hopper grouped
// GEMM's MXFP4 operand (kernels/gemm/grouped_gemm_sm90.cu), so that both give the same bytes. Integer operations
// only: one byte permute through the per-shift table of e2m1_e4m3_lut.h per four codes, signs moved in by byte
// permutes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/formats/formats.h"
#include "kernels/quant/e2m1_e4m3_lut.h"

namespace fp4moe::detail {

// Eight E2M1 codes (one word of layouts.h's packing: element i in bits 4i .. 4i + 3) -> eight E4M3 codes (.x:
// elements 0..3, .y: 4..7, byte i = element i) with an MX block's table. Magnitudes by one byte permute per four
// codes through the table; signs gathered by byte permutes of the word and of the word shifted left by 4 (the sign
// of element 2j, bit 8j + 3, is bit 7 of byte j of w << 4; that of element 2j + 1 bit 7 of byte j of w), kept where
// sign_mask has bit 7 of a byte set (0x80808080: every code's sign; 0: none, the NaN table's 0x7F codes). Nine
// integer instructions for eight codes.
__device__ __forceinline__ uint2 convert8(uint32_t w, E2M1ToE4M3Lut t, uint32_t sign_mask) {
  const uint32_t m = w & 0x77777777u;
  const uint32_t shifted = w << 4;
  const uint32_t signs_lo = __byte_perm(shifted, w, 0x5140u);  // bit 7 of each byte: signs of elements 0..3
  const uint32_t signs_hi = __byte_perm(shifted, w, 0x7362u);  // elements 4..7
  const uint32_t lo = __byte_perm(t.lo, t.hi, m);               // the selector is the low 16 bits: elements 0..3
  const uint32_t hi = __byte_perm(t.lo, t.hi, m >> 16);
  return make_uint2(lo | (signs_lo & sign_mask), hi | (signs_hi & sign_mask));
}

// 16 E2M1 codes (w0: elements 0..7, w1: 8..15, packed as layouts.h's MXFP4 codes) of one MX block -> 16 E4M3
// codes (byte i = element i) with the block's table.
__device__ __forceinline__ uint4 convert16(uint32_t w0, uint32_t w1, E2M1ToE4M3Lut t) {
  const uint2 a = convert8(w0, t, 0x80808080u), b = convert8(w1, t, 0x80808080u);
  return make_uint4(a.x, a.y, b.x, b.y);
}

// s = direct_group_scale_exponent(E) of a group whose four scale bytes are `group_scales` (byte i = MX block i;
// 0xFF for NaN blocks and for blocks past a short last group), 0 when every block is NaN. Packed byte maxima:
// byte b + 1 (mod 256, bytewise without carries) puts NaN (0xFF) at 0, below every finite exponent byte (0..254 ->
// 1..255); then the largest of the four bytes.
__device__ __forceinline__ int group_scale_exponent(uint32_t group_scales) {
  const uint32_t biased = ((group_scales & 0x7F7F7F7Fu) + 0x01010101u) ^ (group_scales & 0x80808080u);
  const uint32_t top = max(max(biased & 0xFFu, __byte_perm(biased, 0u, 0x4441u)),
                           max(__byte_perm(biased, 0u, 0x4442u), __byte_perm(biased, 0u, 0x4443u)));
  return top == 0u ? 0 : direct_group_scale_exponent(static_cast<int>(top) - 1 - kUE8M0Bias);
}

// 16 E4M3 codes of 16 E2M1 codes (w0: elements 0..7, w1: 8..15) of an MX block with scale byte `own` in a group
// of scale exponent s: 0x7F (E4M3 NaN) everywhere for a NaN block.
__device__ __forceinline__ uint4 convert16_block(uint32_t w0, uint32_t w1, uint32_t own, int s) {
  if (own == kUE8M0NaN) return make_uint4(0x7F7F7F7Fu, 0x7F7F7F7Fu, 0x7F7F7F7Fu, 0x7F7F7F7Fu);
  return convert16(w0, w1, e2m1_to_e4m3_lut(static_cast<int>(own) - kUE8M0Bias - s));
}

}  // namespace fp4moe::detail
