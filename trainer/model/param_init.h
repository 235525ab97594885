// Device initialisation of parameters (ParamStore::init): master FP32 [n] and its BF16 copy param [n].
//   param_init_normal_device  master[i] = std_dev * z(seed, key, i), z the standard normal of param_init_normal
//                             (params.h: splitmix64 + Box-Muller, computed in double), param[i] = BF16(master[i])
//   param_fill_device         master[i] = value, param[i] = BF16(value)
// Device pointers, n >= 0 (0 launches nothing); asynchronous on `stream`.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/types.h"

namespace fp4moe {

void param_init_normal_device(float* master, bf16* param, int64_t n, uint64_t seed, uint64_t key, float std_dev,
                              cudaStream_t stream);
void param_fill_device(float* master, bf16* param, int64_t n, float value, cudaStream_t stream);

}  // namespace fp4moe
