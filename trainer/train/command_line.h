// The options of `fp4moe train` (cli/cmd_train.cpp), kept in the trainer library so that tests parse them as the
// command does:
//
//   --config FILE, --section.key VALUE   the configuration (trainer/config.h)
//   --data DIR              overrides train.data_dir
//   --out FILE.h5           result file; default runs/train-<config name>-<UTC date-time>.h5 (trainer/train/out_file.h:
//                           an existing file only when --resume continues the run it holds, or with --overwrite)
//   --overwrite             replace an existing --out file that this run does not continue
//   --run NAME              group under /train and /memory; default the config name
//   --resume PATH|latest    continue from a checkpoint (latest: the highest step in train.checkpoint_dir)
//   --log-interval N        without a terminal, a progress line every N steps (default 10)
//   --synthetic-data        seeded synthetic tokens instead of the shards (trainer/train/batch.h)
//   --peak-tflops X         the peak MFU is quoted against (default 989: H100/H200 SXM dense BF16)
//   --memory-budget GiB     device memory budget (DeviceMemory): an allocation over it fails with its report
//   --profile [--profile-warmup N]   per-module GPU time of every step (trainer/model/profile.h) by log interval and
//                           over the run after N warm-up steps (default 2): /train/<run>/profile, printed at the end
//   --dry-run [--no-data-check]   validate and summarise only (cli/cmd_train.cpp)
//
// The config name is the stem of the --config file (configs/tiny.toml -> tiny), else model.name, else "run".
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <string>
#include <vector>

#include "trainer/config.h"
#include "trainer/train/options.h"

namespace fp4moe {

class TrainCommandLine {
 public:
  // Registers every option on `app` (the `train` subcommand, or a test's own app). `app` must outlive this object,
  // which must not move (CLI11 keeps pointers to its members).
  explicit TrainCommandLine(CLI::App& app);
  TrainCommandLine(const TrainCommandLine&) = delete;
  TrainCommandLine& operator=(const TrainCommandLine&) = delete;

  // After app.parse(): reads the configuration file, applies --data, validates the configuration
  // (validate_config) and the shards (validate_data; not with --synthetic-data, nor with --dry-run
  // --no-data-check), checks the run options, resolves --resume (resolve_resume_path, then the checkpoint's
  // header: readable and of this model's configuration hash, with a step below train.steps), fills the default
  // output and run names and checks the output (check_train_out against --config, the --resume checkpoint and the
  // shards read; with --dry-run too, so that a dry run answers for the real one). Nothing is allocated. Throws
  // fp4moe::Error with a message for the user, naming the option: no --config, --no-data-check without --dry-run,
  // --profile-warmup without --profile or < 0, --log-interval < 1, --peak-tflops or --memory-budget not > 0 (or
  // not finite), a bad --run name, and every error of the functions named above.
  void resolve();

  const TrainerConfig& config() const { return cfg_; }
  const TrainerOptions& options() const { return opts_; }
  bool dry_run() const { return dry_run_; }
  bool no_data_check() const { return no_data_check_; }
  const std::string& config_path() const { return config_->config_path(); }

 private:
  TrainerConfig cfg_;
  TrainerOptions opts_;
  std::unique_ptr<ConfigOptions> config_;
  CLI::Option* budget_option_ = nullptr;
  CLI::Option* profile_warmup_option_ = nullptr;
  std::string data_dir_, out_, run_, resume_;
  double peak_tflops_ = kH100H200DenseBf16Flops / 1e12;
  double memory_budget_gib_ = 0;
  bool dry_run_ = false, no_data_check_ = false, overwrite_ = false;
};

// "runs/train-<config_name>-<UTC date-time>.h5", the date-time as 20261129T101500Z.
std::string default_train_out_path(const std::string& config_name);

// What a parsed and resolved `fp4moe train` command line asks for.
struct TrainRequest {
  TrainerConfig config;
  TrainerOptions options;
  bool dry_run = false;
  bool no_data_check = false;
};

// Parses `args` (the arguments after `train`, e.g. {"--config", "configs/tiny.toml", "--synthetic-data"}) and
// resolves them as TrainCommandLine does. Throws fp4moe::Error, command-line parse errors included (an unknown
// option is named in the message).
TrainRequest parse_train_command(const std::vector<std::string>& args);

}  // namespace fp4moe
