// Shared by the benchmark programs (header only: each bench_<family>.cu is its own executable):
// device buffers, seeded random inputs with a realistic spread, the number of rotated input copies needed to
// defeat the L2, and CUDA-event timing of a batch of launches.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/formats/formats.h"

namespace fp4moe::bench {

// Device allocations of one benchmark case, freed together.
class DevicePool {
 public:
  DevicePool() = default;
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;
  ~DevicePool() {
    for (void* p : ptrs_) cudaFree(p);
  }
  template <typename T>
  T* alloc(int64_t count) {
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(T)));
    ptrs_.push_back(p);
    return static_cast<T*>(p);
  }

 private:
  std::vector<void*> ptrs_;
};

// The spread of generated values: a standard normal times a per-row power of two drawn uniformly from
// 2^[row_log2_lo, row_log2_hi] (tokens of very different magnitude), times `outlier_gain` on one column in
// `outlier_every` (the outlier channels of LLM activations; 0 disables them).
struct Spread {
  float std = 1.0f;
  int row_log2_lo = -4, row_log2_hi = 4;
  int outlier_every = 64;
  float outlier_gain = 32.0f;
};
inline Spread activation_spread() { return Spread{}; }
inline Spread weight_spread() { return Spread{0.02f, -1, 1, 0, 1.0f}; }

__global__ void fill_bf16_random_kernel(__nv_bfloat16* x, int64_t M, int64_t K, uint64_t seed, Spread s) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < M * K; i += int64_t{gridDim.x} * blockDim.x) {
    int64_t m = i / K, k = i % K;
    // Box-Muller on two counter-based uniforms: the values depend on (seed, index) only.
    float u1 = uniform_from_counter(seed, 2 * static_cast<uint64_t>(i)) + 0x1p-25f;
    float u2 = uniform_from_counter(seed, 2 * static_cast<uint64_t>(i) + 1);
    float z = sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
    float ur = uniform_from_counter(seed ^ 0x5EEDull, static_cast<uint64_t>(m));
    int span = s.row_log2_hi - s.row_log2_lo;
    int e = s.row_log2_lo + min(static_cast<int>(ur * static_cast<float>(span + 1)), span);
    float v = z * s.std * exp2_exact(e);
    if (s.outlier_every > 0 && (mix64(static_cast<uint64_t>(k) ^ seed) % s.outlier_every) == 0) v *= s.outlier_gain;
    x[i] = __float2bfloat16_rn(v);
  }
}

// x [M, K] BF16 on the device <- seeded random values with spread `s` (never all zeros).
inline void fill_bf16_random(__nv_bfloat16* x, int64_t M, int64_t K, uint64_t seed, const Spread& s,
                             cudaStream_t stream = nullptr) {
  if (M * K == 0) return;
  int64_t blocks = std::min<int64_t>((M * K + 255) / 256, 65536);
  fill_bf16_random_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(x, M, K, seed, s);
  CUDA_CHECK_LAUNCH();
}

// Number of input copies to rotate through so that their combined working set exceeds twice the L2 (each launch
// then reads from HBM, not from what the previous launch left in the cache): at least 2. working_set_bytes: the
// bytes one launch touches. Capped so that all copies fit in `budget_bytes`.
inline int rotation_copies(int64_t working_set_bytes, int64_t l2_bytes, int64_t budget_bytes) {
  int64_t ws = std::max<int64_t>(working_set_bytes, 1);
  int64_t n = std::max<int64_t>(2, 2 * l2_bytes / ws + 1);
  n = std::min<int64_t>(n, std::max<int64_t>(1, budget_bytes / ws));
  return static_cast<int>(n);
}

// Times `launches` back-to-back launches with CUDA events on `stream`; returns the elapsed seconds.
class EventTimer {
 public:
  EventTimer() {
    CUDA_CHECK(cudaEventCreate(&start_));
    CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~EventTimer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  template <typename Launch>
  double time(int launches, cudaStream_t stream, Launch&& launch) {
    CUDA_CHECK(cudaEventRecord(start_, stream));
    for (int i = 0; i < launches; ++i) launch(i);
    CUDA_CHECK(cudaEventRecord(stop_, stream));
    CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms * 1e-3;
  }

 private:
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

}  // namespace fp4moe::bench
