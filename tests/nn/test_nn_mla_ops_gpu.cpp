// GPU MLA data movements (kernels/nn/mla_ops.h) against their CPU reference, bit for bit: assemble K and split dK
// (the head sum of dk_pe in fixed order), the 16-byte and 2-byte paths, k_pe / dk_pe as a column slice of the
// kv down-projection output, the v part of dkv left alone. Shapes: the tiny model's MLA (4 heads, 16 + 16, v 16),
// DeepSeek-V3's (128 heads, 128 + 64, v 128, k_pe at column 512 of [M, 576]), and odd sizes. Outputs NaN-poisoned
// and guarded.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/common/nn_test_util.h"
#include "kernels/nn/mla_ops.h"

namespace fp4moe {
namespace {

using test::Guarded;

struct Case {
  int64_t M;
  MlaDims dims;
  int64_t pe_stride, pe_offset;  // k_pe = column pe_offset of a [M, pe_stride] tensor
  size_t shift;                  // 1: tensors shifted by one element (2-byte path)
};

const Case kCases[] = {{256, {4, 16, 16, 16}, 48, 32, 0},   {64, {128, 128, 64, 128}, 576, 512, 0},
                       {7, {3, 5, 6, 7}, 6, 0, 0},          {33, {2, 8, 8, 16}, 8, 0, 1},
                       {1, {1, 8, 8, 8}, 24, 16, 0},        {129, {16, 64, 32, 64}, 32, 0, 0}};

std::string name_of(const Case& c) {
  return "M=" + std::to_string(c.M) + " H=" + std::to_string(c.dims.H) + " nope=" + std::to_string(c.dims.nope) +
         " rope=" + std::to_string(c.dims.rope) + " dv=" + std::to_string(c.dims.dv) +
         " pe_stride=" + std::to_string(c.pe_stride) + (c.shift ? " (shifted)" : "");
}

TEST(NnMlaOps, AssembleKMatchesReference) {
  FP4MOE_REQUIRE_DEVICE();
  for (const Case& tc : kCases) {
    SCOPED_TRACE(name_of(tc));
    const MlaDims& dm = tc.dims;
    const int64_t n_kv = tc.M * dm.H * (dm.nope + dm.dv), n_k = tc.M * dm.H * (dm.nope + dm.rope);
    const auto kv = test::random_bf16(n_kv, 1), wide = test::random_bf16(tc.M * tc.pe_stride, 2);
    std::vector<bf16> ref(n_k);
    mla_assemble_k_ref(kv.data(), wide.data() + tc.pe_offset, tc.pe_stride, tc.M, dm, ref.data());
    Guarded<bf16> kv_d(n_kv, tc.shift), wide_d(tc.M * tc.pe_stride, tc.shift), k_d(n_k, tc.shift);
    kv_d.upload(kv);
    wide_d.upload(wide);
    mla_assemble_k(kv_d.ptr(), wide_d.ptr() + tc.pe_offset, tc.pe_stride, tc.M, dm, k_d.ptr(), nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    test::expect_bitwise_equal(k_d.download(), ref, "k");
    EXPECT_TRUE(k_d.guards_intact());
  }
}

TEST(NnMlaOps, SplitDkMatchesReference) {
  FP4MOE_REQUIRE_DEVICE();
  for (const Case& tc : kCases) {
    SCOPED_TRACE(name_of(tc));
    const MlaDims& dm = tc.dims;
    const int64_t n_kv = tc.M * dm.H * (dm.nope + dm.dv), n_k = tc.M * dm.H * (dm.nope + dm.rope);
    const int64_t n_wide = tc.M * tc.pe_stride;
    const auto dk = test::random_bf16(n_k, 3);
    const auto dkv0 = test::random_bf16(n_kv, 4), wide0 = test::random_bf16(n_wide, 5);  // what must survive
    std::vector<bf16> dkv_ref = dkv0, wide_ref = wide0;
    mla_split_dk_ref(dk.data(), tc.M, dm, dkv_ref.data(), wide_ref.data() + tc.pe_offset, tc.pe_stride);
    Guarded<bf16> dk_d(n_k, tc.shift), dkv_d(n_kv, tc.shift), wide_d(n_wide, tc.shift);
    dk_d.upload(dk);
    dkv_d.upload(dkv0);
    wide_d.upload(wide0);
    mla_split_dk(dk_d.ptr(), tc.M, dm, dkv_d.ptr(), wide_d.ptr() + tc.pe_offset, tc.pe_stride, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    test::expect_bitwise_equal(dkv_d.download(), dkv_ref, "dkv (k_nope written, v untouched)");
    test::expect_bitwise_equal(wide_d.download(), wide_ref, "dk_pe (other columns untouched)");
    EXPECT_TRUE(dkv_d.guards_intact());
    EXPECT_TRUE(wide_d.guards_intact());
  }
}

TEST(NnMlaOps, Rejections) {
  FP4MOE_REQUIRE_DEVICE();
  Guarded<bf16> a(1024), b(1024), c(1024);
  EXPECT_THROW(mla_assemble_k(nullptr, b.ptr(), 8, 4, MlaDims{2, 8, 8, 8}, c.ptr(), nullptr), Error);
  EXPECT_THROW(mla_assemble_k(a.ptr(), b.ptr(), 4, 4, MlaDims{2, 8, 8, 8}, c.ptr(), nullptr), Error);
  EXPECT_THROW(mla_split_dk(a.ptr(), 4, MlaDims{2, 8, 8, 0}, b.ptr(), c.ptr(), 8, nullptr), Error);
  mla_assemble_k(nullptr, nullptr, 8, 0, MlaDims{2, 8, 8, 8}, nullptr, nullptr);  // M = 0: nothing to do
}

}  // namespace
}  // namespace fp4moe
