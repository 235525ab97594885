#include "trainer/train/command_line.h"

#include <fmt/format.h>

#include <cmath>
#include <ctime>
#include <filesystem>

#include "kernels/common/check.h"
#include "trainer/checkpoint.h"
#include "trainer/data/loader.h"
#include "trainer/train/metrics.h"
#include "trainer/train/out_file.h"
#include "trainer/train/resume.h"

namespace fp4moe {

TrainCommandLine::TrainCommandLine(CLI::App& app) {
  config_ = std::make_unique<ConfigOptions>(app, cfg_);
  app.add_option("--data", data_dir_, "folder of token shards (overrides train.data_dir)");
  app.add_option("--out", out_, "HDF5 result file (default runs/train-<config name>-<UTC date-time>.h5); an existing "
                                "file is refused unless --resume continues the run it holds, or --overwrite");
  app.add_flag("--overwrite", overwrite_, "replace an existing --out file that this run does not continue (its "
                                          "rows are not kept)");
  app.add_option("--run", run_, "group name of the run under /train and /memory (default the config name)");
  app.add_option("--resume", resume_, "continue from a checkpoint file, or 'latest' (the highest step in "
                                      "train.checkpoint_dir)");
  app.add_option("--log-interval", opts_.log_interval, "without a terminal: a progress line every N steps")
      ->capture_default_str();
  app.add_flag("--synthetic-data", opts_.synthetic_data, "seeded synthetic tokens instead of the token shards");
  app.add_option("--peak-tflops", peak_tflops_, "peak TFLOP/s the MFU is quoted against "
                                                "(989: H100/H200 SXM dense BF16)")
      ->capture_default_str();
  budget_option_ = app.add_option("--memory-budget", memory_budget_gib_,
                                  "device memory budget in GiB (emulates a smaller card; over it, the allocation "
                                  "fails with a report)");
  app.add_flag("--profile", opts_.profile, "time every module's forward, backward and recompute and the optimizer "
                                           "step with CUDA events: a table per log interval and for the run after "
                                           "the warm-up in the result file (/train/<run>/profile), printed at the end");
  profile_warmup_option_ =
      app.add_option("--profile-warmup", opts_.profile_warmup, "with --profile: steps left out of the run's profile")
          ->capture_default_str();
  app.add_flag("--dry-run", dry_run_, "validate, print the model summary and exit");
  app.add_flag("--no-data-check", no_data_check_,
               "with --dry-run: do not open the token shards (e.g. for a production vocabulary)");
}

void TrainCommandLine::resolve() {
  const std::string& config_path = config_->config_path();
  FP4MOE_CHECK(!config_path.empty(), "no configuration: pass --config FILE (e.g. configs/small.toml)");
  config_->load_config_file();
  if (!data_dir_.empty()) cfg_.train.data_dir = data_dir_;
  validate_config(cfg_);
  FP4MOE_CHECK(!no_data_check_ || dry_run_, "--no-data-check applies to --dry-run only");
  if (!opts_.synthetic_data && !no_data_check_) validate_data(cfg_);

  FP4MOE_CHECK(opts_.log_interval >= 1, "--log-interval must be >= 1, got {}", opts_.log_interval);
  FP4MOE_CHECK(profile_warmup_option_->count() == 0 || opts_.profile, "--profile-warmup applies with --profile only");
  FP4MOE_CHECK(opts_.profile_warmup >= 0, "--profile-warmup must be >= 0 steps, got {}", opts_.profile_warmup);
  FP4MOE_CHECK(std::isfinite(peak_tflops_) && peak_tflops_ > 0, "--peak-tflops must be > 0, got {}", peak_tflops_);
  opts_.peak_flops = peak_tflops_ * 1e12;
  if (budget_option_->count() > 0) {
    // The bytes must fit in size_t: 2^64 as a double is the first value that does not.
    constexpr double kGiB = 1073741824.0, kMaxBytes = 18446744073709551616.0;
    FP4MOE_CHECK(std::isfinite(memory_budget_gib_) && memory_budget_gib_ > 0 && memory_budget_gib_ * kGiB < kMaxBytes,
                 "--memory-budget must be a finite number of GiB in (0, {:g}), got {}", kMaxBytes / kGiB,
                 memory_budget_gib_);
    opts_.memory_budget_bytes = static_cast<size_t>(memory_budget_gib_ * kGiB);
  }

  std::string name = std::filesystem::path(config_path).stem().string();
  if (name.empty()) name = cfg_.model.name.empty() ? "run" : cfg_.model.name;
  opts_.run_name = run_.empty() ? name : run_;
  check_run_name(opts_.run_name);
  opts_.out_path = out_.empty() ? default_train_out_path(name) : out_;
  opts_.config_path = config_path;

  if (!resume_.empty()) {
    opts_.resume_path = resolve_resume_path(resume_, cfg_.train.checkpoint_dir);
    const CheckpointReader ckpt(opts_.resume_path, model_config_hash(cfg_));  // header, index, configuration hash
    FP4MOE_CHECK(ckpt.state().step < static_cast<uint64_t>(cfg_.train.steps),
                 "--resume: checkpoint '{}' is at step {}, not below train.steps = {}: nothing left to train (raise "
                 "--train.steps)",
                 opts_.resume_path, ckpt.state().step, cfg_.train.steps);
  }

  std::vector<NamedPath> inputs = {{"--config", config_path}, {"--resume", opts_.resume_path}};
  if (!opts_.synthetic_data && !no_data_check_) {
    std::vector<std::string> shards = find_token_shards(cfg_.train.data_dir, "train");
    if (cfg_.train.eval_interval > 0) {
      const std::vector<std::string> val = find_token_shards(cfg_.train.data_dir, "val");
      shards.insert(shards.end(), val.begin(), val.end());
    }
    for (const std::string& shard : shards) inputs.push_back({"the token shard", shard});
    inputs.push_back({"the tokenizer model", tokenizer_model_of_shards(cfg_.train.data_dir)});  // "" when absent
  }
  const TrainOutUse use = check_train_out(opts_.out_path, opts_.run_name, cfg_, !resume_.empty(), overwrite_, inputs);
  opts_.replace_out = use == TrainOutUse::replace;
}

std::string default_train_out_path(const std::string& config_name) {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &tm);
  return fmt::format("runs/train-{}-{}.h5", config_name, stamp);
}

TrainRequest parse_train_command(const std::vector<std::string>& args) {
  CLI::App app{"fp4moe train"};
  TrainCommandLine cl(app);
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes the arguments in reverse order
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& err) {
    FP4MOE_CHECK(false, "command line: {}", err.what());
  }
  cl.resolve();
  return {cl.config(), cl.options(), cl.dry_run(), cl.no_data_check()};
}

}  // namespace fp4moe
