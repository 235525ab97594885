// The training loop of the reference trainer (DESIGN.md "Trainer"): drives a Model (trainer/model/model.h) over
// batches of token shards or synthetic tokens, with AdamW, the learning-rate schedule, evaluation, metrics,
// progress, checkpoints and resumption. `fp4moe train` (cli/cmd_train.cpp) is a thin layer over it.
//
// One optimizer step s (1-based; B = train.micro_batch, T = train.seq_len):
//   1. Zero the grads. train.grad_accum micro-batches in the 1F1B order of the model's pipeline stage
//      (trainer/train/pipeline_schedule.h; one GPU: forward, backward, forward, backward, ...): each forward takes
//      the next [B, T+1] rows -> tokens and targets [B*T] (split_rows, trainer/train/batch.h) through a pinned host
//      buffer to the device and runs Model::forward_in_slot in the schedule's activation slot; each backward runs
//      Model::backward_in_slot(grad_scale = 1 / grad_accum) of its micro-batch's slot. The step's loss is the mean
//      of the micro-batch losses.
//   2. The global gradient norm over every Param's grad and the clip scale (grad_global_norm,
//      kernels/nn/adamw.h, with max_norm = train.grad_clip, or +Inf when it is 0: no clipping).
//   3. If the loss or the norm is not finite, train.non_finite decides: `skip` applies no update (the step still
//      counts; the row's skipped count grows and a line is printed); `stop` writes a checkpoint of the state after step
//      s - 1 (when train.checkpoint_dir is set) and the metrics file, then throws fp4moe::Error naming step s.
//      Otherwise adamw_step on every Param's shard (trainer/train/optimizer_step.h: the whole tensor, or this GPU's
//      ZeRO-1 shard under parallel.zero1): lr = learning_rate(train, s) (trainer/train/schedule.h), weight decay
//      train.weight_decay where Param::decay and 0 elsewhere, bias corrections from the 1-based count of updates
//      applied so far, the device clip scale as grad_scale; then Model::end_step().
//   4. A row of metrics (trainer/train/metrics.h). Every train.eval_interval steps an evaluation; every
//      train.checkpoint_interval steps a checkpoint (train.checkpoint_dir/step_<8 digits>.ckpt); after either,
//      the metrics file. A SIGINT or SIGTERM (options.handle_signals) ends the run after the current step; over
//      ranks after the step whose loss all-reduce first carries it (below): one received after that all-reduce (in
//      the update, an evaluation or a checkpoint) ends the run after the next step.
// At the end (and when stopped by a signal): the final evaluation when eval_interval > 0 (not after a signal; it
// replaces the periodic one of the last step), a checkpoint when checkpoint_dir is set and the last step had none,
// the metrics file.
//
// train.cuda_graph (trainer/train/step_graph.h): part 1 of a step first draws all its micro-batches into the pinned
// staging (their tokens and targets checked on the host: check_batch_ids, model.h), then the StepGraph queues the
// passes (eagerly, captured or replayed) and the host waits for them and reads the losses; parts 2 to 4 as above.
//
// Evaluation, forward only: the validation batches (val shards in file order, or the synthetic validation stream)
// are reset, so every periodic evaluation of every run (any seed, any recipe) sees the same first eval_steps
// batches of B rows. The final evaluation sees every window of the val shards once, in file order (B at a time, the
// last group shorter; train.final_eval_steps = N > 0: the first N batches instead; synthetic data, which has no
// end: eval_steps batches). val_loss is the mean cross-entropy per token over the windows evaluated (batch means
// weighted by their rows); val_tokens (the eval table's column) is how many tokens that was.
//
// Checkpoints hold the tensors of trainer/train/param_checkpoint.h and CheckpointState: model_config_hash, the
// step, the optimizer steps (updates applied), the tokens seen, the RNG state (the synthetic stream's position),
// the data loader's state and train_config_text; none under ZeRO-1 (require_whole_optimizer_state). Resuming
// (options.resume_path) restores all of it instead of init_weights, so that the steps after the checkpoint give
// bitwise the losses of an uninterrupted run (the model is deterministic). Over W >= 2 ranks a checkpoint is
// save_ranks_checkpoint's (param_checkpoint.h): every rank writes its routed experts to its shard
// (step_<8 digits>.rank_<r>_of_<W>.ckpt), then rank 0 the replicated state (step_<8 digits>.ckpt, the file --resume
// takes) once every shard is written; resuming (load_ranks_checkpoint) needs the same world size and every shard
// of that write; train.checkpoint_dir must be a folder every rank sees. When options.out_path already exists
// (and options.replace_out is false), its rows of this run up to the checkpoint's step are carried into the new
// file.
//
// Emulated layout (a [parallel] section of more than one GPU or ep > 1, trainer/model/model.h): the loop trains one
// GPU's pipeline stage with its share of the experts. A stage without the LM head has no loss: its step rows hold
// NaN for it (the file's attribute loss_absent = 1 says so) and steps are skipped or stopped on the gradient norm
// alone. tokens_per_s counts the tokens this GPU's stage processes in the step (B T grad_accum) and mfu the stage's
// training FLOPs (its layers, and the LM head on the last stage). The file's attributes record the layout and the
// stage (layout_attributes, metrics.h). check_trainable rejects what such a run does not support.
//
// Ranks (options.ranks: `fp4moe train` under `fp4moe launch`; DESIGN.md "Expert parallelism"): the Trainer builds an
// NcclTransport from the rank environment (before its stream: the communicator makes the rank's device current;
// tests bring simulated ranks' transport in options.transport instead) and the Model over it: W-way expert and data parallel, every rank its own micro-batches. Rank r takes of each W
// consecutive batches of the source the r-th (rank-strided; every rank reads all W, so their sources stay at one
// position). In step 2: the loss is the mean of the ranks' (an FP32 all-reduce, which also carries the stop signals
// every rank has received: any rank's stops every rank after that step), Model::reduce_gradients sums the
// replicated gradients, GradNorm takes the group's norm (the same on every rank: the same skip / stop decision).
// The row's `tokens` counts the group's tokens, tokens_per_s and mfu one GPU's; an evaluation of N batches averages
// the ranks' val losses (each rank its own rank-strided batches; val_tokens the group's); one of the whole split
// gives each rank of every W groups of B windows the rank-th (ValidationWindows::next_share; a rank left without
// windows in the last pass runs a forward it does not count) and sums loss x windows and windows over the ranks.
// Rank 0 alone writes the result file and logs: every step's row holds its all-to-all bytes and the exchanges'
// time (Model::take_exchange_totals; the all_to_all_* columns of metrics.h, an evaluation's exchanges left out),
// and every log_interval steps it prints them in a line. check_trainable lists what is refused over ranks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trainer/config.h"
#include "trainer/memory/device_memory.h"
#include "trainer/train/metrics.h"
#include "trainer/train/options.h"
#include "trainer/train/step_profile.h"

namespace fp4moe {

class Model;

// Rejects (fp4moe::Error, one line naming the option), before anything is allocated, what training cfg with
// `options` cannot do: check_emulated_layout's (model.h: parallel.tp > 1); over options.ranks, check_ranks_config's
// (model.h: a [parallel] layout, routed experts that do not split over the ranks); options.ranks with
// options.transport; with pp > 1 or ep > 1 (the GPU holds a stage or an expert share, not the whole model)
// checkpoints (train.checkpoint_dir set) and options.resume_path; train.eval_interval > 0 on a stage without the LM
// head (no loss to evaluate); periodic evaluations of the whole validation split (train.eval_steps = 0) on synthetic
// data, which has none; train.cuda_graph's (config.h). ZeRO-1's own
// rule on checkpoints is require_whole_optimizer_state's. Validates cfg first (validate_config).
void check_trainable(const TrainerConfig& cfg, const TrainerOptions& options);

// What run() did.
struct TrainResult {
  int64_t start_step = 0;       // steps completed before this run (the checkpoint's step; 0 for a fresh start)
  int64_t step = 0;             // steps completed when it ended
  int64_t optimizer_steps = 0;  // updates applied in total (step minus all skipped steps)
  int64_t tokens = 0;           // training tokens consumed in total
  int64_t skipped = 0;          // steps skipped in this run
  std::vector<StepRecord> steps;  // this run's steps (not rows carried over from an earlier file)
  std::vector<EvalRecord> evals;  // this run's evaluations
  int stop_signal = 0;          // the SIGINT/SIGTERM that ended the run early; 0 when it reached train.steps
  std::string last_checkpoint;  // the last checkpoint written, "" when none
  std::vector<ProfileRow> profile;  // with options.profile: the step profile's rows (StepProfile::rows); else empty
  int64_t graph_captures = 0;   // train.cuda_graph: the steps captured in a CUDA graph (StepGraph::captures)
  int64_t graph_replays = 0;    // train.cuda_graph: the steps that replayed a captured graph (StepGraph::replays)
};

class Trainer {
 public:
  // Checks everything that can be checked without a device first: validate_config, no train.checkpoint_dir or
  // resume_path under ZeRO-1 (require_whole_optimizer_state), validate_data (unless
  // options.synthetic_data), the options (log_interval >= 1, peak_flops > 0, the run name, an existing
  // resume_path, an out_path that check_output_path of results/output_path.h accepts: a new path or a regular file,
  // neither config_path nor resume_path), the shards' payloads (DataLoader), a CUDA device. Then creates the output
  // and checkpoint folders, the stream, the DeviceMemory (options.memory_budget_bytes), the Model and the batch
  // buffers, and initialises the weights from train.seed or restores options.resume_path. Throws fp4moe::Error; an
  // allocation over the budget throws with the allocator's report.
  Trainer(const TrainerConfig& cfg, const TrainerOptions& options);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Trains up to train.steps (from the restored step when resuming). Throws fp4moe::Error as described above
  // (non-finite step under `stop`) and for CUDA or I/O failures. Call once.
  TrainResult run();

  Model& model();
  const DeviceMemory& memory() const;
  int64_t step() const;  // steps completed

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace fp4moe
