// The Hopper grouped FP8 Wgrad (kernels/gemm/grouped_wgrad_sm90.h) against the CPU reference (FP64 sums of the
// exactly dequantized column operands, grouped_gemm_ref.h grouped_wgrad_ref) and against the cuBLASLt path
// (GroupedGemm::wgrad_fp8 with Sm90Path::never) on the same operands, for the three outputs: BF16, FP32 written,
// FP32 accumulated onto random initial values.
//
// Operands: FP8 column tensors over the split built on the host (grouped_gemm_test_util.h make_col_tensor; token
// padding 16, or 32 as the FP8 conversion of an MXFP4 column tensor lays it out), the capacity's unused end NaN so
// that a read past the groups shows up. Outputs are poisoned (0xFF bytes: NaN) before every run that writes them;
// afterwards every element must be finite, empty groups exactly zero (or their initial values when accumulating),
// the others within the tolerance of the reference over the sampled rows n (relative L2 per group: 1e-2 for BF16,
// 1e-3 for FP32, as the cuBLASLt tests) and of cuBLASLt's output over all elements. A second run gives the same
// bits, and so do the variants (Sm90WgradConfig) that wait for each block's WGMMAs before promoting it and that
// accumulate by reading, adding and writing back rather than by reductions in global memory. Each case prints its errors against both, so that one run tells where a failure lies.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/gemm/grouped_gemm.h"
#include "kernels/gemm/grouped_gemm_heuristics.h"
#include "kernels/gemm/grouped_gemm_ref.h"
#include "kernels/gemm/grouped_tiles.h"
#include "kernels/gemm/grouped_wgrad_sm90.h"
#include "tests/common/grouped_gemm_sm90_test_util.h"
#include "tests/common/grouped_gemm_test_util.h"

namespace fp4moe {
namespace {

using namespace test;

struct WgradCase {
  std::string name;
  int64_t N, K;
  std::vector<int32_t> sizes;
  int64_t pad = kColAlign;
  ScaleKind scales = ScaleKind::pow2;
};

enum class Out { bf16, fp32, fp32_accumulate };
const char* out_name(Out o) { return o == Out::bf16 ? "bf16" : o == Out::fp32 ? "fp32" : "fp32 accumulate"; }

void check_wgrad_case(const WgradCase& c, uint64_t seed) {
  const std::vector<int32_t> offsets = offsets_of(c.sizes);
  const int64_t G = static_cast<int64_t>(c.sizes.size()), M = offsets[G], N = c.N, K = c.K;
  const std::string shape = fmt::format("{}: M={} N={} K={} G={} token_pad={}", c.name, M, N, K, G, c.pad);
  SCOPED_TRACE(shape);
  Rng rng(seed);
  const HostFp8 x = make_col_tensor(M, K, offsets, c.scales, rng, c.pad);
  const HostFp8 dy = make_col_tensor(M, N, offsets, c.scales, rng, c.pad);
  const std::vector<int64_t> rows = sample_wgrad_rows(N, M * N * K, rng);
  std::vector<float> ref(static_cast<size_t>(G * N * K), 0.0f);
  grouped_wgrad_ref(dy.deq.data(), x.deq.data(), M, N, K, offsets.data(), G, ref.data(), rows);
  std::vector<float> init(static_cast<size_t>(G * N * K));
  for (auto& v : init) v = static_cast<float>(rng.below(2001) - 1000) * 0.25f;

  auto d_offsets = upload(offsets);
  auto d_x = upload(x.codes);
  auto d_xs = upload(x.scales);
  auto d_dy = upload(dy.codes);
  auto d_dys = upload(dy.scales);
  const Fp8ColOperand dy_op{d_dy->ptr, d_dys->ptr}, x_op{d_x->ptr, d_xs->ptr};
  GroupedGemm lt_gemm;
  lt_gemm.set_tuning({1, Sm90Path::never});
  const GroupSplit split{d_offsets->ptr, offsets.data(), G};

  for (Out o : {Out::bf16, Out::fp32, Out::fp32_accumulate}) {
    const bool acc = o == Out::fp32_accumulate;
    const GemmOutType type = o == Out::bf16 ? GemmOutType::bf16 : GemmOutType::fp32;
    const double tol = o == Out::bf16 ? 1e-2 : 1e-3;
    const std::string what = fmt::format("Wgrad sm90 -> {}", out_name(o));
    // One output: poisoned (or the initial values when accumulating), then `body` writes it.
    auto run = [&](const std::string& label, auto&& body, std::vector<float>& got) {
      OutBuffer out(G * N * K, type);
      if (acc) out.buf.upload(init);
      if (!run_case(label, [&] { body(out.output(acc)); })) return false;
      got = out.download();
      return true;
    };
    auto sm90 = [&](GemmOutput dw) {
      grouped_wgrad_fp8_sm90(dy_op, x_op, M, N, K, d_offsets->ptr, G, dw, nullptr, c.pad);
    };
    std::vector<float> got, again, lt;
    if (!run(what, sm90, got)) continue;
    expect_wgrad_close(what, got, ref, acc ? &init : nullptr, N, K, offsets, rows, tol);
    if (run(what + " (again)", sm90, again)) {
      EXPECT_EQ(first_bit_difference(got, again), -1) << what << ": a second run gave other bits";
    }
    const auto serial = [&](GemmOutput dw) {
      grouped_wgrad_fp8_sm90(dy_op, x_op, M, N, K, d_offsets->ptr, G, dw, nullptr, c.pad, Sm90WgradConfig{false});
    };
    if (run(what + " (serial promotion)", serial, again)) {
      EXPECT_EQ(first_bit_difference(got, again), -1) << what << ": the serial variant gave other bits";
    }
    const auto rmw = [&](GemmOutput dw) {  // no subnormal sums here: the same bits as the reductions
      grouped_wgrad_fp8_sm90(dy_op, x_op, M, N, K, d_offsets->ptr, G, dw, nullptr, c.pad, Sm90WgradConfig{true, false});
    };
    if (acc && run(what + " (read-add-write accumulation)", rmw, again)) {
      EXPECT_EQ(first_bit_difference(got, again), -1) << what << ": the read-add-write variant gave other bits";
    }
    if (run(what + " cuBLASLt",
            [&](GemmOutput dw) { lt_gemm.wgrad_fp8(dy_op, x_op, N, K, split, dw, nullptr, c.pad); }, lt)) {
      expect_wgrad_close(what + " cuBLASLt", lt, ref, acc ? &init : nullptr, N, K, offsets, rows, tol);
      const double vs_lt = relative_l2_error(got.data(), lt.data(), static_cast<int64_t>(got.size()));
      std::vector<float> sampled_got, sampled_ref;  // the sampled rows n of the non-empty groups
      for (int64_t g = 0; g < G; ++g)
        if (offsets[g + 1] > offsets[g])
          for (int64_t n : rows)
            for (int64_t k = 0; k < K; ++k) {
              const size_t i = static_cast<size_t>((g * N + n) * K + k);
              sampled_got.push_back(got[i]);
              sampled_ref.push_back(acc ? init[i] + ref[i] : ref[i]);
            }
      const double vs_ref = relative_l2_error(sampled_got.data(), sampled_ref.data(),
                                              static_cast<int64_t>(sampled_got.size()));
      std::cout << "[ wgrad90  ] " << shape << ": " << what << ": rel L2 vs reference " << vs_ref
                << ", vs cuBLASLt " << vs_lt << "\n";
      EXPECT_LT(vs_lt, tol) << what << " vs cuBLASLt";
    }
  }
}

// FP8 column operands over `offsets` (token pad 16, power-of-two scales) on the host and the device, and the
// reference dW over every row n, for the cases that check one output against all of it.
struct WgradOperands {
  int64_t M, N, K, G;
  HostFp8 x, dy;
  std::vector<int64_t> rows;
  std::vector<float> ref;
  std::unique_ptr<DeviceBuffer<uint8_t>> d_x, d_dy;
  std::unique_ptr<DeviceBuffer<float>> d_xs, d_dys;
  WgradOperands(int64_t n, int64_t k, const std::vector<int32_t>& offsets, uint64_t seed)
      : M(offsets.back()), N(n), K(k), G(static_cast<int64_t>(offsets.size()) - 1) {
    Rng rng(seed);
    x = make_col_tensor(M, K, offsets, ScaleKind::pow2, rng);
    dy = make_col_tensor(M, N, offsets, ScaleKind::pow2, rng);
    for (int64_t r = 0; r < N; ++r) rows.push_back(r);
    ref.assign(static_cast<size_t>(G * N * K), 0.0f);
    grouped_wgrad_ref(dy.deq.data(), x.deq.data(), M, N, K, offsets.data(), G, ref.data(), rows);
    d_x = upload(x.codes);
    d_xs = upload(x.scales);
    d_dy = upload(dy.codes);
    d_dys = upload(dy.scales);
  }
  Fp8ColOperand dy_op() const { return {d_dy->ptr, d_dys->ptr}; }
  Fp8ColOperand x_op() const { return {d_x->ptr, d_xs->ptr}; }
};

std::vector<int32_t> random_sizes(int64_t G, int32_t max_size, int empty_one_in, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> sizes(static_cast<size_t>(G));
  for (auto& s : sizes) s = rng.below(empty_one_in) == 0 ? 0 : static_cast<int32_t>(1 + rng.below(max_size));
  return sizes;
}

// Empty, one-token, not-multiple-of-16 and of-128 groups, exactly 128.
const std::vector<int32_t> kRagged8 = {300, 129, 0, 1, 517, 128, 67, 255};

TEST(GroupedWgradSm90, RaggedEightExperts) {
  REQUIRE_SM90();
  check_wgrad_case({"ragged8", 512, 1024, kRagged8}, 1);
  check_wgrad_case({"ragged8 pad 32", 512, 1024, kRagged8, kMxBlock}, 2);
}

TEST(GroupedWgradSm90, EmptyAndOneTokenGroups) {
  REQUIRE_SM90();
  check_wgrad_case({"empty first, middle, last", 256, 384, {0, 190, 0, 0, 33, 0}}, 3);
  check_wgrad_case({"one-token groups", 384, 256, {1, 1, 0, 1, 2, 1}}, 4);
  check_wgrad_case({"one-token groups pad 32", 384, 256, {1, 0, 17, 1, 31, 33}, kMxBlock}, 5);
}

TEST(GroupedWgradSm90, NoTokens) {
  REQUIRE_SM90();
  check_wgrad_case({"M = 0", 256, 256, {0, 0, 0}}, 6);
  check_wgrad_case({"M = 0 pad 32", 128, 384, {0}, kMxBlock}, 7);
}

// The accumulation by reductions in global memory (Sm90WgradConfig::reduce_accumulate, the default) flushes subnormal
// values to zero, as the L2's FP32 add does; the read-add-write variant keeps them. One group of 128 tokens whose
// codes are all zero (a zero product) added onto dW = 2^-140 everywhere: 0 with the reductions, 2^-140 without.
TEST(GroupedWgradSm90, ReductionsFlushSubnormalsAndReadAddWriteKeepsThem) {
  REQUIRE_SM90();
  const int64_t N = 128, K = 128, M = 128, G = 1;
  const std::vector<int32_t> offsets{0, static_cast<int32_t>(M)};
  auto d_offsets = upload(offsets);
  const auto zeros = [](int64_t n) { return std::vector<uint8_t>(static_cast<size_t>(n), 0); };
  const auto ones = [](int64_t n) { return std::vector<float>(static_cast<size_t>(n), 1.0f); };
  auto d_dy = upload(zeros(fp8_col_codes_capacity(M, N, G)));
  auto d_dys = upload(ones(fp8_col_scales_capacity(M, N, G)));
  auto d_x = upload(zeros(fp8_col_codes_capacity(M, K, G)));
  auto d_xs = upload(ones(fp8_col_scales_capacity(M, K, G)));
  const float tiny = std::ldexp(1.0f, -140);
  for (const bool reduce : {true, false}) {
    SCOPED_TRACE(reduce ? "reductions" : "read-add-write");
    OutBuffer out(G * N * K, GemmOutType::fp32);
    out.buf.upload(std::vector<float>(static_cast<size_t>(G * N * K), tiny));
    ASSERT_TRUE(run_case("subnormal dW", [&] {
      grouped_wgrad_fp8_sm90({d_dy->ptr, d_dys->ptr}, {d_x->ptr, d_xs->ptr}, M, N, K, d_offsets->ptr, G,
                             out.output(true), nullptr, kColAlign, Sm90WgradConfig{true, reduce});
    }));
    const std::vector<float> got = out.download();
    const float want = reduce ? 0.0f : tiny;
    int64_t wrong = 0;
    for (const float v : got) wrong += v != want;
    EXPECT_EQ(wrong, 0) << "elements other than " << want << ", e.g. " << got[0];
  }
}

// Raw device offsets that are not a split (negative, decreasing, past M) are made safe on the device (clamped to
// [0, M], non-decreasing: grouped_tiles.h safe_group_offset): the result is the reference's on the safe split, and
// nothing outside the operands is read (the capacity's NaN end would show up) nor any group's dW left unwritten.
TEST(GroupedWgradSm90, BadOffsetsAreMadeSafeOnTheDevice) {
  REQUIRE_SM90();
  const int64_t N = 256, K = 384, M = 300;
  const std::vector<int32_t> raw{-3, 50, 20, 400, 7, 250};
  const int64_t G = static_cast<int64_t>(raw.size()) - 1;
  std::vector<int32_t> safe(raw.size());
  int32_t previous = 0;
  for (size_t i = 0; i < raw.size(); ++i)
    previous = safe[i] = safe_group_offset(raw[i], previous, static_cast<int32_t>(M));
  ASSERT_EQ(safe, (std::vector<int32_t>{0, 50, 50, 300, 300, 300}));
  const WgradOperands w(N, K, safe, 31);
  auto d_raw = upload(raw);
  OutBuffer out(G * N * K, GemmOutType::fp32);
  ASSERT_TRUE(run_case("bad offsets", [&] {
    grouped_wgrad_fp8_sm90(w.dy_op(), w.x_op(), M, N, K, d_raw->ptr, G, out.output(), nullptr);
  }));
  expect_wgrad_close("bad offsets", out.download(), w.ref, nullptr, N, K, safe, w.rows, 1e-3);
}

TEST(GroupedWgradSm90, OneHugeGroup) {
  REQUIRE_SM90();
  check_wgrad_case({"one huge group among small", 256, 256, {3, 0, 20011, 5}}, 8);
  check_wgrad_case({"one huge group pad 32", 128, 512, {12345}, kMxBlock}, 9);
}

TEST(GroupedWgradSm90, ManyExperts) {
  REQUIRE_SM90();
  check_wgrad_case({"32 experts", 256, 512, random_sizes(32, 300, 5, 10)}, 10);
  check_wgrad_case({"256 experts", 128, 256, random_sizes(256, 60, 3, 11)}, 11);
  check_wgrad_case({"256 experts pad 32", 256, 128, random_sizes(256, 60, 3, 12), kMxBlock}, 12);
}

TEST(GroupedWgradSm90, DeepSeekV3SubsetEightByTwoThousand) {
  REQUIRE_SM90();
  check_wgrad_case({"V3 subset 8 x ~2048", 512, 1024, {2011, 2300, 1790, 2048, 1999, 2203, 1877, 2156}}, 13);
  check_wgrad_case({"V3 down subset, pad 32", 1024, 512, {2011, 0, 1790, 2048, 1999, 2203, 1877, 2156}, kMxBlock},
                   14);
}

TEST(GroupedWgradSm90, Fp32Scales) {
  REQUIRE_SM90();
  check_wgrad_case({"fp32 scales", 384, 640, {130, 0, 259, 7, 2}, kColAlign, ScaleKind::fp32}, 15);
}

// GroupedGemm::wgrad_fp8 runs the kernel with Sm90Path::always (its bits, no cuBLASLt query, no host offsets
// needed: the split's host copy is null) and cuBLASLt with automatic (the rule says no) and never.
TEST(GroupedWgradSm90, GroupedGemmChoosesThePathByItsRule) {
  REQUIRE_SM90();
  const int64_t N = 256, K = 384;
  const std::vector<int32_t> sizes{100, 0, 300, 7};
  const std::vector<int32_t> offsets = offsets_of(sizes);
  const WgradOperands w(N, K, offsets, 30);
  const int64_t G = w.G, M = w.M;
  const std::vector<float>& ref = w.ref;
  const std::vector<int64_t>& rows = w.rows;
  auto d_offsets = upload(offsets);
  const Fp8ColOperand dy_op = w.dy_op(), x_op = w.x_op();
  const std::vector<float> direct = [&] {
    OutBuffer out(G * N * K, GemmOutType::fp32);
    grouped_wgrad_fp8_sm90(dy_op, x_op, M, N, K, d_offsets->ptr, G, out.output(), nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    return out.download();
  }();
  EXPECT_FALSE(grouped_wgrad_prefers_sm90(N, K, G)) << "automatic keeps Wgrad on cuBLASLt (the kernel is slower there)";
  for (Sm90Path path : {Sm90Path::always, Sm90Path::automatic, Sm90Path::never}) {
    const bool sm90 = path == Sm90Path::always;
    const std::string what = fmt::format("path {}", static_cast<int>(path));
    GroupedGemm gemm;
    gemm.set_tuning({1, path});
    const GroupSplit split{d_offsets->ptr, sm90 ? nullptr : offsets.data(), G};
    OutBuffer out(G * N * K, GemmOutType::fp32);
    ASSERT_TRUE(run_case(what, [&] { gemm.wgrad_fp8(dy_op, x_op, N, K, split, out.output(), nullptr); }));
    const std::vector<float> got = out.download();
    EXPECT_EQ(gemm.lt().heuristic_queries() == 0, sm90) << what << ": expected the "
                                                        << (sm90 ? "Hopper kernel" : "cuBLASLt calls");
    if (sm90) {
      EXPECT_EQ(first_bit_difference(got, direct), -1) << what << ": not the kernel's bits";
    }
    expect_wgrad_close(what, got, ref, nullptr, N, K, offsets, rows, 1e-3);
  }
  // With a host copy the Hopper path validates it, as every path does, and bounds the kernel's reads by its M.
  GroupedGemm gemm;
  gemm.set_tuning({1, Sm90Path::always});
  OutBuffer out(G * N * K, GemmOutType::fp32);
  ASSERT_TRUE(run_case("always, host copy",
                       [&] { gemm.wgrad_fp8(dy_op, x_op, N, K, GroupSplit{d_offsets->ptr, offsets.data(), G},
                                            out.output(), nullptr); }));
  EXPECT_EQ(first_bit_difference(out.download(), direct), -1) << "always with a host copy: not the kernel's bits";
  std::vector<int32_t> bad = offsets;
  bad[2] = bad[1] - 1;  // decreasing: not a split
  EXPECT_THROW(gemm.wgrad_fp8(dy_op, x_op, N, K, GroupSplit{d_offsets->ptr, bad.data(), G}, out.output(), nullptr),
               Error);
}

TEST(GroupedWgradSm90, RejectsWhatItDoesNotTake) {
  REQUIRE_SM90();
  EXPECT_NE(grouped_wgrad_sm90_unsupported(576, 2048, 8, 16).find("multiples of 128"), std::string::npos);
  EXPECT_NE(grouped_wgrad_sm90_unsupported(4096, 7168, 1025, 16).find("1024"), std::string::npos);
  EXPECT_NE(grouped_wgrad_sm90_unsupported(4096, 7168, 8, 8).find("token_pad"), std::string::npos);
  EXPECT_EQ(grouped_wgrad_sm90_unsupported(4096, 7168, 8, 16), "") << "the V3 shapes run on this device";
  EXPECT_EQ(grouped_wgrad_sm90_unsupported(7168, 2048, 256, 32), "");
  DeviceBuffer<float> buf(1024);
  auto* codes = reinterpret_cast<const uint8_t*>(buf.ptr);
  const Fp8ColOperand op{codes, buf.ptr};
  const int32_t* offsets = reinterpret_cast<const int32_t*>(buf.ptr);
  const GemmOutput fp32{buf.ptr, GemmOutType::fp32, false};
  EXPECT_THROW(grouped_wgrad_fp8_sm90(op, op, 0, 576, 128, offsets, 1, fp32, nullptr), Error);
  EXPECT_THROW(grouped_wgrad_fp8_sm90(op, op, 0, 128, 128, offsets, 1, fp32, nullptr, 8), Error);
  EXPECT_THROW(grouped_wgrad_fp8_sm90(op, op, 0, 128, 128, nullptr, 1, fp32, nullptr), Error);
  EXPECT_THROW(grouped_wgrad_fp8_sm90(op, op, 0, 128, 128, offsets, 1, GemmOutput{buf.ptr, GemmOutType::bf16, true},
                                      nullptr),
               Error);
  EXPECT_THROW(grouped_wgrad_fp8_sm90({codes + 1, buf.ptr}, op, 0, 128, 128, offsets, 1, fp32, nullptr), Error);
  EXPECT_THROW(grouped_wgrad_fp8_sm90(op, op, -1, 128, 128, offsets, 1, fp32, nullptr), Error);
}

}  // namespace
}  // namespace fp4moe
