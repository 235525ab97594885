// GPU router weights for a given selection (kernels/nn/router_gates.h): for the router's own selection they equal
// what router_forward wrote, bit for bit (weights and v2 balance loss); for a forced selection they equal the CPU
// reference with Real = float bit for bit (the same FP32 operations in the same order, no FMA); T = 0; an index
// outside [0, E) gives NaN weights for its token only. Outputs are NaN-poisoned before each run.
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
#include "kernels/nn/router.h"
#include "kernels/nn/router_gates.h"

namespace fp4moe {
namespace {

using test::DeviceBuffer;

struct Shape {
  int64_t T, E, k;
};
const Shape kShapes[] = {{1, 8, 2}, {37, 8, 2}, {256, 64, 6}, {1000, 256, 8}, {5, 16, 16}, {129, 1024, 8}};

RouterConfig config_for(RouterStyle style, int64_t k) {
  return RouterConfig{style, k, style == RouterStyle::v3_sigmoid ? 2.5f : 16.0f,
                      style == RouterStyle::v2_softmax ? 0.003f : 0.0f};
}

std::vector<float> normal(size_t n, uint32_t seed, float stddev) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// k distinct experts per token, in a random order.
std::vector<int32_t> random_selection(const Shape& s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> idx(s.T * s.k), perm(s.E);
  for (int64_t t = 0; t < s.T; ++t) {
    for (int64_t e = 0; e < s.E; ++e) perm[e] = static_cast<int32_t>(e);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t j = 0; j < s.k; ++j) idx[t * s.k + j] = perm[j];
  }
  return idx;
}

void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0 && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " elements differ, first at " << first << " (" << a[first] << " vs "
                     << b[first] << ")";
}

TEST(NnRouterGates, RouterOwnSelectionReproducesRouterForward) {
  FP4MOE_REQUIRE_DEVICE();
  for (const Shape& s : kShapes)
    for (RouterStyle style : {RouterStyle::v3_sigmoid, RouterStyle::v2_softmax}) {
      SCOPED_TRACE(std::string(router_style_name(style)) + " T=" + std::to_string(s.T) + " E=" + std::to_string(s.E) +
                   " k=" + std::to_string(s.k));
      const RouterConfig cfg = config_for(style, s.k);
      DeviceBuffer<float> logits(s.T * s.E), bias(s.E), probs(s.T * s.E), weight(s.T * s.k), gates(s.T * s.k),
          aux(1), aux_gates(1);
      DeviceBuffer<int32_t> idx(s.T * s.k), counts(s.E), offsets(s.E + 1);
      logits.upload(normal(s.T * s.E, static_cast<uint32_t>(s.T + s.E), 1.5f));
      bias.upload(normal(s.E, 3, 0.1f));
      gates.poison(0xFF);
      aux_gates.poison(0xFF);
      router_forward(logits.ptr, bias.ptr, s.T, s.E, cfg, probs.ptr, idx.ptr, weight.ptr, counts.ptr, offsets.ptr,
                     aux.ptr, nullptr);
      router_gates_for_indices(probs.ptr, idx.ptr, counts.ptr, s.T, s.E, cfg, gates.ptr, aux_gates.ptr, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      expect_same_bits(gates.download(), weight.download(), "weights");
      if (style == RouterStyle::v2_softmax) expect_same_bits(aux_gates.download(), aux.download(), "balance loss");
      else EXPECT_TRUE(std::isnan(aux_gates.download()[0])) << "v3 must leave aux_loss alone";
    }
}

TEST(NnRouterGates, ForcedSelectionMatchesReference) {
  FP4MOE_REQUIRE_DEVICE();
  for (const Shape& s : kShapes)
    for (RouterStyle style : {RouterStyle::v3_sigmoid, RouterStyle::v2_softmax}) {
      SCOPED_TRACE(std::string(router_style_name(style)) + " T=" + std::to_string(s.T) + " E=" + std::to_string(s.E) +
                   " k=" + std::to_string(s.k));
      const RouterConfig cfg = config_for(style, s.k);
      // Scores as the router makes them (positive; softmax rows sum to 1 for v2).
      const auto logits = normal(s.T * s.E, 11, 1.5f);
      std::vector<float> probs(s.T * s.E), w_unused(s.T * s.k);
      std::vector<int32_t> own(s.T * s.k), counts(s.E), offsets(s.E + 1);
      float aux_unused = 0;
      router_forward_ref<float>(logits.data(), nullptr, s.T, s.E, cfg, probs.data(), own.data(), w_unused.data(),
                                counts.data(), offsets.data(), &aux_unused);
      const auto idx = random_selection(s, 12);
      expert_counts_and_offsets_ref(idx.data(), s.T, s.k, s.E, counts.data(), offsets.data());
      std::vector<float> w_ref(s.T * s.k);
      float aux_ref = -1;
      router_gates_for_indices_ref<float>(probs.data(), idx.data(), counts.data(), s.T, s.E, cfg, w_ref.data(),
                                          &aux_ref);

      DeviceBuffer<float> probs_d(s.T * s.E), w_d(s.T * s.k), aux_d(1);
      DeviceBuffer<int32_t> idx_d(s.T * s.k), counts_d(s.E);
      probs_d.upload(probs);
      idx_d.upload(idx);
      counts_d.upload(counts);
      w_d.poison(0xFF);
      aux_d.poison(0xFF);
      router_gates_for_indices(probs_d.ptr, idx_d.ptr, counts_d.ptr, s.T, s.E, cfg, w_d.ptr, aux_d.ptr, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      expect_same_bits(w_d.download(), w_ref, "weights");
      if (style == RouterStyle::v2_softmax) {
        const float aux = aux_d.download()[0];
        EXPECT_NEAR(aux, aux_ref, 1e-6 * std::fabs(aux_ref)) << "balance loss";
      }
    }
}

TEST(NnRouterGates, ZeroTokensAndBadIndex) {
  FP4MOE_REQUIRE_DEVICE();
  const RouterConfig v2 = config_for(RouterStyle::v2_softmax, 2);
  DeviceBuffer<float> aux(1);
  DeviceBuffer<int32_t> counts(8);
  aux.poison(0xFF);
  router_gates_for_indices(nullptr, nullptr, counts.ptr, 0, 8, v2, nullptr, aux.ptr, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(aux.download()[0], 0.0f) << "T = 0 writes a zero balance loss";

  // Token 1 holds an index outside [0, E): its weights are NaN, the others are computed.
  const RouterConfig v3 = config_for(RouterStyle::v3_sigmoid, 2);
  DeviceBuffer<float> probs(3 * 4), w(3 * 2);
  DeviceBuffer<int32_t> idx(3 * 2);
  probs.upload(std::vector<float>(12, 0.5f));
  idx.upload({0, 1, 2, 9, 3, 2});
  w.poison(0xFF);
  router_gates_for_indices(probs.ptr, idx.ptr, nullptr, 3, 4, v3, w.ptr, nullptr, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  const auto got = w.download();
  EXPECT_EQ(got[0], 1.25f);  // 2.5 * 0.5 / 1.0
  EXPECT_EQ(got[1], 1.25f);
  EXPECT_TRUE(std::isnan(got[2]) && std::isnan(got[3]));
  EXPECT_EQ(got[4], 1.25f);
  EXPECT_EQ(got[5], 1.25f);
}

}  // namespace
}  // namespace fp4moe
