// The launch-time setmaxnreg check (kernels/gemm/setmaxnreg_check.h) on a device: it reads a kernel's numRegs with
// cudaFuncGetAttributes and refuses, with the kernel's name and numRegs, counts the kernel's pool cannot hold (a
// kernel compiled to few registers asked for the attention kernels' 240/240/24), again at every call (numRegs is
// kept after the first, the arithmetic is not skipped); counts the pool holds pass.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <string>

#include "kernels/common/check.h"
#include "kernels/gemm/setmaxnreg_check.h"
#include "tests/common/gpu_test_util.h"

namespace fp4moe {
namespace {

__global__ void few_registers_kernel(int* out) {
  if (out != nullptr) out[threadIdx.x] = static_cast<int>(threadIdx.x);
}

TEST(SetmaxnregCheckGpu, RefusesAKernelCompiledToFewRegistersAndPassesCountsItHolds) {
  FP4MOE_REQUIRE_DEVICE();
  cudaFuncAttributes attr{};
  CUDA_CHECK(cudaFuncGetAttributes(&attr, few_registers_kernel));
  ASSERT_GT(attr.numRegs, 0);
  ASSERT_LT(attr.numRegs, 168) << "the test needs a kernel compiled to fewer registers than the attention kernels";
  const void* kernel = reinterpret_cast<const void*>(few_registers_kernel);
  for (int attempt = 0; attempt < 2; ++attempt) {  // a refused kernel stays refused
    std::string msg;
    try {
      check_setmaxnreg_pool(kernel, "few_registers_kernel", 384, {240, 240, 24});
    } catch (const Error& e) {
      msg = e.what();
    }
    EXPECT_NE(msg.find("few_registers_kernel: compiled to " + std::to_string(attr.numRegs) + " registers"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("[240, 240, 24]"), std::string::npos) << msg;
  }
  // The smallest counts setmaxnreg takes (24) fit any kernel of 24 registers or more; below that, nothing does.
  const uint32_t r = static_cast<uint32_t>(attr.numRegs);
  if (r >= 24) {
    EXPECT_NO_THROW(check_setmaxnreg_pool(kernel, "few_registers_kernel", 384, {24, 24, 24}));
  } else {
    EXPECT_NO_THROW(check_setmaxnreg_pool(kernel, "few_registers_kernel", 128, {r}));
  }
  EXPECT_THROW(check_setmaxnreg_pool(kernel, "few_registers_kernel", 384, {240, 240, 24}), Error)
      << "a kernel that passed once with other counts is still checked";
}

}  // namespace
}  // namespace fp4moe
