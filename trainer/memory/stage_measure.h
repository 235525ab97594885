// Measuring the stage times of trainer/memory/stage_times.h on the local GPU.
//
// Each entry is one `fp4moe train` child process (the executable given, /proc/self/exe for `fp4moe plan`): its own
// CUDA context, so that the memory it takes is freed when it ends and an out-of-memory or any other failure is
// contained and recorded, not fatal. The child trains ONE GPU of an emulated layout (DESIGN.md "Emulated layout") of
// a three-layer, three-stage pipeline of the model's shape: model.layers 3, all dense (kind dense) or all MoE (kind
// moe), tp 1, pp 3, ep = the key's, dp 8 ep, ZeRO-1, balanced routing, synthetic tokens; stage 1, the middle one,
// holds one layer and neither the embedding nor the LM head (its neighbours are the trainer's stand-ins). The LM
// head (kind head) is stage 2 of the same pipeline (one layer + final norm + LM head + loss) minus stage 1.
// train.grad_accum = parallel.micro_batches = settings.micro_batches per step, settings.warmup_steps steps not timed,
// then settings.timed_steps steps; the time of a micro-batch is the median timed step's wall time (from the result
// file's tokens_per_s: tokens of the step / tokens_per_s) / micro_batches. It includes the step's optimizer update of
// the layer's ZeRO-1 shard and its gradient norm, spread over the micro-batches (a real step spreads them over more).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "trainer/config.h"
#include "trainer/memory/stage_times.h"

namespace fp4moe {

struct MeasureSettings {
  std::string exe;              // the fp4moe executable the children run
  std::string work_dir;         // an existing folder for the children's configurations, logs and result files
  int64_t micro_batches = 4;    // per step
  int64_t warmup_steps = 1;     // not timed (allocation, cuBLASLt heuristics, first launches)
  int64_t timed_steps = 3;
};

// The TOML text of cfg that `fp4moe train --config` reads back to the same configuration (every key of every
// section; strings as toml_basic_string). Takes a validated configuration.
std::string trainer_config_toml(const TrainerConfig& cfg);

// The configuration measuring `key` (not head: its base kind) for the model shape `model`, on the middle stage (1) or
// the last (2) of the pipeline above. Rejects (fp4moe::Error) a kind the model has no layer of, a recipe that is not
// a paper recipe's name, settings with a count < 1, and what validate_config rejects.
TrainerConfig measurement_config(const TrainerConfig& model, const StageTimeKey& key, bool last_stage,
                                 const MeasureSettings& settings);

// Runs `exe train` on cfg in settings.work_dir (files named after `name`) and returns its seconds per micro-batch
// (> 0). Throws fp4moe::Error with one line: the child's exit status and its last line of output (e.g. its
// out-of-memory report), or what is wrong with its result file.
double run_stage_measurement(const TrainerConfig& cfg, const MeasureSettings& settings, const std::string& name);

// One measurement: the key (for progress) and the function that returns its seconds per micro-batch or throws.
using MeasureFn = std::function<double(const TrainerConfig& cfg, const std::string& name)>;

// Measures, in order, every key of `keys` that `cache` does not hold (head: the last stage minus its base key,
// head_base_key(keys), whose entry must be measured first), puts each entry in the cache and saves it after each
// (a failure is recorded with its reason, never thrown). `measure` runs one configuration (run_stage_measurement
// for the command; a test may pass its own); progress(done, total, key), may be empty, is called before each
// measurement (done of total) and once at the end (total of total). Returns how many keys were measured.
int64_t measure_stage_times(const TrainerConfig& model, const std::vector<StageTimeKey>& keys, StageTimeCache& cache,
                            const MeasureSettings& settings, const MeasureFn& measure,
                            const std::function<void(int64_t, int64_t, const StageTimeKey&)>& progress = {});

}  // namespace fp4moe
