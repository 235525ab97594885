// `fp4moe plan (--model v3|v2 | --config FILE) --gpus N --memory-gib G [--recipes bf16,fp8,mxfp4] [--no-measure]
//  [--measure-top K] [--cache FILE] [--tp 1,2,4,8] [--mfu F] [--peak-tflops X] [--nvlink-gb-per-s B]
//  [--ib-gb-per-s B] [--gpus-per-node K] [--global-batch S] [--top K] [--out FILE.h5]`: enumerates the parallel
// layouts of N GPUs x paper 1's recompute policies x the recipes, keeps those whose memory estimate fits G GiB per GPU
// and ranks them by a modelled tokens/s per GPU (trainer/memory/plan.h: the cost model, its assumptions and their
// sources). Then, unless --no-measure, it measures each stage's compute time on the local GPU (trainer/memory/
// stage_times.h, stage_measure.h): for the candidates of each recipe's first --measure-top (default 2) and the best
// of each recompute policy, one `fp4moe train` child per (recipe, policy, layer kind, ep) not yet in the --cache
// table (default runs/plan/stage_times.tsv), with a progress bar on stderr; those candidates are re-ranked by the
// measured compute + the modelled EP/PP transfers + the 1F1B bubble and listed first. Prints a Markdown table per
// recipe and what mxfp4 buys over fp8 and bf16 to stdout; a progress line on stderr when the enumeration takes more
// than a second. --out also writes every candidate, fitting or not, to an HDF5 file (table /plan/candidates:
// trainer/memory/plan.h's plan_table; checked before any work, written atomically: results/output_path.h).
// --model: the production shapes of trainer/memory/estimate_report.h (micro-batch, sequence length and global batch
// from the preset); --config: a trainer configuration (train.micro_batch and seq_len; global batch
// parallel.micro_batches x parallel.dp x train.micro_batch; the rest of its [parallel] section is not used).
// `fp4moe plan --calibrate-p1 [--tp 1,2] [--heavy-modules M,...] [--grads fp32|bf16] [--overhead-gib G] [--top K]`:
// instead of a plan, searches the plausible 256-GPU layouts of DeepSeek-V3 671B for those whose memory estimates fit
// P1's heavy-policy numbers and prints the light policy's prediction at the best fits (trainer/memory/calibrate.h). It
// takes only those options (and --model v3, --no-measure, both implied; --tp restricts the search to tp 1 or 2;
// --heavy-modules says which recompute modules P1's "attention + layernorm + experts" means); any other is refused in
// one line.
// Exit codes: 0 done (also when nothing fits: the report says so; a measurement that fails is recorded in the cache
// and the report, its candidates keep their modelled time); 2 bad arguments, a GPU count no layout exists for, a
// --cache file that is not a stage-time table, or no GPU without --no-measure.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <unistd.h>

#include "cli/commands.h"
#include "kernels/common/check.h"
#include "results/env_info.h"
#include "results/h5_file.h"
#include "results/output_path.h"
#include "results/run_info.h"
#include "trainer/config.h"
#include "trainer/memory/calibrate.h"
#include "trainer/memory/estimate_report.h"
#include "trainer/memory/plan.h"
#include "trainer/memory/stage_measure.h"
#include "trainer/memory/stage_times.h"

namespace fp4moe::cli {

namespace {

struct PlanCommand {
  std::string model, config, out, cache = kDefaultStageTimeCache;
  int64_t gpus = 0, global_batch = 0, top = 5, measure_top = 2;
  double memory_gib = 0;
  std::vector<std::string> recipes = {"bf16", "fp8", "mxfp4"};
  std::vector<int64_t> tp_values = {1, 2, 4, 8};
  bool no_measure = false, calibrate_p1 = false;
  std::string grads = "fp32";
  double overhead_gib = 0;
  std::vector<std::string> heavy_modules;        // --heavy-modules: the calibration's reading of P1's heavy policy
  const CLI::Option* tp_opt = nullptr;           // --tp: a plan's sizes, or the calibration's subset of {1, 2}
  std::vector<const CLI::Option*> plan_only;     // options a plan takes and the calibration does not
  std::vector<const CLI::Option*> calibration_only;
  std::vector<const CLI::Option*> measure_only;  // options of the measurement, refused with --no-measure
  const CLI::Option *gpus_opt = nullptr, *memory_opt = nullptr;
  PlanHardware hw;
  double peak_tflops = hw.peak_flops / 1e12, nvlink_gb = hw.nvlink_bytes_per_s / 1e9, ib_gb = hw.ib_bytes_per_s / 1e9;

  PlanRequest request() const {
    PlanRequest r;
    if (!model.empty()) {
      const ProductionPreset p = production_preset(model);
      r.model = p.config;
      r.title = p.title;
      r.micro_batch = p.layout.micro_batch;
      r.seq_len = p.layout.seq_len;
      r.global_batch = p.global_batch;
    } else {
      r.model = plan_config_from_file(config, r.global_batch);
      const TrainerConfig& c = r.model;
      r.title = c.model.name.empty() ? config : c.model.name;
      r.micro_batch = c.train.micro_batch;
      r.seq_len = c.train.seq_len;
    }
    if (global_batch != 0) r.global_batch = global_batch;
    r.gpus = gpus;
    r.memory_gib = memory_gib;
    for (const std::string& name : recipes) {
      const Recipe recipe = parse_recipe(name, "--recipes");
      for (Recipe seen : r.recipes)
        FP4MOE_CHECK(seen != recipe, "--recipes names {} twice", name);
      r.recipes.push_back(recipe);
    }
    r.tp_values = tp_values;
    r.hw = hw;
    r.hw.peak_flops = peak_tflops * 1e12;
    r.hw.nvlink_bytes_per_s = nvlink_gb * 1e9;
    r.hw.ib_bytes_per_s = ib_gb * 1e9;
    return r;
  }

  int calibrate() {
    for (const CLI::Option* o : plan_only)
      if (o->count() > 0)
        throw CliError(fmt::format("--calibrate-p1 searches P1's 256-GPU DeepSeek-V3 layouts itself and does not take "
                                   "{} (it takes --tp, --heavy-modules, --grads, --overhead-gib, --top)",
                                   o->get_name()));
    if (!model.empty() && model != "v3")
      throw CliError(fmt::format("--calibrate-p1 calibrates DeepSeek-V3 671B (P1's 256-GPU run); --model {} is not "
                                 "calibrated (use --model v3 or leave it out)", model));
    CalibrationRequest r;
    if (tp_opt->count() > 0) {
      for (const int64_t t : tp_values)
        if (t != 1 && t != 2)
          throw CliError(fmt::format("--calibrate-p1 searches tp 1 and 2 (P1's plausible layouts); --tp {} is not "
                                     "one of them", t));
      r.tp_values = tp_values;
    }
    if (!heavy_modules.empty()) r.heavy_modules = heavy_modules;
    r.grad_bytes = grads == "bf16" ? 2 : 4;
    r.overhead_gib = overhead_gib;
    std::vector<CalibrationFit> fits;
    try {
      FP4MOE_CHECK(top >= 1, "--top must be >= 1, got {}", top);
      fits = fp4moe::calibrate_p1(r);
    } catch (const Error& err) {
      throw CliError(user_message(err.what()));
    }
    fmt::print("{}", format_calibration(fits, r, top));
    return kExitOk;
  }

  // Measures what the selected candidates need and puts the measured times into the plan (stage_times.h).
  void measure(PlanResult& result, const PlanRequest& r, StageTimeCache& cache) const {
    const std::vector<size_t> selected = candidates_to_measure(result, measure_top);
    const std::vector<StageTimeKey> keys = keys_to_measure(result, selected, r, r.measured_on);
    MeasureSettings settings;
    std::error_code ec;
    settings.exe = std::filesystem::read_symlink("/proc/self/exe", ec).string();
    if (ec) throw CliError(fmt::format("cannot find this executable (/proc/self/exe): {}", ec.message()));
    std::string dir = (std::filesystem::temp_directory_path() / "fp4moe-plan-XXXXXX").string();
    if (::mkdtemp(dir.data()) == nullptr)
      throw CliError(fmt::format("cannot create a temporary folder '{}' for the measurements", dir));
    settings.work_dir = dir;
    const auto start = std::chrono::steady_clock::now();
    const bool terminal = isatty(fileno(stderr)) != 0;
    auto bar = [&](int64_t done, int64_t total, const StageTimeKey& key) {
      constexpr int kWidth = 24;
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const int filled = static_cast<int>(kWidth * done / std::max<int64_t>(1, total));
      const std::string line =
          fmt::format("plan: measuring [{}{}] {}/{} {} ({:.0f} s)", std::string(static_cast<size_t>(filled), '#'),
                      std::string(static_cast<size_t>(kWidth - filled), '.'), done, total,
                      done == total ? std::string("done") : key.text(), elapsed);
      if (terminal) std::fprintf(stderr, "\r%-110s%s", line.c_str(), done == total ? "\n" : "");
      else std::fprintf(stderr, "%s\n", line.c_str());
    };
    const auto cached = std::count_if(keys.begin(), keys.end(), [&](const StageTimeKey& k) { return cache.find(k); });
    std::fprintf(stderr, "plan: %zu candidates to measure need %zu stage times on %s, %zu of them in %s\n",
                 selected.size(), keys.size(), r.measured_on.c_str(), static_cast<size_t>(cached), cache.path().c_str());
    // The measurements' folder goes whatever ends them.
    struct RemoveFolder {
      const std::string& dir;
      ~RemoveFolder() {
        std::error_code ignored;
        std::filesystem::remove_all(dir, ignored);
      }
    } remove_folder{dir};
    try {
      measure_stage_times(r.model, keys, cache, settings,
                          [&](const TrainerConfig& cfg, const std::string& name) {
                            return run_stage_measurement(cfg, settings, name);
                          },
                          bar);
      apply_measured_times(result, selected, r, cache, r.measured_on);
    } catch (const Error& err) {
      throw CliError(user_message(err.what()));
    }
  }

  int run() {
    for (size_t i = 0; i < tp_values.size(); ++i)
      if (std::find(tp_values.begin(), tp_values.begin() + static_cast<std::ptrdiff_t>(i), tp_values[i]) !=
          tp_values.begin() + static_cast<std::ptrdiff_t>(i))
        throw CliError(fmt::format("--tp names {} twice (each tensor-parallel size once)", tp_values[i]));
    if (calibrate_p1) return calibrate();
    for (const CLI::Option* o : calibration_only)
      if (o->count() > 0) throw CliError(fmt::format("{} applies to --calibrate-p1 only", o->get_name()));
    for (const CLI::Option* o : {gpus_opt, memory_opt})
      if (o->count() == 0) throw CliError(fmt::format("{} is required (unless --calibrate-p1)", o->get_name()));
    if (model.empty() == config.empty()) throw CliError("name the model with one of --model v3|v2 or --config FILE");
    for (const CLI::Option* o : measure_only)
      if (no_measure && o->count() > 0)
        throw CliError(fmt::format("{} applies to the measured plan only (not with --no-measure)", o->get_name()));
    PlanRequest r;
    std::unique_ptr<StageTimeCache> times;
    try {
      r = request();
      validate_request(r);
      FP4MOE_CHECK(top >= 1, "--top must be >= 1, got {}", top);
      FP4MOE_CHECK(measure_top >= 1, "--measure-top must be >= 1, got {}", measure_top);
      if (!out.empty()) check_output_path("--out", out, {{"--config", config}});
      if (!no_measure) {
        check_output_path("--cache", cache, {{"--config", config}, {"--out", out}}, OutputFolder::may_be_created);
        times = std::make_unique<StageTimeCache>(StageTimeCache::load(cache));
      }
    } catch (const Error& err) {
      throw CliError(user_message(err.what()));
    }
    if (!no_measure) {
      const EnvInfo env = query_env_info();
      if (env.gpus.empty()) throw CliError(fmt::format("no GPU: use --no-measure ({})", env.no_gpu_reason));
      r.measured_on = env.gpus.front().name;
    }
    if (enumerate_layouts(r).empty()) throw CliError(explain_no_layout(r));
    const auto start = std::chrono::steady_clock::now();
    const bool terminal = isatty(fileno(stderr)) != 0;
    bool shown = false;
    auto progress = [&](int64_t done, int64_t total) {
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (elapsed < 1.0 && !shown) return;
      if (!terminal && done != total && done % std::max<int64_t>(1, total / 10) != 0) return;  // every 10%
      shown = true;
      std::fprintf(stderr, "%splan: %lld/%lld layouts x policies estimated (%.0f s)%s",
                   terminal ? "\r" : "", static_cast<long long>(done), static_cast<long long>(total), elapsed,
                   terminal ? "" : "\n");
      if (terminal && done == total) std::fputc('\n', stderr);
    };
    PlanResult result = plan_layouts(r, progress);
    if (times) measure(result, r, *times);
    fmt::print("{}", format_plan(result, r, top));
    if (!out.empty()) {
      ResultFile file;
      fill_root_attributes(file, invocation());
      file.add_table("/plan/candidates", plan_table(result, r));
      file.write(out);
      std::fprintf(stderr, "plan: %zu candidates written to %s (/plan/candidates)\n", result.all.size(), out.c_str());
    }
    return kExitOk;
  }
};

}  // namespace

Command add_plan_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand(
      "plan", "rank the parallel layouts and recompute policies that fit a GPU count and memory, per recipe");
  auto cmd = std::make_shared<PlanCommand>();
  sub->add_option("--model", cmd->model, "production shape: v3 (DeepSeek-V3 671B) or v2 (DeepSeek-V2 236B)")
      ->check(CLI::IsMember({"v3", "v2"}));
  sub->add_option("--config", cmd->config, "a trainer configuration (TOML) instead of --model");
  cmd->gpus_opt = sub->add_option("--gpus", cmd->gpus, "GPUs of the run (required for a plan)");
  cmd->memory_opt = sub->add_option("--memory-gib", cmd->memory_gib, "memory per GPU, GiB (required for a plan)");
  sub->add_option("--recipes", cmd->recipes, "paper recipes to plan, comma-separated: bf16, fp8, mxfp4")
      ->delimiter(',')
      ->capture_default_str();
  cmd->tp_opt = sub->add_option("--tp", cmd->tp_values, "tensor-parallel sizes to try, comma-separated, of 1, 2, 4, 8")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_flag("--no-measure", cmd->no_measure,
                "model every stage's compute time instead of measuring it on the local GPU (no GPU needed)");
  sub->add_option("--mfu", cmd->hw.mfu, "assumed model-FLOPs utilisation of the peak (see trainer/memory/plan.h)")
      ->capture_default_str();
  sub->add_option("--peak-tflops", cmd->peak_tflops, "peak TFLOP/s per GPU (989: H100/H200 SXM dense BF16)")
      ->capture_default_str();
  sub->add_option("--nvlink-gb-per-s", cmd->nvlink_gb, "NVLink GB/s per GPU per direction (450: NVLink 4)")
      ->capture_default_str();
  sub->add_option("--ib-gb-per-s", cmd->ib_gb, "InfiniBand GB/s per GPU per direction (50: NDR 400 Gb/s)")
      ->capture_default_str();
  sub->add_option("--gpus-per-node", cmd->hw.gpus_per_node, "GPUs per NVLink node")->capture_default_str();
  sub->add_option("--global-batch", cmd->global_batch,
                  "sequences per optimizer step (default: the preset's, or the configuration's)");
  sub->add_option("--top", cmd->top, "layouts shown per recipe")->capture_default_str();
  sub->add_option("--out", cmd->out, "also write every candidate to this HDF5 file (/plan/candidates)");
  cmd->measure_only.push_back(
      sub->add_option("--measure-top", cmd->measure_top,
                      "measure each recipe's first K candidates (and the best of each recompute policy)")
          ->capture_default_str());
  cmd->measure_only.push_back(
      sub->add_option("--cache", cmd->cache, "table of measured stage times, read and extended")->capture_default_str());
  for (const CLI::Option* o : sub->get_options())
    if (o != sub->get_help_ptr() && o->get_name() != "--model" && o->get_name() != "--top" &&
        o->get_name() != "--no-measure" && o->get_name() != "--tp")
      cmd->plan_only.push_back(o);
  sub->add_flag("--calibrate-p1", cmd->calibrate_p1,
                "instead of a plan: fit DeepSeek-V3 671B layouts of 256 GPUs to P1's memory numbers "
                "(trainer/memory/calibrate.h)");
  cmd->calibration_only.push_back(
      sub->add_option("--grads", cmd->grads, "--calibrate-p1: gradient precision, fp32 (as the trainer) or bf16")
          ->check(CLI::IsMember({"fp32", "bf16"}))
          ->capture_default_str());
  cmd->calibration_only.push_back(
      sub->add_option("--heavy-modules", cmd->heavy_modules,
                      "--calibrate-p1: recompute modules read for P1's \"attention + layernorm + experts\" "
                      "(default core_attn,layernorm,moe; mla_up_proj,core_attn,layernorm,moe reads \"attention\" as "
                      "the whole MLA above its down-projections)")
          ->delimiter(','));
  cmd->calibration_only.push_back(
      sub->add_option("--overhead-gib", cmd->overhead_gib,
                      "--calibrate-p1: framework overhead added to every estimate, GiB")
          ->capture_default_str());
  return {sub, [cmd] { return cmd->run(); }};
}

}  // namespace fp4moe::cli
