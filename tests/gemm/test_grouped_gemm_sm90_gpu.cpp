// The Hopper grouped FP8 GEMM (kernels/gemm/grouped_gemm_sm90.h), Fprop and Dgrad, against the CPU reference
// (FP64 sums of the exactly dequantized operands, grouped_gemm_ref.h) and against the cuBLASLt path
// (GroupedGemm::fprop_fp8 / dgrad_fp8) on the same operands.
//
// Operands are built on the host in the layouts of kernels/quant/layouts.h (random E4M3 codes, random block scales:
// grouped_gemm_test_util.h). Outputs are poisoned (NaN bf16) before every run; afterwards every row of a group must
// be finite and every row outside the groups (before o[0], at or past o[G]) still poisoned, bit for bit.
// Tolerance: relative L2 error per expert group 1e-2, and every compared element within 1e-2 of the largest
// reference value (BF16 output rounds to 2^-9 relative; an indexing or layout defect gives errors of order 1, a
// few wrong columns or rows fail the elementwise bound). Every case prints its worst group's relative L2 error and
// max |error| / max |reference| for the reference and for cuBLASLt, so that one run tells where a failure lies.
// The kernel's variants (Sm90GemmConfig: overlapped promotion, direct epilogue) run on every case beside the case's
// tile width: the same checks, and bit for bit the output of the default path (coalesced epilogue, no overlap) at
// the same width.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/gemm/grouped_gemm.h"
#include "kernels/gemm/grouped_gemm_heuristics.h"
#include "kernels/gemm/grouped_gemm_ref.h"
#include "kernels/gemm/grouped_gemm_sm90.h"
#include "tests/common/grouped_gemm_sm90_test_util.h"
#include "tests/common/grouped_gemm_test_util.h"

namespace fp4moe {
namespace {

using namespace test;

struct Case {
  std::string name;
  int64_t N, K;
  std::vector<int32_t> sizes;
  int64_t rows_after = 0;  // rows of the tensors past o[G], in no group (must stay untouched)
  ScaleKind scales = ScaleKind::pow2;
  int block_n = 0;         // Sm90GemmConfig
  int64_t rows_before = 0; // rows before o[0] (o[0] = rows_before), in no group (must stay untouched)
};

// One case: Fprop and Dgrad of the kernel against the reference and (when the split ends at M) cuBLASLt; the
// second Fprop run must give the same bits as the first; each variant of variants_of(block_n) passes the same checks
// and gives the bits of the default path at its tile width.
void check_case(const Case& c, uint64_t seed) {
  std::vector<int32_t> offsets = offsets_of(c.sizes);
  for (auto& o : offsets) o += static_cast<int32_t>(c.rows_before);
  const int64_t G = static_cast<int64_t>(c.sizes.size()), Mg = offsets[G], M = Mg + c.rows_after;
  const int64_t N = c.N, K = c.K;
  const std::string shape = fmt::format("{}: M={} ({} in groups) N={} K={} G={} block_n={}", c.name, M, Mg, N, K, G,
                                        c.block_n);
  SCOPED_TRACE(shape);
  Rng rng(seed);
  const HostFp8 x = make_row_tensor(M, K, c.scales, rng);
  const HostFp8 dy = make_row_tensor(M, N, c.scales, rng);
  const HostFp8 w = make_block_stack(G, N, K, c.scales, rng);
  const HostFp8 w_t = transpose_block_stack(w, G, N, K);
  const std::vector<int64_t> rows = rows_to_compare(offsets, Mg * N * K, int64_t{1} << 31, rng);
  std::vector<float> y_ref(M * N, 0.0f), dx_ref(M * K, 0.0f);
  {  // the reference takes a split of [0, rows in groups): the tensors from row o[0] on
    const int64_t r0 = c.rows_before;
    std::vector<int32_t> ref_offsets(offsets);
    for (auto& o : ref_offsets) o -= static_cast<int32_t>(r0);
    std::vector<int64_t> ref_rows(rows);
    for (auto& r : ref_rows) r -= r0;
    grouped_fprop_ref(x.deq.data() + r0 * K, w.deq.data(), Mg - r0, N, K, ref_offsets.data(), G,
                      y_ref.data() + r0 * N, ref_rows);
    grouped_dgrad_ref(dy.deq.data() + r0 * N, w.deq.data(), Mg - r0, N, K, ref_offsets.data(), G,
                      dx_ref.data() + r0 * K, ref_rows);
  }

  auto d_offsets = upload(offsets);
  auto d_x = upload(x.codes);
  auto d_xs = upload(x.scales);
  auto d_dy = upload(dy.codes);
  auto d_dys = upload(dy.scales);
  auto d_w = upload(w.codes);
  auto d_ws = upload(w.scales);
  auto d_wt = upload(w_t.codes);
  auto d_wts = upload(w_t.scales);
  const bool lt_comparable = c.rows_after == 0 && c.rows_before == 0;  // GroupedGemm takes splits of [0, M) only
  GroupedGemm lt_gemm;
  lt_gemm.set_tuning({1, Sm90Path::never});  // the per-expert cuBLASLt calls, never this kernel
  const GroupSplit split{d_offsets->ptr, offsets.data(), G};

  for (bool dgrad : {false, true}) {
    const int64_t P = dgrad ? K : N;
    const std::string op = dgrad ? "Dgrad" : "Fprop";
    const std::vector<float>& ref = dgrad ? dx_ref : y_ref;
    // The kernel's output with `config` into a freshly poisoned buffer; false (a failure added) if it threw.
    auto run_sm90 = [&](const std::string& what, Sm90GemmConfig config, std::vector<float>& got) {
      OutBuffer out(M * P, GemmOutType::bf16);
      auto* y = reinterpret_cast<bf16*>(out.buf.ptr);
      if (!run_case(what, [&] {
            if (dgrad)
              grouped_dgrad_fp8_sm90({d_dy->ptr, d_dys->ptr}, {d_wt->ptr, d_wts->ptr}, M, N, K, d_offsets->ptr, G, y,
                                     nullptr, config);
            else
              grouped_fprop_fp8_sm90({d_x->ptr, d_xs->ptr}, {d_w->ptr, d_ws->ptr}, M, N, K, d_offsets->ptr, G, y,
                                     nullptr, config);
          }))
        return false;
      got = out.download();
      return true;
    };
    std::vector<float> lt;  // cuBLASLt's output, when comparable
    if (lt_comparable) {
      OutBuffer lt_out(M * P, GemmOutType::bf16);
      if (run_case(op + " cuBLASLt", [&] {
            if (dgrad)
              lt_gemm.dgrad_fp8({d_dy->ptr, d_dys->ptr}, {d_wt->ptr, d_wts->ptr}, N, K, split, lt_out.output(),
                                nullptr);
            else
              lt_gemm.fprop_fp8({d_x->ptr, d_xs->ptr}, {d_w->ptr, d_ws->ptr}, N, K, split, lt_out.output(), nullptr);
          })) {
        lt = lt_out.download();
        std::cout << "[ sm90     ] " << shape << ": " << op
                  << " cuBLASLt vs reference: " << errors_of(lt, ref, P, offsets, rows).str() << "\n";
      }
    }
    // One output of the kernel: its rows written (and only those), against the reference and cuBLASLt.
    auto check_output = [&](const std::string& what, const std::vector<float>& got) {
      expect_written_rows(what, got, M, P, offsets);
      const Errors e = errors_of(got, ref, P, offsets, rows);
      std::cout << "[ sm90     ] " << shape << ": " << what << " vs reference: " << e.str() << "\n";
      EXPECT_LT(e.rel_l2, kTol) << what << " vs reference, " << e.str();
      EXPECT_LT(e.max_rel(), kTol) << what << " vs reference, elementwise, " << e.str();
      if (!lt.empty()) {
        const Errors vs_lt = errors_of(got, lt, P, offsets, rows);
        std::cout << "[ sm90     ] " << shape << ": " << what << " vs cuBLASLt: " << vs_lt.str() << "\n";
        EXPECT_LT(vs_lt.rel_l2, kTol) << what << " vs cuBLASLt, " << vs_lt.str();
      }
    };

    const std::string base_what = op + " sm90";
    std::vector<float> got;
    if (!run_sm90(base_what, Sm90GemmConfig{c.block_n}, got)) continue;
    check_output(base_what, got);
    if (!dgrad) {  // deterministic: the same bits again
      std::vector<float> again;
      if (run_sm90(base_what + " (again)", Sm90GemmConfig{c.block_n}, again)) {
        EXPECT_EQ(first_bit_difference(got, again), -1) << op << ": a second run gave other bits";
      }
    }
    // The variants: checked as above, and bit for bit the default path (no overlap, coalesced epilogue) at their width.
    std::vector<float> got128;  // the default path at 128 columns, for the overlapped variants of other widths
    for (const Sm90GemmConfig& v : variants_of(c.block_n)) {
      const std::string what = fmt::format("{} sm90 {}", op, variant_name(v));
      std::vector<float> vgot;
      if (!run_sm90(what, v, vgot)) continue;
      check_output(what, vgot);
      const bool own_width = !v.overlap_promotion || c.block_n == 128;
      if (!own_width && got128.empty() && !run_sm90(base_what + " block_n 128", Sm90GemmConfig{128}, got128)) continue;
      const int64_t at = first_bit_difference(own_width ? got : got128, vgot);
      EXPECT_EQ(at, -1) << what << ": other bits than the default path at the same tile width, first at element " << at
                        << " (row " << at / P << ", column " << at % P << ")";
    }
  }
}

std::vector<int32_t> random_sizes(int64_t G, int32_t max_size, int empty_one_in, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> sizes(static_cast<size_t>(G));
  for (auto& s : sizes)
    s = rng.below(empty_one_in) == 0 ? 0 : static_cast<int32_t>(1 + rng.below(max_size));
  return sizes;
}

// 8 ragged groups of a few hundred rows: an empty group, a one-row group, sizes not multiples of 128 (and 128).
const std::vector<int32_t> kRagged8 = {300, 129, 0, 1, 517, 128, 64, 255};

TEST(GroupedGemmSm90, RaggedEightExperts) {
  REQUIRE_SM90();
  check_case({"ragged8", 512, 1024, kRagged8}, 1);
  check_case({"ragged8 block_n 128", 512, 1024, kRagged8, 0, ScaleKind::pow2, 128}, 2);
  check_case({"ragged8 block_n 256", 512, 1024, kRagged8, 0, ScaleKind::pow2, 256}, 3);
}

TEST(GroupedGemmSm90, EmptyAndOneRowGroups) {
  REQUIRE_SM90();
  check_case({"empty first and last", 256, 256, {0, 0, 190, 0, 1, 0}}, 4);
  check_case({"one-row groups", 384, 512, {1, 1, 0, 1, 2, 1}}, 5);
  check_case({"one group", 128, 7168, {333}}, 6);
}

TEST(GroupedGemmSm90, ManyExperts) {
  REQUIRE_SM90();
  check_case({"32 experts", 256, 512, random_sizes(32, 200, 5, 7)}, 7);
  check_case({"256 experts", 256, 384, random_sizes(256, 40, 3, 8)}, 8);
  // K 512: Dgrad's output width is K, and a 256-wide tile needs it to be a multiple of 256.
  check_case({"256 experts block_n 256", 256, 512, random_sizes(256, 40, 3, 9), 0, ScaleKind::pow2, 256}, 9);
}

TEST(GroupedGemmSm90, DeepSeekV3ShapesSmallM) {
  REQUIRE_SM90();
  check_case({"V3 gate/up small M", 4096, 7168, {37, 0, 129, 64, 1, 90, 200, 13}}, 10);
  check_case({"V3 down small M", 7168, 2048, {5, 140, 0, 77, 256, 3, 0, 61}}, 11);
}

TEST(GroupedGemmSm90, DeepSeekV3GateUpEightByTwoThousand) {
  REQUIRE_SM90();
  check_case({"V3 gate/up 8 x ~2048", 4096, 7168, {2011, 2300, 1790, 2048, 1999, 2203, 1877, 2156}}, 12);
}

TEST(GroupedGemmSm90, Fp32Scales) {
  REQUIRE_SM90();
  check_case({"fp32 scales", 384, 640, {130, 0, 259, 7, 2}, 0, ScaleKind::fp32}, 13);
}

TEST(GroupedGemmSm90, RowsOutsideTheGroupsAreUntouched) {
  REQUIRE_SM90();
  check_case({"70 rows past o[G]", 256, 256, {100, 0, 57}, 70}, 14);
  check_case({"45 rows before o[0], 20 past o[G]", 256, 384, {0, 150, 3}, 20, ScaleKind::pow2, 0, 45}, 15);
}

// GroupedGemm::fprop_fp8 and dgrad_fp8 run this kernel by GroupedGemmTuning::sm90: always, and automatic with a mean
// group at or below kSm90MaxMeanGroupRows, give this kernel's bits and ask cuBLASLt nothing (a fresh GroupedGemm's
// cuBLASLt object then answered no heuristic query); never, and automatic above the threshold, run the cuBLASLt
// calls (queries > 0). Both outputs against the FP64 reference.
TEST(GroupedGemmSm90, GroupedGemmChoosesThePathByItsRule) {
  REQUIRE_SM90();
  const int64_t N = 256, K = 512;
  for (int64_t M : {int64_t{333}, kSm90MaxMeanGroupRows + 200}) {
    const std::string shape = fmt::format("M={} N={} K={} G=1", M, N, K);
    SCOPED_TRACE(shape);
    Rng rng(20 + M);
    const HostFp8 x = make_row_tensor(M, K, ScaleKind::pow2, rng);
    const HostFp8 w = make_block_stack(1, N, K, ScaleKind::pow2, rng);
    const std::vector<int32_t> offsets{0, static_cast<int32_t>(M)};
    std::vector<int64_t> rows(static_cast<size_t>(M));
    for (int64_t r = 0; r < M; ++r) rows[static_cast<size_t>(r)] = r;
    std::vector<float> ref(static_cast<size_t>(M * N), 0.0f);
    grouped_fprop_ref(x.deq.data(), w.deq.data(), M, N, K, offsets.data(), 1, ref.data(), rows);
    auto d_offsets = upload(offsets);
    auto d_x = upload(x.codes);
    auto d_xs = upload(x.scales);
    auto d_w = upload(w.codes);
    auto d_ws = upload(w.scales);
    const GroupSplit split{d_offsets->ptr, offsets.data(), 1};
    const std::vector<float> direct = [&] {  // the kernel called directly
      OutBuffer out(M * N, GemmOutType::bf16);
      grouped_fprop_fp8_sm90({d_x->ptr, d_xs->ptr}, {d_w->ptr, d_ws->ptr}, M, N, K, d_offsets->ptr, 1,
                             reinterpret_cast<bf16*>(out.buf.ptr), nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      return out.download();
    }();
    const bool prefers = grouped_gemm_prefers_sm90(M, 1);
    EXPECT_EQ(prefers, M <= kSm90MaxMeanGroupRows);
    for (Sm90Path path : {Sm90Path::always, Sm90Path::automatic, Sm90Path::never}) {
      const bool sm90 = path == Sm90Path::always || (path == Sm90Path::automatic && prefers);
      const std::string what = fmt::format("{} path {}", shape, static_cast<int>(path));
      GroupedGemm gemm;
      gemm.set_tuning({1, path});
      OutBuffer out(M * N, GemmOutType::bf16);
      gemm.fprop_fp8({d_x->ptr, d_xs->ptr}, {d_w->ptr, d_ws->ptr}, N, K, split, out.output(), nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<float> got = out.download();
      EXPECT_EQ(gemm.lt().heuristic_queries() == 0, sm90) << what << ": expected the "
                                                          << (sm90 ? "Hopper kernel" : "cuBLASLt calls");
      if (sm90) {
        EXPECT_EQ(first_bit_difference(got, direct), -1) << what << ": not the kernel's bits";
      }
      const Errors e = errors_of(got, ref, N, offsets, rows);
      EXPECT_LT(e.rel_l2, kTol) << what << ": " << e.str();
      EXPECT_LT(e.max_rel(), kTol) << what << ": " << e.str();
    }
  }
}

TEST(GroupedGemmSm90, RejectsShapesItDoesNotTile) {
  REQUIRE_SM90();
  EXPECT_NE(grouped_gemm_sm90_unsupported(576, 2048, 8).find("multiples of 128"), std::string::npos);
  EXPECT_EQ(grouped_gemm_sm90_unsupported(4096, 7168, 8), "") << "the V3 shapes run on this device";
  EXPECT_THROW(grouped_fprop_fp8_sm90({nullptr, nullptr}, {nullptr, nullptr}, 64, 576, 2048, nullptr, 8, nullptr,
                                      nullptr),
               Error);
}

}  // namespace
}  // namespace fp4moe
