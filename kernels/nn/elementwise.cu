// Elementwise kernels (elementwise.h): grid-stride over chunks of kVec elements (8 with 16-byte aligned pointers).
#include <algorithm>

#include "kernels/common/check.h"
#include "kernels/nn/elementwise.h"
#include "kernels/nn/nn_checks.h"
#include "kernels/nn/nn_vec.cuh"

namespace fp4moe {
namespace {

using nn_detail::load_bf16;
using nn_detail::store_bf16;

constexpr int kThreads = 256;

int grid_for(int64_t chunks) {
  return static_cast<int>(std::clamp<int64_t>(ceil_div(chunks, kThreads), 1, int64_t{132} * 16));
}

template <int kVec>
__global__ void __launch_bounds__(kThreads)
add_bf16_kernel(const bf16* a, const bf16* b, int64_t chunks, bf16* y) {
  for (int64_t c = int64_t{blockIdx.x} * kThreads + threadIdx.x; c < chunks; c += int64_t{gridDim.x} * kThreads) {
    float x[kVec], z[kVec];
    load_bf16<kVec>(a + c * kVec, x);
    load_bf16<kVec>(b + c * kVec, z);
#pragma unroll
    for (int i = 0; i < kVec; ++i) x[i] += z[i];
    store_bf16<kVec>(y + c * kVec, x);
  }
}

template <int kVec>
__global__ void __launch_bounds__(kThreads)
cast_f32_to_bf16_kernel(const float* __restrict__ x, int64_t chunks, bf16* __restrict__ y) {
  for (int64_t c = int64_t{blockIdx.x} * kThreads + threadIdx.x; c < chunks; c += int64_t{gridDim.x} * kThreads) {
    float v[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) v[i] = x[c * kVec + i];
    store_bf16<kVec>(y + c * kVec, v);
  }
}

template <int kVec>
__global__ void __launch_bounds__(kThreads)
cast_bf16_to_f32_kernel(const bf16* __restrict__ x, int64_t chunks, float* __restrict__ y) {
  for (int64_t c = int64_t{blockIdx.x} * kThreads + threadIdx.x; c < chunks; c += int64_t{gridDim.x} * kThreads) {
    float v[kVec];
    load_bf16<kVec>(x + c * kVec, v);
#pragma unroll
    for (int i = 0; i < kVec; ++i) y[c * kVec + i] = v[i];
  }
}

template <int kVec>
__global__ void __launch_bounds__(kThreads)
add_bf16_into_f32_kernel(const bf16* __restrict__ x, int64_t chunks, float* __restrict__ y) {
  for (int64_t c = int64_t{blockIdx.x} * kThreads + threadIdx.x; c < chunks; c += int64_t{gridDim.x} * kThreads) {
    float v[kVec];
    load_bf16<kVec>(x + c * kVec, v);
#pragma unroll
    for (int i = 0; i < kVec; ++i) y[c * kVec + i] = __fadd_rn(y[c * kVec + i], v[i]);
  }
}

bool vec_ok(int64_t n, std::initializer_list<const void*> ptrs) {
  if (n % 8 != 0) return false;
  for (const void* p : ptrs)
    if (!nn_detail::is_aligned(p, 16)) return false;
  return true;
}

void check_flat(const char* what, int64_t n, std::initializer_list<const void*> ptrs) {
  FP4MOE_CHECK(n >= 0, "{}: element count n must be >= 0, got {}", what, n);
  if (n == 0) return;
  for (const void* p : ptrs) FP4MOE_CHECK(p != nullptr, "{}: null pointer with n={} elements", what, n);
}

void check_no_overlap(const char* what, const void* x, size_t xb, const void* y, size_t yb) {
  const auto xs = reinterpret_cast<uintptr_t>(x), ys = reinterpret_cast<uintptr_t>(y);
  FP4MOE_CHECK(xs + xb <= ys || ys + yb <= xs, "{}: input and output overlap (a cast cannot run in place)", what);
}

}  // namespace

void add_bf16(const bf16* a, const bf16* b, int64_t n, bf16* y, cudaStream_t stream) {
  check_flat("add_bf16", n, {a, b, y});
  if (n == 0) return;
  if (vec_ok(n, {a, b, y})) {
    add_bf16_kernel<8><<<grid_for(n / 8), kThreads, 0, stream>>>(a, b, n / 8, y);
  } else {
    add_bf16_kernel<1><<<grid_for(n), kThreads, 0, stream>>>(a, b, n, y);
  }
  CUDA_CHECK_LAUNCH();
}

void cast_f32_to_bf16(const float* x, int64_t n, bf16* y, cudaStream_t stream) {
  check_flat("cast_f32_to_bf16", n, {x, y});
  if (n == 0) return;
  check_no_overlap("cast_f32_to_bf16", x, n * 4, y, n * 2);
  if (vec_ok(n, {x, y})) {
    cast_f32_to_bf16_kernel<8><<<grid_for(n / 8), kThreads, 0, stream>>>(x, n / 8, y);
  } else {
    cast_f32_to_bf16_kernel<1><<<grid_for(n), kThreads, 0, stream>>>(x, n, y);
  }
  CUDA_CHECK_LAUNCH();
}

void cast_bf16_to_f32(const bf16* x, int64_t n, float* y, cudaStream_t stream) {
  check_flat("cast_bf16_to_f32", n, {x, y});
  if (n == 0) return;
  check_no_overlap("cast_bf16_to_f32", x, n * 2, y, n * 4);
  if (vec_ok(n, {x, y})) {
    cast_bf16_to_f32_kernel<8><<<grid_for(n / 8), kThreads, 0, stream>>>(x, n / 8, y);
  } else {
    cast_bf16_to_f32_kernel<1><<<grid_for(n), kThreads, 0, stream>>>(x, n, y);
  }
  CUDA_CHECK_LAUNCH();
}

void add_bf16_into_f32(const bf16* x, int64_t n, float* y, cudaStream_t stream) {
  check_flat("add_bf16_into_f32", n, {x, y});
  if (n == 0) return;
  check_no_overlap("add_bf16_into_f32", x, n * 2, y, n * 4);
  if (vec_ok(n, {x, y})) {
    add_bf16_into_f32_kernel<8><<<grid_for(n / 8), kThreads, 0, stream>>>(x, n / 8, y);
  } else {
    add_bf16_into_f32_kernel<1><<<grid_for(n), kThreads, 0, stream>>>(x, n, y);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe
