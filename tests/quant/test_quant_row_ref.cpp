// Properties of the CPU references of the MXFP4 row kernels: bf16_to_mxfp4_row_ref (BF16 -> MXFP4),
// mxfp4_to_bf16_ref (MXFP4 -> BF16) and mxfp4_row_to_fp8_row_ref (direct MXFP4 -> FP8 1x128 row).
// Hand-computed examples, the special blocks (zero, NaN/Inf, -0), argument rejection, stochastic rounding, and an
// exhaustive check of the direct conversion against the exact MXFP4 value computed in double.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/common/types.h"
#include "kernels/formats/formats.h"
#include "kernels/quant/bf16_to_mxfp4_row.h"
#include "kernels/quant/layouts.h"
#include "kernels/quant/mxfp4_row_to_fp8_row.h"
#include "kernels/quant/mxfp4_to_bf16.h"

namespace fp4moe {
namespace {

const double kE2M1Mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};

double e2m1_exact(int code) { return (code & 8 ? -1 : 1) * kE2M1Mag[code & 7]; }

std::vector<bf16> to_bf16(const std::vector<float>& v) {  // values chosen exactly representable, or rounded
  std::vector<bf16> out;
  for (float f : v) out.push_back(bf16_from_bits(f32_to_bf16_bits(f)));
  return out;
}
float bf16_value(bf16 x) { return bf16_bits_to_f32(bf16_bits(x)); }
int code_at(const std::vector<uint8_t>& codes, int64_t i) { return (codes[i / 2] >> (4 * (i % 2))) & 0xF; }
void set_code(std::vector<uint8_t>& codes, int64_t i, int code) {
  codes[i / 2] = static_cast<uint8_t>((codes[i / 2] & (i % 2 ? 0x0F : 0xF0)) | (code << (4 * (i % 2))));
}

struct Quantized {
  std::vector<uint8_t> codes, scales;
  int64_t nonfinite = 0;
};
Quantized quantize(const std::vector<bf16>& x, int64_t M, int64_t K, const MxQuantConfig& cfg = {}) {
  Quantized q{std::vector<uint8_t>(M * K / 2, 0xA5), std::vector<uint8_t>(M * K / 32, 0xA5), 0};  // poisoned
  q.nonfinite = bf16_to_mxfp4_row_ref(x.data(), M, K, q.codes.data(), q.scales.data(), cfg);
  return q;
}

// Runs `f`, expects fp4moe::Error, and checks that its message contains every one of `parts`.
void expect_error_mentions(const std::function<void()>& f, std::initializer_list<const char*> parts) {
  EXPECT_THROW(f(), Error);
  try {
    f();
  } catch (const Error& e) {
    for (const char* p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

// ---- BF16 -> MXFP4 ------------------------------------------------------------------------------------------

TEST(Bf16ToMxfp4RowRef, HandComputedBlockInFloorMode) {
  // amax = 3 -> e = floor(log2 3) - 2 = -1 (scale byte 126); codes are E2M1(2 v) with ties to even.
  std::vector<float> v(32, 0.0f);
  const float in[] = {3.0f, 1.0f, -0.5f, 0.1f, 0.125f, 0.375f, 2.5f, -2.0f, -0.0f, -0.05f};
  // 2v:             6     2     -1     0.2   0.25(tie) 0.75(tie) 5(tie) -4   -0     -0.1
  const int expect[] = {7, 4, 0xA, 0, 0, 2, 6, 0xE, 8, 8};
  for (int i = 0; i < 10; ++i) v[i] = in[i];
  Quantized q = quantize(to_bf16(v), 1, 32);
  EXPECT_EQ(q.scales[0], 126);
  EXPECT_EQ(q.nonfinite, 0);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(code_at(q.codes, i), i < 10 ? expect[i] : 0) << "element " << i;
  // Packing: element 2i in the low nibble of byte i.
  EXPECT_EQ(q.codes[0], 0x47);
  EXPECT_EQ(q.codes[3], 0xE6);
  EXPECT_EQ(q.codes[4], 0x88);
}

TEST(Bf16ToMxfp4RowRef, FloorModeClipsCeilModeDoesNot) {
  std::vector<float> v(32, 0.0f);
  v[0] = 7.0f;   // floor: e = 0, 7 clips to 6 (code 7); ceil: e = 1, 3.5 -> 4 (code 6)
  v[1] = 3.5f;   // floor: 3.5 -> 4 (code 6);                  ceil: 1.75 -> 2 (code 4)
  v[2] = -1.0f;  // floor: code 0xA;                           ceil: -0.5 (code 9)
  MxQuantConfig floor_cfg, ceil_cfg;
  ceil_cfg.scale_mode = MxScaleMode::ceil;
  Quantized f = quantize(to_bf16(v), 1, 32, floor_cfg), c = quantize(to_bf16(v), 1, 32, ceil_cfg);
  EXPECT_EQ(f.scales[0], 127);
  EXPECT_EQ(c.scales[0], 128);
  EXPECT_EQ(code_at(f.codes, 0), 7);
  EXPECT_EQ(code_at(f.codes, 1), 6);
  EXPECT_EQ(code_at(f.codes, 2), 0xA);
  EXPECT_EQ(code_at(c.codes, 0), 6);
  EXPECT_EQ(code_at(c.codes, 1), 4);
  EXPECT_EQ(code_at(c.codes, 2), 9);
  // amax = 6 and amax = 0.75 (fraction exactly 1.5) fit without clipping in both modes.
  for (float amax : {6.0f, 0.75f}) {
    v.assign(32, 0.0f);
    v[5] = -amax;
    Quantized a = quantize(to_bf16(v), 1, 32, floor_cfg), b = quantize(to_bf16(v), 1, 32, ceil_cfg);
    EXPECT_EQ(a.scales[0], b.scales[0]) << amax;
    EXPECT_EQ(code_at(a.codes, 5), 15) << amax;
    EXPECT_EQ(code_at(b.codes, 5), 15) << amax;
  }
}

TEST(Bf16ToMxfp4RowRef, ScaleExponentFollowsTheModeRule) {
  // floor: amax * 2^-e in [4, 8); ceil: the smallest e with amax * 2^-e <= 6, i.e. in (3, 6].
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> mant(1.0, 2.0);
  std::uniform_int_distribution<int> expo(-120, 120);
  for (int t = 0; t < 2000; ++t) {
    std::vector<float> v(32, 0.0f);
    const float amax = bf16_value(to_bf16({static_cast<float>(std::ldexp(mant(rng), expo(rng)))})[0]);
    v[t % 32] = t % 2 ? amax : -amax;
    for (auto mode : {MxScaleMode::floor, MxScaleMode::ceil}) {
      MxQuantConfig cfg;
      cfg.scale_mode = mode;
      Quantized q = quantize(to_bf16(v), 1, 32, cfg);
      const double r = std::ldexp(static_cast<double>(amax), -(q.scales[0] - 127));
      if (mode == MxScaleMode::floor) {
        EXPECT_TRUE(r >= 4.0 && r < 8.0) << "amax " << amax << " byte " << int(q.scales[0]);
      } else {
        EXPECT_TRUE(r > 3.0 && r <= 6.0) << "amax " << amax << " byte " << int(q.scales[0]);
      }
    }
  }
}

TEST(Bf16ToMxfp4RowRef, AllZeroBlockHasScaleZeroCodesZeroAndDequantizesToZero) {
  std::vector<float> v(64, 0.0f);
  for (int i = 0; i < 32; i += 3) v[i] = -0.0f;  // -0 counts as zero: block amax = 0
  v[40] = 1.0f;                                   // the second block is not zero
  Quantized q = quantize(to_bf16(v), 1, 64);
  EXPECT_EQ(q.scales[0], 0);
  EXPECT_NE(q.scales[1], 0);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(code_at(q.codes, i), 0) << i;
  std::vector<bf16> y(64, bf16_from_bits(0xFFFF));
  mxfp4_to_bf16_ref(q.codes.data(), q.scales.data(), 1, 64, y.data());
  for (int i = 0; i < 32; ++i) EXPECT_EQ(bf16_bits(y[i]), 0x0000) << i;  // +0, not NaN
  EXPECT_EQ(bf16_value(y[40]), 1.0f);
}

TEST(Bf16ToMxfp4RowRef, NonFiniteBlockGetsNaNScaleOnlyForItselfAndIsCounted) {
  const int64_t M = 2, K = 96;
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.0f, 2.0f);
  std::vector<float> v(M * K);
  for (float& f : v) f = d(rng);
  v[0 * K + 40] = std::numeric_limits<float>::quiet_NaN();  // row 0, block 1
  v[1 * K + 5] = std::numeric_limits<float>::infinity();    // row 1, block 0
  v[1 * K + 95] = -std::numeric_limits<float>::infinity();  // row 1, block 2
  const std::vector<bf16> x = to_bf16(v);
  Quantized q = quantize(x, M, K);
  EXPECT_EQ(q.nonfinite, 3);
  const bool bad[6] = {false, true, false, true, false, true};
  for (int b = 0; b < 6; ++b) {
    if (bad[b]) {
      EXPECT_EQ(q.scales[b], kUE8M0NaN) << "block " << b;
      for (int i = 0; i < 32; ++i) EXPECT_EQ(code_at(q.codes, b * 32 + i), 0) << "block " << b;
    } else {
      // Same result as the block quantized on its own.
      std::vector<bf16> alone(x.begin() + b * 32, x.begin() + b * 32 + 32);
      Quantized a = quantize(alone, 1, 32);
      EXPECT_EQ(q.scales[b], a.scales[0]) << "block " << b;
      for (int i = 0; i < 32; ++i) EXPECT_EQ(code_at(q.codes, b * 32 + i), code_at(a.codes, i)) << "block " << b;
    }
  }
  std::vector<bf16> y(M * K);
  mxfp4_to_bf16_ref(q.codes.data(), q.scales.data(), M, K, y.data());
  for (int64_t i = 0; i < M * K; ++i) EXPECT_EQ(std::isnan(bf16_value(y[i])), bad[i / 32]) << i;
}

TEST(Bf16ToMxfp4RowRef, NegativeZeroAndNegativeValuesRoundingToZeroKeepTheSign) {
  std::vector<float> v(32, 0.0f);
  v[0] = 4.0f;     // e = 0
  v[1] = -0.0f;    // -> code 8
  v[2] = -0.25f;   // tie -> -0 (code 8)
  v[3] = -0.1f;    // -> code 8
  v[4] = 0.0f;     // -> code 0
  Quantized q = quantize(to_bf16(v), 1, 32);
  EXPECT_EQ(code_at(q.codes, 1), 8);
  EXPECT_EQ(code_at(q.codes, 2), 8);
  EXPECT_EQ(code_at(q.codes, 3), 8);
  EXPECT_EQ(code_at(q.codes, 4), 0);
  std::vector<bf16> y(32);
  mxfp4_to_bf16_ref(q.codes.data(), q.scales.data(), 1, 32, y.data());
  EXPECT_EQ(bf16_bits(y[1]), 0x8000);
  EXPECT_EQ(bf16_bits(y[4]), 0x0000);
  std::vector<uint8_t> fp8(32);
  std::vector<float> s(4);
  mxfp4_row_to_fp8_row_ref(q.codes.data(), q.scales.data(), 1, 32, fp8.data(), s.data());
  EXPECT_EQ(fp8[1], 0x80);
  EXPECT_EQ(fp8[4], 0x00);
}

TEST(Bf16ToMxfp4RowRef, RejectsBadShapesAndConfigsNamingThem) {
  std::vector<bf16> x(4 * 64);
  std::vector<uint8_t> codes(4 * 32), scales(8);
  auto run = [&](int64_t M, int64_t K, MxQuantConfig cfg) {
    return [&, M, K, cfg] { bf16_to_mxfp4_row_ref(x.data(), M, K, codes.data(), scales.data(), cfg); };
  };
  expect_error_mentions(run(2, 48, {}), {"bf16_to_mxfp4_row_ref", "K must be a positive multiple of 32", "[2, 48]"});
  expect_error_mentions(run(-1, 64, {}), {"M must be >= 0", "[-1, 64]"});
  expect_error_mentions(run(2, 0, {}), {"K must be a positive multiple of 32", "[2, 0]"});
  MxQuantConfig bad_mode;
  bad_mode.scale_mode = static_cast<MxScaleMode>(7);
  expect_error_mentions(run(2, 64, bad_mode), {"scale mode 7"});
  MxQuantConfig bad_offset;
  bad_offset.row_offset = -3;
  expect_error_mentions(run(2, 64, bad_offset), {"row_offset", "-3"});
  EXPECT_EQ(bf16_to_mxfp4_row_ref(nullptr, 0, 64, nullptr, nullptr, {}), 0);  // M = 0: nothing to do
  expect_error_mentions([&] { bf16_to_mxfp4_row_ref(nullptr, 1, 64, codes.data(), scales.data(), {}); },
                        {"x is null"});
}

// ---- stochastic rounding ------------------------------------------------------------------------------------

std::vector<bf16> random_bf16(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& f : v) f = d(rng);
  return to_bf16(v);
}

TEST(Bf16ToMxfp4RowRef, StochasticSameSeedSameOutputDifferentSeedDifferentOutput) {
  const int64_t M = 16, K = 256;
  const std::vector<bf16> x = random_bf16(M * K, 5);
  MxQuantConfig a, b, c;
  a.rounding = b.rounding = c.rounding = Rounding::stochastic;
  a.seed = b.seed = 1234;
  c.seed = 1235;
  Quantized qa = quantize(x, M, K, a), qb = quantize(x, M, K, b), qc = quantize(x, M, K, c);
  EXPECT_EQ(qa.codes, qb.codes);
  EXPECT_EQ(qa.scales, qc.scales);  // scales do not depend on the rounding
  int differ = 0;
  for (int64_t i = 0; i < M * K; ++i) differ += code_at(qa.codes, i) != code_at(qc.codes, i);
  EXPECT_GT(differ, M * K / 10);
  // RNE ignores the seed.
  MxQuantConfig r1, r2;
  r2.seed = 99;
  EXPECT_EQ(quantize(x, M, K, r1).codes, quantize(x, M, K, r2).codes);
}

TEST(Bf16ToMxfp4RowRef, StochasticPicksOneOfTheTwoNeighbours) {
  const int64_t M = 8, K = 128;
  const std::vector<bf16> x = random_bf16(M * K, 8);
  MxQuantConfig cfg;
  cfg.rounding = Rounding::stochastic;
  cfg.seed = 77;
  Quantized q = quantize(x, M, K, cfg);
  for (int64_t i = 0; i < M * K; ++i) {
    const double scaled = std::ldexp(static_cast<double>(bf16_value(x[i])), -(q.scales[i / 32] - 127));
    const double got = e2m1_exact(code_at(q.codes, i));
    double lo = 0, hi = 6;  // the neighbouring magnitudes of |scaled|
    for (double m : kE2M1Mag) {
      if (m <= std::fabs(scaled)) lo = m;
      if (m >= std::fabs(scaled) && m < hi) hi = m;
    }
    EXPECT_TRUE(std::fabs(got) == lo || std::fabs(got) == hi) << "element " << i << " scaled " << scaled;
    EXPECT_EQ(std::signbit(got), std::signbit(scaled)) << i;
  }
}

TEST(Bf16ToMxfp4RowRef, StochasticRoundingIsUnbiased) {
  // Every row: 6 (so that e = 0) and 31 values between E2M1 grid points; the mean over rows of the dequantized
  // value must approach the input (RNE would be off by up to half a step).
  const int64_t M = 20000, K = 32;
  const float vals[31] = {0.3f,  0.7f,   1.1f,  1.3f,  1.9f,  2.2f,  2.9f,  3.3f,  3.9f,  4.5f,  5.5f,
                          5.9f,  0.05f,  0.45f, 1.6f,  2.6f,  3.6f,  4.1f,  4.9f,  -0.3f, -0.7f, -1.1f,
                          -1.9f, -2.2f,  -2.9f, -3.3f, -4.5f, -5.5f, -0.1f, -1.4f, -3.7f};
  std::vector<float> v(M * K);
  for (int64_t m = 0; m < M; ++m) {
    v[m * K] = 6.0f;
    for (int j = 1; j < K; ++j) v[m * K + j] = vals[j - 1];
  }
  const std::vector<bf16> x = to_bf16(v);
  MxQuantConfig cfg;
  cfg.rounding = Rounding::stochastic;
  cfg.seed = 2024;
  Quantized q = quantize(x, M, K, cfg);
  std::vector<bf16> y(M * K);
  mxfp4_to_bf16_ref(q.codes.data(), q.scales.data(), M, K, y.data());
  for (int j = 1; j < K; ++j) {
    const double target = bf16_value(x[j]);
    double sum = 0;
    for (int64_t m = 0; m < M; ++m) sum += bf16_value(y[m * K + j]);
    const double mean = sum / M;
    // Bound: 6 standard deviations of the mean of a two-point variable with step <= 2.
    double lo = 0, hi = 6;
    for (double g : kE2M1Mag) {
      if (g <= std::fabs(target)) lo = g;
      if (g >= std::fabs(target) && g < hi) hi = g;
    }
    const double p = (std::fabs(target) - lo) / (hi - lo);
    const double sigma = (hi - lo) * std::sqrt(p * (1 - p) / M);
    EXPECT_NEAR(mean, target, 6 * sigma + 1e-12) << "column " << j;
  }
}

TEST(Bf16ToMxfp4RowRef, RowOffsetMakesRowRangesMatchTheFullTensor) {
  const int64_t M = 10, K = 96, r0 = 3;
  const std::vector<bf16> x = random_bf16(M * K, 21);
  MxQuantConfig cfg;
  cfg.rounding = Rounding::stochastic;
  cfg.seed = 5;
  Quantized full = quantize(x, M, K, cfg);
  std::vector<bf16> tail(x.begin() + r0 * K, x.end());
  MxQuantConfig tail_cfg = cfg;
  tail_cfg.row_offset = r0;
  Quantized t = quantize(tail, M - r0, K, tail_cfg);
  EXPECT_EQ(t.codes, std::vector<uint8_t>(full.codes.begin() + r0 * K / 2, full.codes.end()));
  EXPECT_EQ(t.scales, std::vector<uint8_t>(full.scales.begin() + r0 * K / 32, full.scales.end()));
  // Without the offset the tail draws other numbers.
  Quantized wrong = quantize(tail, M - r0, K, cfg);
  EXPECT_NE(wrong.codes, t.codes);
}

// ---- MXFP4 -> BF16 ------------------------------------------------------------------------------------------

TEST(Mxfp4ToBf16Ref, HandComputedBlock) {
  std::vector<uint8_t> codes(16, 0), scales = {130};  // 2^3
  const int in[] = {1, 7, 0xB, 8, 5};
  const float expect[] = {4.0f, 48.0f, -12.0f, -0.0f, 24.0f};
  for (int i = 0; i < 5; ++i) set_code(codes, i, in[i]);
  std::vector<bf16> y(32);
  mxfp4_to_bf16_ref(codes.data(), scales.data(), 1, 32, y.data());
  for (int i = 0; i < 5; ++i) EXPECT_EQ(bf16_value(y[i]), expect[i]) << i;
  EXPECT_EQ(bf16_bits(y[3]), 0x8000);
}

TEST(Mxfp4ToBf16Ref, EveryCodeAndScaleByteIsExactOrOverflowsOrIsNaN) {
  // One row per scale byte, 32 elements: the 16 codes twice.
  const int64_t M = 256, K = 32;
  std::vector<uint8_t> codes(M * K / 2), scales(M);
  for (int64_t m = 0; m < M; ++m) {
    scales[m] = static_cast<uint8_t>(m);
    for (int i = 0; i < K; ++i) set_code(codes, m * K + i, i % 16);
  }
  std::vector<bf16> y(M * K);
  mxfp4_to_bf16_ref(codes.data(), scales.data(), M, K, y.data());
  const double bf16_max = std::ldexp(255.0 / 128.0, 127);
  for (int64_t m = 0; m < M; ++m) {
    for (int i = 0; i < 16; ++i) {
      const uint16_t bits = bf16_bits(y[m * K + i]);
      if (m == 255) {
        EXPECT_EQ(bits, 0x7FC0) << "code " << i;
        continue;
      }
      const double exact = e2m1_exact(i) * std::ldexp(1.0, static_cast<int>(m) - 127);
      const double got = bf16_bits_to_f32(bits);
      if (std::fabs(exact) > bf16_max) {
        EXPECT_TRUE(std::isinf(got) && std::signbit(got) == std::signbit(exact)) << "scale " << m << " code " << i;
        EXPECT_GT(m, 252);
      } else {
        EXPECT_EQ(got, exact) << "scale " << m << " code " << i;
        EXPECT_EQ(std::signbit(got), (i & 8) != 0) << "scale " << m << " code " << i;
      }
    }
  }
}

TEST(Mxfp4ToBf16Ref, RejectsBadShapesNamingThem) {
  std::vector<uint8_t> codes(64), scales(4);
  std::vector<bf16> y(128);
  expect_error_mentions([&] { mxfp4_to_bf16_ref(codes.data(), scales.data(), 2, 40, y.data()); },
                        {"mxfp4_to_bf16_ref", "K must be a positive multiple of 32", "[2, 40]"});
  expect_error_mentions([&] { mxfp4_to_bf16_ref(codes.data(), scales.data(), -2, 64, y.data()); },
                        {"M must be >= 0", "[-2, 64]"});
}

// ---- direct MXFP4 -> FP8 row --------------------------------------------------------------------------------

TEST(Mxfp4RowToFp8RowRef, HandComputedGroup) {
  // Scales 2^0, 2^-2, 2^3, NaN: E = 3, S = 2^-3.
  std::vector<uint8_t> codes(64, 0), scales = {127, 125, 130, 0xFF};
  set_code(codes, 0, 2);        // 1.0 * 2^0 / 2^-3 = 8 -> E4M3 0x50
  set_code(codes, 1, 7);        // 6 * 8 = 48 = 1.5 * 2^5 -> 0x64
  set_code(codes, 32, 1);       // 0.5 * 2^-2 / 2^-3 = 1 -> 0x38
  set_code(codes, 64, 7);       // 6 * 2^3 / 2^-3 = 384 = 1.5 * 2^8 -> 0x7C
  set_code(codes, 65, 0xF);     // -384 -> 0xFC
  set_code(codes, 96, 7);       // NaN block -> 0x7F whatever the code
  std::vector<uint8_t> out(128, 0xA5);
  std::vector<float> s(4, -1.0f);
  mxfp4_row_to_fp8_row_ref(codes.data(), scales.data(), 1, 128, out.data(), s.data());
  EXPECT_EQ(s[0], 0.125f);
  EXPECT_EQ(s[1], 1.0f);  // padding rows of the scale layout (ld = 4)
  EXPECT_EQ(s[3], 1.0f);
  EXPECT_EQ(out[0], 0x50);
  EXPECT_EQ(out[1], 0x64);
  EXPECT_EQ(out[2], 0x00);
  EXPECT_EQ(out[32], 0x38);
  EXPECT_EQ(out[64], 0x7C);
  EXPECT_EQ(out[65], 0xFC);
  for (int i = 96; i < 128; ++i) EXPECT_EQ(out[i], 0x7F) << i;
}

// E4M3 code nearest to q (|q| <= 448), ties to the even code, by brute force over the 127 magnitudes.
uint8_t e4m3_nearest_even(double q) {
  int best = 0;
  double best_d = std::numeric_limits<double>::infinity();
  for (int c = 0; c < 0x7F; ++c) {
    const int e = c >> 3, f = c & 7;
    const double mag = e == 0 ? f * std::ldexp(1.0, -9) : (8 + f) * std::ldexp(1.0, e - 10);
    const double d = std::fabs(mag - std::fabs(q));
    if (d < best_d || (d == best_d && c % 2 == 0)) best = c, best_d = d;
  }
  return static_cast<uint8_t>(best | (std::signbit(q) ? 0x80 : 0));
}
double e4m3_exact(uint8_t c) { return e4m3_to_f32(c); }

struct DirectStats {
  int64_t exact_checked = 0, rounded = 0, nan_codes = 0;
};

// Checks mxfp4_row_to_fp8_row_ref on [M, K] against the rule computed in double: S = 2^max(E - 6, -126)
// (1 without finite blocks), code = RNE_E4M3(exact / S); exact while the spread E - e_i <= 14.
DirectStats check_direct_against_exact(const std::vector<uint8_t>& codes, const std::vector<uint8_t>& scales,
                                       int64_t M, int64_t K) {
  std::vector<uint8_t> out(M * K, 0xA5);
  std::vector<float> out_scales(fp8_row_scale_count(M, K), -7.0f);
  mxfp4_row_to_fp8_row_ref(codes.data(), scales.data(), M, K, out.data(), out_scales.data());
  DirectStats st;
  const int64_t groups = ceil_div(K, 128), ld = fp8_row_scale_ld(M);
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t r = M; r < ld; ++r) EXPECT_EQ(out_scales[g * ld + r], 1.0f) << "padding row " << r;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t k0 = g * 128, k1 = std::min<int64_t>(K, k0 + 128);
      int E = std::numeric_limits<int>::min();
      for (int64_t k = k0; k < k1; k += 32)
        if (scales[m * K / 32 + k / 32] != 0xFF) E = std::max(E, scales[m * K / 32 + k / 32] - 127);
      const double S = E == std::numeric_limits<int>::min() ? 1.0 : std::ldexp(1.0, std::max(E - 6, -126));
      EXPECT_EQ(out_scales[g * ld + m], S) << "row " << m << " group " << g;
      for (int64_t k = k0; k < k1; ++k) {
        const uint8_t sb = scales[m * K / 32 + k / 32];
        const uint8_t got = out[m * K + k];
        if (sb == 0xFF) {
          EXPECT_EQ(got, 0x7F) << "row " << m << " k " << k;
          ++st.nan_codes;
          continue;
        }
        const int code = code_at(codes, m * K + k);
        const double exact = e2m1_exact(code) * std::ldexp(1.0, sb - 127);
        const double q = exact / S;
        EXPECT_EQ(got, e4m3_nearest_even(q)) << "row " << m << " k " << k << " code " << code << " scale " << int(sb)
                                             << " E " << E;
        if (E - (sb - 127) <= 14) {
          EXPECT_EQ(e4m3_exact(got) * S, exact) << "row " << m << " k " << k << " code " << code;
          EXPECT_EQ(std::signbit(e4m3_exact(got)), (code & 8) != 0);
          ++st.exact_checked;
        } else if (e4m3_exact(got) * S != exact) {
          ++st.rounded;
        }
      }
    }
  }
  return st;
}

// Rows built so that every code meets every exponent spread 0..spread_max below the group maximum E, for
// several E (including the ends of the UE8M0 range), with NaN and zero blocks mixed in.
void build_spread_rows(int64_t K, int spread_max, std::vector<uint8_t>& codes, std::vector<uint8_t>& scales,
                       int64_t& M) {
  const int kMaxBytes[] = {254, 200, 140, 127, 60, 20, 14, 6, 1, 0};
  const int64_t blocks = K / 32;
  M = 0;
  codes.clear();
  scales.clear();
  for (int emax : kMaxBytes) {
    for (int spread = 0; spread <= spread_max; ++spread) {
      if (emax - spread < 0) break;
      std::vector<uint8_t> rc(K / 2), rs(blocks);
      for (int64_t b = 0; b < blocks; ++b) {
        // In each group: block 0 holds the maximum, the others sit `spread` below it, except one NaN block per
        // odd row (the group's third) and a zero block (scale byte 0, codes 0) every fifth row.
        const int64_t in_group = b % 4;
        rs[b] = static_cast<uint8_t>(in_group == 0 ? emax : emax - spread);
        if (in_group == 2 && M % 2 == 1) rs[b] = 0xFF;
        const bool zero_block = in_group == 1 && M % 5 == 4;
        if (zero_block) rs[b] = 0;
        for (int i = 0; i < 32; ++i) {
          const int64_t k = b * 32 + i;
          const int code = zero_block ? 0 : static_cast<int>((i + b + spread) % 16);
          rc[k / 2] = static_cast<uint8_t>(rc[k / 2] | (code << (4 * (k % 2))));
        }
      }
      codes.insert(codes.end(), rc.begin(), rc.end());
      scales.insert(scales.end(), rs.begin(), rs.end());
      ++M;
    }
  }
}

TEST(Mxfp4RowToFp8RowRef, EqualsTheExactMxfp4ValueUpToSpread14AndRoundsToNearestEvenBeyond) {
  for (int64_t K : {128, 96, 576}) {  // a full group; a short last group; 4.5 groups
    std::vector<uint8_t> codes, scales;
    int64_t M = 0;
    build_spread_rows(K, 40, codes, scales, M);
    const DirectStats st = check_direct_against_exact(codes, scales, M, K);
    EXPECT_GT(st.exact_checked, 0) << "K=" << K;
    EXPECT_GT(st.rounded, 0) << "K=" << K;  // spreads beyond 14 do lose bits
    EXPECT_GT(st.nan_codes, 0) << "K=" << K;
  }
}

TEST(Mxfp4RowToFp8RowRef, EveryCodeAtEverySpreadOfOneGroup) {
  // Exhaustive over codes x spreads in a lone second block: the first block fixes E.
  for (int emax : {254, 127, 10, 0}) {
    for (int spread = 0; spread <= emax && spread <= 60; ++spread) {
      std::vector<uint8_t> codes(64, 0), scales = {static_cast<uint8_t>(emax), static_cast<uint8_t>(emax - spread),
                                                   0xFF, 0};
      for (int i = 0; i < 32; ++i) set_code(codes, 32 + i, i % 16);
      check_direct_against_exact(codes, scales, 1, 128);
    }
  }
}

TEST(Mxfp4RowToFp8RowRef, GroupOfNaNBlocksOnlyGetsScaleOne) {
  std::vector<uint8_t> codes(48, 0x77), scales = {0xFF, 0xFF, 0xFF};
  std::vector<uint8_t> out(96);
  std::vector<float> s(4);
  mxfp4_row_to_fp8_row_ref(codes.data(), scales.data(), 1, 96, out.data(), s.data());
  EXPECT_EQ(s[0], 1.0f);
  for (uint8_t c : out) EXPECT_EQ(c, 0x7F);
}

TEST(Mxfp4RowToFp8RowRef, RandomTensorsMatchTheRule) {
  std::mt19937 rng(99);
  for (int64_t K : {32, 96, 576, 2048}) {
    const int64_t M = 7;
    std::vector<uint8_t> codes(M * K / 2), scales(M * K / 32);
    for (auto& c : codes) c = static_cast<uint8_t>(rng());
    for (auto& s : scales) {
      const uint32_t r = rng() % 100;
      s = static_cast<uint8_t>(r < 3 ? 0xFF : r < 5 ? 0 : 110 + rng() % 30);
    }
    check_direct_against_exact(codes, scales, M, K);
  }
}

TEST(Mxfp4RowToFp8RowRef, RejectsBadShapesNamingThem) {
  std::vector<uint8_t> codes(64), scales(4), out(128);
  std::vector<float> s(8);
  expect_error_mentions(
      [&] { mxfp4_row_to_fp8_row_ref(codes.data(), scales.data(), 1, 100, out.data(), s.data()); },
      {"mxfp4_row_to_fp8_row_ref", "K must be a positive multiple of 32", "[1, 100]"});
  expect_error_mentions([&] { mxfp4_row_to_fp8_row_ref(codes.data(), scales.data(), -5, 32, out.data(), s.data()); },
                        {"M must be >= 0", "[-5, 32]"});
  mxfp4_row_to_fp8_row_ref(nullptr, nullptr, 0, 32, nullptr, nullptr);  // M = 0: nothing to do
}

}  // namespace
}  // namespace fp4moe
