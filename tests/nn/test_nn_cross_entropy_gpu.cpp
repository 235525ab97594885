// GPU fused LM-head cross-entropy (kernels/nn/cross_entropy.h) against its CPU reference in double on the same
// BF16 inputs: loss per token and mean (FP32 GEMM accumulation: 1e-4 relative), dh and dW (the chunk's dlogits
// are BF16 before the GEMMs: 1e-2 relative in norm). Shapes from V = 1 to a 32000-entry vocabulary, chunks that
// divide V, that leave a short last chunk, and that exceed V; ignored tokens (-100), all tokens ignored, dW
// accumulating into an existing master gradient. Outputs are poisoned; a second forward must repeat every bit.
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
#include "kernels/nn/cross_entropy.h"

namespace fp4moe {
namespace {

using test::DeviceBuffer;

struct Case {
  int64_t T, C, V, chunk;
  int ignored_every;  // every n-th token has target -100 (0: none)
};
const Case kCases[] = {{1, 8, 1, 8, 0},          {37, 64, 1000, 256, 0},  {129, 576, 5003, 1024, 5},
                       {5, 16, 100, 8192, 2},     {64, 128, 32000, 8192, 7}, {200, 32, 777, 8, 3}};

void random_bf16(size_t n, float stddev, uint32_t seed, std::vector<bf16>& b, std::vector<double>& d) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, stddev);
  b.resize(n);
  d.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const uint16_t bits = f32_to_bf16_bits(nd(rng));
    b[i] = bf16_from_bits(bits);
    d[i] = bf16_bits_to_f32(bits);
  }
}

// sqrt(sum (a - b)^2 / sum b^2), and the largest |a - b| against the largest |b|.
void expect_relative_error(const std::vector<float>& gpu, const std::vector<double>& ref, double max_rel,
                           const char* what) {
  ASSERT_EQ(gpu.size(), ref.size());
  double num = 0, den = 0, max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_TRUE(std::isfinite(gpu[i])) << what << "[" << i << "] = " << gpu[i] << " (unwritten or overflow)";
    const double d = gpu[i] - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
    max_diff = std::max(max_diff, std::fabs(d));
    max_ref = std::max(max_ref, std::fabs(ref[i]));
  }
  EXPECT_LE(std::sqrt(num / (den + 1e-300)), max_rel) << what << ": relative error in norm";
  EXPECT_LE(max_diff, 4 * max_rel * max_ref + 1e-30) << what << ": largest element error";
}

void check_case(const Case& c) {
  SCOPED_TRACE("T=" + std::to_string(c.T) + " C=" + std::to_string(c.C) + " V=" + std::to_string(c.V) +
               " chunk=" + std::to_string(c.chunk));
  std::vector<bf16> h, w;
  std::vector<double> hd, wd;
  random_bf16(c.T * c.C, 1.0f, 1, h, hd);
  random_bf16(c.V * c.C, 2.0f / std::sqrt(static_cast<float>(c.C)), 2, w, wd);
  std::vector<int32_t> targets(c.T);
  std::mt19937 rng(3);
  for (int64_t t = 0; t < c.T; ++t)
    targets[t] = (c.ignored_every && t % c.ignored_every == 1) ? kIgnoreIndex : static_cast<int32_t>(rng() % c.V);
  std::vector<float> dw_init(c.V * c.C);
  std::normal_distribution<float> nd(0.0f, 0.01f);
  for (auto& v : dw_init) v = nd(rng);
  const float dloss = 0.5f;

  DeviceBuffer<bf16> d_h(c.T * c.C), d_w(c.V * c.C);
  DeviceBuffer<int32_t> d_targets(c.T);
  DeviceBuffer<float> d_loss(c.T), d_mean(1), d_dh(c.T * c.C), d_dw(c.V * c.C);
  d_h.upload(h);
  d_w.upload(w);
  d_targets.upload(targets);
  d_dw.upload(dw_init);
  d_loss.poison(0xFF);
  d_mean.poison(0xFF);
  d_dh.poison(0xFF);

  LmHeadCrossEntropy ce(c.C, c.V, c.chunk);
  ce.forward(d_h.ptr, d_w.ptr, d_targets.ptr, c.T, d_loss.ptr, d_mean.ptr, nullptr);
  ce.backward(d_h.ptr, d_w.ptr, d_targets.ptr, c.T, dloss, d_dh.ptr, d_dw.ptr, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  const auto loss = d_loss.download();
  const float mean = d_mean.download()[0];

  std::vector<double> r_loss(c.T), r_dh(c.T * c.C), r_dw(c.V * c.C);
  const double r_mean = cross_entropy_forward_ref<double>(hd.data(), wd.data(), targets.data(), c.T, c.C, c.V,
                                                          c.chunk, r_loss.data());
  cross_entropy_backward_ref<double>(hd.data(), wd.data(), targets.data(), c.T, c.C, c.V, dloss, r_dh.data(),
                                     r_dw.data());
  EXPECT_NEAR(mean, r_mean, 1e-4 * std::fabs(r_mean) + 1e-6) << "mean loss";
  for (int64_t t = 0; t < c.T; ++t) {
    if (targets[t] == kIgnoreIndex) {
      EXPECT_EQ(loss[t], 0.0f) << "ignored token " << t;
    } else {
      EXPECT_NEAR(loss[t], r_loss[t], 1e-4 * std::fabs(r_loss[t]) + 1e-5) << "token " << t;
    }
  }
  expect_relative_error(d_dh.download(), r_dh, 1e-2, "dh");
  std::vector<float> dw_gain = d_dw.download();
  for (size_t i = 0; i < dw_gain.size(); ++i) dw_gain[i] -= dw_init[i];
  expect_relative_error(dw_gain, r_dw, 1e-2, "dW (gain over the master gradient)");

  // Determinism: the same forward again gives the same bits.
  d_loss.poison(0xFF);
  d_mean.poison(0xFF);
  ce.forward(d_h.ptr, d_w.ptr, d_targets.ptr, c.T, d_loss.ptr, d_mean.ptr, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  const auto loss2 = d_loss.download();
  const float mean2 = d_mean.download()[0];
  EXPECT_EQ(std::memcmp(loss.data(), loss2.data(), loss.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(&mean, &mean2, sizeof(float)), 0);
}

TEST(NnMoeCrossEntropy, MatchesReference) {
  FP4MOE_REQUIRE_DEVICE();
  for (const Case& c : kCases) check_case(c);
}

TEST(NnMoeCrossEntropy, ChunkSizeDoesNotChangeTheLoss) {
  FP4MOE_REQUIRE_DEVICE();
  const int64_t T = 48, C = 64, V = 3001;
  std::vector<bf16> h, w;
  std::vector<double> hd, wd;
  random_bf16(T * C, 1.0f, 4, h, hd);
  random_bf16(V * C, 0.25f, 5, w, wd);
  std::vector<int32_t> targets(T);
  for (int64_t t = 0; t < T; ++t) targets[t] = static_cast<int32_t>((t * 977) % V);
  DeviceBuffer<bf16> d_h(T * C), d_w(V * C);
  DeviceBuffer<int32_t> d_targets(T);
  DeviceBuffer<float> d_mean(1);
  d_h.upload(h);
  d_w.upload(w);
  d_targets.upload(targets);
  std::vector<float> means;
  for (int64_t chunk : {8, 128, 1000, 3008, 8192}) {
    LmHeadCrossEntropy ce(C, V, chunk);
    d_mean.poison(0xFF);
    ce.forward(d_h.ptr, d_w.ptr, d_targets.ptr, T, nullptr, d_mean.ptr, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    means.push_back(d_mean.download()[0]);
  }
  for (float m : means) EXPECT_NEAR(m, means.back(), 1e-5 * std::fabs(means.back()));
}

TEST(NnMoeCrossEntropy, AllTokensIgnored) {
  FP4MOE_REQUIRE_DEVICE();
  const int64_t T = 10, C = 16, V = 50;
  std::vector<bf16> h, w;
  std::vector<double> hd, wd;
  random_bf16(T * C, 1.0f, 6, h, hd);
  random_bf16(V * C, 1.0f, 7, w, wd);
  std::vector<float> dw_init(V * C, 0.25f);
  DeviceBuffer<bf16> d_h(T * C), d_w(V * C);
  DeviceBuffer<int32_t> d_targets(T);
  DeviceBuffer<float> d_loss(T), d_mean(1), d_dh(T * C), d_dw(V * C);
  d_h.upload(h);
  d_w.upload(w);
  d_targets.upload(std::vector<int32_t>(T, kIgnoreIndex));
  d_dw.upload(dw_init);
  d_loss.poison(0xFF);
  d_mean.poison(0xFF);
  d_dh.poison(0xFF);
  LmHeadCrossEntropy ce(C, V, 16);
  ce.forward(d_h.ptr, d_w.ptr, d_targets.ptr, T, d_loss.ptr, d_mean.ptr, nullptr);
  ce.backward(d_h.ptr, d_w.ptr, d_targets.ptr, T, 1.0f, d_dh.ptr, d_dw.ptr, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(d_mean.download()[0], 0.0f);
  EXPECT_EQ(d_loss.download(), std::vector<float>(T, 0.0f));
  EXPECT_EQ(d_dh.download(), std::vector<float>(T * C, 0.0f));
  EXPECT_EQ(d_dw.download(), dw_init) << "dW must be left as it was";
}

TEST(NnMoeCrossEntropy, TargetOutsideTheVocabularyGivesNaN) {
  FP4MOE_REQUIRE_DEVICE();
  const int64_t T = 4, C = 8, V = 20;
  std::vector<bf16> h, w;
  std::vector<double> hd, wd;
  random_bf16(T * C, 1.0f, 8, h, hd);
  random_bf16(V * C, 1.0f, 9, w, wd);
  DeviceBuffer<bf16> d_h(T * C), d_w(V * C);
  DeviceBuffer<int32_t> d_targets(T);
  DeviceBuffer<float> d_loss(T), d_mean(1);
  d_h.upload(h);
  d_w.upload(w);
  d_targets.upload({3, 20, kIgnoreIndex, -1});
  LmHeadCrossEntropy ce(C, V, 8);
  ce.forward(d_h.ptr, d_w.ptr, d_targets.ptr, T, d_loss.ptr, d_mean.ptr, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  const auto loss = d_loss.download();
  EXPECT_TRUE(std::isfinite(loss[0]));
  EXPECT_TRUE(std::isnan(loss[1])) << "target V";
  EXPECT_EQ(loss[2], 0.0f);
  EXPECT_TRUE(std::isnan(loss[3])) << "target -1";
  EXPECT_TRUE(std::isnan(d_mean.download()[0]));
}

TEST(NnMoeCrossEntropy, RejectsBackwardWithoutForward) {
  FP4MOE_REQUIRE_DEVICE();
  LmHeadCrossEntropy ce(16, 100, 64);
  DeviceBuffer<bf16> h(16 * 4), w(100 * 16);
  DeviceBuffer<int32_t> targets(4);
  DeviceBuffer<float> dh(16 * 4);
  try {
    ce.backward(h.ptr, w.ptr, targets.ptr, 4, 1.0f, dh.ptr, nullptr, nullptr);
    ADD_FAILURE() << "expected fp4moe::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs the forward of the same tokens first"), std::string::npos) << e.what();
  }
}

// The chunk kernels on their own, on FP32 logits given directly (no GEMM): the online softmax over column ranges
// of one [T, V] matrix (pointer logits + v0, ld = V) against log-sum-exp in double, and each chunk's dlogits
// against (softmax - onehot) * dloss / n_valid rounded to BF16.
TEST(NnMoeCrossEntropy, ChunkKernelsOnGivenLogits) {
  FP4MOE_REQUIRE_DEVICE();
  const int64_t T = 77, V = 1031, chunk = 200;
  std::mt19937 rng(21);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> logits(T * V);
  for (auto& v : logits) v = nd(rng);
  for (int64_t v = 0; v < V; ++v) logits[5 * V + v] = 80.0f + 0.001f * static_cast<float>(v);  // exp would overflow
  std::vector<int32_t> targets(T);
  for (int64_t t = 0; t < T; ++t) targets[t] = t % 9 == 4 ? kIgnoreIndex : static_cast<int32_t>(rng() % V);
  targets[7] = static_cast<int32_t>(V - 1);  // in the short last chunk
  targets[8] = 0;

  DeviceBuffer<float> d_logits(T * V), stats(4 * T), loss(T), mean(1);
  DeviceBuffer<int32_t> d_targets(T), n_valid(1);
  DeviceBuffer<bf16> dlogits(T * V);
  d_logits.upload(logits);
  d_targets.upload(targets);
  for (auto* b : {&stats, &loss, &mean}) b->poison(0xFF);
  n_valid.poison(0xFF);
  dlogits.poison(0xFF);
  float *m = stats.ptr, *s = stats.ptr + T, *z = stats.ptr + 2 * T, *lse = stats.ptr + 3 * T;
  const float dloss = 2.0f;
  cross_entropy_init(T, m, s, z, nullptr);
  for (int64_t v0 = 0; v0 < V; v0 += chunk)
    cross_entropy_chunk_update(d_logits.ptr + v0, V, T, v0, std::min(chunk, V - v0), d_targets.ptr, m, s, z, nullptr);
  cross_entropy_finalize(m, s, z, d_targets.ptr, T, V, lse, loss.ptr, mean.ptr, n_valid.ptr, nullptr);
  for (int64_t v0 = 0; v0 < V; v0 += chunk)
    cross_entropy_chunk_dlogits(d_logits.ptr + v0, V, T, v0, std::min(chunk, V - v0), d_targets.ptr, lse,
                                n_valid.ptr, dloss, dlogits.ptr + v0, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());

  const auto g_loss = loss.download();
  const auto g_dlogits = dlogits.download();
  int64_t valid = 0;
  double total = 0;
  std::vector<double> ref_lse(T);
  for (int64_t t = 0; t < T; ++t) {
    double mx = -INFINITY, sum = 0;
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, double(logits[t * V + v]));
    for (int64_t v = 0; v < V; ++v) sum += std::exp(logits[t * V + v] - mx);
    ref_lse[t] = mx + std::log(sum);
    if (targets[t] == kIgnoreIndex) {
      EXPECT_EQ(g_loss[t], 0.0f);
      continue;
    }
    const double ref = ref_lse[t] - logits[t * V + targets[t]];
    EXPECT_NEAR(g_loss[t], ref, 1e-5 * (std::fabs(ref_lse[t]) + 1)) << "token " << t;
    total += ref;
    ++valid;
  }
  EXPECT_EQ(n_valid.download()[0], valid);
  EXPECT_NEAR(mean.download()[0], total / valid, 1e-5 * std::fabs(total / valid) + 1e-6);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t v = 0; v < V; ++v) {
      const double p = std::exp(logits[t * V + v] - ref_lse[t]);
      const double ref = targets[t] == kIgnoreIndex ? 0.0 : (p - (v == targets[t] ? 1.0 : 0.0)) * dloss / valid;
      const double got = bf16_bits_to_f32(bf16_bits(g_dlogits[t * V + v]));
      ASSERT_NEAR(got, ref, 5e-3 * std::fabs(ref) + 1e-9) << "dlogits token " << t << " entry " << v;
    }
}

}  // namespace
}  // namespace fp4moe
