// How one training run is carried out, beside its configuration (trainer/config.h): where its metrics go, what it
// resumes from, how it reports progress, and test hooks. Filled by `fp4moe train` (trainer/train/command_line.h)
// or directly by tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

#include "trainer/comm/rank_env.h"
#include "trainer/comm/transport.h"
#include "trainer/flops.h"

namespace fp4moe {

enum class ProgressMode { automatic, terminal, plain };

struct TrainerOptions {
  std::string out_path;     // HDF5 result file (trainer/train/metrics.h), replaced at each write; "": none written
  bool replace_out = false; // an existing out_path is replaced without being read: on a resume none of its rows are
                            // carried over (`train --overwrite` of a file that is not this run's: out_file.h)
  std::string run_name;     // group under /train and /memory (check_run_name); "": model.name, else "run"
  std::string resume_path;  // checkpoint to continue from (an existing file; resolve_resume_path turns "latest"
                            // into one); "": a fresh start from init_weights(train.seed)
  std::string config_path;  // the TOML file, recorded with the run ("" when none)
  std::string command;      // the root attribute `command` (the command line)

  // The rank environment of a run started by `fp4moe launch` (trainer/comm/rank_env.h): training then builds an
  // NcclTransport from it and runs rank env.rank of an env.world_size-way expert- and data-parallel group (trainer.h);
  // nullopt: one GPU, no communicator.
  std::optional<RankEnv> ranks;
  // Tests: a transport of simulated ranks (trainer/comm/in_process_transport.h) that the run uses instead of building
  // an NcclTransport: rank transport->rank() of transport->world_size(), as under `ranks`. Not set by the command
  // line; excludes `ranks`; outlives the Trainer.
  EpTransport* transport = nullptr;

  bool synthetic_data = false;               // seeded synthetic tokens (trainer/train/batch.h) instead of shards
  double peak_flops = kH100H200DenseBf16Flops;  // FLOP/s the MFU is quoted against (> 0)
  size_t memory_budget_bytes = 0;            // DeviceMemory budget (0: none)

  std::FILE* log = stderr;                   // progress and event lines; null: silent
  ProgressMode progress = ProgressMode::automatic;  // automatic: a terminal line when `log` is a terminal
  int64_t log_interval = 10;                 // plain mode: a line every log_interval steps (>= 1)
  bool handle_signals = true;                // SIGINT/SIGTERM stop the run after the current step (stop_signals.h)

  // The step profile (`--profile`, trainer/model/profile.h, trainer/train/step_profile.h): per-module GPU time of
  // every training step, by log_interval and over the run after profile_warmup steps (>= 0), written to the result
  // file and printed at the end. Off: nothing is recorded.
  bool profile = false;
  int64_t profile_warmup = 2;

  // Test hook: at this 1-based step (0: never) the step's loss is replaced by NaN and a NaN is written into the
  // first parameter's gradient before the global norm, as a diverging step would give; the train.non_finite
  // policy then acts on it. Not set by the command line.
  int64_t inject_nonfinite_step = 0;
  // Test hook: from this 1-based step on (0: never) rank inject_stop_rank (0 on one GPU) acts as if it had received
  // SIGTERM (stop_signals.h) before the step's loss all-reduce; the run then stops after that step on every rank.
  // train.steps + 1: the signal arrives after the last step's all-reduce (Trainer::State::agree_final_stop_signal).
  // Not set by the command line; needs no signal handlers.
  int64_t inject_stop_step = 0;
  int inject_stop_rank = 0;
  // Test hook: false runs every step of train.cuda_graph eagerly in the same mode without host synchronisation (the
  // reference whose losses and weights the replayed graph must give bit for bit; trainer/train/step_graph.h). Not
  // set by the command line.
  bool capture_step_graph = true;
};

}  // namespace fp4moe
