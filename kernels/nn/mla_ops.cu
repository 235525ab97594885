// MLA data-movement kernels (mla_ops.h). Memory-bound copies, grid-stride over chunks of kVec elements (kVec = 8:
// one 16-byte access when every dimension and stride is a multiple of 8 and the pointers are 16-byte aligned;
// kVec = 1 otherwise). A chunk never straddles the nope/rope boundary since nope % kVec == 0.
#include <algorithm>
#include <initializer_list>
#include <utility>

#include "kernels/common/check.h"
#include "kernels/nn/mla_ops.h"
#include "kernels/nn/nn_checks.h"
#include "kernels/nn/nn_vec.cuh"

namespace fp4moe {
namespace {

using nn_detail::load_bf16;
using nn_detail::store_bf16;

constexpr int kThreads = 256;

int grid_for(int64_t units) {
  return static_cast<int>(std::clamp<int64_t>(ceil_div(units, kThreads), 1, int64_t{132} * 16));
}

template <int kVec>
__device__ __forceinline__ void copy_chunk(const bf16* src, bf16* dst) {
  if constexpr (kVec == 8)
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
  else
    *dst = *src;
}

// Unit u = ((m * H + h) * dqk / kVec + j): chunk j of head h's key at token m.
template <int kVec>
__global__ void __launch_bounds__(kThreads)
mla_assemble_k_kernel(const bf16* __restrict__ kv, const bf16* __restrict__ k_pe, int64_t pe_stride, int64_t M,
                      MlaDims dims, bf16* __restrict__ k) {
  const int64_t dqk = dims.nope + dims.rope, dkv = dims.nope + dims.dv, chunks = dqk / kVec;
  const int64_t units = M * dims.H * chunks;
  for (int64_t u = int64_t{blockIdx.x} * kThreads + threadIdx.x; u < units; u += int64_t{gridDim.x} * kThreads) {
    const int64_t c = (u % chunks) * kVec, mh = u / chunks, m = mh / dims.H;
    const bf16* src = c < dims.nope ? kv + mh * dkv + c : k_pe + m * pe_stride + (c - dims.nope);
    copy_chunk<kVec>(src, k + mh * dqk + c);
  }
}

// Unit u = ((m * H + h) * nope / kVec + j): chunk j of head h's k_nope gradient at token m.
template <int kVec>
__global__ void __launch_bounds__(kThreads)
mla_split_dk_nope_kernel(const bf16* __restrict__ dk, int64_t M, MlaDims dims, bf16* __restrict__ dkv) {
  const int64_t dqk = dims.nope + dims.rope, dkv_dim = dims.nope + dims.dv, chunks = dims.nope / kVec;
  const int64_t units = M * dims.H * chunks;
  for (int64_t u = int64_t{blockIdx.x} * kThreads + threadIdx.x; u < units; u += int64_t{gridDim.x} * kThreads) {
    const int64_t c = (u % chunks) * kVec, mh = u / chunks;
    copy_chunk<kVec>(dk + mh * dqk + c, dkv + mh * dkv_dim + c);
  }
}

// Unit u = (m * rope / kVec + j): chunk j of dk_pe at token m, summed over the heads in increasing order.
template <int kVec>
__global__ void __launch_bounds__(kThreads)
mla_split_dk_pe_kernel(const bf16* __restrict__ dk, int64_t M, MlaDims dims, bf16* __restrict__ dk_pe,
                       int64_t pe_stride) {
  const int64_t dqk = dims.nope + dims.rope, chunks = dims.rope / kVec, units = M * chunks;
  for (int64_t u = int64_t{blockIdx.x} * kThreads + threadIdx.x; u < units; u += int64_t{gridDim.x} * kThreads) {
    const int64_t c = (u % chunks) * kVec, m = u / chunks;
    const bf16* src = dk + m * dims.H * dqk + dims.nope + c;
    float sum[kVec], v[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) sum[i] = 0.0f;
    for (int64_t h = 0; h < dims.H; ++h) {
      load_bf16<kVec>(src + h * dqk, v);
#pragma unroll
      for (int i = 0; i < kVec; ++i) sum[i] += v[i];
    }
    store_bf16<kVec>(dk_pe + m * pe_stride + c, sum);
  }
}

// Pointer checks; returns whether the 16-byte path applies.
bool check_pointers(const char* what, const MlaDims& dims, int64_t pe_stride,
                    std::initializer_list<std::pair<const char*, const void*>> ptrs) {
  bool vec = dims.nope % 8 == 0 && dims.rope % 8 == 0 && dims.dv % 8 == 0 && pe_stride % 8 == 0;
  for (const auto& [name, p] : ptrs) {
    nn_detail::check_not_null(what, name, p);
    nn_detail::check_aligned(what, name, p, 2);
    vec = vec && nn_detail::is_aligned(p, 16);
  }
  return vec;
}

}  // namespace

void mla_assemble_k(const bf16* kv, const bf16* k_pe, int64_t pe_stride, int64_t M, const MlaDims& dims, bf16* k,
                    cudaStream_t stream) {
  const char* what = "mla_assemble_k";
  nn_detail::check_mla_dims(what, M, dims, pe_stride);
  if (M == 0) return;
  const bool vec = check_pointers(what, dims, pe_stride, {{"kv", kv}, {"k_pe", k_pe}, {"k", k}});
  const int64_t elems = M * dims.H * (dims.nope + dims.rope);
  if (vec)
    mla_assemble_k_kernel<8><<<grid_for(elems / 8), kThreads, 0, stream>>>(kv, k_pe, pe_stride, M, dims, k);
  else
    mla_assemble_k_kernel<1><<<grid_for(elems), kThreads, 0, stream>>>(kv, k_pe, pe_stride, M, dims, k);
  CUDA_CHECK_LAUNCH();
}

void mla_split_dk(const bf16* dk, int64_t M, const MlaDims& dims, bf16* dkv, bf16* dk_pe, int64_t pe_stride,
                  cudaStream_t stream) {
  const char* what = "mla_split_dk";
  nn_detail::check_mla_dims(what, M, dims, pe_stride);
  if (M == 0) return;
  const bool vec = check_pointers(what, dims, pe_stride, {{"dk", dk}, {"dkv", dkv}, {"dk_pe", dk_pe}});
  const int64_t nope_elems = M * dims.H * dims.nope, pe_elems = M * dims.rope;
  if (vec) {
    mla_split_dk_nope_kernel<8><<<grid_for(nope_elems / 8), kThreads, 0, stream>>>(dk, M, dims, dkv);
    CUDA_CHECK_LAUNCH();
    mla_split_dk_pe_kernel<8><<<grid_for(pe_elems / 8), kThreads, 0, stream>>>(dk, M, dims, dk_pe, pe_stride);
  } else {
    mla_split_dk_nope_kernel<1><<<grid_for(nope_elems), kThreads, 0, stream>>>(dk, M, dims, dkv);
    CUDA_CHECK_LAUNCH();
    mla_split_dk_pe_kernel<1><<<grid_for(pe_elems), kThreads, 0, stream>>>(dk, M, dims, dk_pe, pe_stride);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe
