// GPU column conversions and BF16 -> FP8 baselines against their CPU references, bit for bit (codes and scales):
// mxfp4_row_to_fp8_col, bf16_to_fp8_col, bf16_to_fp8_row, bf16_to_fp8_block128 (and its transpose).
// Seeded random data with outliers, tiny values, zero rows and NaN/Inf blocks, and blocks whose amax spans BF16's
// whole exponent range (the fp32 scale mode's pow2 floor included); row shapes M in {1, 7, 128, 4099}
// x K in {32, 96, 576, 2048, 7168}; ragged groups [162, 0, 2577, 446, 0, 83], random splits, all tokens on one
// expert, groups of one row, G = 1 and G = 1024. Outputs are poisoned before every run and surrounded by guards:
// each whole buffer (guards and unused capacity included) must equal the reference's, which writes exactly the
// layout's extent (tests/quant/test_quant_col_ref.cpp), so nothing may be written outside it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/common/gpu_test_util.h"
#include "kernels/common/check.h"
#include "kernels/common/types.h"
#include "kernels/formats/formats.h"
#include "kernels/quant/bf16_to_fp8.h"
#include "kernels/quant/layouts.h"
#include "kernels/quant/mxfp4_row_to_fp8_col.h"

namespace fp4moe {
namespace {

using test::DeviceBuffer;

constexpr unsigned char kPoison = 0xA5;
const int64_t kRows[] = {1, 7, 128, 4099};
const int64_t kCols[] = {32, 96, 576, 2048, 7168};
const Fp8ScaleMode kModes[] = {Fp8ScaleMode::pow2, Fp8ScaleMode::fp32};

// An output of `n` elements with kGuard poisoned elements before and after (multiples of 16 bytes, so the
// tensor keeps the allocation's alignment). `expected` is a host image of the same buffer, poisoned alike, into
// which the CPU reference writes; after the kernel the two whole buffers must be equal.
template <typename T>
struct GuardedOutput {
  static constexpr size_t kGuard = 64;
  size_t n;
  DeviceBuffer<T> dev;
  std::vector<T> expected;
  explicit GuardedOutput(size_t count) : n(count), dev(count + 2 * kGuard), expected(count + 2 * kGuard) {
    std::memset(expected.data(), kPoison, expected.size() * sizeof(T));
    dev.poison(kPoison);
  }
  T* device() { return dev.ptr + kGuard; }
  T* host() { return expected.data() + kGuard; }
  // Index of the first element whose bytes differ (guards included, counted from the start of the tensor), or
  // "" when the buffers are equal.
  std::string first_difference() const {
    std::vector<T> got = dev.download();
    size_t diffs = 0, first = 0;
    for (size_t i = 0; i < got.size(); ++i)
      if (std::memcmp(&got[i], &expected[i], sizeof(T)) != 0 && diffs++ == 0) first = i;
    if (diffs == 0) return "";
    uint32_t g = 0, e = 0;
    std::memcpy(&g, &got[first], sizeof(T));
    std::memcpy(&e, &expected[first], sizeof(T));
    return fmt::format("{} differing elements; first at {} ({}): got 0x{:x}, expected 0x{:x}", diffs,
                       static_cast<int64_t>(first) - static_cast<int64_t>(kGuard),
                       first < kGuard || first >= kGuard + n ? "outside the tensor" : "inside", g, e);
  }
  bool all_poison() const {
    std::vector<T> got = dev.download();
    const auto* b = reinterpret_cast<const unsigned char*>(got.data());
    return std::all_of(b, b + got.size() * sizeof(T), [](unsigned char c) { return c == kPoison; });
  }
};

// A device copy of a host vector.
template <typename T>
struct DeviceCopy : DeviceBuffer<T> {
  explicit DeviceCopy(const std::vector<T>& h) : DeviceBuffer<T>(h.size()) {
    if (!h.empty()) this->upload(h);
  }
};

bf16 to_bf16(float v) { return bf16_from_bits(f32_to_bf16_bits(v)); }

// Seeded BF16 [rows, cols]: normal values with per-row magnitudes 2^-20 .. 2^12, outliers (x 2^14), subnormal-range
// values, zero rows, and with `nonfinite` a few NaN/Inf.
std::vector<bf16> random_bf16(int64_t rows, int64_t cols, uint32_t seed, bool nonfinite) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> row_exp(-20, 12), pick(0, 4095);
  std::vector<bf16> x(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    int kind = pick(rng);
    float row_scale = kind < 32 ? 0.0f : kind < 64 ? 1e-38f : std::ldexp(1.0f, row_exp(rng));
    for (int64_t c = 0; c < cols; ++c) {
      float v = normal(rng) * row_scale;
      int p = pick(rng);
      if (p < 4) v *= 16384.0f;
      if (nonfinite && p == 4) v = NAN;
      if (nonfinite && p == 5) v = (c & 1) ? INFINITY : -INFINITY;
      x[r * cols + c] = to_bf16(v);
    }
  }
  return x;
}

// Seeded BF16 [rows, cols] whose 128x128 tiles take amax exponents over BF16's whole range: tile t (row-major
// over tiles) holds uniform values in (-2, 2) * 2^(-133 + t % 260), so every 1x128 row block, 128-token column
// block and 128x128 block inside it has its amax near that power: BF16 subnormals (2^-133 up), the blocks where
// the fp32 scale mode takes the pow2 floor (amax < 448 * 2^-126), and the top binade, with the largest finite BF16
// (0x7F7F, beyond pow2's stated limit 1.9375 * 2^127) now and then in the top tiles. 33 x 16 tiles cover every
// exponent. No NaN/Inf.
std::vector<bf16> extreme_amax_bf16(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> mantissa(-2.0, 2.0);
  std::uniform_int_distribution<int> pick(0, 63);
  const int64_t tiles_per_row = (cols + 127) / 128;
  std::vector<bf16> x(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int e = -133 + static_cast<int>(((r / 128) * tiles_per_row + c / 128) % 260);  // up to 2^126
      const float v = static_cast<float>(std::ldexp(mantissa(rng), e));                 // |v| < 2^127
      x[r * cols + c] = (e == 126 && pick(rng) == 0) ? bf16_from_bits(v < 0 ? 0xFF7F : 0x7F7F) : to_bf16(v);
    }
  return x;
}

// Seeded MXFP4 [M, K]: random codes; per-row exponents in [-10, 10] with outlier tokens (+12 .. +40), tiny blocks
// (exponent -127 .. -100: shifts far below -5, E4M3 subnormals and flushes), NaN blocks and all-zero blocks.
struct Mxfp4 {
  std::vector<uint8_t> codes, scales;
};
Mxfp4 random_mxfp4(int64_t M, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255), base(-10, 10), outlier(12, 40), tiny(-127, -100), jitter(-3, 3),
      pick(0, 1023);
  Mxfp4 t{std::vector<uint8_t>(static_cast<size_t>(M * K / 2)), std::vector<uint8_t>(static_cast<size_t>(M * K / 32))};
  for (auto& c : t.codes) c = static_cast<uint8_t>(byte(rng));
  for (int64_t r = 0; r < M; ++r) {
    int row_e = base(rng) + (pick(rng) < 16 ? outlier(rng) : 0);
    for (int64_t b = 0; b < K / 32; ++b) {
      int p = pick(rng), e = row_e + jitter(rng);
      if (p < 8) e = tiny(rng);
      uint8_t s = static_cast<uint8_t>(e + 127);
      if (p == 8) s = kUE8M0NaN;
      if (p == 9) {
        s = 0;
        std::memset(&t.codes[(r * K + b * 32) / 2], 0, 16);
      }
      t.scales[r * (K / 32) + b] = s;
    }
  }
  return t;
}

// ---- group splits ------------------------------------------------------------------------------------------

std::vector<int32_t> offsets_of(const std::vector<int32_t>& sizes) {
  std::vector<int32_t> o = {0};
  for (int32_t s : sizes) o.push_back(o.back() + s);
  return o;
}

struct Split {
  std::string name;
  std::vector<int32_t> offsets;
};

std::vector<Split> ragged_splits() {
  std::vector<Split> s;
  s.push_back({"paper [162,0,2577,446,0,83]", offsets_of({162, 0, 2577, 446, 0, 83})});
  s.push_back({"G = 1", offsets_of({1000})});
  s.push_back({"all tokens on expert 5 of 8", offsets_of({0, 0, 0, 0, 0, 2050, 0, 0})});
  s.push_back({"300 groups of 1 row", offsets_of(std::vector<int32_t>(300, 1))});
  s.push_back({"1024 groups (the maximum), 0 to 3 rows", {}});
  std::mt19937 rng(99);
  std::vector<int32_t> sizes;
  for (int g = 0; g < 1024; ++g) sizes.push_back(static_cast<int32_t>(rng() % 4));
  s.back().offsets = offsets_of(sizes);
  for (uint32_t seed = 1; seed <= 4; ++seed) {
    std::mt19937 r(seed);
    int G = 1 + static_cast<int>(r() % 64);
    int M = static_cast<int>(r() % 5000);
    std::vector<int32_t> cuts(G - 1);
    for (auto& c : cuts) c = static_cast<int32_t>(r() % (M + 1));
    std::sort(cuts.begin(), cuts.end());
    std::vector<int32_t> o = {0};
    for (int32_t c : cuts) o.push_back(c);
    o.push_back(M);
    s.push_back({fmt::format("random split seed {} (G = {}, M = {})", seed, G, M), o});
  }
  s.push_back({"M = 0 over 3 groups", {0, 0, 0, 0}});
  return s;
}

// ---- MXFP4 -> FP8 column ------------------------------------------------------------------------------------

void check_mxfp4_col(const std::vector<int32_t>& offsets, int64_t K, uint32_t seed, bool give_host_offsets) {
  const int64_t G = static_cast<int64_t>(offsets.size()) - 1, M = offsets.back();
  SCOPED_TRACE(fmt::format("M = {}, K = {}, G = {}, host offsets {}", M, K, G, give_host_offsets));
  Mxfp4 in = random_mxfp4(M, K, seed);
  DeviceCopy<uint8_t> codes(in.codes), scales(in.scales);
  DeviceCopy<int32_t> d_offsets(offsets);
  GuardedOutput<uint8_t> out(fp8_col_codes_capacity(M, K, G));
  GuardedOutput<float> out_scales(fp8_col_scales_capacity(M, K, G));
  mxfp4_row_to_fp8_col_ref(in.codes.data(), in.scales.data(), M, K, offsets.data(), G, out.host(), out_scales.host());
  mxfp4_row_to_fp8_col(codes.ptr, scales.ptr, M, K, d_offsets.ptr, G, give_host_offsets ? offsets.data() : nullptr,
                       out.device(), out_scales.device(), nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(out.first_difference(), "") << "codes";
  EXPECT_EQ(out_scales.first_difference(), "") << "scales";
}

TEST(Mxfp4RowToFp8ColGpu, RowShapesOneGroup) {
  FP4MOE_REQUIRE_DEVICE();
  uint32_t seed = 1;
  for (int64_t M : kRows)
    for (int64_t K : kCols) check_mxfp4_col({0, static_cast<int32_t>(M)}, K, seed++, true);
}

TEST(Mxfp4RowToFp8ColGpu, RaggedGroupsWithHostAndDeviceOffsets) {
  FP4MOE_REQUIRE_DEVICE();
  uint32_t seed = 100;
  for (const Split& s : ragged_splits()) {
    SCOPED_TRACE(s.name);
    for (int64_t K : {96, 2048}) {
      ++seed;
      check_mxfp4_col(s.offsets, K, seed, (seed & 1) != 0);  // half of the runs with device offsets only
    }
  }
  check_mxfp4_col(offsets_of({162, 0, 2577, 446, 0, 83}), 7168, seed++, false);
  check_mxfp4_col(offsets_of({162, 0, 2577, 446, 0, 83}), 576, seed++, true);
}

// More than 65535 token blocks (8.4M tokens): the kernel's grid puts the token blocks on grid.x then.
TEST(Mxfp4RowToFp8ColGpu, MoreTokenBlocksThanGridYHolds) {
  FP4MOE_REQUIRE_DEVICE();
  const int32_t M = 65535 * 128 + 77;
  check_mxfp4_col({0, 4000001, M}, 32, 909, true);
}

// ---- BF16 -> FP8 column -------------------------------------------------------------------------------------

// x [M, K] with M = offsets.back().
void check_bf16_col(const std::vector<bf16>& x, const std::vector<int32_t>& offsets, int64_t K, Fp8ScaleMode mode,
                    bool give_host_offsets, bool nonfinite) {
  const int64_t G = static_cast<int64_t>(offsets.size()) - 1, M = offsets.back();
  SCOPED_TRACE(fmt::format("M = {}, K = {}, G = {}, mode {}, host offsets {}", M, K, G, static_cast<int>(mode),
                           give_host_offsets));
  DeviceCopy<bf16> d_x(x);
  DeviceCopy<int32_t> d_offsets(offsets);
  DeviceBuffer<unsigned long long> count(1);
  CUDA_CHECK(cudaMemset(count.ptr, 0, sizeof(unsigned long long)));
  GuardedOutput<uint8_t> out(fp8_col_codes_capacity(M, K, G));
  GuardedOutput<float> out_scales(fp8_col_scales_capacity(M, K, G));
  int64_t expect_bad = bf16_to_fp8_col_ref(x.data(), M, K, offsets.data(), G, mode, out.host(), out_scales.host());
  bf16_to_fp8_col(d_x.ptr, M, K, d_offsets.ptr, G, give_host_offsets ? offsets.data() : nullptr, mode, out.device(),
                  out_scales.device(), count.ptr, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(out.first_difference(), "") << "codes";
  EXPECT_EQ(out_scales.first_difference(), "") << "scales";
  EXPECT_EQ(static_cast<int64_t>(count.download()[0]), expect_bad) << "non-finite blocks";
  if (nonfinite && M * K >= 4096) EXPECT_GT(expect_bad, 0) << "the data should hold NaN/Inf blocks";
}

void check_bf16_col(const std::vector<int32_t>& offsets, int64_t K, Fp8ScaleMode mode, uint32_t seed,
                    bool give_host_offsets, bool nonfinite) {
  check_bf16_col(random_bf16(offsets.back(), K, seed, nonfinite), offsets, K, mode, give_host_offsets, nonfinite);
}

TEST(Bf16ToFp8ColGpu, RowShapesOneGroup) {
  FP4MOE_REQUIRE_DEVICE();
  uint32_t seed = 200;
  for (Fp8ScaleMode mode : kModes)
    for (int64_t M : kRows)
      for (int64_t K : {16, 32, 48, 96, 576, 2048, 7168}) {
        ++seed;
        check_bf16_col({0, static_cast<int32_t>(M)}, K, mode, seed, true, seed % 3 == 0);
      }
}

TEST(Bf16ToFp8ColGpu, RaggedGroupsWithHostAndDeviceOffsets) {
  FP4MOE_REQUIRE_DEVICE();
  uint32_t seed = 300;
  for (Fp8ScaleMode mode : kModes)
    for (const Split& s : ragged_splits()) {
      SCOPED_TRACE(s.name);
      for (int64_t K : {96, 2048}) {
        ++seed;
        check_bf16_col(s.offsets, K, mode, seed, (seed & 1) != 0, (seed & 2) != 0);
      }
    }
  check_bf16_col(offsets_of({162, 0, 2577, 446, 0, 83}), 7168, Fp8ScaleMode::pow2, seed++, false, true);
}

// Block amaxes over BF16's whole exponent range (extreme_amax_bf16), one group and ragged groups.
TEST(Bf16ToFp8ColGpu, ExtremeAmaxMatchesReference) {
  FP4MOE_REQUIRE_DEVICE();
  const int64_t M = 33 * 128, K = 2048;
  const std::vector<bf16> x = extreme_amax_bf16(M, K, 350);
  for (Fp8ScaleMode mode : kModes) {
    check_bf16_col(x, {0, static_cast<int32_t>(M)}, K, mode, true, false);
    check_bf16_col(x, offsets_of({162, 0, 2577, 446, 0, 83, 956}), K, mode, false, false);
  }
}

// ---- BF16 -> FP8 row and 128x128 blocks ---------------------------------------------------------------------

void check_bf16_row(const std::vector<bf16>& x, int64_t M, int64_t K, Fp8ScaleMode mode) {
  SCOPED_TRACE(fmt::format("M = {}, K = {}, mode {}", M, K, static_cast<int>(mode)));
  DeviceCopy<bf16> d_x(x);
  DeviceBuffer<unsigned long long> count(1);
  CUDA_CHECK(cudaMemset(count.ptr, 0, sizeof(unsigned long long)));
  GuardedOutput<uint8_t> out(M * K);
  GuardedOutput<float> out_scales(fp8_row_scale_count(M, K));
  int64_t expect_bad = bf16_to_fp8_row_ref(x.data(), M, K, mode, out.host(), out_scales.host());
  bf16_to_fp8_row(d_x.ptr, M, K, mode, out.device(), out_scales.device(), count.ptr, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(out.first_difference(), "") << "codes";
  EXPECT_EQ(out_scales.first_difference(), "") << "scales";
  EXPECT_EQ(static_cast<int64_t>(count.download()[0]), expect_bad) << "non-finite blocks";
}

void check_bf16_row(int64_t M, int64_t K, Fp8ScaleMode mode, uint32_t seed, bool nonfinite) {
  check_bf16_row(random_bf16(M, K, seed, nonfinite), M, K, mode);
}

TEST(Bf16ToFp8RowGpu, MatchesReference) {
  FP4MOE_REQUIRE_DEVICE();
  uint32_t seed = 400;
  for (Fp8ScaleMode mode : kModes)
    for (int64_t M : kRows)
      for (int64_t K : {16, 32, 96, 272, 576, 2048, 7168}) {
        ++seed;
        check_bf16_row(M, K, mode, seed, seed % 3 == 0);
      }
}

void check_bf16_block128(const std::vector<bf16>& w, int64_t N, int64_t K, Fp8ScaleMode mode, bool transpose) {
  SCOPED_TRACE(fmt::format("N = {}, K = {}, mode {}, transpose {}", N, K, static_cast<int>(mode), transpose));
  DeviceCopy<bf16> d_w(w);
  DeviceBuffer<unsigned long long> count(1);
  CUDA_CHECK(cudaMemset(count.ptr, 0, sizeof(unsigned long long)));
  GuardedOutput<uint8_t> out(N * K);
  GuardedOutput<float> out_scales(transpose ? fp8_block_scale_count(K, N) : fp8_block_scale_count(N, K));
  int64_t expect_bad = bf16_to_fp8_block128_ref(w.data(), N, K, mode, transpose, out.host(), out_scales.host());
  bf16_to_fp8_block128(d_w.ptr, N, K, mode, transpose, out.device(), out_scales.device(), count.ptr, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(out.first_difference(), "") << "codes";
  EXPECT_EQ(out_scales.first_difference(), "") << "scales";
  EXPECT_EQ(static_cast<int64_t>(count.download()[0]), expect_bad) << "non-finite blocks";
}

// Block amaxes over BF16's whole exponent range (extreme_amax_bf16).
TEST(Bf16ToFp8RowGpu, ExtremeAmaxMatchesReference) {
  FP4MOE_REQUIRE_DEVICE();
  const int64_t M = 33 * 128, K = 2048;
  const std::vector<bf16> x = extreme_amax_bf16(M, K, 450);
  for (Fp8ScaleMode mode : kModes) check_bf16_row(x, M, K, mode);
}

void check_bf16_block128(int64_t N, int64_t K, Fp8ScaleMode mode, bool transpose, uint32_t seed, bool nonfinite) {
  check_bf16_block128(random_bf16(N, K, seed, nonfinite), N, K, mode, transpose);
}

TEST(Bf16ToFp8Block128Gpu, MatchesReferenceBothOrientations) {
  FP4MOE_REQUIRE_DEVICE();
  uint32_t seed = 500;
  for (Fp8ScaleMode mode : kModes)
    for (bool transpose : {false, true})
      for (int64_t N : {16, 128, 144, 4112})
        for (int64_t K : {16, 32, 96, 576, 2048, 7168}) {
          ++seed;
          check_bf16_block128(N, K, mode, transpose, seed, seed % 4 == 0);
        }
}

// Block amaxes over BF16's whole exponent range (extreme_amax_bf16), both orientations.
TEST(Bf16ToFp8Block128Gpu, ExtremeAmaxMatchesReference) {
  FP4MOE_REQUIRE_DEVICE();
  const int64_t N = 33 * 128, K = 2048;
  const std::vector<bf16> w = extreme_amax_bf16(N, K, 550);
  for (Fp8ScaleMode mode : kModes)
    for (bool transpose : {false, true}) check_bf16_block128(w, N, K, mode, transpose);
}

// ---- rejected arguments: checked before any launch, outputs untouched ------------------------------------------

TEST(QuantColGpuRejects, BadArgumentsBeforeLaunch) {
  FP4MOE_REQUIRE_DEVICE();
  const int64_t M = 64, K = 64;
  std::vector<int32_t> offsets = {0, 10, 64};
  DeviceCopy<int32_t> d_offsets(offsets);
  DeviceBuffer<uint8_t> codes(M * K), scales(M * K / 32);
  DeviceBuffer<bf16> x(M * K);
  GuardedOutput<uint8_t> out(fp8_col_codes_capacity(M, K, 2));
  GuardedOutput<float> out_scales(fp8_col_scales_capacity(M, K, 2));
  auto message = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  auto expect_message = [&](const std::string& got, const std::string& part) {
    EXPECT_NE(got.find(part), std::string::npos) << "message: " << got << "\nexpected to contain: " << part;
  };
  auto mx = [&](int64_t m, int64_t k, const int32_t* dev, int64_t G, const int32_t* host, uint8_t* c) {
    return message([&] { mxfp4_row_to_fp8_col(codes.ptr, scales.ptr, m, k, dev, G, host, c, out_scales.device(), nullptr); });
  };
  expect_message(mx(M, 48, d_offsets.ptr, 2, offsets.data(), out.device()), "got in [M, K] = [64, 48]");
  expect_message(mx(M, K, d_offsets.ptr, 0, offsets.data(), out.device()), "G must be in [1, 1024], got G=0");
  expect_message(mx(M, K, d_offsets.ptr, 1025, nullptr, out.device()), "got G=1025");
  expect_message(mx(M, K, nullptr, 2, offsets.data(), out.device()), "device group offsets are null");
  expect_message(mx(M, K, d_offsets.ptr, 2, offsets.data(), out.device() + 1), "16-byte aligned");
  std::vector<int32_t> bad_start = {1, 10, 64}, bad_end = {0, 10, 63}, decreasing = {0, 20, 10, 64};
  expect_message(mx(M, K, d_offsets.ptr, 2, bad_start.data(), out.device()), "must start at 0");
  expect_message(mx(M, K, d_offsets.ptr, 2, bad_end.data(), out.device()), "must end at M=64");
  expect_message(mx(M, K, d_offsets.ptr, 3, decreasing.data(), out.device()), "non-decreasing");

  expect_message(message([&] {
                   bf16_to_fp8_col(x.ptr, M, 24, d_offsets.ptr, 2, offsets.data(), Fp8ScaleMode::pow2, out.device(),
                                   out_scales.device(), nullptr, nullptr);
                 }),
                 "got x [M, K] = [64, 24]");
  expect_message(message([&] {
                   bf16_to_fp8_col(x.ptr, M, K, d_offsets.ptr, 2, bad_end.data(), Fp8ScaleMode::pow2, out.device(),
                                   out_scales.device(), nullptr, nullptr);
                 }),
                 "must end at M=64");
  expect_message(message([&] {
                   bf16_to_fp8_row(x.ptr, M, 40, Fp8ScaleMode::fp32, out.device(), out_scales.device(), nullptr, nullptr);
                 }),
                 "got x [M, K] = [64, 40]");
  expect_message(message([&] {
                   bf16_to_fp8_block128(x.ptr, 7, K, Fp8ScaleMode::pow2, true, out.device(), out_scales.device(), nullptr,
                                        nullptr);
                 }),
                 "N must be a positive multiple of 16, got w [N, K] = [7, 64]");
  expect_message(message([&] {
                   bf16_to_fp8_row(x.ptr, M, K, static_cast<Fp8ScaleMode>(7), out.device(), out_scales.device(), nullptr,
                                   nullptr);
                 }),
                 "unknown scale mode 7");
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(out.all_poison()) << "a rejected call wrote codes";
  EXPECT_TRUE(out_scales.all_poison()) << "a rejected call wrote scales";
}

// Device offsets are not checked on the host when host_offsets is null; an invalid split must then write nothing
// rather than out of bounds.
TEST(QuantColGpuRejects, InvalidDeviceOffsetsWriteNothing) {
  FP4MOE_REQUIRE_DEVICE();
  const int64_t M = 64, K = 64;
  DeviceBuffer<uint8_t> codes(M * K / 2), scales(M * K / 32);
  DeviceBuffer<bf16> x(M * K);
  // 40 groups: the warp find reads them in two chunks of 32; the bad entry in the second chunk.
  std::vector<int32_t> long_split(41);
  for (int g = 0; g <= 40; ++g) long_split[g] = static_cast<int32_t>(g * M / 40);
  std::vector<int32_t> long_decreasing = long_split, long_short = long_split;
  long_decreasing[36] = long_decreasing[35] - 1;
  long_short[40] = static_cast<int32_t>(M - 1);
  for (std::vector<int32_t> bad : {std::vector<int32_t>{0, 40, 30, 64}, {0, 10, 20, 63}, {5, 10, 20, 64},
                                   long_decreasing, long_short}) {
    const int64_t G = static_cast<int64_t>(bad.size()) - 1;
    DeviceCopy<int32_t> d_offsets(bad);
    GuardedOutput<uint8_t> out(fp8_col_codes_capacity(M, K, G));
    GuardedOutput<float> out_scales(fp8_col_scales_capacity(M, K, G));
    mxfp4_row_to_fp8_col(codes.ptr, scales.ptr, M, K, d_offsets.ptr, G, nullptr, out.device(), out_scales.device(),
                         nullptr);
    bf16_to_fp8_col(x.ptr, M, K, d_offsets.ptr, G, nullptr, Fp8ScaleMode::pow2, out.device(), out_scales.device(),
                    nullptr, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(out.all_poison()) << "offsets " << bad[0] << "," << bad[1] << ",..., " << bad[G] << " (G " << G << ")";
    EXPECT_TRUE(out_scales.all_poison());
  }
}

}  // namespace
}  // namespace fp4moe
