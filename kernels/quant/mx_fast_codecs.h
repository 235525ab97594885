// Cheaper formulations of the E2M1 encoders of formats.h, used by the BF16 -> MXFP4 row kernel
// (bf16_to_mxfp4_row.cu): the same results bit for bit, computed with fewer instructions.
// Host and device, so that tests compare them with formats.h without a device: the BF16x2 RNE encoder on every
// BF16 pair (tests/quant/test_quant_row_gpu.cpp, host-only tests), the stochastic encoder on every E2M1 boundary
// and its FP32 neighbours, random FP32 values and subnormals, with draws around each decision (CPU tests,
// tests/quant/test_mx_fast_codecs.cpp). Where a device branch computes the same bits otherwise (intrinsics and
// pinned instructions for the pipes), a GPU test covers it: tests/quant/test_mx_rne_encoder_gpu.cu,
// tests/quant/test_mx_sr_encoders_gpu.cu.
#pragma once

#include <cuda_bf16.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/formats/formats.h"

namespace fp4moe::detail {

// E2M1 codes of two BF16 elements at once, rounded to nearest even with saturation: the codes of
// f32_to_e2m1_rne(v * 2^-e) for both halves of w (element 0 in bits 0..3 of the result, element 1 in bits
// 16..19, sign in bit 3 of each, -0 kept), given inv2 = 2^-e in both halves. Valid for a finite block: every
// |v| * 2^-e < 8 (e >= floor(log2 amax) - 2) and e in [-127, 126] (2^-e a BF16 normal).
// In BF16x2 arithmetic, two elements per instruction: a = |v| * 2^-e is one product by a power of two (exact;
// below 2^-126 it is rounded to a subnormal or 0, far under 0.25: code 0 either way). a is clamped at 6 (E2M1's
// largest, so that 7 and more saturate rather than round to 8). a + 2^(max(E_a, 0) + 6), E_a = floor(log2 a), in
// BF16 (7 fraction bits) rounds a to the E2M1 step of its binade (0.5 below 2, 1 in [2, 4), 2 in [4, 8)) with
// ties to even, as E2M1 does; the code is the integer difference of the two BF16 bit patterns plus 2 per binade
// above the first. Both halves' integer steps stay inside their 16 bits (no borrow or carry between them). The
// _rn intrinsics keep each product and sum a separate correctly rounded operation.
FP4MOE_HD __nv_bfloat162 bf162_from_bits(uint32_t u) {
  __nv_bfloat162 r;
  memcpy(static_cast<void*>(&r), &u, sizeof r);
  return r;
}
FP4MOE_HD uint32_t bits_of_bf162(__nv_bfloat162 v) {
  uint32_t r;
  memcpy(&r, &v, sizeof r);
  return r;
}

// The magnitudes of the two BF16 halves of w: w & 0x7FFF7FFF for finite values (on the device a BF16x2 absolute
// value, an operand modifier of a fused multiply-add on the FMA pipe, where a mask would take the integer/logic
// pipe); for a NaN half some NaN, whose bits as an unsigned integer are >= 0x7F81 either way.
FP4MOE_HD uint32_t bf16x2_magnitude(uint32_t w) {
#if defined(__CUDA_ARCH__)
  return bits_of_bf162(__habs2(bf162_from_bits(w)));
#else
  return w & 0x7FFF7FFFu;
#endif
}

// The magnitude codes alone, times 2^12 (per half 0..7 in bits 12..14 and 28..30, the high nibbles of bytes 1 and
// 3; bits 15 and 31 are 0, the other bits hold other values): the form the kernels gather (encode_chunk_rne in
// mx_quant_device.cuh, encode_col_block_rne in mx_col_block.cuh), where each element's code sits below its BF16
// sign bit. With s = t - magic (per half the rounded steps, 0..4) and k = (magic - kBase) / 2^7 (the binade above
// the first, 0..2), the code is s + 2k, and 2^12 (s + 2k) = 2^12 t - 4032 magic - 64 kBase per half; each half's
// value lies in [0, 7 * 2^12], so the 32-bit word holds both without a carry or borrow between them. The word
// computed is
// (2^12 + 2^16) t - (2^12 + 2^16 - 64) magic - 64 kBase: the extra 2^16 (t - magic) adds the low half's steps
// (0..4) to bits 16..18 and nothing else (the high half's share is past bit 31). Neither factor is then a power of
// two, so the compiler keeps both multiply-adds on the FMA pipe (a power of two becomes a shift or LEA).
// On the device, with the same bits: 2^E_a * 2^6 by a BF16x2 product (exact) instead of the exponent field plus 6
// (where that field is 0, a < 2^-126, both are below 2^6 and the maximum is kBase either way), on the FMA pipe
// rather than the integer/logic pipe, which bounds the quantizers with a transform (DESIGN.md "What bounds the
// quantizers' speed"). mag: the magnitudes of both elements (bf16x2_magnitude of their word).
FP4MOE_HD uint32_t e2m1_pair_magnitude_x4096_rne_bf16x2(uint32_t mag, __nv_bfloat162 inv2) {
  constexpr uint32_t kSixes = 0x40C040C0u;  // 6.0, 6.0
  constexpr uint32_t kBase = 0x42804280u;   // 64.0 = 2^6, 2^6: the magic number of the first binade (step 0.5)
  const __nv_bfloat162 a2 = __hmul2_rn(bf162_from_bits(mag), inv2);
  const uint32_t a = bits_of_bf162(__hmin2(a2, bf162_from_bits(kSixes)));
#if defined(__CUDA_ARCH__)
  const uint32_t magic = bits_of_bf162(
      __hmax2(__hmul2_rn(bf162_from_bits(a & 0x7F807F80u), bf162_from_bits(kBase)), bf162_from_bits(kBase)));
#else
  const uint32_t magic =
      bits_of_bf162(__hmax2(bf162_from_bits((a & 0x7F807F80u) + 0x03000300u), bf162_from_bits(kBase)));
#endif
  const uint32_t t = bits_of_bf162(__hadd2_rn(bf162_from_bits(a), bf162_from_bits(magic)));
  constexpr uint32_t kT = (1u << 12) + (1u << 16);
#if defined(__CUDA_ARCH__)
  // Two multiply-adds in this order (left to itself, the compiler puts both constant terms in registers and
  // reloads the factor per call): magic (64 - kT) - 64 kBase, then t kT plus that.
  uint32_t r;
  asm("mad.lo.u32 %0, %1, %2, %3;" : "=r"(r) : "r"(magic), "n"(64u - kT), "r"(0u - 64u * kBase));
  asm("mad.lo.u32 %0, %1, %2, %0;" : "+r"(r) : "r"(t), "n"(kT));
  return r;
#else
  return kT * t - (kT - 64u) * magic - 64u * kBase;  // modulo 2^32
#endif
}

// The magnitude codes alone (per half 0..7 in bits 0..2 and 16..18, no sign bit).
FP4MOE_HD uint32_t e2m1_pair_magnitude_rne_bf16x2(uint32_t w, __nv_bfloat162 inv2) {
  return (e2m1_pair_magnitude_x4096_rne_bf16x2(bf16x2_magnitude(w), inv2) >> 12) & 0x00070007u;
}

FP4MOE_HD uint32_t e2m1_pair_rne_bf16x2(uint32_t w, __nv_bfloat162 inv2) {
  return e2m1_pair_magnitude_rne_bf16x2(w, inv2) | ((w >> 12) & 0x00080008u);  // sign bits 15, 31 -> 3, 19
}

// E2M1 magnitude code (0..7) of f32_to_e2m1_stochastic(a, s * 2^-8) for a finite a >= 0 and 8 random bits s
// (mx_random.h mx_sr_bits8), in integers: X = a's FP32 bit pattern for a >= 1, where bits 22.. hold 252 + the lower
// E2M1 neighbour's code and bits 0..21 the exact position of a within the step; for a < 1 the same fixed point built
// from ceil(a * 2^23) (a + 1 rounded up, exact in FP32, minus one binade). a rounds up iff s < position * 2^8 / 2^22,
// i.e. iff ceil(position / 2^14) + (0xFF - s) carries into bit 8; codes past 7 saturate.
// In few instructions (the kernels' form, split so that the per-element work is one maximum with a fused addition,
// the draw's offset (a mask, and a shift folded into the addition) and one shift):
//   - X = max(bits(a), bits(a + 1 rounded up) - 2^23) as integers, without a comparison and a select: for a >= 1
//     the second is (a + 1) / 2 rounded up, which is <= a; for a < 1 it is >= (a + 1) / 2 > a;
//   - floor((floor((X + 2^14 - 1) / 2^14) + 0xFF - s) / 2^8) = floor((X + 2^14 - 1 + 2^14 (0xFF - s)) / 2^22)
//     (nested floor division) = floor((G + e2m1_sr_offset(s)) / 2^22) + 252 with G = X + 2^14 - 1 - 252 * 2^22:
//     e2m1_sr_fixed(a) gives G (the constants added to both operands of the maximum, as signed integers: no operand
//     wraps), e2m1_sr_step the code;
//   - a is clamped at 6 first (E2M1's largest: G + offset < 8 * 2^22, code 7 whatever the draw), so that codes need
//     no saturation, and G >= 0 for every a >= 0.
FP4MOE_HD uint32_t e2m1_sr_fixed(float a) {
  constexpr int32_t kBias = 252 << 22;
  constexpr int32_t kRound = (1 << 14) - 1;
#if defined(__CUDA_ARCH__)
  const int32_t below_one = static_cast<int32_t>(f32_bits(__fadd_ru(a, 1.0f))) + (kRound - kBias - 0x00800000);
  return static_cast<uint32_t>(__viaddmax_s32(static_cast<int32_t>(f32_bits(a)), kRound - kBias, below_one));
#else
  // ceil(a * 2^23) + 2^23 for a < 1 is the bit pattern of a + 1 rounded up, less the exponent of 1 (0x3F800000).
  const int32_t below_one =
      a < 1.0f ? static_cast<int32_t>(0x3F800000u + static_cast<uint32_t>(std::ceil(a * 8388608.0f))) +
                     (kRound - kBias - 0x00800000)
               : INT32_MIN;
  const int32_t above = static_cast<int32_t>(f32_bits(a)) + (kRound - kBias);
  return static_cast<uint32_t>(above > below_one ? above : below_one);
#endif
}

// The draw's offset 2^14 (0xFF - s) for 8 random bits s (bits above 7 ignored). The kernels take it from byte j of
// a 32-bit word w holding the draws of four elements as (~w & (0xFF << 8 j)) shifted by 14 - 8 j: a mask, and a
// shift that the addition of e2m1_sr_step absorbs (LEA, LEA.HI).
FP4MOE_HD uint32_t e2m1_sr_offset(uint32_t s) { return ((s ^ 0xFFu) & 0xFFu) << 14; }

// The magnitude code 0..7 from e2m1_sr_fixed(min(a, 6)) and the draw's e2m1_sr_offset.
FP4MOE_HD uint32_t e2m1_sr_step(uint32_t fixed, uint32_t offset) { return (fixed + offset) >> 22; }

// e2m1_sr_fixed(a) from a' = a 2^16 (the row quantizer's BF16x2 scaling, encode_chunk_stochastic_bf16x2, forms
// the scaled magnitudes 2^16 too large so that the BF16 products vanish exactly where the FP32 ones do), for
// a' = bf16(p 2^16), p >= 0 the exact scaled magnitude, clamped at 6 2^16. Same value as e2m1_sr_fixed(fl32(p))
// clamped at 6:
//   - p 2^16 >= 2^-126 (BF16 normal): a' = p 2^16 exactly. For a >= 2^-126, bits(a') - 16 2^23 = bits(a) and
//     a' + 2^16 rounded up is 2^16 (a + 1 rounded up) (scaling by a power of two commutes with the rounding in the
//     normal range), so both operands of the maximum are those of e2m1_sr_fixed, shifted by the constants below.
//     For a < 2^-126 the first operand is below 0x00800000 + the constant, the maximum is the second, and a + 1
//     rounded up is 1 + 2^-23 for every 0 < a <= 2^-23: the same as for fl32(p) > 0, which holds (p >= 2^-142).
//   - p 2^16 < 2^-126: a' > 0 iff p 2^16 > 2^-134 (half of BF16's smallest subnormal, the tie to 0) iff
//     p > 2^-150 iff fl32(p) > 0 (the same tie one FP32 subnormal step lower); either way the result depends only
//     on whether it is 0 (1 + 2^-23 or 1 for a + 1 rounded up), and is the same.
// No signed overflow: the operands are those of e2m1_sr_fixed less 16 2^23, or (a < 2^-126) at least
// -16 2^23 plus the constant.
FP4MOE_HD uint32_t e2m1_sr_fixed_x65536(float a_x65536) {
  constexpr int32_t kScaleBits = 16 << 23;  // the exponent field of 2^16
  constexpr int32_t kBias = 252 << 22;
  constexpr int32_t kRound = (1 << 14) - 1;
#if defined(__CUDA_ARCH__)
  const int32_t below_one =
      static_cast<int32_t>(f32_bits(__fadd_ru(a_x65536, 65536.0f))) + (kRound - kBias - 0x00800000 - kScaleBits);
  return static_cast<uint32_t>(
      __viaddmax_s32(static_cast<int32_t>(f32_bits(a_x65536)), kRound - kBias - kScaleBits, below_one));
#else
  const float a = a_x65536 * (1.0f / 65536.0f);  // exact for a' >= 2^-110; below only a > 0 matters
  const int32_t below_one =
      a_x65536 < 65536.0f
          ? static_cast<int32_t>(0x3F800000u + (a_x65536 > 0.0f ? (a < 0x1p-23f ? 1u : static_cast<uint32_t>(
                                                                                          std::ceil(a * 8388608.0f)))
                                                                 : 0u)) +
                (kRound - kBias - 0x00800000)
          : INT32_MIN;
  const int32_t above = static_cast<int32_t>(f32_bits(a_x65536)) + (kRound - kBias - kScaleBits);
  return static_cast<uint32_t>(above > below_one ? above : below_one);
#endif
}

FP4MOE_HD uint32_t e2m1_magnitude_sr_f32(float a, uint32_t s) {
  return e2m1_sr_step(e2m1_sr_fixed(a < 6.0f ? a : 6.0f), e2m1_sr_offset(s));
}

}  // namespace fp4moe::detail
