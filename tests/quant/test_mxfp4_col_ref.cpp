// Properties of the CPU references of the MXFP4 column quantizers (bf16_to_mxfp4_col.h): the dense form is the row
// quantizer of X^T (every transform, both scale modes), stochastic rounding draws by the element's index in X,
// each ragged group is the dense form of its zero-padded rows, NaN/Inf blocks, capacities and rejections.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/common/types.h"
#include "kernels/formats/formats.h"
#include "kernels/quant/bf16_to_mxfp4_col.h"
#include "kernels/quant/bf16_to_mxfp4_row.h"
#include "kernels/quant/layouts.h"
#include "kernels/quant/mx_random.h"
#include "kernels/quant/mx_transform.h"
#include "tests/common/mx_test_util.h"

namespace fp4moe {
namespace {

constexpr HadamardTransform kAllTransforms[] = {HadamardTransform::none, HadamardTransform::h16,
                                                HadamardTransform::h32, HadamardTransform::rht};

std::vector<bf16> random_x(int64_t M, int64_t K, uint32_t seed) { return test::mx_random_bf16(M, K, seed); }

std::vector<bf16> transpose(const std::vector<bf16>& x, int64_t M, int64_t K) {
  std::vector<bf16> t(x.size());
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) t[k * M + m] = x[m * K + k];
  return t;
}

struct Quantized {
  std::vector<uint8_t> codes, scales;
  int64_t nonfinite = 0;
};

Quantized col(const std::vector<bf16>& x, int64_t M, int64_t K, const MxQuantConfig& cfg) {
  Quantized q{std::vector<uint8_t>(M * K / 2, 0xA5), std::vector<uint8_t>(M * K / 32, 0xA5), 0};
  q.nonfinite = bf16_to_mxfp4_col_ref(x.data(), M, K, q.codes.data(), q.scales.data(), cfg);
  return q;
}

int code_at(const std::vector<uint8_t>& codes, int64_t i) { return (codes[i / 2] >> (4 * (i % 2))) & 0xF; }

TEST(Bf16ToMxfp4ColRef, DenseIsTheRowQuantizerOfTheTranspose) {
  const int64_t M = 96, K = 40;
  const std::vector<bf16> x = random_x(M, K, 1);
  const std::vector<bf16> xt = transpose(x, M, K);
  for (HadamardTransform t : kAllTransforms)
    for (MxScaleMode mode : {MxScaleMode::floor, MxScaleMode::ceil}) {
      MxQuantConfig cfg;
      cfg.scale_mode = mode;
      cfg.transform = t;
      cfg.rht_seed = 77;
      const Quantized c = col(x, M, K, cfg);
      std::vector<uint8_t> codes(M * K / 2), scales(M * K / 32);
      bf16_to_mxfp4_row_ref(xt.data(), K, M, codes.data(), scales.data(), cfg);
      EXPECT_EQ(c.codes, codes) << "transform " << static_cast<int>(t) << " mode " << static_cast<int>(mode);
      EXPECT_EQ(c.scales, scales) << "transform " << static_cast<int>(t) << " mode " << static_cast<int>(mode);
    }
}

TEST(Bf16ToMxfp4ColRef, StochasticRoundingDrawsByTheElementIndexInX) {
  const int64_t M = 64, K = 24;
  const std::vector<bf16> x = random_x(M, K, 2);
  MxQuantConfig cfg;
  const Quantized rne = col(x, M, K, cfg);
  cfg.rounding = Rounding::stochastic;
  cfg.seed = 1234;
  cfg.row_offset = 5;
  const Quantized sr = col(x, M, K, cfg);
  EXPECT_EQ(sr.scales, rne.scales);  // the scale does not depend on the rounding
  int64_t differ = 0;
  for (int64_t k = 0; k < K; ++k)
    for (int64_t m = 0; m < M; ++m) {
      const int e = static_cast<int>(sr.scales[(k * M + m) / 32]) - kUE8M0Bias;
      const float v = bf16_bits_to_f32(bf16_bits(x[m * K + k])) * exp2_exact(-e);
      const uint64_t index = static_cast<uint64_t>((cfg.row_offset + m) * K + k);
      const int expected = f32_to_e2m1_stochastic(v, mx_sr_uniform(cfg.seed, index));
      ASSERT_EQ(code_at(sr.codes, k * M + m), expected) << "m " << m << " k " << k;
      differ += code_at(sr.codes, k * M + m) != code_at(rne.codes, k * M + m);
    }
  EXPECT_GT(differ, 0);  // stochastic rounding rounds some elements away from the nearest value
}

TEST(Bf16ToMxfp4ColRaggedRef, EachGroupIsTheDenseQuantizerOfItsZeroPaddedRows) {
  const int64_t K = 16;
  const std::vector<int32_t> offsets = {0, 0, 5, 37, 101, 134, 134};  // sizes 0, 5, 32, 64, 33, 0
  const int64_t G = static_cast<int64_t>(offsets.size()) - 1, M = offsets[G];
  const std::vector<bf16> x = random_x(M, K, 3);
  for (HadamardTransform t : kAllTransforms)
    for (Rounding r : {Rounding::rne, Rounding::stochastic}) {
      MxQuantConfig cfg;
      cfg.transform = t;
      cfg.rht_seed = 9;
      cfg.rounding = r;
      cfg.seed = 31;
      cfg.row_offset = 3;
      std::vector<uint8_t> codes(mxfp4_col_codes_capacity(M, K, G), 0xA5);
      std::vector<uint8_t> scales(mxfp4_col_scales_capacity(M, K, G), 0xA5);
      bf16_to_mxfp4_col_ragged_ref(x.data(), M, K, offsets.data(), G, codes.data(), scales.data(), cfg);
      int64_t P = 0;
      for (int64_t g = 0; g < G; ++g) {
        const int64_t rows = offsets[g + 1] - offsets[g], L = mxfp4_col_group_ld(rows);
        std::vector<bf16> padded(static_cast<size_t>(L * K), bf16_from_bits(0));
        for (int64_t i = 0; i < rows * K; ++i) padded[i] = x[offsets[g] * K + i];
        MxQuantConfig group_cfg = cfg;
        group_cfg.row_offset = cfg.row_offset + offsets[g];  // padding rows are zero: their draws do not matter
        if (L > 0) {
          const Quantized q = col(padded, L, K, group_cfg);
          EXPECT_EQ(std::vector<uint8_t>(codes.begin() + K * P / 2, codes.begin() + K * (P + L) / 2), q.codes)
              << "group " << g << " transform " << static_cast<int>(t) << " rounding " << static_cast<int>(r);
          EXPECT_EQ(std::vector<uint8_t>(scales.begin() + K * P / 32, scales.begin() + K * (P + L) / 32), q.scales)
              << "group " << g;
        }
        P += L;
      }
      EXPECT_EQ(P, 0 + 32 + 32 + 64 + 64);
      // Exactly the layout's extent is written: the rest of the capacity keeps its poison.
      for (size_t i = static_cast<size_t>(K * P / 2); i < codes.size(); ++i) ASSERT_EQ(codes[i], 0xA5) << i;
      for (size_t i = static_cast<size_t>(K * P / 32); i < scales.size(); ++i) ASSERT_EQ(scales[i], 0xA5) << i;
    }
}

TEST(Bf16ToMxfp4ColRaggedRef, CapacityHoldsEverySplit) {
  // The worst split pads every group by 31 rows: G groups of 1 row.
  for (int64_t G : {1, 3, 64}) {
    const int64_t M = G, K = 8;
    std::vector<int32_t> offsets(G + 1);
    for (int64_t g = 0; g <= G; ++g) offsets[g] = static_cast<int32_t>(g);
    int64_t P = 0;
    for (int64_t g = 0; g < G; ++g) P += mxfp4_col_group_ld(offsets[g + 1] - offsets[g]);
    EXPECT_EQ(K * P / 2, mxfp4_col_codes_capacity(M, K, G));
    EXPECT_EQ(K * P / 32, mxfp4_col_scales_capacity(M, K, G));
  }
}

TEST(Bf16ToMxfp4ColRef, NonFiniteValueMakesOnlyItsColumnBlockNaNAndIsCounted) {
  const int64_t M = 64, K = 8;
  std::vector<bf16> x = random_x(M, K, 4);
  x[40 * K + 3] = bf16_from_bits(0x7FC0);  // NaN at (m = 40, k = 3): block 1 of row 3 of X^T
  const Quantized q = col(x, M, K, MxQuantConfig{});
  EXPECT_EQ(q.nonfinite, 1);
  for (int64_t b = 0; b < M * K / 32; ++b) EXPECT_EQ(q.scales[b] == kUE8M0NaN, b == 3 * 2 + 1) << "block " << b;
}

TEST(Bf16ToMxfp4ColRef, RejectsBadShapesAndConfigsNamingThem) {
  std::vector<bf16> x(64 * 64);
  std::vector<uint8_t> codes(64 * 64), scales(64 * 64);
  auto dense = [&](int64_t M, int64_t K, MxQuantConfig cfg = {}) {
    bf16_to_mxfp4_col_ref(x.data(), M, K, codes.data(), scales.data(), cfg);
  };
  EXPECT_THROW(dense(48, 8), Error);   // M % 32 != 0
  EXPECT_THROW(dense(-32, 8), Error);  // M < 0
  EXPECT_THROW(dense(32, 12), Error);  // K % 8 != 0
  EXPECT_THROW(dense(32, 0), Error);
  EXPECT_THROW(dense(32, kMxColMaxK + 8), Error);
  MxQuantConfig bad;
  bad.row_offset = -1;
  EXPECT_THROW(dense(32, 8, bad), Error);
  bad = {};
  bad.rounding = static_cast<Rounding>(7);
  EXPECT_THROW(dense(32, 8, bad), Error);
  bad = {};
  bad.transform = static_cast<HadamardTransform>(9);
  EXPECT_THROW(dense(32, 8, bad), Error);
  try {
    dense(48, 8);
    FAIL() << "expected a rejection";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[48, 8]"), std::string::npos) << e.what();
  }
  dense(0, 8);  // M = 0: nothing to do
  auto ragged = [&](std::vector<int32_t> offsets, int64_t M, int64_t K = 8) {
    bf16_to_mxfp4_col_ragged_ref(x.data(), M, K, offsets.data(), static_cast<int64_t>(offsets.size()) - 1,
                                 codes.data(), scales.data(), MxQuantConfig{});
  };
  ragged({0, 5, 9}, 9);                          // any group size
  EXPECT_THROW(ragged({0, 5, 3, 9}, 9), Error);  // decreasing
  EXPECT_THROW(ragged({0, 5, 8}, 9), Error);     // does not end at M
  EXPECT_THROW(ragged({1, 9}, 9), Error);        // does not start at 0
  EXPECT_THROW(ragged({0}, 0), Error);           // G = 0
  EXPECT_THROW(ragged({0, 9}, 9, 4), Error);     // K % 8 != 0
}

}  // namespace
}  // namespace fp4moe
