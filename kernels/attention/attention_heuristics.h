// Which kernels flash_attention_forward and flash_attention_backward (flash_attention.h) run for a (Dqk, Dv) pair:
// one rule, kept apart from the launchers so that a new measurement changes this file only.
//
// The rule: Dqk >= 128 -> key32 forward and role_split backward; smaller Dqk -> key64 forward and column_split
// backward. Chosen from timings on an H200 of five forward and five backward kernels on the same inputs, at the MLA
// shape (Dqk/Dv 192/128) and a small one (96/64); the runs and their results are listed in
// reports/results/h200/README.md. Why each side wins:
//   forward, Dqk >= 128: the key64 kernel drops to 16 query rows per warp there (so that its 64-key score fragments
//     and output accumulator fit in registers without spilling), so every K and V fragment it reads from shared
//     memory feeds one product; key32 halves the key block to keep 32 rows per warp (each fragment feeds two
//     products) and fits two thread blocks per SM.
//   forward, Dqk < 128: key64 already runs 32 rows per warp there, and its 64-key blocks take half the online-softmax
//     rescales of key32's 32-key blocks.
//   backward, Dqk >= 128: role_split keeps P^T and dS^T in registers between products (no shared-memory round trip),
//     reads K and V fragments once per thread block, balances its two roles (Dqk + Dv columns each) and reuses Q and dO
//     from L2 in the head-grouped order; these savings grow with the head dims.
//   backward, Dqk < 128: with short products per step those savings are small against the FP32 exchange of P^T
//     between the paired warps of role_split; column_split was faster.
// The kernels that lost (forward with row-stepping copies alone or with Q fragments held in registers; backward with
// row-stepping copies alone, role_split without the head-grouped order, or dQ fused into the dK/dV sweep through an
// FP32 accumulator) were removed. Only (192, 128) and (96, 64) were timed: (128, 128) and (192, 192) follow the
// Dqk >= 128 rule untimed, and (32, 16), (32, 32), (64, 64) the rule below it.
#pragma once

#include <cstdint>

namespace fp4moe::attn {

enum class FwdKernel {
  // flash_attention_fwd_key64.cu: 64-key blocks; 32 query rows per warp and 4 warps at the pairs it runs (Dqk <= 96);
  // Q fragments read from shared memory at every key block; all heads side by side.
  key64,
  // flash_attention_fwd_key32.cu: 32 query rows per warp (4 warps; 16 rows and 8 warps at Dv = 192) against 32-key
  // blocks, two thread blocks per SM, head-grouped block order (block_tile in attention_tile.cuh).
  key32,
};

enum class BwdKernels {
  // flash_attention_bwd_column_split.cu: dK/dV kernel whose 8 warps split the query columns (P^T and dS^T through
  // shared memory), then flash_attention_bwd.cu's dQ kernel (recomputes S and dP); tile copies by 16-byte piece, all
  // heads side by side.
  column_split,
  // flash_attention_bwd_role_split.cu: dK/dV kernel whose warps split the products by role (S^T, P^T, dV |
  // dP^T, dS^T, dK), then flash_attention_bwd.cu's dQ kernel with row-stepping copies; both in the head-grouped
  // block order.
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
