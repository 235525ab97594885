// CPU references of the MXFP4 GEMM on FP8 tensor cores (mxfp4_gemm.h): the product of the direct FP8 conversions
// equals the exact product of the dequantized MXFP4 operands while no 128-group spans more than 14 binades of block
// scales, and beyond that differs by exactly the conversion's rounding of the small blocks (computed here
// independently with std::nearbyint); argument rejection.
#include <gtest/gtest.h>

#include <cfenv>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/gemm/mxfp4_gemm.h"
#include "kernels/quant/layouts.h"
#include "tests/common/mx_test_util.h"

namespace fp4moe {
namespace {

using test::MxTensor;
using test::random_mx;

std::vector<double> exact(const MxTensor& a, const MxTensor& b) {
  std::vector<double> y(a.R * b.R);
  mxfp4_gemm_exact_ref(a.op(), b.op(), a.R, b.R, a.K, y.data());
  return y;
}
std::vector<double> via_fp8(const MxTensor& a, const MxTensor& b) {
  std::vector<double> y(a.R * b.R);
  mxfp4_gemm_fp8_ref(a.op(), b.op(), a.R, b.R, a.K, y.data());
  return y;
}

TEST(Mxfp4GemmRef, Fp8ProductEqualsTheExactProductWhileTheSpreadIsAtMost14) {
  for (int spread : {0, 7, 14}) {
    const MxTensor a = random_mx(8, 320, -spread / 2, spread - spread / 2, 10 + spread);
    const MxTensor b = random_mx(16, 320, -20, -20 + spread, 20 + spread);
    EXPECT_EQ(via_fp8(a, b), exact(a, b)) << "spread " << spread;  // the same FP64 values summed in the same order
  }
}

TEST(Mxfp4GemmRef, SpreadAbove14RoundsTheSmallBlocksToTheGroupsE4M3Grid) {
  ASSERT_EQ(std::fegetround(), FE_TONEAREST);
  // A: rows of one 128-group: block 0 at exponent 0 (sets E = 0, group scale 2^-6), blocks 1..3 at -low.
  // B: ones at exponent 0, so y = the sum of A's row.
  for (int low : {15, 16, 18, 19}) {
    MxTensor a(4, 128), b(16, 128);
    for (int64_t r = 0; r < 4; ++r) {
      for (int blk = 0; blk < 4; ++blk) a.scales[r * 4 + blk] = static_cast<uint8_t>(127 - (blk == 0 ? 0 : low));
      // Positive codes 0.5 (one in four low nibbles), 6 and 3, so that the roundings cannot cancel out.
      for (int64_t i = 0; i < 64; ++i) a.codes[r * 64 + i] = static_cast<uint8_t>((i % 4 == 0 ? 1 : 7) | (5 << 4));
    }
    for (auto& c : b.codes) c = 0x22;  // 1.0, 1.0
    for (auto& s : b.scales) s = 127;
    const std::vector<double> y8 = via_fp8(a, b), y = exact(a, b);
    // Expected: each value v of a small block rounded to nearest even on the grid 2^(s - 9) = 2^-15 of the
    // group's E4M3 subnormals (s = -6).
    std::vector<double> av(4 * 128);
    mxfp4_dequantize_f64_ref(a.op(), 4, 128, av.data());
    for (int64_t r = 0; r < 4; ++r) {
      double expected = 0.0, lost = 0.0;
      for (int64_t k = 0; k < 128; ++k) {
        const double v = av[r * 128 + k];
        const double q = k < 32 ? v : std::nearbyint(v / std::ldexp(1.0, -15)) * std::ldexp(1.0, -15);
        expected += q;
        lost += q - v;
      }
      for (int64_t n = 0; n < 16; ++n) {
        EXPECT_EQ(y8[r * 16 + n], expected) << "spread " << low << " row " << r;
        EXPECT_NE(y8[r * 16 + n], y[r * 16 + n]) << "spread " << low << ": the conversion must lose something";
      }
      if (low >= 19) {  // every small value is below half the grid step: the small blocks vanish
        double big = 0.0;
        for (int64_t k = 0; k < 32; ++k) big += av[r * 128 + k];
        EXPECT_EQ(y8[r * 16], big);
      }
      EXPECT_NE(lost, 0.0);
    }
  }
}

TEST(Mxfp4GemmRef, RejectsShapesTheGpuGemmRejects) {
  MxTensor a(4, 64), b(16, 64);
  std::vector<double> y(64);
  EXPECT_THROW(mxfp4_gemm_exact_ref(a.op(), b.op(), 3, 16, 64, y.data()), Error);   // M % 4
  EXPECT_THROW(mxfp4_gemm_fp8_ref(a.op(), b.op(), 4, 8, 64, y.data()), Error);      // N % 16
  EXPECT_THROW(mxfp4_gemm_fp8_ref(a.op(), b.op(), 4, 16, 48, y.data()), Error);     // K % 32
  EXPECT_THROW(mxfp4_gemm_fp8_ref(a.op(), b.op(), 4, 16, 64, nullptr), Error);
}

}  // namespace
}  // namespace fp4moe
