// Device helpers of the BF16 -> MXFP4 row kernels (bf16_to_mxfp4_row.cu, bf16_to_mxfp4_row_variants.cu): E2M1
// encoders of one 8-element chunk (16 bytes of BF16) and the block exponent from the amax bits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/formats/formats.h"
#include "kernels/quant/bf16_to_mxfp4_row.h"
#include "kernels/quant/layouts.h"
#include "kernels/quant/mx_fast_codecs.h"

namespace fp4moe::detail {

// Argument checks of bf16_to_mxfp4_row (every variant) and the launch of variant 0 (bf16_to_mxfp4_row.cu).
void check_bf16_to_mxfp4_row_args(const char* what, const bf16* x, int64_t M, int64_t K, const uint8_t* codes,
                                  const uint8_t* scales, const MxQuantConfig& cfg,
                                  const unsigned long long* nonfinite_blocks);
void launch_bf16_to_mxfp4_row_v0(const bf16* x, int64_t M, int64_t K, uint8_t* codes, uint8_t* scales,
                                 const MxQuantConfig& cfg, unsigned long long* nonfinite_blocks, cudaStream_t stream);

constexpr int kChunk = 8;  // BF16 elements per chunk (16 bytes); 4 chunks per MX block
static_assert(kMxBlock == 4 * kChunk, "four chunks per MX block");

constexpr uint32_t kBf16AbsNonFinite = 0x7F80;  // |x| bits >= this: Inf or NaN

// E2M1 magnitude code (0..7) of a = |v * 2^-e|, finite: the number of round-to-nearest-even decision points that
// a passes (ties at 0.25, 1.25, 2.5 and 5 go down, at 0.75, 1.75 and 3.5 up; 7 saturates). Branch-free, and
// the same result as f32_to_e2m1_rne (formats.h), which the GPU tests check bit for bit through the reference.
__device__ __forceinline__ uint32_t e2m1_rne_magnitude(float a) {
  return static_cast<uint32_t>(a > 0.25f) + static_cast<uint32_t>(a >= 0.75f) + static_cast<uint32_t>(a > 1.25f) +
         static_cast<uint32_t>(a >= 1.75f) + static_cast<uint32_t>(a > 2.5f) + static_cast<uint32_t>(a >= 3.5f) +
         static_cast<uint32_t>(a > 5.0f);
}

// Stochastic E2M1 magnitude code of a = |v * 2^-e| with u in [0, 1): the rule of f32_to_e2m1_stochastic without
// its search loop. lo = the largest magnitude <= a, and a rounds up with probability (a - lo) / step, the
// division by the power-of-two step done as an exact product.
__device__ __forceinline__ uint32_t e2m1_stochastic_magnitude(float a, float u) {
  const uint32_t lo = static_cast<uint32_t>(a >= 0.5f) + static_cast<uint32_t>(a >= 1.0f) +
                      static_cast<uint32_t>(a >= 1.5f) + static_cast<uint32_t>(a >= 2.0f) +
                      static_cast<uint32_t>(a >= 3.0f) + static_cast<uint32_t>(a >= 4.0f);
  const float lo_value = 0.5f * static_cast<float>(e2m1_half_units(lo));
  const float inv_step = lo < 4u ? 2.0f : (lo < 6u ? 1.0f : 0.5f);  // steps 0.5, 1, 2
  const float p_up = __fmul_rn(__fsub_rn(a, lo_value), inv_step);
  const uint32_t code = u < p_up ? lo + 1u : lo;
  return a >= kE2M1Max ? 7u : code;
}

// Encode 8 BF16 (one chunk) of a finite block, one element at a time: 8 E2M1 codes, element i in bits 4i..4i+3.
// inv_scale = 2^-e; the product is an exact power-of-two scaling (rounded only below 2^-126, far under 0.25).
template <Rounding kRounding>
__device__ __forceinline__ uint32_t encode_chunk_scalar(const uint4& v, float inv_scale, uint64_t seed,
                                                        uint64_t first_index) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  uint32_t packed = 0;
#pragma unroll
  for (int i = 0; i < kChunk; ++i) {
    const uint32_t bits = (i & 1) ? (w[i / 2] & 0xFFFF0000u) : (w[i / 2] << 16);  // BF16 -> fp32 bits
    const float a = fabsf(__fmul_rn(__uint_as_float(bits), inv_scale));
    uint32_t magnitude;
    if constexpr (kRounding == Rounding::rne)
      magnitude = e2m1_rne_magnitude(a);
    else
      magnitude = e2m1_stochastic_magnitude(a, uniform_from_counter(seed, first_index + i));
    packed |= (magnitude | ((bits >> 28) & 8u)) << (4 * i);  // the sign bit of v, -0 included
  }
  return packed;
}

// Exponents for which every decision point times 2^e is a BF16 normal (no rounding, no flush-to-zero question).
constexpr int kPackedMinExponent = -124, kPackedMaxExponent = 125;

__device__ __forceinline__ uint32_t bf16x2_gt_mask(uint32_t a, uint32_t b) {
  uint32_t m;
  asm("set.gt.u32.bf16x2 %0, %1, %2;" : "=r"(m) : "r"(a), "r"(b));
  return m;
}
__device__ __forceinline__ uint32_t bf16x2_ge_mask(uint32_t a, uint32_t b) {
  uint32_t m;
  asm("set.ge.u32.bf16x2 %0, %1, %2;" : "=r"(m) : "r"(a), "r"(b));
  return m;
}

// RNE encode of 8 BF16 (one chunk) for kPackedMinExponent <= e <= kPackedMaxExponent, two elements per compare.
// |x| > p * 2^e exactly when |x| * 2^-e > p, so comparing |x| with the scaled decision points gives the same
// codes as f32_to_e2m1_rne(x * 2^-e). The seven masks form a thermometer per 16-bit half (m1 >= m2 >= ... >= m7)
// whose count is the magnitude code: bit 2 = m4, bit 1 = (m2 & ~m4) | m6, bit 0 = the parity of all seven.
__device__ __forceinline__ uint32_t encode_chunk_rne_packed(const uint4& v, int e) {
  // BF16 bits of the E2M1 rounding decision points 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5. A magnitude passes the
  // even-indexed ones when strictly above them (ties go down) and the odd-indexed ones when at or above (ties up).
  // Both halves of each word hold the point; adding e to the exponent fields of both halves is one add of
  // (e << 7) * 0x10001 modulo 2^32, exact because every result half stays a positive BF16 normal.
  constexpr uint32_t kE2M1DecisionBf16[7] = {0x3E80, 0x3F40, 0x3FA0, 0x3FE0, 0x4020, 0x4060, 0x40A0};
  const uint32_t exponent_step = (static_cast<uint32_t>(e) << 7) * 0x00010001u;
  uint32_t t[7];
#pragma unroll
  for (int i = 0; i < 7; ++i) t[i] = kE2M1DecisionBf16[i] * 0x00010001u + exponent_step;
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  uint32_t pair_codes[4];
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    const uint32_t mag = w[p] & 0x7FFF7FFFu;
    const uint32_t m1 = bf16x2_gt_mask(mag, t[0]), m2 = bf16x2_ge_mask(mag, t[1]), m3 = bf16x2_gt_mask(mag, t[2]),
                   m4 = bf16x2_ge_mask(mag, t[3]), m5 = bf16x2_gt_mask(mag, t[4]), m6 = bf16x2_ge_mask(mag, t[5]),
                   m7 = bf16x2_gt_mask(mag, t[6]);
    const uint32_t b0 = m1 ^ m2 ^ m3 ^ m4 ^ m5 ^ m6 ^ m7, b1 = (m2 & ~m4) | m6, b2 = m4;
    // Low element's code in bits 0..3, high element's in bits 16..19; signs from bits 15 and 31 of the pair.
    const uint32_t c = (b0 & 0x00010001u) | (b1 & 0x00020002u) | (b2 & 0x00040004u) | ((w[p] >> 12) & 0x00080008u);
    pair_codes[p] = c | (c >> 12);  // byte 0: low code | high code << 4
  }
  return __byte_perm(__byte_perm(pair_codes[0], pair_codes[1], 0x0040u), __byte_perm(pair_codes[2], pair_codes[3], 0x0040u),
                     0x5410u);
}

// mx_scale_exponent of a finite, nonzero BF16 amax given by its magnitude bits, read off the exponent field when
// amax is a normal (floor: exponent - 2; ceil: one more when the 7-bit fraction exceeds 1.5; clamped at -127).
__device__ __forceinline__ int block_exponent(uint32_t amax_bits, MxScaleMode mode) {
  const int biased = static_cast<int>(amax_bits >> 7);
  if (biased == 0) return mx_scale_exponent(bf16_bits_to_f32(static_cast<uint16_t>(amax_bits)), mode);
  const int up = (mode == MxScaleMode::ceil && (amax_bits & 0x7Fu) > 0x40u) ? 1 : 0;
  return max(biased - kUE8M0Bias - 2 + up, -127);
}

// Largest BF16 magnitude bits of one chunk (bits order like magnitudes; >= kBf16AbsNonFinite: Inf or NaN).
__device__ __forceinline__ uint32_t chunk_amax_bits(const uint4& v) {
  const uint32_t m2 = __vmaxu2(__vmaxu2(v.x & 0x7FFF7FFFu, v.y & 0x7FFF7FFFu), __vmaxu2(v.z & 0x7FFF7FFFu, v.w & 0x7FFF7FFFu));
  return max(m2 & 0xFFFFu, m2 >> 16);
}

// RNE encode of 8 BF16 (one chunk) for any block exponent e, inv_scale = 2^-e: each element's magnitude is
// scaled by one exact fp32 product (rounded only below 2^-126, far under 0.25) and encoded by
// e2m1_rne_magnitude_by_add (mx_fast_codecs.h): fp32 additions in place of the seven comparisons.
__device__ __forceinline__ uint32_t encode_chunk_rne_by_add(const uint4& v, float inv_scale) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  uint32_t packed = 0;
#pragma unroll
  for (int i = 0; i < kChunk; ++i) {
    const uint32_t bits = (i & 1) ? (w[i / 2] & 0xFFFF0000u) : (w[i / 2] << 16);  // BF16 -> fp32 bits
    const float a = __fmul_rn(__uint_as_float(bits & 0x7FFFFFFFu), inv_scale);
    packed |= (e2m1_rne_magnitude_by_add(a) | ((bits >> 28) & 8u)) << (4 * i);
  }
  return packed;
}

// Stochastic encode of 8 BF16 (one chunk) with the uniforms of uniform_from_counter_fast (the same values as
// uniform_from_counter, fewer instructions).
__device__ __forceinline__ uint32_t encode_chunk_stochastic_fast(const uint4& v, float inv_scale, uint64_t seed,
                                                                 uint64_t first_index) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  uint32_t packed = 0;
#pragma unroll
  for (int i = 0; i < kChunk; ++i) {
    const uint32_t bits = (i & 1) ? (w[i / 2] & 0xFFFF0000u) : (w[i / 2] << 16);
    const float a = fabsf(__fmul_rn(__uint_as_float(bits), inv_scale));
    const uint32_t magnitude = e2m1_stochastic_magnitude(a, uniform_from_counter_fast(seed, first_index + i));
    packed |= (magnitude | ((bits >> 28) & 8u)) << (4 * i);
  }
  return packed;
}

}  // namespace fp4moe::detail
