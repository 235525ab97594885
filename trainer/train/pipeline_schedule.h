// The 1F1B pipeline schedule of one stage (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on
// GPU Clusters Using Megatron-LM", sec. 2.2: PipeDream-Flush), as the trainer's step runs it (trainer_step.cpp).
//
// Stage s of p stages, m micro-batches per optimizer step, k = min(p - s, m) in flight (ParallelLayout::in_flight,
// trainer/memory/estimate.h):
//   warm-up     forwards of micro-batches 0 .. k-2             (the later stages fill up)
//   steady      forward of micro-batch k-1+i, then backward of micro-batch i, for i = 0 .. m-k
//   cool-down   backwards of micro-batches m-k+1 .. m-1
// Every micro-batch is forwarded once and backwarded once, after its forward and in micro-batch order, so the
// gradients accumulate in the order of the one-GPU loop. At most k micro-batches are in flight (forwarded, not yet
// backwarded) at any point: micro-batch j keeps its activations in slot j mod k, which micro-batch j - k freed
// (its backward comes before the forward of j). p = 1 (one GPU) gives F0 B0 F1 B1 ...
// e.g. p = 4: stage 0 with m = 6: F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5 (k = 4); stage 3: F0 B0 F1 B1 ... (k = 1).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fp4moe {

enum class PipelinePass { forward, backward };

// One operation of a stage's schedule: a pass over a micro-batch (0-based, in data order) in an activation slot
// (trainer/memory/device_memory.h; Model::forward_in_slot, backward_in_slot).
struct PipelineStep {
  PipelinePass pass = PipelinePass::forward;
  int64_t micro_batch = 0;
  int64_t slot = 0;

  bool operator==(const PipelineStep& o) const {
    return pass == o.pass && micro_batch == o.micro_batch && slot == o.slot;
  }
};

// The activation slots the schedule uses: min(stages - stage, micro_batches). Rejects (fp4moe::Error) stages < 1, a
// stage outside [0, stages) and micro_batches < 1.
int64_t one_f_one_b_slots(int64_t stages, int64_t stage, int64_t micro_batches);

// The 2 m steps of stage `stage` (above). Rejects what one_f_one_b_slots rejects.
std::vector<PipelineStep> one_f_one_b_schedule(int64_t stages, int64_t stage, int64_t micro_batches);

// "F0 F1 B0 ..." (slots not shown), for messages and tests.
std::string schedule_text(const std::vector<PipelineStep>& steps);

}  // namespace fp4moe
