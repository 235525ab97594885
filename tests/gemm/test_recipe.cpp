// The one recipe type (trainer/model/recipe.h): the presets' fields, their names (the text of the configuration
// and of the model-config hash, which checkpoints carry), and the rejection of combinations not built yet, by the
// recipe functions and by the layer constructors. No device needed.
#include <gtest/gtest.h>

#include <string>

#include "kernels/common/check.h"
#include "kernels/quant/mx_transform.h"
#include "tests/common/trainer_test_util.h"
#include "trainer/config.h"
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
  expect_error_with([] { parse_recipe("fp4", "recipe.routed_experts"); },
                    {"recipe.routed_experts", "'fp4'", "bf16, fp8 or mxfp4"});
  expect_error_with([] { parse_recipe("MXFP4", "recipe.dense_mlp"); }, {"recipe.dense_mlp"});
}

TEST(Recipe, OtherCombinationsAreNamedByTheirFieldsAndRejected) {
  Recipe r = Recipe::mxfp4;
  r.fprop = GemmPrecision::mxfp4;
  r.mx = {Rounding::stochastic, MxTransform::h16};
  EXPECT_FALSE(is_preset_recipe(r));
  EXPECT_EQ(recipe_name(r), "fprop=mxfp4 dgrad=fp8 wgrad=fp8 input=mxfp4 rounding=sr transform=h16");
  expect_error_with([&] { require_preset_recipe(r, "Linear layers.0.attn.q_down"); },
                    {"Linear layers.0.attn.q_down", "fprop=mxfp4", "transform=h16",
                     "only the presets bf16, fp8 and mxfp4 run today"});
  for (const Recipe& p : {Recipe::bf16, Recipe::fp8, Recipe::mxfp4}) EXPECT_NO_THROW(require_preset_recipe(p, "x"));
  // Any one field away from a preset is another combination.
  Recipe wgrad = Recipe::fp8;
  wgrad.wgrad = GemmPrecision::bf16;
  Recipe stored = Recipe::fp8;
  stored.mxfp4_input = true;  // fp8 with MXFP4 storage is mxfp4 only with mxfp4's quantizer options
  stored.mx.transform = MxTransform::rht;
  Recipe bf16_sr = Recipe::bf16;
  bf16_sr.mx.rounding = Rounding::stochastic;
  for (const Recipe& other : {wgrad, stored, bf16_sr}) {
    EXPECT_FALSE(is_preset_recipe(other)) << recipe_name(other);
    EXPECT_THROW(require_preset_recipe(other, "x"), Error) << recipe_name(other);
  }
}

TEST(Recipe, LayerConstructorsRejectCombinationsNotBuiltBeforeRegistering) {
  ParamStore store;
  Recipe r = Recipe::fp8;
  r.dgrad = GemmPrecision::bf16;
  expect_error_with([&] { Linear(store, "layers.0.mlp.fc1", 64, 128, r, 0.02f); },
                    {"Linear layers.0.mlp.fc1", "dgrad=bf16", "only the presets"});
  EXPECT_TRUE(store.params().empty());
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
