// ParamStore::init on the device (trainer/model/param_init.h) against the host generator param_init_normal: every
// element within one FP32 ulp of std * z(seed, key, i) (the double log/cos of device and host may differ in the
// last place), the BF16 copy the RNE rounding of the master, ones and zeros exact, and grads/m/v zeroed.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tests/common/gpu_test_util.h"
#include "trainer/model/params.h"

namespace fp4moe {
namespace {

TEST(ParamInit, DeviceGeneratorMatchesTheHostReference) {
  FP4MOE_REQUIRE_DEVICE();
  DeviceMemory mem;
  ParamStore store;
  Param& w = store.add("layers.0.attn.q_down", {257, 131}, ParamInit::normal, 0.02f, true);
  Param& g = store.add("layers.0.attn_norm", {64}, ParamInit::ones, 0.0f, false);
  Param& z = store.add("zeros", {40}, ParamInit::zeros, 0.0f, false);
  store.allocate(mem);
  CUDA_CHECK(cudaMemset(w.grad, 0xFF, w.n * 4));  // poison: init must zero them
  CUDA_CHECK(cudaMemset(w.m, 0xFF, w.n * 4));
  store.init(1234, nullptr);

  std::vector<float> master(w.n), grad(w.n), m(w.n);
  std::vector<bf16> param(w.n);
  CUDA_CHECK(cudaMemcpy(master.data(), w.master, w.n * 4, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(param.data(), w.param, w.n * 2, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(grad.data(), w.grad, w.n * 4, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(m.data(), w.m, w.n * 4, cudaMemcpyDeviceToHost));
  const uint64_t key = param_name_key(w.name);
  int64_t exact = 0;
  for (int64_t i = 0; i < w.n; ++i) {
    const float ref = 0.02f * param_init_normal(1234, key, static_cast<uint64_t>(i));
    ASSERT_LE(std::fabs(master[i] - ref), std::fabs(std::nextafter(ref, 2 * ref) - ref)) << "i=" << i;
    exact += master[i] == ref;
    ASSERT_EQ(bf16_bits(param[i]), bf16_bits(__float2bfloat16_rn(master[i]))) << "i=" << i;
    ASSERT_EQ(grad[i], 0.0f);
    ASSERT_EQ(m[i], 0.0f);
  }
  EXPECT_GE(exact, w.n * 99 / 100) << "the device and host generators should agree almost everywhere";

  std::vector<float> ones(g.n), zeros(z.n);
  CUDA_CHECK(cudaMemcpy(ones.data(), g.master, g.n * 4, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(zeros.data(), z.master, z.n * 4, cudaMemcpyDeviceToHost));
  for (float v : ones) EXPECT_EQ(v, 1.0f);
  for (float v : zeros) EXPECT_EQ(v, 0.0f);
}

}  // namespace
}  // namespace fp4moe
