// Device initialisation of parameters (ParamStore::init): a BF16 param [n] and its FP32 master, of which only the
// elements [master.begin, master.end) are stored (ZeRO-1's shard, trainer/model/param_shard.h; [0, n): all of them).
//   param_init_normal_device  w_i = std_dev * z(seed, key, first_index + i), z the standard normal of param_init_normal
//                             (params.h: splitmix64 + Box-Muller, computed in double); param[i] = BF16(w_i) for
//                             every i < n, master.data[i - master.begin] = w_i for i in the shard
//   param_fill_device         the same with w_i = value
// Device pointers, n >= 0 (0 launches nothing), 0 <= master.begin <= master.end <= n, master.data non-null when
// the shard is not empty; asynchronous on `stream`.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/types.h"

namespace fp4moe {

// The stored elements [begin, end) of a master tensor: element i at data[i - begin].
struct MasterShard {
  float* data = nullptr;
  int64_t begin = 0;
  int64_t end = 0;
};

void param_init_normal_device(const MasterShard& master, bf16* param, int64_t n, uint64_t seed, uint64_t key,
                              int64_t first_index, float std_dev, cudaStream_t stream);
void param_fill_device(const MasterShard& master, bf16* param, int64_t n, float value, cudaStream_t stream);

}  // namespace fp4moe
