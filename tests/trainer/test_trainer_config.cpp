// Trainer configuration (trainer/config.h): the presets in configs/ load and validate, the command line wins over
// the file, and every bad configuration is rejected with a message naming the option (and the file or folder).
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/common/trainer_test_util.h"
#include "trainer/config.h"
#include "trainer/config_file.h"
#include "trainer/data/token_shard.h"
#include "trainer/flops.h"
#include "trainer/train/metrics.h"

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

// dense_small, the ladder's dense model: small's vocabulary, attention, depth, width and tokens per step, every layer
// a dense SwiGLU FFN as wide as the experts one token of small activates (about small's matmul FLOPs per token).
TEST(TrainerConfig, DenseSmallIsSmallWithEveryLayerDense) {
  const TrainerConfig dense = parse_config_args({"--config", preset("dense_small")});
  const TrainerConfig small = parse_config_args({"--config", preset("small")});
  EXPECT_EQ(dense.model.name, "dense_small");
  EXPECT_EQ(dense.model.n_dense_layers, dense.model.layers);  // no MoE layer
  const ParameterCounts p = count_parameters(dense);
  EXPECT_EQ(p.router + p.routed_experts + p.shared_experts, 0);
  EXPECT_EQ(p.dense_ffn, dense.model.layers * 3 * dense.model.hidden * dense.model.dense_ffn);
  const ModelConfig &d = dense.model, &s = small.model;
  for (auto [got, want] : {std::pair{d.vocab_size, s.vocab_size}, {d.hidden, s.hidden}, {d.layers, s.layers},
                           {d.heads, s.heads}, {d.q_lora_rank, s.q_lora_rank}, {d.kv_lora_rank, s.kv_lora_rank},
                           {d.qk_nope_head_dim, s.qk_nope_head_dim}, {d.qk_rope_head_dim, s.qk_rope_head_dim},
                           {d.v_head_dim, s.v_head_dim}})
    EXPECT_EQ(got, want);
  EXPECT_EQ(d.dense_ffn, (small.moe.top_k + small.moe.shared_experts) * small.moe.expert_ffn);
  const double small_matmul = static_cast<double>(count_parameters(small).activated_matmul);
  EXPECT_NEAR(static_cast<double>(p.activated_matmul) / small_matmul, 1.0, 0.02);
  const TrainingConfig &dt = dense.train, &st = small.train;  // the same run: tokens, schedule, evaluations
  EXPECT_EQ(dt.seq_len, 1024);
  EXPECT_EQ(dt.micro_batch, 8);
  for (auto [got, want] : {std::pair{dt.seq_len, st.seq_len}, {dt.micro_batch, st.micro_batch},
                           {dt.grad_accum, st.grad_accum}, {dt.steps, st.steps}, {dt.warmup_steps, st.warmup_steps},
                           {dt.eval_interval, st.eval_interval}, {dt.eval_steps, st.eval_steps}})
    EXPECT_EQ(got, want);
  EXPECT_EQ(dt.lr, st.lr);
  EXPECT_EQ(dt.min_lr, st.min_lr);
  EXPECT_EQ(dt.seed, st.seed);
  EXPECT_EQ(dt.data_dir, st.data_dir);
  EXPECT_EQ(dt.checkpoint_dir, "runs/dense_small/checkpoints");
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

// The text of configs/tiny.toml with each line that starts with a given prefix replaced.
std::string tiny_text_with(std::initializer_list<std::pair<std::string, std::string>> lines) {
  std::ifstream in(preset("tiny"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const auto& [prefix, by] : lines) {
    const size_t at = text.find("\n" + prefix);
    EXPECT_NE(at, std::string::npos) << prefix;
    if (at != std::string::npos) text.replace(at + 1, text.find('\n', at + 1) - at - 1, by);
  }
  return text;
}

TEST(TrainerConfigToml, CommentsAfterValuesAndHashesInsideStrings) {
  test::TempDir dir;
  const std::string path = dir.write("c.toml", tiny_text_with({{"lr = ", "lr = 2.5e-3   # trailing comment"},
                                                               {"name = ", "name = \"tiny #2\"  # '#' in a string"},
                                                               {"checkpoint_dir = ", "checkpoint_dir = 'runs/#a'"}}));
  const TrainerConfig cfg = parse_config_args({"--config", path});
  EXPECT_DOUBLE_EQ(cfg.train.lr, 2.5e-3);
  EXPECT_EQ(cfg.model.name, "tiny #2");
  EXPECT_EQ(cfg.train.checkpoint_dir, "runs/#a");
}

TEST(TrainerConfigToml, MultiLineArraysWithCommentsAndATrailingComma) {
  test::TempDir dir;
  const std::string path = dir.write(
      "c.toml", tiny_text_with({{"modules = ", "modules = [\n  \"core_attn\",  # the attention core\n  # next\n"
                                               "  \"moe_act\",\n]"}}));
  const TrainerConfig cfg = parse_config_args({"--config", path});
  EXPECT_EQ(cfg.recompute.modules, (std::vector<std::string>{"core_attn", "moe_act"}));
  EXPECT_TRUE(cfg.recompute.has("moe_act"));
  EXPECT_FALSE(cfg.recompute.has("moe"));
}

TEST(TrainerConfigToml, ByteOrderMarkEscapesAndDottedKeys) {
  test::TempDir dir;
  // A UTF-8 byte order mark, a \u escape, an integer for a float option and `section.key` at the top level.
  // ([recompute] moves to the top: a dotted key defines its table, which no header may open again.)
  const std::string text = tiny_text_with({{"name = ", "name = \"t\\u0069ny\""},
                                           {"rope_theta = ", "rope_theta = 500"},
                                           {"[recompute]", ""},
                                           {"modules = ", ""}});
  const std::string path = dir.write("c.toml", "\xEF\xBB\xBFrecompute.modules = [\"moe_act\"]\n" + text);
  const TrainerConfig cfg = parse_config_args({"--config", path});
  EXPECT_EQ(cfg.model.name, "tiny");
  EXPECT_EQ(cfg.model.rope_theta, 500.0);
  EXPECT_EQ(cfg.recompute.modules, std::vector<std::string>{"moe_act"});
  EXPECT_EQ(cfg.model.hidden, 64);
}

TEST(TrainerConfigToml, EmptyAndNoneRecompute) {
  EXPECT_TRUE(tiny_with({"--recompute.modules", "none"}).recompute.modules.empty());
  EXPECT_TRUE(parse_config_args({"--config", preset("tiny")}).recompute.modules.empty());  // modules = []
  EXPECT_TRUE(tiny_with({"--recompute.modules", "full"}).recompute.has("core_attn"));
}

// Every preset reads as CLI11's TOML reader (the one used before toml++) read it: its values given on the command
// line give the same configuration as the file.
TEST(TrainerConfigToml, EveryPresetReadsAsBefore) {
  int presets = 0;
  for (const auto& entry : std::filesystem::directory_iterator(test::repo_root() + "/configs")) {
    if (entry.path().extension() != ".toml") continue;
    SCOPED_TRACE(entry.path().string());
    ++presets;
    std::vector<std::string> args, modules;
    for (const CLI::ConfigItem& item : CLI::ConfigTOML().from_file(entry.path().string())) {
      if (item.name == "++" || item.name == "--") continue;
      if (item.fullname() == "recompute.modules") {
        modules = {"--recompute.modules"};
        modules.insert(modules.end(), item.inputs.begin(), item.inputs.end());
        if (item.inputs.empty()) modules.push_back("none");
        continue;
      }
      ASSERT_EQ(item.inputs.size(), 1u) << item.fullname();
      args.insert(args.end(), {"--" + item.fullname(), item.inputs[0]});
    }
    args.insert(args.end(), modules.begin(), modules.end());  // a list takes the arguments up to the next option
    const TrainerConfig before = parse_config_args(args);
    const TrainerConfig now = parse_config_args({"--config", entry.path().string()});
    EXPECT_EQ(train_config_text(now), train_config_text(before));
    EXPECT_EQ(now.model.name, before.model.name);
    EXPECT_EQ(now.model.name, entry.path().stem().string());
    EXPECT_EQ(now.moe.aux_alpha, before.moe.aux_alpha);
    EXPECT_EQ(now.moe.bias_update_rate, before.moe.bias_update_rate);
    EXPECT_EQ(now.train.data_dir, "data/cache/shards");
  }
  EXPECT_GE(presets, 5);
  const TrainerConfig small = parse_config_args({"--config", preset("small")});
  EXPECT_EQ(small.model.hidden, 768);
  EXPECT_EQ(small.moe.routed_experts, 32);
  EXPECT_DOUBLE_EQ(small.moe.routed_scale, 2.5);
  EXPECT_DOUBLE_EQ(small.train.lr, 1e-3);
  EXPECT_EQ(small.train.seed, 1234u);
  EXPECT_EQ(small.train.checkpoint_dir, "runs/small/checkpoints");
}

TEST(TrainerConfigToml, RejectsMalformedFilesWithLineAndColumn) {
  test::TempDir dir;
  auto rejected = [&](const std::string& name, const std::string& text, std::initializer_list<std::string> parts) {
    SCOPED_TRACE(name);
    const std::string path = dir.write(name, text);
    const std::string msg = test::error_message([&] { parse_config_args({"--config", path}); });
    EXPECT_NE(msg.find("config file '" + path + "'"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  };
  rejected("unterminated.toml", "[model]\nname = \"tiny\nhidden = 64\n", {"line 2, column", "not closed"});
  rejected("twice.toml", "[model]\nhidden = 64\nhidden = 128\n", {"line 3, column", "'hidden'"});
  rejected("section_twice.toml", "[model]\nhidden = 64\n[train]\n[model]\nlayers = 2\n", {"line 4", "'model'"});
  rejected("unknown.toml", "[model]\n\nhiden = 64\n", {"line 3, column 1", "unknown option 'model.hiden'"});
  rejected("top.toml", "lr = 1e-3\n", {"unknown option 'lr'"});
  rejected("nested.toml", "[model.attention]\nheads = 4\n", {"unknown option 'model.attention.heads'"});
  rejected("section.toml", "[optimizer]\n", {"unknown option 'optimizer'"});
  rejected("string_int.toml", "[model]\nhidden = \"64\"\n",
           {"line 2, column 1", "model.hidden = \"64\": expected an integer, got a string"});
  rejected("float_int.toml", "[model]\nhidden = 64.0\n", {"model.hidden = 64.0: expected an integer, got a float"});
  rejected("string_float.toml", "[train]\nlr = \"1e-3\"\n", {"train.lr = \"1e-3\": expected a number, got a string"});
  rejected("bool_string.toml", "[moe]\nrouter = true\n", {"moe.router = true: expected a string, got a boolean"});
  rejected("string_list.toml", "[recompute]\nmodules = \"moe\"\n",
           {"recompute.modules", "expected an array of strings"});
  rejected("mixed_list.toml", "[recompute]\nmodules = [\"moe\", 1]\n", {"expected an array of strings"});
}

TEST(TrainerConfigToml, BasicStringEscapesQuotesBackslashesAndControlCharacters) {
  EXPECT_EQ(toml_basic_string("tiny"), "\"tiny\"");
  EXPECT_EQ(toml_basic_string("a \"b\" \\c"), "\"a \\\"b\\\" \\\\c\"");
  EXPECT_EQ(toml_basic_string("\b\t\n\f\r"), "\"\\b\\t\\n\\f\\r\"");
  EXPECT_EQ(toml_basic_string(std::string("\0\x01\x1f\x7f", 4)), "\"\\u0000\\u0001\\u001F\\u007F\"");
  EXPECT_EQ(toml_basic_string("caf\xc3\xa9"), "\"caf\xc3\xa9\"");  // UTF-8 as it is
}

TEST(TrainerConfig, ModelNameIsShortPrintableAscii) {
  for (const std::string& bad : {std::string("a\nb"), std::string("tab\there"), std::string("del\x7f"),
                                 std::string("caf\xc3\xa9")}) {
    SCOPED_TRACE(bad);
    expect_error_with([&] { tiny_with({"--model.name", bad}); },
                      {"model.name has character 0x", "expected printable ASCII"});
  }
  expect_error_with([] { tiny_with({"--model.name", "a\nb"}); }, {"model.name has character 0x0a at position 1"});
  expect_error_with([] { tiny_with({"--model.name", std::string(129, 'x')}); },
                    {"model.name is 129 characters long, expected at most 128"});
  EXPECT_EQ(tiny_with({"--model.name", std::string(128, 'x')}).model.name, std::string(128, 'x'));
  EXPECT_EQ(tiny_with({"--model.name", "quote \" and \\ backslash"}).model.name, "quote \" and \\ backslash");
}

TEST(TrainerConfig, CommandLineWinsButTheFileIsStillChecked) {
  test::TempDir dir;
  const std::string path = dir.write("c.toml", tiny_text_with({{"hidden = ", "hidden = \"wide\""}}));
  expect_error_with([&] { parse_config_args({"--config", path, "--model.hidden", "64"}); },
                    {path, "model.hidden = \"wide\""});
}

TEST(TrainerConfig, RejectsFileProblemsNamingFileAndKey) {
  test::TempDir dir;
  const std::string unknown = dir.write("unknown.toml", "[model]\nhiden = 64\n");
  expect_error_with([&] { parse_config_args({"--config", unknown}); }, {unknown, "unknown option 'model.hiden'"});
  const std::string bad_value = dir.write("bad.toml", "[model]\nhidden = \"abc\"\n");
  expect_error_with([&] { parse_config_args({"--config", bad_value}); }, {bad_value, "model.hidden", "abc"});
  const std::string missing = dir.file("missing.toml");
  expect_error_with([&] { parse_config_args({"--config", missing}); }, {missing, "does not exist"});
  expect_error_with([&] { parse_config_args({"--config", preset("tiny"), "--model.hidden", "x"}); },
                    {"command line", "--model.hidden"});
  expect_error_with([&] { parse_config_args({"--config", preset("tiny"), "--no.such"}); }, {"command line"});
}

TEST(TrainerConfig, CommandLineIntegersAreDecimalAndInRange) {
  for (const char* text : {"99999999999999999999", "010", "0x40", "64.0", "1e3"}) {
    SCOPED_TRACE(text);
    expect_error_with([&] { tiny_with({"--train.seed", text}); },
                      {"command line", "--train.seed", fmt::format("'{}' is not a decimal integer", text)});
  }
  EXPECT_EQ(tiny_with({"--model.hidden", "64", "--train.seed", "0"}).train.seed, 0u);
  EXPECT_EQ(tiny_with({"--model.n_dense_layers", "0"}).model.n_dense_layers, 0);
  expect_error_with([] { tiny_with({"--train.warmup_steps=-1"}); }, {"train.warmup_steps = -1"});
}

TEST(TrainerConfig, MissingRequiredKeysAreNamed) {
  test::TempDir dir;
  const std::string no_hidden = dir.write("c.toml", tiny_text_with({{"hidden = ", "# hidden unset"}}));
  expect_error_with([&] { parse_config_args({"--config", no_hidden}); },
                    {"model.hidden is missing (set it in the config file '" + no_hidden + "' or with --model.hidden)"});
  EXPECT_EQ(parse_config_args({"--config", no_hidden, "--model.hidden", "64"}).model.hidden, 64);
  const std::string no_lr = dir.write("lr.toml", tiny_text_with({{"lr = ", ""}}));
  expect_error_with([&] { parse_config_args({"--config", no_lr}); }, {"train.lr is missing"});
  // dense_ffn only with dense layers, the MoE sizes only with MoE layers; keys with working defaults may go.
  const std::string no_ffn = dir.write("ffn.toml", tiny_text_with({{"dense_ffn = ", ""}}));
  expect_error_with([&] { parse_config_args({"--config", no_ffn}); }, {"model.dense_ffn is missing"});
  EXPECT_NO_THROW(parse_config_args({"--config", no_ffn, "--model.n_dense_layers", "0"}));
  const std::string no_moe = dir.write("moe.toml", tiny_text_with({{"top_k = ", ""}, {"shared_experts = ", ""}}));
  expect_error_with([&] { parse_config_args({"--config", no_moe}); }, {"moe.top_k is missing"});
  EXPECT_NO_THROW(parse_config_args({"--config", no_moe, "--model.n_dense_layers", "2"}));
  EXPECT_EQ(parse_config_args({"--config", no_moe, "--moe.top_k", "2"}).moe.shared_experts, 0);
}

TEST(TrainerConfig, SeedIsReadSignedAndNegativeRejected) {
  expect_error_with([] { tiny_with({"--train.seed=-1"}); }, {"train.seed must be >= 0, got -1"});
  test::TempDir dir;
  const std::string path = dir.write("c.toml", tiny_text_with({{"seed = ", "seed = -5"}}));
  expect_error_with([&] { parse_config_args({"--config", path}); }, {"train.seed must be >= 0, got -5"});
  EXPECT_EQ(tiny_with({"--train.seed", "9223372036854775807"}).train.seed, 9223372036854775807ull);
}

// The floats are read as doubles but used in float32: a value that overflows float32, or that must be > 0 and
// rounds to a subnormal or to 0, or that leaves its range once rounded, is refused.
TEST(TrainerConfig, RejectsFloatsThatFloat32CannotHold) {
  expect_error_with([] { tiny_with({"--train.eps", "1e-50"}); },
                    {"train.eps = 1e-50 is below the smallest normal float32 1.17549e-38; it is used in float32"});
  expect_error_with([] { tiny_with({"--model.norm_eps", "1e-320"}); },
                    {"model.norm_eps = 1e-320 is below the smallest normal float32", "used in float32"});
  expect_error_with([] { tiny_with({"--train.lr", "1e-39"}); }, {"train.lr = 1e-39 is below the smallest normal"});
  expect_error_with([] { tiny_with({"--model.rope_theta", "1e300"}); },
                    {"model.rope_theta = 1e+300 exceeds the largest float32 3.40282e+38; it is used in float32"});
  expect_error_with([] { tiny_with({"--moe.aux_alpha", "1e39"}); }, {"moe.aux_alpha = 1e+39 exceeds the largest"});
  expect_error_with([] { tiny_with({"--train.beta2", "0.99999999999"}); },
                    {"train.beta2 = 0.99999999999 rounds to 1 in float32, which is not in [0, 1)"});
  // At the float32 limits, and below them where the rule allows 0, the values are taken.
  EXPECT_EQ(tiny_with({"--train.eps", "1.2e-38"}).train.eps, 1.2e-38);
  EXPECT_EQ(tiny_with({"--model.rope_theta", "3.4e38"}).model.rope_theta, 3.4e38);
  EXPECT_EQ(tiny_with({"--train.weight_decay", "1e-50"}).train.weight_decay, 1e-50);
}

TEST(TrainerConfig, RejectsNonFiniteAndOutOfRangeFloats) {
  for (const char* key : {"model.rope_theta", "model.norm_eps", "moe.routed_scale", "moe.aux_alpha",
                          "moe.bias_update_rate", "train.lr", "train.min_lr", "train.weight_decay", "train.beta1",
                          "train.beta2", "train.eps", "train.grad_clip"})
    for (const char* v : {"inf", "-inf", "nan"}) {
      SCOPED_TRACE(std::string(key) + " = " + v);
      expect_error_with([&] { tiny_with({fmt::format("--{}={}", key, v)}); },
                        {fmt::format("{} must be a finite number", key), fmt::format("got {}", v)});
    }
  expect_error_with([] { tiny_with({"--train.lr", "inf"}); }, {"train.lr must be a finite number > 0, got inf"});
  expect_error_with([] { tiny_with({"--model.norm_eps", "1"}); }, {"model.norm_eps must be a finite number in (0, 1)"});
  expect_error_with([] { tiny_with({"--train.beta1", "1"}); },
                    {"train.beta1 must be a finite number in [0, 1), got 1"});
  expect_error_with([] { tiny_with({"--moe.aux_alpha=-0.5"}); }, {"moe.aux_alpha must be a finite number >= 0"});
  // The same from the file (TOML spells them inf and nan); MoE floats also for an all-dense model.
  test::TempDir dir;
  const std::string path = dir.write("c.toml", tiny_text_with({{"lr = ", "lr = inf"}}));
  expect_error_with([&] { parse_config_args({"--config", path}); }, {"train.lr must be a finite number > 0, got inf"});
  expect_error_with([] { tiny_with({"--model.n_dense_layers", "2", "--moe.routed_scale", "nan"}); },
                    {"moe.routed_scale must be a finite number > 0, got nan"});
}

TEST(TrainerConfig, RejectsDerivedSizesThatOverflow) {
  // 2^20 x 2^20 tokens per micro-batch fit; x 2^30 micro-batches per step do not.
  expect_error_with([] { tiny_with({"--train.seq_len", "1048576", "--train.micro_batch", "1048576",
                                    "--train.grad_accum", "1073741824"}); },
                    {"tokens per step = train.seq_len x train.micro_batch x train.grad_accum",
                     "1048576 x 1048576 x 1073741824", "does not fit in a 64-bit integer"});
  expect_error_with([] { tiny_with({"--train.seq_len", "1048576", "--train.micro_batch", "1048576",
                                    "--train.grad_accum", "1024", "--train.steps", "1099511627776"}); },
                    {"tokens of the run", "train.steps", "does not fit"});
  expect_error_with([] { tiny_with({"--train.seq_len", "9223372036854775807"}); },
                    {"train.seq_len + 1", "does not fit"});
  expect_error_with([] { tiny_with({"--train.seq_len", "4611686018427387904", "--train.micro_batch", "2"}); },
                    {"train.micro_batch", "train.seq_len", "does not fit"});
  expect_error_with([] { tiny_with({"--train.seq_len", "1099511627776", "--train.micro_batch", "1024"}); },
                    {"logits per micro-batch", "model.vocab_size", "does not fit"});
  expect_error_with([] { tiny_with({"--model.qk_nope_head_dim", "9223372036854775800"}); },
                    {"model.qk_nope_head_dim + model.qk_rope_head_dim", "does not fit"});
  expect_error_with([] { tiny_with({"--moe.routed_experts", "1024", "--moe.expert_ffn", "4611686018427387904"}); },
                    {"routed expert weights", "does not fit"});
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
  expect_error_with([] { tiny_with({"--train.beta2", "1"}); }, {"train.beta2 must be a finite number in [0, 1)"});
  expect_error_with([] { tiny_with({"--train.eps", "0"}); }, {"train.eps must be a finite number > 0"});
  expect_error_with([] { tiny_with({"--train.grad_clip", "-1"}); }, {"train.grad_clip must be a finite number >= 0"});
  expect_error_with([] { tiny_with({"--train.seq_len", "0"}); }, {"train.seq_len must be >= 1"});
  expect_error_with([] { tiny_with({"--train.checkpoint_interval", "5"}); }, {"needs train.checkpoint_dir"});
  expect_error_with([] { tiny_with({"--train.eval_steps", "-1"}); },
                    {"train.eval_steps must be >= 0", "0: the whole validation split", "got -1"});
  EXPECT_EQ(tiny_with({"--train.eval_steps", "0"}).train.eval_steps, 0);  // periodic evaluations of the whole split
  expect_error_with([] { tiny_with({"--train.final_eval_steps", "-1"}); },
                    {"train.final_eval_steps must be >= 0", "0: the whole validation split", "got -1"});
  EXPECT_EQ(tiny_with({}).train.final_eval_steps, 0);  // default: the whole split
  EXPECT_EQ(tiny_with({"--train.final_eval_steps", "3"}).train.final_eval_steps, 3);
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
  test::TempDir dir;
  const std::string missing = dir.file("nothing_here");
  expect_error_with([&] { validate_data(tiny_with({"--train.data_dir", missing})); }, {missing, "not a folder"});
  expect_error_with([&] { validate_data(tiny_with({"--model.vocab_size", "129280"})); },
                    {"model.vocab_size = 129280 exceeds 65536"});
  const std::string empty = dir.path().string();
  expect_error_with([&] { validate_data(tiny_with({"--train.data_dir", empty})); }, {empty, "train"});

  // 9 tokens: 4 windows of seq_len + 1 = 3 tokens, one batch of 4 rows.
  const std::vector<uint16_t> tokens = {5, 7, 2, 9, 11, 2, 3, 4, 2};
  const std::vector<std::string> shape = {"--train.seq_len", "2", "--train.micro_batch", "4"};
  auto data_of = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), {"--train.data_dir", empty, "--model.vocab_size", "1000"});
    extra.insert(extra.end(), shape.begin(), shape.end());
    return tiny_with(extra);
  };
  write_token_shard(dir.file("train_000.bin"), tokens, 1000, 2);
  write_token_shard(dir.file("val_000.bin"), tokens, 1000, 2);
  expect_error_with([&] { validate_data(tiny_with({"--train.data_dir", empty})); },
                    {dir.file("train_000.bin"), "1000", "32768"});
  EXPECT_NO_THROW(validate_data(data_of({})));
  // Evaluation needs val shards.
  std::filesystem::remove(dir.file("val_000.bin"));
  expect_error_with([&] { validate_data(data_of({})); }, {"val"});
  EXPECT_NO_THROW(validate_data(data_of({"--train.eval_interval", "0"})));
}

TEST(TrainerConfig, DataMustHoldOneBatchPerSplit) {
  test::TempDir dir;
  const std::string folder = dir.path().string();
  // train: 9 tokens, 4 windows of 2 + 1 tokens; val: 7 tokens, 3 windows.
  write_token_shard(dir.file("train_000.bin"), std::vector<uint16_t>{5, 7, 2, 9, 11, 2, 3, 4, 2}, 1000, 2);
  write_token_shard(dir.file("val_000.bin"), std::vector<uint16_t>{5, 7, 2, 9, 11, 3, 2}, 1000, 2);
  auto config = [&](const char* micro_batch, const char* eval_interval) {
    return tiny_with({"--train.data_dir", folder, "--model.vocab_size", "1000", "--train.seq_len", "2",
                      "--train.micro_batch", micro_batch, "--train.eval_interval", eval_interval});
  };
  EXPECT_NO_THROW(validate_data(config("3", "10")));
  expect_error_with([&] { validate_data(config("4", "10")); },
                    {folder, "the val shards hold 3 windows of train.seq_len + 1 = 3 tokens",
                     "fewer than one batch of train.micro_batch = 4 rows", "evaluation"});
  EXPECT_NO_THROW(validate_data(config("4", "0")));  // no evaluation: the val split is not read
  expect_error_with([&] { validate_data(config("5", "0")); },
                    {"the train shards hold 4 windows", "train.micro_batch = 5", "training"});
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

// model.attention_backend and model.attention_deterministic: own and non-deterministic by default, any of the three
// names, and not part of the model's identity (a checkpoint resumes under another backend).
TEST(TrainerConfig, AttentionBackendOptions) {
  const TrainerConfig base = tiny_with({});
  EXPECT_EQ(base.model.attention_backend, AttentionBackend::own);
  EXPECT_FALSE(base.model.attention_deterministic);
  const TrainerConfig cudnn =
      tiny_with({"--model.attention_backend", "cudnn", "--model.attention_deterministic", "true"});
  EXPECT_EQ(cudnn.model.attention_backend, AttentionBackend::cudnn);
  EXPECT_TRUE(cudnn.model.attention_deterministic);
  EXPECT_EQ(tiny_with({"--model.attention_backend", "auto"}).model.attention_backend, AttentionBackend::automatic);
  EXPECT_EQ(model_config_hash(cudnn), model_config_hash(base));
  expect_error_with([] { tiny_with({"--model.attention_backend", "flash"}); },
                    {"model.attention_backend = 'flash'", "expected own", "cudnn", "auto"});
  expect_error_with([] { tiny_with({"--model.attention_deterministic", "1"}); }, {"not a boolean"});
}

// train.moments: fp32 by default (every preset), bf16 accepted from the file and the command line; anything else
// rejected naming the key and the accepted values; not part of the model's identity; in the train settings' text.
TEST(TrainerConfig, AdamWMomentsOption) {
  for (const char* name : {"tiny", "small", "dense_small", "v3", "v2", "v3_layer", "v3_671b", "v2_236b"}) {
    SCOPED_TRACE(name);
    EXPECT_EQ(parse_config_args({"--config", preset(name)}).train.moments, MomentDtype::fp32);
  }
  const TrainerConfig base = tiny_with({});
  const TrainerConfig bf16 = tiny_with({"--train.moments", "bf16"});
  EXPECT_EQ(bf16.train.moments, MomentDtype::bf16);
  EXPECT_EQ(tiny_with({"--train.moments", "fp32"}).train.moments, MomentDtype::fp32);
  EXPECT_EQ(model_config_hash(bf16), model_config_hash(base));
  EXPECT_NE(train_config_text(base).find("train.moments = fp32\n"), std::string::npos);
  EXPECT_NE(train_config_text(bf16).find("train.moments = bf16\n"), std::string::npos);
  for (const char* bad : {"fp16", "BF16", "float32", "", "fp8"})
    expect_error_with([&] { tiny_with({"--train.moments", bad}); },
                      {fmt::format("train.moments = '{}'", bad).c_str(), "expected fp32 or bf16"});

  // From a file: a string, checked as on the command line.
  const test::TempDir dir;
  auto file_with = [&](const std::string& line) { return dir.write("c.toml", tiny_text_with({{"moments = ", line}})); };
  EXPECT_EQ(parse_config_args({"--config", file_with("moments = \"bf16\"  # DeepSeek-V3's")}).train.moments,
            MomentDtype::bf16);
  expect_error_with([&] { parse_config_args({"--config", file_with("moments = \"half\"")}); },
                    {"train.moments = 'half'", "expected fp32 or bf16"});
  expect_error_with([&] { parse_config_args({"--config", file_with("moments = 2")}); }, {"train.moments"});
}

// A value rejected while the options are converted (text choices, recipes, the seed) is reported with where it came
// from: the flag when given on the command line (also over a config file, whose value it overrides), the file when
// read from it; never the file for a command-line value.
TEST(TrainerConfig, RejectedValuesNameTheirOrigin) {
  const test::TempDir dir;
  const std::string tiny = preset("tiny");
  struct Case {
    const char* key;   // section.key
    const char* line;  // the start of the key's line in configs/tiny.toml
    const char* bad;   // a value it rejects, as the command line gives it
    const char* good;  // a value it takes
  };
  const Case cases[] = {{"train.moments", "moments = ", "fp16", "bf16"},
                        {"moe.router", "router = ", "v4", "v2"},
                        {"train.non_finite", "non_finite = ", "ignore", "skip"},
                        {"model.attention_backend", "attention_backend = ", "flash", "auto"},
                        {"recipe.attention", "attention = \"", "fp4", "bf16"},
                        {"recipe.dense_mlp", "dense_mlp = \"", "fp8 fprop=fp4", "bf16"},
                        {"recipe.shared_experts", "shared_experts = \"", "mxfp4 rounding=up", "bf16"},
                        {"recipe.routed_experts", "routed_experts = \"", "bf16 fprop=fp8", "bf16"},
                        {"train.seed", "seed = ", "-3", "7"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.key);
    const std::string key = c.key, flag = "--" + key, name = key.substr(key.find('.') + 1);
    // On the command line, over the file's good value: the flag, not the file.
    std::vector<std::vector<std::string>> command_lines = {{"--config", tiny, flag + "=" + c.bad}};
    if (c.bad[0] != '-') command_lines.push_back({"--config", tiny, flag, c.bad});
    for (const std::vector<std::string>& args : command_lines) {
      const std::string msg = test::error_message([&] { parse_config_args(args); });
      EXPECT_EQ(msg.rfind("command line " + flag + ": " + key, 0), 0u) << msg;
      EXPECT_EQ(msg.find(tiny), std::string::npos) << msg;
      EXPECT_EQ(msg.find("config file"), std::string::npos) << msg;
    }
    // In the file: the file, not a flag.
    const std::string value = key == "train.seed" ? c.bad : fmt::format("\"{}\"", c.bad);
    const std::string text = tiny_text_with({{c.line, fmt::format("{} = {}", name, value)}});
    ASSERT_NE(text.find(fmt::format("\n{} = {}\n", name, value)), std::string::npos);
    const std::string path = dir.write(name + ".toml", text);
    const std::string msg = test::error_message([&] { parse_config_args({"--config", path}); });
    EXPECT_EQ(msg.rfind(fmt::format("config file '{}': {}", path, key), 0), 0u) << msg;
    EXPECT_EQ(msg.find(flag), std::string::npos) << msg;
    // A good value on the command line wins over the file's bad one.
    EXPECT_NO_THROW(parse_config_args({"--config", path, flag, c.good}));
  }
}

TEST(TrainerConfig, OriginNamesTheFlagTheFileOrTheDefault) {
  const test::TempDir dir;
  const std::string path = dir.write("c.toml", tiny_text_with({{"moments = ", "moments = \"bf16\""}}));
  TrainerConfig cfg;
  CLI::App app{"test"};
  ConfigOptions options(app, cfg);
  std::vector<std::string> args = {"--config", path, "--train.lr", "1e-3"};
  std::reverse(args.begin(), args.end());
  app.parse(args);
  options.load_config_file();
  EXPECT_EQ(options.origin("train.lr"), "command line --train.lr");
  EXPECT_EQ(options.origin("train.moments"), fmt::format("config file '{}'", path));
  EXPECT_EQ(options.origin("parallel.routed_load"), "default of parallel.routed_load");
}

}  // namespace
}  // namespace fp4moe
