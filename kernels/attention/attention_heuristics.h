// Which kernels flash_attention_forward and flash_attention_backward (flash_attention.h) run for a (Dqk, Dv) pair:
// one rule, kept apart from the launchers so that a new measurement changes this file only.
//
// Measured on an H200 (bench_attention; TFLOP/s, causal, backward counted as 2.5x forward; the log:
// reports/results/h200/repro-trainer-20261129/bench_attention_variants.log), among five forward and five backward
// kernels timed on the same inputs:
//   shape                              forward                        backward
//   mla   B1 T4096 H128 Dqk/Dv 192/128 key32: 300 (key64: 240)        role_split: 169 (column_split: 138)
//   small B8 T1024 H12  Dqk/Dv  96/64  key64: 206 (key32: 141)        column_split: 116 (role_split: 106)
// The other kernels timed then are removed: forward with row-stepping tile copies alone, or with Q fragments held
// in registers (with and without the head-grouped order); backward with row-stepping copies alone, role_split
// without the head-grouped order, or with dQ fused into the dK/dV sweep through an FP32 accumulator. The best of
// them: forward 272 and backward 163 at mla, 203 and 113 at small.
// Rule: Dqk >= 128 -> key32 forward and role_split backward; smaller Dqk -> key64 and column_split. Only (192, 128)
// and (96, 64) were measured: (128, 128) and (192, 192) follow the Dqk >= 128 rule unmeasured, and (32, 16),
// (32, 32), (64, 64) the rule below it.
#pragma once

#include <cstdint>

namespace fp4moe::attn {

enum class FwdKernel {
  // flash_attention_fwd.cu: 64-key blocks; 32 query rows per warp and 4 warps at the pairs it runs (Dqk <= 96);
  // Q fragments read from shared memory at every key block; all heads side by side.
  key64,
  // flash_attention_fwd_tiled.cu: 32 query rows per warp (4 warps; 16 rows and 8 warps at Dv = 192) against 32-key
  // blocks, two thread blocks per SM, head-grouped block order (block_tile in attention_tile.cuh).
  key32,
};

enum class BwdKernels {
  // flash_attention_bwd.cu: dK/dV kernel whose 8 warps split the query columns (P^T and dS^T through shared memory),
  // then the dQ kernel (recomputes S and dP); tile copies by 16-byte piece, all heads side by side.
  column_split,
  // flash_attention_bwd_split.cu: dK/dV kernel whose warps split the products by role (S^T, P^T, dV | dP^T, dS^T,
  // dK), then flash_attention_bwd.cu's dQ kernel with row-stepping copies; both in the head-grouped block order.
  role_split,
};

// The forward kernel for (Dqk, Dv), for the pairs of kAttentionPairs (flash_attention.h).
constexpr FwdKernel forward_kernel_for(int64_t Dqk, int64_t /*Dv*/) {
  return Dqk >= 128 ? FwdKernel::key32 : FwdKernel::key64;
}

// The backward kernels for (Dqk, Dv), for the pairs of kAttentionPairs; after the D = rowsum(dO * O) kernel.
constexpr BwdKernels backward_kernels_for(int64_t Dqk, int64_t /*Dv*/) {
  return Dqk >= 128 ? BwdKernels::role_split : BwdKernels::column_split;
}

}  // namespace fp4moe::attn
