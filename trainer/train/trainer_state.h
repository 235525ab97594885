// Private to trainer/train/trainer*.cpp: the Trainer's state, shared by the loop (trainer.cpp), the optimizer step
// (trainer_step.cpp) and evaluation, checkpoints and metrics (trainer_io.cpp).
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels/nn/adamw.h"
#include "trainer/comm/nccl_transport.h"
#include "trainer/memory/device_memory.h"
#include "trainer/model/model.h"
#include "trainer/train/batch.h"
#include "trainer/train/metrics.h"
#include "trainer/train/optimizer_step.h"
#include "trainer/train/pipeline_schedule.h"
#include "trainer/train/progress.h"
#include "trainer/train/step_graph.h"
#include "trainer/train/step_profile.h"
#include "trainer/train/trainer.h"

namespace fp4moe {

struct Trainer::State {
  using Clock = std::chrono::steady_clock;

  TrainerConfig cfg;
  TrainerOptions opts;
  std::string run_name;
  int64_t B = 0, T = 0;            // rows per micro-batch, tokens per row
  int64_t tokens_per_step = 0;     // B * T * grad_accum
  double flops_per_token = 0;      // training model FLOPs per token (trainer/flops.h)

  cudaStream_t stream = nullptr;
  cudaEvent_t uploaded = nullptr;  // recorded after the copies out of `pinned`
  int32_t* pinned = nullptr;       // host, page-locked [2 * B * T]: tokens, then targets; train.cuda_graph:
                                   // [grad_accum][2][B * T], the step's micro-batches (StepGraph::Batch)
  int rank = 0, world = 1;         // this rank of the expert- and data-parallel group (one GPU: 0 of 1)
  std::vector<int32_t> rows;       // host [B, T+1], the batch as the source gives it
  std::vector<int32_t> other_rows; // host [B, T+1], the other ranks' batches (read past, rank-strided)

  std::unique_ptr<NcclTransport> nccl;  // launched runs (opts.ranks); outlives the model
  EpTransport* transport = nullptr;     // nccl, or opts.transport (simulated ranks); null on one GPU
  std::unique_ptr<DeviceMemory> mem;  // declared before everything it allocates (destroyed after them)
  std::unique_ptr<Model> model;
  std::vector<PipelineStep> schedule;  // one step's passes: 1F1B of the model's stage over train.grad_accum
  DeviceArray<int32_t> tokens, targets;  // device [B * T]
  std::unique_ptr<GradNorm> grad_norm;   // the step's global gradient norm and clip scale (over the group)
  std::unique_ptr<StepGraph> graph;      // train.cuda_graph: the step's passes (step_graph.h); else null
  DeviceArray<float> rank_value;         // device [3]: values summed over the ranks (sum_over_ranks)

  std::unique_ptr<TokenBatches> train, val;  // val: null when eval_interval = 0
  std::unique_ptr<ValidationWindows> val_split;  // the whole validation split (shards, eval_interval > 0)
  std::unique_ptr<TrainMetrics> metrics;
  std::unique_ptr<ProgressPrinter> progress;
  std::unique_ptr<StepProfiler> profiler;  // --profile: on the model's context (ModelContext::profiler); else null
  std::unique_ptr<StepProfile> profile;    // --profile: the steps' times by range
  MemoryPeaks run_peaks;

  int64_t step = 0, optimizer_steps = 0, tokens_seen = 0;
  int64_t last_eval_step = -1, last_checkpoint_step = -1;
  int step_stop_signal = 0;  // over ranks: the stop signal agreed in the last step's loss all-reduce (0: none)
  Clock::time_point run_start;
  TrainResult result;

  ~State();
  void setup();                       // trainer.cpp: everything the constructor does
  // The next batch of `source` -> tokens, targets (on `stream`); over W ranks the next W batches are read and this
  // rank's (the rank-th) is kept, so every rank's source stays at the same position.
  void upload(TokenBatches& source);
  void draw(TokenBatches& source);    // upload's batches -> rows (this rank's), without the copy
  // train.cuda_graph: the step's grad_accum batches of `train` -> pinned ([grad_accum][2][B*T]), checked on the
  // host (check_batch_ids), after the previous copies out of it have finished.
  void stage_step_batches();
  // values (at most 3) summed in place over the group's ranks: one FP32 all-reduce, each value rounded to FP32
  // first; unchanged on one GPU.
  void sum_over_ranks(std::span<double> values);
  double mean_over_ranks(double v);   // v averaged over the group's ranks (sum_over_ranks / W); v on one GPU
  // The SIGINT/SIGTERM this rank received (StopSignals::pending), or the test hook's (TrainerOptions::
  // inject_stop_step, from that step on, on inject_stop_rank); 0 when none. `s`: the step it is asked in.
  int local_stop_signal(int64_t s) const;
  // Step s's loss averaged over the ranks (mean_over_ranks) with the stop signals riding on the same all-reduce:
  // any rank's signal received by then is agreed by every rank into step_stop_signal (the signalled ranks' own; the
  // others the signalled ranks' mean, exact when they received the same one). One GPU: the loss, unchanged.
  double reduce_step_loss(double loss, int64_t s);
  // Over ranks, after the last step: one all-reduce of the signals received since that step's loss all-reduce
  // (local_stop_signal(steps + 1)), so that a late signal stops every rank before the final evaluation, as it does on
  // one GPU; the agreed signal or 0. One GPU: 0 (stop_after_step already read the signal after the last step).
  int agree_final_stop_signal(int64_t steps);
  // After a step: the signal that stops the run now, or 0. Over ranks step_stop_signal (the same on every rank, so
  // every rank stops after the same step and the final checkpoint's collectives meet); one GPU local_stop_signal now.
  int stop_after_step() const;
  void upload_rows(int64_t n);        // the first n (<= B) rows of `rows` -> tokens, targets (on `stream`)

  StepRecord train_step();            // trainer_step.cpp
  [[noreturn]] void stop_non_finite(int64_t bad_step, double loss, double norm);

  // trainer_io.cpp: runs, records and prints an evaluation: the periodic one (eval_steps batches) or the final
  // one (final_eval_steps batches; 0: every window of val_split, the last group shorter than B when B does not
  // divide the windows; with synthetic data eval_steps batches).
  void evaluate(bool final_evaluation);
  std::string checkpoint();           // writes step's checkpoint and the metrics file; returns the path
  void restore(const std::string& path);
  void write_metrics();               // no-op without opts.out_path
};

}  // namespace fp4moe
