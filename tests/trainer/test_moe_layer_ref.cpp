// The CPU side of the MoE layer (trainer/model/moe.h): the layer reference that the GPU test compares against
// (moe_layer_ref.h) is checked here against central finite differences of its own forward in double (v3 and v2,
// shared experts on and off, a forced selection that leaves experts without tokens), and the layer's configuration
// checks, which run before anything is registered or allocated (so they need no device).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tests/common/moe_layer_ref.h"
#include "tests/common/nn_ref_test_util.h"
#include "tests/common/trainer_test_util.h"
#include "trainer/config.h"
#include "trainer/memory/device_memory.h"
#include "trainer/model/moe.h"
#include "trainer/model/moe_experts.h"
#include "trainer/model/params.h"

namespace fp4moe {
namespace {

using test::MoeRefForward;
using test::MoeRefParams;
using test::MoeRefShape;
using test::Vec;

MoeRefParams random_params(const MoeRefShape& s, uint32_t seed) {
  MoeRefParams p;
  p.wr = test::normal_values(s.E * s.d, seed + 1, 0.0, 0.5);
  p.bias = test::normal_values(s.E, seed + 2, 0.0, 0.1);
  p.w1 = test::normal_values(s.E * 2 * s.f * s.d, seed + 3, 0.0, 0.5);
  p.w2 = test::normal_values(s.E * s.d * s.f, seed + 4, 0.0, 0.5);
  p.ws1 = test::normal_values(2 * s.shared_f * s.d, seed + 5, 0.0, 0.5);
  p.ws2 = test::normal_values(s.d * s.shared_f, seed + 6, 0.0, 0.5);
  return p;
}

// Loss = <y, g> + aux_grad * aux with the selection held fixed (`idx`), in double without BF16 rounding.
void check_gradients(const MoeRefShape& s, const std::vector<int32_t>* forced) {
  MoeRefParams p = random_params(s, 10);
  Vec x = test::normal_values(s.M * s.d, 20);
  const Vec g = test::normal_values(s.M * s.d, 30);
  const double aux_grad = 0.7;
  const MoeRefForward base = test::moe_ref_forward(s, p, x, forced, false);
  const std::vector<int32_t> idx = base.idx;  // held fixed: the loss is smooth for a given selection
  const auto loss = [&] {
    const MoeRefForward o = test::moe_ref_forward(s, p, x, &idx, false);
    return test::dot(o.y, g) + aux_grad * o.aux;
  };
  const test::MoeRefGrads an = test::moe_ref_backward(s, p, x, base, g, aux_grad, false);
  test::expect_gradient_matches(an.dx, test::finite_difference_gradient(x, loss), "dx", 1e-6);
  test::expect_gradient_matches(an.gwr, test::finite_difference_gradient(p.wr, loss), "router", 1e-6);
  test::expect_gradient_matches(an.gw1, test::finite_difference_gradient(p.w1, loss), "experts.fc1", 1e-6);
  test::expect_gradient_matches(an.gw2, test::finite_difference_gradient(p.w2, loss), "experts.fc2", 1e-6);
  if (s.shared_f > 0) {
    test::expect_gradient_matches(an.gws1, test::finite_difference_gradient(p.ws1, loss), "shared.fc1", 1e-6);
    test::expect_gradient_matches(an.gws2, test::finite_difference_gradient(p.ws2, loss), "shared.fc2", 1e-6);
  }
}

MoeRefShape small_shape(RouterStyle style, int64_t shared_f) {
  const RouterConfig rc{style, 2, style == RouterStyle::v3_sigmoid ? 2.5f : 1.5f,
                        style == RouterStyle::v2_softmax ? 0.05f : 0.0f};
  return MoeRefShape{5, 8, 4, 2, 4, shared_f, rc};
}

TEST(MoeReference, V3GradientsMatchFiniteDifferences) { check_gradients(small_shape(RouterStyle::v3_sigmoid, 4), nullptr); }
TEST(MoeReference, V2GradientsMatchFiniteDifferences) { check_gradients(small_shape(RouterStyle::v2_softmax, 4), nullptr); }
TEST(MoeReference, NoSharedExperts) { check_gradients(small_shape(RouterStyle::v3_sigmoid, 0), nullptr); }

TEST(MoeReference, ForcedSelectionWithEmptyExperts) {
  for (RouterStyle style : {RouterStyle::v3_sigmoid, RouterStyle::v2_softmax}) {
    const MoeRefShape s = small_shape(style, 4);
    const std::vector<int32_t> forced = {2, 1, 1, 2, 2, 1, 1, 2, 2, 1};  // experts 0 and 3 get no token
    check_gradients(s, &forced);
    const MoeRefParams p = random_params(s, 10);
    const MoeRefForward o = test::moe_ref_forward(s, p, test::normal_values(s.M * s.d, 20), &forced, false);
    EXPECT_EQ(o.counts, (std::vector<int32_t>{0, 5, 5, 0}));
    EXPECT_EQ(o.idx, forced);
    const test::MoeRefGrads gr = test::moe_ref_backward(s, p, test::normal_values(s.M * s.d, 20), o,
                                                        test::normal_values(s.M * s.d, 30), 1.0, false);
    for (int64_t i = 0; i < 2 * s.f * s.d; ++i) EXPECT_EQ(gr.gw1[i], 0.0) << "expert 0 has no token";
  }
}

// With BF16 storage the reference differs from the double one by BF16 rounding only (the size of the tolerance the
// GPU test uses for the same comparison).
TEST(MoeReference, RoundedStorageStaysWithinBf16Tolerance) {
  MoeRefShape s = small_shape(RouterStyle::v3_sigmoid, 4);
  s.M = 64;
  s.d = 32;
  s.f = 16;
  s.shared_f = 16;
  const MoeRefParams p = random_params(s, 3);
  const Vec x = test::to_f64(test::to_bf16(test::normal_values(s.M * s.d, 4)));
  const Vec dy = test::to_f64(test::to_bf16(test::normal_values(s.M * s.d, 5)));
  const MoeRefForward exact = test::moe_ref_forward(s, p, x, nullptr, false);
  const MoeRefForward rounded = test::moe_ref_forward(s, p, x, &exact.idx, true);
  EXPECT_LT(test::relative_l2(rounded.y, exact.y), 1e-2);
  const auto ge = test::moe_ref_backward(s, p, x, exact, dy, 1.0, false);
  const auto gr = test::moe_ref_backward(s, p, x, rounded, dy, 1.0, true);
  EXPECT_LT(test::relative_l2(gr.dx, ge.dx), 1e-2);
  EXPECT_LT(test::relative_l2(gr.gw1, ge.gw1), 1e-2);
  EXPECT_LT(test::relative_l2(gr.gwr, ge.gwr), 2e-2);
}

// ---- configuration checks (no device needed: they run before any registration or allocation) ----------------

TrainerConfig tiny() { return parse_config_args({"--config", test::preset("tiny")}); }

TEST(MoeLayerConfig, PresetsPass) {
  check_moe_layer_config(tiny(), 256, "layers.1.moe");
  for (const char* name : {"small", "v3", "v2"}) {
    SCOPED_TRACE(name);
    const TrainerConfig cfg = parse_config_args({"--config", test::preset(name)});
    check_moe_layer_config(cfg, cfg.train.micro_batch * cfg.train.seq_len, "layers.1.moe");
  }
}

TEST(MoeLayerConfig, RejectsWhatTheLayerCannotRun) {
  using test::expect_error_with;
  auto with = [](auto edit) {
    TrainerConfig c = tiny();
    edit(c);
    return c;
  };
  const std::string p = "layers.1.moe";
  expect_error_with([&] { check_moe_layer_config(with([](TrainerConfig& c) { c.model.hidden = 72; }), 8, p); },
                    {"layers.1.moe", "model.hidden", "multiple of 16"});
  expect_error_with([&] {
    check_moe_layer_config(with([](TrainerConfig& c) {
                             c.moe.expert_ffn = 48;
                             c.recipe.routed_experts = Recipe::mxfp4;
                           }), 8, p);
  }, {"moe.expert_ffn", "multiple of 32"});
  expect_error_with([&] { check_moe_layer_config(with([](TrainerConfig& c) { c.moe.top_k = 9; }), 8, p); },
                    {"moe.top_k"});
  expect_error_with([&] { check_moe_layer_config(with([](TrainerConfig& c) { c.moe.routed_experts = 0; }), 8, p); },
                    {"moe.routed_experts"});
  expect_error_with([&] { check_moe_layer_config(with([](TrainerConfig& c) { c.moe.shared_experts = -1; }), 8, p); },
                    {"moe.shared_experts"});
  expect_error_with([&] { check_moe_layer_config(with([](TrainerConfig& c) { c.moe.routed_scale = 0; }), 8, p); },
                    {"moe.routed_scale"});
  expect_error_with([&] { check_moe_layer_config(with([](TrainerConfig& c) { c.moe.aux_alpha = -1; }), 8, p); },
                    {"moe.aux_alpha"});
  expect_error_with(
      [&] { check_moe_layer_config(with([](TrainerConfig& c) { c.moe.bias_update_rate = -1; }), 8, p); },
      {"moe.bias_update_rate"});
  expect_error_with([&] { check_moe_layer_config(with([](TrainerConfig& c) { c.model.layers = 0; }), 8, p); },
                    {"model.layers"});
  expect_error_with([&] { check_moe_layer_config(tiny(), -1, p); }, {"max_tokens"});
  expect_error_with([&] { check_moe_layer_config(tiny(), int64_t{1} << 30, p); }, {"max_tokens", "int32"});
}

TEST(MoeLayerConfig, ConstructorChecksBeforeRegisteringAnything) {
  ParamStore store;
  DeviceMemory mem;
  TrainerConfig c = tiny();
  c.moe.top_k = 9;
  test::expect_error_with([&] { MoeLayer layer(store, "layers.1.moe", c, 256, mem); }, {"moe.top_k"});
  EXPECT_TRUE(store.params().empty());
  EXPECT_EQ(mem.current_total(), 0u);
}

TEST(MoeLayerConfig, InitStd) {
  TrainerConfig c = tiny();
  c.model.layers = 8;
  EXPECT_FLOAT_EQ(moe_fc2_init_std(c), 0.005f);  // 0.02 / sqrt(16)
  c.model.layers = 0;
  test::expect_error_with([&] { moe_fc2_init_std(c); }, {"model.layers"});
}

TEST(MoeLayerConfig, RejectsARoutedRecipeThatIsNotBuiltBeforeRegisteringAnything) {
  ParamStore store;
  DeviceMemory mem;
  TrainerConfig c = tiny();
  c.recipe.routed_experts = Recipe::fp8;
  c.recipe.routed_experts.wgrad = GemmPrecision::bf16;  // bf16 mixed with fp8 classes: not built
  test::expect_error_with([&] { MoeLayer layer(store, "layers.1.moe", c, 256, mem); },
                          {"layers.1.moe", "recipe.routed_experts", "wgrad=bf16", "not built", "bf16 GEMM classes mixed"});
  EXPECT_TRUE(store.params().empty());
  EXPECT_EQ(mem.current_total(), 0u);
}

}  // namespace
}  // namespace fp4moe
