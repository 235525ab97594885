// GPU MoE router (kernels/nn/router.h) against its CPU reference: V3 (sigmoid, selection bias) and V2 (softmax,
// balance loss) over shapes from one expert to E = 1024, top-k = E included, with exactly tied scores (the lower
// expert index must win on both sides) and experts that receive no token. The selection, counts and offsets
// must match exactly; scores, weights, the balance loss and the backward's dlogits up to float rounding (expf,
// reduction order). Outputs are poisoned before each run; a second run must reproduce every bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "tests/common/gpu_test_util.h"
#include "kernels/common/check.h"
#include "kernels/nn/router.h"

namespace fp4moe {
namespace {

using test::DeviceBuffer;

struct Shape {
  int64_t T, E, k;
};
const Shape kShapes[] = {{1, 8, 2}, {9, 1, 1}, {37, 64, 6}, {1000, 256, 8}, {5, 16, 16}, {130, 1024, 8},
                         {20, 1024, 1024}, {4099, 160, 6}};

// Logits in [-6, 6] on a grid coarse enough that distinct scores stay far apart in float after sigmoid or softmax,
// with every value used twice per token (exact ties), every 7th token all equal, and experts listed in `starved`
// pushed to the bottom so that (when k leaves room) they get no token.
std::vector<float> router_logits(const Shape& s, const std::vector<int64_t>& starved, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> x(s.T * s.E);
  std::vector<int> perm(s.E);
  const float step = 12.0f / static_cast<float>(s.E / 2 + 1);
  for (int64_t t = 0; t < s.T; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t e = 0; e < s.E; ++e) x[t * s.E + e] = t % 7 == 3 ? 0.5f : -6.0f + step * static_cast<float>(perm[e] / 2);
    for (int64_t e : starved)
      if (e < s.E) x[t * s.E + e] = -7.0f - static_cast<float>(e % 3);
  }
  return x;
}

// Integer biases: s + bias never brings two different bias groups within float rounding of each other.
std::vector<float> router_bias(int64_t E, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> b(E);
  for (auto& v : b) v = static_cast<float>(static_cast<int>(rng() % 3) - 1);
  return b;
}

std::vector<float> uniform(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

struct Outputs {
  std::vector<float> probs, weight, dlogits;
  std::vector<int32_t> idx, counts, offsets;
  float aux = 0;
};

struct DeviceRouter {
  const Shape s;
  DeviceBuffer<float> logits, bias, probs, weight, aux, dweights, dlogits;
  DeviceBuffer<int32_t> idx, counts, offsets;
  explicit DeviceRouter(const Shape& shape)
      : s(shape), logits(s.T * s.E), bias(s.E), probs(s.T * s.E), weight(s.T * s.k), aux(1), dweights(s.T * s.k),
        dlogits(s.T * s.E), idx(s.T * s.k), counts(s.E), offsets(s.E + 1) {}

  Outputs run(const RouterConfig& cfg, bool with_bias, float aux_grad) {
    for (auto* b : {&probs, &weight, &aux, &dlogits}) b->poison(0xFF);  // NaN
    for (auto* b : {&idx, &counts, &offsets}) b->poison(0xFF);          // -1
    router_forward(logits.ptr, with_bias ? bias.ptr : nullptr, s.T, s.E, cfg, probs.ptr, idx.ptr, weight.ptr,
                   counts.ptr, offsets.ptr, aux.ptr, nullptr);
    router_backward(probs.ptr, idx.ptr, counts.ptr, dweights.ptr, s.T, s.E, cfg, aux_grad, dlogits.ptr, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    Outputs o{probs.download(), weight.download(), dlogits.download(), idx.download(), counts.download(),
              offsets.download(), aux.download()[0]};
    return o;
  }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

void expect_close(const std::vector<float>& gpu, const std::vector<float>& ref, double rel, double abs_floor,
                  const char* what) {
  ASSERT_EQ(gpu.size(), ref.size()) << what;
  int reported = 0;
  for (size_t i = 0; i < gpu.size(); ++i) {
    const double tol = rel * std::fabs(ref[i]) + abs_floor;
    if (!(std::fabs(double(gpu[i]) - ref[i]) <= tol) && reported++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: gpu " << gpu[i] << " ref " << ref[i] << " (tolerance " << tol << ")";
  }
}

void check_router(const Shape& s, RouterStyle style, bool with_bias) {
  SCOPED_TRACE(std::string(router_style_name(style)) + " T=" + std::to_string(s.T) + " E=" + std::to_string(s.E) +
               " k=" + std::to_string(s.k) + (with_bias ? " bias" : ""));
  const RouterConfig cfg{style, s.k, style == RouterStyle::v3_sigmoid ? 2.5f : 16.0f,
                         style == RouterStyle::v2_softmax ? 0.003f : 0.0f};
  const std::vector<int64_t> starved = s.E > 2 * s.k ? std::vector<int64_t>{0, s.E - 1} : std::vector<int64_t>{};
  const auto logits = router_logits(s, starved, static_cast<uint32_t>(s.T * 31 + s.E));
  auto bias = router_bias(s.E, 7);
  for (int64_t e : starved) bias[e] = -1.0f;  // the lowest bias group: a starved expert stays last
  const auto dweights = uniform(s.T * s.k, 11);
  const float aux_grad = 0.5f;

  DeviceRouter dev(s);
  dev.logits.upload(logits);
  dev.bias.upload(bias);
  dev.dweights.upload(dweights);
  const Outputs g = dev.run(cfg, with_bias, aux_grad);

  Outputs r;
  r.probs.assign(s.T * s.E, 0);
  r.weight.assign(s.T * s.k, 0);
  r.idx.assign(s.T * s.k, 0);
  r.counts.assign(s.E, 0);
  r.offsets.assign(s.E + 1, 0);
  router_forward_ref<float>(logits.data(), with_bias ? bias.data() : nullptr, s.T, s.E, cfg, r.probs.data(),
                            r.idx.data(), r.weight.data(), r.counts.data(), r.offsets.data(), &r.aux);
  ASSERT_EQ(g.idx, r.idx) << "top-k selection (ties: lower expert index first)";
  EXPECT_EQ(g.counts, r.counts);
  EXPECT_EQ(g.offsets, r.offsets);
  if (!starved.empty() && s.E > 2 * s.k) {
    EXPECT_EQ(g.counts[0], 0) << "expert 0 was meant to receive no token";
    EXPECT_EQ(g.counts[s.E - 1], 0);
  }
  expect_close(g.probs, r.probs, 1e-5, 1e-12, "probs");
  expect_close(g.weight, r.weight, 1e-5, 1e-12, "topk_weight");
  if (style == RouterStyle::v2_softmax) {
    EXPECT_NEAR(g.aux, r.aux, 1e-5 * std::fabs(r.aux) + 1e-12) << "balance loss";
  }

  // Backward from the GPU's own forward (same probs, selection and counts on both sides).
  std::vector<float> ref_dlogits(s.T * s.E, 0);
  router_backward_ref<float>(g.probs.data(), g.idx.data(), g.counts.data(), dweights.data(), s.T, s.E, cfg, aux_grad,
                             ref_dlogits.data());
  float max_abs = 0;
  for (float v : ref_dlogits) max_abs = std::max(max_abs, std::fabs(v));
  expect_close(g.dlogits, ref_dlogits, 1e-4, 1e-5 * max_abs + 1e-20, "dlogits");
  if (style == RouterStyle::v3_sigmoid) {
    for (int64_t t = 0; t < s.T; ++t)
      for (int64_t e = 0; e < s.E; ++e)
        if (std::find(g.idx.begin() + t * s.k, g.idx.begin() + (t + 1) * s.k, e) == g.idx.begin() + (t + 1) * s.k) {
          ASSERT_EQ(g.dlogits[t * s.E + e], 0.0f) << "v3: an unselected expert gets no gradient (token " << t << ")";
        }
  }

  const Outputs again = dev.run(cfg, with_bias, aux_grad);
  EXPECT_EQ(again.idx, g.idx);
  EXPECT_TRUE(same_bits(again.probs, g.probs) && same_bits(again.weight, g.weight) &&
              same_bits(again.dlogits, g.dlogits) && std::memcmp(&again.aux, &g.aux, sizeof(float)) == 0)
      << "a second run must reproduce every bit";
}

TEST(NnMoeRouter, V3MatchesReference) {
  FP4MOE_REQUIRE_DEVICE();
  for (const Shape& s : kShapes) {
    check_router(s, RouterStyle::v3_sigmoid, true);
    check_router(s, RouterStyle::v3_sigmoid, false);
  }
}

TEST(NnMoeRouter, V2MatchesReference) {
  FP4MOE_REQUIRE_DEVICE();
  for (const Shape& s : kShapes) check_router(s, RouterStyle::v2_softmax, false);
}

TEST(NnMoeRouter, AllTiedTokensPickTheLowestIndices) {
  FP4MOE_REQUIRE_DEVICE();
  const Shape s{33, 40, 5};
  DeviceRouter dev(s);
  dev.logits.upload(std::vector<float>(s.T * s.E, -0.25f));
  dev.dweights.upload(uniform(s.T * s.k, 3));
  for (RouterStyle style : {RouterStyle::v3_sigmoid, RouterStyle::v2_softmax}) {
    const Outputs g = dev.run(RouterConfig{style, s.k, 1.0f, 0.0f}, false, 1.0f);
    for (int64_t t = 0; t < s.T; ++t)
      for (int64_t j = 0; j < s.k; ++j) ASSERT_EQ(g.idx[t * s.k + j], j) << router_style_name(style) << " token " << t;
    EXPECT_EQ(g.counts[0], s.T);
    EXPECT_EQ(g.counts[s.k], 0);
  }
}

TEST(NnMoeRouter, ZeroTokensWritesEmptyCountsAndOffsets) {
  FP4MOE_REQUIRE_DEVICE();
  const int64_t E = 12;
  DeviceBuffer<int32_t> counts(E), offsets(E + 1);
  DeviceBuffer<float> aux(1);
  counts.poison(0xFF);
  offsets.poison(0xFF);
  aux.poison(0xFF);
  router_forward(nullptr, nullptr, 0, E, RouterConfig{RouterStyle::v2_softmax, 2, 1.0f, 0.1f}, nullptr, nullptr,
                 nullptr, counts.ptr, offsets.ptr, aux.ptr, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(counts.download(), std::vector<int32_t>(E, 0));
  EXPECT_EQ(offsets.download(), std::vector<int32_t>(E + 1, 0));
  EXPECT_EQ(aux.download()[0], 0.0f);
}

TEST(NnMoeRouter, CountsAndOffsetsOfGivenAssignments) {
  FP4MOE_REQUIRE_DEVICE();
  // Ragged split with empty experts, as the grouped GEMM tests use: experts 1 and 4 get nothing.
  const int64_t T = 3000, k = 3, E = 6;
  const int32_t allowed[] = {0, 2, 3, 5};
  std::mt19937 rng(9);
  std::vector<int32_t> idx(T * k);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> pool(std::begin(allowed), std::end(allowed));
    std::shuffle(pool.begin(), pool.end(), rng);
    for (int64_t j = 0; j < k; ++j) idx[t * k + j] = pool[j];
  }
  DeviceBuffer<int32_t> d_idx(T * k), counts(E), offsets(E + 1);
  d_idx.upload(idx);
  counts.poison(0xFF);
  offsets.poison(0xFF);
  expert_counts_and_offsets(d_idx.ptr, T, k, E, counts.ptr, offsets.ptr, nullptr);
  std::vector<int32_t> ref_counts(E), ref_offsets(E + 1);
  expert_counts_and_offsets_ref(idx.data(), T, k, E, ref_counts.data(), ref_offsets.data());
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(counts.download(), ref_counts);
  EXPECT_EQ(offsets.download(), ref_offsets);
  EXPECT_EQ(ref_counts[1], 0);
  EXPECT_EQ(ref_offsets[E], T * k);
}

TEST(NnMoeRouter, BiasUpdateMatchesReference) {
  FP4MOE_REQUIRE_DEVICE();
  for (int64_t E : {1, 7, 256, 1024}) {
    SCOPED_TRACE("E=" + std::to_string(E));
    std::mt19937 rng(static_cast<uint32_t>(E));
    std::vector<int32_t> counts(E);
    int64_t total = 0;
    for (auto& c : counts) {
      c = static_cast<int32_t>(rng() % 9);
      total += c;
    }
    if (E > 2) counts[1] = static_cast<int32_t>(total / E);  // near the mean
    total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    std::vector<float> bias = uniform(E, 13), ref = bias;
    router_bias_update_ref(counts.data(), E, total, 0.001f, ref.data());
    DeviceBuffer<int32_t> d_counts(E);
    DeviceBuffer<float> d_bias(E);
    d_counts.upload(counts);
    d_bias.upload(bias);
    router_bias_update(d_counts.ptr, E, total, 0.001f, d_bias.ptr, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(same_bits(d_bias.download(), ref));
  }
}

// The device tally of a step's loads: tally += counts, over the block edges of its grid.
TEST(NnMoeRouter, TallyCountsMatchesReference) {
  FP4MOE_REQUIRE_DEVICE();
  for (int64_t E : {1, 7, 256, 257, 1024}) {
    SCOPED_TRACE("E=" + std::to_string(E));
    std::mt19937 rng(static_cast<uint32_t>(E) + 5);
    std::vector<int32_t> counts(E), tally(E);
    for (auto& c : counts) c = static_cast<int32_t>(rng() % 5000);
    for (auto& t : tally) t = static_cast<int32_t>(rng() % 100000);
    std::vector<int32_t> ref = tally;
    router_tally_counts_ref(counts.data(), E, ref.data());
    DeviceBuffer<int32_t> d_counts(E), d_tally(E);
    d_counts.upload(counts);
    d_tally.upload(tally);
    router_tally_counts(d_counts.ptr, E, d_tally.ptr, nullptr);
    router_tally_counts(d_counts.ptr, E, d_tally.ptr, nullptr);  // twice: a second micro-batch
    router_tally_counts_ref(counts.data(), E, ref.data());
    CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(d_tally.download(), ref);
  }
  EXPECT_THROW(router_tally_counts(nullptr, 4, nullptr, nullptr), Error);
}

// The bias update from a device tally (its total summed on the device), then the tally zeroed: as the reference,
// and as router_bias_update given the host total.
TEST(NnMoeRouter, BiasUpdateFromTallyMatchesReference) {
  FP4MOE_REQUIRE_DEVICE();
  for (int64_t E : {1, 7, 256, 1024}) {
    SCOPED_TRACE("E=" + std::to_string(E));
    std::mt19937 rng(static_cast<uint32_t>(E) + 11);
    std::vector<int32_t> tally(E);
    for (auto& c : tally) c = static_cast<int32_t>(8 * (rng() % 9));
    // An expert exactly at the mean: E - 1 loads, then the last one making the total E times the first's.
    if (E > 2) {
      const int64_t others = std::accumulate(tally.begin() + 1, tally.end() - 1, int64_t{0});
      const int64_t last = static_cast<int64_t>(tally[0]) * E - tally[0] - others;
      if (last >= 0) tally[E - 1] = static_cast<int32_t>(last);
    }
    const int64_t total = std::accumulate(tally.begin(), tally.end(), int64_t{0});
    const std::vector<float> bias = uniform(E, 17);
    std::vector<float> ref = bias, ref_total = bias;
    std::vector<int32_t> ref_tally = tally;
    router_bias_update_from_tally_ref(ref_tally.data(), E, 0.001f, ref.data());
    router_bias_update_ref(tally.data(), E, total, 0.001f, ref_total.data());
    EXPECT_TRUE(same_bits(ref, ref_total));
    DeviceBuffer<int32_t> d_tally(E);
    DeviceBuffer<float> d_bias(E);
    d_tally.upload(tally);
    d_bias.upload(bias);
    router_bias_update_from_tally(d_tally.ptr, E, 0.001f, d_bias.ptr, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(same_bits(d_bias.download(), ref));
    EXPECT_EQ(d_tally.download(), std::vector<int32_t>(static_cast<size_t>(E), 0)) << "the tally was not zeroed";
    // A zero tally (a step without tokens) leaves the bias unchanged.
    router_bias_update_from_tally(d_tally.ptr, E, 0.001f, d_bias.ptr, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(same_bits(d_bias.download(), ref));
  }
}

}  // namespace
}  // namespace fp4moe
