// CPU reference of the MLA data movements (kernels/nn/mla_ops.h): where each element of the assembled keys comes
// from, split dK as the exact adjoint of assemble K (on integers, where every sum is exact), k_pe as a column
// slice of a wider tensor, the fixed head order of the dk_pe sum, and rejections.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/nn/mla_ops.h"
#include "tests/common/nn_ref_test_util.h"

namespace fp4moe {
namespace {

using test::bf16_to_f64;
using test::f64_to_bf16;

// Small integers (exact in BF16, and so are their sums and products here).
std::vector<bf16> integers(size_t n, uint32_t seed) {
  std::vector<bf16> v(n);
  std::mt19937 rng(seed);
  for (auto& x : v) x = f64_to_bf16(static_cast<double>(static_cast<int>(rng() % 9) - 4));
  return v;
}

TEST(NnRefMlaOps, AssembleKTakesNopeFromEachHeadAndTheSharedRopeKey) {
  const MlaDims dims{3, 4, 2, 5};
  const int64_t M = 2, dqk = 6, dkv = 9, pe_stride = 7, pe_offset = 5;  // k_pe: columns 5, 6 of a [M, 7] tensor
  std::vector<bf16> kv(M * dims.H * dkv), wide(M * pe_stride), k(M * dims.H * dqk);
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = f64_to_bf16(static_cast<double>(i));
  for (size_t i = 0; i < wide.size(); ++i) wide[i] = f64_to_bf16(-1.0 - static_cast<double>(i));
  mla_assemble_k_ref(kv.data(), wide.data() + pe_offset, pe_stride, M, dims, k.data());
  for (int64_t m = 0; m < M; ++m)
    for (int64_t h = 0; h < dims.H; ++h)
      for (int64_t i = 0; i < dqk; ++i) {
        const double expected = i < dims.nope ? bf16_to_f64(kv[(m * dims.H + h) * dkv + i])
                                              : bf16_to_f64(wide[m * pe_stride + pe_offset + i - dims.nope]);
        EXPECT_EQ(bf16_to_f64(k[(m * dims.H + h) * dqk + i]), expected) << "m=" << m << " h=" << h << " i=" << i;
      }
}

TEST(NnRefMlaOps, SplitDkIsTheAdjointOfAssembleK) {
  // <assemble(kv, k_pe), dk> = <kv, dkv> + <k_pe, dk_pe> for every kv, k_pe, dk (the v part of dkv is zero here);
  // integers keep every sum exact, so the identity holds exactly.
  const MlaDims dims{4, 8, 6, 10};
  const int64_t M = 5, dqk = 14, dkv_dim = 18;
  const auto kv = integers(M * dims.H * dkv_dim, 1), k_pe = integers(M * dims.rope, 2);
  const auto dk = integers(M * dims.H * dqk, 3);
  std::vector<bf16> k(M * dims.H * dqk), dk_pe(M * dims.rope);
  std::vector<bf16> dkv(M * dims.H * dkv_dim, f64_to_bf16(0.0));
  mla_assemble_k_ref(kv.data(), k_pe.data(), dims.rope, M, dims, k.data());
  mla_split_dk_ref(dk.data(), M, dims, dkv.data(), dk_pe.data(), dims.rope);
  double lhs = 0, rhs = 0;
  for (size_t i = 0; i < k.size(); ++i) lhs += bf16_to_f64(k[i]) * bf16_to_f64(dk[i]);
  for (size_t i = 0; i < kv.size(); ++i) rhs += bf16_to_f64(kv[i]) * bf16_to_f64(dkv[i]);
  for (size_t i = 0; i < k_pe.size(); ++i) rhs += bf16_to_f64(k_pe[i]) * bf16_to_f64(dk_pe[i]);
  EXPECT_EQ(lhs, rhs);
}

TEST(NnRefMlaOps, SplitDkLeavesTheValuePartAndWritesAStridedDkPe) {
  const MlaDims dims{2, 2, 2, 3};
  const int64_t M = 1, pe_stride = 5;
  const std::vector<bf16> dk = test::to_bf16({1, 2, 3, 4, /*head 1*/ 5, 6, 7, 8});
  std::vector<bf16> dkv(2 * 5, f64_to_bf16(-9.0)), dk_pe(pe_stride, f64_to_bf16(-7.0));
  mla_split_dk_ref(dk.data(), M, dims, dkv.data(), dk_pe.data() + 1, pe_stride);
  const std::vector<double> expected_dkv = {1, 2, -9, -9, -9, 5, 6, -9, -9, -9};
  const std::vector<double> expected_pe = {-7, 3 + 7, 4 + 8, -7, -7};
  EXPECT_EQ(test::to_f64(dkv), expected_dkv);
  EXPECT_EQ(test::to_f64(dk_pe), expected_pe);
}

TEST(NnRefMlaOps, DkPeSumsHeadsInIncreasingOrder) {
  // Rope values over heads 2^20, -2^20, 1 + 2^-7 (exact in BF16): in head order the FP32 sum is 0 + (1 + 2^-7);
  // in reverse, -2^20 + (1 + 2^-7) rounds to -2^20 + 1 (FP32 ulp 2^-3 there) and the result is 1.
  const MlaDims dims{3, 1, 1, 1};
  const std::vector<bf16> dk = test::to_bf16({0, std::ldexp(1.0, 20), 0, -std::ldexp(1.0, 20), 0, 1 + 1.0 / 128});
  std::vector<bf16> dkv(3 * 2), dk_pe(1);
  mla_split_dk_ref(dk.data(), 1, dims, dkv.data(), dk_pe.data(), 1);
  EXPECT_EQ(bf16_to_f64(dk_pe[0]), 1 + 1.0 / 128);
}

TEST(NnRefMlaOps, Rejections) {
  std::vector<bf16> a(64), b(64), c(64);
  test::expect_error_mentions([&] { mla_assemble_k_ref(a.data(), b.data(), 2, -1, MlaDims{1, 2, 2, 2}, c.data()); },
                              {"mla_assemble_k_ref", "M must be >= 0"});
  test::expect_error_mentions([&] { mla_assemble_k_ref(a.data(), b.data(), 2, 1, MlaDims{0, 2, 2, 2}, c.data()); },
                              {"H must be >= 1"});
  test::expect_error_mentions([&] { mla_split_dk_ref(a.data(), 1, MlaDims{1, 2, 0, 2}, b.data(), c.data(), 2); },
                              {"mla_split_dk_ref", "rope must be >= 1"});
  test::expect_error_mentions([&] { mla_split_dk_ref(a.data(), 1, MlaDims{1, 2, 4, 2}, b.data(), c.data(), 3); },
                              {"pe_stride=3 is below rope=4"});
}

}  // namespace
}  // namespace fp4moe
