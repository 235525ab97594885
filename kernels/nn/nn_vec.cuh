// Device helpers of the kernels/nn layer ops: BF16 vectors of 1 or 8 elements (one 16-byte access for 8) converted
// to and from FP32, and warp sums. Only included by .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/types.h"

namespace fp4moe::nn_detail {

// Loads kVec BF16 starting at p (16-byte aligned when kVec == 8) as FP32.
template <int kVec>
__device__ __forceinline__ void load_bf16(const bf16* p, float (&out)[kVec]) {
  static_assert(kVec == 1 || kVec == 8, "1 element or one 16-byte vector");
  if constexpr (kVec == 8) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = __uint_as_float(w[i] << 16);
      out[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
    }
  } else {
    out[0] = __bfloat162float(*p);
  }
}

// Stores kVec FP32 values as BF16 (round to nearest even) starting at p (16-byte aligned when kVec == 8).
template <int kVec>
__device__ __forceinline__ void store_bf16(bf16* p, const float (&in)[kVec]) {
  static_assert(kVec == 1 || kVec == 8, "1 element or one 16-byte vector");
  if constexpr (kVec == 8) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t lo = __bfloat16_as_ushort(__float2bfloat16_rn(in[2 * i]));
      const uint32_t hi = __bfloat16_as_ushort(__float2bfloat16_rn(in[2 * i + 1]));
      w[i] = lo | (hi << 16);
    }
    *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
  } else {
    *p = __float2bfloat16_rn(in[0]);
  }
}

// Sum over the 32 lanes of a warp; every lane gets the result (butterfly, the same order in every lane).
template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
  return v;
}

}  // namespace fp4moe::nn_detail
