// GPU MoE permutation (kernels/nn/permute.h) against its CPU reference: the map (row_of, assignment_of) from the
// device counts and offsets, permute forward (a copy, vectorised and scalar paths), permute backward, the weighted
// combine and its backward. Every BF16 output must equal the float reference rounded to BF16, bit for bit (same
// slot order, no FMA); the combine-weight gradient dw, a reduction over D, is compared up to its rounding bound.
// Shapes from a single token and D = 1 to 4099 tokens x 7168 features, top-k = E, experts without tokens.
// Outputs are poisoned before each run; a second run must reproduce every bit.
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
#include "kernels/nn/permute.h"
#include "kernels/nn/router.h"

namespace fp4moe {
namespace {

using test::DeviceBuffer;

struct Shape {
  int64_t T, k, E, D;
};
const Shape kShapes[] = {{1, 1, 1, 1},     {37, 2, 8, 7},      {37, 6, 64, 64},  {513, 3, 3, 24},
                         {4099, 8, 256, 136}, {300, 8, 32, 7168}, {64, 4, 300, 2050}, {1, 8, 8, 576}};

// Distinct experts per token; experts e % 5 == 2 get no token when there are enough others.
std::vector<int32_t> assignments(const Shape& s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> pool;
  for (int32_t e = 0; e < s.E; ++e)
    if (e % 5 != 2) pool.push_back(e);
  if (static_cast<int64_t>(pool.size()) < s.k) {
    pool.resize(s.E);
    for (int32_t e = 0; e < s.E; ++e) pool[e] = e;
  }
  std::vector<int32_t> idx(s.T * s.k);
  for (int64_t t = 0; t < s.T; ++t) {
    std::shuffle(pool.begin(), pool.end(), rng);
    for (int64_t j = 0; j < s.k; ++j) idx[t * s.k + j] = pool[j];
  }
  return idx;
}

// BF16 N(0, 1) values and their exact float widenings.
void random_bf16(size_t n, uint32_t seed, std::vector<bf16>& b, std::vector<float>& f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  b.resize(n);
  f.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const uint16_t bits = f32_to_bf16_bits(nd(rng));
    b[i] = bf16_from_bits(bits);
    f[i] = bf16_bits_to_f32(bits);
  }
}

std::vector<uint16_t> bits_of(const std::vector<bf16>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = bf16_bits(v[i]);
  return out;
}

std::vector<uint16_t> rounded(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = f32_to_bf16_bits(v[i]);
  return out;
}

// Index of the first differing element, or -1.
template <typename T>
int64_t first_mismatch(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return static_cast<int64_t>(i);
  return -1;
}

struct Results {
  std::vector<int32_t> row_of, assignment_of;
  std::vector<uint16_t> xs, dx, y, dys;
  std::vector<float> dw;
};

void check_permute(const Shape& s) {
  SCOPED_TRACE("T=" + std::to_string(s.T) + " k=" + std::to_string(s.k) + " E=" + std::to_string(s.E) +
               " D=" + std::to_string(s.D));
  const int64_t n = s.T * s.k;
  const auto idx = assignments(s, static_cast<uint32_t>(s.T + 7 * s.E));
  std::vector<bf16> x, dxs, ys, dy;
  std::vector<float> xf, dxsf, ysf, dyf;
  random_bf16(s.T * s.D, 1, x, xf);
  random_bf16(n * s.D, 2, dxs, dxsf);
  random_bf16(n * s.D, 3, ys, ysf);
  random_bf16(s.T * s.D, 4, dy, dyf);
  std::vector<float> w(n);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (auto& v : w) v = u(rng);

  DeviceBuffer<int32_t> d_idx(n), counts(s.E), offsets(s.E + 1), row_of(n), assignment_of(n);
  DeviceBuffer<bf16> d_x(s.T * s.D), d_xs(n * s.D), d_dxs(n * s.D), d_dx(s.T * s.D), d_ys(n * s.D), d_y(s.T * s.D),
      d_dy(s.T * s.D), d_dys(n * s.D);
  DeviceBuffer<float> d_w(n), d_dw(n);
  d_idx.upload(idx);
  d_x.upload(x);
  d_dxs.upload(dxs);
  d_ys.upload(ys);
  d_dy.upload(dy);
  d_w.upload(w);

  auto run = [&] {
    for (auto* b : {&counts, &offsets, &row_of, &assignment_of}) b->poison(0xFF);
    for (auto* b : {&d_xs, &d_dx, &d_y, &d_dys}) b->poison(0xFF);  // BF16 NaN
    d_dw.poison(0xFF);
    expert_counts_and_offsets(d_idx.ptr, s.T, s.k, s.E, counts.ptr, offsets.ptr, nullptr);
    permute_map(d_idx.ptr, offsets.ptr, s.T, s.k, s.E, row_of.ptr, assignment_of.ptr, nullptr);
    permute_forward(d_x.ptr, assignment_of.ptr, s.T, s.k, s.D, d_xs.ptr, nullptr);
    permute_backward(d_dxs.ptr, row_of.ptr, s.T, s.k, s.D, d_dx.ptr, nullptr);
    unpermute_forward(d_ys.ptr, d_w.ptr, row_of.ptr, s.T, s.k, s.D, d_y.ptr, nullptr);
    unpermute_backward(d_dy.ptr, d_ys.ptr, d_w.ptr, row_of.ptr, s.T, s.k, s.D, d_dys.ptr, d_dw.ptr, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    return Results{row_of.download(),        assignment_of.download(), bits_of(d_xs.download()),
                   bits_of(d_dx.download()), bits_of(d_y.download()),  bits_of(d_dys.download()),
                   d_dw.download()};
  };
  const Results g = run();

  std::vector<int32_t> r_counts(s.E), r_offsets(s.E + 1), r_row_of(n), r_assignment_of(n);
  permute_map_ref(idx.data(), s.T, s.k, s.E, r_counts.data(), r_offsets.data(), r_row_of.data(),
                  r_assignment_of.data());
  EXPECT_EQ(counts.download(), r_counts);
  EXPECT_EQ(offsets.download(), r_offsets);
  ASSERT_EQ(g.row_of, r_row_of);
  ASSERT_EQ(g.assignment_of, r_assignment_of);

  std::vector<float> r_xs(n * s.D), r_dx(s.T * s.D), r_y(s.T * s.D), r_dys(n * s.D), r_dw(n);
  permute_forward_ref<float>(xf.data(), r_assignment_of.data(), s.T, s.k, s.D, r_xs.data());
  permute_backward_ref<float>(dxsf.data(), r_row_of.data(), s.T, s.k, s.D, r_dx.data());
  unpermute_forward_ref<float>(ysf.data(), w.data(), r_row_of.data(), s.T, s.k, s.D, r_y.data());
  unpermute_backward_ref<float>(dyf.data(), ysf.data(), w.data(), r_row_of.data(), s.T, s.k, s.D, r_dys.data(),
                                r_dw.data());
  EXPECT_EQ(first_mismatch(g.xs, rounded(r_xs)), -1) << "permute forward";
  EXPECT_EQ(first_mismatch(g.dx, rounded(r_dx)), -1) << "permute backward";
  EXPECT_EQ(first_mismatch(g.y, rounded(r_y)), -1) << "unpermute forward";
  EXPECT_EQ(first_mismatch(g.dys, rounded(r_dys)), -1) << "unpermute backward dys";
  // dw: a sum of D products in another order; bound by D * 2^-23 * sum |products|.
  for (int64_t t = 0; t < s.T; ++t)
    for (int64_t j = 0; j < s.k; ++j) {
      const int64_t r = r_row_of[t * s.k + j];
      double abs_sum = 0;
      for (int64_t d = 0; d < s.D; ++d) abs_sum += std::fabs(double(dyf[t * s.D + d]) * ysf[r * s.D + d]);
      const double tol = (static_cast<double>(s.D) + 2) * 1.2e-7 * abs_sum + 1e-30;
      ASSERT_NEAR(g.dw[t * s.k + j], r_dw[t * s.k + j], tol) << "dw token " << t << " slot " << j;
    }

  const Results again = run();
  EXPECT_TRUE(again.xs == g.xs && again.dx == g.dx && again.y == g.y && again.dys == g.dys &&
              first_mismatch(again.dw, g.dw) == -1)
      << "a second run must reproduce every bit";
}

TEST(NnMoePermute, MatchesReferenceBitForBit) {
  FP4MOE_REQUIRE_DEVICE();
  for (const Shape& s : kShapes) check_permute(s);
}

TEST(NnMoePermute, MisalignedRowsTakeTheScalarPath) {
  FP4MOE_REQUIRE_DEVICE();
  // D % 8 == 0 but x offset by one element: the 16-byte path must not be taken; the copy stays exact.
  const Shape s{50, 2, 4, 64};
  const auto idx = assignments(s, 3);
  std::vector<bf16> x;
  std::vector<float> xf;
  random_bf16(s.T * s.D + 1, 6, x, xf);
  DeviceBuffer<int32_t> d_idx(s.T * s.k), counts(s.E), offsets(s.E + 1), row_of(s.T * s.k), assignment_of(s.T * s.k);
  DeviceBuffer<bf16> d_x(s.T * s.D + 1), d_xs(s.T * s.k * s.D);
  d_idx.upload(idx);
  d_x.upload(x);
  d_xs.poison(0xFF);
  expert_counts_and_offsets(d_idx.ptr, s.T, s.k, s.E, counts.ptr, offsets.ptr, nullptr);
  permute_map(d_idx.ptr, offsets.ptr, s.T, s.k, s.E, row_of.ptr, assignment_of.ptr, nullptr);
  permute_forward(d_x.ptr + 1, assignment_of.ptr, s.T, s.k, s.D, d_xs.ptr, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  const auto a = assignment_of.download();
  const auto xs = bits_of(d_xs.download());
  for (int64_t r = 0; r < s.T * s.k; ++r)
    for (int64_t d = 0; d < s.D; ++d)
      ASSERT_EQ(xs[r * s.D + d], bf16_bits(x[1 + (a[r] / s.k) * s.D + d])) << "row " << r << " feature " << d;
}

TEST(NnMoePermute, ZeroTokensLaunchNothing) {
  FP4MOE_REQUIRE_DEVICE();
  permute_map(nullptr, nullptr, 0, 2, 4, nullptr, nullptr, nullptr);
  permute_forward(nullptr, nullptr, 0, 2, 16, nullptr, nullptr);
  permute_backward(nullptr, nullptr, 0, 2, 16, nullptr, nullptr);
  unpermute_forward(nullptr, nullptr, nullptr, 0, 2, 16, nullptr, nullptr);
  unpermute_backward(nullptr, nullptr, nullptr, nullptr, 0, 2, 16, nullptr, nullptr, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace fp4moe
