// GPU column MXFP4 quantizers (bf16_to_mxfp4_col, bf16_to_mxfp4_col_ragged), each of their kernels, against their
// CPU references, bit for bit: every rounding and transform, both scale modes, NaN/Inf blocks counted, all-zero
// blocks, every block exponent (subnormal amax included), partial row and column tiles, ragged splits with empty
// groups and groups of any size; stochastic rounding independent of how the rows are split into launches; nothing
// written outside the outputs (guards) or past the layout's extent (outputs poisoned first); device offsets that
// are not a valid split write nothing; rejections before any launch.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/common/types.h"
#include "kernels/quant/bf16_to_mxfp4_col.h"
#include "kernels/quant/layouts.h"
#include "tests/common/gpu_test_util.h"
#include "tests/common/mx_test_util.h"
#include "tests/common/nn_test_util.h"

namespace fp4moe {
namespace {

using test::DeviceBuffer;
using test::Guarded;

constexpr HadamardTransform kAllTransforms[] = {HadamardTransform::none, HadamardTransform::h16,
                                                HadamardTransform::h32, HadamardTransform::rht};

struct ColRun {
  std::vector<uint8_t> codes, scales;
  int64_t nonfinite = 0;
  bool guards_intact = false;
};

// The kernels behind the column quantizers (bf16_to_mxfp4_col.h): each must give the reference's bits.
constexpr detail::MxColKernel kAllKernels[] = {detail::MxColKernel::block_per_thread, detail::MxColKernel::block_staged,
                                               detail::MxColKernel::register_tile, detail::MxColKernel::shared_tile};

// The dense (offsets empty) or ragged GPU quantizer into outputs of `codes_n` and `scales_n` bytes, poisoned first.
ColRun run_gpu(const std::vector<bf16>& x, int64_t M, int64_t K, const std::vector<int32_t>& offsets,
               int64_t codes_n, int64_t scales_n, const MxQuantConfig& cfg, bool pass_host_offsets,
               detail::MxColKernel kernel) {
  Guarded<bf16> dx(static_cast<size_t>(M * K));
  Guarded<uint8_t> codes(static_cast<size_t>(codes_n)), scales(static_cast<size_t>(scales_n));
  DeviceBuffer<unsigned long long> counter(1);
  dx.upload(x);
  CUDA_CHECK(cudaMemset(counter.ptr, 0, sizeof(unsigned long long)));
  if (offsets.empty()) {
    detail::bf16_to_mxfp4_col_using(kernel, dx.ptr(), M, K, codes.ptr(), scales.ptr(), cfg, counter.ptr, nullptr);
  } else {
    DeviceBuffer<int32_t> d_offsets(offsets.size());
    d_offsets.upload(offsets);
    const int64_t G = static_cast<int64_t>(offsets.size()) - 1;
    detail::bf16_to_mxfp4_col_ragged_using(kernel, dx.ptr(), M, K, d_offsets.ptr, G,
                                           pass_host_offsets ? offsets.data() : nullptr, codes.ptr(), scales.ptr(),
                                           cfg, counter.ptr, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  return ColRun{codes.download(), scales.download(), static_cast<int64_t>(counter.download()[0]),
                codes.guards_intact() && scales.guards_intact()};
}

// Every column kernel on dense X [M, K] with `cfg` equals the CPU reference bit for bit (codes, scales, the
// non-finite count), guards intact.
void expect_every_kernel_matches_ref(const std::vector<bf16>& x, int64_t M, int64_t K, const MxQuantConfig& cfg) {
  std::vector<uint8_t> codes(M * K / 2), scales(M * K / 32);
  const int64_t nonfinite = bf16_to_mxfp4_col_ref(x.data(), M, K, codes.data(), scales.data(), cfg);
  for (detail::MxColKernel kernel : kAllKernels) {
    SCOPED_TRACE(testing::Message() << "kernel " << int(kernel));
    const ColRun got = run_gpu(x, M, K, {}, M * K / 2, M * K / 32, cfg, true, kernel);
    EXPECT_EQ(got.codes, codes);
    EXPECT_EQ(got.scales, scales);
    EXPECT_EQ(got.nonfinite, nonfinite);
    EXPECT_TRUE(got.guards_intact);
  }
}

MxQuantConfig config(Rounding r, HadamardTransform t, MxScaleMode mode, uint64_t seed) {
  MxQuantConfig cfg;
  cfg.rounding = r;
  cfg.transform = t;
  cfg.scale_mode = mode;
  cfg.seed = 0x5EED0000ull + seed;
  cfg.rht_seed = 0x77700000ull + seed;
  return cfg;
}

TEST(Bf16ToMxfp4ColGpu, DenseMatchesReferenceBitForBit) {
  FP4MOE_REQUIRE_DEVICE();
  // Row tiles of 128 (one partial: 352 = 2 x 128 + 96), column tiles of 32 and 128 (partial: 200, 8, 40, 2056, 576),
  // MoE widths.
  const std::pair<int64_t, int64_t> shapes[] = {{32, 8}, {96, 40}, {352, 200}, {128, 2048}, {64, 2056}, {256, 576}};
  uint32_t seed = 1;
  for (const auto& [M, K] : shapes) {
    const std::vector<bf16> x = test::mx_random_bf16(M, K, seed, /*nonfinite=*/seed % 2 == 1);
    for (HadamardTransform t : kAllTransforms)
      for (Rounding r : {Rounding::rne, Rounding::stochastic}) {
        const MxQuantConfig cfg = config(r, t, seed % 3 == 0 ? MxScaleMode::ceil : MxScaleMode::floor, seed);
        SCOPED_TRACE(testing::Message() << "M=" << M << " K=" << K << " transform=" << int(t) << " rounding="
                                        << int(r));
        expect_every_kernel_matches_ref(x, M, K, cfg);
      }
    ++seed;
  }
}

TEST(Bf16ToMxfp4ColGpu, RaggedMatchesReferenceAndWritesOnlyTheLayoutsExtent) {
  FP4MOE_REQUIRE_DEVICE();
  const std::vector<std::vector<int32_t>> splits = {
      {0, 0, 5, 37, 101, 134, 134},        // empty groups, sizes 5, 32, 64, 33
      {0, 300, 300, 301, 700},             // a group across several 128-token blocks, a group of one token
      {0, 256},                            // one group, a multiple of 128
  };
  uint32_t seed = 40;
  for (const auto& offsets : splits)
    for (int64_t K : {int64_t{16}, int64_t{200}}) {
      const int64_t G = static_cast<int64_t>(offsets.size()) - 1, M = offsets.back();
      const std::vector<bf16> x = test::mx_random_bf16(M, K, seed, seed % 2 == 0);
      const int64_t codes_n = mxfp4_col_codes_capacity(M, K, G), scales_n = mxfp4_col_scales_capacity(M, K, G);
      for (HadamardTransform t : kAllTransforms)
        for (Rounding r : {Rounding::rne, Rounding::stochastic}) {
          MxQuantConfig cfg = config(r, t, MxScaleMode::floor, seed);
          cfg.row_offset = 1000;
          SCOPED_TRACE(testing::Message() << "M=" << M << " G=" << G << " K=" << K << " transform=" << int(t)
                                          << " rounding=" << int(r));
          std::vector<uint8_t> codes(codes_n, test::kNanPoison), scales(scales_n, test::kNanPoison);
          const int64_t nonfinite =
              bf16_to_mxfp4_col_ragged_ref(x.data(), M, K, offsets.data(), G, codes.data(), scales.data(), cfg);
          for (detail::MxColKernel kernel : kAllKernels) {
            SCOPED_TRACE(testing::Message() << "kernel " << int(kernel));
            const ColRun got = run_gpu(x, M, K, offsets, codes_n, scales_n, cfg, true, kernel);
            EXPECT_EQ(got.codes, codes);  // the poison past the extent included
            EXPECT_EQ(got.scales, scales);
            EXPECT_EQ(got.nonfinite, nonfinite);
            EXPECT_TRUE(got.guards_intact);
          }
        }
      ++seed;
    }
}

// Two launches over row ranges with row_offset give the same codes as one launch over all rows (each launch's
// output is the [K, rows] transpose of its range).
TEST(Bf16ToMxfp4ColGpu, StochasticRoundingDoesNotDependOnTheLaunchSplit) {
  FP4MOE_REQUIRE_DEVICE();
  const int64_t M = 320, K = 72, M0 = 192;
  const std::vector<bf16> x = test::mx_random_bf16(M, K, 7);
  for (detail::MxColKernel kernel : kAllKernels)
    for (HadamardTransform t : {HadamardTransform::none, HadamardTransform::h32}) {
      MxQuantConfig cfg = config(Rounding::stochastic, t, MxScaleMode::floor, 7);
      const ColRun all = run_gpu(x, M, K, {}, M * K / 2, M * K / 32, cfg, true, kernel);
      const std::vector<bf16> top(x.begin(), x.begin() + M0 * K), bottom(x.begin() + M0 * K, x.end());
      const ColRun first = run_gpu(top, M0, K, {}, M0 * K / 2, M0 * K / 32, cfg, true, kernel);
      cfg.row_offset = M0;
      const ColRun second = run_gpu(bottom, M - M0, K, {}, (M - M0) * K / 2, (M - M0) * K / 32, cfg, true, kernel);
      for (int64_t k = 0; k < K; ++k) {
        for (int64_t j = 0; j < M / 2; ++j) {
          const uint8_t part =
              j < M0 / 2 ? first.codes[k * M0 / 2 + j] : second.codes[k * (M - M0) / 2 + j - M0 / 2];
          ASSERT_EQ(all.codes[k * M / 2 + j], part)
              << "kernel " << int(kernel) << " transform " << int(t) << " row of X^T " << k << " byte " << j;
        }
      }
    }
}

// More than 65535 token blocks: the register-tile kernel's slots run over the grid's y and z dimensions.
TEST(Bf16ToMxfp4ColGpu, MoreTokenBlocksThanOneGridDimensionHolds) {
  FP4MOE_REQUIRE_DEVICE();
  const int64_t M = 65536 * 128 + 96, K = 8;  // 65537 token blocks, the last one partial
  const std::vector<bf16> x = test::mx_random_bf16(M, K, 11);
  const MxQuantConfig cfg = config(Rounding::stochastic, HadamardTransform::none, MxScaleMode::floor, 11);
  expect_every_kernel_matches_ref(x, M, K, cfg);
}

// The block rule's edge cases along tokens, X [M, K] with M % 32 == 0, block n = (k, b) holding rows 32 b ..
// 32 b + 31 of column k: an amax exponent field n mod 255 (every block exponent, a subnormal amax included) with
// random magnitudes at or below it, the amax at a random row (the first in 1 block of 13), random signs; 1 block of
// 17 all zero (+0 and -0: scale 0, codes 0, no NaN); 1 of 19 with one NaN or Inf (scale 0xFF, codes 0, counted).
std::vector<bf16> edge_blocks(int64_t M, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<bf16> x(static_cast<size_t>(M * K));
  const uint16_t specials[] = {0x7FC0, 0xFFC1, 0x7F80, 0xFF80};  // NaN, -NaN, +Inf, -Inf
  for (int64_t k = 0; k < K; ++k)
    for (int64_t b = 0; b < M / 32; ++b) {
      const int64_t n = k * (M / 32) + b;
      const uint32_t amax_bits = static_cast<uint32_t>(n % 255) << 7 | (rng() & 0x7F);
      const uint32_t at = n % 13 == 0 ? 0 : rng() % 32;
      for (uint32_t i = 0; i < 32; ++i) {
        const uint32_t mag = n % 17 == 5 ? 0 : (i == at ? amax_bits : rng() % (amax_bits + 1));
        x[(b * 32 + i) * K + k] = bf16_from_bits(static_cast<uint16_t>(mag | (rng() & 1 ? 0x8000 : 0)));
      }
      if (n % 19 == 7) x[(b * 32 + rng() % 32) * K + k] = bf16_from_bits(specials[n % 4]);
    }
  return x;
}

TEST(Bf16ToMxfp4ColGpu, EdgeBlocksMatchReferenceInEveryKernelAndOption) {
  FP4MOE_REQUIRE_DEVICE();
  const int64_t K = 264;  // one full column tile of the block-per-thread kernel and a partial one
  const std::vector<int32_t> offsets = {0, 96, 96, 133, 160, 224};  // empty group; 37 and 27 tokens padded to 64, 32
  const int64_t M = offsets.back(), G = static_cast<int64_t>(offsets.size()) - 1;
  const std::vector<bf16> x = edge_blocks(M, K, 23);
  for (bool ragged : {false, true})
    for (MxScaleMode mode : {MxScaleMode::floor, MxScaleMode::ceil})
      for (HadamardTransform t : kAllTransforms)
        for (Rounding r : {Rounding::rne, Rounding::stochastic}) {
          const MxQuantConfig cfg = config(r, t, mode, 23);
          SCOPED_TRACE(testing::Message() << (ragged ? "ragged" : "dense") << " mode=" << int(mode)
                                          << " transform=" << int(t) << " rounding=" << int(r));
          const int64_t codes_n = ragged ? mxfp4_col_codes_capacity(M, K, G) : M * K / 2;
          const int64_t scales_n = ragged ? mxfp4_col_scales_capacity(M, K, G) : M * K / 32;
          std::vector<uint8_t> codes(codes_n, test::kNanPoison), scales(scales_n, test::kNanPoison);
          const int64_t nonfinite =
              ragged ? bf16_to_mxfp4_col_ragged_ref(x.data(), M, K, offsets.data(), G, codes.data(), scales.data(), cfg)
                     : bf16_to_mxfp4_col_ref(x.data(), M, K, codes.data(), scales.data(), cfg);
          EXPECT_GT(nonfinite, 0);
          for (detail::MxColKernel kernel : kAllKernels) {
            SCOPED_TRACE(testing::Message() << "kernel " << int(kernel));
            const ColRun got = run_gpu(x, M, K, ragged ? offsets : std::vector<int32_t>{}, codes_n, scales_n, cfg,
                                       true, kernel);
            EXPECT_EQ(got.codes, codes);
            EXPECT_EQ(got.scales, scales);
            EXPECT_EQ(got.nonfinite, nonfinite);
            EXPECT_TRUE(got.guards_intact);
          }
        }
}

// The row quantizer's fold and BF16x2-scaling edge blocks (test::mx_fold_edge_blocks) along tokens: block n in
// column n % 8, rows 32 (n / 8) .. 32 (n / 8) + 31. For the column kernels they are transforms whose FP32 sums leave
// BF16's range or fall to subnormals, tiny, NaN and Inf blocks, and columns of very different scales side by side
// in one BF16x2 word. Every kernel, both scale modes, both roundings, every transform.
TEST(Bf16ToMxfp4ColGpu, TransformAndScalingEdgeBlocksMatchReference) {
  FP4MOE_REQUIRE_DEVICE();
  const std::vector<bf16> blocks = test::mx_fold_edge_blocks();
  const int64_t K = 8, n = static_cast<int64_t>(blocks.size()) / 32, M = 32 * ((n + K - 1) / K);
  std::vector<bf16> x(static_cast<size_t>(M * K), bf16_from_bits(0x3F80));
  for (int64_t b = 0; b < n; ++b)
    for (int64_t i = 0; i < 32; ++i) x[(32 * (b / K) + i) * K + b % K] = blocks[32 * b + i];
  for (MxScaleMode mode : {MxScaleMode::floor, MxScaleMode::ceil})
    for (HadamardTransform t : kAllTransforms)
      for (Rounding r : {Rounding::rne, Rounding::stochastic}) {
        SCOPED_TRACE(testing::Message() << "mode=" << int(mode) << " transform=" << int(t) << " rounding=" << int(r));
        expect_every_kernel_matches_ref(x, M, K, config(r, t, mode, 31));
      }
}

TEST(Bf16ToMxfp4ColGpu, InvalidDeviceOffsetsWriteNothing) {
  FP4MOE_REQUIRE_DEVICE();
  const int64_t M = 64, K = 16;
  const std::vector<bf16> x = test::mx_random_bf16(M, K, 8);
  for (const std::vector<int32_t>& offsets : {std::vector<int32_t>{0, 40, 30, 64}, std::vector<int32_t>{0, 40, 60}}) {
    const int64_t G = static_cast<int64_t>(offsets.size()) - 1;
    const int64_t codes_n = mxfp4_col_codes_capacity(M, K, G), scales_n = mxfp4_col_scales_capacity(M, K, G);
    for (detail::MxColKernel kernel : kAllKernels) {
      const ColRun got = run_gpu(x, M, K, offsets, codes_n, scales_n, MxQuantConfig{}, /*pass_host_offsets=*/false,
                                 kernel);
      EXPECT_EQ(got.codes, std::vector<uint8_t>(codes_n, test::kNanPoison)) << "kernel " << int(kernel);
      EXPECT_EQ(got.scales, std::vector<uint8_t>(scales_n, test::kNanPoison)) << "kernel " << int(kernel);
      EXPECT_TRUE(got.guards_intact);
    }
  }
}

TEST(Bf16ToMxfp4ColGpu, RejectsBeforeAnyLaunch) {
  FP4MOE_REQUIRE_DEVICE();
  DeviceBuffer<bf16> x(64 * 64 + 8);
  DeviceBuffer<uint8_t> codes(64 * 64), scales(64 * 64);
  DeviceBuffer<int32_t> offsets(4);
  const MxQuantConfig cfg;
  EXPECT_THROW(bf16_to_mxfp4_col(x.ptr + 1, 64, 64, codes.ptr, scales.ptr, cfg, nullptr, nullptr), Error);
  EXPECT_THROW(bf16_to_mxfp4_col(x.ptr, 64, 64, codes.ptr + 4, scales.ptr, cfg, nullptr, nullptr), Error);
  EXPECT_THROW(bf16_to_mxfp4_col(x.ptr, 48, 64, codes.ptr, scales.ptr, cfg, nullptr, nullptr), Error);
  EXPECT_THROW(bf16_to_mxfp4_col(x.ptr, 64, 60, codes.ptr, scales.ptr, cfg, nullptr, nullptr), Error);
  const int32_t bad[] = {0, 10, 5, 64};
  EXPECT_THROW(bf16_to_mxfp4_col_ragged(x.ptr, 64, 64, offsets.ptr, 3, bad, codes.ptr, scales.ptr, cfg, nullptr,
                                        nullptr),
               Error);
  EXPECT_THROW(bf16_to_mxfp4_col_ragged(x.ptr, 64, 64, nullptr, 3, nullptr, codes.ptr, scales.ptr, cfg, nullptr,
                                        nullptr),
               Error);
  EXPECT_THROW(bf16_to_mxfp4_col_ragged(x.ptr, 64, 64, offsets.ptr, 1025, nullptr, codes.ptr, scales.ptr, cfg,
                                        nullptr, nullptr),
               Error);
  CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace fp4moe
