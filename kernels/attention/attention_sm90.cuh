// Device helpers of the sm90 attention kernels (flash_attention_fwd_sm90.cu, flash_attention_bwd_sm90*.cu): fences that
// pin the registers of an asynchronous warpgroup product (wgmma) in place around its issue and wait, and the release
// of a ring stage by the warps that read it, and the stage and phase of a block in the ring. sm_90a only; built on kernels/gemm/sm90_ptx.cuh.
#pragma once

#include <cstdint>

#include "kernels/gemm/sm90_ptx.cuh"

namespace fp4moe::attn {

// sm90::fence_operand on every register of an accumulator (FP32) or of register A fragments (BF16 pairs): the
// compiler keeps its own accesses of them on their side of a wgmma fence, issue or wait.
template <int N>
__device__ __forceinline__ void fence_fragments(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) sm90::fence_operand(r[i]);
}
template <int N>
__device__ __forceinline__ void fence_fragments(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int k = 0; k < 4; ++k) sm90::fence_operand(r[i][k]);
}

// Stage and phase parity of block j in a ring of kStages stages (a stage's barriers complete one phase per use).
template <int kStages>
__device__ __forceinline__ int ring_stage(int j) {
  return j % kStages;
}
template <int kStages>
__device__ __forceinline__ uint32_t ring_phase(int j) {
  return static_cast<uint32_t>(j / kStages) & 1u;
}

// One arrival per warp (lane 0) on an empty barrier: the warp's products reading the stage are complete.
__device__ __forceinline__ void release_stage(uint64_t* bar, int lane) {
  __syncwarp();
  if (lane == 0) sm90::mbar_arrive(bar);
}

}  // namespace fp4moe::attn
