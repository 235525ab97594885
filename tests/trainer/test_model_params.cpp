// CPU checks of the trainer's memory accounting and parameter store that need no device: the budget refusal
// (before any cudaMalloc), registration errors, and the statistics and determinism of the init generator.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "kernels/common/check.h"
#include "trainer/memory/device_memory.h"
#include "trainer/model/params.h"

namespace fp4moe {
namespace {

TEST(TrainerMemory, BudgetRefusesBeforeAllocatingAndNamesTheBuffer) {
  DeviceMemory mem(/*budget_bytes=*/1024);
  EXPECT_EQ(mem.allocate(0, MemCategory::activations, "empty"), nullptr);
  try {
    mem.allocate(4096, MemCategory::activations, "layers.0.attn.q_up activations");
    FAIL() << "expected the budget to refuse";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("layers.0.attn.q_up activations"), std::string::npos) << msg;
    EXPECT_NE(msg.find("activations"), std::string::npos) << msg;
    EXPECT_NE(msg.find("budget"), std::string::npos) << msg;
  }
  EXPECT_EQ(mem.current_total(), 0u);
  EXPECT_EQ(mem.peak_total(), 0u);
  EXPECT_THROW(mem.release(reinterpret_cast<void*>(0x1000)), Error);
  EXPECT_STREQ(mem_category_name(MemCategory::optimizer), "optimizer");
}

TEST(TrainerParams, RegistrationRejectsBadTensors) {
  ParamStore store;
  store.add("layers.0.attn.q_down", {32, 64}, ParamInit::normal, 0.02f, true);
  EXPECT_THROW(store.add("layers.0.attn.q_down", {32, 64}, ParamInit::normal, 0.02f, true), Error);
  EXPECT_THROW(store.add("bad", {32, 0}, ParamInit::normal, 0.02f, true), Error);
  EXPECT_THROW(store.add("empty", {}, ParamInit::ones, 0.0f, false), Error);
  EXPECT_THROW(store.add("no_std", {4}, ParamInit::normal, 0.0f, true), Error);
  store.add("norm", {64}, ParamInit::ones, 0.0f, false);
  EXPECT_EQ(store.total_elements(), 32 * 64 + 64);
  ASSERT_NE(store.find("norm"), nullptr);
  EXPECT_FALSE(store.find("norm")->decay);
  EXPECT_EQ(store.find("missing"), nullptr);
}

TEST(TrainerParams, InitGeneratorIsStandardNormalAndKeyed) {
  const uint64_t key = param_name_key("layers.0.attn.q_down");
  EXPECT_NE(key, param_name_key("layers.0.attn.q_up"));
  const int n = 200000;
  double sum = 0, sum2 = 0, sum4 = 0;
  for (int i = 0; i < n; ++i) {
    const double x = param_init_normal(1234, key, i);
    ASSERT_TRUE(std::isfinite(x));
    sum += x;
    sum2 += x * x;
    sum4 += x * x * x * x;
  }
  const double mean = sum / n, var = sum2 / n - mean * mean, kurt = sum4 / n;
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(var, 1.0, 0.015);
  EXPECT_NEAR(kurt, 3.0, 0.08);
  // Same (seed, key, index) -> same value; another seed or key -> another value.
  EXPECT_EQ(param_init_normal(1, key, 5), param_init_normal(1, key, 5));
  EXPECT_NE(param_init_normal(1, key, 5), param_init_normal(2, key, 5));
  EXPECT_NE(param_init_normal(1, key, 5), param_init_normal(1, key + 1, 5));
}

}  // namespace
}  // namespace fp4moe
