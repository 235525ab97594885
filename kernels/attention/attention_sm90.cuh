// What the sm90 attention kernels (flash_attention_fwd_sm90.cu, flash_attention_bwd_sm90.cu,
// flash_attention_bwd_sm90_dkdv.cu) share, in the structure of FlashAttention-3 (Shah et al. 2024, sec. 3.1):
// - the thread block: three warpgroups of 128 threads, consumers 0 and 1 and producer 2 (TMA copies), the
//   producer's registers lowered to 24 a thread and the consumers' raised to 240 by setmaxnreg, two-stage rings of
//   64-element (128-byte swizzled) BF16 boxes; the block's prologue (its tile in block_tile's order, its 1024-byte
//   aligned shared memory) and the role split;
// - device helpers: fences that pin the registers of an asynchronous warpgroup product (wgmma) in place around its
//   issue and wait, the release of a ring stage by the warps that read it, the stage and phase of a block in the
//   ring, the TMA copy of a tile as a row of boxes;
// - host: the four tensor maps of the backward kernels and the launch (shared-memory size, the setmaxnreg pool
//   check of kernels/gemm/setmaxnreg_check.h).
// sm_90a only; built on kernels/gemm/sm90_ptx.cuh. Included by those three .cu files only (its constants live in
// fp4moe::attn).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <string>

#include "kernels/attention/attention_params.cuh"
#include "kernels/attention/attention_tile.cuh"
#include "kernels/common/check.h"
#include "kernels/gemm/setmaxnreg_check.h"
#include "kernels/gemm/sm90_ptx.cuh"

namespace fp4moe::attn {

// ---- the thread block -----------------------------------------------------------------------------------------------

constexpr int kBox = 64;  // BF16 per 128-byte swizzled row: the inner side of every TMA box
constexpr int kStages = 2;
constexpr int kConsumerThreads = 256;  // warpgroups 0 and 1
constexpr int kThreads = 384;          // + warpgroup 2, the producer
constexpr int kConsumerWarps = kConsumerThreads / 32;
constexpr uint32_t kProducerRegs = 24, kConsumerRegs = 240;  // sm90_ptx.cuh setmaxnreg_fits
constexpr uint32_t kDescPerKStep = (16 * 2) >> 4;            // 16 BF16 along a K-major row (32 bytes)
static_assert(sm90::setmaxnreg_fits(kThreads, kThreads - kConsumerThreads, kProducerRegs, kConsumerRegs),
              "setmaxnreg asks for more registers than the thread block holds");

// This thread block's sequence-head bh (b = bh / H, h = bh % H) and tile in block_tile's order (attention_tile.cuh:
// p.group_heads over p.bh_count), and its dynamic shared memory from the next 1024-byte boundary (the 128-byte
// swizzle's atom; the layouts reserve 1024 bytes for it). Params: FwdParams or BwdParams. Returns false for a block
// past the last sequence-head, which must then return.
struct Sm90Block {
  int64_t bh;
  int tile, b, h;
  uint8_t* smem;
};
template <typename Params>
__device__ __forceinline__ bool sm90_block_start(const Params& p, Sm90Block& blk) {
  blk.bh = 0;
  blk.tile = 0;
  if (!block_tile(p.group_heads, p.bh_count, blk.bh, blk.tile)) return false;
  uint8_t* raw = dynamic_smem<uint8_t>();
  blk.smem = raw + ((1024 - (sm90::smem_addr(raw) & 1023)) & 1023);
  blk.b = static_cast<int>(blk.bh / p.H);
  blk.h = static_cast<int>(blk.bh % p.H);
  return true;
}

// The role split, after the barriers are initialised: the producer warpgroup (threads kConsumerThreads ..) lowers
// its registers to kProducerRegs and gets true; the consumer warpgroups raise theirs to kConsumerRegs and get false.
// Every thread of the block calls it (setmaxnreg is executed by whole warpgroups).
__device__ __forceinline__ bool sm90_producer_role() {
  if (threadIdx.x >= kConsumerThreads) {
    sm90::warpgroup_regs_dec<kProducerRegs>();
    return true;
  }
  sm90::warpgroup_regs_inc<kConsumerRegs>();
  return false;
}

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

// Stage and phase parity of block j in the kernels' ring of kStages stages.
__device__ __forceinline__ int stage_of(int j) { return ring_stage<kStages>(j); }
__device__ __forceinline__ uint32_t phase_of(int j) { return ring_phase<kStages>(j); }

// One arrival per warp (lane 0) on an empty barrier: the warp's products reading the stage are complete.
__device__ __forceinline__ void release_stage(uint64_t* bar, int lane) {
  __syncwarp();
  if (lane == 0) sm90::mbar_arrive(bar);
}

// ---- the backward kernels' copies ------------------------------------------------------------------------------

// The tensor maps of the backward kernels' operands (attention_tensor_map), as kernel parameter addresses.
struct Sm90BwdMaps {
  const CUtensorMap* q;
  const CUtensorMap* k;
  const CUtensorMap* v;
  const CUtensorMap* dout;
};

// The boxes of one tile: `boxes` copies of 64 columns each, rows from `row0`, box i at dst + i * box_bytes.
__device__ __forceinline__ void load_boxes(uint8_t* dst, const CUtensorMap* map, int boxes, uint32_t box_bytes, int h,
                                           int row0, int b, uint64_t* bar) {
  for (int i = 0; i < boxes; ++i) sm90::tma_load_4d(dst + i * box_bytes, map, i * kBox, h, row0, b, bar);
}

// ---- host -----------------------------------------------------------------------------------------------------------

// The backward kernels' tensor maps over p.q, p.k, p.v, p.dout (attention_tensor_map; `what` names the kernel in its
// errors): Q and dO boxes of q_rows rows, K and V boxes of kv_rows rows, Q and K Dqk wide, V and dO Dv wide.
struct Sm90BwdTensorMaps {
  CUtensorMap q, k, v, dout;
};
inline Sm90BwdTensorMaps sm90_bwd_tensor_maps(const char* what, const BwdParams& p, int64_t B, int64_t Dqk,
                                              int64_t Dv, uint32_t q_rows, uint32_t kv_rows) {
  const std::string w = what;  // errors name the operand, as the forward's do
  return {attention_tensor_map((w + ": q").c_str(), p.q, B, p.T, p.H, Dqk, q_rows),
          attention_tensor_map((w + ": k").c_str(), p.k, B, p.T, p.H, Dqk, kv_rows),
          attention_tensor_map((w + ": v").c_str(), p.v, B, p.T, p.H, Dv, kv_rows),
          attention_tensor_map((w + ": dout").c_str(), p.dout, B, p.T, p.H, Dv, q_rows)};
}

// Launches `kernel` (named `name` in errors) on `grid` blocks of kThreads threads with `smem_bytes` of dynamic shared
// memory on `stream`: first the setmaxnreg pool check (once per kernel: the producer warpgroup at kProducerRegs, the
// two consumers at kConsumerRegs must fit in the registers the kernel was compiled to), then the shared-memory
// attribute, the launch and its error check.
template <typename... KernelArgs, typename... Args>
void launch_sm90_attention(void (*kernel)(KernelArgs...), const char* name, dim3 grid, uint32_t smem_bytes,
                           cudaStream_t stream, const Args&... args) {
  check_setmaxnreg_pool(reinterpret_cast<const void*>(kernel), name, kThreads,
                        {kConsumerRegs, kConsumerRegs, kProducerRegs});
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem_bytes)));
  kernel<<<grid, kThreads, smem_bytes, stream>>>(args...);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe::attn
