// Exhaustive checks of the number formats (kernels/formats/formats.h) against brute-force definitions:
// every E2M1 code, every E4M3 and UE8M0 byte, every RNE tie, saturation, -0 and NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/formats/formats.h"

namespace fp4moe {
namespace {

const double kE2M1Mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};

// Brute force: nearest representable magnitude among `mags` (ascending), ties to the even index, saturating.
int nearest_even(const std::vector<double>& mags, double a) {
  if (a >= mags.back()) return static_cast<int>(mags.size()) - 1;
  int best = 0;
  for (int i = 1; i < static_cast<int>(mags.size()); ++i) {
    double d = std::fabs(mags[i] - a), db = std::fabs(mags[best] - a);
    if (d < db || (d == db && (i % 2 == 0))) best = i;
  }
  return best;
}

std::vector<double> e4m3_magnitudes() {  // codes 0x00..0x7E in order
  std::vector<double> m;
  for (int c = 0; c < 0x7F; ++c) {
    int e = c >> 3, f = c & 7;
    m.push_back(e == 0 ? f * std::ldexp(1.0, -9) : (8 + f) * std::ldexp(1.0, e - 10));
  }
  return m;
}

TEST(E2M1, DecodesAllSixteenCodes) {
  for (int c = 0; c < 16; ++c) {
    double expect = (c & 8 ? -1 : 1) * kE2M1Mag[c & 7];
    EXPECT_EQ(e2m1_to_f32(static_cast<uint8_t>(c)), static_cast<float>(expect)) << "code " << c;
  }
  EXPECT_TRUE(std::signbit(e2m1_to_f32(8)));  // -0
}

TEST(E2M1, EveryCodeRoundTrips) {
  for (int c = 0; c < 16; ++c) EXPECT_EQ(f32_to_e2m1_rne(e2m1_to_f32(static_cast<uint8_t>(c))), c) << c;
}

TEST(E2M1, TiesRoundToEven) {
  struct Case { float v; int code; };
  const Case cases[] = {{0.25f, 0}, {0.75f, 2}, {1.25f, 2}, {1.75f, 4}, {2.5f, 4}, {3.5f, 6}, {5.0f, 6},
                        {0.25000006f, 1}, {0.24999999f, 0}, {5.0000005f, 7}, {4.9999995f, 6},
                        {-0.25f, 8}, {-5.0f, 14}, {6.0f, 7}, {7.9f, 7}, {1e30f, 7}, {-1e30f, 15}};
  for (const auto& c : cases) EXPECT_EQ(f32_to_e2m1_rne(c.v), c.code) << "v=" << c.v;
}

TEST(E2M1, SignOfZeroIsKept) {
  EXPECT_EQ(f32_to_e2m1_rne(-0.0f), 8);
  EXPECT_EQ(f32_to_e2m1_rne(-0.1f), 8);
  EXPECT_EQ(f32_to_e2m1_rne(0.0f), 0);
}

TEST(E2M1, MatchesBruteForceOnDenseGrid) {
  std::vector<double> mags(kE2M1Mag, kE2M1Mag + 8);
  for (int i = 0; i <= 8 * 4096; ++i) {
    float v = static_cast<float>(i) / 4096.0f;  // 0 .. 8, includes every tie exactly
    int expect = nearest_even(mags, v);
    ASSERT_EQ(f32_to_e2m1_rne(v), expect) << "v=" << v;
    ASSERT_EQ(f32_to_e2m1_rne(-v), expect | 8) << "v=" << -v;
  }
}

TEST(E2M1, StochasticRoundingPicksNeighboursWithExactProbability) {
  // v = 1.25 lies a half of the way from 1 to 1.5: up iff u < 0.5.
  EXPECT_EQ(f32_to_e2m1_stochastic(1.25f, 0.49999994f), 3);
  EXPECT_EQ(f32_to_e2m1_stochastic(1.25f, 0.5f), 2);
  // Representable values never move; saturation at 6; the sign is kept.
  for (int c = 0; c < 16; ++c)
    for (float u : {0.0f, 0.5f, 0.99999994f})
      EXPECT_EQ(f32_to_e2m1_stochastic(e2m1_to_f32(static_cast<uint8_t>(c)), u), c);
  EXPECT_EQ(f32_to_e2m1_stochastic(7.5f, 0.0f), 7);
  EXPECT_EQ(f32_to_e2m1_stochastic(-2.5f, 0.3f), 8 | 5);  // 2.5 between 2 and 3: p_up = 0.5
  EXPECT_EQ(f32_to_e2m1_stochastic(-2.5f, 0.7f), 8 | 4);
}

TEST(E2M1, StochasticRoundingIsUnbiased) {
  // Mean of the rounded values over many counters approaches the input.
  for (float v : {0.1f, 0.3f, 1.1f, 2.2f, 3.3f, 5.9f}) {
    double sum = 0;
    const int n = 200000;
    for (int i = 0; i < n; ++i) sum += e2m1_to_f32(f32_to_e2m1_stochastic(v, uniform_from_counter(7, i)));
    EXPECT_NEAR(sum / n, v, 0.01) << "v=" << v;
  }
}

TEST(Counter, UniformIsInRangeAndDependsOnSeedAndIndex) {
  EXPECT_EQ(uniform_from_counter(1, 2), uniform_from_counter(1, 2));
  EXPECT_NE(uniform_from_counter(1, 2), uniform_from_counter(2, 2));
  EXPECT_NE(uniform_from_counter(1, 2), uniform_from_counter(1, 3));
  for (uint64_t i = 0; i < 10000; ++i) {
    float u = uniform_from_counter(42, i);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
  }
}

TEST(UE8M0, AllBytesDecodeToExactPowersOfTwoAndOnlyFFIsNaN) {
  for (int b = 0; b < 256; ++b) {
    float f = ue8m0_to_f32(static_cast<uint8_t>(b));
    if (b == 0xFF) {
      EXPECT_TRUE(std::isnan(f));
      continue;
    }
    EXPECT_FALSE(std::isnan(f)) << b;
    EXPECT_EQ(static_cast<double>(f), std::ldexp(1.0, b - 127)) << "byte " << b;
  }
  EXPECT_GT(ue8m0_to_f32(0), 0.0f);  // 2^-127 is a subnormal, exact
}

TEST(E4M3, AllBytesDecode) {
  auto mags = e4m3_magnitudes();
  for (int c = 0; c < 256; ++c) {
    float f = e4m3_to_f32(static_cast<uint8_t>(c));
    if ((c & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(f)) << c;
      continue;
    }
    double expect = (c & 0x80 ? -1 : 1) * mags[c & 0x7F];
    EXPECT_EQ(static_cast<double>(f), expect) << "code " << c;
  }
  EXPECT_EQ(e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
}

TEST(E4M3, EveryFiniteCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    EXPECT_EQ(f32_to_e4m3_satfinite(e4m3_to_f32(static_cast<uint8_t>(c))), c) << c;
  }
}

TEST(E4M3, EveryTieRoundsToEvenAndNeighboursRoundToNearest) {
  auto mags = e4m3_magnitudes();
  for (size_t i = 0; i + 1 < mags.size(); ++i) {
    float lo = static_cast<float>(mags[i]), hi = static_cast<float>(mags[i + 1]);
    float mid = static_cast<float>((mags[i] + mags[i + 1]) / 2);  // exact in fp32
    int even = (i % 2 == 0) ? static_cast<int>(i) : static_cast<int>(i + 1);
    EXPECT_EQ(f32_to_e4m3_satfinite(mid), even) << "tie between " << lo << " and " << hi;
    EXPECT_EQ(f32_to_e4m3_satfinite(std::nextafter(mid, 0.0f)), static_cast<int>(i)) << mid;
    EXPECT_EQ(f32_to_e4m3_satfinite(std::nextafter(mid, 1e9f)), static_cast<int>(i + 1)) << mid;
    EXPECT_EQ(f32_to_e4m3_satfinite(-mid), 0x80 | even);
  }
}

TEST(E4M3, SaturatesAndHandlesSpecials) {
  EXPECT_EQ(f32_to_e4m3_satfinite(448.0f), 0x7E);
  EXPECT_EQ(f32_to_e4m3_satfinite(464.0f), 0x7E);  // would round to 480 without saturation
  EXPECT_EQ(f32_to_e4m3_satfinite(1e6f), 0x7E);
  EXPECT_EQ(f32_to_e4m3_satfinite(-1e6f), 0xFE);
  EXPECT_EQ(f32_to_e4m3_satfinite(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(f32_to_e4m3_satfinite(-std::numeric_limits<float>::infinity()), 0xFE);
  EXPECT_EQ(f32_to_e4m3_satfinite(std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(f32_to_e4m3_satfinite(-std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(f32_to_e4m3_satfinite(-0.0f), 0x80);
  EXPECT_EQ(f32_to_e4m3_satfinite(std::ldexp(1.0f, -11)), 0x00);  // a quarter of the smallest subnormal
  EXPECT_EQ(f32_to_e4m3_satfinite(std::ldexp(1.0f, -10)), 0x00);  // half: tie to even (0)
  EXPECT_EQ(f32_to_e4m3_satfinite(std::ldexp(1.5f, -10)), 0x01);
  EXPECT_EQ(f32_to_e4m3_satfinite(1e-40f), 0x00);                  // fp32 subnormal input
}

TEST(E4M3, MatchesBruteForceOnRandomFloats) {
  auto mags = e4m3_magnitudes();
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> expo(-14.0f, 10.0f);
  for (int i = 0; i < 200000; ++i) {
    float v = std::exp2(expo(rng));
    int expect = nearest_even(mags, v);
    ASSERT_EQ(f32_to_e4m3_satfinite(v), expect) << "v=" << v;
  }
}

TEST(BF16, RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16_bits(1.0f), 0x3F80);
  EXPECT_EQ(f32_to_bf16_bits(f32_from_bits(0x3F808000u)), 0x3F80);  // tie, even stays
  EXPECT_EQ(f32_to_bf16_bits(f32_from_bits(0x3F818000u)), 0x3F82);  // tie, odd goes up
  EXPECT_EQ(f32_to_bf16_bits(f32_from_bits(0x3F808001u)), 0x3F81);
  EXPECT_TRUE(std::isnan(bf16_bits_to_f32(f32_to_bf16_bits(std::numeric_limits<float>::quiet_NaN()))));
  for (uint32_t b = 0; b < 0x10000; ++b) {  // every BF16 value round-trips
    float f = bf16_bits_to_f32(static_cast<uint16_t>(b));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_bf16_bits(f), b);
  }
}

TEST(MxScale, FloorModeIsOcp) {
  EXPECT_EQ(mx_scale_exponent(6.0f, MxScaleMode::floor), 0);   // floor(log2 6) - 2 = 0
  EXPECT_EQ(mx_scale_exponent(7.9f, MxScaleMode::floor), 0);   // 7.9 clips to 6 after scaling
  EXPECT_EQ(mx_scale_exponent(8.0f, MxScaleMode::floor), 1);
  EXPECT_EQ(mx_scale_exponent(1.0f, MxScaleMode::floor), -2);
  EXPECT_EQ(mx_scale_exponent(1e-40f, MxScaleMode::floor), -127);  // clamped
  EXPECT_EQ(mx_scale_exponent(3e38f, MxScaleMode::floor), 125);
}

TEST(MxScale, CeilModeIsTheSmallestExponentThatDoesNotClip) {
  std::mt19937 rng(99);
  std::uniform_real_distribution<float> expo(-100.0f, 100.0f);
  for (int i = 0; i < 100000; ++i) {
    float amax = std::exp2(expo(rng));
    int e = mx_scale_exponent(amax, MxScaleMode::ceil);
    ASSERT_LE(static_cast<double>(amax) * std::ldexp(1.0, -e), 6.0) << amax;
    ASSERT_GT(static_cast<double>(amax) * std::ldexp(1.0, -(e - 1)), 6.0) << amax;
  }
  EXPECT_EQ(mx_scale_exponent(6.0f, MxScaleMode::ceil), 0);
  EXPECT_EQ(mx_scale_exponent(6.0000005f, MxScaleMode::ceil), 1);
  EXPECT_EQ(mx_scale_exponent(12.0f, MxScaleMode::ceil), 1);
}

TEST(Fp8Scale, Pow2ExponentIsTheSmallestThatFits) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> expo(-100.0f, 100.0f);
  for (int i = 0; i < 100000; ++i) {
    float amax = std::exp2(expo(rng));
    int p = fp8_pow2_scale_exponent(amax);
    ASSERT_LE(static_cast<double>(amax), 448.0 * std::ldexp(1.0, p)) << amax;
    ASSERT_GT(static_cast<double>(amax), 448.0 * std::ldexp(1.0, p - 1)) << amax;
  }
  EXPECT_EQ(fp8_pow2_scale_exponent(448.0f), 0);
  EXPECT_EQ(fp8_pow2_scale_exponent(448.00003f), 1);
  EXPECT_EQ(fp8_pow2_scale_exponent(1e-42f), -126);  // clamped so that 1/s stays a normal float
}

TEST(Direct, ShiftedE2M1ToE4M3IsExactWithinFourteenBinadesAndRneBeyond) {
  for (int code = 0; code < 16; ++code) {
    double v = e2m1_to_f32(static_cast<uint8_t>(code));
    for (int shift = 6; shift >= -40; --shift) {
      uint8_t out = e2m1_to_e4m3_shifted(static_cast<uint8_t>(code), shift);
      double exact = std::ldexp(v, shift);
      // The rule: E4M3 RNE of the exact value (no saturation possible, |exact| <= 384).
      ASSERT_EQ(out, f32_to_e4m3_satfinite(static_cast<float>(exact))) << "code " << code << " shift " << shift;
      if (shift >= -8) {
        ASSERT_EQ(static_cast<double>(e4m3_to_f32(out)), exact) << code << " " << shift;
      }
    }
  }
  EXPECT_EQ(e2m1_to_e4m3_shifted(7, 6), 0x7C);   // 6 * 64 = 384
  EXPECT_EQ(e2m1_to_e4m3_shifted(8, 0), 0x80);   // -0 keeps its sign
}

TEST(Direct, GroupScaleExponent) {
  EXPECT_EQ(direct_group_scale_exponent(0), -6);
  EXPECT_EQ(direct_group_scale_exponent(-127), -126);
  EXPECT_EQ(direct_group_scale_exponent(127), 121);
}

TEST(Helpers, RneShiftRight) {
  EXPECT_EQ(rne_shift_right(5, 1), 2u);  // 2.5 -> 2
  EXPECT_EQ(rne_shift_right(7, 1), 4u);  // 3.5 -> 4
  EXPECT_EQ(rne_shift_right(3, 2), 1u);  // 0.75 -> 1
  EXPECT_EQ(rne_shift_right(2, 2), 0u);  // 0.5 -> 0
  EXPECT_EQ(rne_shift_right(0xFFFFFFFFu, 40), 0u);
  EXPECT_EQ(exp2_exact(-149), std::ldexp(1.0f, -149));
  EXPECT_EQ(floor_log2(1e-45f), -149);
  EXPECT_EQ(floor_log2(3.0f), 1);
}

}  // namespace
}  // namespace fp4moe
