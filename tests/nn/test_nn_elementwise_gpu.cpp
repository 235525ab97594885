// GPU elementwise glue (kernels/nn/elementwise.h) against the CPU reference, bit for bit: residual add and the
// FP32 -> BF16 cast (one RNE rounding each), the exact BF16 -> FP32 cast, the BF16-into-FP32 accumulation; vector
// and scalar paths, n = 0, and the rejection of an in-place cast. Outputs are NaN-poisoned and guarded.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "tests/common/nn_test_util.h"
#include "kernels/nn/elementwise.h"

namespace fp4moe {
namespace {

using test::Guarded;

std::vector<float> random_f32(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 100.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  if (n > 3) {  // specials: a tie to even, a value past the BF16 range, a NaN
    v[0] = 1.00390625f;  // 1 + 2^-8: exactly between two BF16 values
    v[1] = 3.4e38f;
    v[2] = std::nanf("");
  }
  return v;
}

bool same_bits(const std::vector<bf16>& a, const std::vector<bf16>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(bf16)) == 0;
}

TEST(NnElementwise, MatchesReferenceBitForBit) {
  FP4MOE_REQUIRE_DEVICE();
  for (const size_t n : {size_t{1}, size_t{7}, size_t{8}, size_t{4099}, size_t{65536}}) {
    for (const size_t shift : {size_t{0}, size_t{1}}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " shift=" + std::to_string(shift));
      const auto a = test::random_bf16(n, 11 + n), b = test::random_bf16(n, 12 + n);
      const auto x = random_f32(n, 13 + n);
      std::vector<bf16> add_ref(n), cast_ref(n);
      add_bf16_ref(a.data(), b.data(), n, add_ref.data());
      cast_f32_to_bf16_ref(x.data(), n, cast_ref.data());

      Guarded<bf16> a_d(n, shift), b_d(n, shift), y_d(n, shift), c_d(n, shift);
      Guarded<float> x_d(n, shift), back_d(n, shift);
      a_d.upload(a);
      b_d.upload(b);
      x_d.upload(x);
      add_bf16(a_d.ptr(), b_d.ptr(), n, y_d.ptr(), nullptr);
      cast_f32_to_bf16(x_d.ptr(), n, c_d.ptr(), nullptr);
      cast_bf16_to_f32(a_d.ptr(), n, back_d.ptr(), nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_TRUE(same_bits(y_d.download(), add_ref));
      EXPECT_TRUE(same_bits(c_d.download(), cast_ref));
      const auto back = back_d.download();
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(back[i], __bfloat162float(a[i])) << "i=" << i;
      EXPECT_TRUE(y_d.guards_intact() && c_d.guards_intact() && back_d.guards_intact());

      // In place (y aliases a) gives the same sum.
      add_bf16(a_d.ptr(), b_d.ptr(), n, a_d.ptr(), nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_TRUE(same_bits(a_d.download(), add_ref));
    }
  }
}

TEST(NnElementwise, AddBf16IntoF32MatchesReferenceBitForBit) {
  FP4MOE_REQUIRE_DEVICE();
  for (const size_t n : {size_t{1}, size_t{7}, size_t{8}, size_t{4099}, size_t{65536}}) {
    for (const size_t shift : {size_t{0}, size_t{1}}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " shift=" + std::to_string(shift));
      const auto x = test::random_bf16(n, 21 + n);
      const auto y0 = random_f32(n, 22 + n);
      std::vector<float> want = y0;
      add_bf16_into_f32_ref(x.data(), n, want.data());
      Guarded<bf16> x_d(n, shift);
      Guarded<float> y_d(n, shift);
      x_d.upload(x);
      y_d.upload(y0);
      add_bf16_into_f32(x_d.ptr(), n, y_d.ptr(), nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      const auto got = y_d.download();
      for (size_t i = 0; i < n; ++i) {  // bit for bit; a NaN sum (y0 holds one) may differ in its payload
        if (std::isnan(want[i])) {
          ASSERT_TRUE(std::isnan(got[i])) << "i=" << i;
        } else {
          ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0) << "i=" << i << ": " << got[i] << " vs "
                                                                       << want[i];
        }
      }
      EXPECT_TRUE(y_d.guards_intact());
    }
  }
  Guarded<float> y(64);
  EXPECT_THROW(add_bf16_into_f32(reinterpret_cast<const bf16*>(y.ptr() + 8), 16, y.ptr(), nullptr), Error);  // overlap
  EXPECT_NO_THROW(add_bf16_into_f32(nullptr, 0, nullptr, nullptr));
}

TEST(NnElementwise, RejectsBadArguments) {
  FP4MOE_REQUIRE_DEVICE();
  Guarded<float> x(64);
  EXPECT_THROW(cast_f32_to_bf16(x.ptr(), 16, reinterpret_cast<bf16*>(x.ptr() + 4), nullptr), Error);
  EXPECT_THROW(add_bf16(nullptr, nullptr, 4, nullptr, nullptr), Error);
  EXPECT_THROW(cast_bf16_to_f32(nullptr, -1, nullptr, nullptr), Error);
  EXPECT_NO_THROW(add_bf16(nullptr, nullptr, 0, nullptr, nullptr));
}

}  // namespace
}  // namespace fp4moe
