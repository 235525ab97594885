// The [parallel] section of the trainer configuration (trainer/config.h's ParallelConfig) and the layout the memory
// estimate reads from it (trainer/memory/estimate.h's layout_of): defaults of one GPU, the file and the command line,
// one-line validation errors naming what does not divide, the 1F1B in-flight rule min(pp - s, micro_batches) and
// the layout arithmetic.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/common/temp_dir.h"
#include "tests/common/trainer_test_util.h"
#include "trainer/config.h"
#include "trainer/memory/estimate.h"
#include "trainer/memory/estimate_report.h"

namespace fp4moe {
namespace {

using test::expect_error_with;
using test::preset;

TrainerConfig tiny(std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"--config", preset("tiny")};
  args.insert(args.end(), extra.begin(), extra.end());
  return parse_config_args(args);
}

TEST(ParallelConfig, DefaultsDescribeOneGpu) {
  const TrainerConfig cfg = tiny();
  const ParallelConfig& p = cfg.parallel;
  EXPECT_EQ(p.tp, 1);
  EXPECT_EQ(p.pp, 1);
  EXPECT_EQ(p.ep, 1);
  EXPECT_EQ(p.dp, 1);
  EXPECT_EQ(p.micro_batches, 1);
  EXPECT_FALSE(p.zero1);
  EXPECT_EQ(p.stage, -1);
  EXPECT_EQ(p.routed_load, 1.0);
  const ParallelLayout l = layout_of(cfg);
  EXPECT_EQ(l.name, "1 GPU");
  EXPECT_EQ(l.gpus, 1);
  EXPECT_EQ(l.micro_batch, 4);
  EXPECT_EQ(l.seq_len, 64);
  // Without [parallel] the dry run's estimate is the one-GPU estimate, to the byte.
  EXPECT_EQ(estimate_memory(cfg).bytes, estimate_memory(cfg, single_gpu_layout(cfg)).bytes);
}

TEST(ParallelConfig, SectionOnTopOfAPreset) {
  test::TempDir dir;
  // A full configuration: tiny's text with a [parallel] section appended.
  std::ifstream in(preset("tiny"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  text += "\n[parallel]\ntp = 2\npp = 2\nep = 4\ndp = 2\nmicro_batches = 8\nzero1 = true\nstage = 1\n"
          "routed_load = 1.5\n";
  const std::string accum = "grad_accum = 1";  // a step's micro-batches are the pipeline's
  ASSERT_NE(text.find(accum), std::string::npos);
  text.replace(text.find(accum), accum.size(), "grad_accum = 8");
  const std::string path = dir.write("par.toml", text);
  const TrainerConfig cfg = parse_config_args({"--config", path});
  const ParallelConfig& p = cfg.parallel;
  EXPECT_EQ(p.tp, 2);
  EXPECT_EQ(p.pp, 2);
  EXPECT_EQ(p.ep, 4);
  EXPECT_EQ(p.dp, 2);
  EXPECT_EQ(p.micro_batches, 8);
  EXPECT_TRUE(p.zero1);
  EXPECT_EQ(p.stage, 1);
  EXPECT_EQ(p.routed_load, 1.5);
  EXPECT_EQ(p.gpus(), 8);

  // Layout arithmetic: gpus = tp x pp x dp, expert_dp = dp tp / ep.
  const ParallelLayout l = layout_of(cfg);
  EXPECT_EQ(l.gpus, 8);
  EXPECT_EQ(l.tp, 2);
  EXPECT_EQ(l.pp, 2);
  EXPECT_EQ(l.dp, 2);
  EXPECT_EQ(l.ep, 4);
  EXPECT_EQ(l.expert_dp(), 1);
  EXPECT_TRUE(l.zero1);
  EXPECT_EQ(l.routed_load, 1.5);
  EXPECT_EQ(l.micro_batches, 8);
  EXPECT_EQ(l.name, "8 GPUs");

  // parallel.stage picks the estimated stage; -1 the largest.
  EXPECT_EQ(estimate_memory(cfg).stage, 1);
  const TrainerConfig largest = parse_config_args({"--config", path, "--parallel.stage", "-1"});
  EXPECT_EQ(estimate_memory(largest).stage, estimate_memory(largest, layout_of(largest)).stage);
  EXPECT_EQ(estimate_memory(largest).total(), estimate_memory(largest, layout_of(largest)).total());

  // The command line wins over the file, booleans included.
  const TrainerConfig cli = parse_config_args({"--config", path, "--parallel.pp", "1", "--parallel.dp", "4",
                                               "--parallel.zero1", "false", "--parallel.stage", "0"});
  EXPECT_EQ(cli.parallel.pp, 1);
  EXPECT_EQ(cli.parallel.dp, 4);
  EXPECT_FALSE(cli.parallel.zero1);
  EXPECT_EQ(cli.parallel.tp, 2);  // from the file
}

TEST(ParallelConfig, RejectsWhatDoesNotDivideOnOneLine) {
  const struct {
    std::vector<std::string> args;
    std::vector<std::string> parts;
  } cases[] = {
      {{"--parallel.tp", "3"}, {"[parallel]", "tp = 3", "model.heads = 4"}},
      {{"--parallel.dp", "3", "--parallel.ep", "3"}, {"[parallel]", "ep = 3", "moe.routed_experts = 8"}},
      {{"--parallel.dp", "2", "--parallel.ep", "4"}, {"[parallel]", "ep = 4", "dp x tp = 2"}},
      {{"--parallel.pp", "3"}, {"[parallel]", "pp = 3", "model.layers = 2"}},
      {{"--parallel.pp", "2", "--parallel.stage", "2"}, {"parallel.stage = 2", "parallel.pp = 2"}},
      {{"--parallel.stage", "-2"}, {"parallel.stage = -2"}},
      {{"--parallel.micro_batches", "0"}, {"parallel.micro_batches must be >= 1, got 0"}},
      {{"--parallel.tp", "0"}, {"parallel.tp must be >= 1, got 0"}},
      {{"--parallel.dp", "2000000"}, {"parallel.dp = 2000000 exceeds"}},
      {{"--parallel.tp", "1024", "--parallel.dp", "1024", "--parallel.pp", "2"}, {"tp x pp x dp", "exceeds"}},
      {{"--parallel.routed_load", "0.5"}, {"parallel.routed_load", "got 0.5"}},
      {{"--parallel.routed_load", "nan"}, {"parallel.routed_load"}},
      {{"--parallel.pp", "2", "--parallel.micro_batches", "4"},
       {"train.grad_accum = 1 must equal parallel.micro_batches = 4", "1F1B"}},
      // One GPU setting micro_batches: the same rule (the dry run would print a step of 7 beside grad_accum 3).
      {{"--parallel.micro_batches", "7", "--train.grad_accum", "3"},
       {"train.grad_accum = 3 must equal parallel.micro_batches = 7"}},
      // A GPU receives at most every rank's rows: a larger load overflowed the plans' row counts.
      {{"--parallel.dp", "2", "--parallel.ep", "2", "--parallel.routed_load", "1e15"},
       {"parallel.routed_load = 1000000000000000 must be at most parallel.ep = 2"}},
      {{"--parallel.routed_load", "4"}, {"parallel.routed_load = 4 must be at most parallel.ep = 1"}},
      {{"--parallel.zero1", "true"}, {"parallel.zero1 = true needs parallel.dp > 1", "dp = 1"}},
      {{"--model.n_dense_layers", "2", "--parallel.dp", "2", "--parallel.ep", "2"},
       {"[parallel]", "ep = 2 needs MoE layers"}},
  };
  for (const auto& c : cases) {
    std::vector<std::string> args = {"--config", preset("tiny")};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const std::string msg = test::error_message([&] { parse_config_args(args); });
    EXPECT_FALSE(msg.empty()) << c.parts.front();
    for (const std::string& part : c.parts) EXPECT_NE(msg.find(part), std::string::npos) << part << " in: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  // A boolean must be a TOML boolean in the file.
  test::TempDir dir;
  std::ifstream in(preset("tiny"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string path = dir.write("bad.toml", text + "\n[parallel]\nzero1 = 1\n");
  expect_error_with([&] { parse_config_args({"--config", path}); }, {"parallel.zero1", "a boolean", "an integer"});
}

TEST(ParallelConfig, CommandLineBooleansAreTrueOrFalse) {
  // As in the file (a TOML boolean): true or false, not CLI11's integers (2 read as true, -1 as false) or words.
  for (const char* value : {"2", "-1", "1", "0", "yes", "on", "TRUE"}) {
    SCOPED_TRACE(value);
    const std::string msg = test::error_message(
        [&] { parse_config_args({"--config", preset("tiny"), "--parallel.dp", "2", "--parallel.zero1", value}); });
    EXPECT_NE(msg.find("--parallel.zero1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("true or false"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  EXPECT_TRUE(parse_config_args({"--config", preset("tiny"), "--parallel.dp", "2", "--parallel.zero1", "true"})
                  .parallel.zero1);
  EXPECT_FALSE(parse_config_args({"--config", preset("tiny"), "--parallel.dp", "2", "--parallel.zero1", "false"})
                   .parallel.zero1);
}

TEST(ParallelLayout, OneFOneBKeepsTheSmallerOfStagesAheadAndMicroBatches) {
  ParallelLayout l;
  l.pp = 4;
  l.micro_batches = 8;
  EXPECT_EQ(l.in_flight(0), 4);
  EXPECT_EQ(l.in_flight(1), 3);
  EXPECT_EQ(l.in_flight(3), 1);
  l.micro_batches = 2;  // fewer micro-batches than stages: stage 0 runs both forwards before its first backward
  EXPECT_EQ(l.in_flight(0), 2);
  EXPECT_EQ(l.in_flight(1), 2);
  EXPECT_EQ(l.in_flight(2), 2);
  EXPECT_EQ(l.in_flight(3), 1);

  // In the estimate: tiny over 2 stages keeps one micro-batch on stage 0 when a step has one.
  const TrainerConfig one = tiny({"--parallel.pp", "2"});
  const TrainerConfig two = tiny({"--parallel.pp", "2", "--parallel.micro_batches", "2", "--train.grad_accum", "2"});
  const MemoryEstimate a = estimate_memory_stage(one, layout_of(one), 0);
  const MemoryEstimate b = estimate_memory_stage(two, layout_of(two), 0);
  EXPECT_EQ(a.in_flight, 1);
  EXPECT_EQ(b.in_flight, 2);
  EXPECT_EQ(b.category(MemCategory::activations), 2 * a.category(MemCategory::activations));
}

// configs/v3_671b.toml and configs/v2_236b.toml (the emulated production GPUs) state DeepSeek-V3 671B's and V2 236B's
// shapes a second time, beside the estimator's presets (trainer/memory/estimate_report.h): they must agree.
void expect_production_config(const std::string& config, const std::string& preset_name) {
  SCOPED_TRACE(config);
  const TrainerConfig cfg = parse_config_args({"--config", preset(config)});
  const ProductionPreset p = production_preset(preset_name);
  const ModelConfig &a = cfg.model, &b = p.config.model;
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden, b.hidden);
  EXPECT_EQ(a.layers, b.layers);
  EXPECT_EQ(a.n_dense_layers, b.n_dense_layers);
  EXPECT_EQ(a.heads, b.heads);
  EXPECT_EQ(a.q_lora_rank, b.q_lora_rank);
  EXPECT_EQ(a.kv_lora_rank, b.kv_lora_rank);
  EXPECT_EQ(a.qk_nope_head_dim, b.qk_nope_head_dim);
  EXPECT_EQ(a.qk_rope_head_dim, b.qk_rope_head_dim);
  EXPECT_EQ(a.v_head_dim, b.v_head_dim);
  EXPECT_EQ(a.dense_ffn, b.dense_ffn);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.norm_eps, b.norm_eps);
  const MoeConfig &x = cfg.moe, &y = p.config.moe;
  EXPECT_EQ(x.routed_experts, y.routed_experts);
  EXPECT_EQ(x.shared_experts, y.shared_experts);
  EXPECT_EQ(x.top_k, y.top_k);
  EXPECT_EQ(x.expert_ffn, y.expert_ffn);
  EXPECT_EQ(x.router, y.router);
  EXPECT_EQ(x.routed_scale, y.routed_scale);
  EXPECT_EQ(x.aux_alpha, y.aux_alpha);
  EXPECT_EQ(x.bias_update_rate, y.bias_update_rate);
  const ParallelLayout l = layout_of(cfg);
  EXPECT_EQ(l.micro_batch, p.layout.micro_batch);
  EXPECT_EQ(l.seq_len, p.layout.seq_len);
  EXPECT_TRUE(l.zero1);
  EXPECT_EQ(l.micro_batches * l.dp * l.micro_batch, p.global_batch) << "the preset's global batch";
  EXPECT_EQ(cfg.train.grad_accum, l.micro_batches);
}

TEST(ParallelConfig, ProductionConfigsStateThePresetsShapes) {
  expect_production_config("v3_671b", "v3");
  expect_production_config("v2_236b", "v2");
  // v2_236b is the preset's own layout; v3_671b the closest tensor-parallel-1 layout to P1's memory numbers.
  const ParallelLayout v2 = layout_of(parse_config_args({"--config", preset("v2_236b")}));
  const ParallelLayout v2_preset = production_preset("v2").layout;
  EXPECT_EQ(v2.gpus, v2_preset.gpus);
  EXPECT_EQ(v2.pp, v2_preset.pp);
  EXPECT_EQ(v2.ep, v2_preset.ep);
  EXPECT_EQ(v2.dp, v2_preset.dp);
  EXPECT_EQ(v2.tp, v2_preset.tp);
}

}  // namespace
}  // namespace fp4moe
