// GPU MXFP4 row kernels against their CPU references, bit for bit: bf16_to_mxfp4_row (codes, scales, NaN/Inf
// count; with each transform and rounding: mx_transform.h), mxfp4_to_bf16, mxfp4_row_to_fp8_row (codes and fp32
// scales, layout padding included) and the naive MXFP4 -> BF16 -> FP8 path. Seeded random data with outliers, tiny values, zero rows and NaN/Inf blocks; the
// shapes of the MoE layers (K = 2048, 7168, 576) and edge shapes (M = 1, K = 32, a short last 1x128 group,
// in_scales at an odd address, more 128-row tiles than one grid holds). Every output is poisoned before each run
// and surrounded by guard bytes that must stay untouched. Host-only tests (they run without a device) check the
// faster codecs of mx_fast_codecs.h, which bf16_to_mxfp4_row uses, against formats.h exhaustively.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "tests/common/gpu_test_util.h"
#include "tests/common/mx_test_util.h"
#include "kernels/common/check.h"
#include "kernels/common/types.h"
#include "kernels/formats/formats.h"
#include "kernels/quant/bf16_to_fp8.h"
#include "kernels/quant/bf16_to_mxfp4_row.h"
#include "kernels/quant/layouts.h"
#include "kernels/quant/mx_fast_codecs.h"
#include "kernels/quant/mxfp4_row_to_fp8_row.h"
#include "kernels/quant/mxfp4_to_bf16.h"

namespace fp4moe {
namespace {

using test::DeviceBuffer;

constexpr unsigned char kPoison = 0xA5;
const int64_t kRows[] = {1, 7, 128, 4099};
const int64_t kCols[] = {32, 96, 576, 2048, 7168};

// A device tensor of n elements with kGuard poisoned elements on each side (16-byte multiples, so the tensor
// keeps the allocation's alignment); guards_intact() tells whether a kernel wrote outside the tensor.
template <typename T>
struct Guarded {
  static constexpr size_t kGuard = 64;
  size_t n;
  DeviceBuffer<T> buf;
  explicit Guarded(size_t count) : n(count), buf(count + 2 * kGuard) { buf.poison(kPoison); }
  T* ptr() { return buf.ptr + kGuard; }
  void poison() { buf.poison(kPoison); }
  void upload(const std::vector<T>& h) {
    CUDA_CHECK(cudaMemcpy(ptr(), h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() {
    std::vector<T> h(n);
    if (n) CUDA_CHECK(cudaMemcpy(h.data(), ptr(), n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  bool guards_intact() {
    std::vector<T> all = buf.download();
    const auto* bytes = reinterpret_cast<const unsigned char*>(all.data());
    const size_t guard_bytes = kGuard * sizeof(T), total = all.size() * sizeof(T);
    for (size_t i = 0; i < guard_bytes; ++i)
      if (bytes[i] != kPoison || bytes[total - 1 - i] != kPoison) return false;
    return true;
  }
};

std::vector<uint16_t> bits_of(const std::vector<bf16>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = bf16_bits(v[i]);
  return b;
}

// Index of the first difference, or -1.
template <typename T>
int64_t first_mismatch(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return static_cast<int64_t>(i);
  return -1;
}

// Activation-like BF16 [M, K]: N(0, 1) with a few outliers (x1e4), some tiny values (down to BF16 subnormals),
// an all-zero row (row 3, when it exists), and NaN/Inf in a few blocks when `nonfinite` is set.
std::vector<bf16> activations(int64_t M, int64_t K, uint32_t seed, bool nonfinite) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> pct(0, 9999);
  std::vector<bf16> x(M * K);
  for (int64_t i = 0; i < M * K; ++i) {
    float v = normal(rng);
    const int r = pct(rng);
    if (r < 5) v *= 1e4f;
    else if (r < 10) v *= 1e-30f;
    else if (r < 12) v *= 1e-39f;  // subnormal
    else if (r < 14) v = -0.0f;
    x[i] = bf16_from_bits(f32_to_bf16_bits(v));
  }
  if (M > 3)
    for (int64_t k = 0; k < K; ++k) x[3 * K + k] = bf16_from_bits(k % 2 ? 0x8000 : 0x0000);
  if (nonfinite) {
    const uint16_t specials[] = {0x7FC0, 0xFFC1, 0x7F80, 0xFF80};  // NaN, -NaN, +Inf, -Inf
    for (int j = 0; j < 5; ++j) x[rng() % (M * K)] = bf16_from_bits(specials[j % 4]);
  }
  return x;
}

// Runs `f`, expects fp4moe::Error with every one of `parts` in its message.
void expect_error_mentions(const std::function<void()>& f, std::initializer_list<const char*> parts) {
  try {
    f();
    ADD_FAILURE() << "expected fp4moe::Error";
  } catch (const Error& e) {
    for (const char* p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

// ---- BF16 -> MXFP4 --------------------------------------------------------------------------------------------

struct QuantRun {
  std::vector<uint8_t> codes, scales;
  unsigned long long nonfinite = 0;
  bool guards_intact = false;
};

QuantRun quantize_on_gpu(const std::vector<bf16>& x, int64_t M, int64_t K, const MxQuantConfig& cfg,
                         detail::MxRowKernel kernel) {
  Guarded<bf16> dx(M * K);
  Guarded<uint8_t> codes(M * K / 2), scales(M * K / 32);
  DeviceBuffer<unsigned long long> counter(1);
  dx.upload(x);
  CUDA_CHECK(cudaMemset(counter.ptr, 0, sizeof(unsigned long long)));
  detail::bf16_to_mxfp4_row_using(kernel, dx.ptr(), M, K, codes.ptr(), scales.ptr(), cfg, counter.ptr, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  QuantRun r{codes.download(), scales.download(), counter.download()[0], codes.guards_intact() && scales.guards_intact()};
  return r;
}

// Both kernels behind bf16_to_mxfp4_row (bf16_to_mxfp4_row.h detail::MxRowKernel): they must agree bit for bit
// (codes, scales, NaN/Inf count, untouched guards); the block-per-thread kernel's run is returned for the caller's
// comparison with the reference.
QuantRun quantize_on_gpu(const std::vector<bf16>& x, int64_t M, int64_t K, const MxQuantConfig& cfg) {
  const QuantRun lanes = quantize_on_gpu(x, M, K, cfg, detail::MxRowKernel::chunk_per_lane);
  const QuantRun blocks = quantize_on_gpu(x, M, K, cfg, detail::MxRowKernel::block_per_thread);
  EXPECT_EQ(first_mismatch(lanes.codes, blocks.codes), -1) << "the two row kernels' codes differ";
  EXPECT_EQ(first_mismatch(lanes.scales, blocks.scales), -1) << "the two row kernels' scales differ";
  EXPECT_EQ(lanes.nonfinite, blocks.nonfinite);
  EXPECT_TRUE(lanes.guards_intact);
  return blocks;
}

TEST(Bf16ToMxfp4RowGpu, MatchesReferenceBitForBit) {
  FP4MOE_REQUIRE_DEVICE();
  uint32_t seed = 1;
  for (int64_t M : kRows) {
    for (int64_t K : kCols) {
      const bool nonfinite = (M * K) % 3 != 1;
      const std::vector<bf16> x = activations(M, K, seed++, nonfinite);
      for (auto mode : {MxScaleMode::floor, MxScaleMode::ceil}) {
        for (auto rounding : {Rounding::rne, Rounding::stochastic}) {
          MxQuantConfig cfg;
          cfg.scale_mode = mode;
          cfg.rounding = rounding;
          cfg.seed = 0x5EED0000ull + seed;
          SCOPED_TRACE(testing::Message() << "M=" << M << " K=" << K << " mode=" << int(mode) << " rounding="
                                          << int(rounding));
          std::vector<uint8_t> ref_codes(M * K / 2, kPoison), ref_scales(M * K / 32, kPoison);
          const int64_t ref_nonfinite = bf16_to_mxfp4_row_ref(x.data(), M, K, ref_codes.data(), ref_scales.data(), cfg);
          const QuantRun got = quantize_on_gpu(x, M, K, cfg);
          EXPECT_EQ(first_mismatch(got.codes, ref_codes), -1);
          EXPECT_EQ(first_mismatch(got.scales, ref_scales), -1);
          EXPECT_EQ(static_cast<int64_t>(got.nonfinite), ref_nonfinite);
          if (nonfinite) {
            EXPECT_GT(ref_nonfinite, 0);
          }
          EXPECT_TRUE(got.guards_intact);
        }
      }
    }
  }
}

// With a transform (h16, h32, rht) and either rounding: the butterflies across lanes, the random signs at every
// column, the rounding of the transformed values to BF16, the last partial tile. Row 3 is all zero (no NaN may
// come of it).
TEST(Bf16ToMxfp4RowGpu, TransformsMatchReferenceBitForBit) {
  FP4MOE_REQUIRE_DEVICE();
  uint32_t seed = 100;
  for (int64_t M : kRows) {
    for (int64_t K : {int64_t{32}, int64_t{96}, int64_t{576}, int64_t{2048}}) {
      const bool nonfinite = (M * K) % 3 != 1;
      const std::vector<bf16> x = activations(M, K, seed++, nonfinite);
      bool zero_row_3 = M > 3;  // unless a NaN/Inf landed there
      for (int64_t k = 0; zero_row_3 && k < K; ++k) zero_row_3 = (bf16_bits(x[3 * K + k]) & 0x7FFF) == 0;
      for (auto transform : {HadamardTransform::h16, HadamardTransform::h32, HadamardTransform::rht}) {
        for (auto rounding : {Rounding::rne, Rounding::stochastic}) {
          MxQuantConfig cfg;
          cfg.scale_mode = seed % 2 ? MxScaleMode::floor : MxScaleMode::ceil;
          cfg.rounding = rounding;
          cfg.seed = 0xABC00000ull + seed;
          cfg.transform = transform;
          cfg.rht_seed = 0x77700000ull + seed;  // a fresh seed per run, as per training step
          SCOPED_TRACE(testing::Message() << "M=" << M << " K=" << K << " transform=" << int(transform)
                                          << " rounding=" << int(rounding) << " mode=" << int(cfg.scale_mode));
          std::vector<uint8_t> ref_codes(M * K / 2, kPoison), ref_scales(M * K / 32, kPoison);
          const int64_t ref_nonfinite = bf16_to_mxfp4_row_ref(x.data(), M, K, ref_codes.data(), ref_scales.data(), cfg);
          const QuantRun got = quantize_on_gpu(x, M, K, cfg);
          EXPECT_EQ(first_mismatch(got.codes, ref_codes), -1);
          EXPECT_EQ(first_mismatch(got.scales, ref_scales), -1);
          EXPECT_EQ(static_cast<int64_t>(got.nonfinite), ref_nonfinite);
          EXPECT_TRUE(got.guards_intact);
          if (zero_row_3) {
            for (int64_t b = 3 * K / 32; b < 4 * K / 32; ++b) EXPECT_EQ(got.scales[b], 0) << "zero row, block " << b;
          }
        }
      }
    }
  }
}

TEST(Bf16ToMxfp4RowGpu, AllZeroTensorWithEveryOptionGivesZeroCodesAndScales) {
  FP4MOE_REQUIRE_DEVICE();
  const int64_t M = 129, K = 160;
  std::vector<bf16> x(M * K);
  for (int64_t i = 0; i < M * K; ++i) x[i] = bf16_from_bits(i % 3 ? 0x0000 : 0x8000);  // +-0
  for (auto transform : {HadamardTransform::none, HadamardTransform::h16, HadamardTransform::h32,
                         HadamardTransform::rht})
    for (auto rounding : {Rounding::rne, Rounding::stochastic}) {
      MxQuantConfig cfg;
      cfg.rounding = rounding;
      cfg.transform = transform;
      const QuantRun got = quantize_on_gpu(x, M, K, cfg);
      EXPECT_EQ(got.nonfinite, 0u);
      EXPECT_EQ(got.codes, std::vector<uint8_t>(M * K / 2, 0)) << int(transform) << " " << int(rounding);
      EXPECT_EQ(got.scales, std::vector<uint8_t>(M * K / 32, 0)) << int(transform) << " " << int(rounding);
      EXPECT_TRUE(got.guards_intact);
    }
}

// Blocks over the whole BF16 range: row r's first element has exponent field r % 255 (so every block exponent
// from -127 to 126 occurs, subnormal amax included), the others are random magnitudes at or below it, any sign.
TEST(Bf16ToMxfp4RowGpu, EveryBlockExponentAndMagnitudeMatchesReference) {
  FP4MOE_REQUIRE_DEVICE();
  const int64_t M = 255 * 8, K = 64;
  std::mt19937 rng(17);
  std::vector<bf16> x(M * K);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t b = 0; b < K / 32; ++b) {
      const uint32_t amax_bits = ((m % 255) << 7) | (rng() & 0x7F);
      for (int i = 0; i < 32; ++i) {
        const uint32_t mag = i == 0 ? amax_bits : rng() % (amax_bits + 1);
        x[m * K + b * 32 + i] = bf16_from_bits(static_cast<uint16_t>(mag | (rng() & 1 ? 0x8000 : 0)));
      }
    }
  }
  for (auto mode : {MxScaleMode::floor, MxScaleMode::ceil}) {
    for (auto rounding : {Rounding::rne, Rounding::stochastic}) {
      for (auto transform : {HadamardTransform::none, HadamardTransform::h16, HadamardTransform::h32,
                             HadamardTransform::rht}) {
        MxQuantConfig cfg;
        cfg.scale_mode = mode;
        cfg.rounding = rounding;
        cfg.seed = 31;
        cfg.transform = transform;
        cfg.rht_seed = 32;
        SCOPED_TRACE(testing::Message() << "mode=" << int(mode) << " rounding=" << int(rounding)
                                        << " transform=" << int(transform));
        std::vector<uint8_t> ref_codes(M * K / 2), ref_scales(M * K / 32);
        // A transform may push a block near the top of the range past FP32 (a NaN/Inf block, counted alike).
        const int64_t ref_nonfinite = bf16_to_mxfp4_row_ref(x.data(), M, K, ref_codes.data(), ref_scales.data(), cfg);
        if (transform == HadamardTransform::none) {
          EXPECT_EQ(ref_nonfinite, 0);
        }
        const QuantRun got = quantize_on_gpu(x, M, K, cfg);
        EXPECT_EQ(first_mismatch(got.codes, ref_codes), -1);
        EXPECT_EQ(first_mismatch(got.scales, ref_scales), -1);
        EXPECT_EQ(static_cast<int64_t>(got.nonfinite), ref_nonfinite);
        EXPECT_TRUE(got.guards_intact);
      }
    }
  }
}

// Every BF16 magnitude at every normal block exponent, both signs: for e in [-127, 125] the blocks hold the amax
// 2^(e+2) (block exponent e under the floor rule) and then every magnitude below 2^(e+3), 31 per block, so every
// product the RNE encoder forms on the device occurs (each tie included); ceil blocks as the rule makes them.
// Stochastic rounding too: its BF16x2 scaling by 2^(16 - e) for e >= -111 (products that are FP32 or BF16
// subnormals, or vanish, at every exponent) and its FP32 scaling below.
TEST(Bf16ToMxfp4RowGpu, EveryMagnitudeAtEveryBlockExponentMatchesReference) {
  FP4MOE_REQUIRE_DEVICE();
  std::vector<bf16> x;
  for (int e = -127; e <= 125; ++e) {
    const uint32_t amax_bits = static_cast<uint32_t>(e + 2 + kUE8M0Bias) << 7;  // 2^(e+2), biased exponent >= 2
    const uint32_t below = amax_bits + 0x80u;                                  // magnitudes below 2^(e+3)
    for (uint32_t h = 0; h < below;) {
      x.push_back(bf16_from_bits(static_cast<uint16_t>(amax_bits)));
      for (int i = 1; i < 32; ++i, ++h)
        x.push_back(bf16_from_bits(static_cast<uint16_t>((h < below ? h : 0u) | ((h & 1u) << 15))));
    }
  }
  const int64_t K = 1024, M = (static_cast<int64_t>(x.size()) + K - 1) / K;
  x.resize(static_cast<size_t>(M * K), bf16_from_bits(0));
  for (auto mode : {MxScaleMode::floor, MxScaleMode::ceil}) {
    for (auto rounding : {Rounding::rne, Rounding::stochastic}) {
      MxQuantConfig cfg;
      cfg.scale_mode = mode;
      cfg.rounding = rounding;
      cfg.seed = 0x5A5A;
      SCOPED_TRACE(testing::Message() << "mode=" << int(mode) << " rounding=" << int(rounding) << " M=" << M);
      std::vector<uint8_t> ref_codes(M * K / 2, kPoison), ref_scales(M * K / 32, kPoison);
      EXPECT_EQ(bf16_to_mxfp4_row_ref(x.data(), M, K, ref_codes.data(), ref_scales.data(), cfg), 0);
      const QuantRun got = quantize_on_gpu(x, M, K, cfg);
      EXPECT_EQ(first_mismatch(got.codes, ref_codes), -1);
      EXPECT_EQ(first_mismatch(got.scales, ref_scales), -1);
      EXPECT_TRUE(got.guards_intact);
    }
  }
}

// The edges of the folded 1/4 of h16 and rht under RNE and of the BF16x2 scaling of stochastic rounding
// (test::mx_fold_edge_blocks) along rows (48 rows of 256; a partial last row would be filled with ones). Both scale
// modes, both roundings, every transform.
TEST(Bf16ToMxfp4RowGpu, FoldedScaleAndScaledSrEdgesMatchReference) {
  FP4MOE_REQUIRE_DEVICE();
  const int64_t K = 32 * 8;
  std::vector<bf16> x = test::mx_fold_edge_blocks();
  const int64_t M = (static_cast<int64_t>(x.size()) + K - 1) / K;
  x.resize(static_cast<size_t>(M * K), bf16_from_bits(0x3F80));
  for (auto mode : {MxScaleMode::floor, MxScaleMode::ceil}) {
    for (auto rounding : {Rounding::rne, Rounding::stochastic}) {
      for (auto transform : {HadamardTransform::none, HadamardTransform::h16, HadamardTransform::h32,
                             HadamardTransform::rht}) {
        for (uint64_t seed : {uint64_t{1}, uint64_t{2}, uint64_t{3}}) {
          MxQuantConfig cfg;
          cfg.scale_mode = mode;
          cfg.rounding = rounding;
          cfg.transform = transform;
          cfg.seed = 0xD0D0 + seed;
          cfg.rht_seed = 0xE0E0 + seed;
          SCOPED_TRACE(testing::Message() << "mode=" << int(mode) << " rounding=" << int(rounding)
                                          << " transform=" << int(transform) << " seed=" << seed);
          std::vector<uint8_t> ref_codes(M * K / 2, kPoison), ref_scales(M * K / 32, kPoison);
          const int64_t ref_nonfinite =
              bf16_to_mxfp4_row_ref(x.data(), M, K, ref_codes.data(), ref_scales.data(), cfg);
          EXPECT_GT(ref_nonfinite, 0);
          const QuantRun got = quantize_on_gpu(x, M, K, cfg);
          const int64_t at = first_mismatch(got.codes, ref_codes);
          EXPECT_EQ(at, -1) << "block " << (at < 0 ? -1 : at / 16);
          const int64_t at_scale = first_mismatch(got.scales, ref_scales);
          EXPECT_EQ(at_scale, -1) << "block " << at_scale;
          EXPECT_EQ(static_cast<int64_t>(got.nonfinite), ref_nonfinite);
          EXPECT_TRUE(got.guards_intact);
        }
      }
    }
  }
}

TEST(Bf16ToMxfp4RowGpu, RowRangesWithRowOffsetMatchOneLaunch) {
  FP4MOE_REQUIRE_DEVICE();
  const int64_t M = 4099, K = 576, r0 = 1500;  // halves of different sizes, pointer offsets into one tensor
  const std::vector<bf16> x = activations(M, K, 77, true);
  for (auto [rounding, transform] : {std::pair{Rounding::rne, HadamardTransform::none},
                                     std::pair{Rounding::stochastic, HadamardTransform::none},
                                     std::pair{Rounding::stochastic, HadamardTransform::rht},
                                     std::pair{Rounding::stochastic, HadamardTransform::h32}}) {
    MxQuantConfig cfg;
    cfg.rounding = rounding;
    cfg.seed = 4242;
    cfg.transform = transform;
    cfg.rht_seed = 99;
    std::vector<uint8_t> ref_codes(M * K / 2), ref_scales(M * K / 32);
    const int64_t ref_nonfinite = bf16_to_mxfp4_row_ref(x.data(), M, K, ref_codes.data(), ref_scales.data(), cfg);

    SCOPED_TRACE(testing::Message() << "rounding " << int(rounding) << " transform " << int(transform));
    Guarded<bf16> dx(M * K);
    Guarded<uint8_t> codes(M * K / 2), scales(M * K / 32);
    DeviceBuffer<unsigned long long> counter(1);
    dx.upload(x);
    CUDA_CHECK(cudaMemset(counter.ptr, 0, sizeof(unsigned long long)));
    MxQuantConfig first = cfg, second = cfg;
    second.row_offset = r0;
    bf16_to_mxfp4_row(dx.ptr(), r0, K, codes.ptr(), scales.ptr(), first, counter.ptr, nullptr);
    bf16_to_mxfp4_row(dx.ptr() + r0 * K, M - r0, K, codes.ptr() + r0 * K / 2, scales.ptr() + r0 * K / 32, second,
                      counter.ptr, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(first_mismatch(codes.download(), ref_codes), -1);
    EXPECT_EQ(first_mismatch(scales.download(), ref_scales), -1);
    EXPECT_EQ(static_cast<int64_t>(counter.download()[0]), ref_nonfinite);
    EXPECT_TRUE(codes.guards_intact() && scales.guards_intact());
  }
}

TEST(Bf16ToMxfp4RowGpu, NonFiniteBlocksAreCountedOncePerBlock) {
  FP4MOE_REQUIRE_DEVICE();
  const int64_t M = 7, K = 96;
  std::vector<bf16> x = activations(M, K, 9, false);
  x[0] = bf16_from_bits(0x7FC0);    // block 0: one NaN ...
  x[1] = bf16_from_bits(0x7F80);    // ... and an Inf: still one block
  x[5 * K + 64] = bf16_from_bits(0xFF80);  // row 5, block 2
  const QuantRun got = quantize_on_gpu(x, M, K, {});
  EXPECT_EQ(got.nonfinite, 2u);
  EXPECT_EQ(got.scales[0], kUE8M0NaN);
  EXPECT_EQ(got.scales[5 * 3 + 2], kUE8M0NaN);
  EXPECT_NE(got.scales[1], kUE8M0NaN);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(got.codes[i], 0) << i;
  for (int64_t i = 0; i < M * 3; ++i)
    if (i != 0 && i != 17) {
      EXPECT_NE(got.scales[i], kUE8M0NaN) << "block " << i;
    }
}

TEST(Bf16ToMxfp4RowGpu, EmptyTensorLaunchesNothing) {
  FP4MOE_REQUIRE_DEVICE();
  DeviceBuffer<unsigned long long> counter(1);
  CUDA_CHECK(cudaMemset(counter.ptr, 0, sizeof(unsigned long long)));
  EXPECT_NO_THROW(bf16_to_mxfp4_row(nullptr, 0, 7168, nullptr, nullptr, {}, counter.ptr, nullptr));
  EXPECT_NO_THROW(mxfp4_to_bf16(nullptr, nullptr, 0, 32, nullptr, nullptr));
  EXPECT_NO_THROW(mxfp4_row_to_fp8_row(nullptr, nullptr, 0, 96, nullptr, nullptr, nullptr));
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(counter.download()[0], 0u);
}

TEST(Bf16ToMxfp4RowGpu, RejectsBadArgumentsBeforeLaunch) {
  FP4MOE_REQUIRE_DEVICE();
  const int64_t M = 4, K = 64;
  Guarded<bf16> x(M * K + 16);
  Guarded<uint8_t> codes(M * K / 2 + 16), scales(M * K / 32);
  x.upload(activations(1, M * K + 16, 3, false));
  auto run = [&](const bf16* px, int64_t m, int64_t k, uint8_t* pc, MxQuantConfig cfg) {
    return [=, &scales] { bf16_to_mxfp4_row(px, m, k, pc, scales.ptr(), cfg, nullptr, nullptr); };
  };
  expect_error_mentions(run(x.ptr(), M, 48, codes.ptr(), {}), {"bf16_to_mxfp4_row", "multiple of 32", "[4, 48]"});
  expect_error_mentions(run(x.ptr(), -1, K, codes.ptr(), {}), {"M must be >= 0", "[-1, 64]"});
  expect_error_mentions(run(x.ptr(), M, 0, codes.ptr(), {}), {"[4, 0]"});
  expect_error_mentions(run(nullptr, M, K, codes.ptr(), {}), {"x is null"});
  expect_error_mentions(run(x.ptr() + 1, M, K, codes.ptr(), {}), {"x must be 16-byte aligned"});
  expect_error_mentions(run(x.ptr(), M, K, codes.ptr() + 4, {}), {"codes must be 16-byte aligned"});
  MxQuantConfig bad;
  bad.rounding = static_cast<Rounding>(3);
  expect_error_mentions(run(x.ptr(), M, K, codes.ptr(), bad), {"unknown rounding 3"});
  bad = {};
  bad.row_offset = -1;
  expect_error_mentions(run(x.ptr(), M, K, codes.ptr(), bad), {"row_offset"});
  bad = {};
  bad.transform = static_cast<HadamardTransform>(9);
  expect_error_mentions(run(x.ptr(), M, K, codes.ptr(), bad), {"unknown transform 9"});
  bad.transform = HadamardTransform::rht;
  expect_error_mentions(run(x.ptr(), 1, (int64_t{1} << 30) + 32, codes.ptr(), bad), {"rht takes K <= 2^30"});
  CUDA_CHECK(cudaDeviceSynchronize());
  for (uint8_t b : codes.download()) ASSERT_EQ(b, kPoison) << "a rejected call launched";
  for (uint8_t b : scales.download()) ASSERT_EQ(b, kPoison) << "a rejected call launched";
}

// ---- faster codecs of the quantizer (host, no device needed) ---------------------------------------------------

// e2m1_pair_rne_bf16x2 against f32_to_e2m1_rne on every element the quantizer encodes: every finite BF16 value
// (both signs, subnormals and -0 included) at every block exponent e in [-127, 126] that keeps |v| 2^-e below 8,
// paired with a second value so that both halves are checked, and every tie and its neighbours.
TEST(MxFastCodecs, E2m1PairByBf16AddMatchesRoundToNearestEven) {
  int64_t checked = 0, mismatches = 0;
  for (int e = -127; e <= 126; ++e) {
    const __nv_bfloat162 inv2 = __float2bfloat162_rn(exp2_exact(-e));
    const float scale = exp2_exact(-e);
    for (uint32_t h = 0; h < 0x7F80u; ++h) {
      if (!(bf16_bits_to_f32(static_cast<uint16_t>(h)) * scale < 8.0f)) break;  // magnitudes ascend with h
      const uint32_t lo = h | ((h & 1u) << 15), hi = (h * 7u) % (h + 1u) | ((h & 2u) << 14);  // hi <= h: in range
      const uint32_t got = detail::e2m1_pair_rne_bf16x2(lo | (hi << 16), inv2);
      const uint32_t want_lo = f32_to_e2m1_rne(bf16_bits_to_f32(static_cast<uint16_t>(lo)) * scale);
      const uint32_t want_hi = f32_to_e2m1_rne(bf16_bits_to_f32(static_cast<uint16_t>(hi)) * scale);
      checked += 2;
      if (((got & 0xFu) != want_lo || ((got >> 16) & 0xFu) != want_hi || (got & 0xFFF0FFF0u) != 0) &&
          mismatches++ < 5)
        ADD_FAILURE() << "e " << e << " bf16 bits 0x" << std::hex << lo << ", 0x" << hi << ": got 0x" << got;
    }
  }
  for (float tie : {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f, 7.0f}) {
    for (float a : {std::nextafter(tie, 0.0f), tie, std::nextafter(tie, 8.0f)}) {
      const uint32_t bits = f32_to_bf16_bits(a);  // the BF16 nearest a (the value itself at a tie)
      const float v = bf16_bits_to_f32(static_cast<uint16_t>(bits));
      if (!(v < 8.0f)) continue;
      ++checked;
      EXPECT_EQ(detail::e2m1_pair_rne_bf16x2(bits, __float2bfloat162_rn(1.0f)) & 0xFu, f32_to_e2m1_rne(v)) << v;
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << checked;
  EXPECT_GT(checked, 4000000);
}

// ---- MXFP4 -> BF16 --------------------------------------------------------------------------------------------

// Random packed codes and scale bytes: mostly near 127, with every special byte (0, 1, 2, 252..255) present.
void random_mxfp4(int64_t M, int64_t K, uint32_t seed, std::vector<uint8_t>& codes, std::vector<uint8_t>& scales) {
  std::mt19937 rng(seed);
  codes.resize(M * K / 2);
  scales.resize(M * K / 32);
  for (auto& c : codes) c = static_cast<uint8_t>(rng());
  const uint8_t specials[] = {0, 1, 2, 252, 253, 254, 255};
  for (size_t i = 0; i < scales.size(); ++i) {
    const uint32_t r = rng() % 100;
    scales[i] = r < 7 ? specials[r] : r < 10 ? static_cast<uint8_t>(rng() % 255) : static_cast<uint8_t>(100 + rng() % 50);
  }
}

std::vector<uint16_t> dequantize_on_gpu(const std::vector<uint8_t>& codes, const std::vector<uint8_t>& scales,
                                        int64_t M, int64_t K, bool* guards_intact) {
  Guarded<uint8_t> dc(codes.size()), ds(scales.size());
  Guarded<bf16> y(M * K);
  dc.upload(codes);
  ds.upload(scales);
  mxfp4_to_bf16(dc.ptr(), ds.ptr(), M, K, y.ptr(), nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  *guards_intact = y.guards_intact();
  return bits_of(y.download());
}

TEST(Mxfp4ToBf16Gpu, EveryCodeAndScaleByteMatchesReference) {
  FP4MOE_REQUIRE_DEVICE();
  const int64_t M = 256, K = 32;  // row m: scale byte m, the 16 codes twice
  std::vector<uint8_t> codes(M * K / 2), scales(M);
  for (int64_t m = 0; m < M; ++m) {
    scales[m] = static_cast<uint8_t>(m);
    for (int i = 0; i < 16; ++i) codes[m * 16 + i] = static_cast<uint8_t>((2 * i % 16) | ((2 * i + 1) % 16) << 4);
  }
  std::vector<bf16> ref(M * K);
  mxfp4_to_bf16_ref(codes.data(), scales.data(), M, K, ref.data());
  bool guards = false;
  EXPECT_EQ(first_mismatch(dequantize_on_gpu(codes, scales, M, K, &guards), bits_of(ref)), -1);
  EXPECT_TRUE(guards);
}

TEST(Mxfp4ToBf16Gpu, MatchesReferenceBitForBit) {
  FP4MOE_REQUIRE_DEVICE();
  uint32_t seed = 100;
  for (int64_t M : kRows) {
    for (int64_t K : kCols) {
      SCOPED_TRACE(testing::Message() << "M=" << M << " K=" << K);
      std::vector<uint8_t> codes, scales;
      random_mxfp4(M, K, seed++, codes, scales);
      std::vector<bf16> ref(M * K);
      mxfp4_to_bf16_ref(codes.data(), scales.data(), M, K, ref.data());
      bool guards = false;
      EXPECT_EQ(first_mismatch(dequantize_on_gpu(codes, scales, M, K, &guards), bits_of(ref)), -1);
      EXPECT_TRUE(guards);
    }
  }
}

TEST(Mxfp4ToBf16Gpu, RejectsBadArgumentsBeforeLaunch) {
  FP4MOE_REQUIRE_DEVICE();
  Guarded<uint8_t> codes(256), scales(16);
  Guarded<bf16> y(512);
  expect_error_mentions([&] { mxfp4_to_bf16(codes.ptr(), scales.ptr(), 2, 80, y.ptr(), nullptr); },
                        {"mxfp4_to_bf16", "multiple of 32", "[2, 80]"});
  expect_error_mentions([&] { mxfp4_to_bf16(codes.ptr(), scales.ptr(), -3, 64, y.ptr(), nullptr); }, {"[-3, 64]"});
  expect_error_mentions([&] { mxfp4_to_bf16(codes.ptr() + 8, scales.ptr(), 2, 64, y.ptr(), nullptr); },
                        {"codes must be 16-byte aligned"});
  expect_error_mentions([&] { mxfp4_to_bf16(codes.ptr(), nullptr, 2, 64, y.ptr(), nullptr); }, {"scales is null"});
  expect_error_mentions([&] { mxfp4_to_bf16(codes.ptr(), scales.ptr(), 2, 64, y.ptr() + 4, nullptr); },
                        {"y must be 16-byte aligned"});
  CUDA_CHECK(cudaDeviceSynchronize());
  for (bf16 v : y.download()) ASSERT_EQ(bf16_bits(v), 0xA5A5) << "a rejected call launched";
}

// ---- direct MXFP4 -> FP8 row ----------------------------------------------------------------------------------

struct Fp8Run {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  bool guards_intact = false;
};

// scale_shift: in_scales placed that many bytes past an aligned address (the kernels accept any alignment).
Fp8Run direct_on_gpu(const std::vector<uint8_t>& codes, const std::vector<uint8_t>& scales, int64_t M, int64_t K,
                     int scale_shift) {
  Guarded<uint8_t> dc(codes.size()), ds(scales.size() + scale_shift), out(M * K);
  Guarded<float> out_scales(fp8_row_scale_count(M, K));
  dc.upload(codes);
  CUDA_CHECK(cudaMemcpy(ds.ptr() + scale_shift, scales.data(), scales.size(), cudaMemcpyHostToDevice));
  mxfp4_row_to_fp8_row(dc.ptr(), ds.ptr() + scale_shift, M, K, out.ptr(), out_scales.ptr(), nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  return {out.download(), out_scales.download(), out.guards_intact() && out_scales.guards_intact()};
}

void expect_direct_matches_reference(const std::vector<uint8_t>& codes, const std::vector<uint8_t>& scales,
                                     int64_t M, int64_t K) {
  std::vector<uint8_t> ref_codes(M * K, kPoison);
  std::vector<float> ref_scales(fp8_row_scale_count(M, K), -1.0f);
  mxfp4_row_to_fp8_row_ref(codes.data(), scales.data(), M, K, ref_codes.data(), ref_scales.data());
  for (int scale_shift : {0, 1}) {  // aligned scale words, and byte loads only
    SCOPED_TRACE(testing::Message() << "in_scales + " << scale_shift);
    const Fp8Run got = direct_on_gpu(codes, scales, M, K, scale_shift);
    EXPECT_EQ(first_mismatch(got.codes, ref_codes), -1);
    EXPECT_EQ(first_mismatch(got.scales, ref_scales), -1);  // layout padding (1.0) included
    EXPECT_TRUE(got.guards_intact);
  }
}

TEST(Mxfp4RowToFp8RowGpu, MatchesReferenceOnQuantizedActivations) {
  FP4MOE_REQUIRE_DEVICE();
  uint32_t seed = 200;
  for (int64_t M : kRows) {
    for (int64_t K : kCols) {
      SCOPED_TRACE(testing::Message() << "M=" << M << " K=" << K);
      const std::vector<bf16> x = activations(M, K, seed++, true);
      std::vector<uint8_t> codes(M * K / 2), scales(M * K / 32);
      bf16_to_mxfp4_row_ref(x.data(), M, K, codes.data(), scales.data(), {});
      expect_direct_matches_reference(codes, scales, M, K);
    }
  }
}

TEST(Mxfp4RowToFp8RowGpu, MatchesReferenceOnRandomCodesAndScales) {
  FP4MOE_REQUIRE_DEVICE();
  uint32_t seed = 300;
  for (int64_t M : kRows) {
    for (int64_t K : kCols) {
      SCOPED_TRACE(testing::Message() << "M=" << M << " K=" << K);
      std::vector<uint8_t> codes, scales;
      random_mxfp4(M, K, seed++, codes, scales);  // spreads up to 254 inside a group, NaN blocks
      expect_direct_matches_reference(codes, scales, M, K);
    }
  }
}

TEST(Mxfp4RowToFp8RowGpu, EveryCodeAtEverySpread) {
  FP4MOE_REQUIRE_DEVICE();
  // Row r: group maximum byte emax in block 0, block 1 `spread` below it with the 16 codes twice, a NaN block
  // and a zero block; K = 128 + 96 gives a full and a short group.
  const int64_t K = 224;
  std::vector<uint8_t> codes, scales;
  int64_t M = 0;
  for (int emax : {254, 200, 127, 20, 6, 0}) {
    for (int spread = 0; spread <= emax && spread <= 60; ++spread, ++M) {
      const uint8_t hi = static_cast<uint8_t>(emax), lo = static_cast<uint8_t>(emax - spread);
      const uint8_t row_scales[7] = {hi, lo, 0xFF, 0, lo, hi, lo};
      scales.insert(scales.end(), row_scales, row_scales + 7);
      for (int b = 0; b < 7; ++b)
        for (int i = 0; i < 16; ++i)
          codes.push_back(b == 3 ? 0 : static_cast<uint8_t>((2 * i + b) % 16 | ((2 * i + 1 + b) % 16) << 4));
    }
  }
  expect_direct_matches_reference(codes, scales, M, K);
}

// More 128-row tiles than the grid's y dimension holds (65535): thread blocks take a second tile 65535 tiles on.
// M % 4 == 3, so the scale layout's padding row lies in such a tile; K = 32 is one short group per row.
TEST(Mxfp4RowToFp8RowGpu, MoreRowTilesThanTheGridHolds) {
  FP4MOE_REQUIRE_DEVICE();
  const int64_t M = (int64_t{65535} + 1000) * 128 + 7, K = 32;
  std::vector<uint8_t> codes, scales;
  random_mxfp4(M, K, 500, codes, scales);
  expect_direct_matches_reference(codes, scales, M, K);
}

TEST(Mxfp4RowToFp8RowGpu, RejectsBadArgumentsBeforeLaunch) {
  FP4MOE_REQUIRE_DEVICE();
  Guarded<uint8_t> codes(256), scales(16), out(512);
  Guarded<float> out_scales(16);
  auto call = [&](const uint8_t* c, int64_t M, int64_t K, uint8_t* o, float* s) {
    return [=, &scales] { mxfp4_row_to_fp8_row(c, scales.ptr(), M, K, o, s, nullptr); };
  };
  expect_error_mentions(call(codes.ptr(), 2, 33, out.ptr(), out_scales.ptr()),
                        {"mxfp4_row_to_fp8_row", "multiple of 32", "[2, 33]"});
  expect_error_mentions(call(codes.ptr(), -2, 64, out.ptr(), out_scales.ptr()), {"[-2, 64]"});
  expect_error_mentions(call(codes.ptr() + 8, 2, 64, out.ptr(), out_scales.ptr()),
                        {"in_codes must be 16-byte aligned"});
  expect_error_mentions(call(codes.ptr(), 2, 64, out.ptr() + 1, out_scales.ptr()),
                        {"out_codes must be 16-byte aligned"});
  expect_error_mentions(call(codes.ptr(), 2, 64, out.ptr(), nullptr), {"out_scales is null"});
  CUDA_CHECK(cudaDeviceSynchronize());
  for (uint8_t b : out.download()) ASSERT_EQ(b, kPoison) << "a rejected call launched";
}

// ---- naive MXFP4 -> BF16 -> FP8 row ---------------------------------------------------------------------------

TEST(Mxfp4RowToFp8RowNaiveGpu, EqualsDequantizeThenBf16ToFp8RowPow2) {
  FP4MOE_REQUIRE_DEVICE();
  uint32_t seed = 400;
  for (int64_t M : {int64_t{1}, int64_t{7}, int64_t{4099}}) {
    for (int64_t K : {int64_t{32}, int64_t{576}, int64_t{7168}}) {
      SCOPED_TRACE(testing::Message() << "M=" << M << " K=" << K);
      const std::vector<bf16> x = activations(M, K, seed++, true);
      std::vector<uint8_t> codes(M * K / 2), scales(M * K / 32);
      bf16_to_mxfp4_row_ref(x.data(), M, K, codes.data(), scales.data(), {});
      std::vector<bf16> y(M * K);
      mxfp4_to_bf16_ref(codes.data(), scales.data(), M, K, y.data());
      std::vector<uint8_t> ref_codes(M * K, kPoison);
      std::vector<float> ref_scales(fp8_row_scale_count(M, K), -1.0f);
      bf16_to_fp8_row_ref(y.data(), M, K, Fp8ScaleMode::pow2, ref_codes.data(), ref_scales.data());

      Guarded<uint8_t> dc(codes.size()), ds(scales.size()), out(M * K);
      Guarded<bf16> workspace(M * K);
      Guarded<float> out_scales(fp8_row_scale_count(M, K));
      dc.upload(codes);
      ds.upload(scales);
      mxfp4_row_to_fp8_row_naive(dc.ptr(), ds.ptr(), M, K, workspace.ptr(), out.ptr(), out_scales.ptr(), nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(first_mismatch(out.download(), ref_codes), -1);
      EXPECT_EQ(first_mismatch(out_scales.download(), ref_scales), -1);
      EXPECT_TRUE(out.guards_intact() && out_scales.guards_intact() && workspace.guards_intact());
    }
  }
}

}  // namespace
}  // namespace fp4moe
