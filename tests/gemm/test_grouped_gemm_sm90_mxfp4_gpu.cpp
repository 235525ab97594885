// The Hopper grouped GEMM's MXFP4 Fprop (grouped_fprop_mxfp4_sm90, kernels/gemm/grouped_gemm_sm90.h), which
// converts the MXFP4 row operand in shared memory: bit for bit the output of "convert, then the FP8 kernel"
// (mxfp4_row_to_fp8_row, then grouped_fprop_fp8_sm90 with the same Sm90GemmConfig), for the case's tile width and
// every variant of variants_of; and against the FP64 reference of the dequantized MXFP4 operand (grouped_gemm_ref.h)
// where the direct rule is exact (block exponents of a 128-group at most 14 apart).
//
// Inputs: random MXFP4 (tests/common/mx_test_util.h: both signs, -0, one block in eight all zero) and random FP8
// block weights. NaN cases mark one MX block in 64 NaN (scale 0xFF): its row's output is NaN in both paths, the same
// bits, and the row is left out of the reference comparison. Outputs are poisoned before every run; rows outside the
// groups must stay poisoned. Tolerances and compared rows as in test_grouped_gemm_sm90_gpu.cpp.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/formats/formats.h"
#include "kernels/gemm/grouped_gemm_ref.h"
#include "kernels/gemm/grouped_gemm_sm90.h"
#include "kernels/quant/layouts.h"
#include "kernels/quant/mxfp4_row_to_fp8_row.h"
#include "tests/common/grouped_gemm_sm90_test_util.h"
#include "tests/common/grouped_gemm_test_util.h"
#include "tests/common/mx_test_util.h"

namespace fp4moe {
namespace {

using namespace test;

struct MxCase {
  std::string name;
  int64_t N, K;
  std::vector<int32_t> sizes;
  int64_t rows_after = 0;   // rows past o[G], in no group (must stay untouched)
  int64_t rows_before = 0;  // rows before o[0] (o[0] = rows_before), in no group
  int block_n = 0;          // Sm90GemmConfig
  bool nan_blocks = false;  // one MX block in 64 NaN
  int e_lo = -8, e_hi = 6;  // MX block exponents; exact conversion (and the FP64 comparison) when e_hi - e_lo <= 14
};

// Exact values of an MXFP4 row tensor (NaN for NaN blocks).
std::vector<float> mx_dequantized(const MxTensor& x) {
  std::vector<float> v(static_cast<size_t>(x.R * x.K));
  for (int64_t i = 0; i < x.R * x.K; ++i) {
    const uint8_t code = static_cast<uint8_t>((x.codes[i / 2] >> (4 * (i % 2))) & 0xF);
    v[i] = e2m1_to_f32(code) * ue8m0_to_f32(x.scales[i / kMxBlock]);
  }
  return v;
}

void check_mx_case(const MxCase& c, uint32_t seed) {
  std::vector<int32_t> offsets = offsets_of(c.sizes);
  for (auto& o : offsets) o += static_cast<int32_t>(c.rows_before);
  const int64_t G = static_cast<int64_t>(c.sizes.size()), Mg = offsets[G], M = Mg + c.rows_after;
  const int64_t N = c.N, K = c.K;
  const std::string shape = fmt::format("{}: M={} ({} in groups) N={} K={} G={} block_n={}", c.name, M, Mg, N, K, G,
                                        c.block_n);
  SCOPED_TRACE(shape);
  MxTensor x = random_mx(M, K, c.e_lo, c.e_hi, seed);
  Rng rng(seed);
  std::vector<bool> nan_rows(static_cast<size_t>(M), false);
  if (c.nan_blocks)
    for (int64_t b = 0; b < M * K / kMxBlock; ++b)
      if (rng.below(64) == 0) {
        x.scales[b] = kUE8M0NaN;
        nan_rows[static_cast<size_t>(b / (K / kMxBlock))] = true;
      }
  const HostFp8 w = make_block_stack(G, N, K, ScaleKind::pow2, rng);

  // The FP64 reference of the dequantized MXFP4 operand over the finite rows, when the conversion is exact.
  const bool exact = c.e_hi - c.e_lo <= 14;
  std::vector<int64_t> rows;
  for (int64_t r : rows_to_compare(offsets, Mg * N * K, int64_t{1} << 31, rng))
    if (!nan_rows[static_cast<size_t>(r)]) rows.push_back(r);
  std::vector<float> y_ref(static_cast<size_t>(M * N), 0.0f);
  if (exact) {
    const std::vector<float> x_deq = mx_dequantized(x);
    const int64_t r0 = c.rows_before;
    std::vector<int32_t> ref_offsets(offsets);
    for (auto& o : ref_offsets) o -= static_cast<int32_t>(r0);
    std::vector<int64_t> ref_rows(rows);
    for (auto& r : ref_rows) r -= r0;
    grouped_fprop_ref(x_deq.data() + r0 * K, w.deq.data(), Mg - r0, N, K, ref_offsets.data(), G,
                      y_ref.data() + r0 * N, ref_rows);
  }

  auto d_offsets = upload(offsets);
  auto d_codes = upload(x.codes);
  auto d_scales = upload(x.scales);
  auto d_w = upload(w.codes);
  auto d_ws = upload(w.scales);
  DeviceBuffer<uint8_t> fp8_codes(static_cast<size_t>(M * K));
  DeviceBuffer<float> fp8_scales(static_cast<size_t>(fp8_row_scale_count(M, K)));
  fp8_codes.poison(0xFF);
  fp8_scales.poison(0xFF);
  if (!run_case("mxfp4_row_to_fp8_row", [&] {
        mxfp4_row_to_fp8_row(d_codes->ptr, d_scales->ptr, M, K, fp8_codes.ptr, fp8_scales.ptr, nullptr);
      }))
    return;

  // One output (fused or converted first) with `config` into a freshly poisoned buffer; false if it threw.
  auto run = [&](const std::string& what, bool fused, Sm90GemmConfig config, std::vector<float>& got) {
    OutBuffer out(M * N, GemmOutType::bf16);
    auto* y = reinterpret_cast<bf16*>(out.buf.ptr);
    if (!run_case(what, [&] {
          if (fused)
            grouped_fprop_mxfp4_sm90({d_codes->ptr, d_scales->ptr}, {d_w->ptr, d_ws->ptr}, M, N, K, d_offsets->ptr,
                                     G, y, nullptr, config);
          else
            grouped_fprop_fp8_sm90({fp8_codes.ptr, fp8_scales.ptr}, {d_w->ptr, d_ws->ptr}, M, N, K, d_offsets->ptr,
                                   G, y, nullptr, config);
        }))
      return false;
    got = out.download();
    return true;
  };

  std::vector<Sm90GemmConfig> configs{Sm90GemmConfig{c.block_n}};
  for (const Sm90GemmConfig& v : variants_of(c.block_n)) configs.push_back(v);
  for (const Sm90GemmConfig& config : configs) {
    const std::string what = "Fprop mxfp4_sm90 " + variant_name(config);
    std::vector<float> fused, converted;
    if (!run(what, true, config, fused) || !run(what + " (converted first)", false, config, converted)) continue;
    expect_written_rows(what, fused, M, N, offsets, &nan_rows);
    const int64_t at = first_bit_difference(converted, fused);
    EXPECT_EQ(at, -1) << what << ": other bits than mxfp4_row_to_fp8_row + grouped_fprop_fp8_sm90, first at element "
                      << at << " (row " << at / N << ", column " << at % N << ")";
    if (exact) {
      const Errors e = errors_of(fused, y_ref, N, offsets, rows);
      std::cout << "[ sm90 mx  ] " << shape << ": " << what << " vs reference: " << e.str() << "\n";
      EXPECT_LT(e.rel_l2, kTol) << what << " vs reference, " << e.str();
      EXPECT_LT(e.max_rel(), kTol) << what << " vs reference, elementwise, " << e.str();
    }
  }
}

const std::vector<int32_t> kRagged8 = {300, 129, 0, 1, 517, 128, 64, 255};

std::vector<int32_t> random_sizes(int64_t G, int32_t max_size, int empty_one_in, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> sizes(static_cast<size_t>(G));
  for (auto& s : sizes) s = rng.below(empty_one_in) == 0 ? 0 : static_cast<int32_t>(1 + rng.below(max_size));
  return sizes;
}

TEST(GroupedGemmSm90Mxfp4, RaggedEightExperts) {
  REQUIRE_SM90();
  check_mx_case({"ragged8", 512, 1024, kRagged8}, 1);
  check_mx_case({"ragged8 block_n 128", 512, 1024, kRagged8, 0, 0, 128}, 2);
  check_mx_case({"ragged8 block_n 256", 512, 1024, kRagged8, 0, 0, 256}, 3);
}

TEST(GroupedGemmSm90Mxfp4, EmptyAndOneRowGroups) {
  REQUIRE_SM90();
  check_mx_case({"empty first and last", 256, 256, {0, 0, 190, 0, 1, 0}}, 4);
  check_mx_case({"one-row groups", 384, 512, {1, 1, 0, 1, 2, 1}}, 5);
  check_mx_case({"one group K 7168", 128, 7168, {333}}, 6);
}

TEST(GroupedGemmSm90Mxfp4, ManyExperts) {
  REQUIRE_SM90();
  check_mx_case({"32 experts", 256, 512, random_sizes(32, 200, 5, 7)}, 7);
  // K 384: 12 scale bytes per row, rows not 16-byte aligned in the scales.
  check_mx_case({"256 experts", 256, 384, random_sizes(256, 40, 3, 8)}, 8);
  check_mx_case({"256 experts block_n 256", 256, 512, random_sizes(256, 40, 3, 9), 0, 0, 256}, 9);
}

TEST(GroupedGemmSm90Mxfp4, DeepSeekV3Shapes) {
  REQUIRE_SM90();
  check_mx_case({"V3 gate/up small M", 4096, 7168, {37, 0, 129, 64, 1, 90, 200, 13}}, 10);
  check_mx_case({"V3 down small M", 7168, 2048, {5, 140, 0, 77, 256, 3, 0, 61}}, 11);
  check_mx_case({"V3 gate/up 8 x ~2048", 4096, 7168, {2011, 2300, 1790, 2048, 1999, 2203, 1877, 2156}}, 12);
}

TEST(GroupedGemmSm90Mxfp4, RowsOutsideTheGroupsAreUntouched) {
  REQUIRE_SM90();
  check_mx_case({"70 rows past o[G]", 256, 256, {100, 0, 57}, 70}, 14);
  check_mx_case({"45 rows before o[0], 20 past o[G]", 256, 384, {0, 150, 3}, 20, 45}, 15);
}

// NaN MX blocks (codes 0x7F after the direct rule, their rows NaN) and block exponents 40 apart in a group (the
// rule's rounding and E4M3 subnormals): the bits of convert-then-GEMM; the exact cases also against FP64.
TEST(GroupedGemmSm90Mxfp4, NanBlocksAndWideExponentSpread) {
  REQUIRE_SM90();
  check_mx_case({"ragged8 NaN blocks", 512, 1024, kRagged8, 0, 0, 0, true}, 16);
  check_mx_case({"NaN blocks block_n 256, rows outside", 256, 512, {0, 150, 3, 77}, 20, 45, 256, true}, 17);
  check_mx_case({"wide spread", 384, 640, {130, 0, 259, 7, 2}, 0, 0, 0, false, -30, 10}, 18);
  check_mx_case({"wide spread NaN blocks", 256, 1024, kRagged8, 0, 0, 128, true, -40, 0}, 19);
}

TEST(GroupedGemmSm90Mxfp4, RejectsShapesItDoesNotTile) {
  REQUIRE_SM90();
  DeviceBuffer<int32_t> offsets(9);
  EXPECT_THROW(grouped_fprop_mxfp4_sm90({nullptr, nullptr}, {nullptr, nullptr}, 64, 512, 2080, offsets.ptr, 8,
                                        nullptr, nullptr),
               Error);
}

}  // namespace
}  // namespace fp4moe
