// CPU references of the column conversions for Wgrad and of the BF16 -> FP8 baselines: hand-computed blocks,
// the layouts of layouts.h (group placement, zero padding, short blocks, scale padding), the exactness of the
// direct MXFP4 -> FP8 column rule, argument rejection, the block128 transpose and dequantization error bounds.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/formats/formats.h"
#include "kernels/quant/bf16_to_fp8.h"
#include "kernels/quant/e2m1_e4m3_lut.h"
#include "kernels/quant/fp8_block_scale.h"
#include "kernels/quant/fp8_col_groups.h"
#include "kernels/quant/layouts.h"
#include "kernels/quant/mxfp4_row_to_fp8_col.h"

namespace fp4moe {
namespace {

constexpr uint8_t kPoison = 0xA5;

bf16 to_bf16(float v) { return bf16_from_bits(f32_to_bf16_bits(v)); }
float to_f32(bf16 v) { return bf16_bits_to_f32(bf16_bits(v)); }
uint32_t bits(float f) { return f32_bits(f); }

std::vector<bf16> to_bf16(const std::vector<float>& v) {
  std::vector<bf16> out;
  for (float f : v) out.push_back(to_bf16(f));
  return out;
}

// Seeded BF16 activations: a per-row magnitude spread of 2^-8 .. 2^8, rare outliers (x 2^12) and zero rows.
std::vector<bf16> random_bf16(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> row_exp(-8, 8), pick(0, 511);
  std::vector<bf16> x(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    bool zero_row = pick(rng) < 8;
    float row_scale = std::ldexp(1.0f, row_exp(rng));
    for (int64_t c = 0; c < cols; ++c) {
      float v = zero_row ? 0.0f : normal(rng) * row_scale;
      if (pick(rng) == 0) v *= 4096.0f;
      x[r * cols + c] = to_bf16(v);
    }
  }
  return x;
}

// Seeded MXFP4 row tensor [M, K]: random codes; MX exponents in [-20, -20 + spread] (so the spread within any
// block of tokens is <= spread); with `specials`, some NaN blocks and some all-zero blocks (scale byte 0).
struct Mxfp4 {
  std::vector<uint8_t> codes, scales;
};
Mxfp4 random_mxfp4(int64_t M, int64_t K, int spread, bool specials, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255), exp(0, spread), pick(0, 255);
  Mxfp4 t{std::vector<uint8_t>(static_cast<size_t>(M * K / 2)), std::vector<uint8_t>(static_cast<size_t>(M * K / 32))};
  for (auto& c : t.codes) c = static_cast<uint8_t>(byte(rng));
  for (size_t i = 0; i < t.scales.size(); ++i) {
    t.scales[i] = static_cast<uint8_t>(127 - 20 + exp(rng));
    int p = pick(rng);
    if (specials && p == 0) t.scales[i] = kUE8M0NaN;
    if (specials && p == 1) {  // an all-zero block as the quantizer writes it
      t.scales[i] = 0;
      std::memset(&t.codes[i * 16], 0, 16);
    }
  }
  return t;
}

// Exact value of MXFP4 element (r, k) as a double (NaN for a NaN block).
double mxfp4_value(const Mxfp4& t, int64_t K, int64_t r, int64_t k) {
  uint8_t sb = t.scales[r * (K / 32) + k / 32];
  if (sb == kUE8M0NaN) return NAN;
  uint8_t byte = t.codes[r * (K / 2) + k / 2];
  uint8_t code = (k % 2 == 0) ? (byte & 0xF) : (byte >> 4);
  return std::ldexp(static_cast<double>(e2m1_to_f32(code)), sb - 127);
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// ---- the packed E2M1 -> E4M3 table of the GPU kernel ---------------------------------------------------------

TEST(E2M1ToE4M3Lut, MatchesTheShiftedEncodeForEveryShift) {
  for (int shift = -300; shift <= 6; ++shift) {
    E2M1ToE4M3Lut lut = e2m1_to_e4m3_lut(shift);
    for (uint32_t mag = 0; mag < 8; ++mag) {
      uint32_t byte = ((mag < 4 ? lut.lo : lut.hi) >> (8 * (mag & 3))) & 0xFF;
      ASSERT_EQ(byte, e2m1_to_e4m3_shifted(static_cast<uint8_t>(mag), shift)) << "shift " << shift << " mag " << mag;
    }
  }
}

// ---- FP8 block scale and BF16 -> FP8, hand-computed -------------------------------------------------------------

TEST(Fp8BlockScale, HandComputedScales) {
  // pow2: the smallest p with amax <= 448 * 2^p.
  EXPECT_EQ(fp8_block_scale(448.0f, Fp8ScaleMode::pow2).scale, 1.0f);
  EXPECT_EQ(fp8_block_scale(449.0f, Fp8ScaleMode::pow2).scale, 2.0f);
  EXPECT_EQ(fp8_block_scale(3.0f, Fp8ScaleMode::pow2).scale, 0.0078125f);        // 448 / 128 = 3.5 >= 3
  EXPECT_EQ(fp8_block_scale(3.0f, Fp8ScaleMode::pow2).multiplier, 128.0f);
  EXPECT_EQ(fp8_block_scale(1.0f, Fp8ScaleMode::pow2).scale, 0.00390625f);       // 448 / 256 = 1.75 >= 1
  EXPECT_EQ(fp8_block_scale(3.5f, Fp8ScaleMode::pow2).scale, 0.0078125f);        // exactly 448 * 2^-7
  EXPECT_EQ(fp8_block_scale(3.5000002f, Fp8ScaleMode::pow2).scale, 0.015625f);
  // fp32: s = amax / 448, multiplier 448 / amax, both rounded to nearest in fp32.
  EXPECT_EQ(fp8_block_scale(3.0f, Fp8ScaleMode::fp32).scale, 3.0f / 448.0f);
  EXPECT_EQ(fp8_block_scale(3.0f, Fp8ScaleMode::fp32).multiplier, 448.0f / 3.0f);
  // fp32 below amax = 448 * 2^-126: the pow2 floor s = 2^-126, multiplier 2^126 (448 / 1e-40 overflows).
  EXPECT_EQ(fp8_block_scale(1e-40f, Fp8ScaleMode::fp32).scale, std::ldexp(1.0f, -126));
  EXPECT_EQ(fp8_block_scale(1e-40f, Fp8ScaleMode::fp32).multiplier, std::ldexp(1.0f, 126));
  for (Fp8ScaleMode mode : {Fp8ScaleMode::pow2, Fp8ScaleMode::fp32}) {
    EXPECT_EQ(fp8_block_scale(0.0f, mode).scale, 1.0f);
    EXPECT_FALSE(fp8_block_scale(0.0f, mode).nonfinite);
    EXPECT_TRUE(std::isnan(fp8_block_scale(NAN, mode).scale));
    EXPECT_TRUE(fp8_block_scale(INFINITY, mode).nonfinite);
  }
}

// One row of 16 elements: [1, -0.5, 3, 0.1 (bf16 0.10009765625), 0 x 12].
std::vector<bf16> hand_row() {
  std::vector<float> v(16, 0.0f);
  v[0] = 1.0f, v[1] = -0.5f, v[2] = 3.0f, v[3] = 0.1f;
  return to_bf16(v);
}

TEST(Bf16ToFp8Row, HandComputedPow2Block) {
  std::vector<bf16> x = hand_row();
  std::vector<uint8_t> codes(16, kPoison);
  std::vector<float> scales(4, -1.0f);
  EXPECT_EQ(bf16_to_fp8_row_ref(x.data(), 1, 16, Fp8ScaleMode::pow2, codes.data(), scales.data()), 0);
  // amax 3 -> s = 2^-7: 1 * 128 = 2^7 -> 0x70; -64 -> 0xE8; 384 = 1.5 * 2^8 -> 0x7C; 12.8125 -> 13 -> 0x55.
  EXPECT_EQ(codes[0], 0x70);
  EXPECT_EQ(codes[1], 0xE8);
  EXPECT_EQ(codes[2], 0x7C);
  EXPECT_EQ(codes[3], 0x55);
  for (int i = 4; i < 16; ++i) EXPECT_EQ(codes[i], 0x00) << i;
  EXPECT_EQ(scales[0], 0.0078125f);
  for (int r = 1; r < 4; ++r) EXPECT_EQ(scales[r], 1.0f) << "padding row " << r;  // ld = round_up(1, 4)
}

TEST(Bf16ToFp8Row, HandComputedFp32Block) {
  std::vector<bf16> x = hand_row();
  std::vector<uint8_t> codes(16, kPoison);
  std::vector<float> scales(4, -1.0f);
  bf16_to_fp8_row_ref(x.data(), 1, 16, Fp8ScaleMode::fp32, codes.data(), scales.data());
  // multiplier 448/3 = 149.33: 149.33 -> 144 (0x71); 3 -> 447.99998 -> 448 (0x7E); -74.67 -> -72 (0xE9).
  EXPECT_EQ(codes[0], 0x71);
  EXPECT_EQ(codes[1], 0xE9);
  EXPECT_EQ(codes[2], 0x7E);
  EXPECT_EQ(codes[3], f32_to_e4m3_satfinite(to_f32(x[3]) * (448.0f / 3.0f)));
  EXPECT_EQ(scales[0], 3.0f / 448.0f);
}

TEST(Bf16ToFp8Row, ZeroBlockHasUnitScaleAndZeroCodes) {
  std::vector<bf16> x = to_bf16(std::vector<float>(32, 0.0f));
  x[5] = to_bf16(-0.0f);
  for (Fp8ScaleMode mode : {Fp8ScaleMode::pow2, Fp8ScaleMode::fp32}) {
    std::vector<uint8_t> codes(32, kPoison);
    std::vector<float> scales(4, -1.0f);
    bf16_to_fp8_row_ref(x.data(), 1, 32, mode, codes.data(), scales.data());
    EXPECT_EQ(scales[0], 1.0f);
    for (int i = 0; i < 32; ++i) EXPECT_EQ(codes[i], i == 5 ? 0x80 : 0x00) << i;  // -0 keeps its sign bit
  }
}

TEST(Bf16ToFp8Row, NonFiniteBlockIsNanAndCountedAlone) {
  // Row 0: blocks [0, 128) and [128, 256); row 1 likewise. NaN in row 0 block 1, Inf in row 1 block 0.
  const int64_t M = 2, K = 256;
  std::vector<bf16> x = random_bf16(M, K, 7);
  x[0 * K + 200] = to_bf16(NAN);
  x[1 * K + 3] = to_bf16(-INFINITY);
  std::vector<uint8_t> codes(M * K, kPoison);
  std::vector<float> scales(fp8_row_scale_count(M, K), -1.0f);
  EXPECT_EQ(bf16_to_fp8_row_ref(x.data(), M, K, Fp8ScaleMode::pow2, codes.data(), scales.data()), 2);
  auto scale = [&](int64_t r, int64_t b) { return scales[fp8_row_scale_index(r, b, M)]; };
  EXPECT_EQ(bits(scale(0, 1)), kFp8NanScaleBits);
  EXPECT_EQ(bits(scale(1, 0)), kFp8NanScaleBits);
  EXPECT_TRUE(std::isfinite(scale(0, 0)));
  EXPECT_TRUE(std::isfinite(scale(1, 1)));
  for (int64_t k = 0; k < K; ++k) {
    EXPECT_EQ(codes[0 * K + k] == 0x7F, k >= 128) << "row 0, k " << k;
    EXPECT_EQ(codes[1 * K + k] == 0x7F, k < 128) << "row 1, k " << k;
  }
}

TEST(Bf16ToFp8Row, ShortLastBlockAndScalePadding) {
  // K = 272 = 128 + 128 + 16: the last block covers 16 elements; an outlier there must not touch block 1.
  const int64_t M = 5, K = 272;
  std::vector<bf16> x = random_bf16(M, K, 11);
  for (int64_t r = 0; r < M; ++r) x[r * K + 270] = to_bf16(1e6f);
  std::vector<uint8_t> codes(M * K, kPoison);
  std::vector<float> scales(fp8_row_scale_count(M, K), -1.0f);
  ASSERT_EQ(scales.size(), 3u * 8u);
  bf16_to_fp8_row_ref(x.data(), M, K, Fp8ScaleMode::pow2, codes.data(), scales.data());
  for (int64_t r = 0; r < 8; ++r)
    for (int64_t b = 0; b < 3; ++b) {
      float s = scales[b * 8 + r];
      if (r >= M) {
        EXPECT_EQ(s, 1.0f) << "padding row " << r;
        continue;
      }
      float amax = 0;
      for (int64_t k = b * 128; k < std::min<int64_t>(K, b * 128 + 128); ++k) amax = std::max(amax, std::fabs(to_f32(x[r * K + k])));
      EXPECT_EQ(s, amax == 0 ? 1.0f : fp8_block_scale(amax, Fp8ScaleMode::pow2).scale) << r << "," << b;
    }
}

// ---- BF16 -> FP8 column layout ----------------------------------------------------------------------------------

// Group g of the column tensor must be the row quantization of the group's transpose padded with zero tokens to
// L_g: the same 1x128 blocks, now along tokens.
void expect_col_equals_row_of_transpose(const std::vector<int32_t>& offsets, int64_t K, Fp8ScaleMode mode) {
  const int64_t G = static_cast<int64_t>(offsets.size()) - 1, M = offsets.back();
  std::vector<bf16> x = random_bf16(M, K, 17);
  const int64_t cap_codes = fp8_col_codes_capacity(M, K, G), cap_scales = fp8_col_scales_capacity(M, K, G);
  std::vector<uint8_t> codes(cap_codes + 64, kPoison);
  std::vector<float> scales(cap_scales + 16, -1.0f);
  bf16_to_fp8_col_ref(x.data(), M, K, offsets.data(), G, mode, codes.data(), scales.data());
  int64_t used_codes = 0, used_scales = 0;
  for (const Fp8ColGroup& grp : fp8_col_groups(offsets.data(), G, K)) {
    used_codes += K * grp.ld;
    used_scales += K * grp.token_blocks;
    if (grp.rows == 0) continue;
    std::vector<bf16> xt(K * grp.ld, to_bf16(0.0f));
    for (int64_t t = 0; t < grp.rows; ++t)
      for (int64_t k = 0; k < K; ++k) xt[k * grp.ld + t] = x[(grp.row0 + t) * K + k];
    std::vector<uint8_t> row_codes(K * grp.ld);
    std::vector<float> row_scales(fp8_row_scale_count(K, grp.ld));
    bf16_to_fp8_row_ref(xt.data(), K, grp.ld, mode, row_codes.data(), row_scales.data());
    for (int64_t i = 0; i < K * grp.ld; ++i)
      ASSERT_EQ(codes[grp.codes_offset + i], row_codes[i]) << "group at row " << grp.row0 << ", element " << i;
    for (int64_t b = 0; b < grp.token_blocks; ++b)
      for (int64_t k = 0; k < K; ++k)
        ASSERT_EQ(bits(scales[grp.scales_offset + b * K + k]), bits(row_scales[fp8_row_scale_index(k, b, K)]))
            << "block " << b << ", feature " << k;
  }
  // Nothing written past the groups' extent (the last group ends where the next one would start).
  for (int64_t i = used_codes; i < static_cast<int64_t>(codes.size()); ++i) ASSERT_EQ(codes[i], kPoison) << i;
  for (int64_t i = used_scales; i < static_cast<int64_t>(scales.size()); ++i) ASSERT_EQ(scales[i], -1.0f) << i;
}

TEST(Bf16ToFp8Col, GroupPlacementPaddingAndShortBlocks) {
  // Groups of 3, 0, 17 and 130 rows: L = 16, 0, 32, 144; token blocks 1, 0, 1, 2 (the last one of 2 tokens).
  std::vector<int32_t> offsets = {0, 3, 3, 20, 150};
  std::vector<Fp8ColGroup> groups = fp8_col_groups(offsets.data(), 4, 16);
  EXPECT_EQ(groups[1].codes_offset, 16 * 16);
  EXPECT_EQ(groups[2].codes_offset, 16 * 16);
  EXPECT_EQ(groups[3].codes_offset, 16 * (16 + 32));
  EXPECT_EQ(groups[3].scales_offset, 16 * 2);
  EXPECT_EQ(groups[3].ld, 144);
  EXPECT_EQ(groups[3].token_blocks, 2);
  for (Fp8ScaleMode mode : {Fp8ScaleMode::pow2, Fp8ScaleMode::fp32}) {
    expect_col_equals_row_of_transpose(offsets, 16, mode);
    expect_col_equals_row_of_transpose({0, 162, 162, 2739, 3185, 3185, 3268}, 48, mode);
    expect_col_equals_row_of_transpose({0, 1, 2, 3}, 32, mode);
  }
}

TEST(Bf16ToFp8Col, NanBlockKeepsZeroPadding) {
  const int64_t K = 16;
  std::vector<int32_t> offsets = {0, 5};
  std::vector<bf16> x = random_bf16(5, K, 3);
  x[2 * K + 7] = to_bf16(NAN);  // feature 7, token 2
  std::vector<uint8_t> codes(fp8_col_codes_capacity(5, K, 1), kPoison);
  std::vector<float> scales(fp8_col_scales_capacity(5, K, 1), -1.0f);
  EXPECT_EQ(bf16_to_fp8_col_ref(x.data(), 5, K, offsets.data(), 1, Fp8ScaleMode::pow2, codes.data(), scales.data()), 1);
  EXPECT_EQ(bits(scales[7]), kFp8NanScaleBits);
  for (int t = 0; t < 16; ++t) EXPECT_EQ(codes[7 * 16 + t], t < 5 ? 0x7F : 0x00) << t;
  EXPECT_NE(codes[6 * 16 + 0], 0x7F);
}

// ---- MXFP4 -> FP8 column -----------------------------------------------------------------------------------

TEST(Mxfp4RowToFp8Col, HandComputedBlock) {
  // Three tokens, K = 32: exponents 0 and 3, the third token's block is NaN. Codes: every element 6.0 (code 7),
  // except element 1 of token 0, which is -0.5 (code 9).
  const int64_t M = 3, K = 32;
  std::vector<uint8_t> codes(M * 16, 0x77), scales = {127, 130, kUE8M0NaN};
  codes[0] = 0x97;
  std::vector<int32_t> offsets = {0, 3};
  std::vector<uint8_t> out(fp8_col_codes_capacity(M, K, 1), kPoison);
  std::vector<float> out_scales(fp8_col_scales_capacity(M, K, 1), -1.0f);
  mxfp4_row_to_fp8_col_ref(codes.data(), scales.data(), M, K, offsets.data(), 1, out.data(), out_scales.data());
  // E = 3, s = E - 6 = -3: token 0 has shift 3 (6 * 8 = 48 = 1.5 * 2^5 -> 0x64; -0.5 * 8 = -4 -> 0xC8),
  // token 1 shift 6 (6 * 64 = 384 -> 0x7C), token 2 NaN (0x7F); columns 3..15 are padding.
  EXPECT_EQ(out_scales[0], 0.125f);
  EXPECT_EQ(out[0 * 16 + 0], 0x64);
  EXPECT_EQ(out[1 * 16 + 0], 0xC8);
  for (int k = 0; k < K; ++k) {
    EXPECT_EQ(out_scales[k], 0.125f);
    if (k != 1) {
      EXPECT_EQ(out[k * 16 + 0], 0x64) << k;
    }
    EXPECT_EQ(out[k * 16 + 1], 0x7C) << k;
    EXPECT_EQ(out[k * 16 + 2], 0x7F) << k;
    for (int t = 3; t < 16; ++t) EXPECT_EQ(out[k * 16 + t], 0x00) << k << "," << t;
  }
  // Dequantized: 0x64 * 0.125 = 6 (token 0), 0x7C * 0.125 = 48 = 6 * 2^3 (token 1).
  EXPECT_EQ(e4m3_to_f32(out[0]) * out_scales[0], 6.0f);
  EXPECT_EQ(e4m3_to_f32(out[1]) * out_scales[0], 48.0f);
}

TEST(Mxfp4RowToFp8Col, AllNanBlockHasUnitScale) {
  const int64_t M = 2, K = 32;
  std::vector<uint8_t> codes(M * 16, 0x12), scales = {kUE8M0NaN, kUE8M0NaN};
  std::vector<int32_t> offsets = {0, 2};
  std::vector<uint8_t> out(fp8_col_codes_capacity(M, K, 1), kPoison);
  std::vector<float> out_scales(fp8_col_scales_capacity(M, K, 1), -1.0f);
  mxfp4_row_to_fp8_col_ref(codes.data(), scales.data(), M, K, offsets.data(), 1, out.data(), out_scales.data());
  for (int k = 0; k < K; ++k) {
    EXPECT_EQ(out_scales[k], 1.0f);
    EXPECT_EQ(out[k * 16 + 0], 0x7F);
    EXPECT_EQ(out[k * 16 + 1], 0x7F);
  }
}

// Every element against the rule computed in floating point: code = RNE_E4M3(value * 2^-s), s from the block's
// largest non-NaN exponent; exact (dequantized value == MXFP4 value) whenever the block's spread is <= 14.
void expect_mxfp4_col_matches_rule(const std::vector<int32_t>& offsets, int64_t K, int spread, uint32_t seed) {
  const int64_t G = static_cast<int64_t>(offsets.size()) - 1, M = offsets.back();
  Mxfp4 in = random_mxfp4(M, K, spread, true, seed);
  std::vector<uint8_t> out(fp8_col_codes_capacity(M, K, G) + 64, kPoison);
  std::vector<float> out_scales(fp8_col_scales_capacity(M, K, G) + 16, -1.0f);
  mxfp4_row_to_fp8_col_ref(in.codes.data(), in.scales.data(), M, K, offsets.data(), G, out.data(), out_scales.data());
  int64_t used_codes = 0, used_scales = 0, inexact = 0;
  for (const Fp8ColGroup& grp : fp8_col_groups(offsets.data(), G, K)) {
    used_codes += K * grp.ld;
    used_scales += K * grp.token_blocks;
    for (int64_t k = 0; k < K; ++k) {
      for (int64_t b = 0; b < grp.token_blocks; ++b) {
        int E = INT32_MIN;
        for (int64_t t = b * 128; t < std::min(grp.rows, b * 128 + 128); ++t) {
          uint8_t sb = in.scales[(grp.row0 + t) * (K / 32) + k / 32];
          if (sb != kUE8M0NaN) E = std::max(E, sb - 127);
        }
        const int s = E == INT32_MIN ? 0 : std::max(E - 6, -126);
        ASSERT_EQ(out_scales[grp.scales_offset + b * K + k], std::ldexp(1.0f, s));
        for (int64_t t = b * 128; t < std::min(grp.rows, b * 128 + 128); ++t) {
          double v = mxfp4_value(in, K, grp.row0 + t, k);
          uint8_t got = out[grp.codes_offset + k * grp.ld + t];
          if (std::isnan(v)) {
            ASSERT_EQ(got, 0x7F);
            continue;
          }
          uint8_t expect = f32_to_e4m3_satfinite(static_cast<float>(std::ldexp(v, -s)));  // exact product, then RNE
          ASSERT_EQ(got, expect) << "row " << grp.row0 + t << ", k " << k;
          double back = static_cast<double>(e4m3_to_f32(got)) * std::ldexp(1.0, s);
          if (E - (in.scales[(grp.row0 + t) * (K / 32) + k / 32] - 127) <= 14) {
            ASSERT_EQ(back, v);
          }
          inexact += back != v;
        }
      }
      for (int64_t t = grp.rows; t < grp.ld; ++t) ASSERT_EQ(out[grp.codes_offset + k * grp.ld + t], 0) << t;
    }
  }
  if (spread <= 14) EXPECT_EQ(inexact, 0);
  else EXPECT_GT(inexact, 0) << "a spread of " << spread << " should round some elements";
  for (int64_t i = used_codes; i < static_cast<int64_t>(out.size()); ++i) ASSERT_EQ(out[i], kPoison) << i;
  for (int64_t i = used_scales; i < static_cast<int64_t>(out_scales.size()); ++i) ASSERT_EQ(out_scales[i], -1.0f) << i;
}

TEST(Mxfp4RowToFp8Col, ExactWhileSpreadAtMost14) {
  expect_mxfp4_col_matches_rule({0, 162, 162, 2739, 3185, 3185, 3268}, 64, 14, 1);
  expect_mxfp4_col_matches_rule({0, 1, 2, 3, 130}, 32, 14, 2);
}

TEST(Mxfp4RowToFp8Col, RoundsToNearestEvenBeyondSpread14) {
  expect_mxfp4_col_matches_rule({0, 300, 301}, 96, 30, 3);
}

// ---- argument rejection --------------------------------------------------------------------------------------

TEST(QuantColRefRejects, InvalidOffsets) {
  const int64_t K = 32;
  Mxfp4 in = random_mxfp4(8, K, 4, false, 5);
  std::vector<uint8_t> out(fp8_col_codes_capacity(8, K, 3));
  std::vector<float> s(fp8_col_scales_capacity(8, K, 3));
  auto run = [&](std::vector<int32_t> o, int64_t G) {
    return error_of([&] { mxfp4_row_to_fp8_col_ref(in.codes.data(), in.scales.data(), 8, K, o.data(), G, out.data(), s.data()); });
  };
  EXPECT_NE(run({1, 4, 8}, 2).find("must start at 0, got offsets[0]=1"), std::string::npos);
  EXPECT_NE(run({0, 5, 3, 8}, 3).find("non-decreasing"), std::string::npos);
  EXPECT_NE(run({0, 4, 7}, 2).find("must end at M=8, got offsets[2]=7"), std::string::npos);
  EXPECT_NE(run({0}, 0).find("at least one group, got G=0"), std::string::npos);
  std::vector<bf16> x = random_bf16(8, K, 5);
  std::vector<int32_t> bad = {0, 9};
  EXPECT_NE(error_of([&] { bf16_to_fp8_col_ref(x.data(), 8, K, bad.data(), 1, Fp8ScaleMode::pow2, out.data(), s.data()); })
                .find("must end at M=8"),
            std::string::npos);
}

TEST(QuantColRefRejects, ShapesNamedInMessages) {
  std::vector<uint8_t> codes(4 * 48), scales(4 * 2), out(4096);
  std::vector<float> s(4096);
  std::vector<int32_t> offsets = {0, 4};
  EXPECT_NE(error_of([&] { mxfp4_row_to_fp8_col_ref(codes.data(), scales.data(), 4, 48, offsets.data(), 1, out.data(), s.data()); })
                .find("multiple of 32 (MX block), got in [M, K] = [4, 48]"),
            std::string::npos);
  std::vector<bf16> x(7 * 24, to_bf16(1.0f));
  EXPECT_NE(error_of([&] { bf16_to_fp8_row_ref(x.data(), 7, 24, Fp8ScaleMode::pow2, out.data(), s.data()); })
                .find("multiple of 16, got x [M, K] = [7, 24]"),
            std::string::npos);
  std::vector<int32_t> o7 = {0, 7};
  EXPECT_NE(error_of([&] { bf16_to_fp8_col_ref(x.data(), 7, 24, o7.data(), 1, Fp8ScaleMode::pow2, out.data(), s.data()); })
                .find("[M, K] = [7, 24]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { bf16_to_fp8_block128_ref(x.data(), 7, 16, Fp8ScaleMode::pow2, false, out.data(), s.data()); })
                .find("N must be a positive multiple of 16, got w [N, K] = [7, 16]"),
            std::string::npos);
}

// ---- 128x128 weight blocks -------------------------------------------------------------------------------------

TEST(Bf16ToFp8Block128, TransposeIsTheTransposeOfTheBlocks) {
  for (Fp8ScaleMode mode : {Fp8ScaleMode::pow2, Fp8ScaleMode::fp32}) {
    const int64_t N = 144, K = 400;  // 2 x 4 blocks, short in both directions; scale rows padded 4 -> 4, 2 -> 4
    std::vector<bf16> w = random_bf16(N, K, 23);
    w[130 * K + 390] = to_bf16(INFINITY);  // block (1, 3)
    std::vector<uint8_t> c(N * K, kPoison), ct(N * K, kPoison);
    std::vector<float> s(fp8_block_scale_count(N, K), -1.0f), st(fp8_block_scale_count(K, N), -1.0f);
    EXPECT_EQ(bf16_to_fp8_block128_ref(w.data(), N, K, mode, false, c.data(), s.data()), 1);
    EXPECT_EQ(bf16_to_fp8_block128_ref(w.data(), N, K, mode, true, ct.data(), st.data()), 1);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) ASSERT_EQ(ct[k * N + n], c[n * K + k]) << n << "," << k;
    const int64_t ld = fp8_block_scale_ld(K), ldt = fp8_block_scale_ld(N);
    ASSERT_EQ(ld, 4);
    ASSERT_EQ(ldt, 4);
    for (int64_t nb = 0; nb < 2; ++nb)
      for (int64_t kb = 0; kb < 4; ++kb) ASSERT_EQ(bits(st[kb * ldt + nb]), bits(s[nb * ld + kb])) << nb << "," << kb;
    for (int64_t kb = 0; kb < 4; ++kb)
      for (int64_t nb = 2; nb < ldt; ++nb) EXPECT_EQ(st[kb * ldt + nb], 1.0f) << "padding " << kb << "," << nb;
    EXPECT_EQ(bits(s[1 * ld + 3]), kFp8NanScaleBits);
  }
}

TEST(Bf16ToFp8Block128, BlockScaleCoversTheWholeTile) {
  const int64_t N = 128, K = 128;
  std::vector<bf16> w(N * K);
  for (int64_t i = 0; i < N * K; ++i) w[i] = to_bf16(0.5f * static_cast<float>(i % 7 - 3));
  w[127 * K + 127] = to_bf16(1000.0f);  // the tile's amax sits in its last element
  std::vector<uint8_t> c(N * K);
  std::vector<float> s(fp8_block_scale_count(N, K));
  bf16_to_fp8_block128_ref(w.data(), N, K, Fp8ScaleMode::pow2, false, c.data(), s.data());
  EXPECT_EQ(s[0], 4.0f);  // 1000 <= 448 * 4
  EXPECT_EQ(s[1], 1.0f);  // padding
  EXPECT_EQ(c[127 * K + 127], f32_to_e4m3_satfinite(250.0f));
}

// ---- dequantization ---------------------------------------------------------------------------------------------

TEST(Fp8Dequantize, HandComputedLayouts) {
  // Row: [2, 32] with scales [1, 4] = {0.5, 2, pad, pad}.
  std::vector<uint8_t> codes(64, 0x38);  // 1.0
  codes[32] = 0xC0;                      // -2.0
  std::vector<float> scales = {0.5f, 2.0f, 1.0f, 1.0f}, y(64);
  fp8_row_dequantize_ref(codes.data(), scales.data(), 2, 32, y.data());
  EXPECT_EQ(y[0], 0.5f);
  EXPECT_EQ(y[31], 0.5f);
  EXPECT_EQ(y[32], -4.0f);
  EXPECT_EQ(y[33], 2.0f);
  // Column: groups {1, 2} rows, K = 16; group 1 codes start at 16 * 16, its scales at 16.
  std::vector<int32_t> offsets = {0, 1, 3};
  std::vector<uint8_t> ccodes(fp8_col_codes_capacity(3, 16, 2), 0);
  std::vector<float> cscales(fp8_col_scales_capacity(3, 16, 2), 1.0f), cy(3 * 16);
  ccodes[16 * 16 + 5 * 16 + 1] = 0x40;  // group 1, feature 5, token 1 (row 2): 2.0
  cscales[16 + 5] = 8.0f;
  fp8_col_dequantize_ref(ccodes.data(), cscales.data(), 3, 16, offsets.data(), 2, cy.data());
  EXPECT_EQ(cy[2 * 16 + 5], 16.0f);
  EXPECT_EQ(cy[1 * 16 + 5], 0.0f);
  // block128 transposed: W^T [16, 32] with scales [1, 4] = {0.25, pad...}.
  std::vector<uint8_t> bcodes(16 * 32, 0x30);  // 0.5
  std::vector<float> bscales = {0.25f, 1.0f, 1.0f, 1.0f}, by(16 * 32);
  fp8_block128_dequantize_ref(bcodes.data(), bscales.data(), 32, 16, true, by.data());
  EXPECT_EQ(by[0], 0.125f);
  EXPECT_EQ(by[16 * 32 - 1], 0.125f);
}

// E4M3 keeps 4 significant bits: a normal rounds within 2^-4 relative; below 2^-6 * s the absolute step is
// 2^-9 * s, so the error is at most half of it. fp32 mode adds the rounding of the multiplier (2^-24).
void expect_within_fp8_bound(const std::vector<bf16>& x, const std::vector<float>& y, const std::function<float(int64_t)>& scale_of) {
  for (size_t i = 0; i < x.size(); ++i) {
    float v = to_f32(x[i]);
    float s = scale_of(static_cast<int64_t>(i));
    double bound = std::fabs(v) * (0.0625 + 1e-6) + std::ldexp(static_cast<double>(s), -10) * (1 + 1e-6);
    ASSERT_LE(std::fabs(static_cast<double>(y[i]) - v), bound) << "element " << i << " value " << v << " scale " << s;
  }
}

TEST(Fp8Dequantize, ErrorWithinE4M3Bound) {
  for (Fp8ScaleMode mode : {Fp8ScaleMode::pow2, Fp8ScaleMode::fp32}) {
    const int64_t M = 300, K = 272;
    std::vector<bf16> x = random_bf16(M, K, 31);
    std::vector<uint8_t> codes(M * K);
    std::vector<float> scales(fp8_row_scale_count(M, K)), y(M * K);
    bf16_to_fp8_row_ref(x.data(), M, K, mode, codes.data(), scales.data());
    fp8_row_dequantize_ref(codes.data(), scales.data(), M, K, y.data());
    expect_within_fp8_bound(x, y, [&](int64_t i) { return scales[fp8_row_scale_index(i / K, (i % K) / 128, M)]; });

    std::vector<int32_t> offsets = {0, 100, 100, 300};
    std::vector<uint8_t> ccodes(fp8_col_codes_capacity(M, K, 3));
    std::vector<float> cscales(fp8_col_scales_capacity(M, K, 3));
    bf16_to_fp8_col_ref(x.data(), M, K, offsets.data(), 3, mode, ccodes.data(), cscales.data());
    fp8_col_dequantize_ref(ccodes.data(), cscales.data(), M, K, offsets.data(), 3, y.data());
    std::vector<Fp8ColGroup> groups = fp8_col_groups(offsets.data(), 3, K);
    expect_within_fp8_bound(x, y, [&](int64_t i) {
      int64_t r = i / K, k = i % K;
      const Fp8ColGroup& g = r < 100 ? groups[0] : groups[2];
      return cscales[g.scales_offset + ((r - g.row0) / 128) * K + k];
    });

    const int64_t N = 288;
    std::vector<bf16> w = random_bf16(N, K, 37);
    std::vector<uint8_t> wcodes(N * K);
    std::vector<float> wscales(fp8_block_scale_count(N, K)), wy(N * K);
    bf16_to_fp8_block128_ref(w.data(), N, K, mode, false, wcodes.data(), wscales.data());
    fp8_block128_dequantize_ref(wcodes.data(), wscales.data(), N, K, false, wy.data());
    expect_within_fp8_bound(w, wy, [&](int64_t i) {
      return wscales[(i / K / 128) * fp8_block_scale_ld(K) + (i % K) / 128];
    });
  }
}

}  // namespace
}  // namespace fp4moe
