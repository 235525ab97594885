// The Trainer's evaluation, checkpoints, resumption and metrics file (documented in trainer/train/trainer.h).
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <vector>

#include "kernels/common/check.h"
#include "trainer/checkpoint.h"
#include "trainer/train/param_checkpoint.h"
#include "trainer/train/trainer_state.h"

namespace fp4moe {

void Trainer::State::evaluate(bool final_evaluation) {
  const TrainingConfig& t = cfg.train;
  std::vector<double> losses;
  std::vector<int64_t> batch_rows;
  const bool whole_split = (final_evaluation ? t.final_eval_steps : t.eval_steps) == 0 && val_split;
  if (whole_split) {
    val_split->reset();
    // Over W ranks of each W groups of B windows the rank-th. A rank whose group is empty at the end still runs the
    // pass's forward (its exchanges are collective), on one row of `rows` (earlier tokens), and counts none of it.
    for (int64_t n; (n = val_split->next_share(rows, other_rows, B, rank, world)) >= 0;) {
      upload_rows(std::max<int64_t>(n, 1));
      const double loss = model->forward(tokens.data(), targets.data(), std::max<int64_t>(n, 1)).loss;
      if (n == 0) continue;
      losses.push_back(loss);
      batch_rows.push_back(n);
    }
  } else {
    const int64_t batches = final_evaluation && t.final_eval_steps > 0 ? t.final_eval_steps : t.eval_steps;
    val->reset();
    for (int64_t i = 0; i < batches; ++i) {
      upload(*val);
      losses.push_back(model->forward(tokens.data(), targets.data(), B).loss);
      batch_rows.push_back(B);
    }
  }
  CUDA_CHECK(cudaStreamSynchronize(stream));
  run_peaks.merge(*mem);
  int64_t windows = 0;
  for (const int64_t n : batch_rows) windows += n;
  double val_loss = 0;
  if (whole_split && world > 1) {  // the split's loss: the sums over the ranks of loss x windows and of windows
    double sums[2] = {0, static_cast<double>(windows)};
    for (size_t i = 0; i < losses.size(); ++i) sums[0] += losses[i] * static_cast<double>(batch_rows[i]);
    sum_over_ranks(sums);
    val_loss = sums[0] / sums[1];
    windows = static_cast<int64_t>(sums[1]);
  } else {  // over W ranks each evaluated its own batches (rank-strided, as the training batches): the ranks' mean
    val_loss = mean_over_ranks(rows_weighted_mean(losses, batch_rows));
    windows *= whole_split ? 1 : world;
  }
  const EvalRecord e{step, tokens_seen, val_loss, windows * T};
  metrics->add_eval(e);
  result.evals.push_back(e);
  last_eval_step = step;
  progress->message(fmt::format("{} at step {}: val_loss {:.4f} ({} validation tokens: {}{} windows of {} tokens)",
                                final_evaluation ? "final eval" : "eval", step, e.val_loss, e.val_tokens,
                                whole_split ? "every one of the split's " : "", windows, T));
}

std::string Trainer::State::checkpoint() {
  const std::string path =
      (std::filesystem::path(cfg.train.checkpoint_dir) / checkpoint_file_name(static_cast<uint64_t>(step))).string();
  CheckpointState st;
  st.config_hash = model_config_hash(cfg);
  st.step = static_cast<uint64_t>(step);
  st.optimizer_steps = static_cast<uint64_t>(optimizer_steps);
  st.tokens_seen = static_cast<uint64_t>(tokens_seen);
  st.rng = train->rng_state();
  st.data_loader = train->loader_state();
  st.config_text = train_config_text(cfg);
  if (world > 1)  // every rank its experts, rank 0 the rest once every rank's are written
    save_ranks_checkpoint(path, model->params(), st, *transport, *mem, stream);
  else
    save_param_checkpoint(path, model->params(), st, stream);
  last_checkpoint_step = step;
  result.last_checkpoint = path;
  write_metrics();
  progress->message(fmt::format("checkpoint at step {}: {}", step, path));
  return path;
}

void Trainer::State::restore(const std::string& path) {
  const uint64_t hash = model_config_hash(cfg);
  const CheckpointState st = world > 1 ? load_ranks_checkpoint(path, model->params(), hash, *transport, *mem, stream)
                                       : load_param_checkpoint(path, model->params(), hash, stream);
  FP4MOE_CHECK(st.step < static_cast<uint64_t>(cfg.train.steps),
               "resume: checkpoint '{}' is at step {}, not below train.steps = {}: nothing left to train", path,
               st.step, cfg.train.steps);
  FP4MOE_CHECK(st.optimizer_steps <= st.step, "resume: checkpoint '{}' counts {} updates in {} steps", path,
               st.optimizer_steps, st.step);
  train->restore(st.data_loader, st.rng);
  step = static_cast<int64_t>(st.step);
  optimizer_steps = static_cast<int64_t>(st.optimizer_steps);
  tokens_seen = static_cast<int64_t>(st.tokens_seen);
  last_checkpoint_step = step;  // the file we came from holds this state
}

void Trainer::State::write_metrics() {
  if (opts.out_path.empty()) return;
  metrics->set_memory(run_peaks);
  if (profile) metrics->set_profile(profile->table());
  metrics->write(opts.out_path);
}

}  // namespace fp4moe
