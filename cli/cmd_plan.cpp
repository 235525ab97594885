// `fp4moe plan (--model v3|v2 | --config FILE) --gpus N --memory-gib G [--recipes bf16,fp8,mxfp4] --no-measure
//  [--tp 1,2,4,8] [--mfu F] [--peak-tflops X] [--nvlink-gb-per-s B] [--ib-gb-per-s B] [--gpus-per-node K]
//  [--global-batch S] [--top K] [--out FILE.h5]`: enumerates the parallel layouts of N GPUs x paper 1's recompute policies x the recipes, keeps those
// whose memory estimate fits G GiB per GPU and ranks them by a modelled tokens/s per GPU (trainer/memory/plan.h: the
// cost model, its assumptions and their sources). Prints a Markdown table per recipe and what mxfp4 buys over fp8
// and bf16 to stdout; a progress line on stderr when the enumeration takes more than a second. --out also writes
// every candidate, fitting or not, to an HDF5 file (table /plan/candidates: trainer/memory/plan.h's plan_table;
// checked before any work, written atomically: results/output_path.h).
// --model: the production shapes of trainer/memory/estimate_report.h (micro-batch, sequence length and global batch
// from the preset); --config: a trainer configuration (train.micro_batch and seq_len; global batch
// parallel.micro_batches x parallel.dp x train.micro_batch). Measuring each stage's time on the local GPU is not
// built: without --no-measure the command says so and exits 2.
// Exit codes: 0 done (also when nothing fits: the report says so); 2 bad arguments.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <unistd.h>

#include "cli/commands.h"
#include "kernels/common/check.h"
#include "results/h5_file.h"
#include "results/output_path.h"
#include "results/run_info.h"
#include "trainer/config.h"
#include "trainer/memory/estimate_report.h"
#include "trainer/memory/plan.h"

namespace fp4moe::cli {

namespace {

struct PlanCommand {
  std::string model, config, out;
  int64_t gpus = 0, global_batch = 0, top = 5;
  double memory_gib = 0;
  std::vector<std::string> recipes = {"bf16", "fp8", "mxfp4"};
  std::vector<int64_t> tp_values = {1, 2, 4, 8};
  bool no_measure = false;
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
      r.model = parse_config_args({"--config", config});
      const TrainerConfig& c = r.model;
      r.title = c.model.name.empty() ? config : c.model.name;
      r.micro_batch = c.train.micro_batch;
      r.seq_len = c.train.seq_len;
      r.global_batch = c.parallel.micro_batches * c.parallel.dp * c.train.micro_batch;
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

  int run() {
    if (!no_measure)
      throw CliError("measuring each stage's time needs a GPU and is not built yet; run with --no-measure for the "
                     "modelled plan (no GPU needed)");
    if (model.empty() == config.empty()) throw CliError("name the model with one of --model v3|v2 or --config FILE");
    PlanRequest r;
    try {
      r = request();
      validate_request(r);
      FP4MOE_CHECK(top >= 1, "--top must be >= 1, got {}", top);
      if (!out.empty()) check_output_path("--out", out, {{"--config", config}});
    } catch (const Error& err) {
      throw CliError(user_message(err.what()));
    }
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
    const PlanResult result = plan_layouts(r, progress);
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
  sub->add_option("--gpus", cmd->gpus, "GPUs of the run")->required();
  sub->add_option("--memory-gib", cmd->memory_gib, "memory per GPU, GiB")->required();
  sub->add_option("--recipes", cmd->recipes, "paper recipes to plan, comma-separated: bf16, fp8, mxfp4")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_option("--tp", cmd->tp_values, "tensor-parallel sizes to try, comma-separated, of 1, 2, 4, 8")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_flag("--no-measure", cmd->no_measure, "model every stage's time instead of measuring it (no GPU needed)");
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
  return {sub, [cmd] { return cmd->run(); }};
}

}  // namespace fp4moe::cli
