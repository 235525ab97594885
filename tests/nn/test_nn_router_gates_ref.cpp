// CPU reference of the router weights for a given selection (kernels/nn/router_gates.h): for the router's own
// selection it reproduces router_forward_ref's weights and balance loss bit for bit (float and double); a forced
// selection by hand; T = 0; the rejected arguments (the device launcher's checks run before any CUDA call, so they
// are tested here too).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/nn/router.h"
#include "kernels/nn/router_gates.h"
#include "tests/common/nn_ref_test_util.h"

namespace fp4moe {
namespace {

using test::expect_error_mentions;

template <typename Real>
void expect_gates_reproduce_router(RouterStyle style) {
  const int64_t T = 41, E = 16, k = 4;
  const RouterConfig cfg{style, k, style == RouterStyle::v3_sigmoid ? 2.5f : 16.0f,
                         style == RouterStyle::v2_softmax ? 0.003f : 0.0f};
  const auto logits_d = test::normal_values(T * E, 5, 0.0, 2.0), bias_d = test::normal_values(E, 6, 0.0, 0.1);
  std::vector<Real> logits(logits_d.begin(), logits_d.end()), bias(bias_d.begin(), bias_d.end());
  std::vector<Real> probs(T * E), weight(T * k), gates(T * k, Real(-7));
  std::vector<int32_t> idx(T * k), counts(E), offsets(E + 1);
  Real aux = 0, aux_gates = -7;
  router_forward_ref<Real>(logits.data(), bias.data(), T, E, cfg, probs.data(), idx.data(), weight.data(),
                           counts.data(), offsets.data(), &aux);
  router_gates_for_indices_ref<Real>(probs.data(), idx.data(), counts.data(), T, E, cfg, gates.data(), &aux_gates);
  for (int64_t i = 0; i < T * k; ++i) ASSERT_EQ(gates[i], weight[i]) << "weight " << i;
  if (style == RouterStyle::v2_softmax) {
    EXPECT_EQ(aux_gates, aux);
  } else {
    EXPECT_EQ(aux_gates, Real(-7)) << "v3 has no balance loss and must leave aux_loss alone";
  }
}

TEST(NnRefRouterGates, ReproducesTheRoutersOwnSelection) {
  expect_gates_reproduce_router<float>(RouterStyle::v3_sigmoid);
  expect_gates_reproduce_router<float>(RouterStyle::v2_softmax);
  expect_gates_reproduce_router<double>(RouterStyle::v3_sigmoid);
  expect_gates_reproduce_router<double>(RouterStyle::v2_softmax);
}

TEST(NnRefRouterGates, ForcedSelectionHandComputed) {
  // One token, E = 4, scores s = (0.5, 0.75, 0.25, 0.125); the forced selection (2, 0) is not the top-2.
  const std::vector<double> s = {0.5, 0.75, 0.25, 0.125};
  const std::vector<int32_t> idx = {2, 0}, counts = {1, 0, 1, 0};
  std::vector<double> w(2);
  double aux = -1;
  router_gates_for_indices_ref<double>(s.data(), idx.data(), counts.data(), 1, 4,
                                       RouterConfig{RouterStyle::v3_sigmoid, 2, 2.5f, 0.0f}, w.data(), &aux);
  EXPECT_DOUBLE_EQ(w[0], 2.5 * 0.25 / 0.75);
  EXPECT_DOUBLE_EQ(w[1], 2.5 * 0.5 / 0.75);
  EXPECT_EQ(aux, -1);
  // v2 on p = (0.1, 0.2, 0.3, 0.4) with forced (0, 3): w = 16 p; f = E / (k T) count = 2 count, P = p (T = 1).
  const std::vector<double> p = {0.1, 0.2, 0.3, 0.4};
  const std::vector<int32_t> idx2 = {0, 3}, counts2 = {1, 0, 0, 1};
  router_gates_for_indices_ref<double>(p.data(), idx2.data(), counts2.data(), 1, 4,
                                       RouterConfig{RouterStyle::v2_softmax, 2, 16.0f, 0.5f}, w.data(), &aux);
  EXPECT_DOUBLE_EQ(w[0], 16.0 * 0.1);
  EXPECT_DOUBLE_EQ(w[1], 16.0 * 0.4);
  EXPECT_NEAR(aux, 0.5 * (2 * 0.1 + 2 * 0.4), 1e-15);
}

TEST(NnRefRouterGates, ZeroTokens) {
  float aux = -1;
  const std::vector<int32_t> counts(8, 0);
  router_gates_for_indices_ref<float>(nullptr, nullptr, counts.data(), 0, 8,
                                      RouterConfig{RouterStyle::v2_softmax, 2, 1.0f, 0.01f}, nullptr, &aux);
  EXPECT_EQ(aux, 0.0f);
}

TEST(NnRefRouterGates, RejectsBadArguments) {
  const std::vector<float> p(2 * 4, 0.25f);
  std::vector<float> w(2 * 2);
  float aux = 0;
  const RouterConfig v3{RouterStyle::v3_sigmoid, 2, 1.0f, 0.0f}, v2{RouterStyle::v2_softmax, 2, 1.0f, 0.1f};
  const std::vector<int32_t> ok = {0, 1, 2, 3};
  const std::vector<int32_t> out_of_range = {0, 1, 4, 3}, repeated = {0, 1, 2, 2};
  expect_error_mentions([&] { router_gates_for_indices_ref<float>(p.data(), out_of_range.data(), nullptr, 2, 4, v3,
                                                                  w.data(), nullptr); },
                        {"token 1", "expert 4"});
  expect_error_mentions([&] { router_gates_for_indices_ref<float>(p.data(), repeated.data(), nullptr, 2, 4, v3,
                                                                  w.data(), nullptr); },
                        {"token 1", "twice"});
  expect_error_mentions([&] { router_gates_for_indices_ref<float>(p.data(), ok.data(), nullptr, 2, 4, v2, w.data(),
                                                                  &aux); },
                        {"counts", "null"});
  const std::vector<int32_t> wrong_counts = {2, 0, 1, 1};
  expect_error_mentions([&] { router_gates_for_indices_ref<float>(p.data(), ok.data(), wrong_counts.data(), 2, 4, v2,
                                                                  w.data(), &aux); },
                        {"counts[0] = 2"});
  expect_error_mentions([&] { router_gates_for_indices_ref<float>(nullptr, ok.data(), nullptr, 2, 4, v3, w.data(),
                                                                  nullptr); },
                        {"must not be null"});
  const RouterConfig too_many{RouterStyle::v3_sigmoid, 5, 1.0f, 0.0f};
  expect_error_mentions([&] { router_gates_for_indices_ref<float>(p.data(), ok.data(), nullptr, 1, 4, too_many,
                                                                  w.data(), nullptr); },
                        {"top-k"});
  // The device launcher rejects the same shapes and pointers before any CUDA call.
  expect_error_mentions([&] { router_gates_for_indices(nullptr, nullptr, nullptr, 2, 4, v3, nullptr, nullptr,
                                                       nullptr); },
                        {"router_gates_for_indices", "must not be null"});
  expect_error_mentions([&] { router_gates_for_indices(nullptr, nullptr, nullptr, -1, 4, v3, nullptr, nullptr,
                                                       nullptr); },
                        {"T must be >= 0"});
  float* fake = reinterpret_cast<float*>(16);
  expect_error_mentions([&] { router_gates_for_indices(fake, reinterpret_cast<const int32_t*>(16), nullptr, 2, 4, v2,
                                                       fake, fake, nullptr); },
                        {"counts"});
}

}  // namespace
}  // namespace fp4moe
