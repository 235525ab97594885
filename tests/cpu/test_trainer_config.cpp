// Trainer configuration (trainer/config.h): the presets in configs/ load and validate, the command line wins over
// the file, and every bad configuration is rejected with a message naming the option (and the file or folder).
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/cpu/trainer_test_util.h"
#include "trainer/config.h"
#include "trainer/data/token_shard.h"

namespace fp4moe {
namespace {

using test::expect_error_with;
using test::preset;

TrainerConfig tiny_with(std::vector<std::string> extra) {
  std::vector<std::string> args = {"--config", preset("tiny")};
  args.insert(args.end(), extra.begin(), extra.end());
  return parse_config_args(args);
}

TEST(TrainerConfig, EveryPresetLoadsAndValidates) {
  for (const char* name : {"tiny", "small", "v3", "v2"}) {
    SCOPED_TRACE(name);
    const TrainerConfig cfg = parse_config_args({"--config", preset(name)});
    EXPECT_EQ(cfg.model.name, name);
    EXPECT_EQ(cfg.model.vocab_size, 32768);  // the tokenizer of `make data`
    EXPECT_GE(cfg.model.layers, 2);
    EXPECT_LT(cfg.model.n_dense_layers, cfg.model.layers);  // every preset has MoE layers
    EXPECT_EQ(cfg.train.data_dir, "data/cache/shards");
  }
}

TEST(TrainerConfig, V3AndV2PresetsKeepTheDeepSeekPerLayerDimensions) {
  const TrainerConfig v3 = parse_config_args({"--config", preset("v3")});
  EXPECT_EQ(v3.model.hidden, 7168);
  EXPECT_EQ(v3.model.heads, 128);
  EXPECT_EQ(v3.model.q_lora_rank, 1536);
  EXPECT_EQ(v3.model.kv_lora_rank, 512);
  EXPECT_EQ(v3.model.qk_nope_head_dim, 128);
  EXPECT_EQ(v3.model.qk_rope_head_dim, 64);
  EXPECT_EQ(v3.model.v_head_dim, 128);
  EXPECT_EQ(v3.model.dense_ffn, 18432);
  EXPECT_EQ(v3.moe.expert_ffn, 2048);
  EXPECT_EQ(v3.moe.top_k, 8);
  EXPECT_EQ(v3.moe.shared_experts, 1);
  EXPECT_EQ(v3.moe.router, RouterStyle::v3_sigmoid);
  EXPECT_EQ(v3.recipe.routed_experts, Recipe::mxfp4);
  EXPECT_EQ(v3.recompute.modules, std::vector<std::string>{"mla_up_proj"});

  const TrainerConfig v2 = parse_config_args({"--config", preset("v2")});
  EXPECT_EQ(v2.model.hidden, 5120);
  EXPECT_EQ(v2.model.heads, 128);
  EXPECT_EQ(v2.model.q_lora_rank, 1536);
  EXPECT_EQ(v2.model.kv_lora_rank, 512);
  EXPECT_EQ(v2.model.dense_ffn, 12288);
  EXPECT_EQ(v2.moe.expert_ffn, 1536);
  EXPECT_EQ(v2.moe.top_k, 6);
  EXPECT_EQ(v2.moe.shared_experts, 2);
  EXPECT_EQ(v2.moe.router, RouterStyle::v2_softmax);
  EXPECT_DOUBLE_EQ(v2.moe.aux_alpha, 0.003);
}

TEST(TrainerConfig, CommandLineWinsOverTheFileAndTheRestComesFromTheFile) {
  const TrainerConfig file = parse_config_args({"--config", preset("small")});
  const TrainerConfig cli = parse_config_args(
      {"--config", preset("small"), "--train.lr", "3e-4", "--recipe.routed_experts", "mxfp4", "--model.layers", "6"});
  EXPECT_DOUBLE_EQ(cli.train.lr, 3e-4);
  EXPECT_NE(file.train.lr, 3e-4);
  EXPECT_EQ(cli.recipe.routed_experts, Recipe::mxfp4);
  EXPECT_EQ(cli.model.layers, 6);
  EXPECT_EQ(cli.model.hidden, file.model.hidden);
  EXPECT_EQ(cli.moe.routed_experts, file.moe.routed_experts);
  EXPECT_EQ(cli.train.steps, file.train.steps);
}

TEST(TrainerConfig, TomlSubsetCommentsArraysAndEmptyRecompute) {
  // tiny.toml with a commented lr and a recompute list over two lines.
  std::ifstream in(preset("tiny"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto replace_line = [&](const std::string& prefix, const std::string& by) {
    const size_t at = text.find("\n" + prefix);
    ASSERT_NE(at, std::string::npos) << prefix;
    text.replace(at + 1, text.find('\n', at + 1) - at - 1, by);
  };
  replace_line("lr = ", "lr = 2.5e-3   # trailing comment");
  replace_line("modules = ", "modules = [\"core_attn\",\n           \"moe_act\"]");
  test::TrainerTempDir dir;
  const TrainerConfig cfg = parse_config_args({"--config", dir.write("c.toml", text)});
  EXPECT_DOUBLE_EQ(cfg.train.lr, 2.5e-3);
  EXPECT_EQ(cfg.recompute.modules, (std::vector<std::string>{"core_attn", "moe_act"}));
  EXPECT_TRUE(cfg.recompute.has("moe_act"));
  EXPECT_FALSE(cfg.recompute.has("moe"));

  const TrainerConfig none = tiny_with({"--recompute.modules", "none"});
  EXPECT_TRUE(none.recompute.modules.empty());
  EXPECT_TRUE(parse_config_args({"--config", preset("tiny")}).recompute.modules.empty());  // modules = []

  const TrainerConfig full = tiny_with({"--recompute.modules", "full"});
  EXPECT_TRUE(full.recompute.has("core_attn"));
}

TEST(TrainerConfig, RejectsFileProblemsNamingFileAndKey) {
  test::TrainerTempDir dir;
  const std::string unknown = dir.write("unknown.toml", "[model]\nhiden = 64\n");
  expect_error_with([&] { parse_config_args({"--config", unknown}); }, {unknown, "unknown option 'model.hiden'"});
  const std::string top = dir.write("top.toml", "lr = 1e-3\n");
  expect_error_with([&] { parse_config_args({"--config", top}); }, {top, "unknown option 'lr'"});
  const std::string bad_value = dir.write("bad.toml", "[model]\nhidden = \"abc\"\n");
  expect_error_with([&] { parse_config_args({"--config", bad_value}); }, {bad_value, "model.hidden", "abc"});
  const std::string twice = dir.write("twice.toml", "[model]\nhidden = 64\nhidden = 128\n");
  expect_error_with([&] { parse_config_args({"--config", twice}); }, {twice, "model.hidden"});
  const std::string missing = dir.file("missing.toml");
  expect_error_with([&] { parse_config_args({"--config", missing}); }, {missing, "does not exist"});
  expect_error_with([&] { parse_config_args({"--config", preset("tiny"), "--model.hidden", "x"}); },
                    {"command line", "--model.hidden"});
  expect_error_with([&] { parse_config_args({"--config", preset("tiny"), "--no.such"}); }, {"command line"});
}

TEST(TrainerConfig, RejectsShapesThatCannotRun) {
  expect_error_with([] { tiny_with({"--model.heads", "5"}); }, {"model.heads = 5 does not divide model.hidden = 64"});
  expect_error_with([] { tiny_with({"--moe.top_k", "9"}); }, {"moe.top_k = 9 exceeds moe.routed_experts = 8"});
  expect_error_with([] { tiny_with({"--model.n_dense_layers", "3"}); },
                    {"model.n_dense_layers = 3", "model.layers = 2"});
  expect_error_with([] { tiny_with({"--moe.routed_experts", "2000"}); }, {"moe.routed_experts = 2000", "1024"});
  expect_error_with([] { tiny_with({"--model.vocab_size", "1"}); }, {"model.vocab_size must be >= 2"});
  expect_error_with([] { tiny_with({"--model.hidden", "0"}); }, {"model.hidden must be >= 1"});
  expect_error_with([] { tiny_with({"--model.qk_rope_head_dim", "15"}); }, {"qk_rope_head_dim = 15 must be even"});
  expect_error_with([] { tiny_with({"--moe.expert_ffn", "40"}); }, {"moe.expert_ffn = 40", "multiple of 16"});
  expect_error_with([] { tiny_with({"--moe.expert_ffn", "48", "--recipe.routed_experts", "mxfp4"}); },
                    {"moe.expert_ffn = 48", "multiple of 32", "mxfp4"});
  EXPECT_NO_THROW(tiny_with({"--moe.expert_ffn", "48"}));  // 48 is fine for bf16
  // An all-dense model does not need MoE settings.
  EXPECT_NO_THROW(tiny_with({"--model.n_dense_layers", "2", "--moe.routed_experts", "0", "--moe.top_k", "0"}));
}

TEST(TrainerConfig, RejectsScheduleRecipeRouterAndRecomputeMistakes) {
  expect_error_with([] { tiny_with({"--train.warmup_steps", "30"}); }, {"train.warmup_steps = 30", "train.steps = 20"});
  expect_error_with([] { tiny_with({"--train.min_lr", "1"}); }, {"train.min_lr"});
  expect_error_with([] { tiny_with({"--train.beta2", "1"}); }, {"train.beta2 must be in [0, 1)"});
  expect_error_with([] { tiny_with({"--train.eps", "0"}); }, {"train.eps must be > 0"});
  expect_error_with([] { tiny_with({"--train.grad_clip", "-1"}); }, {"train.grad_clip must be >= 0"});
  expect_error_with([] { tiny_with({"--train.seq_len", "0"}); }, {"train.seq_len must be >= 1"});
  expect_error_with([] { tiny_with({"--train.checkpoint_interval", "5"}); }, {"needs train.checkpoint_dir"});
  expect_error_with([] { tiny_with({"--train.eval_steps", "0"}); }, {"train.eval_steps must be >= 1"});
  expect_error_with([] { tiny_with({"--train.non_finite", "ignore"}); }, {"train.non_finite = 'ignore'", "skip or stop"});
  expect_error_with([] { tiny_with({"--train.data_dir", ""}); }, {"train.data_dir is empty"});
  expect_error_with([] { tiny_with({"--recipe.attention", "fp4"}); },
                    {"recipe.attention = 'fp4'", "bf16, fp8 or mxfp4"});
  expect_error_with([] { tiny_with({"--moe.router", "v4"}); }, {"moe.router = 'v4'"});
  expect_error_with([] { tiny_with({"--recompute.modules", "attention"}); },
                    {"unknown module 'attention'", "mla_up_proj"});
  expect_error_with([] { tiny_with({"--recompute.modules", "moe", "moe"}); }, {"'moe' is listed twice"});
  expect_error_with([] { tiny_with({"--recompute.modules", "full", "moe_act"}); }, {"'full'", "cannot be combined"});
}

TEST(TrainerConfig, DataChecksFolderShardsAndVocabulary) {
  test::TrainerTempDir dir;
  const std::string missing = dir.file("nothing_here");
  expect_error_with([&] { validate_data(tiny_with({"--train.data_dir", missing})); }, {missing, "not a folder"});
  expect_error_with([&] { validate_data(tiny_with({"--model.vocab_size", "129280"})); },
                    {"model.vocab_size = 129280 exceeds 65536"});
  const std::string empty = dir.path().string();
  expect_error_with([&] { validate_data(tiny_with({"--train.data_dir", empty})); }, {empty, "train"});

  const std::vector<uint16_t> tokens = {5, 7, 2, 9, 11, 2, 3, 4, 2};
  write_token_shard(dir.file("train_000.bin"), tokens, 1000, 2);
  write_token_shard(dir.file("val_000.bin"), tokens, 1000, 2);
  expect_error_with([&] { validate_data(tiny_with({"--train.data_dir", empty})); },
                    {dir.file("train_000.bin"), "1000", "32768"});
  EXPECT_NO_THROW(validate_data(tiny_with({"--train.data_dir", empty, "--model.vocab_size", "1000"})));
  // Evaluation needs val shards.
  std::filesystem::remove(dir.file("val_000.bin"));
  expect_error_with([&] { validate_data(tiny_with({"--train.data_dir", empty, "--model.vocab_size", "1000"})); },
                    {"val"});
  EXPECT_NO_THROW(validate_data(
      tiny_with({"--train.data_dir", empty, "--model.vocab_size", "1000", "--train.eval_interval", "0"})));
}

TEST(TrainerConfig, ModelHashFollowsShapeAndRecipeNotSchedule) {
  const TrainerConfig base = parse_config_args({"--config", preset("small")});
  const uint64_t h = model_config_hash(base);
  EXPECT_EQ(h, model_config_hash(parse_config_args({"--config", preset("small")})));
  EXPECT_EQ(h, model_config_hash(parse_config_args({"--config", preset("small"), "--train.lr", "1e-4",
                                                    "--train.steps", "5000"})));
  EXPECT_NE(h, model_config_hash(parse_config_args({"--config", preset("small"), "--model.hidden", "960"})));
  EXPECT_NE(h, model_config_hash(parse_config_args({"--config", preset("small"), "--moe.top_k", "2"})));
  EXPECT_NE(h, model_config_hash(
                   parse_config_args({"--config", preset("small"), "--recipe.routed_experts", "fp8"})));
  EXPECT_NE(model_config_text(base).find("model.hidden = 768\n"), std::string::npos);
}

}  // namespace
}  // namespace fp4moe
