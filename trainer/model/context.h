// What every layer's forward and backward needs besides its own tensors: the stream, the cuBLASLt handle with
// its plan cache, and the allocator (DESIGN.md "Trainer"). One per model; layers do not own handles.
#pragma once

#include <cuda_runtime.h>

#include "kernels/gemm/cublaslt_matmul.h"
#include "trainer/memory.h"

namespace fp4moe {

struct ModelContext {
  cudaStream_t stream = nullptr;
  CublasLtMatmul* lt = nullptr;
  DeviceMemory* mem = nullptr;
};

}  // namespace fp4moe
