// CPU reference of the fused LM-head cross-entropy (kernels/nn/cross_entropy.h): a hand-computed loss, independence
// of the vocabulary chunk size, the ignore index, out-of-range targets, large logits (online softmax without
// overflow), the backward (dh, dW) against finite differences in double, and the rejected shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/nn/cross_entropy.h"
#include "tests/common/nn_ref_test_util.h"

namespace fp4moe {
namespace {

using test::expect_error_mentions;

std::vector<double> random_values(size_t n, double scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd(0.0, scale);
  std::vector<double> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

std::vector<int32_t> random_targets(int64_t T, int64_t V, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(T);
  for (auto& x : t) x = static_cast<int32_t>(rng() % V);
  return t;
}

TEST(NnRefCrossEntropy, HandComputed) {
  // C = 1, h = 1, logits = (0, ln 2, ln 3): lse = ln 6; target 2 -> ln 6 - ln 3 = ln 2; target 0 -> ln 6.
  const std::vector<double> h = {1.0, 1.0}, w = {0.0, std::log(2.0), std::log(3.0)};
  const std::vector<int32_t> targets = {2, 0};
  std::vector<double> per_token(2, -1);
  for (int64_t chunk : {1, 2, 3, 8}) {
    const double loss = cross_entropy_forward_ref<double>(h.data(), w.data(), targets.data(), 2, 1, 3, chunk,
                                                          per_token.data());
    EXPECT_NEAR(per_token[0], std::log(2.0), 1e-15) << "chunk " << chunk;
    EXPECT_NEAR(per_token[1], std::log(6.0), 1e-15) << "chunk " << chunk;
    EXPECT_NEAR(loss, (std::log(2.0) + std::log(6.0)) / 2, 1e-15) << "chunk " << chunk;
  }
  // Gradient of the mean: dlogits = (softmax - onehot) / 2; dh_0 = sum_v dlogits_v w_v.
  std::vector<double> dh(2), dw(3);
  cross_entropy_backward_ref<double>(h.data(), w.data(), targets.data(), 2, 1, 3, 1.0, dh.data(), dw.data());
  const double p[3] = {1.0 / 6, 2.0 / 6, 3.0 / 6};
  EXPECT_NEAR(dh[0], ((p[1] * w[1] + p[2] * w[2]) - w[2]) / 2, 1e-15);
  EXPECT_NEAR(dh[1], ((p[1] * w[1] + p[2] * w[2]) - w[0]) / 2, 1e-15);
  EXPECT_NEAR(dw[0], ((p[0] - 0) + (p[0] - 1)) / 2, 1e-15);
  EXPECT_NEAR(dw[2], ((p[2] - 1) + (p[2] - 0)) / 2, 1e-15);
}

TEST(NnRefCrossEntropy, ChunkSizeDoesNotChangeTheLoss) {
  const int64_t T = 7, C = 16, V = 101;
  auto h = random_values(T * C, 1.0, 1), w = random_values(V * C, 0.5, 2);
  auto targets = random_targets(T, V, 3);
  std::vector<double> whole(T), part(T);
  const double ref = cross_entropy_forward_ref<double>(h.data(), w.data(), targets.data(), T, C, V, V, whole.data());
  for (int64_t chunk : {1, 8, 13, 64, 100, 512}) {
    const double loss =
        cross_entropy_forward_ref<double>(h.data(), w.data(), targets.data(), T, C, V, chunk, part.data());
    EXPECT_NEAR(loss, ref, 1e-13) << "chunk " << chunk;
    for (int64_t t = 0; t < T; ++t) EXPECT_NEAR(part[t], whole[t], 1e-13) << "chunk " << chunk << " token " << t;
  }
}

TEST(NnRefCrossEntropy, IgnoredTokensCountNowhere) {
  const int64_t T = 6, C = 8, V = 20;
  auto h = random_values(T * C, 1.0, 4), w = random_values(V * C, 1.0, 5);
  auto targets = random_targets(T, V, 6);
  targets[1] = kIgnoreIndex;
  targets[4] = kIgnoreIndex;
  std::vector<double> per_token(T);
  const double loss = cross_entropy_forward_ref<double>(h.data(), w.data(), targets.data(), T, C, V, 7,
                                                        per_token.data());
  EXPECT_EQ(per_token[1], 0.0);
  EXPECT_EQ(per_token[4], 0.0);
  EXPECT_NEAR(loss, (per_token[0] + per_token[2] + per_token[3] + per_token[5]) / 4, 1e-14);
  std::vector<double> dh(T * C), dw(V * C);
  cross_entropy_backward_ref<double>(h.data(), w.data(), targets.data(), T, C, V, 1.0, dh.data(), dw.data());
  for (int64_t c = 0; c < C; ++c) {
    EXPECT_EQ(dh[1 * C + c], 0.0);
    EXPECT_EQ(dh[4 * C + c], 0.0);
  }
  // Every token ignored: loss 0, zero gradients (no division by zero).
  std::vector<int32_t> none(T, kIgnoreIndex);
  EXPECT_EQ(cross_entropy_forward_ref<double>(h.data(), w.data(), none.data(), T, C, V, 7, nullptr), 0.0);
  cross_entropy_backward_ref<double>(h.data(), w.data(), none.data(), T, C, V, 1.0, dh.data(), dw.data());
  for (double v : dh) EXPECT_EQ(v, 0.0);
  for (double v : dw) EXPECT_EQ(v, 0.0);
}

TEST(NnRefCrossEntropy, TargetOutsideTheVocabularyGivesNaN) {
  const std::vector<float> h = {1.0f}, w = {0.0f, 1.0f};
  for (int32_t bad : {2, -1, 1000}) {
    const std::vector<int32_t> targets = {bad};
    std::vector<float> per_token(1);
    const float loss = cross_entropy_forward_ref<float>(h.data(), w.data(), targets.data(), 1, 1, 2, 1,
                                                        per_token.data());
    EXPECT_TRUE(std::isnan(loss)) << "target " << bad;
    EXPECT_TRUE(std::isnan(per_token[0])) << "target " << bad;
  }
}

TEST(NnRefCrossEntropy, LargeLogitsStayFinite) {
  // Logits around 1e4: exp would overflow without the running max; shifting every logit leaves the loss alone.
  const int64_t T = 3, C = 8, V = 50;
  auto h = random_values(T * C, 1.0, 7), w = random_values(V * C, 1.0, 8);
  auto targets = random_targets(T, V, 9);
  const double base = cross_entropy_forward_ref<double>(h.data(), w.data(), targets.data(), T, C, V, 16, nullptr);
  // Add a constant logit 1e4 to every entry via an extra feature: h' = (h, 1e4), w' = (w, 1).
  std::vector<double> h2(T * (C + 8), 0.0), w2(V * (C + 8), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < C; ++c) h2[t * (C + 8) + c] = h[t * C + c];
    h2[t * (C + 8) + C] = 1e4;
  }
  for (int64_t v = 0; v < V; ++v) {
    for (int64_t c = 0; c < C; ++c) w2[v * (C + 8) + c] = w[v * C + c];
    w2[v * (C + 8) + C] = 1.0;
  }
  const double shifted = cross_entropy_forward_ref<double>(h2.data(), w2.data(), targets.data(), T, C + 8, V, 16,
                                                           nullptr);
  EXPECT_TRUE(std::isfinite(shifted));
  EXPECT_NEAR(shifted, base, 1e-9);
  std::vector<float> hf(h2.begin(), h2.end()), wf(w2.begin(), w2.end());
  const float in_float = cross_entropy_forward_ref<float>(hf.data(), wf.data(), targets.data(), T, C + 8, V, 16,
                                                          nullptr);
  EXPECT_TRUE(std::isfinite(in_float));
}

TEST(NnRefCrossEntropy, BackwardMatchesFiniteDifferences) {
  const int64_t T = 4, C = 5, V = 9;
  auto h = random_values(T * C, 1.0, 10), w = random_values(V * C, 1.0, 11);
  auto targets = random_targets(T, V, 12);
  targets[2] = kIgnoreIndex;
  const double dloss = 0.75;
  std::vector<double> dh(T * C, -99), dw(V * C, -99);
  cross_entropy_backward_ref<double>(h.data(), w.data(), targets.data(), T, C, V, dloss, dh.data(), dw.data());
  auto loss = [&](const std::vector<double>& h_, const std::vector<double>& w_) {
    return dloss * cross_entropy_forward_ref<double>(h_.data(), w_.data(), targets.data(), T, C, V, 4, nullptr);
  };
  const double eps = 1e-6;
  for (int64_t i = 0; i < T * C; ++i) {
    auto p = h, m = h;
    p[i] += eps;
    m[i] -= eps;
    const double fd = (loss(p, w) - loss(m, w)) / (2 * eps);
    EXPECT_NEAR(dh[i], fd, 1e-8 * (1 + std::fabs(fd))) << "dh " << i;
  }
  for (int64_t i = 0; i < V * C; ++i) {
    auto p = w, m = w;
    p[i] += eps;
    m[i] -= eps;
    const double fd = (loss(h, p) - loss(h, m)) / (2 * eps);
    EXPECT_NEAR(dw[i], fd, 1e-8 * (1 + std::fabs(fd))) << "dW " << i;
  }
}

TEST(NnRefCrossEntropy, RejectsBadArguments) {
  std::vector<double> h(8), w(8);
  std::vector<int32_t> targets(1);
  expect_error_mentions([&] {
    cross_entropy_forward_ref<double>(h.data(), w.data(), targets.data(), 1, 0, 1, 1, nullptr);
  }, {"C >= 1", "C=0"});
  expect_error_mentions([&] {
    cross_entropy_forward_ref<double>(h.data(), w.data(), targets.data(), 1, 8, 1, 0, nullptr);
  }, {"chunk >= 1", "chunk=0"});
  expect_error_mentions([&] {
    cross_entropy_forward_ref<double>(nullptr, w.data(), targets.data(), 1, 8, 1, 1, nullptr);
  }, {"must not be null"});
  // The device path's shape rules (checked before any CUDA call).
  expect_error_mentions([&] { detail::check_cross_entropy_shape("lm_head", 4, 12, 100, 64); },
                        {"lm_head", "multiple of 8", "C=12"});
  expect_error_mentions([&] { detail::check_cross_entropy_shape("lm_head", 4, 16, 100, 100); },
                        {"chunk must be a positive multiple of 8", "chunk=100"});
  expect_error_mentions([&] { detail::check_cross_entropy_shape("lm_head", 4, 16, 0, 64); }, {"V=0"});
  expect_error_mentions([&] { detail::check_cross_entropy_shape("lm_head", int64_t{1} << 24, 16, 10, 64); },
                        {"2^24", "T=16777216"});
  expect_error_mentions([&] { LmHeadCrossEntropy bad(20, 1000, 64); }, {"LmHeadCrossEntropy", "C=20"});
}

}  // namespace
}  // namespace fp4moe
