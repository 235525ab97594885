// Device side of trainer/model/layout_emulation.h: the pipeline stand-ins, the expert-parallel local routing and the
// skewed load's extra rows (and routed_rows, on the host).
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

// Block e: writes local_idx where topk_idx maps to e (real rows a < n) and at the extra rows n + j with
// j mod E_local = e (j < extra), and counts[e].
__global__ void __launch_bounds__(kThreads)
local_expert_count_kernel(const int32_t* __restrict__ topk_idx, int64_t n, int64_t extra, int E_local,
                          int32_t* __restrict__ local_idx, int32_t* __restrict__ counts) {
  using Reduce = cub::BlockReduce<int, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  const int e = blockIdx.x;
  int count = 0;
  for (int64_t a = threadIdx.x; a < n; a += kThreads)
    if (topk_idx[a] % E_local == e) {
      local_idx[a] = e;
      ++count;
    }
  for (int64_t j = e + int64_t{threadIdx.x} * E_local; j < extra; j += int64_t{kThreads} * E_local) {
    local_idx[n + j] = e;
    ++count;
  }
  const int total = Reduce(temp).Sum(count);
  if (threadIdx.x == 0) counts[e] = total;
}

__global__ void __launch_bounds__(kThreads)
routed_row_tokens_kernel(const int32_t* assignment_of, int64_t rows, int64_t n, int64_t k, int32_t* token_of) {
  for (int64_t r = int64_t{blockIdx.x} * kThreads + threadIdx.x; r < rows; r += int64_t{gridDim.x} * kThreads)
    token_of[r] = static_cast<int32_t>((assignment_of[r] % n) / k);
}

__global__ void __launch_bounds__(kThreads)
zero_extra_rows_kernel(const int32_t* __restrict__ extra_row_of, int64_t count, int64_t d, bf16* __restrict__ data) {
  for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < count * d; i += int64_t{gridDim.x} * kThreads)
    data[int64_t{extra_row_of[i / d]} * d + i % d] = __float2bfloat16_rn(0.0f);
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

int64_t routed_row_count(int64_t balanced_rows, double routed_load, int64_t tp) {
  FP4MOE_CHECK(balanced_rows >= 0 && tp >= 1 && std::isfinite(routed_load) && routed_load >= 1.0,
               "routed_row_count: expected balanced_rows >= 0, tp >= 1 and a finite routed_load >= 1, got {} {} {}",
               balanced_rows, tp, routed_load);
  if (routed_load == 1.0) return ceil_div(balanced_rows, tp);
  const double R = std::ceil(static_cast<double>(balanced_rows) * routed_load / static_cast<double>(tp));
  FP4MOE_CHECK(R < 0x1.0p63, "routed_row_count: {} rows x routed_load {} / tp {} is beyond int64", balanced_rows,
               routed_load, tp);
  return static_cast<int64_t>(R);
}

void local_expert_routing(const int32_t* topk_idx, int64_t n, int64_t rows, int64_t E_local, int32_t* local_idx,
                          int32_t* counts, int32_t* offsets, cudaStream_t stream) {
  FP4MOE_CHECK(n >= 0 && rows >= n && rows <= (int64_t{1} << 31) - 1 && (n > 0 || rows == 0) && E_local >= 1 &&
                   E_local <= kMaxLocalExperts,
               "local_expert_routing: expected 0 <= n <= rows < 2^31 (rows 0 when n is) and E_local in [1, {}], got "
               "n={} rows={} E_local={}", kMaxLocalExperts, n, rows, E_local);
  FP4MOE_CHECK(counts && offsets && (n == 0 || topk_idx) && (rows == 0 || local_idx),
               "local_expert_routing: null pointer (topk_idx [n], local_idx [rows], counts [E_local], offsets "
               "[E_local + 1])");
  local_expert_count_kernel<<<static_cast<int>(E_local), kThreads, 0, stream>>>(topk_idx, n, rows - n,
                                                                                static_cast<int>(E_local), local_idx,
                                                                                counts);
  CUDA_CHECK_LAUNCH();
  local_expert_offsets_kernel<<<1, 1, 0, stream>>>(counts, static_cast<int>(E_local), offsets);
  CUDA_CHECK_LAUNCH();
}

void routed_row_tokens(const int32_t* assignment_of, int64_t rows, int64_t n, int64_t k, int32_t* token_of,
                       cudaStream_t stream) {
  FP4MOE_CHECK(k >= 1 && rows >= n && rows <= (int64_t{1} << 31) - 1 && (rows == 0 || n >= 1),
               "routed_row_tokens: expected k >= 1 and 1 <= n <= rows < 2^31 (or rows 0), got n={} rows={} k={}", n,
               rows, k);
  if (rows == 0) return;
  FP4MOE_CHECK(assignment_of && token_of, "routed_row_tokens: assignment_of and token_of [rows] must not be null");
  routed_row_tokens_kernel<<<grid_for(rows), kThreads, 0, stream>>>(assignment_of, rows, n, k, token_of);
  CUDA_CHECK_LAUNCH();
}

void zero_extra_rows(const int32_t* row_of, int64_t n, int64_t rows, int64_t d, bf16* rows_data,
                     cudaStream_t stream) {
  FP4MOE_CHECK(n >= 0 && rows >= n && d >= 1, "zero_extra_rows: expected 0 <= n <= rows and d >= 1, got n={} "
               "rows={} d={}", n, rows, d);
  if (rows == n) return;
  FP4MOE_CHECK(row_of && rows_data, "zero_extra_rows: row_of [rows] and rows_data [rows, d] must not be null");
  zero_extra_rows_kernel<<<grid_for((rows - n) * d), kThreads, 0, stream>>>(row_of + n, rows - n, d, rows_data);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe
