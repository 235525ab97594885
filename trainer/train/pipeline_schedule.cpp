#include "trainer/train/pipeline_schedule.h"

#include "kernels/common/check.h"
#include "trainer/memory/estimate.h"

namespace fp4moe {

int64_t one_f_one_b_slots(int64_t stages, int64_t stage, int64_t micro_batches) {
  FP4MOE_CHECK(stages >= 1 && stage >= 0 && stage < stages && micro_batches >= 1,
               "1F1B schedule: expected stages >= 1, 0 <= stage < stages and micro_batches >= 1, got stages={} "
               "stage={} micro_batches={}",
               stages, stage, micro_batches);
  ParallelLayout layout;  // the rule is the layout's (what the memory estimate keeps in flight)
  layout.pp = stages;
  layout.micro_batches = micro_batches;
  return layout.in_flight(stage);
}

std::vector<PipelineStep> one_f_one_b_schedule(int64_t stages, int64_t stage, int64_t micro_batches) {
  const int64_t k = one_f_one_b_slots(stages, stage, micro_batches), m = micro_batches;
  std::vector<PipelineStep> steps;
  auto forward = [&](int64_t j) { steps.push_back(PipelineStep{PipelinePass::forward, j, j % k}); };
  auto backward = [&](int64_t j) { steps.push_back(PipelineStep{PipelinePass::backward, j, j % k}); };
  for (int64_t j = 0; j < k - 1; ++j) forward(j);  // warm-up
  for (int64_t i = 0; i + k - 1 < m; ++i) {        // steady 1F1B
    forward(i + k - 1);
    backward(i);
  }
  for (int64_t j = m - k + 1; j < m; ++j) backward(j);  // cool-down
  return steps;
}

std::string schedule_text(const std::vector<PipelineStep>& steps) {
  std::string s;
  for (const PipelineStep& p : steps) {
    if (!s.empty()) s += ' ';
    s += (p.pass == PipelinePass::forward ? 'F' : 'B') + std::to_string(p.micro_batch);
  }
  return s;
}

}  // namespace fp4moe
