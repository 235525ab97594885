// Device pieces shared by the persistent grouped GEMM kernels (grouped_gemm_sm90.cu, grouped_wgrad_sm90.cu, and the
// CUDA-core grouped_gemm_simt.cu): the position in a ring of shared-memory stages, and the warp-wide scans that turn
// the device group offsets into safe offsets (grouped_tiles.h's rule) and into per-group prefix sums, computed once per
// CTA in shared memory.
#pragma once

#include <cstdint>

#include "kernels/gemm/grouped_tiles.h"

namespace fp4moe::sm90 {

// A position in a ring of kStages stages: the stage and the parity of its current use (a producer and its
// consumers walk the same sequence of uses).
template <int kStages>
struct RingPos {
  uint32_t stage = 0, phase = 0;
  __device__ __forceinline__ void advance() {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
};

// One warp (all 32 lanes): the raw offsets in s_o [G+1] become the safe offsets of grouped_tiles.h (clamped to
// [0, M], a running maximum), in place; each lane takes a contiguous chunk, the chunks joined by a max-scan.
__device__ __forceinline__ void safe_offsets_warp(int32_t* s_o, int32_t G, int32_t M) {
  const int lane = threadIdx.x % 32;
  const int n = G + 1, chunk = (n + 31) / 32;
  const int begin = min(lane * chunk, n), end = min(begin + chunk, n);
  int32_t run = 0;
  for (int i = begin; i < end; ++i) run = max(run, safe_group_offset(s_o[i], 0, M));
  for (int d = 1; d < 32; d *= 2) {
    const int32_t v = __shfl_up_sync(0xFFFFFFFFu, run, d);
    if (lane >= d) run = max(run, v);
  }
  int32_t before = __shfl_up_sync(0xFFFFFFFFu, run, 1);
  if (lane == 0) before = 0;
  for (int i = begin; i < end; ++i) s_o[i] = before = safe_group_offset(s_o[i], before, M);
  __syncwarp();
}

// One warp (all 32 lanes): out[g] = sum_{h<g} count(h) for g in [0, G], out[G] the total (int32; callers bound
// it). count(g) is evaluated twice per group (once for the lane's sum, once for the prefix).
template <class Count>
__device__ __forceinline__ void exclusive_sum_warp(int32_t G, Count&& count, int32_t* out) {
  const int lane = threadIdx.x % 32;
  const int chunk = (G + 31) / 32;
  const int begin = min(lane * chunk, G), end = min(begin + chunk, G);
  int32_t sum = 0;
  for (int g = begin; g < end; ++g) sum += count(g);
  int32_t incl = sum;
  for (int d = 1; d < 32; d *= 2) {
    const int32_t v = __shfl_up_sync(0xFFFFFFFFu, incl, d);
    if (lane >= d) incl += v;
  }
  int32_t at = incl - sum;
  for (int g = begin; g < end; ++g) {
    out[g] = at;
    at += count(g);
  }
  if (lane == 31) out[G] = incl;
  __syncwarp();
}

}  // namespace fp4moe::sm90
