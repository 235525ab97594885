// CPU reference of AdamW and the global gradient norm (kernels/nn/adamw.h): the first step is lr * sign(g), bias
// correction makes a constant gradient move the weight by lr per step, decoupled decay shrinks the master weight
// by (1 - lr wd) independently of the gradient, the clip scale multiplies the gradient, the BF16 copy is the
// rounded master; the norm over several tensors and its clip scale; rejections (references and GPU launchers).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/nn/adamw.h"
#include "tests/common/nn_ref_test_util.h"

namespace fp4moe {
namespace {

using test::bf16_to_f64;

struct HostTensor {
  std::vector<float> master, grad, m, v;
  std::vector<bf16> param;
  explicit HostTensor(std::vector<float> w, std::vector<float> g)
      : master(std::move(w)), grad(std::move(g)), m(master.size()), v(master.size()), param(master.size()) {}
  AdamWTensor view() {
    return {master.data(), param.data(), grad.data(), m.data(), v.data(), static_cast<int64_t>(master.size())};
  }
};

TEST(NnRefAdamW, HandComputedFirstStep) {
  // g = 0.5, beta1 0.9, beta2 0.95: m = 0.05, v = 0.0125; m_hat = 0.5, v_hat = 0.25; update = lr * 0.5 / 0.5 = lr.
  HostTensor t({1.0f, -2.0f}, {0.5f, -3.0f});
  AdamWConfig cfg;
  cfg.lr = 0.1f;
  cfg.eps = 1e-12f;
  cfg.weight_decay = 0.1f;
  adamw_step_ref(t.view(), cfg, 1.0f);
  EXPECT_NEAR(t.m[0], 0.05, 2e-8);  // FP32 moments
  EXPECT_NEAR(t.v[0], 0.0125, 5e-9);
  EXPECT_NEAR(t.master[0], 1.0 - 0.1 * 0.1 * 1.0 - 0.1, 1e-6);     // decay, then lr * sign(g)
  EXPECT_NEAR(t.master[1], -2.0 + 0.1 * 0.1 * 2.0 + 0.1, 1e-6);
  EXPECT_EQ(bf16_bits(t.param[0]), f32_to_bf16_bits(t.master[0]));  // the BF16 copy of the master weight
  EXPECT_EQ(bf16_bits(t.param[1]), f32_to_bf16_bits(t.master[1]));
}

TEST(NnRefAdamW, ConstantGradientMovesByLrEveryStep) {
  // With bias correction, m_hat = g and v_hat = g^2 exactly for a constant g: each step moves lr * sign(g).
  HostTensor t({0.0f}, {0.25f});
  AdamWConfig cfg;
  cfg.lr = 0.01f;
  cfg.eps = 1e-12f;
  cfg.weight_decay = 0.0f;
  for (int64_t s = 1; s <= 20; ++s) {
    cfg.step = s;
    adamw_step_ref(t.view(), cfg, 1.0f);
    EXPECT_NEAR(t.master[0], -0.01 * s, 1e-6) << "step " << s;
  }
}

TEST(NnRefAdamW, DecoupledDecayDoesNotGoThroughTheMoments) {
  // Zero gradient: m = v = 0 stays, the update term is 0 / eps = 0, only the decay acts.
  HostTensor t({3.0f}, {0.0f});
  AdamWConfig cfg;
  cfg.lr = 0.5f;
  cfg.weight_decay = 0.1f;
  adamw_step_ref(t.view(), cfg, 1.0f);
  EXPECT_NEAR(t.master[0], 3.0 * (1 - 0.05), 1e-6);
  EXPECT_EQ(t.m[0], 0.0f);
  EXPECT_EQ(t.v[0], 0.0f);
}

TEST(NnRefAdamW, ClipScaleMultipliesTheGradient) {
  HostTensor a({1.0f, 2.0f}, {0.3f, -0.7f}), b({1.0f, 2.0f}, {0.6f, -1.4f});
  AdamWConfig cfg;
  cfg.lr = 1e-3f;
  cfg.step = 3;
  adamw_step_ref(a.view(), cfg, 2.0f);
  adamw_step_ref(b.view(), cfg, 1.0f);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(a.master[i], b.master[i]);
    EXPECT_EQ(a.m[i], b.m[i]);
    EXPECT_EQ(a.v[i], b.v[i]);
  }
}

TEST(NnRefAdamW, GlobalNormAndClipScale) {
  const std::vector<float> g1 = {3.0f}, g2 = {0.0f, 4.0f}, g3 = {};
  const GradTensor ts[] = {{g1.data(), 1}, {g2.data(), 2}, {g3.data(), 0}};
  const double norm = grad_global_norm_ref(ts, 3);
  EXPECT_EQ(norm, 5.0);
  EXPECT_FLOAT_EQ(grad_clip_scale(norm, 1.0f), static_cast<float>(1.0 / (5.0 + 1e-6)));
  EXPECT_EQ(grad_clip_scale(norm, 10.0f), 1.0f);
  EXPECT_EQ(grad_clip_scale(norm, std::numeric_limits<float>::infinity()), 1.0f);
  EXPECT_EQ(grad_global_norm_ref(ts, 0), 0.0);
  const std::vector<float> bad = {1.0f, std::numeric_limits<float>::quiet_NaN()};
  const GradTensor with_nan[] = {{bad.data(), 2}};
  EXPECT_TRUE(std::isnan(grad_global_norm_ref(with_nan, 1)));
  EXPECT_TRUE(std::isnan(grad_clip_scale(grad_global_norm_ref(with_nan, 1), 1.0f)));
  EXPECT_TRUE(std::isnan(grad_clip_scale(std::numeric_limits<double>::infinity(), 1.0f)));
}

TEST(NnRefAdamW, RejectsBadArguments) {
  HostTensor t({1.0f}, {1.0f});
  auto with = [&](auto change) {
    AdamWConfig cfg;
    cfg.lr = 1e-3f;
    change(cfg);
    return [=, &t] { adamw_step_ref(t.view(), cfg, 1.0f); };
  };
  test::expect_error_mentions(with([](AdamWConfig& c) { c.lr = -1; }), {"adamw_step_ref", "lr must be finite"});
  test::expect_error_mentions(with([](AdamWConfig& c) { c.beta1 = 1; }), {"beta1 must be in [0, 1)"});
  test::expect_error_mentions(with([](AdamWConfig& c) { c.beta2 = -0.5f; }), {"beta2 must be in [0, 1)"});
  test::expect_error_mentions(with([](AdamWConfig& c) { c.eps = 0; }), {"eps must be finite and > 0"});
  test::expect_error_mentions(with([](AdamWConfig& c) { c.weight_decay = NAN; }), {"weight_decay"});
  test::expect_error_mentions(with([](AdamWConfig& c) { c.step = 0; }), {"step must be >= 1", "step=0"});
  AdamWTensor missing = t.view();
  missing.m = nullptr;
  test::expect_error_mentions([&] { adamw_step_ref(missing, AdamWConfig{}, 1.0f); }, {"m is null"});
  // GPU launchers, before any CUDA call.
  test::expect_error_mentions([&] { adamw_step(missing, AdamWConfig{}, nullptr, nullptr); },
                              {"adamw_step", "m is null"});
  AdamWTensor odd = t.view();
  odd.master = reinterpret_cast<float*>(uintptr_t{0x4002});
  test::expect_error_mentions([&] { adamw_step(odd, AdamWConfig{}, nullptr, nullptr); },
                              {"master must be 4-byte aligned"});
  const GradTensor neg[] = {{nullptr, -1}}, null_grad[] = {{nullptr, 8}};
  float out = 0;
  double ws = 0;
  test::expect_error_mentions([&] { grad_global_norm(neg, 1, 1.0f, &ws, &out, nullptr, nullptr); },
                              {"grad_global_norm", "tensor 0 has n=-1"});
  test::expect_error_mentions([&] { grad_global_norm(null_grad, 1, 1.0f, &ws, &out, nullptr, nullptr); },
                              {"tensor 0 (n=8) has a null grad"});
  test::expect_error_mentions([&] { grad_global_norm(null_grad, 1, 0.0f, &ws, &out, nullptr, nullptr); },
                              {"max_norm must be > 0"});
  test::expect_error_mentions([&] { grad_global_norm(null_grad, 1, NAN, &ws, &out, nullptr, nullptr); },
                              {"max_norm must be > 0"});
  test::expect_error_mentions([&] { grad_global_norm(nullptr, 2, 1.0f, &ws, &out, nullptr, nullptr); },
                              {"tensors is null with count=2"});
  test::expect_error_mentions([&] { grad_global_norm(nullptr, 0, 1.0f, nullptr, &out, nullptr, nullptr); },
                              {"workspace is null"});
}

}  // namespace
}  // namespace fp4moe
