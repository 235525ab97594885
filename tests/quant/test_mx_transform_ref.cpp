// The CPU references of the transforms (mx_transform.h) and of MXFP4 quantization with a transform and with
// stochastic rounding (bf16_to_mxfp4_row_ref): Sylvester order and orthogonality of the
// Hadamard matrices, the inverse, the random signs, the exact product of two transformed operands, quantization of
// a transformed tensor, stochastic rounding unbiased on transformed values and independent of how rows are split.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/common/types.h"
#include "kernels/formats/formats.h"
#include "kernels/quant/bf16_to_mxfp4_row.h"
#include "kernels/quant/mx_transform.h"
#include "kernels/quant/mxfp4_to_bf16.h"

namespace fp4moe {
namespace {

constexpr HadamardTransform kTransforms[] = {HadamardTransform::h16, HadamardTransform::h32, HadamardTransform::rht};

std::vector<float> normal_floats(int64_t n, uint32_t seed, bool bf16_values) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& f : v) {
    f = d(rng) * (rng() % 50 == 0 ? 30.0f : 1.0f);
    if (bf16_values) f = bf16_bits_to_f32(f32_to_bf16_bits(f));
  }
  return v;
}

std::vector<float> transform(const std::vector<float>& x, int64_t M, int64_t K, HadamardTransform t, uint64_t seed,
                             bool inverse = false) {
  std::vector<float> y(x.size());
  if (inverse) mx_transform_rows_inverse_ref(x.data(), M, K, t, seed, y.data());
  else mx_transform_rows_ref(x.data(), M, K, t, seed, y.data());
  return y;
}

// The matrix of a transform on one block of n: row i = T(e_i).
std::vector<float> matrix_of(HadamardTransform t, int n, uint64_t seed) {
  std::vector<float> eye(n * n, 0.0f);
  for (int i = 0; i < n; ++i) eye[i * n + i] = 1.0f;
  return transform(eye, n, n, t, seed);
}

TEST(MxTransformRef, HadamardMatricesAreSylvesterOrderAndOrthogonal) {
  for (HadamardTransform t : {HadamardTransform::h16, HadamardTransform::h32}) {
    const int n = hadamard_block_size(t);
    const std::vector<float> h = matrix_of(t, n, 0);
    const double c = hadamard_scale(n);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        // Sylvester: entry (i, j) of W_n is (-1)^popcount(i & j).
        const double w = std::popcount(static_cast<unsigned>(i & j)) % 2 ? -1.0 : 1.0;
        ASSERT_EQ(h[i * n + j], static_cast<float>(w * c)) << "n " << n << " (" << i << ", " << j << ")";
      }
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        double unscaled = 0, scaled = 0;  // W W^T = n I; H H^T = I (up to the rounding of 1/sqrt(32))
        for (int k = 0; k < n; ++k) {
          unscaled += (h[i * n + k] / c) * (h[j * n + k] / c);
          scaled += static_cast<double>(h[i * n + k]) * h[j * n + k];
        }
        EXPECT_EQ(unscaled, i == j ? n : 0.0) << i << " " << j;
        EXPECT_NEAR(scaled, i == j ? 1.0 : 0.0, 1e-7) << i << " " << j;
      }
  }
}

// The 32 signs of an MX block (one hash, read by the block-per-thread kernels) are the four chunks' 8 signs side by
// side, for blocks in the low and the high half of a hash and far along the reduction dimension.
TEST(MxTransformRef, RhtSignBits32AreFourChunksOfSignBits8) {
  for (uint64_t seed : {uint64_t{0}, uint64_t{99}, uint64_t{0xFFFFFFFFFFFFFFFFull}}) {
    for (uint64_t k0 : {uint64_t{0}, uint64_t{32}, uint64_t{64}, uint64_t{96}, uint64_t{7136}, uint64_t{1} << 29,
                        (uint64_t{1} << 30) - 32}) {
      uint32_t chunks = 0;
      for (uint64_t c = 0; c < 4; ++c) chunks |= rht_sign_bits8(seed, k0 + 8 * c) << (8 * c);
      EXPECT_EQ(rht_sign_bits32(seed, k0), chunks) << "seed " << seed << " k0 " << k0;
    }
  }
  EXPECT_NE(rht_sign_bits32(99, 0), rht_sign_bits32(99, 32));
}

// mod_by_inverse (the row quantizer's rht block column) equals the remainder for divisors from 1 to 2^25 (K / 32
// up to K = 2^30) and numerators at the edges of its one-subtraction bound and past 2^32.
TEST(MxTransformRef, ModByInverseIsTheRemainder) {
  std::mt19937_64 rng(5);
  std::vector<uint32_t> divisors = {1, 2, 3, 7, 56, 64, 160, 224, 255, 256, 4097, (1u << 25) - 1, 1u << 25};
  for (int i = 0; i < 40; ++i) divisors.push_back(1 + static_cast<uint32_t>(rng() % (1u << 25)));
  for (uint32_t d : divisors) {
    const uint32_t inverse = 0xFFFFFFFFu / d;
    std::vector<uint64_t> n = {0, 1, d - 1u, d, uint64_t{d} + 1, 0xFFFFFFFFull, 0xFFFFFFFEull, 0x100000000ull,
                               0x123456789ABull, (uint64_t{1} << 57) - 1};
    for (uint64_t q : {uint64_t{0xFFFFFFFFu} / d, uint64_t{0xFFFFFFFFu} / d - 1})  // the largest multiples below 2^32
      for (uint64_t r : {uint64_t{0}, uint64_t{d} - 1}) n.push_back(q * d + r);
    for (int i = 0; i < 2000; ++i) n.push_back(rng() >> (i % 2 == 0 ? 32 : 24));
    for (uint64_t v : n) ASSERT_EQ(mod_by_inverse(v, d, inverse), v % d) << "n " << v << " d " << d;
  }
}

TEST(MxTransformRef, RhtIsRandomSignsThenH16WithSignsKeyedBySeedAndColumn) {
  const int K = 64;
  const uint64_t seed = 99;
  std::vector<float> eye(K * K, 0.0f);
  for (int i = 0; i < K; ++i) eye[i * K + i] = 1.0f;
  const std::vector<float> r = transform(eye, K, K, HadamardTransform::rht, seed);
  const std::vector<float> h = matrix_of(HadamardTransform::h16, 16, 0);
  int negative = 0;
  for (int i = 0; i < K; ++i) {
    const float s = (rht_sign_bits8(seed, i / 8 * 8) >> (i % 8)) & 1u ? -1.0f : 1.0f;
    negative += s < 0;
    for (int j = 0; j < K; ++j) {
      const bool same_block = i / 16 == j / 16;
      ASSERT_EQ(r[i * K + j], same_block ? s * h[(i % 16) * 16 + j % 16] : 0.0f) << i << " " << j;
    }
  }
  EXPECT_GT(negative, 16);
  EXPECT_LT(negative, 48);
  // Another seed, other signs; rows do not matter (two equal rows stay equal).
  EXPECT_NE(transform(eye, K, K, HadamardTransform::rht, seed + 1), r);
  std::vector<float> two = normal_floats(K, 3, true);
  two.insert(two.end(), two.begin(), two.end());
  const std::vector<float> t2 = transform(two, 2, K, HadamardTransform::rht, seed);
  EXPECT_EQ(std::vector<float>(t2.begin(), t2.begin() + K), std::vector<float>(t2.begin() + K, t2.end()));
}

TEST(MxTransformRef, InverseRestoresTheInputInFp32) {
  const int64_t M = 7, K = 256;
  const std::vector<float> x = normal_floats(M * K, 5, false);
  for (HadamardTransform t : kTransforms) {
    const std::vector<float> y = transform(x, M, K, t, 1234);
    EXPECT_NE(y, x);
    const std::vector<float> back = transform(y, M, K, t, 1234, true);
    double max_err = 0, max_x = 0;
    for (int64_t i = 0; i < M * K; ++i) {
      max_err = std::max(max_err, std::fabs(static_cast<double>(back[i]) - x[i]));
      max_x = std::max(max_x, std::fabs(static_cast<double>(x[i])));
    }
    EXPECT_LT(max_err, 1e-6 * max_x) << static_cast<int>(t);
    // The wrong seed does not invert rht.
    if (t == HadamardTransform::rht) {
      const std::vector<float> wrong = transform(y, M, K, t, 1235, true);
      EXPECT_GT(std::fabs(wrong[0] - x[0]) + std::fabs(wrong[1] - x[1]), 0.0f);
    }
  }
  EXPECT_EQ(transform(x, M, K, HadamardTransform::none, 0), x);
}

TEST(MxTransformRef, TransformOfBothOperandsKeepsTheExactProduct) {
  // (X T)(W T)^T = X W^T: FP64 products of the FP32 transformed operands against the FP64 product of the originals,
  // within the FP32 rounding of the transformed values.
  const int64_t M = 5, N = 6, K = 512;
  const std::vector<float> x = normal_floats(M * K, 8, true), w = normal_floats(N * K, 9, true);
  for (HadamardTransform t : kTransforms) {
    const std::vector<float> xt = transform(x, M, K, t, 42), wt = transform(w, N, K, t, 42);
    const std::vector<float> w_other = transform(w, N, K, t, 43);  // rht with other signs on W: not exact
    double worst = 0, worst_other = 0;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double exact = 0, rotated = 0, other = 0, bound = 0;
        for (int64_t k = 0; k < K; ++k) {
          exact += static_cast<double>(x[m * K + k]) * w[n * K + k];
          rotated += static_cast<double>(xt[m * K + k]) * wt[n * K + k];
          other += static_cast<double>(xt[m * K + k]) * w_other[n * K + k];
          bound += std::fabs(static_cast<double>(xt[m * K + k]) * wt[n * K + k]);
        }
        worst = std::max(worst, std::fabs(rotated - exact) / bound);
        worst_other = std::max(worst_other, std::fabs(other - exact) / bound);
      }
    EXPECT_LT(worst, 1e-6) << static_cast<int>(t);
    if (t == HadamardTransform::rht) {
      EXPECT_GT(worst_other, 1e-3);
    }
  }
}

TEST(MxTransformRef, RejectsBadShapesAndTransforms) {
  std::vector<float> x(64 * 2), y(64 * 2);
  EXPECT_THROW(mx_transform_rows_ref(x.data(), 1, 24, HadamardTransform::h16, 0, y.data()), Error);
  EXPECT_THROW(mx_transform_rows_ref(x.data(), 1, 48, HadamardTransform::h32, 0, y.data()), Error);
  EXPECT_THROW(mx_transform_rows_ref(x.data(), 1, 64, static_cast<HadamardTransform>(7), 0, y.data()), Error);
  EXPECT_THROW(mx_transform_rows_ref(x.data(), -1, 64, HadamardTransform::h16, 0, y.data()), Error);
  EXPECT_THROW(mx_transform_rows_ref(nullptr, 1, 64, HadamardTransform::h16, 0, y.data()), Error);
  EXPECT_NO_THROW(mx_transform_rows_ref(x.data(), 1, 48, HadamardTransform::h16, 0, y.data()));
  EXPECT_NO_THROW(mx_transform_rows_ref(nullptr, 0, 64, HadamardTransform::h32, 0, nullptr));
  MxQuantConfig cfg;
  std::vector<bf16> xb(64);
  std::vector<uint8_t> codes(32), scales(2);
  cfg.transform = static_cast<HadamardTransform>(4);
  EXPECT_THROW(bf16_to_mxfp4_row_ref(xb.data(), 1, 64, codes.data(), scales.data(), cfg), Error);
}

// ---- quantization with a transform ----------------------------------------------------------------------------

struct Quantized {
  std::vector<uint8_t> codes, scales;
  int64_t nonfinite = 0;
  bool operator==(const Quantized& o) const {
    return codes == o.codes && scales == o.scales && nonfinite == o.nonfinite;
  }
};

std::vector<bf16> as_bf16(const std::vector<float>& v) {
  std::vector<bf16> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = bf16_from_bits(f32_to_bf16_bits(v[i]));
  return b;
}

Quantized quantize(const std::vector<bf16>& x, int64_t M, int64_t K, const MxQuantConfig& cfg) {
  Quantized q{std::vector<uint8_t>(M * K / 2, 0xA5), std::vector<uint8_t>(M * K / 32, 0xA5), 0};
  q.nonfinite = bf16_to_mxfp4_row_ref(x.data(), M, K, q.codes.data(), q.scales.data(), cfg);
  return q;
}

// The quantizer with a transform equals the plain quantizer on the reference transform rounded to BF16.
TEST(MxTransformRef, QuantizingWithATransformIsQuantizingTheTransformedTensor) {
  const int64_t M = 9, K = 192;
  const std::vector<float> xf = normal_floats(M * K, 12, true);
  const std::vector<bf16> x = as_bf16(xf);
  for (HadamardTransform t : kTransforms)
    for (Rounding r : {Rounding::rne, Rounding::stochastic}) {
      MxQuantConfig cfg;
      cfg.transform = t;
      cfg.rht_seed = 555;
      cfg.rounding = r;
      cfg.seed = 3;
      const Quantized fused = quantize(x, M, K, cfg);
      const std::vector<float> y = transform(xf, M, K, t, 555);
      MxQuantConfig plain = cfg;
      plain.transform = HadamardTransform::none;
      EXPECT_TRUE(fused == quantize(as_bf16(y), M, K, plain)) << static_cast<int>(t) << " " << static_cast<int>(r);
      EXPECT_FALSE(fused == quantize(x, M, K, plain));
    }
}

TEST(MxTransformRef, ZeroBlocksStayZeroAndNonFiniteInputMarksItsBlocks) {
  const int64_t M = 2, K = 64;
  std::vector<float> xf(M * K, 0.0f);
  xf[K + 5] = NAN;  // row 1, first MX block
  for (HadamardTransform t : kTransforms) {
    MxQuantConfig cfg;
    cfg.transform = t;
    const Quantized q = quantize(as_bf16(xf), M, K, cfg);
    EXPECT_EQ(q.scales[0], 0);
    EXPECT_EQ(q.scales[1], 0);
    EXPECT_EQ(q.scales[2], kUE8M0NaN);
    EXPECT_EQ(q.scales[3], 0);  // a NaN spreads over its transform block only, inside one MX block
    EXPECT_EQ(q.nonfinite, 1);
    for (int64_t i = 0; i < K / 2; ++i) EXPECT_EQ(q.codes[i], 0) << i;
  }
}

TEST(MxTransformRef, StochasticRoundingOfTransformedValuesIsUnbiased) {
  // Every row the same 32 values: the mean over rows of the dequantized transformed values must approach the
  // transformed values (each row draws other numbers).
  const int64_t M = 20000, K = 32;
  const std::vector<float> row = normal_floats(K, 21, true);
  std::vector<float> xf;
  for (int64_t m = 0; m < M; ++m) xf.insert(xf.end(), row.begin(), row.end());
  for (HadamardTransform t : kTransforms) {
    MxQuantConfig cfg;
    cfg.transform = t;
    cfg.rounding = Rounding::stochastic;
    cfg.seed = 2025;
    cfg.rht_seed = 8;
    const Quantized q = quantize(as_bf16(xf), M, K, cfg);
    std::vector<bf16> deq(M * K);
    mxfp4_to_bf16_ref(q.codes.data(), q.scales.data(), M, K, deq.data());
    std::vector<float> target = transform(row, 1, K, t, 8);
    for (float& v : target) v = bf16_bits_to_f32(f32_to_bf16_bits(v));  // what the block rule quantizes
    const double step_max = std::ldexp(2.0, q.scales[0] - 127);  // the largest E2M1 step at this block's scale
    for (int64_t k = 0; k < K; ++k) {
      double sum = 0;
      for (int64_t m = 0; m < M; ++m) sum += bf16_bits_to_f32(bf16_bits(deq[m * K + k]));
      EXPECT_NEAR(sum / M, target[k], 6 * step_max * 0.5 / std::sqrt(static_cast<double>(M)))
          << "transform " << static_cast<int>(t) << " column " << k;
    }
  }
}

TEST(MxTransformRef, StochasticRoundingDoesNotDependOnHowRowsAreSplit) {
  const int64_t M = 12, K = 128;
  const std::vector<bf16> x = as_bf16(normal_floats(M * K, 31, true));
  for (HadamardTransform t : {HadamardTransform::none, HadamardTransform::rht}) {
    MxQuantConfig cfg;
    cfg.transform = t;
    cfg.rounding = Rounding::stochastic;
    cfg.seed = 77;
    cfg.rht_seed = 78;
    const Quantized full = quantize(x, M, K, cfg);
    // Three launches over rows [0, 5), [5, 6), [6, 12).
    Quantized pieces{{}, {}, 0};
    const int64_t cuts[] = {0, 5, 6, 12};
    for (int p = 0; p < 3; ++p) {
      MxQuantConfig part = cfg;
      part.row_offset = cuts[p];
      const std::vector<bf16> rows(x.begin() + cuts[p] * K, x.begin() + cuts[p + 1] * K);
      const Quantized q = quantize(rows, cuts[p + 1] - cuts[p], K, part);
      pieces.codes.insert(pieces.codes.end(), q.codes.begin(), q.codes.end());
      pieces.scales.insert(pieces.scales.end(), q.scales.begin(), q.scales.end());
    }
    EXPECT_TRUE(full == pieces) << static_cast<int>(t);
  }
}

}  // namespace
}  // namespace fp4moe
