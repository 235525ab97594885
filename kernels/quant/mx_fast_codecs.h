// Cheaper formulations of two rules of formats.h, used by the BF16 -> MXFP4 row kernel
// (bf16_to_mxfp4_row.cu): the same results bit for bit, computed with fewer instructions.
// Host and device alike, so that the CPU tests compare them with formats.h exhaustively
// (tests/quant/test_quant_row_gpu.cpp, host-only tests that run without a device).
#pragma once

#include <cuda_bf16.h>

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

FP4MOE_HD uint32_t e2m1_pair_rne_bf16x2(uint32_t w, __nv_bfloat162 inv2) {
  constexpr uint32_t kSixes = 0x40C040C0u;  // 6.0, 6.0
  constexpr uint32_t kBase = 0x42804280u;   // 64.0 = 2^6, 2^6: the magic number of the first binade (step 0.5)
  const __nv_bfloat162 a2 = __hmul2_rn(bf162_from_bits(w & 0x7FFF7FFFu), inv2);
  const uint32_t a = bits_of_bf162(__hmin2(a2, bf162_from_bits(kSixes)));
  const uint32_t magic =
      bits_of_bf162(__hmax2(bf162_from_bits((a & 0x7F807F80u) + 0x03000300u), bf162_from_bits(kBase)));
  const uint32_t t = bits_of_bf162(__hadd2_rn(bf162_from_bits(a), bf162_from_bits(magic)));
  const uint32_t code = t - magic + ((magic - kBase) >> 6);  // per half 0..7
  return code | ((w >> 12) & 0x00080008u);                   // sign bits 15, 31 -> 3, 19
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
