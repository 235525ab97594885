// CPU tests of the host parts of the expert-parallel MoE layer (trainer/model/moe_expert_parallel.h) and of the FP8
// rows' way back to BF16 at the receiver (trainer/comm/ep_payload.h, ep_fp8_rows_to_bf16_ref). The layer itself runs
// in test_moe_expert_parallel_gpu.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/formats/formats.h"
#include "kernels/quant/bf16_to_fp8.h"
#include "kernels/quant/layouts.h"
#include "trainer/comm/ep_payload.h"
#include "trainer/model/moe_expert_parallel.h"

namespace fp4moe {
namespace {

struct Fp8Rows {
  int64_t M, K;
  std::vector<bf16> x;
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  Fp8Rows(int64_t m, int64_t k, uint32_t seed)
      : M(m), K(k), x(static_cast<size_t>(m * k)), codes(static_cast<size_t>(m * k)),
        scales(static_cast<size_t>(fp8_row_scale_count(m, k))) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0.f, 1.f);
    for (int64_t i = 0; i < m * k; ++i) {
      const float v = n(rng) * (i % k < 128 ? 1.0f : 300.0f);  // the blocks of a row at different scales
      x[static_cast<size_t>(i)] = bf16_from_bits(f32_to_bf16_bits(v));
    }
    bf16_to_fp8_row_ref(x.data(), m, k, Fp8ScaleMode::pow2, codes.data(), scales.data());
  }
  EpRows view() { return EpRows{EpRowFormat::fp8, M, K, codes.data(), scales.data()}; }
};

// Each element is e4m3(code) * its block's scale, rounded to BF16 (exact here: power-of-two scales).
TEST(MoeExpertParallelRef, Fp8RowsBackToBf16AreTheDequantizedValues) {
  Fp8Rows r(5, 160, 3);  // a full and a partial 128-block, 5 rows (padded scales)
  std::vector<float> want(static_cast<size_t>(r.M * r.K));
  fp8_row_dequantize_ref(r.codes.data(), r.scales.data(), r.M, r.K, want.data());
  std::vector<bf16> got(want.size());
  ep_fp8_rows_to_bf16_ref(r.view(), got.data());
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_EQ(bf16_bits_to_f32(bf16_bits(got[i])), want[i]) << "element " << i << " (not exact in BF16)";
}

// The receiver's Group Linear quantizes the BF16 rows again: the same values come out (the FP8 rows' values survive
// the second quantization), which is what makes the dispatch's FP8 rows the GEMM's operand.
TEST(MoeExpertParallelRef, Fp8RowsQuantizedAgainKeepTheirValues) {
  Fp8Rows r(7, 256, 11);
  std::vector<bf16> back(r.x.size());
  ep_fp8_rows_to_bf16_ref(r.view(), back.data());
  std::vector<uint8_t> codes2(r.codes.size());
  std::vector<float> scales2(r.scales.size());
  bf16_to_fp8_row_ref(back.data(), r.M, r.K, Fp8ScaleMode::pow2, codes2.data(), scales2.data());
  std::vector<float> v1(r.x.size()), v2(r.x.size());
  fp8_row_dequantize_ref(r.codes.data(), r.scales.data(), r.M, r.K, v1.data());
  fp8_row_dequantize_ref(codes2.data(), scales2.data(), r.M, r.K, v2.data());
  EXPECT_EQ(v1, v2);
}

TEST(MoeExpertParallelRef, Fp8RowsBackToBf16RejectBadArguments) {
  Fp8Rows r(2, 32, 5);
  std::vector<bf16> out(64);
  EpRows bf = r.view();
  bf.format = EpRowFormat::bf16;
  EXPECT_THROW(ep_fp8_rows_to_bf16_ref(bf, out.data()), Error);
  EXPECT_THROW(ep_fp8_rows_to_bf16_ref(r.view(), nullptr), Error);
  EpRows no_scales = r.view();
  no_scales.scales = nullptr;
  EXPECT_THROW(ep_fp8_rows_to_bf16_ref(no_scales, out.data()), Error);
  EpRows negative = r.view();
  negative.rows = -1;
  EXPECT_THROW(ep_fp8_rows_to_bf16_ref(negative, out.data()), Error);
  EpRows empty{EpRowFormat::fp8, 0, 32, nullptr, nullptr};
  EXPECT_NO_THROW(ep_fp8_rows_to_bf16_ref(empty, nullptr));
}

// The layer's own buffers hold the rows each recipe sends and receives: M tokens, R received rows, top-k.
TEST(MoeExpertParallelRef, ExchangeBuffersFollowTheRecipesFormats) {
  const int64_t M = 10, R = 17, d = 160, k = 3;
  auto bytes = [](const BufferPlan& p, const char* t) { return p.at(t).bytes(); };
  const BufferPlan b = ExpertParallelMoeLayer::exchange_buffers(M, R, d, k, Recipe::bf16);
  EXPECT_EQ(bytes(b, "combined ys"), 2 * M * k * d);
  EXPECT_EQ(bytes(b, "tokens FP8 codes") + bytes(b, "tokens MXFP4 codes") + bytes(b, "received FP8 codes"), 0);
  EXPECT_EQ(bytes(b, "d rows FP8 codes") + bytes(b, "received d rows FP8 codes"), 0);  // bf16's backward is BF16
  EXPECT_EQ(bytes(b, "d rows"), 2 * M * k * d);
  EXPECT_EQ(bytes(b, "expert d rows"), 2 * R * d);

  const BufferPlan f = ExpertParallelMoeLayer::exchange_buffers(M, R, d, k, Recipe::fp8);
  EXPECT_EQ(bytes(f, "tokens FP8 codes"), M * d);
  EXPECT_EQ(bytes(f, "tokens FP8 scales"), 4 * fp8_row_scale_count(M, d));
  EXPECT_EQ(bytes(f, "received FP8 codes"), R * d);
  EXPECT_EQ(bytes(f, "received rows (BF16)"), 2 * R * d);
  EXPECT_EQ(bytes(f, "tokens MXFP4 codes"), 0);
  EXPECT_EQ(bytes(f, "d rows FP8 codes"), M * k * d);
  EXPECT_EQ(bytes(f, "received d rows FP8 scales"), 4 * fp8_row_scale_count(R, d));

  const BufferPlan x = ExpertParallelMoeLayer::exchange_buffers(M, R, d, k, Recipe::mxfp4);
  EXPECT_EQ(bytes(x, "tokens MXFP4 codes"), M * d / 2);
  EXPECT_EQ(bytes(x, "tokens MXFP4 scales"), M * d / 32);
  EXPECT_EQ(bytes(x, "received FP8 codes") + bytes(x, "received rows (BF16)"), 0);  // received into the experts' xs
  EXPECT_EQ(bytes(x, "received d rows FP8 codes"), R * d);                          // backward in FP8

  EXPECT_THROW(ExpertParallelMoeLayer::exchange_buffers(-1, R, d, k, Recipe::bf16), Error);
  EXPECT_THROW(ExpertParallelMoeLayer::exchange_buffers(M, -1, d, k, Recipe::bf16), Error);
}

}  // namespace
}  // namespace fp4moe
