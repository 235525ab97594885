// Number formats, exactly as the CPU references and the GPU kernels use them (host and device, bit for bit).
// All arithmetic on values is integer bit manipulation or exact power-of-two scaling, so host and device agree.
//
//   E2M1 (FP4, OCP MX v1.0 sec. 5.3.3): 4-bit code s e1 e0 m; magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6.
//   UE8M0 (OCP MX v1.0 sec. 5.4.1): unsigned 8-bit exponent, byte b -> 2^(b-127) for b in 0..254; 0xFF is NaN.
//   E4M3 (OCP FP8 E4M3FN): bias 7, max 448, subnormals down to 2^-9, 0x7F/0xFF NaN, no infinities.
//   BF16: the top 16 bits of an IEEE fp32; float -> bf16 rounds to nearest even.
//
// Packing of E2M1 codes: element 2i in the low nibble, element 2i+1 in the high nibble of byte i.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FP4MOE_HD __host__ __device__ __forceinline__
#else
#define FP4MOE_HD inline
#endif

namespace fp4moe {

// ---- raw float bits --------------------------------------------------------------------------------------

// The IEEE-754 binary32 bits of f and back (no conversion: a reinterpretation).
FP4MOE_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

FP4MOE_HD float f32_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// Classification on the bits, immune to fast-math assumptions: finite = neither Inf nor NaN.
FP4MOE_HD bool f32_is_finite(float f) { return (f32_bits(f) & 0x7F800000u) != 0x7F800000u; }
FP4MOE_HD bool f32_is_nan(float f) { return (f32_bits(f) & 0x7FFFFFFFu) > 0x7F800000u; }

// 2^e as an exact fp32 for e in [-149, 127] (subnormal powers included).
FP4MOE_HD float exp2_exact(int e) {
  if (e >= -126) return f32_from_bits(static_cast<uint32_t>(e + 127) << 23);
  return f32_from_bits(1u << (e + 149));
}

// floor(log2 |f|) for finite nonzero f, subnormals included (-149 .. 127).
FP4MOE_HD int floor_log2(float f) {
  uint32_t u = f32_bits(f) & 0x7FFFFFFFu;
  int ef = static_cast<int>(u >> 23);
  if (ef != 0) return ef - 127;
#if defined(__CUDA_ARCH__)
  return (31 - __clz(u)) - 149;
#else
  return (31 - __builtin_clz(u)) - 149;
#endif
}

// The 23 fraction bits of |f| normalised to [1, 2) (for subnormals too): f = (1 + frac/2^23) * 2^floor_log2(f).
FP4MOE_HD uint32_t normalized_fraction(float f) {
  uint32_t u = f32_bits(f) & 0x7FFFFFFFu;
  if ((u >> 23) != 0) return u & 0x7FFFFFu;
  int lead = floor_log2(f) + 149;  // position of the leading one in u
  return (u << (23 - lead)) & 0x7FFFFFu;
}

// Round-half-to-even of x / 2^s for s >= 0 (integer).
FP4MOE_HD uint32_t rne_shift_right(uint32_t x, int s) {
  if (s <= 0) return x;
  if (s >= 32) return 0;  // x < 2^32 <= 2^(s): result is 0 or the tie 0.5 (-> 0) at most
  uint32_t q = x >> s;
  uint32_t rem = x & ((1u << s) - 1u);
  uint32_t half = 1u << (s - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return q;
}

// ---- BF16 --------------------------------------------------------------------------------------------------

// BF16 bits (the top half of an fp32) -> fp32, exact.
FP4MOE_HD float bf16_bits_to_f32(uint16_t b) { return f32_from_bits(static_cast<uint32_t>(b) << 16); }

// Round to nearest even; NaN stays a quiet NaN with its sign; overflow rounds to +-Inf as IEEE does.
FP4MOE_HD uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = f32_bits(f);
  if (f32_is_nan(f)) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  uint32_t lsb = (u >> 16) & 1u;
  return static_cast<uint16_t>((u + 0x7FFFu + lsb) >> 16);
}

// ---- E2M1 --------------------------------------------------------------------------------------------------

constexpr float kE2M1Max = 6.0f;

// Magnitude of a 3-bit E2M1 magnitude code (0..7) in units of 0.5: 0, 1, 2, 3, 4, 6, 8, 12.
FP4MOE_HD uint32_t e2m1_half_units(uint32_t mag_code) {
  return (mag_code < 4) ? mag_code : ((2u + (mag_code & 1u)) << ((mag_code >> 1) - 1u));
}

// E2M1 code (low 4 bits: sign bit 3, magnitude code 0..7; OCP MX v1.0 sec. 5.3.3) -> fp32, exact; code 8 is -0.
FP4MOE_HD float e2m1_to_f32(uint8_t code) {
  float m = 0.5f * static_cast<float>(e2m1_half_units(code & 7u));
  return (code & 8u) ? -m : m;
}

// E2M1 encode of an fp32 value: round to nearest even on the exact value, saturating to +-6.
// Ties: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4. -0 and negative values that round to 0 keep
// the sign bit. NaN input is the caller's business (blocks with NaN are handled before encoding); here NaN -> 0.
FP4MOE_HD uint8_t f32_to_e2m1_rne(float v) {
  uint8_t sign = (f32_bits(v) >> 31) ? 8 : 0;
  float a = v < 0 ? -v : v;
  uint8_t m;
  if (!(a > 0.25f)) m = 0;  // also NaN
  else if (a < 0.75f) m = 1;
  else if (a <= 1.25f) m = 2;
  else if (a < 1.75f) m = 3;
  else if (a <= 2.5f) m = 4;
  else if (a < 3.5f) m = 5;
  else if (a <= 5.0f) m = 6;
  else m = 7;
  return sign | m;
}

// Stochastic E2M1 encode: |v| (saturated to 6) lies between two neighbouring magnitudes lo <= |v| <= hi;
// it rounds up with probability (|v| - lo) / (hi - lo), decided by u in [0, 1) (a multiple of 2^-24).
// Both the difference and the division by a power of two are exact in fp32, so the rule is exact.
FP4MOE_HD uint8_t f32_to_e2m1_stochastic(float v, float u) {
  uint8_t sign = (f32_bits(v) >> 31) ? 8 : 0;
  float a = v < 0 ? -v : v;
  if (!(a < kE2M1Max)) return f32_is_nan(v) ? 0 : static_cast<uint8_t>(sign | 7);
  uint8_t lo = 0;
  while (lo < 7 && 0.5f * static_cast<float>(e2m1_half_units(lo + 1u)) <= a) ++lo;
  float lo_v = 0.5f * static_cast<float>(e2m1_half_units(lo));
  float step = 0.5f * static_cast<float>(e2m1_half_units(lo + 1u) - e2m1_half_units(lo));
  float p_up = (a - lo_v) / step;
  return sign | static_cast<uint8_t>(u < p_up ? lo + 1 : lo);
}

// Counter-based uniform in [0, 1) keyed by (seed, element index): the same element gets the same number
// whatever the launch shape. splitmix64 finaliser over (seed, index); 24 bits of the result.
FP4MOE_HD uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
FP4MOE_HD float uniform_from_counter(uint64_t seed, uint64_t index) {
  uint64_t h = mix64(seed ^ mix64(index + 0x9E3779B97F4A7C15ull));
  return static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
}

// ---- UE8M0 -------------------------------------------------------------------------------------------------

constexpr uint8_t kUE8M0NaN = 0xFF;
constexpr int kUE8M0Bias = 127;

// UE8M0 scale byte (OCP MX v1.0 sec. 5.4.1) -> 2^(b - 127) as an exact fp32 (b = 0: 2^-127, a subnormal);
// 0xFF -> NaN.
FP4MOE_HD float ue8m0_to_f32(uint8_t b) {
  if (b == kUE8M0NaN) return f32_from_bits(0x7FC00000u);
  return exp2_exact(static_cast<int>(b) - kUE8M0Bias);
}

// ---- E4M3 (OCP E4M3FN) -------------------------------------------------------------------------------------

constexpr float kE4M3Max = 448.0f;
constexpr uint8_t kE4M3NaN = 0x7F;

// E4M3 code (OCP FP8 E4M3FN: bias 7, subnormals down to 2^-9, max 448, no Inf) -> fp32, exact; 0x7F and 0xFF
// (S.1111.111) -> NaN.
FP4MOE_HD float e4m3_to_f32(uint8_t code) {
  uint32_t e = (code >> 3) & 0xFu, m = code & 7u;
  float mag;
  if (e == 0xF && m == 7) return f32_from_bits(0x7FC00000u);
  if (e == 0) mag = static_cast<float>(m) * exp2_exact(-9);
  else mag = static_cast<float>(8u + m) * exp2_exact(static_cast<int>(e) - 10);
  return (code & 0x80) ? -mag : mag;
}

// E4M3 encode: round to nearest even, saturate to +-448 (satfinite, Inf included); NaN -> 0x7F.
FP4MOE_HD uint8_t f32_to_e4m3_satfinite(float v) {
  if (f32_is_nan(v)) return kE4M3NaN;
  uint32_t u = f32_bits(v);
  uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x43E00000u) return sign | 0x7E;  // |v| > 448
  if (a == 0) return sign;
  int ef = static_cast<int>(a >> 23);
  uint32_t mant = (ef ? (a & 0x7FFFFFu) | 0x800000u : (a & 0x7FFFFFu));  // |v| = mant * 2^(e2)
  int e2 = (ef ? ef : 1) - 127 - 23;
  int e = ef - 127;
  if (ef != 0 && e >= -6) {
    // normal range: keep 4 significant bits (implicit one + 3), the carry may bump the exponent.
    uint32_t r = rne_shift_right(mant, 20);  // in [8, 16]
    uint32_t code = (static_cast<uint32_t>(e + 7) << 3) + (r - 8u);
    return sign | static_cast<uint8_t>(code > 0x7Eu ? 0x7Eu : code);
  }
  // subnormal range: units of 2^-9; mant * 2^(e2 + 9) with e2 + 9 < 0 here. A result of 8 is 2^-6 (code 0x08).
  uint32_t q = rne_shift_right(mant, -(e2 + 9));
  return sign | static_cast<uint8_t>(q);
}

// ---- MXFP4 block rules (OCP MX v1.0 sec. 6.3, and the ceil variant) ------------------------------------------

enum class MxScaleMode : int {
  floor = 0,  // OCP: e = floor(log2 amax) - 2 (amax may clip to 6 after scaling)
  ceil = 1,   // no clipping: the smallest e with amax * 2^-e <= 6
};

// Shared exponent e (unclamped result clamped to [-127, 127]) for a block with finite amax > 0.
// Near the top of the fp32 range the rule's own result is not representable on decode: in ceil mode an amax of
// 1.5 * 2^127 or more gives e = 126 and code 4, so the block's largest element dequantizes to 2^128 = +-Inf in
// fp32/BF16 (and in the direct FP8 path's scale * code). Real activations are nowhere near; the CLI counts it.
FP4MOE_HD int mx_scale_exponent(float amax, MxScaleMode mode) {
  int f = floor_log2(amax);
  int e;
  if (mode == MxScaleMode::floor) e = f - 2;
  else e = (normalized_fraction(amax) <= 0x400000u) ? f - 2 : f - 1;  // fraction <= 1.5 -> 4*frac <= 6
  return e < -127 ? -127 : (e > 127 ? 127 : e);
}

// ---- FP8 1x128 / 128x128 block scale rules -------------------------------------------------------------------

// A block with finite amax > 0 gets a scale s and a multiplier m: codes E4M3(v * m), dequantized value
// E4M3(code) * s. In both modes s is a normal fp32 no smaller than 2^-126 and m is a normal fp32 no larger than
// 2^126, with s * m = 1 exactly (pow2) or within 2^-23 (fp32, two roundings), for every finite amax:
//   pow2: s = 2^p, m = 2^-p, p = fp8_pow2_scale_exponent(amax) (ceil(log2(amax / 448)) clamped to >= -126);
//   fp32: amax >= 448 * 2^-126: s = amax / 448 and m = 448 / amax, each one fp32 round-to-nearest division;
//         amax <  448 * 2^-126: s = 2^-126 and m = 2^126, the pow2 floor (amax / 448 would be subnormal, losing
//         bits, and 448 / amax overflows for amax < 448 / FLT_MAX; the block then uses less than the E4M3 range).
// The dequantized amax is within E4M3's 2^-4 relative rounding of amax for every BF16 amax (amax * 2^126 >= 2^-7
// for the smallest BF16 subnormal 2^-133, an exact E4M3 subnormal), with one exception, pow2 at the top: for
// amax >= 1.9375 * 2^127 the code rounds up to 256 and 256 * 2^120 overflows fp32 on dequantization (+-Inf), a
// limit of a power-of-two scale with three mantissa bits (fp32 scales stay finite: 448 * s <= FLT_MAX).
// The one implementation of the rule is fp8_block_scale (kernels/quant/fp8_block_scale.h), host and device.
enum class Fp8ScaleMode : int {
  pow2 = 0,  // s = 2^ceil(log2(amax / 448)) computed exactly, clamped to [2^-126, 2^127]; m = 1 / s
  fp32 = 1,  // s = amax / 448, m = 448 / amax in fp32; s = 2^-126, m = 2^126 for amax < 448 * 2^-126
};

// The smallest FP8 block scale exponent of both modes (the smallest normal fp32 exponent: 1/s stays finite).
constexpr int kFp8MinScaleExponent = -126;

// Exponent p of the pow2 scale for a finite amax > 0: the smallest p with amax <= 448 * 2^p (exact), clamped to
// [kFp8MinScaleExponent, 127] (the top is never reached: p <= 120 for finite amax).
FP4MOE_HD int fp8_pow2_scale_exponent(float amax) {
  int f = floor_log2(amax);
  int p = (normalized_fraction(amax) <= 0x600000u) ? f - 8 : f - 7;  // 448 = 1.75 * 2^8
  return p < kFp8MinScaleExponent ? kFp8MinScaleExponent : (p > 127 ? 127 : p);
}

// ---- Direct MXFP4 -> FP8 (the paper's FP4RowToFP8Row/Col rule) ----------------------------------------------

// Scale exponent of a 1x128 FP8 group built from MX blocks whose largest (non-NaN) exponent is E:
// S = 2^max(E - 6, -126). Every fp4 * 2^(e_i - s) is then <= 6 * 2^6 = 384 < 448 (never saturates).
FP4MOE_HD int direct_group_scale_exponent(int max_mx_exponent) {
  int s = max_mx_exponent - 6;
  return s < -126 ? -126 : s;
}

// E4M3 code of the value e2m1(code) * 2^shift, for shift <= 6, by integer operations only (no float math):
// sign copied, exponent rebiased, the implicit bit materialised when the result is an E4M3 subnormal, and
// round-to-nearest-even when bits fall off the bottom (exact while shift >= -8, i.e. the exponent spread
// E - e_i <= 14 in a group). -0 keeps its sign.
FP4MOE_HD uint8_t e2m1_to_e4m3_shifted(uint8_t code, int shift) {
  uint8_t sign = (code & 8u) ? 0x80 : 0x00;
  uint32_t mag = code & 7u;
  if (mag == 0) return sign;
  // e2m1 magnitude = (2 + m) * 2^(x - 1) with m the mantissa bit and x the unbiased exponent (-1 for 0.5).
  uint32_t m = mag & 1u;
  int x = (mag < 2) ? -1 : static_cast<int>(mag >> 1) - 1;
  if (mag == 1) m = 0;  // 0.5 = 1.0 * 2^-1
  x += shift;           // value = (1 + m/2) * 2^x
  if (x >= -6) return sign | static_cast<uint8_t>((static_cast<uint32_t>(x + 7) << 3) | (m << 2));
  // E4M3 subnormal: value = k * 2^-9 with k = (2 + m) * 2^(x + 8), rounded to nearest even.
  int sh = x + 8;
  uint32_t k = (sh >= 0) ? ((2u + m) << sh) : rne_shift_right(2u + m, -sh);
  return sign | static_cast<uint8_t>(k);  // k <= 8; k == 8 is exactly the smallest normal (0x08)
}

}  // namespace fp4moe
