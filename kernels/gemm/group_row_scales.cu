#include "kernels/gemm/group_row_scales.h"

#include "kernels/common/check.h"
#include "kernels/quant/layouts.h"

namespace fp4moe {

namespace {

constexpr int kThreads = 256;

// grid (x: chunks of a group's rows, y: group). Block-major output: coalesced along rows for each 128-block.
__global__ void pack_group_row_scales_kernel(const float* __restrict__ scales, int64_t M, int64_t ld, int64_t nb,
                                             const int32_t* __restrict__ offsets, float* __restrict__ packed) {
  const int g = blockIdx.y;
  __shared__ long long base;
  if (threadIdx.x == 0) {
    long long s = 0;
    for (int h = 0; h < g; ++h) s += group_main_rows(offsets[h], offsets[h + 1] - offsets[h], M);
    base = s;
  }
  __syncthreads();
  const int64_t off = offsets[g];
  const int64_t n_main = group_main_rows(off, offsets[g + 1] - off, M);
  float* out = packed + nb * base;
  for (int64_t j = blockIdx.x * int64_t{kThreads} + threadIdx.x; j < n_main; j += int64_t{gridDim.x} * kThreads)
    for (int64_t b = 0; b < nb; ++b) out[b * n_main + j] = scales[b * ld + off + j];
}

}  // namespace

void pack_group_row_scales(const float* scales, int64_t M, int64_t C, const int32_t* offsets, int64_t G,
                           int64_t max_group_rows, float* packed, cudaStream_t stream) {
  FP4MOE_CHECK(M >= 0 && C > 0, "pack_group_row_scales: expected M >= 0 and C > 0, got M={} C={}", M, C);
  FP4MOE_CHECK(G >= 1 && G <= 65535, "pack_group_row_scales: expected 1 <= G <= 65535, got G={}", G);
  FP4MOE_CHECK(scales && offsets && packed, "pack_group_row_scales: null pointer (scales {}, offsets {}, packed {})",
               static_cast<const void*>(scales), static_cast<const void*>(offsets), static_cast<void*>(packed));
  if (M == 0 || max_group_rows <= 0) return;
  const int64_t rows = max_group_rows + 3;
  int64_t chunks = (rows + kThreads - 1) / kThreads;
  if (chunks > 1024) chunks = 1024;
  dim3 grid(static_cast<unsigned>(chunks), static_cast<unsigned>(G));
  pack_group_row_scales_kernel<<<grid, kThreads, 0, stream>>>(scales, M, fp8_row_scale_ld(M),
                                                              (C + kFp8Block - 1) / kFp8Block, offsets, packed);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe
