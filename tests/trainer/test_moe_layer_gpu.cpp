// GPU tests of the trainer's MoE layer and SwiGLU MLP (trainer/model/moe.h, swiglu_mlp.h) against the CPU reference
// of tests/common/moe_layer_ref.h (the kernels' *_ref functions and GEMMs in double, with BF16 rounding where the GPU
// stores BF16), on the tiny shapes: d 64, E 8, top-2, expert FFN 32, one shared expert, M 256 and 37 (max 256).
//   - forward y and backward dx and every parameter grad, v3 and v2 routers: relative L2 <= 1e-2 (BF16 storage;
//     the reference follows the GPU's selection, which must equal the reference's own wherever the selection
//     scores are not within 1e-4 of a tie); the v2 balance loss to 1e-4 relative;
//   - outputs NaN-poisoned before every run; determinism (a second run gives the same bits);
//   - force_routing: the router's own selection reproduces y bit for bit; a selection that starves experts 0 and 7
//     matches the reference and leaves their grads zero; null restores normal routing;
//   - the v3 bias update from the counts of the micro-batches whose backward ran; M = 0;
//   - the fp8 and mxfp4 routed recipes against the same BF16 reference with the looser tolerances their formats
//     allow (wiring checks: a wrong wiring is off by O(1)).
// Run: fp4moe_tests_gpu --gtest_filter='MoeLayer*:SwigluMlp*'
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tests/common/moe_layer_ref.h"
#include "tests/common/gpu_test_util.h"
#include "tests/common/moe_test_util.h"
#include "tests/common/nn_test_util.h"
#include "kernels/common/check.h"
#include "kernels/nn/router.h"
#include "trainer/config.h"
#include "trainer/model/moe.h"
#include "trainer/model/swiglu_mlp.h"

namespace fp4moe {
namespace {

using test::DeviceBuffer;
using test::LayerHarness;
using test::Vec;

constexpr int64_t kD = 64, kE = 8, kK = 2, kF = 32, kShared = 1, kMaxTokens = 256;
const std::string kPrefix = "layers.1.moe";

TrainerConfig tiny_moe(RouterStyle style, Recipe routed = Recipe::bf16) {
  TrainerConfig c;
  c.model.hidden = kD;
  c.model.layers = 2;
  c.moe.routed_experts = kE;
  c.moe.shared_experts = kShared;
  c.moe.top_k = kK;
  c.moe.expert_ffn = kF;
  c.moe.router = style;
  c.moe.routed_scale = style == RouterStyle::v3_sigmoid ? 2.5 : 2.0;
  c.moe.aux_alpha = style == RouterStyle::v2_softmax ? 0.01 : 0.0;
  c.moe.bias_update_rate = 0.001;
  c.recipe.routed_experts = routed;
  return c;
}

test::MoeRefShape ref_shape(const TrainerConfig& c, int64_t M) {
  return test::MoeRefShape{M, kD, kE, kK, kF, c.moe.shared_experts * kF,
                           RouterConfig{c.moe.router, kK, static_cast<float>(c.moe.routed_scale),
                                        static_cast<float>(c.moe.aux_alpha)}};
}

// A layer with allocated, seeded parameters; weights re-drawn with stds that put the router logits near 1 and the
// SwiGLU in its non-linear range; a non-zero v3 bias.
struct MoeSetup {
  LayerHarness h;
  TrainerConfig cfg;
  std::unique_ptr<MoeLayer> layer;
  test::MoeRefParams p;
  explicit MoeSetup(const TrainerConfig& c) : cfg(c) {
    layer = std::make_unique<MoeLayer>(h.store, kPrefix, cfg, kMaxTokens, h.mem);
    h.fit_scratch(layer->scratch_bytes());
    h.store.allocate(h.mem);
    h.store.init(7, h.stream);
    p.wr = h.set_param(kPrefix + ".router", 0.15, 1);
    p.w1 = h.set_param(kPrefix + ".experts.fc1", 0.1, 2);
    p.w2 = h.set_param(kPrefix + ".experts.fc2", 0.1, 3);
    if (cfg.moe.shared_experts > 0) {
      p.ws1 = h.set_param(kPrefix + ".shared.fc1", 0.1, 4);
      p.ws2 = h.set_param(kPrefix + ".shared.fc2", 0.1, 5);
    }
    if (cfg.moe.router == RouterStyle::v3_sigmoid) {
      std::vector<float> bias(kE);
      p.bias.resize(kE);
      for (int64_t e = 0; e < kE; ++e) p.bias[e] = bias[e] = 0.01f * static_cast<float>((e * 5) % 7 - 3);
      CUDA_CHECK(cudaMemcpy(h.state(kPrefix + ".router_bias").data, bias.data(), kE * sizeof(float),
                            cudaMemcpyHostToDevice));
    }
  }
  ~MoeSetup() { layer.reset(); }  // before the harness's allocator goes
};

struct RunResult {
  Vec y, dx;
  std::vector<int32_t> idx;
  float aux = 0;
};

// Zeroes the grads, poisons y and dx, runs forward and backward on x and dy.
RunResult run_layer(MoeSetup& s, const std::vector<bf16>& x, const std::vector<bf16>& dy, int64_t M) {
  DeviceBuffer<bf16> x_d(M * kD), y_d(M * kD), dy_d(M * kD), dx_d(M * kD);
  x_d.upload(x);
  dy_d.upload(dy);
  y_d.poison(0xFF);
  dx_d.poison(0xFF);
  s.h.store.zero_grads(s.h.stream);
  s.layer->forward(s.h.ctx, x_d.ptr, M, y_d.ptr);
  RunResult r;
  r.aux = s.layer->aux_loss_host();
  s.layer->backward(s.h.ctx, dy_d.ptr, x_d.ptr, M, dx_d.ptr);
  s.h.sync();
  r.y = test::as_doubles(y_d.download());
  r.dx = test::as_doubles(dx_d.download());
  r.idx.resize(M * kK);
  CUDA_CHECK(cudaMemcpy(r.idx.data(), s.layer->topk_idx(), M * kK * sizeof(int32_t), cudaMemcpyDeviceToHost));
  return r;
}

struct Tolerances {
  double y = 1e-2, dx = 1e-2, grads = 1e-2;
};

// Compares a run with the reference that follows `selection` (the GPU's own, or a forced one).
void expect_matches_reference(MoeSetup& s, const Vec& x, const Vec& dy, int64_t M, const RunResult& r,
                              const std::vector<int32_t>& selection, const Tolerances& tol) {
  const test::MoeRefShape shape = ref_shape(s.cfg, M);
  const test::MoeRefForward ref = test::moe_ref_forward(shape, s.p, x, &selection, true);
  test::expect_rel_l2(r.y, ref.y, tol.y, "y");
  if (s.cfg.moe.router == RouterStyle::v2_softmax)
    EXPECT_NEAR(r.aux, ref.aux, 1e-4 * std::fabs(ref.aux) + 1e-9) << "v2 balance loss";
  else
    EXPECT_EQ(r.aux, 0.0f) << "v3 has no balance loss";
  const test::MoeRefGrads g = test::moe_ref_backward(shape, s.p, x, ref, dy, 1.0, true);
  test::expect_rel_l2(r.dx, g.dx, tol.dx, "dx");
  test::expect_rel_l2(s.h.grad(kPrefix + ".router"), g.gwr, tol.grads, "router grad");
  test::expect_rel_l2(s.h.grad(kPrefix + ".experts.fc1"), g.gw1, tol.grads, "experts.fc1 grad");
  test::expect_rel_l2(s.h.grad(kPrefix + ".experts.fc2"), g.gw2, tol.grads, "experts.fc2 grad");
  if (s.cfg.moe.shared_experts > 0) {
    test::expect_rel_l2(s.h.grad(kPrefix + ".shared.fc1"), g.gws1, tol.grads, "shared.fc1 grad");
    test::expect_rel_l2(s.h.grad(kPrefix + ".shared.fc2"), g.gws2, tol.grads, "shared.fc2 grad");
  }
}

// The GPU selection equals the reference's own for every token whose selection scores are not within 1e-4 of a tie.
void expect_selection_matches(MoeSetup& s, const Vec& x, int64_t M, const std::vector<int32_t>& gpu_idx) {
  const test::MoeRefForward own = test::moe_ref_forward(ref_shape(s.cfg, M), s.p, x, nullptr, false);
  int64_t near_ties = 0;
  for (int64_t t = 0; t < M; ++t) {
    if (own.margin[t] < 1e-4) {
      ++near_ties;
      continue;
    }
    for (int64_t j = 0; j < kK; ++j)
      ASSERT_EQ(gpu_idx[t * kK + j], own.own_idx[t * kK + j]) << "token " << t << " slot " << j;
  }
  EXPECT_LT(near_ties, M / 10 + 1) << "too many near-ties for the selection check to mean much";
}

void check_against_reference(RouterStyle style, int64_t M, Recipe routed, const Tolerances& tol) {
  SCOPED_TRACE(std::string(router_style_name(style)) + " M=" + std::to_string(M) + " routed " + recipe_name(routed));
  MoeSetup s(tiny_moe(style, routed));
  Vec x, dy;
  const auto xb = test::random_bf16_values(M * kD, 100 + static_cast<uint32_t>(M), 1.0, x);
  const auto dyb = test::random_bf16_values(M * kD, 200 + static_cast<uint32_t>(M), 1.0, dy);
  const RunResult r = run_layer(s, xb, dyb, M);
  expect_selection_matches(s, x, M, r.idx);
  expect_matches_reference(s, x, dy, M, r, r.idx, tol);
}

TEST(MoeLayer, V3MatchesReference) {
  FP4MOE_REQUIRE_DEVICE();
  for (int64_t M : {int64_t{256}, int64_t{37}}) check_against_reference(RouterStyle::v3_sigmoid, M, Recipe::bf16, {});
}

TEST(MoeLayer, V2MatchesReference) {
  FP4MOE_REQUIRE_DEVICE();
  for (int64_t M : {int64_t{256}, int64_t{37}}) check_against_reference(RouterStyle::v2_softmax, M, Recipe::bf16, {});
}

TEST(MoeLayer, WithoutSharedExperts) {
  FP4MOE_REQUIRE_DEVICE();
  TrainerConfig c = tiny_moe(RouterStyle::v3_sigmoid);
  c.moe.shared_experts = 0;
  MoeSetup s(c);
  EXPECT_EQ(s.layer->shared(), nullptr);
  Vec x, dy;
  const int64_t M = 37;
  const auto xb = test::random_bf16_values(M * kD, 5, 1.0, x), dyb = test::random_bf16_values(M * kD, 6, 1.0, dy);
  const RunResult r = run_layer(s, xb, dyb, M);
  expect_matches_reference(s, x, dy, M, r, r.idx, {});
}

// FP8 (E4M3, 1x128 / 128x128 blocks) and MXFP4 (E2M1 with power-of-two block scales, backward in FP8) against the
// BF16 reference. An emulation of one expert's forward at these shapes (weights std 0.1, x ~ N(0, 1)) gives a
// relative L2 error of the fc2 output of about 0.065 (fp8) and 0.23 (mxfp4: 0.115 per quantized activation);
// the tolerances allow about 1.5-2x that, well below the O(1) error of a wrong wiring.
TEST(MoeLayer, Fp8RoutedExpertsMatchReferenceLoosely) {
  FP4MOE_REQUIRE_DEVICE();
  check_against_reference(RouterStyle::v3_sigmoid, 256, Recipe::fp8, Tolerances{0.12, 0.15, 0.2});
}

TEST(MoeLayer, Mxfp4RoutedExpertsMatchReferenceLoosely) {
  FP4MOE_REQUIRE_DEVICE();
  check_against_reference(RouterStyle::v3_sigmoid, 256, Recipe::mxfp4, Tolerances{0.35, 0.35, 0.5});
}

TEST(MoeLayer, Deterministic) {
  FP4MOE_REQUIRE_DEVICE();
  for (RouterStyle style : {RouterStyle::v3_sigmoid, RouterStyle::v2_softmax}) {
    SCOPED_TRACE(router_style_name(style));
    MoeSetup s(tiny_moe(style));
    Vec x, dy;
    const int64_t M = 256;
    const auto xb = test::random_bf16_values(M * kD, 8, 1.0, x), dyb = test::random_bf16_values(M * kD, 9, 1.0, dy);
    const RunResult a = run_layer(s, xb, dyb, M);
    std::vector<Vec> grads_a;
    for (const auto& p : s.h.store.params()) grads_a.push_back(s.h.grad(p.name));
    const RunResult b = run_layer(s, xb, dyb, M);
    EXPECT_EQ(a.idx, b.idx);
    test::expect_bitwise_equal(a.y, b.y, "y");
    test::expect_bitwise_equal(a.dx, b.dx, "dx");
    EXPECT_EQ(a.aux, b.aux);
    size_t i = 0;
    for (const auto& p : s.h.store.params()) test::expect_bitwise_equal(grads_a[i++], s.h.grad(p.name), p.name);
  }
}

TEST(MoeLayer, ForceRoutingIsHonoured) {
  FP4MOE_REQUIRE_DEVICE();
  for (RouterStyle style : {RouterStyle::v3_sigmoid, RouterStyle::v2_softmax}) {
    SCOPED_TRACE(router_style_name(style));
    MoeSetup s(tiny_moe(style));
    const int64_t M = 256;
    Vec x, dy;
    const auto xb = test::random_bf16_values(M * kD, 10, 1.0, x), dyb = test::random_bf16_values(M * kD, 11, 1.0, dy);
    const RunResult normal = run_layer(s, xb, dyb, M);

    // The router's own selection, forced: the same bits.
    DeviceBuffer<int32_t> forced(M * kK);
    forced.upload(normal.idx);
    s.layer->force_routing(forced.ptr);
    const RunResult same = run_layer(s, xb, dyb, M);
    EXPECT_EQ(same.idx, normal.idx);
    test::expect_bitwise_equal(same.y, normal.y, "y with the router's own selection forced");
    test::expect_bitwise_equal(same.dx, normal.dx, "dx with the router's own selection forced");
    EXPECT_EQ(same.aux, normal.aux);

    // A selection that starves experts 0 and 7: token t goes to 1 + t % 6 and 1 + (t + 3) % 6.
    std::vector<int32_t> starve(M * kK);
    for (int64_t t = 0; t < M; ++t) {
      starve[t * kK] = static_cast<int32_t>(1 + t % 6);
      starve[t * kK + 1] = static_cast<int32_t>(1 + (t + 3) % 6);
    }
    forced.upload(starve);
    const RunResult r = run_layer(s, xb, dyb, M);
    EXPECT_EQ(r.idx, starve) << "topk_idx() reports the forced selection";
    expect_matches_reference(s, x, dy, M, r, starve, {});
    const Vec g1 = s.h.grad(kPrefix + ".experts.fc1"), g2 = s.h.grad(kPrefix + ".experts.fc2");
    for (int64_t e : {int64_t{0}, int64_t{7}}) {
      EXPECT_TRUE(test::expert_slice_is_zero(g1, e, 2 * kF * kD)) << "expert " << e << " fc1 grad";
      EXPECT_TRUE(test::expert_slice_is_zero(g2, e, kD * kF)) << "expert " << e << " fc2 grad";
    }

    s.layer->force_routing(nullptr);
    const RunResult back = run_layer(s, xb, dyb, M);
    EXPECT_EQ(back.idx, normal.idx);
    test::expect_bitwise_equal(back.y, normal.y, "y after force_routing(nullptr)");
  }
}

TEST(MoeLayer, V3BiasUpdateUsesTheCountsOfTrainedMicroBatches) {
  FP4MOE_REQUIRE_DEVICE();
  MoeSetup s(tiny_moe(RouterStyle::v3_sigmoid));
  const StateTensor& bias_state = s.h.state(kPrefix + ".router_bias");
  auto bias_now = [&] {
    std::vector<float> b(kE);
    s.h.sync();
    CUDA_CHECK(cudaMemcpy(b.data(), bias_state.data, kE * sizeof(float), cudaMemcpyDeviceToHost));
    return b;
  };
  std::vector<float> expected = bias_now();
  std::vector<int32_t> counts(kE, 0);
  int64_t total = 0;
  for (int64_t M : {int64_t{256}, int64_t{37}}) {  // two micro-batches of one step
    Vec x, dy;
    const auto xb = test::random_bf16_values(M * kD, 30 + static_cast<uint32_t>(M), 1.0, x);
    const auto dyb = test::random_bf16_values(M * kD, 40 + static_cast<uint32_t>(M), 1.0, dy);
    const RunResult r = run_layer(s, xb, dyb, M);
    for (int32_t e : r.idx) ++counts[e];
    total += M * kK;
  }
  {  // an evaluation forward (no backward) must not count
    Vec x;
    DeviceBuffer<bf16> x_d(64 * kD), y_d(64 * kD);
    x_d.upload(test::random_bf16_values(64 * kD, 50, 1.0, x));
    s.layer->forward(s.h.ctx, x_d.ptr, 64, y_d.ptr);
    s.h.sync();
  }
  s.layer->end_step(s.h.ctx);
  router_bias_update_ref(counts.data(), kE, total, 0.001f, expected.data());
  EXPECT_EQ(bias_now(), expected);
  s.layer->end_step(s.h.ctx);  // the tally restarted: no tokens, no change
  EXPECT_EQ(bias_now(), expected);
}

TEST(MoeLayer, ZeroTokens) {
  FP4MOE_REQUIRE_DEVICE();
  for (RouterStyle style : {RouterStyle::v3_sigmoid, RouterStyle::v2_softmax}) {
    SCOPED_TRACE(router_style_name(style));
    MoeSetup s(tiny_moe(style));
    s.h.store.zero_grads(s.h.stream);
    s.layer->forward(s.h.ctx, nullptr, 0, nullptr);
    EXPECT_EQ(s.layer->aux_loss_host(), 0.0f);
    s.layer->backward(s.h.ctx, nullptr, nullptr, 0, nullptr);
    s.layer->end_step(s.h.ctx);
    for (const auto& p : s.h.store.params())
      for (double g : s.h.grad(p.name)) ASSERT_EQ(g, 0.0) << p.name;
    EXPECT_THROW(s.layer->forward(s.h.ctx, nullptr, kMaxTokens + 1, nullptr), Error);
  }
}

// ---- SwigluMlp ---------------------------------------------------------------------------------------------------

struct MlpSetup {
  LayerHarness h;
  std::unique_ptr<SwigluMlp> mlp;
  Vec w1, w2;
  MlpSetup() {
    mlp = std::make_unique<SwigluMlp>(h.store, "layers.0.mlp", kD, kF, Recipe::bf16, kMaxTokens, h.mem, 0.01f);
    h.fit_scratch(mlp->scratch_bytes());
    h.store.allocate(h.mem);
    h.store.init(3, h.stream);
    w1 = h.set_param("layers.0.mlp.fc1", 0.1, 21);
    w2 = h.set_param("layers.0.mlp.fc2", 0.1, 22);
  }
  ~MlpSetup() { mlp.reset(); }
};

TEST(SwigluMlp, RegistersItsParameters) {
  FP4MOE_REQUIRE_DEVICE();
  MlpSetup s;
  EXPECT_EQ(s.h.param("layers.0.mlp.fc1").shape, (std::vector<int64_t>{2 * kF, kD}));
  EXPECT_EQ(s.h.param("layers.0.mlp.fc2").shape, (std::vector<int64_t>{kD, kF}));
  EXPECT_FLOAT_EQ(s.h.param("layers.0.mlp.fc1").init_std, 0.02f);
  EXPECT_FLOAT_EQ(s.h.param("layers.0.mlp.fc2").init_std, 0.01f);
}

TEST(SwigluMlp, MatchesReference) {
  FP4MOE_REQUIRE_DEVICE();
  for (int64_t M : {int64_t{256}, int64_t{37}}) {
    SCOPED_TRACE("M=" + std::to_string(M));
    MlpSetup s;
    Vec x, dy;
    const auto xb = test::random_bf16_values(M * kD, 60, 1.0, x), dyb = test::random_bf16_values(M * kD, 61, 1.0, dy);
    DeviceBuffer<bf16> x_d(M * kD), y_d(M * kD), dy_d(M * kD), dx_d(M * kD);
    x_d.upload(xb);
    dy_d.upload(dyb);
    y_d.poison(0xFF);
    dx_d.poison(0xFF);
    s.h.store.zero_grads(s.h.stream);
    s.mlp->forward(s.h.ctx, x_d.ptr, M, y_d.ptr);
    s.mlp->backward(s.h.ctx, dy_d.ptr, x_d.ptr, M, dx_d.ptr);
    s.h.sync();
    const test::MlpRefForward ref = test::mlp_ref_forward(x, s.w1, s.w2, M, kD, kF, true);
    const test::MlpRefGrads g = test::mlp_ref_backward(x, s.w1, s.w2, ref, dy, M, kD, kF, true);
    const Vec y = test::as_doubles(y_d.download()), dx = test::as_doubles(dx_d.download());
    test::expect_rel_l2(y, ref.y, 1e-2, "y");
    test::expect_rel_l2(dx, test::maybe_round(g.dx, true), 1e-2, "dx");
    test::expect_rel_l2(s.h.grad("layers.0.mlp.fc1"), g.gw1, 1e-2, "fc1 grad");
    test::expect_rel_l2(s.h.grad("layers.0.mlp.fc2"), g.gw2, 1e-2, "fc2 grad");

    // Determinism, and the FP32 accumulating Dgrad: dx32 = base + dx.
    const Vec gw1 = s.h.grad("layers.0.mlp.fc1");
    y_d.poison(0xFF);
    s.h.store.zero_grads(s.h.stream);
    s.mlp->forward(s.h.ctx, x_d.ptr, M, y_d.ptr);
    const std::vector<float> base(M * kD, 0.5f);
    DeviceBuffer<float> dx32(M * kD);
    dx32.upload(base);
    s.mlp->backward(s.h.ctx, dy_d.ptr, x_d.ptr, M, LinearGradOut{dx32.ptr, true, true});
    s.h.sync();
    test::expect_bitwise_equal(test::as_doubles(y_d.download()), y, "y, second run");
    test::expect_bitwise_equal(s.h.grad("layers.0.mlp.fc1"), gw1, "fc1 grad, second run");
    const std::vector<float> acc = dx32.download();
    Vec added(acc.size());
    for (size_t i = 0; i < acc.size(); ++i) added[i] = static_cast<double>(acc[i]) - 0.5;
    test::expect_rel_l2(added, g.dx, 1e-2, "dx accumulated in FP32");
  }
}

TEST(SwigluMlp, ZeroTokensAndLimits) {
  FP4MOE_REQUIRE_DEVICE();
  MlpSetup s;
  s.h.store.zero_grads(s.h.stream);
  s.mlp->forward(s.h.ctx, nullptr, 0, nullptr);
  s.mlp->backward(s.h.ctx, nullptr, nullptr, 0, static_cast<bf16*>(nullptr));
  for (double g : s.h.grad("layers.0.mlp.fc1")) ASSERT_EQ(g, 0.0);
  EXPECT_THROW(s.mlp->forward(s.h.ctx, nullptr, kMaxTokens + 1, nullptr), Error);
  EXPECT_THROW(s.mlp->backward(s.h.ctx, nullptr, nullptr, 5, static_cast<bf16*>(nullptr)), Error)
      << "backward must follow a forward of the same M";
}

}  // namespace
}  // namespace fp4moe
