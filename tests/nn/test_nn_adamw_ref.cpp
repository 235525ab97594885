// CPU reference of AdamW and the global gradient norm (kernels/nn/adamw.h): the first step is lr * sign(g), bias
// correction makes a constant gradient move the weight by lr per step, decoupled decay shrinks the master weight
// by (1 - lr wd) independently of the gradient, the clip scale multiplies the gradient, the BF16 copy is the
// rounded master; the norm over several tensors and its clip scale; rejections (references and GPU launchers).
// BF16 moments (DeepSeek-V3 sec. 3.3.3): against a double computation on random inputs, each stored moment the
// BF16 nearest to the double value (rounded once, ties to even, also where an FP32 step would have made a false
// tie), the master update from the unrounded moments (the same master as FP32 moments holding the same values).
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

struct HostTensorBf16Moments {
  std::vector<float> master, grad;
  std::vector<bf16> m, v, param;
  HostTensorBf16Moments(std::vector<float> w, std::vector<float> g)
      : master(std::move(w)), grad(std::move(g)), m(master.size(), bf16_from_bits(0)),
        v(master.size(), bf16_from_bits(0)), param(master.size()) {}
  AdamWTensorBf16Moments view() {
    return {master.data(), param.data(), grad.data(), m.data(), v.data(), static_cast<int64_t>(master.size())};
  }
};

// `got` is a BF16 nearest to `exact`: no BF16 neighbour of it is closer (ties to even are checked separately).
::testing::AssertionResult nearest_bf16(bf16 got, double exact) {
  const uint16_t b = bf16_bits(got);
  const double d = std::fabs(bf16_to_f64(got) - exact);
  for (const uint16_t n : {static_cast<uint16_t>(b - 1), static_cast<uint16_t>(b + 1)})
    if (std::fabs(bf16_to_f64(bf16_from_bits(n)) - exact) < d)
      return ::testing::AssertionFailure() << "BF16 " << bf16_to_f64(got) << " is not the nearest to " << exact;
  return ::testing::AssertionSuccess();
}

TEST(NnRefAdamW, Bf16MomentsAreTheNearestBf16OfTheDoubleMoments) {
  const size_t n = 4099;
  const std::vector<double> w0 = test::normal_values(n, 11, 0.0, 0.02), g0 = test::normal_values(n, 12, 0.0, 1e-3),
                            m0 = test::normal_values(n, 13, 0.0, 1e-3), r0 = test::normal_values(n, 14, 0.0, 1e-6);
  std::vector<float> w(n), g(n);
  for (size_t i = 0; i < n; ++i) {
    w[i] = static_cast<float>(w0[i]);
    g[i] = static_cast<float>(g0[i]);
  }
  HostTensorBf16Moments t(w, g);
  for (size_t i = 0; i < n; ++i) {
    t.m[i] = test::f64_to_bf16(m0[i]);
    const double m = bf16_to_f64(t.m[i]);
    t.v[i] = test::f64_to_bf16(m * m + std::fabs(r0[i]));  // v >= m^2, as in a real run
  }
  const std::vector<bf16> m_in = t.m, v_in = t.v;
  AdamWConfig cfg;
  cfg.lr = 3e-4f;
  cfg.step = 6;
  const float scale = 0.75f;
  adamw_step_ref(t.view(), cfg, scale);
  const double b1 = cfg.beta1, b2 = cfg.beta2;
  const double bc1 = 1 - std::pow(b1, 6.0), bc2 = 1 - std::pow(b2, 6.0);
  for (size_t i = 0; i < n; ++i) {
    SCOPED_TRACE("element " + std::to_string(i));
    const double gi = static_cast<double>(g[i]) * scale;
    const double m = b1 * bf16_to_f64(m_in[i]) + (1 - b1) * gi;
    const double v = b2 * bf16_to_f64(v_in[i]) + (1 - b2) * gi * gi;
    const double wd = w[i] - double(cfg.lr) * cfg.weight_decay * w[i];
    const double want = wd - (double(cfg.lr) / bc1) * m / (std::sqrt(v) / std::sqrt(bc2) + cfg.eps);
    ASSERT_TRUE(nearest_bf16(t.m[i], m));
    ASSERT_TRUE(nearest_bf16(t.v[i], v));
    ASSERT_NEAR(t.master[i], want, std::ldexp(std::fabs(want), -23) + 1e-12);  // one FP32 rounding
    ASSERT_EQ(bf16_bits(t.param[i]), f32_to_bf16_bits(t.master[i]));
  }
}

TEST(NnRefAdamW, Bf16MomentsUpdateTheMasterAsFp32MomentsOfTheSameValues) {
  // The master update reads the unrounded moments: FP32 moments holding the same (BF16) values give the same master
  // and param, and their FP32 m and v round (nearest even) to the BF16 ones wherever no false tie arises.
  const size_t n = 1000;
  const std::vector<double> w0 = test::normal_values(n, 21, 0.0, 0.02), g0 = test::normal_values(n, 22, 0.0, 1e-2),
                            m0 = test::normal_values(n, 23, 0.0, 1e-2);
  std::vector<float> w(n), g(n);
  for (size_t i = 0; i < n; ++i) {
    w[i] = static_cast<float>(w0[i]);
    g[i] = static_cast<float>(g0[i]);
  }
  HostTensorBf16Moments b(w, g);
  HostTensor f(w, g);
  for (size_t i = 0; i < n; ++i) {
    b.m[i] = test::f64_to_bf16(m0[i]);
    b.v[i] = test::f64_to_bf16(2 * m0[i] * m0[i] + 1e-6);
    f.m[i] = static_cast<float>(bf16_to_f64(b.m[i]));
    f.v[i] = static_cast<float>(bf16_to_f64(b.v[i]));
  }
  AdamWConfig cfg;
  cfg.lr = 1e-3f;
  cfg.step = 2;
  adamw_step_ref(b.view(), cfg, 1.0f);
  adamw_step_ref(f.view(), cfg, 1.0f);
  // A false tie: the FP32 value sits exactly halfway between two BF16 values (its low 16 bits 0x8000).
  auto false_tie = [](float x) { return (f32_bits(x) & 0xFFFFu) == 0x8000u; };
  int compared = 0;
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(f32_bits(b.master[i]), f32_bits(f.master[i])) << i;
    EXPECT_EQ(bf16_bits(b.param[i]), bf16_bits(f.param[i])) << i;
    if (!false_tie(f.m[i])) {
      EXPECT_EQ(bf16_bits(b.m[i]), f32_to_bf16_bits(f.m[i])) << i;
    }
    if (!false_tie(f.v[i])) {
      EXPECT_EQ(bf16_bits(b.v[i]), f32_to_bf16_bits(f.v[i])) << i;
    }
    compared += !false_tie(f.m[i]) && !false_tie(f.v[i]);
  }
  EXPECT_GT(compared, 990);
}

TEST(NnRefAdamW, Bf16MomentsRoundOnceToNearestEven) {
  // beta1 = 0.5 and beta2 = 0.5 make m = (m0 + g) / 2 and v = (v0 + g^2) / 2 exact in double; lr = 0 leaves the
  // master alone. Each case: m0 = 1 (BF16), g chosen so that m lands on or near a BF16 rounding boundary of [1, 2)
  // (BF16 spacing 2^-7 there).
  struct Case {
    float g;
    double m_exact, m_stored;
  };
  const Case cases[] = {
      {1.0f + 0x1p-7f, 1.0 + 0x1p-8, 1.0},                                       // tie: to even (1.0)
      {1.0f + 3 * 0x1p-7f, 1.0 + 3 * 0x1p-8, 1.0 + 0x1p-6},                      // tie: to even (1 + 2^-6)
      {1.0f + 0x1p-7f + 0x1p-23f, 1.0 + 0x1p-8 + 0x1p-24, 1.0 + 0x1p-7},         // above the tie: up; through FP32
                                                                                 // (nearest even) it would be a tie
      {1.0f + 0x1p-7f - 0x1p-23f, 1.0 + 0x1p-8 - 0x1p-24, 1.0},                  // below the tie: down
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.m_exact);
    HostTensorBf16Moments t({0.5f}, {c.g});
    t.m[0] = bf16_from_bits(0x3F80);  // 1.0
    AdamWConfig cfg;
    cfg.lr = 0.0f;
    cfg.beta1 = 0.5f;
    cfg.beta2 = 0.5f;
    adamw_step_ref(t.view(), cfg, 1.0f);
    EXPECT_EQ(bf16_to_f64(t.m[0]), c.m_stored);
    EXPECT_TRUE(nearest_bf16(t.v[0], 0.5 * double(c.g) * double(c.g)));
    EXPECT_EQ(t.master[0], 0.5f);
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
  // BF16 moments: the same checks, 2-byte alignment of m and v.
  HostTensorBf16Moments h({1.0f}, {1.0f});
  AdamWTensorBf16Moments no_v = h.view();
  no_v.v = nullptr;
  test::expect_error_mentions([&] { adamw_step_ref(no_v, AdamWConfig{}, 1.0f); }, {"adamw_step_ref", "v is null"});
  test::expect_error_mentions([&] { adamw_step(no_v, AdamWConfig{}, nullptr, nullptr); }, {"adamw_step", "v is null"});
  AdamWTensorBf16Moments odd_m = h.view();
  odd_m.master = reinterpret_cast<float*>(uintptr_t{0x4000});
  odd_m.m = reinterpret_cast<bf16*>(uintptr_t{0x5001});
  test::expect_error_mentions([&] { adamw_step(odd_m, AdamWConfig{}, nullptr, nullptr); },
                              {"m must be 2-byte aligned"});
  AdamWConfig bad;
  bad.beta1 = -0.1f;
  test::expect_error_mentions([&] { adamw_step_ref(h.view(), bad, 1.0f); }, {"beta1 must be in [0, 1)"});
  EXPECT_STREQ(moment_dtype_name(MomentDtype::bf16), "bf16");
  EXPECT_STREQ(moment_dtype_name(MomentDtype::fp32), "fp32");
  EXPECT_EQ(moment_dtype_bytes(MomentDtype::bf16), 2);
  EXPECT_EQ(moment_dtype_bytes(MomentDtype::fp32), 4);
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
