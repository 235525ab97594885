// Host-side helpers shared by the launchers of the Hopper grouped GEMM kernels (grouped_gemm_sm90.cu,
// grouped_wgrad_sm90.cu): the sm_90 shared-memory limit their layouts are checked against at compile time, a
// device attribute of the current device, and the operand pointer rule.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/common/check.h"

namespace fp4moe {

// sm_90's opt-in maximum of dynamic shared memory per block (227 KiB; CUDA C++ Programming Guide, compute
// capability 9.0). The launchers still compare their size with the device's cudaDevAttrMaxSharedMemoryPerBlockOptin.
constexpr size_t kSm90MaxSmemPerBlock = 232448;

// A non-null pointer on a 16-byte boundary (the TMA and cp.async rule for the kernels' operands and outputs).
inline bool nonnull_aligned16(const void* p) { return p != nullptr && reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The value of `attr` on the current device (cudaGetDevice); throws fp4moe::Error on a CUDA error.
inline int current_device_attribute(cudaDeviceAttr attr) {
  int device = 0, value = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&value, attr, device));
  return value;
}

}  // namespace fp4moe
