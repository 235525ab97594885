// SwiGLU forward and backward kernels (swiglu.h). Elementwise and memory-bound: the [M, F] output is walked as a flat
// grid-stride sequence of kVec-element chunks (kVec = 8: one 16-byte access per tensor, when F % 8 == 0 and the
// pointers are 16-byte aligned; kVec = 1 otherwise); a chunk never crosses a row since F % kVec == 0.
#include <algorithm>
#include <initializer_list>
#include <utility>

#include "kernels/nn/nn_checks.h"
#include "kernels/nn/nn_vec.cuh"
#include "kernels/nn/swiglu.h"

namespace fp4moe {
namespace {

using nn_detail::load_bf16;
using nn_detail::store_bf16;

constexpr int kThreads = 256;

__device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

// Offset of chunk `c` (of the [M, F] output) in the [M, 2F] input: its gate; the up part is F further.
__device__ __forceinline__ int64_t gate_offset(int64_t c, int64_t F, int kVec) {
  const int64_t e = c * kVec, m = e / F;
  return e + m * F;  // m * 2F + (e - m * F)
}

template <int kVec>
__global__ void __launch_bounds__(kThreads)
swiglu_forward_kernel(const bf16* __restrict__ input, int64_t chunks, int64_t F, bf16* __restrict__ y) {
  for (int64_t c = int64_t{blockIdx.x} * kThreads + threadIdx.x; c < chunks; c += int64_t{gridDim.x} * kThreads) {
    const int64_t gi = gate_offset(c, F, kVec);
    float g[kVec], u[kVec];
    load_bf16<kVec>(input + gi, g);
    load_bf16<kVec>(input + gi + F, u);
#pragma unroll
    for (int i = 0; i < kVec; ++i) g[i] = g[i] * sigmoid(g[i]) * u[i];
    store_bf16<kVec>(y + c * kVec, g);
  }
}

template <int kVec>
__global__ void __launch_bounds__(kThreads)
swiglu_backward_kernel(const bf16* __restrict__ dy, const bf16* __restrict__ input, int64_t chunks, int64_t F,
                       bf16* __restrict__ dinput) {
  for (int64_t c = int64_t{blockIdx.x} * kThreads + threadIdx.x; c < chunks; c += int64_t{gridDim.x} * kThreads) {
    const int64_t gi = gate_offset(c, F, kVec);
    float g[kVec], u[kVec], d[kVec], dg[kVec], du[kVec];
    load_bf16<kVec>(input + gi, g);
    load_bf16<kVec>(input + gi + F, u);
    load_bf16<kVec>(dy + c * kVec, d);
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      const float s = sigmoid(g[i]);
      dg[i] = d[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
      du[i] = d[i] * (g[i] * s);
    }
    store_bf16<kVec>(dinput + gi, dg);
    store_bf16<kVec>(dinput + gi + F, du);
  }
}

// Grid-stride grid: enough blocks for a few waves on any current GPU, fewer for small tensors.
unsigned grid_for(int64_t chunks) {
  return static_cast<unsigned>(std::clamp<int64_t>(ceil_div(chunks, kThreads), 1, 132 * 16));
}

// Shape and pointer checks; returns whether the 16-byte path applies.
bool check_swiglu(const char* what, int64_t M, int64_t F,
                  std::initializer_list<std::pair<const char*, const void*>> ptrs) {
  nn_detail::check_matrix_shape(what, "M", M, "F", F);
  nn_detail::check_elements(what, M, 2 * F);
  bool vec = F % 8 == 0;
  for (const auto& [name, p] : ptrs) {
    nn_detail::check_not_null(what, name, p);
    nn_detail::check_aligned(what, name, p, 2);
    vec = vec && nn_detail::is_aligned(p, 16);
  }
  return vec;
}

}  // namespace

void swiglu_forward(const bf16* input, int64_t M, int64_t F, bf16* y, cudaStream_t stream) {
  const char* what = "swiglu_forward";
  nn_detail::check_matrix_shape(what, "M", M, "F", F);
  if (M == 0) return;
  const bool vec = check_swiglu(what, M, F, {{"input", input}, {"y", y}});
  if (vec)
    swiglu_forward_kernel<8><<<grid_for(M * F / 8), kThreads, 0, stream>>>(input, M * F / 8, F, y);
  else
    swiglu_forward_kernel<1><<<grid_for(M * F), kThreads, 0, stream>>>(input, M * F, F, y);
  CUDA_CHECK_LAUNCH();
}

void swiglu_backward(const bf16* dy, const bf16* input, int64_t M, int64_t F, bf16* dinput, cudaStream_t stream) {
  const char* what = "swiglu_backward";
  nn_detail::check_matrix_shape(what, "M", M, "F", F);
  if (M == 0) return;
  const bool vec = check_swiglu(what, M, F, {{"dy", dy}, {"input", input}, {"dinput", dinput}});
  if (vec)
    swiglu_backward_kernel<8><<<grid_for(M * F / 8), kThreads, 0, stream>>>(dy, input, M * F / 8, F, dinput);
  else
    swiglu_backward_kernel<1><<<grid_for(M * F), kThreads, 0, stream>>>(dy, input, M * F, F, dinput);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe
