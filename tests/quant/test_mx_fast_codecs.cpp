// The stochastic E2M1 encoder of mx_fast_codecs.h (bf16_to_mxfp4_row's stochastic rounding) against the rule of
// formats.h it reformulates, and the counter-based draws of mx_random.h: every E2M1
// boundary and its FP32 neighbours, subnormals, random FP32 values, and for stochastic rounding the draws on both
// sides of each decision.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/formats/formats.h"
#include "kernels/quant/mx_fast_codecs.h"
#include "kernels/quant/mx_random.h"

namespace fp4moe {
namespace {

// Magnitudes a >= 0 that the encoder meets in a finite block (a < 8), the hard ones first: every E2M1 value and
// midpoint with 40 FP32 neighbours on each side, subnormals, then random bit patterns below 8.
std::vector<float> test_magnitudes() {
  std::vector<float> a;
  const float marks[] = {0.0f, 0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f, 2.0f, 2.5f,
                         3.0f, 3.5f,  4.0f, 5.0f,  6.0f, 7.0f,  7.99f, 1e-30f, 1e-40f};
  for (float m : marks) {
    float lo = m, hi = m;
    a.push_back(m);
    for (int i = 0; i < 40; ++i) {
      lo = std::nextafter(lo, 0.0f);
      hi = std::nextafter(hi, 8.0f);
      a.push_back(lo);
      a.push_back(hi);
    }
  }
  for (uint32_t u = 1; u < 4096; ++u) a.push_back(f32_from_bits(u * 977u));  // subnormals
  std::mt19937 rng(7);
  while (a.size() < 2000000) {
    const float f = f32_from_bits(rng() & 0x7FFFFFFFu);
    if (f < 8.0f) a.push_back(f);
  }
  return a;
}

TEST(MxFastCodecs, StochasticF32MatchesFormatsOnEveryDecision) {
  std::mt19937 rng(11);
  int64_t checked = 0, mismatches = 0;
  for (float a : test_magnitudes()) {
    // The draw where the decision flips: s < p * 2^8 rounds up (p the exact fraction of the step).
    const double grid[] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    int lo = 0;
    while (lo < 7 && grid[lo + 1] <= a) ++lo;
    const double p = lo == 7 ? 0 : (a - grid[lo]) / (grid[lo + 1] - grid[lo]);
    const int64_t flip = static_cast<int64_t>(std::ceil(p * 256.0));
    std::vector<int64_t> draws = {0, 1, 254, 255, static_cast<int64_t>(rng() & 0xFF)};
    for (int64_t d = -2; d <= 2; ++d) draws.push_back(flip + d);
    for (int64_t s : draws) {
      if (s < 0 || s > 255) continue;
      const uint32_t want = f32_to_e2m1_stochastic(a, static_cast<float>(s) * (1.0f / 256.0f));
      const uint32_t got = detail::e2m1_magnitude_sr_f32(a, static_cast<uint32_t>(s));
      ++checked;
      if (got != want && ++mismatches < 10) ADD_FAILURE() << "a = " << a << " s = " << s << " got " << got;
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << checked;
  // Saturation: 6 and beyond give 7 whatever the draw.
  for (float a : {6.0f, 6.5f, 7.99f})
    for (uint32_t s : {0u, 255u}) EXPECT_EQ(detail::e2m1_magnitude_sr_f32(a, s), 7u) << a;
}

// BF16 round to nearest even of x >= 0 given in double (exact for every product below), subnormals included.
uint32_t bf16_bits_of_double(double x) {
  if (x < 0x1p-126) return static_cast<uint32_t>(std::nearbyint(x * 0x1p133));  // grid 2^-133; 128 = 2^-126
  return f32_to_bf16_bits(static_cast<float>(x));  // x has at most 8 significant bits here: exact in FP32
}

// The BF16x2 scaling of stochastic rounding (mx_quant_device.cuh encode_chunk_stochastic_bf16x2): for every block
// exponent it takes (e >= -111) and every BF16 magnitude m with m 2^-e < 8 (a finite block's), the fixed point of
// min(bf16(m 2^(16 - e)), 6 2^16) (e2m1_sr_fixed_x65536) equals that of min(fl32(m 2^-e), 6) (e2m1_sr_fixed),
// products that are FP32 or BF16 subnormals or vanish included; and so the code, on every draw.
TEST(MxFastCodecs, StochasticBf16x2ScalingMatchesFp32ScalingAtEveryExponent) {
  int64_t checked = 0, mismatches = 0;
  for (int e = -111; e <= 126; ++e) {
    for (uint32_t m = 0; m < 0x7F80u; ++m) {
      const float v = bf16_bits_to_f32(static_cast<uint16_t>(m));
      const double p = static_cast<double>(v) * std::ldexp(1.0, -e);  // exact
      if (p >= 8.0) break;
      const float a32 = std::fmin(v * exp2_exact(-e), 6.0f);  // the FP32 product, as encode_chunk_stochastic
      const uint32_t b = std::min(bf16_bits_of_double(std::ldexp(p, 16)), 0x48C0u);  // BF16 product, min 6 2^16
      const float a16 = bf16_bits_to_f32(static_cast<uint16_t>(b));
      const uint32_t want = detail::e2m1_sr_fixed(a32), got = detail::e2m1_sr_fixed_x65536(a16);
      ++checked;
      if (got != want && ++mismatches < 10)
        ADD_FAILURE() << "e = " << e << " m = 0x" << std::hex << m << " got 0x" << got << " want 0x" << want;
      for (uint32_t s : {0u, 1u, 128u, 255u})
        if (detail::e2m1_sr_step(got, detail::e2m1_sr_offset(s)) != detail::e2m1_magnitude_sr_f32(a32, s) &&
            ++mismatches < 10)
          ADD_FAILURE() << "e = " << e << " m = 0x" << std::hex << m << " s = " << s;
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << checked;
  EXPECT_GT(checked, 1000000);
}

// 8-bit draws (mx_random.h): over the 256 draws, a BF16 magnitude a in [0.25, 8) (every value the quantizers round
// there is one, scaled exactly) rounds up exactly 256 p times, p its fraction of the step: no bias; below 0.25 the
// count is ceil(256 p), a bias under 1/256 of the step. The integer encoder agrees with formats.h on every draw.
TEST(MxFastCodecs, StochasticRoundingOnEightBitDrawsIsUnbiasedForBf16AboveAQuarter) {
  const double grid[] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  int64_t exact = 0, biased = 0;
  for (uint32_t bits = 0; bits < 0x4100u; ++bits) {  // every BF16 from +0 to 8
    const float a = bf16_bits_to_f32(static_cast<uint16_t>(bits));
    if (!(a < 6.0f)) continue;
    int lo = 0;
    while (grid[lo + 1] <= a) ++lo;
    const double p = (a - grid[lo]) / (grid[lo + 1] - grid[lo]);
    int ups = 0;
    for (uint32_t s = 0; s < 256; ++s) {
      const uint32_t want = f32_to_e2m1_stochastic(a, static_cast<float>(s) * (1.0f / 256.0f));
      ASSERT_EQ(detail::e2m1_magnitude_sr_f32(a, s), want) << "a = " << a << " s = " << s;
      ASSERT_TRUE(want == static_cast<uint32_t>(lo) || want == static_cast<uint32_t>(lo) + 1) << a;
      ups += want != static_cast<uint32_t>(lo);
    }
    if (a >= 0.25f) {
      EXPECT_EQ(ups, 256.0 * p) << "a = " << a;
      ++exact;
    } else {
      EXPECT_EQ(ups, std::ceil(256.0 * p)) << "a = " << a;
      EXPECT_GT(256.0 * p, ups - 1.0) << "a = " << a;  // up by less than 1/256 too often
      biased += ups != 256.0 * p;
    }
  }
  EXPECT_EQ(exact, 4 * 128 + 64);  // the BF16 in [0.25, 6): four binades of 128 and half of [4, 8)
  EXPECT_GT(biased, 0);   // the bound is reached below 0.25, not an empty statement
}

TEST(MxRandom, DrawsAreEightPerHashAndKeyedBySeedAndIndex) {
  const uint64_t seed = 0x1234;
  for (uint64_t g = 0; g < 100; ++g) {
    const uint64_t h = mx_sr_hash64(seed, g);
    EXPECT_EQ(h, mx_sr_mix(mx_sr_counter(seed, g)));
    EXPECT_EQ(mx_sr_counter(seed, g + 1), mx_sr_counter(seed, g) + kMxSrWeyl);
    for (uint64_t i = 0; i < 8; ++i) EXPECT_EQ(mx_sr_bits8(seed, 8 * g + i), (h >> (8 * i)) & 0xFF);
  }
  // The mixer's rule, on values computed apart from it (fold, multiply, fold, multiply, fold, modulo 2^64).
  EXPECT_EQ(mx_sr_hash64(0, 0), 0x5C76A454C81BDD84ull);
  EXPECT_EQ(mx_sr_hash64(0x1234, 4), 0xD0B47E0745A89B1Cull);
  // splitmix64 (the RHT signs and the trainer's seeds): output 0 of seed 0 is the published first value.
  EXPECT_EQ(splitmix64_at(0, 0), 0xE220A8397B1DCDAFull);
  EXPECT_NE(mx_sr_hash64(1, 5), mx_sr_hash64(2, 5));
  EXPECT_EQ(mx_sr_uniform(3, 9), static_cast<float>(mx_sr_bits8(3, 9)) / 256.0f);
  // Roughly uniform: the mean of many draws is near 1/2 and every 8-bit value is reachable in principle.
  double sum = 0;
  const int n = 400000;
  for (int i = 0; i < n; ++i) sum += mx_sr_uniform(77, static_cast<uint64_t>(i));
  EXPECT_NEAR(sum / n, 0.5 - 0.5 / 256.0, 5 * std::sqrt(1.0 / 12 / n));
}

// Pearson's chi-square of counts against equal expectations, as a z-score ((X - df) / sqrt(2 df)).
double chi_square_z(const std::vector<double>& counts) {
  double total = 0;
  for (double c : counts) total += c;
  const double expected = total / static_cast<double>(counts.size());
  double x = 0;
  for (double c : counts) x += (c - expected) * (c - expected) / expected;
  const double df = static_cast<double>(counts.size() - 1);
  return (x - df) / std::sqrt(2 * df);
}

// The draws of stochastic rounding are uniform and independent where the quantizers' elements meet: the 8 bits of
// each draw; the top 4 bits of pairs of draws at distances 1..9 (within and across hashes), 16, one row of 7168
// and 2048 x 4, and of the same element under seeds s and s + 1; every bit balanced. A draw
// function with a weak spot (a constant bit, draws of one hash tied together, a stride that repeats) fails by far
// (z-scores in the hundreds); |z| < 6 holds for a good one with probability far above 0.999 per statistic.
TEST(MxRandom, DrawsAreUniformAndIndependentAcrossNeighboursRowsAndSeeds) {
  const int64_t n = int64_t{1} << 20;
  for (uint64_t seed : {uint64_t{0}, uint64_t{1}, uint64_t{0x5EED0007}, splitmix64_at(2024, 3)}) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    std::vector<uint32_t> d(n), e(n);
    for (int64_t i = 0; i < n; ++i) {
      d[i] = mx_sr_bits8(seed, static_cast<uint64_t>(i));
      e[i] = mx_sr_bits8(seed + 1, static_cast<uint64_t>(i));
    }
    std::vector<double> all(256), bits(8);
    for (int64_t i = 0; i < n; ++i) {
      all[d[i]] += 1;
      for (int b = 0; b < 8; ++b) bits[b] += (d[i] >> b) & 1;
    }
    EXPECT_LT(std::fabs(chi_square_z(all)), 6.0);
    for (int b = 0; b < 8; ++b) EXPECT_NEAR(bits[b] / n, 0.5, 6 * 0.5 / std::sqrt(static_cast<double>(n))) << b;
    for (int64_t lag : {1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 7168, 8192}) {
      std::vector<double> joint(256);
      for (int64_t i = 0; i + lag < n; ++i) joint[(d[i] >> 4) * 16 + (d[i + lag] >> 4)] += 1;
      EXPECT_LT(std::fabs(chi_square_z(joint)), 6.0) << "lag " << lag;
    }
    std::vector<double> seeds(256);
    for (int64_t i = 0; i < n; ++i) seeds[(d[i] >> 4) * 16 + (e[i] >> 4)] += 1;
    EXPECT_LT(std::fabs(chi_square_z(seeds)), 6.0) << "seed and seed + 1";
  }
}

}  // namespace
}  // namespace fp4moe
