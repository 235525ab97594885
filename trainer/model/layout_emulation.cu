// Device side of trainer/model/layout_emulation.h: the pipeline stand-ins and the expert-parallel local routing.
#include <cub/block/block_reduce.cuh>

#include <algorithm>
#include <cmath>

#include "kernels/common/check.h"
#include "trainer/model/layout_emulation.h"

namespace fp4moe {
namespace {

constexpr int kThreads = 256;

int grid_for(int64_t n) { return static_cast<int>(std::min<int64_t>(ceil_div(n, kThreads), 4096)); }

__global__ void __launch_bounds__(kThreads)
standin_input_kernel(const int32_t* __restrict__ tokens, int64_t M, int64_t d, bf16* __restrict__ h) {
  for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < M * d; i += int64_t{gridDim.x} * kThreads)
    h[i] = __float2bfloat16_rn(standin_input_value(tokens[i / d], i % d));
}

__global__ void __launch_bounds__(kThreads)
standin_output_grad_kernel(uint64_t seed, int64_t micro_batch, int64_t n, float scale, bf16* __restrict__ dh) {
  for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < n; i += int64_t{gridDim.x} * kThreads)
    dh[i] = __float2bfloat16_rn(standin_output_grad_value(seed, micro_batch, i, scale));
}

// Block e: writes local_idx where topk_idx maps to e, and counts[e].
__global__ void __launch_bounds__(kThreads)
local_expert_count_kernel(const int32_t* __restrict__ topk_idx, int64_t n, int E_local, int32_t* __restrict__ local_idx,
                          int32_t* __restrict__ counts) {
  using Reduce = cub::BlockReduce<int, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  const int e = blockIdx.x;
  int count = 0;
  for (int64_t a = threadIdx.x; a < n; a += kThreads)
    if (topk_idx[a] % E_local == e) {
      local_idx[a] = e;
      ++count;
    }
  const int total = Reduce(temp).Sum(count);
  if (threadIdx.x == 0) counts[e] = total;
}

__global__ void local_expert_offsets_kernel(const int32_t* __restrict__ counts, int E_local,
                                            int32_t* __restrict__ offsets) {
  int32_t sum = 0;
  offsets[0] = 0;
  for (int e = 0; e < E_local; ++e) offsets[e + 1] = sum += counts[e];
}

}  // namespace

void standin_input(const int32_t* tokens, int64_t M, int64_t d, bf16* h, cudaStream_t stream) {
  FP4MOE_CHECK(M >= 0 && d >= 1, "standin_input: expected M >= 0 and d >= 1, got M={} d={}", M, d);
  if (M == 0) return;
  FP4MOE_CHECK(tokens && h, "standin_input: tokens [M] and h [M, d] must not be null");
  standin_input_kernel<<<grid_for(M * d), kThreads, 0, stream>>>(tokens, M, d, h);
  CUDA_CHECK_LAUNCH();
}

void standin_output_grad(uint64_t seed, int64_t micro_batch, int64_t n, float scale, bf16* dh, cudaStream_t stream) {
  FP4MOE_CHECK(n >= 0 && std::isfinite(scale), "standin_output_grad: expected n >= 0 and a finite scale, got n={} "
               "scale={}", n, scale);
  if (n == 0) return;
  FP4MOE_CHECK(dh != nullptr, "standin_output_grad: dh [n] must not be null");
  standin_output_grad_kernel<<<grid_for(n), kThreads, 0, stream>>>(seed, micro_batch, n, scale, dh);
  CUDA_CHECK_LAUNCH();
}

void local_expert_routing(const int32_t* topk_idx, int64_t n, int64_t E_local, int32_t* local_idx, int32_t* counts,
                          int32_t* offsets, cudaStream_t stream) {
  FP4MOE_CHECK(n >= 0 && n <= (int64_t{1} << 31) - 1 && E_local >= 1 && E_local <= kMaxLocalExperts,
               "local_expert_routing: expected 0 <= n < 2^31 and E_local in [1, {}], got n={} E_local={}",
               kMaxLocalExperts, n, E_local);
  FP4MOE_CHECK(counts && offsets && (n == 0 || (topk_idx && local_idx)),
               "local_expert_routing: null pointer (topk_idx, local_idx [n], counts [E_local], offsets [E_local + 1])");
  local_expert_count_kernel<<<static_cast<int>(E_local), kThreads, 0, stream>>>(topk_idx, n, static_cast<int>(E_local),
                                                                                local_idx, counts);
  CUDA_CHECK_LAUNCH();
  local_expert_offsets_kernel<<<1, 1, 0, stream>>>(counts, static_cast<int>(E_local), offsets);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe
