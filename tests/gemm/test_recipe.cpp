// The one recipe type (trainer/model/recipe.h): the presets' fields, their names (the text of the configuration
// and of the model-config hash, which checkpoints carry), paper 2's per-class overrides, and the rejection of
// combinations not built, by the recipe functions and by the layer constructors. No device needed.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/quant/mx_transform.h"
#include "tests/common/trainer_test_util.h"
#include "trainer/config.h"
#include "trainer/model/group_linear.h"
#include "trainer/model/linear.h"
#include "trainer/model/params.h"
#include "trainer/model/recipe.h"

namespace fp4moe {
namespace {

using test::expect_error_with;

void expect_gemms(const Recipe& r, GemmPrecision p) {
  EXPECT_EQ(r.fprop, p);
  EXPECT_EQ(r.dgrad, p);
  EXPECT_EQ(r.wgrad, p);
}

TEST(Recipe, PresetsHoldTheirPrecisionsPerGemmClass) {
  expect_gemms(Recipe::bf16, GemmPrecision::bf16);
  EXPECT_FALSE(Recipe::bf16.mxfp4_input);
  expect_gemms(Recipe::fp8, GemmPrecision::fp8);
  EXPECT_FALSE(Recipe::fp8.mxfp4_input);
  // Paper 1: MXFP4 storage of the input, FP8 GEMMs in forward and backward, the OCP quantizer with RNE.
  expect_gemms(Recipe::mxfp4, GemmPrecision::fp8);
  EXPECT_TRUE(Recipe::mxfp4.mxfp4_input);
  EXPECT_EQ(Recipe::mxfp4.mx.rounding, Rounding::rne);
  EXPECT_EQ(Recipe::mxfp4.mx.transform, MxTransform::none);
  EXPECT_NE(Recipe::bf16, Recipe::fp8);
  EXPECT_NE(Recipe::fp8, Recipe::mxfp4);
  EXPECT_EQ(Recipe{}, Recipe::bf16);
}

TEST(Recipe, PresetNamesRoundTrip) {
  for (const char* name : {"bf16", "fp8", "mxfp4"}) {
    const Recipe r = parse_recipe(name, "recipe.attention");
    EXPECT_TRUE(is_preset_recipe(r)) << name;
    EXPECT_EQ(recipe_name(r), name);
  }
  for (const Recipe& r : {Recipe::bf16, Recipe::fp8, Recipe::mxfp4}) EXPECT_EQ(parse_recipe(recipe_name(r), "x"), r);
  // Exact field values of each preset as parsed (what today's configurations train with).
  const Recipe fp8 = parse_recipe("fp8", "x");
  EXPECT_TRUE(fp8.fprop == GemmPrecision::fp8 && fp8.dgrad == GemmPrecision::fp8 && fp8.wgrad == GemmPrecision::fp8 &&
              !fp8.mxfp4_input && fp8.mx.rounding == Rounding::rne && fp8.mx.transform == MxTransform::none);
  const Recipe mx = parse_recipe("mxfp4", "x");
  EXPECT_TRUE(mx.fprop == GemmPrecision::fp8 && mx.dgrad == GemmPrecision::fp8 && mx.wgrad == GemmPrecision::fp8 &&
              mx.mxfp4_input && mx.mx.rounding == Rounding::rne && mx.mx.transform == MxTransform::none);
  expect_error_with([] { parse_recipe("fp4", "recipe.routed_experts"); },
                    {"recipe.routed_experts", "'fp4'", "bf16, fp8 or mxfp4"});
  expect_error_with([] { parse_recipe("MXFP4", "recipe.dense_mlp"); }, {"recipe.dense_mlp"});
  expect_error_with([] { parse_recipe("", "recipe.dense_mlp"); }, {"recipe.dense_mlp", "empty recipe"});
}

// Paper 2's ladder: a preset, then per-class overrides; the fields' form round-trips through recipe_name.
TEST(Recipe, LadderOverridesParseAndRoundTrip) {
  const Recipe fprop = parse_recipe("fp8 fprop=mxfp4", "recipe.attention");
  EXPECT_EQ(fprop.fprop, GemmPrecision::mxfp4);
  EXPECT_EQ(fprop.dgrad, GemmPrecision::fp8);
  EXPECT_EQ(fprop.wgrad, GemmPrecision::fp8);
  EXPECT_FALSE(fprop.mxfp4_input);
  EXPECT_FALSE(is_preset_recipe(fprop));
  EXPECT_EQ(recipe_name(fprop), "fprop=mxfp4 dgrad=fp8 wgrad=fp8 input=bf16 rounding=rne transform=none");
  const Recipe all = parse_recipe("fp8  fprop=mxfp4 dgrad=mxfp4 wgrad=mxfp4 rounding=sr transform=h16", "x");
  EXPECT_EQ(all.fprop, GemmPrecision::mxfp4);
  EXPECT_EQ(all.dgrad, GemmPrecision::mxfp4);
  EXPECT_EQ(all.wgrad, GemmPrecision::mxfp4);
  EXPECT_EQ(all.mx.rounding, Rounding::stochastic);
  EXPECT_EQ(all.mx.transform, MxTransform::h16);
  for (const Recipe& r : {fprop, all}) EXPECT_EQ(parse_recipe(recipe_name(r), "x"), r) << recipe_name(r);
  // An override back to the preset's own value is the preset.
  EXPECT_EQ(parse_recipe("fp8 wgrad=fp8", "x"), Recipe::fp8);
  EXPECT_EQ(recipe_name(parse_recipe("fp8 wgrad=fp8", "x")), "fp8");
  for (const char* t : {"none", "h16", "h32", "rht"})
    EXPECT_EQ(recipe_name(parse_recipe(std::string("fp8 wgrad=mxfp4 transform=") + t, "x")),
              std::string("fprop=fp8 dgrad=fp8 wgrad=mxfp4 input=bf16 rounding=rne transform=") + t);
}

TEST(Recipe, BadOverridesGetOneLineErrors) {
  const auto one_line = [](const char* text, std::initializer_list<const char*> parts) {
    try {
      parse_recipe(text, "recipe.dense_mlp");
      ADD_FAILURE() << text << " was accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      for (const char* p : parts) EXPECT_NE(msg.find(p), std::string::npos) << msg << " lacks " << p;
    }
  };
  one_line("fp8 fprop=fp4", {"recipe.dense_mlp", "fprop=fp4", "bf16, fp8 or mxfp4"});
  one_line("fp8 rounding=stochastic", {"rounding=stochastic", "rne or sr"});
  one_line("fp8 transform=h64", {"transform=h64", "none, h16, h32 or rht"});
  one_line("fp8 input=fp8", {"input=fp8", "bf16 or mxfp4"});
  one_line("fp8 fwd=mxfp4", {"unknown key 'fwd'", "fprop, dgrad, wgrad, input, rounding or transform"});
  one_line("fp8 fprop", {"'fprop' is not key=value"});
  one_line("fp8 fprop=mxfp4 fprop=fp8", {"fprop is given twice"});
  one_line("fp8 mxfp4", {"'mxfp4' is not key=value"});
  // Combinations that are not built, each named.
  one_line("bf16 fprop=fp8", {"not built", "bf16 GEMM classes mixed"});
  one_line("fp8 wgrad=bf16", {"not built", "bf16 GEMM classes mixed"});
  one_line("mxfp4 fprop=mxfp4", {"not built", "MXFP4 input storage"});
  one_line("mxfp4 rounding=sr", {"not built", "MXFP4 input storage"});
  one_line("fp8 transform=h16", {"no GEMM class is mxfp4"});
  one_line("bf16 rounding=sr", {"no GEMM class is mxfp4"});
}

TEST(Recipe, BuiltCombinationsPerLayerKind) {
  const GemmPrecision f = GemmPrecision::fp8, x = GemmPrecision::mxfp4;
  for (GemmPrecision fp : {f, x})
    for (GemmPrecision dg : {f, x})
      for (GemmPrecision wg : {f, x}) {
        Recipe r = Recipe::fp8;
        r.fprop = fp;
        r.dgrad = dg;
        r.wgrad = wg;
        EXPECT_NO_THROW(check_recipe_built(r, "Linear")) << recipe_name(r);
        EXPECT_NO_THROW(GroupLinear::check_shape(8, 64, 64, r)) << recipe_name(r);  // routed experts: every one
      }
  for (const Recipe& p : {Recipe::bf16, Recipe::fp8, Recipe::mxfp4}) EXPECT_NO_THROW(check_recipe_built(p, "x"));
  EXPECT_TRUE(quantizes_bf16_input(Recipe::fp8));
  EXPECT_FALSE(quantizes_bf16_input(Recipe::mxfp4));
  EXPECT_FALSE(quantizes_bf16_input(Recipe::bf16));
  EXPECT_TRUE(needs_mx_blocks_along_k(Recipe::mxfp4));
  EXPECT_FALSE(needs_mx_blocks_along_k(Recipe::fp8));
  EXPECT_TRUE(needs_mx_blocks_along_n(parse_recipe("fp8 dgrad=mxfp4", "x")));
  EXPECT_FALSE(needs_mx_blocks_along_n(parse_recipe("fp8 fprop=mxfp4 wgrad=mxfp4", "x")));
}

TEST(Recipe, LayerConstructorsRejectCombinationsNotBuiltBeforeRegistering) {
  ParamStore store;
  Recipe r = Recipe::fp8;
  r.dgrad = GemmPrecision::bf16;
  expect_error_with([&] { Linear(store, "layers.0.mlp.fc1", 64, 128, r, 0.02f); },
                    {"Linear layers.0.mlp.fc1", "dgrad=bf16", "not built"});
  // An MXFP4 Dgrad blocks along out_features (N).
  const Recipe dgrad = parse_recipe("fp8 dgrad=mxfp4", "x");
  expect_error_with([&] { Linear(store, "layers.0.mlp.fc2", 64, 48, dgrad, 0.02f); },
                    {"Linear layers.0.mlp.fc2", "out_features", "out=48"});
  EXPECT_TRUE(store.params().empty());
  // Built: registers the weight.
  Linear ok(store, "layers.0.mlp.fc3", 64, 64, parse_recipe("fp8 fprop=mxfp4 dgrad=mxfp4 wgrad=mxfp4", "x"), 0.02f);
  EXPECT_EQ(store.params().size(), 1u);
}

// The layer seed of the MXFP4 quantizers: different per layer and per step, fixed for a name and step.
TEST(Recipe, LayerQuantSeedDependsOnStepAndLayer) {
  EXPECT_EQ(layer_quant_seed(7, "layers.0.attn.q_down"), layer_quant_seed(7, "layers.0.attn.q_down"));
  EXPECT_NE(layer_quant_seed(7, "layers.0.attn.q_down"), layer_quant_seed(8, "layers.0.attn.q_down"));
  EXPECT_NE(layer_quant_seed(7, "layers.0.attn.q_down"), layer_quant_seed(7, "layers.0.attn.q_up"));
}

// A fixed model configuration (the shape of configs/tiny.toml) with the given recipes.
TrainerConfig hashed_config(Recipe attention, Recipe dense, Recipe experts) {
  TrainerConfig c;
  ModelConfig& m = c.model;
  m.vocab_size = 32768;
  m.hidden = 64;
  m.layers = 2;
  m.n_dense_layers = 1;
  m.heads = 4;
  m.q_lora_rank = 32;
  m.kv_lora_rank = 32;
  m.qk_nope_head_dim = 16;
  m.qk_rope_head_dim = 16;
  m.v_head_dim = 16;
  m.dense_ffn = 128;
  m.rope_theta = 10000;
  m.norm_eps = 1e-6;
  c.moe.routed_experts = 8;
  c.moe.shared_experts = 1;
  c.moe.top_k = 2;
  c.moe.expert_ffn = 32;
  c.moe.router = RouterStyle::v3_sigmoid;
  c.moe.routed_scale = 1.0;
  c.recipe.attention = attention;
  c.recipe.dense_mlp = dense;
  c.recipe.shared_experts = experts;
  c.recipe.routed_experts = experts;
  return c;
}

// The model-config hash that checkpoints carry is unchanged for every preset: the values are what the hash gave
// when the recipe was an enum of these three names, so checkpoints written then still resume.
TEST(Recipe, ModelConfigTextOfThePresetsIsUnchanged) {
  const std::string text = model_config_text(hashed_config(Recipe::mxfp4, Recipe::bf16, Recipe::fp8));
  EXPECT_NE(text.find("recipe.attention = mxfp4\nrecipe.dense_mlp = bf16\nrecipe.shared_experts = fp8\n"
                      "recipe.routed_experts = fp8\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(model_config_hash(hashed_config(Recipe::bf16, Recipe::fp8, Recipe::bf16)), 0xcc33287ad768647cull);
  EXPECT_EQ(model_config_hash(hashed_config(Recipe::bf16, Recipe::fp8, Recipe::fp8)), 0xe01712c6518bf1ceull);
  EXPECT_EQ(model_config_hash(hashed_config(Recipe::bf16, Recipe::fp8, Recipe::mxfp4)), 0x44f2c1efc3c18006ull);
  EXPECT_EQ(model_config_hash(hashed_config(Recipe::mxfp4, Recipe::bf16, Recipe::fp8)), 0x3a2dbeb400e1bdfdull);
}

// The configuration takes the ladder per class, rejects what is not built for the class or the shape with one line
// naming the option, and keeps the presets' values.
TEST(Recipe, ConfigurationTakesLadderOverridesPerClass) {
  const auto tiny = [](std::vector<std::string> extra) {
    std::vector<std::string> args = {"--config", test::preset("tiny")};
    args.insert(args.end(), extra.begin(), extra.end());
    return parse_config_args(args);
  };
  const TrainerConfig presets = tiny({"--recipe.attention", "fp8", "--recipe.routed_experts", "mxfp4"});
  EXPECT_EQ(presets.recipe.attention, Recipe::fp8);
  EXPECT_EQ(presets.recipe.routed_experts, Recipe::mxfp4);
  EXPECT_EQ(presets.recipe.dense_mlp, Recipe::bf16);
  const TrainerConfig c = tiny({"--recipe.dense_mlp", "fp8 fprop=mxfp4 dgrad=mxfp4 wgrad=mxfp4 rounding=sr",
                                "--recipe.routed_experts", "fp8 wgrad=mxfp4 transform=h16"});
  EXPECT_EQ(c.recipe.dense_mlp.dgrad, GemmPrecision::mxfp4);
  EXPECT_EQ(c.recipe.dense_mlp.mx.rounding, Rounding::stochastic);
  EXPECT_EQ(c.recipe.routed_experts.wgrad, GemmPrecision::mxfp4);
  EXPECT_EQ(c.recipe.routed_experts.fprop, GemmPrecision::fp8);
  EXPECT_NE(model_config_text(c).find(
                "recipe.routed_experts = fprop=fp8 dgrad=fp8 wgrad=mxfp4 input=bf16 rounding=rne transform=h16\n"),
            std::string::npos)
      << model_config_text(c);
  EXPECT_EQ(tiny({"--recipe.routed_experts", "fp8 fprop=mxfp4 dgrad=mxfp4"}).recipe.routed_experts.dgrad,
            GemmPrecision::mxfp4);  // MXFP4 Fprop and Dgrad over ragged expert groups
  expect_error_with([&] { tiny({"--recipe.routed_experts", "fp8 wgrad=bf16"}); },
                    {"recipe.routed_experts", "not built", "bf16 GEMM classes mixed"});
  expect_error_with([&] { tiny({"--recipe.shared_experts", "fp8 transform=rht"}); },
                    {"recipe.shared_experts", "no GEMM class is mxfp4"});
  // tiny's kv_down has kv_lora_rank + qk_rope_head_dim = 48 outputs: no MX blocks of 32 for an MXFP4 Dgrad.
  expect_error_with([&] { tiny({"--recipe.attention", "fp8 dgrad=mxfp4"}); },
                    {"model.kv_lora_rank + qk_rope_head_dim", "48", "multiple of 32"});
  EXPECT_NO_THROW(tiny({"--recipe.attention", "fp8 fprop=mxfp4 wgrad=mxfp4"}));
}

// The recipe's transform is the quantizer's: its names, and the block each transform works on.
TEST(Recipe, TransformNamesAndBlocksAreTheQuantizers) {
  const MxTransform transforms[] = {MxTransform::none, MxTransform::h16, MxTransform::h32, MxTransform::rht};
  const char* names[] = {"none", "h16", "h32", "rht"};
  const int blocks[] = {1, 16, 32, 16};
  for (int i = 0; i < 4; ++i) {
    EXPECT_STREQ(mx_transform_name(transforms[i]), names[i]);
    EXPECT_EQ(hadamard_block_size(transforms[i]), blocks[i]);
  }
}

}  // namespace
}  // namespace fp4moe
