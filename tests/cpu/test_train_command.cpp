// The options of `fp4moe train` (trainer/train/command_line.h) as the command parses them: defaults, --data,
// --resume (a file, latest = the highest step), and each option error with its message; the stop signals.
#include <gtest/gtest.h>

#include <csignal>
#include <regex>
#include <string>
#include <vector>

#include "tests/cpu/trainer_test_util.h"
#include "trainer/checkpoint.h"
#include "trainer/data/token_shard.h"
#include "trainer/train/command_line.h"
#include "trainer/train/resume.h"
#include "trainer/train/stop_signals.h"

namespace fp4moe {
namespace {

using test::expect_error_with;
using test::TrainerTempDir;

std::vector<std::string> tiny(std::initializer_list<std::string> more) {
  std::vector<std::string> args = {"--config", test::preset("tiny")};
  args.insert(args.end(), more);
  return args;
}

// An empty checkpoint (no tensors) of the tiny configuration at `step`.
void write_tiny_checkpoint(const std::string& path, uint64_t step, uint64_t hash) {
  CheckpointState st;
  st.config_hash = hash;
  st.step = step;
  write_checkpoint(path, st, {});
}

uint64_t tiny_hash() { return model_config_hash(parse_config_args(tiny({}))); }

TEST(TrainCommand, DefaultsAndOverrides) {
  const TrainRequest r = parse_train_command(tiny({"--synthetic-data"}));
  EXPECT_FALSE(r.dry_run);
  EXPECT_TRUE(r.options.synthetic_data);
  EXPECT_EQ(r.options.run_name, "tiny");
  EXPECT_TRUE(std::regex_match(r.options.out_path, std::regex(R"(runs/train-tiny-\d{8}T\d{6}Z\.h5)")))
      << r.options.out_path;
  EXPECT_EQ(r.options.peak_flops, 989e12);
  EXPECT_EQ(r.options.memory_budget_bytes, 0u);
  EXPECT_EQ(r.options.log_interval, 10);
  EXPECT_EQ(r.options.resume_path, "");
  EXPECT_EQ(r.options.config_path, test::preset("tiny"));
  EXPECT_EQ(r.config.train.steps, 20);

  const TrainRequest o = parse_train_command(tiny({"--synthetic-data", "--out", "x/y.h5", "--run", "bf16-a",
                                                   "--log-interval", "5", "--peak-tflops", "1979", "--memory-budget",
                                                   "80", "--train.steps", "7"}));
  EXPECT_EQ(o.options.out_path, "x/y.h5");
  EXPECT_EQ(o.options.run_name, "bf16-a");
  EXPECT_EQ(o.options.log_interval, 5);
  EXPECT_EQ(o.options.peak_flops, 1979e12);
  EXPECT_EQ(o.options.memory_budget_bytes, size_t{80} << 30);
  EXPECT_EQ(o.config.train.steps, 7);
}

TEST(TrainCommand, DataOverridesTheConfigAndIsChecked) {
  TrainerTempDir dir;
  std::vector<uint16_t> tokens(5000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(3 + i % 1000);
  tokens.back() = 2;
  write_token_shard(dir.file("train_000.bin"), tokens, 32768, 2);
  write_token_shard(dir.file("val_000.bin"), tokens, 32768, 2);
  const TrainRequest r = parse_train_command(tiny({"--data", dir.path().string()}));
  EXPECT_EQ(r.config.train.data_dir, dir.path().string());
  EXPECT_FALSE(r.options.synthetic_data);

  expect_error_with([&] { parse_train_command(tiny({"--data", dir.file("missing")})); },
                    {"train.data_dir", dir.file("missing"), "is not a folder"});
  // Without --synthetic-data the configured folder must hold shards; with it, the folder is not read.
  expect_error_with([&] { parse_train_command(tiny({"--train.data_dir", dir.file("nope")})); }, {"not a folder"});
  parse_train_command(tiny({"--train.data_dir", dir.file("nope"), "--synthetic-data"}));
}

TEST(TrainCommand, OptionErrorsSayWhatWasWrong) {
  expect_error_with([] { parse_train_command(tiny({"--bogus", "1"})); }, {"--bogus"});
  expect_error_with([] { parse_train_command({"--synthetic-data"}); }, {"no configuration", "--config"});
  expect_error_with([] { parse_train_command(tiny({"--synthetic-data", "--log-interval", "0"})); },
                    {"--log-interval must be >= 1", "0"});
  expect_error_with([] { parse_train_command(tiny({"--synthetic-data", "--peak-tflops", "0"})); },
                    {"--peak-tflops must be > 0"});
  expect_error_with([] { parse_train_command(tiny({"--synthetic-data", "--memory-budget", "-1"})); },
                    {"--memory-budget must be > 0 GiB"});
  expect_error_with([] { parse_train_command(tiny({"--synthetic-data", "--run", "a/b"})); }, {"run name 'a/b'"});
  expect_error_with([] { parse_train_command(tiny({"--synthetic-data", "--no-data-check"})); },
                    {"--no-data-check applies to --dry-run only"});
  expect_error_with([] { parse_train_command(tiny({"--synthetic-data", "--train.lr", "-1"})); }, {"train.lr"});
  const TrainRequest dry = parse_train_command(tiny({"--dry-run", "--no-data-check"}));
  EXPECT_TRUE(dry.dry_run);
  EXPECT_TRUE(dry.no_data_check);
}

TEST(TrainCommand, ResumeOfAMissingOrWrongFileIsRefused) {
  TrainerTempDir dir;
  expect_error_with([&] { parse_train_command(tiny({"--synthetic-data", "--resume", dir.file("missing.ckpt")})); },
                    {"--resume", dir.file("missing.ckpt"), "does not exist"});
  expect_error_with([&] { parse_train_command(tiny({"--synthetic-data", "--resume", "latest"})); },
                    {"--resume latest needs train.checkpoint_dir"});
  expect_error_with(
      [&] {
        parse_train_command(tiny({"--synthetic-data", "--resume", "latest", "--train.checkpoint_dir",
                                  dir.path().string()}));
      },
      {"no checkpoint", dir.path().string()});
  write_tiny_checkpoint(dir.file("other.ckpt"), 3, tiny_hash() ^ 1);
  expect_error_with([&] { parse_train_command(tiny({"--synthetic-data", "--resume", dir.file("other.ckpt")})); },
                    {"configuration hash"});
  write_tiny_checkpoint(dir.file("done.ckpt"), 20, tiny_hash());
  expect_error_with([&] { parse_train_command(tiny({"--synthetic-data", "--resume", dir.file("done.ckpt")})); },
                    {"step 20", "train.steps = 20", "nothing left to train"});
  const std::string junk = dir.write("junk.ckpt", "not a checkpoint");
  EXPECT_FALSE(test::error_message([&] { parse_train_command(tiny({"--synthetic-data", "--resume", junk})); }).empty());
}

TEST(TrainCommand, ResumeLatestPicksTheHighestStep) {
  TrainerTempDir dir;
  const uint64_t hash = tiny_hash();
  write_tiny_checkpoint(dir.file(checkpoint_file_name(3)), 3, hash);
  write_tiny_checkpoint(dir.file(checkpoint_file_name(12)), 12, hash);
  write_tiny_checkpoint(dir.file(checkpoint_file_name(10)), 10, hash);
  dir.write(checkpoint_file_name(19) + ".tmp.123", "an unfinished write");
  dir.write("step_x.ckpt", "not a step");
  dir.write("notes.txt", "");
  EXPECT_EQ(latest_checkpoint(dir.path().string()), dir.file("step_00000012.ckpt"));
  const TrainRequest r = parse_train_command(
      tiny({"--synthetic-data", "--resume", "latest", "--train.checkpoint_dir", dir.path().string()}));
  EXPECT_EQ(r.options.resume_path, dir.file("step_00000012.ckpt"));
  // An explicit file wins over the folder.
  const TrainRequest f = parse_train_command(tiny({"--synthetic-data", "--resume", dir.file(checkpoint_file_name(3)),
                                                   "--train.checkpoint_dir", dir.path().string()}));
  EXPECT_EQ(f.options.resume_path, dir.file("step_00000003.ckpt"));

  TrainerTempDir empty;
  EXPECT_EQ(latest_checkpoint(empty.path().string()), "");
  expect_error_with([&] { latest_checkpoint(empty.file("absent")); }, {"does not exist or is not a folder"});
  expect_error_with([&] { resolve_resume_path("", dir.path().string()); }, {"--resume"});
}

TEST(TrainCommand, StopSignalsAreCaughtOnceAndRestored) {
  struct sigaction before {};
  sigaction(SIGINT, nullptr, &before);
  {
    StopSignals signals;
    EXPECT_EQ(StopSignals::pending(), 0);
    expect_error_with([] { StopSignals again; }, {"already installed"});
    std::raise(SIGINT);  // the first one only asks to stop
    EXPECT_EQ(StopSignals::pending(), SIGINT);
    std::raise(SIGTERM);  // another kind does not replace it
    EXPECT_EQ(StopSignals::pending(), SIGINT);
  }
  struct sigaction after {};
  sigaction(SIGINT, nullptr, &after);
  EXPECT_EQ(after.sa_handler, before.sa_handler);
  EXPECT_STREQ(stop_signal_name(SIGINT), "SIGINT");
  EXPECT_STREQ(stop_signal_name(SIGTERM), "SIGTERM");
}

}  // namespace
}  // namespace fp4moe
