// The metrics of a training run in its HDF5 result file (DESIGN.md "Results"), kept in memory and rewritten whole
// (atomically, through results/h5_file.h) at every evaluation, every checkpoint and at the end:
//
//   /                      root attributes (results/run_info.h: schema_version, git_sha, date, gpu, driver, cuda,
//                          cublaslt, nccl, host, command)
//   /train/<run>           the configuration as attributes (train_run_attributes), an empty `columns` list
//   /train/<run>/steps     one row per optimizer step: step, tokens, loss, lr, grad_norm, tokens_per_s, mfu,
//                          peak_act_gib, peak_total_gib, skipped, all_to_all_sent_bytes, all_to_all_received_bytes,
//                          all_to_all_to_self_bytes, all_to_all_ms (StepRecord)
//   /train/<run>/eval      one row per evaluation: step, tokens, val_loss, val_tokens (EvalRecord)
//   /train/<run>/profile   with --profile only: the step profile per step range (trainer/train/step_profile.h):
//                          range, first_step, last_step, steps, module, pass, ms_per_step, share, calls_per_step
//   /memory/<run>          per-category peaks of the device allocator: category (weights, grads, optimizer,
//                          activations, comm, workspace, total), peak_bytes, peak_gib; attribute budget_bytes, and
//                          for a model with MoE layers the dispatch_* attributes (set_dispatch_attributes)
//
// GiB are 2^30 bytes. A run resumed from a checkpoint can carry the rows of an earlier file of the same run up to
// the checkpoint's step (load_previous), so one file holds the whole curve; the profile covers the steps this run
// ran (an earlier file's is not carried).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "results/env_info.h"
#include "results/table.h"
#include "trainer/config.h"
#include "trainer/memory/device_memory.h"
#include "trainer/memory/estimate.h"

namespace fp4moe {

struct DispatchBytes;  // trainer/model/moe_experts.h

// One row of /train/<run>/steps.
struct StepRecord {
  int64_t step = 0;           // the optimizer step just completed, 1-based
  int64_t tokens = 0;         // training tokens consumed up to and including this step (whole run)
  double loss = 0;            // mean over the step's micro-batches of their mean cross-entropy (nats/token)
  double lr = 0;              // learning rate of this step (trainer/train/schedule.h)
  double grad_norm = 0;       // global L2 norm of the gradient before clipping
  double tokens_per_s = 0;    // this step's tokens / its wall time, per GPU
  double mfu = 0;             // model FLOPs utilization of the step, 0..1 (trainer/flops.h)
  double peak_act_gib = 0;    // peak of MemCategory::activations during the step
  double peak_total_gib = 0;  // peak of all categories during the step
  int64_t skipped = 0;        // steps skipped so far in the whole run, this one included (step - updates applied):
                              // a step was skipped (non-finite loss or gradient norm, policy skip) when it grew
  // The step's expert-parallel all-to-all as the writing rank (rank 0 over ranks) saw it: over every MoE layer's
  // exchanges, forward and backward (Model::take_exchange_totals), the bytes sent to the other ranks, received from
  // them and copied to itself, and the exchanges' CUDA-event time. On one GPU without a transport no exchange is
  // made: all four are 0. At world size 1 (`fp4moe launch --gpus 1`) every byte is to_self (a local copy), sent and
  // received 0. Files written before these columns existed read back as 0.
  int64_t all_to_all_sent_bytes = 0, all_to_all_received_bytes = 0, all_to_all_to_self_bytes = 0;
  double all_to_all_ms = 0;
};

// One row of /train/<run>/eval.
struct EvalRecord {
  int64_t step = 0;      // steps completed when it ran
  int64_t tokens = 0;    // training tokens consumed by then
  double val_loss = 0;   // mean cross-entropy per token over the validation tokens evaluated
  int64_t val_tokens = 0;  // validation tokens evaluated (targets): eval_steps x B x T periodically, the whole
                           // split (or final_eval_steps batches) at the end; 0 in files written before it was kept
};

// Per-category peaks of a DeviceMemory over a whole run (bytes).
struct MemoryPeaks {
  std::array<size_t, kMemCategories> peak{};
  size_t peak_total = 0;
  size_t budget = 0;  // 0: none
  // peak := max(peak, mem's peaks since its last reset_peaks); budget := mem's.
  void merge(const DeviceMemory& mem);
};

// The emulated layout's attributes of /train/<run> (trainer/model/model.h, trainer/train/trainer.h), int64:
// parallel.tp, parallel.pp, parallel.dp, parallel.ep, parallel.micro_batches, parallel.zero1 (0 or 1), the stage
// this GPU ran (stage, stage.first_layer, stage.layers) and loss_absent (1 on a stage without the LM head, whose
// steps' loss column holds NaN: no loss, not a divergence; else 0). Empty when cfg emulates no layout (one GPU).
Attributes layout_attributes(const TrainerConfig& cfg, const PipelineStage& stage);

// The configuration as attributes of /train/<run>: model_config_text and model_config_hash (16 hex digits) of
// trainer/config.h, model.name, every train.* setting (numbers as int64/float64, train.seed as int64 when it fits,
// else as decimal text; train.non_finite as text), train.tokens_per_step and recompute.modules (space-separated,
// "none" when empty).
Attributes train_run_attributes(const TrainerConfig& cfg);

// The text a checkpoint keeps for provenance: model_config_text, then one `key = value` line per train.* setting
// and recompute.modules (the attributes above).
std::string train_config_text(const TrainerConfig& cfg);

// Throws fp4moe::Error unless `run` can name an HDF5 group: non-empty, no '/', not "." or "..".
void check_run_name(const std::string& run);

class TrainMetrics {
 public:
  // run: the group name under /train and /memory (check_run_name). attributes: those of /train/<run>.
  // command and env: the root attributes.
  TrainMetrics(std::string run, Attributes attributes, std::string command, EnvInfo env);

  // Rejects (fp4moe::Error) a step not above the last row's.
  void add_step(const StepRecord& r);
  void add_eval(const EvalRecord& r);
  void set_memory(const MemoryPeaks& m) { memory_ = m; }
  // The table /train/<run>/profile (StepProfile::table); none is written until this is called.
  void set_profile(Table profile) { profile_ = std::move(profile); has_profile_ = true; }
  void set_attribute(const std::string& name, Value v);          // of /train/<run>
  void set_memory_attribute(const std::string& name, Value v);   // of /memory/<run> (not "budget_bytes")

  const std::vector<StepRecord>& steps() const { return steps_; }
  const std::vector<EvalRecord>& evals() const { return evals_; }

  // Takes the rows with step <= up_to_step of /train/<run>/steps and /eval from an existing result file (before
  // any row was added here). A file without this run's tables adds nothing. Throws fp4moe::Error for a file that
  // is not HDF5, or columns missing or of different lengths, naming the file.
  void load_previous(const std::string& path, int64_t up_to_step);

  // Writes the whole file atomically (results/h5_file.h; an existing file is replaced). Throws fp4moe::Error.
  void write(const std::string& path) const;

 private:
  std::string run_;
  Attributes attributes_;
  std::string command_;
  EnvInfo env_;
  std::vector<StepRecord> steps_;
  std::vector<EvalRecord> evals_;
  MemoryPeaks memory_;
  Attributes memory_attributes_;
  Table profile_;
  bool has_profile_ = false;
};

// The expert dispatch payload of a model's MoE layers (Model::dispatch_bytes: one DispatchBytes per MoE layer,
// trainer/model/moe_experts.h) as attributes of /memory/<run>, for the reproduction suite's comm_volume scenario:
//   dispatch_recipe                    recipe.routed_experts (text)
//   dispatch_hidden, dispatch_top_k    model.hidden, moe.top_k
//   dispatch_moe_layers                number of MoE layers
//   dispatch_payload_bytes_per_token   element bytes per routed token and MoE layer (float64)
//   dispatch_scale_bytes_per_token     block-scale bytes per routed token and MoE layer (float64)
//   dispatch_bytes_per_token           their sum
//   dispatch_bytes_per_step            dispatch_bytes_per_token x train.tokens_per_step x top_k x MoE layers
// Sets nothing for an empty `layers` (a dense model). Rejects (fp4moe::Error) layers whose counts differ: every
// MoE layer of a model has one shape and one recipe.
void set_dispatch_attributes(TrainMetrics& metrics, const TrainerConfig& cfg, const std::vector<DispatchBytes>& layers);

}  // namespace fp4moe
