// The options of `fp4moe train` (trainer/train/command_line.h) as the command parses them: defaults, --data,
// --resume (a file, latest = the highest step), --out (never an input or a special file; an existing file only
// when the resumed run continues it, or with --overwrite: trainer/train/out_file.h), and each option error with
// its message; the stop signals.
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "results/h5_file.h"
#include "results/table.h"
#include "tests/common/trainer_test_util.h"
#include "trainer/checkpoint.h"
#include "trainer/data/token_shard.h"
#include "trainer/train/command_line.h"
#include "trainer/train/metrics.h"
#include "trainer/train/resume.h"
#include "trainer/train/stop_signals.h"

namespace fp4moe {
namespace {

using test::expect_error_with;
using test::TempDir;

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
  TempDir dir;
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
                    {"--memory-budget must be a finite number of GiB in (0, 1.71799e+10), got -1"});
  // GiB x 2^30 bytes must fit in size_t.
  for (const char* gib : {"0", "nan", "inf", "1.8e10", "1e300"}) {
    SCOPED_TRACE(gib);
    expect_error_with([&] { parse_train_command(tiny({"--synthetic-data", "--memory-budget", gib})); },
                      {"--memory-budget must be a finite number of GiB in (0, 1.71799e+10)"});
  }
  EXPECT_EQ(parse_train_command(tiny({"--synthetic-data", "--memory-budget", "1.7e10"})).options.memory_budget_bytes,
            static_cast<size_t>(1.7e10 * 1073741824.0));
  expect_error_with([] { parse_train_command(tiny({"--synthetic-data", "--run", "a/b"})); }, {"run name 'a/b'"});
  expect_error_with([] { parse_train_command(tiny({"--synthetic-data", "--no-data-check"})); },
                    {"--no-data-check applies to --dry-run only"});
  expect_error_with([] { parse_train_command(tiny({"--synthetic-data", "--train.lr", "-1"})); }, {"train.lr"});
  const TrainRequest dry = parse_train_command(tiny({"--dry-run", "--no-data-check"}));
  EXPECT_TRUE(dry.dry_run);
  EXPECT_TRUE(dry.no_data_check);
}

TEST(TrainCommand, ResumeOfAMissingOrWrongFileIsRefused) {
  TempDir dir;
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
  TempDir dir;
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

  TempDir empty;
  EXPECT_EQ(latest_checkpoint(empty.path().string()), "");
  expect_error_with([&] { latest_checkpoint(empty.file("absent")); }, {"does not exist or is not a folder"});
  expect_error_with([&] { resolve_resume_path("", dir.path().string()); }, {"--resume"});
}

// A result file of `run` under `cfg` as the trainer writes it, with one step row.
void write_run_file(const std::string& path, const std::string& run, const TrainerConfig& cfg) {
  TrainMetrics m(run, train_run_attributes(cfg), "fp4moe train", EnvInfo{});
  m.add_step({1, 64, 10.0, 1e-3, 1.0, 1e3, 0.1, 0.5, 1.0, 0});
  m.write(path);
}

std::string contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(TrainCommand, OutIsNeverAnInputOrASpecialFile) {
  TempDir dir;
  const std::string config = dir.write("tiny.toml", contents(test::preset("tiny")));
  std::filesystem::create_symlink(config, dir.file("config_link.h5"));
  std::filesystem::create_hard_link(config, dir.file("config_hard.h5"));
  for (const std::string& out : {config, dir.file("config_link.h5"), dir.file("config_hard.h5")}) {
    SCOPED_TRACE(out);
    expect_error_with([&] { parse_train_command({"--config", config, "--synthetic-data", "--out", out}); },
                      {"--out '" + out + "' is the same file as --config '" + config + "'"});
    // --overwrite never lets an output replace an input.
    expect_error_with(
        [&] { parse_train_command({"--config", config, "--synthetic-data", "--out", out, "--overwrite"}); },
        {"is the same file as --config"});
  }
  EXPECT_EQ(contents(config), contents(test::preset("tiny")));

  const std::string ckpt = dir.file(checkpoint_file_name(3));
  write_tiny_checkpoint(ckpt, 3, tiny_hash());
  expect_error_with([&] { parse_train_command(tiny({"--synthetic-data", "--resume", ckpt, "--out", ckpt})); },
                    {"--out '" + ckpt + "' is the same file as --resume '" + ckpt + "'"});

  std::vector<uint16_t> tokens(5000, 7);
  tokens.back() = 2;
  write_token_shard(dir.file("train_000.bin"), tokens, 32768, 2);
  write_token_shard(dir.file("val_000.bin"), tokens, 32768, 2);
  for (const char* shard : {"train_000.bin", "val_000.bin"})
    expect_error_with(
        [&] { parse_train_command(tiny({"--data", dir.path().string(), "--out", dir.file(shard), "--overwrite"})); },
        {"is the same file as the token shard '" + dir.file(shard) + "'"});
  // The tokenizer model beside the shards is read too (its checksum against the shards').
  const std::string spm = dir.write("spm.model", "a sentencepiece model");
  expect_error_with(
      [&] { parse_train_command(tiny({"--data", dir.path().string(), "--out", spm, "--overwrite"})); },
      {"is the same file as the tokenizer model '"});
  EXPECT_EQ(contents(spm), "a sentencepiece model");

  expect_error_with([] { parse_train_command(tiny({"--synthetic-data", "--out", "/dev/null", "--overwrite"})); },
                    {"--out '/dev/null' is a character device, expected a regular file"});
  expect_error_with([&] { parse_train_command(tiny({"--synthetic-data", "--dry-run", "--out", dir.path().string()})); },
                    {"is a folder"});
  // A folder that does not exist yet is created by the run.
  EXPECT_EQ(parse_train_command(tiny({"--synthetic-data", "--out", dir.file("new/r.h5")})).options.out_path,
            dir.file("new/r.h5"));
}

TEST(TrainCommand, OutIsOutsideTheCheckpointFolder) {
  TempDir dir;
  const std::string ckpt_dir = dir.file("ckpt");
  for (const std::string& out : {ckpt_dir, ckpt_dir + "/r.h5", ckpt_dir + "/sub/r.h5", dir.file("ckpt/../ckpt/r.h5")}) {
    SCOPED_TRACE(out);
    expect_error_with(
        [&] { parse_train_command(tiny({"--synthetic-data", "--train.checkpoint_dir", ckpt_dir, "--out", out})); },
        {"--out '" + out + "' is inside train.checkpoint_dir '" + ckpt_dir + "'"});
  }
  std::filesystem::create_directory(ckpt_dir);
  auto with_out = [&](const std::string& out) {
    return parse_train_command(tiny({"--synthetic-data", "--train.checkpoint_dir", ckpt_dir, "--out", out}));
  };
  expect_error_with([&] { with_out(ckpt_dir + "/r.h5"); }, {"is inside train.checkpoint_dir"});
  EXPECT_EQ(with_out(dir.file("ckpt.h5")).options.out_path, dir.file("ckpt.h5"));  // beside it
  // A checkpoint folder that is a file is refused when the configuration is validated, also by --dry-run.
  const std::string file = dir.write("ckpt_file", "not a folder");
  expect_error_with(
      [&] { parse_train_command(tiny({"--synthetic-data", "--dry-run", "--train.checkpoint_dir", file})); },
      {"train.checkpoint_dir '" + file + "' exists and is not a folder, expected a folder"});
}

TEST(TrainCommand, AnExistingOutNeedsOverwriteUnlessTheRunContinuesIt) {
  TempDir dir;
  const std::string old = dir.write("old.h5", "an earlier result");
  for (bool dry : {false, true}) {
    std::vector<std::string> args = tiny({"--synthetic-data", "--out", old});
    if (dry) args.push_back("--dry-run");
    expect_error_with([&] { parse_train_command(args); },
                      {"--out '" + old + "' already exists", "expected a new path", "--overwrite"});
    args.push_back("--overwrite");
    const TrainRequest r = parse_train_command(args);
    EXPECT_TRUE(r.options.replace_out);
  }
  EXPECT_EQ(contents(old), "an earlier result");
  EXPECT_FALSE(parse_train_command(tiny({"--synthetic-data", "--out", dir.file("new.h5")})).options.replace_out);

  // A fresh run does not continue a file of its own run either: it would start the curve again from step 1.
  const TrainerConfig cfg = parse_config_args(tiny({}));
  const std::string own = dir.file("own.h5");
  write_run_file(own, "tiny", cfg);
  expect_error_with([&] { parse_train_command(tiny({"--synthetic-data", "--out", own})); }, {"already exists"});

  // A resume continues the file of its own run (same run name, same model configuration, nothing else in it).
  const std::string ckpt = dir.file(checkpoint_file_name(3));
  write_tiny_checkpoint(ckpt, 3, tiny_hash());
  const TrainRequest resumed = parse_train_command(tiny({"--synthetic-data", "--resume", ckpt, "--out", own}));
  EXPECT_FALSE(resumed.options.replace_out);
  EXPECT_EQ(resumed.options.out_path, own);
  EXPECT_FALSE(parse_train_command(tiny({"--synthetic-data", "--resume", ckpt, "--out", own, "--overwrite"}))
                   .options.replace_out);  // --overwrite only lets a file be replaced that the run does not continue

  // ... and nothing else: another run, another configuration, other results, another kind of file.
  const std::string other_config = dir.file("other_config.h5"), extra = dir.file("extra.h5");
  write_run_file(other_config, "tiny", parse_config_args(tiny({"--moe.top_k", "3"})));
  {
    ResultFile f;
    Table run;
    for (const auto& [name, v] : train_run_attributes(cfg)) run.set_attribute(name, v);
    f.add_table("/train/tiny", std::move(run));
    Table bench;
    bench.add_column("case", ColumnType::str).add_row({std::string("a")});
    f.add_table("/bench/quant", std::move(bench));
    f.write(extra);
  }
  const std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>> refused = {
      {{"--out", own, "--run", "other"}, {"holds no run 'other'"}},
      {{"--out", other_config}, {"holds run 'tiny' of another model configuration"}},
      {{"--out", extra}, {"holds results besides run 'tiny' (/bench/quant/case)"}},
      {{"--out", old}, {"is not an HDF5 result file"}},
  };
  for (const auto& [more, words] : refused) {
    std::vector<std::string> args = tiny({"--synthetic-data", "--resume", ckpt});
    args.insert(args.end(), more.begin(), more.end());
    SCOPED_TRACE(more[1]);
    const std::string msg = test::error_message([&] { parse_train_command(args); });
    EXPECT_NE(msg.find("--out '" + more[1] + "' "), std::string::npos) << msg;
    for (const std::string& w : words) EXPECT_NE(msg.find(w), std::string::npos) << msg;
    EXPECT_NE(msg.find("pass --overwrite to replace it"), std::string::npos) << msg;
    args.push_back("--overwrite");
    EXPECT_TRUE(parse_train_command(args).options.replace_out);  // replaced whole: none of its rows are read
  }
  EXPECT_EQ(contents(old), "an earlier result");
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
