// The FP8 block scale rules (formats.h, Fp8ScaleMode; fp8_block_scale.h) over the whole fp32 exponent range:
// for amax = (1 + f) * 2^e with e = -149 .. 127 the scale s and the multiplier m are normal fp32 with s * m = 1
// to fp32 rounding, and a block quantized with them dequantizes within E4M3's rounding; the reference
// quantizers of the three layouts follow the rule for every BF16 exponent; all-zero blocks get scale 1 and zero
// codes in every mode and layout (no NaN from 0 / 0).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "kernels/formats/formats.h"
#include "kernels/quant/bf16_to_fp8.h"
#include "kernels/quant/bf16_to_mxfp4_row.h"
#include "kernels/quant/fp8_block_scale.h"
#include "kernels/quant/layouts.h"
#include "kernels/quant/mxfp4_row_to_fp8_col.h"
#include "kernels/quant/mxfp4_row_to_fp8_row.h"

namespace fp4moe {
namespace {

const Fp8ScaleMode kModes[] = {Fp8ScaleMode::pow2, Fp8ScaleMode::fp32};
const char* mode_name(Fp8ScaleMode m) { return m == Fp8ScaleMode::pow2 ? "pow2" : "fp32"; }

// Fractions f (of 2^23) of amax = (1 + f) * 2^e: the powers of two, the ends of the mantissa, 1.75 (448's own
// mantissa) and 1.9375 (where a pow2 code rounds up to the next power of two).
const uint32_t kFractions[] = {0, 1, 0x200000, 0x400000, 0x600000, 0x600001, 0x700000, 0x780000, 0x7FFFFF};

// (1 + frac / 2^23) * 2^e rounded once to fp32 (to nearest; below 2^-126 onto the subnormal grid).
float amax_at(int e, uint32_t frac) {
  return static_cast<float>(std::ldexp(1.0 + std::ldexp(static_cast<double>(frac), -23), e));
}

bool is_e4m3_nan(uint8_t code) { return (code & 0x7F) == 0x7F; }

// Bound on |E4M3(code) * s - v| for a code E4M3(v * m) of a block scale (s, m) with |v| <= amax: RNE in E4M3
// (2^-4 relative for normal codes, half the subnormal step 2^-9 below), the roundings of v * m, of s * m and of
// the product code * s (2^-24 relative, and half the fp32 subnormal step 2^-149 when that product is subnormal).
double error_bound(double v, double s) {
  return (0x1p-4 + 0x1p-18) * std::fabs(v) + (0x1p-10 + 0x1p-28) * s + 0x1p-150;
}

// Every block scale: s and m normal, s >= 2^-126, m <= 2^126, s * m = 1 exactly (pow2) or within two fp32
// roundings (fp32), and the fp32 rule's own quotients wherever amax >= 448 * 2^-126.
TEST(Fp8ScaleRange, ScaleAndMultiplierAreNormalAndConsistentForEveryExponent) {
  const float floor_amax = 448.0f * std::ldexp(1.0f, -126);
  for (Fp8ScaleMode mode : kModes)
    for (int e = -149; e <= 127; ++e)
      for (uint32_t frac : kFractions) {
        const float amax = amax_at(e, frac);
        ASSERT_TRUE(std::isfinite(amax) && amax > 0.0f);
        SCOPED_TRACE(testing::Message() << mode_name(mode) << " amax " << std::hexfloat << amax);
        const Fp8BlockScale sc = fp8_block_scale(amax, mode);
        ASSERT_FALSE(sc.nonfinite);
        ASSERT_EQ(std::fpclassify(sc.scale), FP_NORMAL);
        ASSERT_EQ(std::fpclassify(sc.multiplier), FP_NORMAL);
        ASSERT_GT(sc.scale, 0.0f);
        ASSERT_GE(sc.scale, std::ldexp(1.0f, -126));
        ASSERT_LE(sc.multiplier, std::ldexp(1.0f, 126));
        const double product = static_cast<double>(sc.scale) * static_cast<double>(sc.multiplier);
        if (mode == Fp8ScaleMode::pow2 || amax < floor_amax) {
          ASSERT_EQ(product, 1.0);
          ASSERT_EQ(sc.scale, std::ldexp(1.0f, fp8_pow2_scale_exponent(amax)));
        } else {
          ASSERT_LE(std::fabs(product - 1.0), 0x1p-23 + 0x1p-46);
          ASSERT_EQ(sc.scale, amax / 448.0f);
          ASSERT_EQ(sc.multiplier, 448.0f / amax);
        }
      }
}

// A block [amax, -0.7 amax, 0.3 amax, amax / 8, -amax / 256, amax * 2^-12, amax * 2^-30, 0] coded with the
// shared rule (the reference's and the kernels' E4M3(v * m), value code * s): no NaN code, finite values within
// error_bound, and amax itself within 2^-4 relative wherever its code is a normal E4M3 (amax * m >= 2^-6, so
// for every amax >= 2^-132: the whole BF16 range). pow2's one limit (formats.h): amax >= 1.9375 * 2^127
// dequantizes to +Inf; asserted as such so the limit stays where it is stated.
TEST(Fp8ScaleRange, DequantizedBlockIsAccurateForEveryExponent) {
  const double factors[] = {1.0, -0.7, 0.3, 0x1p-3, -0x1p-8, 0x1p-12, 0x1p-30, 0.0};
  for (Fp8ScaleMode mode : kModes)
    for (int e = -149; e <= 127; ++e)
      for (uint32_t frac : kFractions) {
        const float amax = amax_at(e, frac);
        SCOPED_TRACE(testing::Message() << mode_name(mode) << " amax " << std::hexfloat << amax);
        const Fp8BlockScale sc = fp8_block_scale(amax, mode);
        const bool pow2_top = mode == Fp8ScaleMode::pow2 && amax >= 0x1.fp127f;
        for (double factor : factors) {
          const float v = static_cast<float>(factor * amax);
          const uint8_t code = f32_to_e4m3_satfinite(v * sc.multiplier);
          ASSERT_FALSE(is_e4m3_nan(code)) << "v " << v;
          const float y = e4m3_to_f32(code) * sc.scale;
          if (pow2_top && factor == 1.0) {
            ASSERT_TRUE(std::isinf(y)) << "the stated pow2 limit moved";
            continue;
          }
          ASSERT_TRUE(std::isfinite(y)) << "v " << v;
          ASSERT_LE(std::fabs(static_cast<double>(y) - v), error_bound(v, sc.scale)) << "v " << v << " y " << y;
          if (factor == 1.0 && amax >= 0x1p-132f) {
            ASSERT_LE(std::fabs(static_cast<double>(y) - amax), (0x1p-4 + 0x1p-20) * amax) << "y " << y;
          }
        }
      }
}

// Every amax of the top binade [2^127, FLT_MAX] in fp32 mode: the code of amax is 448 and 448 * s stays finite.
TEST(Fp8ScaleRange, Fp32ScaleOfTheTopBinadeDequantizesFinite) {
  for (uint32_t u = 0x7F000000u; u < 0x7F800000u; ++u) {
    const float amax = f32_from_bits(u);
    const Fp8BlockScale sc = fp8_block_scale(amax, Fp8ScaleMode::fp32);
    const uint8_t code = f32_to_e4m3_satfinite(amax * sc.multiplier);
    ASSERT_EQ(code, 0x7E) << std::hexfloat << amax;
    ASSERT_TRUE(std::isfinite(e4m3_to_f32(code) * sc.scale)) << std::hexfloat << amax;
  }
}

// ---- the reference quantizers over every BF16 exponent --------------------------------------------------------

bf16 to_bf16(float v) { return bf16_from_bits(f32_to_bf16_bits(v)); }
float to_f32(bf16 v) { return bf16_bits_to_f32(bf16_bits(v)); }

// One block of n BF16 values with amax = the BF16 value `amax_bits` at position `at` (sign alternating with the
// block index) and smaller values after it (wrapping): -0.7, 0.3, 1/8, -1/256, 2^-12 and 2^-30 of amax, then
// zeros; values are rounded to BF16 (the small ones may become subnormal or zero).
void fill_block(uint16_t amax_bits, int64_t block, int64_t n, const std::function<bf16&(int64_t)>& at) {
  const float amax = bf16_bits_to_f32(amax_bits);
  const float factors[] = {-0.7f, 0.3f, 0x1p-3f, -0x1p-8f, 0x1p-12f, 0x1p-30f};
  const int64_t first = block % n;
  for (int64_t i = 0; i < n; ++i) at(i) = to_bf16(0.0f);
  at(first) = bf16_from_bits(static_cast<uint16_t>(amax_bits | ((block & 1) ? 0x8000u : 0u)));
  for (int64_t j = 0; j < 6 && j + 1 < n; ++j) at((first + 1 + j) % n) = to_bf16(factors[j] * amax);
}

// BF16 amax values (bits) for every BF16 exponent, the smallest subnormal 2^-133 to the largest finite value,
// with `mantissas_per_exponent` mantissas each (spread over 0..127, 0 and 127 included).
std::vector<uint16_t> bf16_amax_values(int mantissas_per_exponent) {
  std::vector<uint16_t> out;
  for (int k = 1; k < 128; ++k) out.push_back(static_cast<uint16_t>(k));  // the subnormals: k * 2^-133
  for (uint32_t ef = 1; ef < 255; ++ef)
    for (int j = 0; j < mantissas_per_exponent; ++j) {
      uint32_t m = mantissas_per_exponent == 1 ? 0 : 127u * j / (mantissas_per_exponent - 1);
      out.push_back(static_cast<uint16_t>((ef << 7) | m));
    }
  return out;
}

// Checks dequantized y against the input x of one block (n elements, accessors by index) quantized to codes with
// scale s: s equals the rule's scale of the block's amax, no NaN code, finite values within error_bound, and the
// block's amax within 2^-4 relative (every BF16 amax; pow2's stated top limit excepted).
void check_block(Fp8ScaleMode mode, float amax, float s, int64_t n, const std::function<float(int64_t)>& x,
                 const std::function<float(int64_t)>& y, const std::function<uint8_t(int64_t)>& code) {
  SCOPED_TRACE(testing::Message() << mode_name(mode) << " amax " << std::hexfloat << amax);
  ASSERT_EQ(f32_bits(s), f32_bits(fp8_block_scale(amax, mode).scale));
  ASSERT_EQ(std::fpclassify(s), FP_NORMAL);
  const bool pow2_top = mode == Fp8ScaleMode::pow2 && amax >= 0x1.fp127f;
  for (int64_t i = 0; i < n; ++i) {
    const double v = x(i), got = y(i);
    ASSERT_FALSE(is_e4m3_nan(code(i))) << "element " << i;
    if (pow2_top && std::fabs(v) == amax) {
      ASSERT_TRUE(std::isinf(got));
      continue;
    }
    ASSERT_TRUE(std::isfinite(got)) << "element " << i;
    ASSERT_LE(std::fabs(got - v), error_bound(v, s)) << "element " << i << " v " << v << " y " << got;
    if (std::fabs(v) == amax) {
      ASSERT_LE(std::fabs(got - v), (0x1p-4 + 0x1p-20) * amax) << "y " << got;
    }
  }
}

// Row layout: one 1x128 block per row, rows over every BF16 amax.
TEST(Fp8ScaleRange, RowReferenceOverEveryBf16Exponent) {
  const std::vector<uint16_t> amaxes = bf16_amax_values(16);
  const int64_t M = static_cast<int64_t>(amaxes.size()), K = kFp8Block;
  std::vector<bf16> x(M * K);
  for (int64_t r = 0; r < M; ++r) fill_block(amaxes[r], r, K, [&](int64_t i) -> bf16& { return x[r * K + i]; });
  for (Fp8ScaleMode mode : kModes) {
    std::vector<uint8_t> codes(M * K);
    std::vector<float> scales(fp8_row_scale_count(M, K)), y(M * K);
    ASSERT_EQ(bf16_to_fp8_row_ref(x.data(), M, K, mode, codes.data(), scales.data()), 0);
    fp8_row_dequantize_ref(codes.data(), scales.data(), M, K, y.data());
    for (int64_t r = 0; r < M; ++r)
      ASSERT_NO_FATAL_FAILURE(check_block(mode, bf16_bits_to_f32(amaxes[r]), scales[fp8_row_scale_index(r, 0, M)], K,
                                          [&](int64_t i) { return to_f32(x[r * K + i]); },
                                          [&](int64_t i) { return y[r * K + i]; },
                                          [&](int64_t i) { return codes[r * K + i]; }));
  }
}

// Column layout (one group of 128 tokens): one block along tokens per feature, features over every BF16 amax.
TEST(Fp8ScaleRange, ColumnReferenceOverEveryBf16Exponent) {
  const std::vector<uint16_t> amaxes = bf16_amax_values(4);
  const int64_t K = (static_cast<int64_t>(amaxes.size()) + 15) / 16 * 16, M = kFp8Block;
  std::vector<bf16> x(M * K, to_bf16(1.0f));
  for (int64_t k = 0; k < static_cast<int64_t>(amaxes.size()); ++k)
    fill_block(amaxes[k], k, M, [&](int64_t t) -> bf16& { return x[t * K + k]; });
  const std::vector<int32_t> offsets = {0, static_cast<int32_t>(M)};
  for (Fp8ScaleMode mode : kModes) {
    std::vector<uint8_t> codes(fp8_col_codes_capacity(M, K, 1));
    std::vector<float> scales(fp8_col_scales_capacity(M, K, 1)), y(M * K);
    ASSERT_EQ(bf16_to_fp8_col_ref(x.data(), M, K, offsets.data(), 1, mode, codes.data(), scales.data()), 0);
    fp8_col_dequantize_ref(codes.data(), scales.data(), M, K, offsets.data(), 1, y.data());
    for (int64_t k = 0; k < static_cast<int64_t>(amaxes.size()); ++k)
      ASSERT_NO_FATAL_FAILURE(check_block(mode, bf16_bits_to_f32(amaxes[k]), scales[k], M,
                                          [&](int64_t t) { return to_f32(x[t * K + k]); },
                                          [&](int64_t t) { return y[t * K + k]; },
                                          [&](int64_t t) { return codes[k * M + t]; }));
  }
}

// 128x128 blocks side by side along K, one BF16 amax each (two mantissas per exponent), in both orientations.
TEST(Fp8ScaleRange, Block128ReferenceOverEveryBf16Exponent) {
  const std::vector<uint16_t> amaxes = bf16_amax_values(2);
  const int64_t blocks = static_cast<int64_t>(amaxes.size()), N = kFp8Block, K = blocks * kFp8Block;
  std::vector<bf16> w(N * K);
  for (int64_t b = 0; b < blocks; ++b)
    fill_block(amaxes[b], b * 37, N * kFp8Block,
               [&](int64_t i) -> bf16& { return w[(i / kFp8Block) * K + b * kFp8Block + i % kFp8Block]; });
  for (Fp8ScaleMode mode : kModes)
    for (bool transpose : {false, true}) {
      SCOPED_TRACE(transpose ? "transpose" : "no transpose");
      std::vector<uint8_t> codes(N * K);
      std::vector<float> scales(transpose ? fp8_block_scale_count(K, N) : fp8_block_scale_count(N, K)), y(N * K);
      ASSERT_EQ(bf16_to_fp8_block128_ref(w.data(), N, K, mode, transpose, codes.data(), scales.data()), 0);
      fp8_block128_dequantize_ref(codes.data(), scales.data(), N, K, transpose, y.data());
      // Element i of block b is w[n, k] with n = i / 128, k = b * 128 + i % 128; transposed it sits at [k, n].
      auto at = [&](int64_t b, int64_t i) {
        const int64_t n = i / kFp8Block, k = b * kFp8Block + i % kFp8Block;
        return transpose ? k * N + n : n * K + k;
      };
      for (int64_t b = 0; b < blocks; ++b) {
        const float s = transpose ? scales[b * fp8_block_scale_ld(N)] : scales[b];
        ASSERT_NO_FATAL_FAILURE(
            check_block(mode, bf16_bits_to_f32(amaxes[b]), s, N * kFp8Block,
                        [&](int64_t i) { return to_f32(w[(i / kFp8Block) * K + b * kFp8Block + i % kFp8Block]); },
                        [&](int64_t i) { return y[at(b, i)]; }, [&](int64_t i) { return codes[at(b, i)]; }));
      }
    }
}

// ---- all-zero blocks: scale 1 and zero codes (a -0 keeps its sign bit), every mode and layout -----------------

TEST(Fp8ScaleRange, AllZeroBlocksHaveUnitScaleAndZeroCodesInEveryModeAndLayout) {
  const int64_t M = 128, K = 256;  // row: 2 blocks per row; column: 256 features x 1 token block; 128x128: 2
  std::vector<bf16> x(M * K, to_bf16(0.0f));
  for (int64_t i = 0; i < M * K; i += 7) x[i] = to_bf16(-0.0f);
  auto expect_codes = [&](const std::vector<uint8_t>& codes, const std::function<int64_t(int64_t)>& index) {
    for (int64_t i = 0; i < M * K; ++i)
      ASSERT_EQ(codes[index(i)], (i % 7 == 0) ? 0x80 : 0x00) << "element " << i;
  };
  for (Fp8ScaleMode mode : kModes) {
    SCOPED_TRACE(mode_name(mode));
    std::vector<uint8_t> codes(M * K);
    std::vector<float> scales(fp8_row_scale_count(M, K));
    ASSERT_EQ(bf16_to_fp8_row_ref(x.data(), M, K, mode, codes.data(), scales.data()), 0);
    for (float s : scales) ASSERT_EQ(s, 1.0f) << "row";
    ASSERT_NO_FATAL_FAILURE(expect_codes(codes, [](int64_t i) { return i; }));

    const std::vector<int32_t> offsets = {0, static_cast<int32_t>(M)};
    std::vector<uint8_t> ccodes(fp8_col_codes_capacity(M, K, 1));
    std::vector<float> cscales(fp8_col_scales_capacity(M, K, 1), -1.0f);
    ASSERT_EQ(bf16_to_fp8_col_ref(x.data(), M, K, offsets.data(), 1, mode, ccodes.data(), cscales.data()), 0);
    for (int64_t k = 0; k < K; ++k) ASSERT_EQ(cscales[k], 1.0f) << "column, feature " << k;
    ASSERT_NO_FATAL_FAILURE(expect_codes(ccodes, [&](int64_t i) { return (i % K) * M + i / K; }));

    for (bool transpose : {false, true}) {
      std::vector<uint8_t> bcodes(M * K);
      std::vector<float> bscales(transpose ? fp8_block_scale_count(K, M) : fp8_block_scale_count(M, K));
      ASSERT_EQ(bf16_to_fp8_block128_ref(x.data(), M, K, mode, transpose, bcodes.data(), bscales.data()), 0);
      for (float s : bscales) ASSERT_EQ(s, 1.0f) << "128x128 (padding entries are 1 too)";
      ASSERT_NO_FATAL_FAILURE(expect_codes(bcodes, [&](int64_t i) { return transpose ? (i % K) * M + i / K : i; }));
    }
  }
}

// The direct MXFP4 -> FP8 conversions of all-zero MX blocks (scale byte 0, codes 0, as bf16_to_mxfp4_row writes
// them): zero codes and the rule's finite scale 2^max(E - 6, -126) = 2^-126, never NaN.
TEST(Fp8ScaleRange, AllZeroMxBlocksConvertToZeroCodesAndAFiniteScale) {
  const int64_t M = 128, K = 256;
  std::vector<bf16> x(M * K, to_bf16(0.0f));
  std::vector<uint8_t> mx_codes(M * K / 2), mx_scales(M * K / 32);
  ASSERT_EQ(bf16_to_mxfp4_row_ref(x.data(), M, K, mx_codes.data(), mx_scales.data(), MxQuantConfig{}), 0);
  std::vector<uint8_t> codes(M * K, 0xA5);
  std::vector<float> scales(fp8_row_scale_count(M, K));
  mxfp4_row_to_fp8_row_ref(mx_codes.data(), mx_scales.data(), M, K, codes.data(), scales.data());
  for (uint8_t c : codes) ASSERT_EQ(c, 0x00) << "row";
  for (float s : scales) ASSERT_EQ(s, std::ldexp(1.0f, -126)) << "row";
  const std::vector<int32_t> offsets = {0, static_cast<int32_t>(M)};
  std::vector<uint8_t> ccodes(fp8_col_codes_capacity(M, K, 1), 0xA5);
  std::vector<float> cscales(fp8_col_scales_capacity(M, K, 1));
  mxfp4_row_to_fp8_col_ref(mx_codes.data(), mx_scales.data(), M, K, offsets.data(), 1, ccodes.data(), cscales.data());
  for (int64_t i = 0; i < K * M; ++i) ASSERT_EQ(ccodes[i], 0x00) << "column, element " << i;  // one group: [K, M]
  for (int64_t k = 0; k < K; ++k) ASSERT_EQ(cscales[k], std::ldexp(1.0f, -126)) << "column, feature " << k;
}

}  // namespace
}  // namespace fp4moe
