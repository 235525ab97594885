// The 1F1B schedule of one pipeline stage (trainer/train/pipeline_schedule.h): every micro-batch forwarded once and
// backwarded once after its forward, backwards in micro-batch order, at most k = min(pp - s, m) in flight (the
// memory estimate's in_flight) and exactly k at the peak, a slot never written while it holds a micro-batch whose
// backward has not run; one stage gives the one-GPU order F0 B0 F1 B1 ...; fixed orders against the paper's figure.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/common/trainer_test_util.h"
#include "trainer/memory/estimate.h"
#include "trainer/train/pipeline_schedule.h"

namespace fp4moe {
namespace {

// Checks the schedule's invariants; returns its text.
std::string checked(int64_t pp, int64_t s, int64_t m) {
  SCOPED_TRACE("pp " + std::to_string(pp) + " stage " + std::to_string(s) + " m " + std::to_string(m));
  const std::vector<PipelineStep> steps = one_f_one_b_schedule(pp, s, m);
  ParallelLayout layout;
  layout.pp = pp;
  layout.micro_batches = m;
  const int64_t k = layout.in_flight(s);
  EXPECT_EQ(one_f_one_b_slots(pp, s, m), k);
  EXPECT_EQ(static_cast<int64_t>(steps.size()), 2 * m);
  std::vector<int> forwarded(static_cast<size_t>(m), 0), backwarded(static_cast<size_t>(m), 0);
  std::vector<int64_t> holder(static_cast<size_t>(k), -1);  // the micro-batch each slot holds, -1: free
  std::vector<int64_t> slot_of(static_cast<size_t>(m), -1);
  int64_t in_flight = 0, peak = 0, next_backward = 0;
  for (const PipelineStep& p : steps) {
    if (p.micro_batch < 0 || p.micro_batch >= m || p.slot < 0 || p.slot >= k) {
      ADD_FAILURE() << "micro-batch " << p.micro_batch << " or slot " << p.slot << " out of range";
      return "";
    }
    const size_t j = static_cast<size_t>(p.micro_batch), slot = static_cast<size_t>(p.slot);
    if (p.pass == PipelinePass::forward) {
      EXPECT_EQ(forwarded[j]++, 0) << "F" << j << " twice";
      EXPECT_EQ(holder[slot], -1) << "F" << j << " writes slot " << slot << ", which holds micro-batch "
                                  << holder[slot] << " before its backward";
      holder[slot] = p.micro_batch;
      slot_of[j] = p.slot;
      peak = std::max(peak, ++in_flight);
    } else {
      EXPECT_EQ(forwarded[j], 1) << "B" << j << " before F" << j;
      EXPECT_EQ(backwarded[j]++, 0) << "B" << j << " twice";
      EXPECT_EQ(p.slot, slot_of[j]) << "B" << j << " reads another slot than its forward wrote";
      EXPECT_EQ(holder[slot], p.micro_batch);
      EXPECT_EQ(p.micro_batch, next_backward++) << "backwards out of micro-batch order";
      holder[slot] = -1;
      --in_flight;
    }
    EXPECT_LE(in_flight, k);
  }
  EXPECT_EQ(in_flight, 0);
  EXPECT_EQ(peak, k) << "the stage keeps min(pp - s, m) micro-batches at its peak";
  for (int64_t j = 0; j < m; ++j) EXPECT_EQ(backwarded[static_cast<size_t>(j)], 1) << "B" << j;
  return schedule_text(steps);
}

TEST(PipelineSchedule, OneStageIsTheOneGpuOrder) {
  EXPECT_EQ(checked(1, 0, 1), "F0 B0");
  EXPECT_EQ(checked(1, 0, 4), "F0 B0 F1 B1 F2 B2 F3 B3");
  for (const PipelineStep& p : one_f_one_b_schedule(1, 0, 4)) EXPECT_EQ(p.slot, 0);
}

TEST(PipelineSchedule, WarmUpSteadyCoolDown) {
  // pp 2, stage 0, three micro-batches: two slots, used round-robin.
  EXPECT_EQ(checked(2, 0, 3), "F0 F1 B0 F2 B1 B2");
  std::vector<int64_t> slots;
  for (const PipelineStep& p : one_f_one_b_schedule(2, 0, 3)) slots.push_back(p.slot);
  EXPECT_EQ(slots, (std::vector<int64_t>{0, 1, 0, 0, 1, 0}));
  // 4 stages, 6 micro-batches: stage 0 warms up with 3 forwards, stage 1 with 2; the last stage alternates.
  EXPECT_EQ(checked(4, 0, 6), "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  EXPECT_EQ(checked(4, 1, 6), "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5");
  EXPECT_EQ(checked(4, 3, 6), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
}

TEST(PipelineSchedule, FewerMicroBatchesThanStagesAhead) {
  EXPECT_EQ(checked(4, 0, 2), "F0 F1 B0 B1");  // m < pp - s: every forward before the first backward
  EXPECT_EQ(checked(8, 2, 3), "F0 F1 F2 B0 B1 B2");
  EXPECT_EQ(checked(4, 0, 1), "F0 B0");
}

TEST(PipelineSchedule, InvariantsOverLayouts) {
  for (int64_t pp = 1; pp <= 8; ++pp)
    for (int64_t s = 0; s < pp; ++s)
      for (int64_t m = 1; m <= 12; ++m) checked(pp, s, m);
}

TEST(PipelineSchedule, RejectsBadArguments) {
  test::expect_error_with([] { one_f_one_b_schedule(0, 0, 1); }, {"stages >= 1", "stages=0"});
  test::expect_error_with([] { one_f_one_b_schedule(2, 2, 1); }, {"0 <= stage < stages", "stage=2"});
  test::expect_error_with([] { one_f_one_b_schedule(2, -1, 1); }, {"stage=-1"});
  test::expect_error_with([] { one_f_one_b_schedule(2, 0, 0); }, {"micro_batches >= 1", "micro_batches=0"});
}

}  // namespace
}  // namespace fp4moe
