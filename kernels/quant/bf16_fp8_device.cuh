// Device helpers shared by the BF16 -> FP8 kernels: amax as an integer maximum of BF16 magnitude bits, and the
// E4M3 encode through the hardware cvt.rn.satfinite.e4m3x2.f32 (round to nearest even, saturation to +-448:
// the same result as f32_to_e4m3_satfinite in formats.h, checked bit for bit by the GPU tests).
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/quant/fp8_block_scale.h"

namespace fp4moe::detail {

// Per-half maximum of the magnitude bits of two BF16 (|x| orders like its bits; NaN and Inf exceed every finite
// value, so a block holds NaN/Inf iff its maximum is >= 0x7F80).
__device__ __forceinline__ uint32_t bf16x2_abs_max(uint32_t acc, uint32_t pair) {
  return __vmaxu2(acc, pair & 0x7FFF7FFFu);
}

__device__ __forceinline__ uint32_t bf16_lo_to_f32_bits(uint32_t pair) { return pair << 16; }
__device__ __forceinline__ uint32_t bf16_hi_to_f32_bits(uint32_t pair) { return pair & 0xFFFF0000u; }

// E4M3 codes of a * m (low byte) and b * m (high byte): one fp32 product each, then RNE with saturation.
__device__ __forceinline__ uint32_t e4m3x2_scaled(uint32_t a_bits, uint32_t b_bits, float m) {
  float2 v = make_float2(__fmul_rn(__uint_as_float(a_bits), m), __fmul_rn(__uint_as_float(b_bits), m));
  return static_cast<uint32_t>(__nv_cvt_float2_to_fp8x2(v, __NV_SATFINITE, __NV_E4M3));
}

// Four BF16 elements (w0 = elements 0, 1; w1 = elements 2, 3) -> four E4M3 codes, byte i = element i.
__device__ __forceinline__ uint32_t bf16x4_to_e4m3x4(uint32_t w0, uint32_t w1, float m) {
  return e4m3x2_scaled(bf16_lo_to_f32_bits(w0), bf16_hi_to_f32_bits(w0), m) |
         (e4m3x2_scaled(bf16_lo_to_f32_bits(w1), bf16_hi_to_f32_bits(w1), m) << 16);
}

// Sixteen BF16 values of one feature (its half of each pair word) -> sixteen E4M3 codes along tokens.
template <bool kHigh>
__device__ __forceinline__ uint4 bf16_column16_to_e4m3(const uint32_t (&pairs)[16], float m) {
  uint32_t w[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    uint32_t b[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) b[i] = kHigh ? bf16_hi_to_f32_bits(pairs[4 * q + i]) : bf16_lo_to_f32_bits(pairs[4 * q + i]);
    w[q] = e4m3x2_scaled(b[0], b[1], m) | (e4m3x2_scaled(b[2], b[3], m) << 16);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Sixteen E4M3 NaN codes for the first `valid` tokens, zeros after (the padding of a column group).
__device__ __forceinline__ uint4 e4m3_nan16(int valid) {
  uint32_t w[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    w[q] = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i)
      if (4 * q + i < valid) w[q] |= uint32_t{kE4M3NaN} << (8 * i);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

}  // namespace fp4moe::detail
