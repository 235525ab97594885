// CPU reference of the MoE permutation (kernels/nn/permute.h): the map on a hand-computed case (stable order,
// an expert without tokens), permute/unpermute on hand values, adjointness of permute forward and backward, the
// unpermute backward (dys and the combine-weight gradient) against finite differences in double, and rejections.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/nn/permute.h"
#include "tests/common/nn_ref_test_util.h"

namespace fp4moe {
namespace {

using test::expect_error_mentions;

struct Map {
  std::vector<int32_t> counts, offsets, row_of, assignment_of;
};

Map make_map(const std::vector<int32_t>& idx, int64_t T, int64_t k, int64_t E) {
  Map m{std::vector<int32_t>(E, -1), std::vector<int32_t>(E + 1, -1), std::vector<int32_t>(T * k, -1),
        std::vector<int32_t>(T * k, -1)};
  permute_map_ref(idx.data(), T, k, E, m.counts.data(), m.offsets.data(), m.row_of.data(), m.assignment_of.data());
  return m;
}

// Distinct experts per token, drawn from `allowed` (so that the others get no tokens).
std::vector<int32_t> random_assignments(int64_t T, int64_t k, const std::vector<int32_t>& allowed, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> idx(T * k), pool = allowed;
  for (int64_t t = 0; t < T; ++t) {
    std::shuffle(pool.begin(), pool.end(), rng);
    for (int64_t j = 0; j < k; ++j) idx[t * k + j] = pool[j];
  }
  return idx;
}

std::vector<double> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-2.0, 2.0);
  std::vector<double> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

TEST(NnRefPermute, MapHandComputed) {
  // T = 3, k = 2, E = 4: token 0 -> (1, 0), token 1 -> (1, 3), token 2 -> (0, 1); expert 2 gets nothing.
  const std::vector<int32_t> idx = {1, 0, 1, 3, 0, 1};
  Map m = make_map(idx, 3, 2, 4);
  EXPECT_EQ(m.counts, (std::vector<int32_t>{2, 3, 0, 1}));
  EXPECT_EQ(m.offsets, (std::vector<int32_t>{0, 2, 5, 5, 6}));
  // Expert 0: assignments 1, 4 -> rows 0, 1; expert 1: 0, 2, 5 -> rows 2, 3, 4; expert 3: 3 -> row 5.
  EXPECT_EQ(m.row_of, (std::vector<int32_t>{2, 0, 3, 5, 1, 4}));
  EXPECT_EQ(m.assignment_of, (std::vector<int32_t>{1, 4, 0, 2, 5, 3}));
}

TEST(NnRefPermute, MapIsAStablePermutation) {
  const int64_t T = 97, k = 4, E = 16;
  std::vector<int32_t> allowed;
  for (int32_t e = 0; e < E; ++e)
    if (e != 3 && e != 11) allowed.push_back(e);
  auto idx = random_assignments(T, k, allowed, 1);
  Map m = make_map(idx, T, k, E);
  EXPECT_EQ(m.counts[3], 0);
  EXPECT_EQ(m.counts[11], 0);
  EXPECT_EQ(m.offsets[E], T * k);
  for (int64_t a = 0; a < T * k; ++a) {
    const int32_t r = m.row_of[a], e = idx[a];
    EXPECT_EQ(m.assignment_of[r], a);
    EXPECT_GE(r, m.offsets[e]);
    EXPECT_LT(r, m.offsets[e + 1]);
  }
  for (int64_t e = 0; e < E; ++e)  // within an expert: token order
    for (int32_t r = m.offsets[e] + 1; r < m.offsets[e + 1]; ++r)
      EXPECT_LT(m.assignment_of[r - 1], m.assignment_of[r]);
}

TEST(NnRefPermute, TopKEqualsExpertCount) {
  const int64_t T = 5, k = 3, E = 3;
  auto idx = random_assignments(T, k, {0, 1, 2}, 2);
  Map m = make_map(idx, T, k, E);
  EXPECT_EQ(m.counts, std::vector<int32_t>(E, T));
  for (int64_t e = 0; e < E; ++e)
    for (int64_t i = 0; i < T; ++i) EXPECT_EQ(m.assignment_of[e * T + i] / k, i) << "expert " << e;
}

TEST(NnRefPermute, ForwardAndCombineHandComputed) {
  const std::vector<int32_t> idx = {1, 0, 1, 3, 0, 1};  // as MapHandComputed
  Map m = make_map(idx, 3, 2, 4);
  const std::vector<double> x = {10, 11, 20, 21, 30, 31};  // [3, 2]
  std::vector<double> xs(12, -1);
  permute_forward_ref<double>(x.data(), m.assignment_of.data(), 3, 2, 2, xs.data());
  EXPECT_EQ(xs, (std::vector<double>{10, 11, 30, 31, 10, 11, 20, 21, 30, 31, 20, 21}));

  // Expert outputs = the rows' own values times (1 + row); combine with weights (0.5, 0.25), (1, 2), (3, -1).
  std::vector<double> ys(12);
  for (int r = 0; r < 6; ++r)
    for (int d = 0; d < 2; ++d) ys[r * 2 + d] = xs[r * 2 + d] * (1 + r);
  const std::vector<double> w = {0.5, 0.25, 1, 2, 3, -1};
  std::vector<double> y(6, -1);
  unpermute_forward_ref<double>(ys.data(), w.data(), m.row_of.data(), 3, 2, 2, y.data());
  // token 0: slot 0 -> row 2 (x3), slot 1 -> row 0 (x1): 0.5*3x + 0.25*1x = 1.75x
  // token 1: slot 0 -> row 3 (x4), slot 1 -> row 5 (x6): 1*4x + 2*6x = 16x
  // token 2: slot 0 -> row 1 (x2), slot 1 -> row 4 (x5): 3*2x - 1*5x = 1x
  EXPECT_EQ(y, (std::vector<double>{1.75 * 10, 1.75 * 11, 16 * 20, 16 * 21, 30, 31}));
}

TEST(NnRefPermute, SingleExpertWithUnitWeightRoundTrips) {
  const int64_t T = 9, D = 5;
  std::vector<int32_t> idx = random_assignments(T, 1, {0, 1, 2, 3}, 3);
  Map m = make_map(idx, T, 1, 4);
  auto x = random_values(T * D, 4);
  std::vector<double> xs(T * D), y(T * D), ones(T, 1.0);
  permute_forward_ref<double>(x.data(), m.assignment_of.data(), T, 1, D, xs.data());
  unpermute_forward_ref<double>(xs.data(), ones.data(), m.row_of.data(), T, 1, D, y.data());
  EXPECT_EQ(y, x);
}

TEST(NnRefPermute, PermuteBackwardIsTheAdjoint) {
  // <permute(x), g> = <x, permute_backward(g)> for every x, g.
  const int64_t T = 23, k = 3, E = 7, D = 6;
  auto idx = random_assignments(T, k, {0, 1, 2, 4, 5, 6}, 5);
  Map m = make_map(idx, T, k, E);
  auto x = random_values(T * D, 6), g = random_values(T * k * D, 7);
  std::vector<double> xs(T * k * D), dx(T * D, -99);
  permute_forward_ref<double>(x.data(), m.assignment_of.data(), T, k, D, xs.data());
  permute_backward_ref<double>(g.data(), m.row_of.data(), T, k, D, dx.data());
  double lhs = 0, rhs = 0;
  for (size_t i = 0; i < xs.size(); ++i) lhs += xs[i] * g[i];
  for (size_t i = 0; i < x.size(); ++i) rhs += x[i] * dx[i];
  EXPECT_NEAR(lhs, rhs, 1e-12 * (1 + std::fabs(lhs)));
}

TEST(NnRefPermute, UnpermuteBackwardMatchesFiniteDifferences) {
  const int64_t T = 6, k = 3, E = 5, D = 4;
  auto idx = random_assignments(T, k, {0, 1, 3, 4}, 8);
  Map m = make_map(idx, T, k, E);
  auto ys = random_values(T * k * D, 9), w = random_values(T * k, 10), gy = random_values(T * D, 11);
  auto loss = [&](const std::vector<double>& ys_, const std::vector<double>& w_) {
    std::vector<double> y(T * D);
    unpermute_forward_ref<double>(ys_.data(), w_.data(), m.row_of.data(), T, k, D, y.data());
    double L = 0;
    for (int64_t i = 0; i < T * D; ++i) L += gy[i] * y[i];
    return L;
  };
  std::vector<double> dys(T * k * D, -99), dw(T * k, -99);
  unpermute_backward_ref<double>(gy.data(), ys.data(), w.data(), m.row_of.data(), T, k, D, dys.data(), dw.data());
  const double h = 1e-6;
  for (int64_t i = 0; i < T * k; ++i) {
    auto wp = w, wm = w;
    wp[i] += h;
    wm[i] -= h;
    const double fd = (loss(ys, wp) - loss(ys, wm)) / (2 * h);
    EXPECT_NEAR(dw[i], fd, 1e-8 * (1 + std::fabs(fd))) << "combine weight " << i;
  }
  for (int64_t i = 0; i < T * k * D; ++i) {
    auto p = ys, q = ys;
    p[i] += h;
    q[i] -= h;
    const double fd = (loss(p, w) - loss(q, w)) / (2 * h);
    EXPECT_NEAR(dys[i], fd, 1e-8 * (1 + std::fabs(fd))) << "expert output " << i;
  }
}

TEST(NnRefPermute, ZeroTokens) {
  std::vector<int32_t> counts(3, -1), offsets(4, -1);
  permute_map_ref(nullptr, 0, 2, 3, counts.data(), offsets.data(), nullptr, nullptr);
  EXPECT_EQ(counts, std::vector<int32_t>(3, 0));
  EXPECT_EQ(offsets, std::vector<int32_t>(4, 0));
}

TEST(NnRefPermute, RejectsBadArguments) {
  std::vector<int32_t> counts(4), offsets(5), row_of(8), assignment_of(8);
  auto map = [&](const std::vector<int32_t>& idx, int64_t T, int64_t k, int64_t E) {
    permute_map_ref(idx.data(), T, k, E, counts.data(), offsets.data(), row_of.data(), assignment_of.data());
  };
  expect_error_mentions([&] { map({0, 1, 2, 3, 0}, 1, 5, 4); }, {"top-k must be <= the expert count", "k=5", "E=4"});
  expect_error_mentions([&] { map({0, -1}, 1, 2, 4); }, {"selects expert -1", "[0, 4)"});
  expect_error_mentions([&] { map({2, 2}, 1, 2, 4); }, {"token 0 selects expert 2 twice"});
  expect_error_mentions([&] { map({}, 1, 0, 4); }, {"top-k must be >= 1", "k=0"});
  std::vector<double> x(4), xs(8);
  expect_error_mentions([&] { permute_forward_ref<double>(x.data(), assignment_of.data(), 2, 2, 0, xs.data()); },
                        {"hidden size D must be >= 1", "D=0"});
  expect_error_mentions([&] { permute_forward_ref<double>(x.data(), assignment_of.data(), -3, 2, 2, xs.data()); },
                        {"T must be >= 0", "T=-3"});
  // The device launchers check the same rules before any CUDA call.
  expect_error_mentions([&] { permute_map(nullptr, nullptr, 4, 2, 0, nullptr, nullptr, nullptr); },
                        {"permute_map", "E=0"});
  // The device map takes k > E: a token may repeat an expert there (the expert-parallel emulation's local routing).
  EXPECT_NO_THROW(permute_map(nullptr, nullptr, 0, 9, 8, nullptr, nullptr, nullptr));
  expect_error_mentions([&] { permute_forward(nullptr, nullptr, 4, 2, 16, nullptr, nullptr); },
                        {"permute_forward", "null pointer"});
  expect_error_mentions([&] { unpermute_backward(nullptr, nullptr, nullptr, nullptr, 4, 2, 0, nullptr, nullptr,
                                                 nullptr); },
                        {"unpermute_backward", "D=0"});
}

}  // namespace
}  // namespace fp4moe
