// CPU reference of the MoE router (kernels/nn/router.h): hand-computed V3 (sigmoid, bias, normalised weights) and
// V2 (softmax, balance loss) cases, deterministic tie-breaking, top-k = E, experts without tokens, counts and
// offsets, the backward against central finite differences in double, and the rejected arguments (the device
// launchers' checks run before any CUDA call, so they are tested here too).
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
#include "kernels/nn/router.h"
#include "tests/common/nn_ref_test_util.h"

namespace fp4moe {
namespace {

using test::expect_error_mentions;

template <typename Real>
struct Routed {
  std::vector<Real> probs, weight;
  std::vector<int32_t> idx, counts, offsets;
  Real aux = -1;
};

template <typename Real>
Routed<Real> route(const std::vector<Real>& logits, const std::vector<Real>* bias, int64_t T, int64_t E,
                   const RouterConfig& cfg) {
  Routed<Real> r;
  r.probs.assign(T * E, Real(-7));  // poisoned
  r.weight.assign(T * cfg.top_k, Real(-7));
  r.idx.assign(T * cfg.top_k, -7);
  r.counts.assign(E, -7);
  r.offsets.assign(E + 1, -7);
  router_forward_ref<Real>(logits.data(), bias ? bias->data() : nullptr, T, E, cfg, r.probs.data(), r.idx.data(),
                           r.weight.data(), r.counts.data(), r.offsets.data(), &r.aux);
  return r;
}

RouterConfig v3(int64_t k, float scale = 2.5f) { return RouterConfig{RouterStyle::v3_sigmoid, k, scale, 0.0f}; }
RouterConfig v2(int64_t k, float scale, float alpha) { return RouterConfig{RouterStyle::v2_softmax, k, scale, alpha}; }

TEST(NnRefRouter, V3HandComputedWithTieAndBias) {
  const double l3 = std::log(3.0);
  // sigmoid: 0.5, 0.75, 0.25, 0.75. Experts 1 and 3 tie: the lower index (1) comes first.
  const std::vector<double> logits = {0.0, l3, -l3, l3};
  auto r = route<double>(logits, nullptr, 1, 4, v3(2));
  EXPECT_EQ(r.idx, (std::vector<int32_t>{1, 3}));
  EXPECT_NEAR(r.probs[0], 0.5, 1e-15);
  EXPECT_NEAR(r.probs[2], 0.25, 1e-15);
  EXPECT_NEAR(r.weight[0], 2.5 * 0.75 / 1.5, 1e-14);
  EXPECT_NEAR(r.weight[1], 2.5 * 0.75 / 1.5, 1e-14);
  EXPECT_EQ(r.counts, (std::vector<int32_t>{0, 1, 0, 1}));
  EXPECT_EQ(r.offsets, (std::vector<int32_t>{0, 0, 1, 1, 2}));
  EXPECT_EQ(r.aux, -1) << "v3 has no auxiliary loss and must leave aux_loss alone";

  // The bias moves expert 2 (s = 0.25) to the top for the selection only; its weight uses s, not s + bias.
  const std::vector<double> bias = {0.0, 0.0, 0.6, 0.0};
  r = route<double>(logits, &bias, 1, 4, v3(2));
  EXPECT_EQ(r.idx, (std::vector<int32_t>{2, 1}));
  EXPECT_NEAR(r.weight[0], 2.5 * 0.25 / 1.0, 1e-14);
  EXPECT_NEAR(r.weight[1], 2.5 * 0.75 / 1.0, 1e-14);
  EXPECT_NEAR(r.probs[2], 0.25, 1e-15) << "probs hold s, without the bias";
}

TEST(NnRefRouter, V2HandComputedWithBalanceLoss) {
  // p = (1, 2, 2, 4) / 9; top-2 = experts 3 then 1 (1 and 2 tie at 2/9: the lower index wins).
  const std::vector<double> logits = {0.0, std::log(2.0), std::log(2.0), std::log(4.0)};
  auto r = route<double>(logits, nullptr, 1, 4, v2(2, 16.0f, 0.003f));
  EXPECT_EQ(r.idx, (std::vector<int32_t>{3, 1}));
  EXPECT_NEAR(r.probs[0], 1.0 / 9, 1e-15);
  EXPECT_NEAR(r.weight[0], 16.0 * 4 / 9, 1e-13);
  EXPECT_NEAR(r.weight[1], 16.0 * 2 / 9, 1e-13);  // not renormalised
  // f_e = E / (k T) count_e = 2 count_e = (0, 2, 0, 2); P_e = p_e; aux = alpha (2 * 2/9 + 2 * 4/9).
  EXPECT_NEAR(r.aux, double(0.003f) * 12.0 / 9.0, 1e-15);
}

TEST(NnRefRouter, AllTiedSelectsTheLowestIndices) {
  for (RouterStyle style : {RouterStyle::v3_sigmoid, RouterStyle::v2_softmax}) {
    RouterConfig cfg{style, 3, 1.0f, 0.0f};
    auto r = route<float>(std::vector<float>(8, 0.25f), nullptr, 1, 8, cfg);
    EXPECT_EQ(r.idx, (std::vector<int32_t>{0, 1, 2})) << router_style_name(style);
  }
}

TEST(NnRefRouter, TopKEqualsExpertCount) {
  const int64_t T = 3, E = 5;
  std::vector<double> logits = {0.3, -1.0, 2.0, 2.0, 0.1, /**/ 5, 4, 3, 2, 1, /**/ -1, -1, -1, -1, -1};
  auto r = route<double>(logits, nullptr, T, E, v3(E, 1.0f));
  EXPECT_EQ(std::vector<int32_t>(r.idx.begin(), r.idx.begin() + E), (std::vector<int32_t>{2, 3, 0, 4, 1}));
  EXPECT_EQ(std::vector<int32_t>(r.idx.begin() + E, r.idx.begin() + 2 * E), (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(std::vector<int32_t>(r.idx.begin() + 2 * E, r.idx.end()), (std::vector<int32_t>{0, 1, 2, 3, 4}));
  for (int64_t t = 0; t < T; ++t) {
    double sum = 0;
    for (int64_t j = 0; j < E; ++j) sum += r.weight[t * E + j];
    EXPECT_NEAR(sum, 1.0, 1e-14) << "v3 weights are normalised over the selected experts";
  }
  EXPECT_EQ(r.counts, std::vector<int32_t>(E, T));
  EXPECT_EQ(r.offsets, (std::vector<int32_t>{0, 3, 6, 9, 12, 15}));
}

TEST(NnRefRouter, ExpertsWithoutTokensAndOffsets) {
  // Experts 0 and 4 are never chosen: their ranges are empty, offsets repeat.
  const int64_t T = 4, E = 6;
  std::vector<float> logits(T * E, -3.0f);
  const int favourite[T][2] = {{1, 2}, {3, 5}, {2, 1}, {5, 2}};
  for (int64_t t = 0; t < T; ++t) {
    logits[t * E + favourite[t][0]] = 2.0f;
    logits[t * E + favourite[t][1]] = 1.0f;
  }
  auto r = route<float>(logits, nullptr, T, E, v3(2));
  EXPECT_EQ(r.idx, (std::vector<int32_t>{1, 2, 3, 5, 2, 1, 5, 2}));
  EXPECT_EQ(r.counts, (std::vector<int32_t>{0, 2, 3, 1, 0, 2}));
  EXPECT_EQ(r.offsets, (std::vector<int32_t>{0, 0, 2, 5, 6, 6, 8}));
}

TEST(NnRefRouter, ZeroTokens) {
  std::vector<int32_t> counts(4, -1), offsets(5, -1);
  float aux = -1;
  router_forward_ref<float>(nullptr, nullptr, 0, 4, v2(2, 1.0f, 0.1f), nullptr, nullptr, nullptr, counts.data(),
                            offsets.data(), &aux);
  EXPECT_EQ(counts, std::vector<int32_t>(4, 0));
  EXPECT_EQ(offsets, std::vector<int32_t>(5, 0));
  EXPECT_EQ(aux, 0.0f);
}

// Logits whose scores are pairwise far apart (no selection flips under a 1e-6 perturbation).
std::vector<double> spaced_logits(int64_t T, int64_t E, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<double> x(T * E);
  std::vector<int> perm(E);
  for (int64_t t = 0; t < T; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t e = 0; e < E; ++e) x[t * E + e] = -3.0 + 6.0 * perm[e] / E + 0.01 * (rng() % 7) / E;
  }
  return x;
}

// L = sum_{t,j} g[t,j] w[t,j] + aux_grad * aux: the backward's dlogits against central differences of L.
void check_backward_against_finite_differences(const RouterConfig& cfg, int64_t T, int64_t E, bool with_bias) {
  SCOPED_TRACE(std::string(router_style_name(cfg.style)) + " k=" + std::to_string(cfg.top_k) +
               " E=" + std::to_string(E));
  const int64_t k = cfg.top_k;
  std::vector<double> logits = spaced_logits(T, E, 17 + static_cast<uint32_t>(E * 3 + k));
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> bias(E), g(T * k);
  for (auto& b : bias) b = 0.05 * u(rng);
  for (auto& v : g) v = u(rng);
  const double aux_grad = 0.7;
  const std::vector<double>* b = with_bias ? &bias : nullptr;

  auto loss = [&](const std::vector<double>& x) {
    auto r = route<double>(x, b, T, E, cfg);
    double L = 0;
    for (int64_t i = 0; i < T * k; ++i) L += g[i] * r.weight[i];
    return cfg.style == RouterStyle::v2_softmax ? L + aux_grad * r.aux : L;
  };
  auto r = route<double>(logits, b, T, E, cfg);
  std::vector<double> dlogits(T * E, -99.0);
  router_backward_ref<double>(r.probs.data(), r.idx.data(), r.counts.data(), g.data(), T, E, cfg, aux_grad,
                              dlogits.data());
  const double h = 1e-6;
  for (int64_t i = 0; i < T * E; ++i) {
    std::vector<double> xp = logits, xm = logits;
    xp[i] += h;
    xm[i] -= h;
    auto rp = route<double>(xp, b, T, E, cfg), rm = route<double>(xm, b, T, E, cfg);
    ASSERT_EQ(rp.idx, r.idx) << "the perturbation changed the selection; the test data must avoid near ties";
    ASSERT_EQ(rm.idx, r.idx);
    const double fd = (loss(xp) - loss(xm)) / (2 * h);
    EXPECT_NEAR(dlogits[i], fd, 1e-7 * (1.0 + std::fabs(fd))) << "logit " << i;
  }
}

TEST(NnRefRouter, V3BackwardMatchesFiniteDifferences) {
  check_backward_against_finite_differences(v3(2), 3, 6, true);
  check_backward_against_finite_differences(v3(4, 1.0f), 2, 16, false);
  check_backward_against_finite_differences(v3(5), 2, 5, true);  // top-k = E
  check_backward_against_finite_differences(v3(1), 4, 3, true);  // one expert: its weight is the constant scale
}

TEST(NnRefRouter, V2BackwardMatchesFiniteDifferences) {
  check_backward_against_finite_differences(v2(2, 16.0f, 0.003f), 3, 6, false);
  check_backward_against_finite_differences(v2(3, 1.0f, 0.5f), 5, 8, false);
  check_backward_against_finite_differences(v2(4, 2.0f, 0.1f), 2, 4, false);  // top-k = E
}

TEST(NnRefRouter, V3GradientIsZeroForUnselectedExperts) {
  const int64_t T = 2, E = 8;
  auto logits = spaced_logits(T, E, 3);
  auto r = route<double>(logits, nullptr, T, E, v3(3));
  std::vector<double> g(T * 3, 1.5), dlogits(T * E, -99);
  router_backward_ref<double>(r.probs.data(), r.idx.data(), r.counts.data(), g.data(), T, E, v3(3), 1.0,
                              dlogits.data());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e) {
      bool selected = false;
      for (int j = 0; j < 3; ++j) selected |= r.idx[t * 3 + j] == e;
      if (!selected) {
        EXPECT_EQ(dlogits[t * E + e], 0.0);
      }
    }
  // Equal upstream gradients on normalised weights: the weights sum to a constant, so every gradient vanishes.
  for (double d : dlogits) EXPECT_NEAR(d, 0.0, 1e-15);
}

TEST(NnRefRouter, BiasUpdateMovesOverAndUnderloadedExperts) {
  // T k = 12 over E = 4: mean load 3. Expert 0 (5) and 2 (4) are overloaded, 1 (3) at the mean, 3 (0) starved.
  const std::vector<int32_t> counts = {5, 3, 4, 0};
  std::vector<float> bias = {0.5f, -0.25f, 0.0f, 1.0f};
  router_bias_update_ref(counts.data(), 4, 12, 0.125f, bias.data());
  EXPECT_EQ(bias, (std::vector<float>{0.375f, -0.25f, -0.125f, 1.125f}));
  // A mean that is not an integer (T k = 7 over E = 2: 3.5): 4 is over, 3 under, exactly.
  const std::vector<int32_t> counts2 = {4, 3};
  std::vector<float> bias2 = {0.0f, 0.0f};
  router_bias_update_ref(counts2.data(), 2, 7, 0.001f, bias2.data());
  EXPECT_EQ(bias2, (std::vector<float>{-0.001f, 0.001f}));
  // gamma = 0 leaves the bias alone.
  router_bias_update_ref(counts2.data(), 2, 7, 0.0f, bias2.data());
  EXPECT_EQ(bias2, (std::vector<float>{-0.001f, 0.001f}));

  expect_error_mentions([&] { router_bias_update_ref(counts.data(), 4, 12, -0.1f, bias.data()); },
                        {"gamma must be finite and >= 0"});
  expect_error_mentions([&] { router_bias_update_ref(counts.data(), 4, 12, NAN, bias.data()); }, {"gamma"});
  expect_error_mentions([&] { router_bias_update_ref(counts.data(), 4, -1, 0.1f, bias.data()); },
                        {"total_assignments", "-1"});
  expect_error_mentions([&] { router_bias_update_ref(counts.data(), 0, 12, 0.1f, bias.data()); }, {"E=0"});
  expect_error_mentions([&] { router_bias_update(counts.data(), 4, 12, 0.1f, nullptr, nullptr); },
                        {"router_bias_update", "must not be null"});
}

TEST(NnRefRouter, RejectsBadArguments) {
  std::vector<float> x(8), p(8), w(8);
  std::vector<int32_t> idx(8), counts(8), offsets(9);
  auto fwd = [&](int64_t T, int64_t E, RouterConfig cfg) {
    router_forward_ref<float>(x.data(), nullptr, T, E, cfg, p.data(), idx.data(), w.data(), counts.data(),
                              offsets.data(), nullptr);
  };
  expect_error_mentions([&] { fwd(1, 4, v3(5)); }, {"top-k must be in [1, E]", "top_k=5", "E=4"});
  expect_error_mentions([&] { fwd(1, 4, v3(0)); }, {"top-k", "top_k=0"});
  expect_error_mentions([&] { fwd(1, 0, v3(1)); }, {"expert count E", "E=0"});
  expect_error_mentions([&] { fwd(1, 1025, v3(1)); }, {"expert count E", "1024", "E=1025"});
  expect_error_mentions([&] { fwd(-1, 4, v3(1)); }, {"T must be >= 0", "T=-1"});
  expect_error_mentions([&] { fwd(1, 4, v3(2, 0.0f)); }, {"routed_scale must be > 0"});
  expect_error_mentions([&] { fwd(1, 4, v2(2, 1.0f, -0.1f)); }, {"aux_alpha must be >= 0"});
  expect_error_mentions([&] { fwd(1, 4, RouterConfig{static_cast<RouterStyle>(7), 1, 1.0f, 0.0f}); },
                        {"unknown router style 7"});
  expect_error_mentions([&] { fwd(1 << 29, 8, v3(8)); }, {"fit in int32"});

  std::vector<int32_t> bad = {0, 4};
  expect_error_mentions([&] { expert_counts_and_offsets_ref(bad.data(), 1, 2, 4, counts.data(), offsets.data()); },
                        {"token 0 slot 1 selects expert 4", "[0, 4)"});
  std::vector<int32_t> twice = {1, 2, 3, 3};
  expect_error_mentions([&] { expert_counts_and_offsets_ref(twice.data(), 2, 2, 4, counts.data(), offsets.data()); },
                        {"token 1 selects expert 3 twice"});

  // The device launchers check the same rules before touching the device (no GPU needed to see them fail).
  expect_error_mentions([&] {
    router_forward(nullptr, nullptr, 4, 8, v3(9), nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
  }, {"router_forward", "top-k must be in [1, E]"});
  expect_error_mentions([&] {
    router_forward(nullptr, nullptr, 4, 8, v3(2), nullptr, nullptr, nullptr, counts.data(), offsets.data(), nullptr,
                   nullptr);
  }, {"router_forward", "must not be null"});
  expect_error_mentions([&] { router_backward(nullptr, nullptr, nullptr, nullptr, 4, 2, v2(3, 1.0f, 0.0f), 1.0f,
                                              nullptr, nullptr); },
                        {"router_backward", "top_k=3"});
}

}  // namespace
}  // namespace fp4moe
