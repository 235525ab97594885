// The in-flight micro-batches' slots (trainer/memory/device_memory.h) on the host: the cursor's rules, a KeptValue
// following the active slot, and the buffer plan sending held activations (and only them) through allocate_kept,
// which makes one copy per slot (trainer/memory/buffer_plan.h). The device copies themselves are the GPU test's
// (tests/trainer/test_inflight_gpu.cpp).
#include <gtest/gtest.h>

#include <string>

#include "kernels/common/types.h"
#include "tests/common/trainer_test_util.h"
#include "trainer/memory/buffer_plan.h"
#include "trainer/memory/device_memory.h"

namespace fp4moe {
namespace {

using test::expect_error_with;

TEST(ActivationSlots, CursorRules) {
  ActivationSlots s;
  EXPECT_EQ(s.count(), 1);
  EXPECT_EQ(s.active(), 0);
  expect_error_with([&] { s.set_count(0); }, {"count must be >= 1, got 0"});
  s.set_count(3);
  s.set_active(2);
  EXPECT_EQ(s.active(), 2);
  expect_error_with([&] { s.set_active(3); }, {"slot 3 is outside [0, 3)"});
  expect_error_with([&] { s.set_active(-1); }, {"slot -1"});
  s.set_count(2);
  EXPECT_EQ(s.active(), 0) << "a new count starts at slot 0";
  DeviceMemory mem;
  EXPECT_EQ(mem.slots().count(), 1) << "one slot unless the model sets more";
}

TEST(ActivationSlots, KeptValueFollowsTheActiveSlot) {
  ActivationSlots s;
  s.set_count(3);
  KeptValue<int64_t> m(s, -1);
  s.set_active(1);
  m.get() = 5;
  s.set_active(2);
  EXPECT_EQ(m.get(), -1);
  m.get() = 7;
  s.set_active(1);
  EXPECT_EQ(m.get(), 5);
  s.set_active(0);
  EXPECT_EQ(m.get(), -1);
  KeptValue<int64_t> one;  // no cursor: one value
  one.get() = 3;
  EXPECT_EQ(one.get(), 3);
  // A value made for fewer slots than the cursor now has refuses a slot it lacks.
  ActivationSlots t;
  t.set_count(2);
  KeptValue<int64_t> two(t, 0);
  t.set_count(3);
  t.set_active(2);
  expect_error_with([&] { two.get(); }, {"slot 2 is outside the 2 copies"});
}

TEST(ActivationSlots, PlanSendsHeldActivationsThroughAllocateKept) {
  BufferPlan p("mlp");
  p.add("h", 64, ElemType::bf16)                                                           // held activation
      .add("a", 64, ElemType::bf16, /*held=*/false)                                        // not held
      .add("d h", 64, ElemType::bf16, true, MemCategory::workspace, Lifetime::backward_scratch)
      .add("copy", 0, ElemType::e4m3, true, MemCategory::activations, Lifetime::first_forward);
  DeviceMemory mem;  // the checks come before any allocation
  mem.slots().set_count(2);
  expect_error_with([&] { p.allocate<bf16>(mem, "h", "layers.0.mlp"); }, {"h is activations", "allocate_kept"});
  expect_error_with([&] { p.allocate_kept<bf16>(mem, "d h", "layers.0.mlp"); }, {"d h is workspace", "allocate"});
  expect_error_with([&] { p.allocate_kept<float>(mem, "h", "layers.0.mlp"); }, {"4-byte"});
  // Not held, or no elements: no copy at all, under any slot.
  const KeptArray<bf16> a = p.allocate_kept<bf16>(mem, "a", "layers.0.mlp");
  const KeptArray<uint8_t> copy = p.allocate_kept<uint8_t>(mem, "copy", "layers.0.mlp");
  mem.slots().set_active(1);
  EXPECT_EQ(a.copies(), 0);
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(copy.size(), 0);
  EXPECT_EQ(mem.current(MemCategory::activations), 0u);
}

}  // namespace
}  // namespace fp4moe
