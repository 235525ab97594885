// `fp4moe train --config FILE [--section.key VALUE ...] [run options]`: trains the reference MoE model
// (trainer/train/trainer.h). The configuration (trainer/config.h: a TOML file, any key overridable as
// --section.key) and the token shards' headers are validated before anything is allocated; then the run writes its
// metrics to an HDF5 file (trainer/train/metrics.h), prints progress, evaluates and checkpoints as configured.
// The options (trainer/train/command_line.h):
//   --data DIR, --out FILE.h5 (default runs/train-<config name>-<UTC date-time>.h5), --overwrite, --run NAME,
//   --resume PATH|latest, --log-interval N, --synthetic-data, --peak-tflops X, --memory-budget GiB,
//   --profile [--profile-warmup N], --dry-run [--no-data-check] [--production v3|v2]
// --profile times each module's forward, backward and recompute and the optimizer step with CUDA events
// (trainer/model/profile.h) and writes the table per log interval and after the warm-up to the result file
// (/train/<run>/profile, trainer/train/step_profile.h); the run's table is printed before the last line.
// --dry-run prints the model summary (shapes, parameters total and activated per token, model FLOPs per token,
// tokens per step) and the memory estimate of one GPU of the configuration's [parallel] layout (trainer/config.h;
// one GPU without the section; trainer/memory/estimate.h), and exits
// 0 without a GPU; --no-data-check leaves the shards out of it (for shapes no local data fits, such as
// DeepSeek-V3's production vocabulary of 129280). --production v3|v2 adds the estimate of the production run
// (DeepSeek-V3 671B on 256 GPUs, DeepSeek-V2 236B on 128 GPUs: trainer/memory/estimate_report.h) under this
// configuration's recipe and recompute policy, and paper 1's policies x recipes table.
// Training runs on one GPU; with a [parallel] section of more than one GPU it runs ONE GPU of that layout, emulated
// (its pipeline stage, its share of the experts and the communication buffers: trainer/model/model.h, trainer.h);
// tp > 1 is estimated only (--dry-run); with pp > 1 or ep > 1 there are no checkpoints and no
// --resume, and no evaluation on a stage without the LM head (check_trainable, one line, exit 2).
// Under `fp4moe launch` training reads the rank environment (trainer/comm/rank_env.h; a malformed one is refused with
// one line, exit 2) and runs as one rank of an expert- and data-parallel group over NCCL (trainer/train/trainer.h):
// each rank its own micro-batches, the routed experts split over the ranks, rank 0 alone writing the result file and
// the log, every rank its routed experts' shard of a checkpoint and rank 0 the rest (param_checkpoint.h); refused
// (exit 2): a [parallel] section (an emulated layout). World size 1 under the launcher runs over a real NCCL
// communicator of one rank and checkpoints as one GPU. --dry-run does not read the rank environment.
// Exit codes: 0 done; 2 a bad configuration, option or input, or no CUDA device (one line, before any
// allocation); 1 a failure while training (an allocation over --memory-budget with the allocator's report, a
// non-finite step under train.non_finite = stop, CUDA or I/O errors); 128 + the signal number after a SIGINT or
// SIGTERM, once the current step, a checkpoint (with train.checkpoint_dir) and the metrics file are written.
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <stdexcept>

#include "cli/commands.h"
#include "kernels/common/check.h"
#include "results/env_info.h"
#include "trainer/comm/rank_env.h"
#include "trainer/config.h"
#include "trainer/data/loader.h"
#include "trainer/flops.h"
#include "trainer/memory/estimate.h"
#include "trainer/memory/estimate_report.h"
#include "trainer/train/command_line.h"
#include "trainer/train/trainer.h"

namespace fp4moe::cli {

namespace {

std::string si(double v) {
  if (v >= 1e12) return fmt::format("{:.2f}T", v / 1e12);
  if (v >= 1e9) return fmt::format("{:.2f}B", v / 1e9);
  if (v >= 1e6) return fmt::format("{:.2f}M", v / 1e6);
  if (v >= 1e3) return fmt::format("{:.2f}K", v / 1e3);
  return fmt::format("{:.0f}", v);
}

// data: "checked" (the shards' headers were read), "synthetic" (--synthetic-data) or "unchecked" (--no-data-check).
void print_summary(const TrainerConfig& cfg, const std::string& config_path, const std::string& data) {
  const ModelConfig& m = cfg.model;
  const MoeConfig& e = cfg.moe;
  const TrainingConfig& t = cfg.train;
  const ParameterCounts p = count_parameters(cfg);
  const FlopsPerToken f = model_flops_per_token(cfg, t.seq_len);
  const int64_t moe_layers = m.layers - m.n_dense_layers;

  fmt::print("dry run of {} (nothing allocated)\n", config_path.empty() ? "the command-line configuration" : config_path);
  fmt::print("model: {}\n", m.name.empty() ? "(unnamed)" : m.name);
  fmt::print("shape: vocab {}, hidden {}, layers {} ({} dense, {} MoE), heads {}, q_lora_rank {}, kv_lora_rank {}, "
             "qk head dim {}+{} (nope+rope), v head dim {}\n",
             m.vocab_size, m.hidden, m.layers, m.n_dense_layers, moe_layers, m.heads, m.q_lora_rank, m.kv_lora_rank,
             m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim);
  if (m.n_dense_layers > 0) fmt::print("dense ffn: {}\n", m.dense_ffn);
  if (moe_layers > 0)
    fmt::print("moe: {} routed experts, top-{}, {} shared, expert ffn {}, router {} (routed_scale {})\n",
               e.routed_experts, e.top_k, e.shared_experts, e.expert_ffn,
               e.router == RouterStyle::v2_softmax ? "v2 softmax" : "v3 sigmoid", e.routed_scale);
  fmt::print("recipe: attention {}, dense_mlp {}, shared_experts {}, routed_experts {}\n",
             recipe_name(cfg.recipe.attention), recipe_name(cfg.recipe.dense_mlp),
             recipe_name(cfg.recipe.shared_experts), recipe_name(cfg.recipe.routed_experts));
  fmt::print("attention core: {}{}\n", attention_backend_name(m.attention_backend),
             m.attention_backend == AttentionBackend::own
                 ? " (our kernels)"
                 : fmt::format(" ({} backward; cuDNN's plans and workspace are resolved on the device)",
                               m.attention_deterministic ? "deterministic" : "non-deterministic"));
  fmt::print("recompute: {}\n",
             cfg.recompute.modules.empty() ? std::string("none") : fmt::format("{}", fmt::join(cfg.recompute.modules, " ")));
  fmt::print("parameters total: {} ({})\n", p.total, si(static_cast<double>(p.total)));
  fmt::print("parameters activated per token: {} ({})\n", p.activated, si(static_cast<double>(p.activated)));
  fmt::print("parameters by part: embedding {}, attention {}, norms {}, dense ffn {}, router {}, routed experts {}, "
             "shared experts {}, lm head {}\n",
             si(p.embedding), si(p.attention), si(p.norms), si(p.dense_ffn), si(p.router), si(p.routed_experts),
             si(p.shared_experts), si(p.lm_head));
  fmt::print("model flops per token (seq_len {}, causal): forward {:.4g}, training 3x {:.4g} (attention {:.1f}%)\n",
             t.seq_len, f.forward, f.training, 100.0 * f.attention / f.forward);
  fmt::print("tokens per step: {} (seq_len {} x micro_batch {} x grad_accum {})\n", t.tokens_per_step(), t.seq_len,
             t.micro_batch, t.grad_accum);
  fmt::print("schedule: {} steps ({} tokens), lr {:g}, warm-up {} steps, cosine to {:g}, weight decay {:g}\n",
             t.steps, si(static_cast<double>(t.steps * t.tokens_per_step())), t.lr, t.warmup_steps, t.min_lr,
             t.weight_decay);
  if (data == "synthetic") {
    fmt::print("data: synthetic tokens (--synthetic-data; {} not used)\n", t.data_dir);
    return;
  }
  if (data != "checked") {
    fmt::print("data: {} (not checked: --no-data-check)\n", t.data_dir);
    return;
  }
  const size_t train_shards = find_token_shards(t.data_dir, "train").size();
  fmt::print("data: {} ({} train shards{}, vocabulary {} checked)\n", t.data_dir, train_shards,
             t.eval_interval > 0 ? fmt::format(", {} val shards", find_token_shards(t.data_dir, "val").size()) : "",
             m.vocab_size);
}

// The memory estimate of the configuration's [parallel] layout (one GPU without the section) and, for a production
// preset ("v3", "v2"; "" for none), on its layout.
void print_memory_estimate(const TrainerConfig& cfg, const std::string& production) {
  fmt::print("{}", format_memory_estimate(estimate_memory(cfg), cfg));
  if (production.empty()) return;
  const ProductionPreset preset = production_preset(production);
  const TrainerConfig prod = with_production_shape(cfg, preset);
  fmt::print("{}", format_memory_estimate(estimate_memory(prod, preset.layout), prod));
  fmt::print("{}", format_paper_policy_table(paper_policy_table(preset), preset));
}

struct TrainCommand {
  std::unique_ptr<TrainCommandLine> line;
  std::string production;  // --production: "v3", "v2" or ""

  int run() {
    try {
      line->resolve();
    } catch (const Error& err) {
      throw CliError(user_message(err.what()));
    }
    const TrainerConfig& cfg = line->config();
    if (!production.empty() && !line->dry_run()) throw CliError("--production applies to --dry-run only");
    if (line->dry_run()) {
      print_summary(cfg, line->config_path(),
                    line->options().synthetic_data ? "synthetic" : line->no_data_check() ? "unchecked" : "checked");
      print_memory_estimate(cfg, production);
      return kExitOk;
    }
    TrainerOptions opts = line->options();
    try {
      const RankEnv ranks = read_rank_env(process_env());
      if (ranks.launched) opts.ranks = ranks;  // under `fp4moe launch`: one rank of the group, even of one
      check_trainable(cfg, opts);  // what an emulated [parallel] layout or the ranks do not support
    } catch (const Error& err) {
      throw CliError(user_message(err.what()));
    }
    const std::string no_gpu = why_no_cuda_device();
    if (!no_gpu.empty())
      throw CliError(fmt::format("{}: training needs one (--dry-run works without)", no_gpu));

    opts.command = invocation();
    TrainResult result;
    try {
      Trainer trainer(cfg, opts);
      result = trainer.run();
    } catch (const Error& err) {
      throw std::runtime_error(user_message(err.what()));
    }
    if (result.stop_signal == 0) return kExitOk;
    const std::string resume =
        result.last_checkpoint.empty()
            ? std::string("no train.checkpoint_dir was set, so the run cannot be resumed")
            : fmt::format("continue with --resume {}", result.last_checkpoint);
    std::fprintf(stderr, "fp4moe train: interrupted after step %lld of %lld; %s\n",
                 static_cast<long long>(result.step), static_cast<long long>(cfg.train.steps), resume.c_str());
    return 128 + result.stop_signal;
  }
};

}  // namespace

Command add_train_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("train", "train the reference MoE model from a TOML configuration (configs/)");
  auto cmd = std::make_shared<TrainCommand>();
  cmd->line = std::make_unique<TrainCommandLine>(*sub);
  sub->add_option("--production", cmd->production,
                  "with --dry-run: also estimate the memory of a production run (v3: DeepSeek-V3 671B on 256 GPUs, "
                  "v2: DeepSeek-V2 236B on 128 GPUs)")
      ->check(CLI::IsMember({"v3", "v2"}));
  return {sub, [cmd] { return cmd->run(); }};
}

}  // namespace fp4moe::cli
