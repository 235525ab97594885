// Device side of ParamStore::init (params.h): the counter-based N(0, std^2) generator of param_init_normal,
// evaluated per element on the GPU (the host loop took ~36 ns per element: minutes for a DeepSeek-V3 layer stack).
// Same formula, in double: splitmix64 of (seed, key, index) -> two uniforms from the top 53 bits -> Box-Muller.
// The double log/cos of the device and of the host C library may differ in the last place, which survives the
// rounding to FP32 only rarely; tests/trainer/test_param_init_gpu.cpp bounds the difference by one FP32 ulp.
#include <cuda_bf16.h>

#include <algorithm>

#include "kernels/common/check.h"
#include "trainer/model/param_init.h"

namespace fp4moe {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ uint64_t splitmix64_dev(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__global__ void __launch_bounds__(kThreads)
param_init_normal_kernel(MasterShard master, bf16* __restrict__ param, int64_t n, uint64_t seed, uint64_t key,
                         uint64_t first_index, float std_dev) {
  for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < n; i += int64_t{gridDim.x} * kThreads) {
    const uint64_t index = first_index + static_cast<uint64_t>(i);
    const uint64_t a = splitmix64_dev(seed ^ splitmix64_dev(key ^ splitmix64_dev(index)));
    const uint64_t b = splitmix64_dev(a);
    const double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;
    const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;
    const float z = static_cast<float>(sqrt(-2.0 * log(u1)) * cos(2.0 * 3.14159265358979323846 * u2));
    const float w = std_dev * z;
    if (i >= master.begin && i < master.end) master.data[i - master.begin] = w;
    param[i] = __float2bfloat16_rn(w);
  }
}

__global__ void __launch_bounds__(kThreads)
param_fill_kernel(MasterShard master, bf16* __restrict__ param, int64_t n, float value) {
  for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < n; i += int64_t{gridDim.x} * kThreads) {
    if (i >= master.begin && i < master.end) master.data[i - master.begin] = value;
    param[i] = __float2bfloat16_rn(value);
  }
}

int grid_for(int64_t n) { return static_cast<int>(std::clamp<int64_t>(ceil_div(n, kThreads), 1, 132 * 32)); }

// The checks both launchers make (header); false when there is nothing to launch (n = 0).
bool check_init_args(const char* what, const MasterShard& master, const bf16* param, int64_t n) {
  FP4MOE_CHECK(n >= 0, "{}: n must be >= 0, got {}", what, n);
  FP4MOE_CHECK(master.begin >= 0 && master.begin <= master.end && master.end <= n,
               "{}: the master shard [{}, {}) must lie in [0, n = {}]", what, master.begin, master.end, n);
  if (n == 0) return false;
  FP4MOE_CHECK(param, "{}: param must not be null", what);
  FP4MOE_CHECK(master.data || master.begin == master.end, "{}: master must not be null for a non-empty shard", what);
  return true;
}

}  // namespace

void param_init_normal_device(const MasterShard& master, bf16* param, int64_t n, uint64_t seed, uint64_t key,
                              int64_t first_index, float std_dev, cudaStream_t stream) {
  FP4MOE_CHECK(first_index >= 0, "param_init_normal_device: first_index must be >= 0, got {}", first_index);
  if (!check_init_args("param_init_normal_device", master, param, n)) return;
  param_init_normal_kernel<<<grid_for(n), kThreads, 0, stream>>>(master, param, n, seed, key,
                                                                 static_cast<uint64_t>(first_index), std_dev);
  CUDA_CHECK_LAUNCH();
}

void param_fill_device(const MasterShard& master, bf16* param, int64_t n, float value, cudaStream_t stream) {
  if (!check_init_args("param_fill_device", master, param, n)) return;
  param_fill_kernel<<<grid_for(n), kThreads, 0, stream>>>(master, param, n, value);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe
