// Which kernels flash_attention_forward and flash_attention_backward (flash_attention.h) run for a (Dqk, Dv) pair:
// one rule, kept apart from the launchers so that a new measurement changes this file only.
//
// The rule: forward on a device of compute capability 9.0 at (Dqk, Dv) = (192, 128) or (128, 128) -> the sm90
// forward (WGMMA, TMA and warp specialisation, FlashAttention-3's structure); elsewhere Dqk >= 128 -> key32 forward,
// smaller Dqk -> key64 forward. Backward on a device of compute capability 9.0 at (192, 128) or (128, 128) -> sm90
// (a dK/dV kernel and a dQ kernel, both on WGMMA and TMA); elsewhere Dqk >= 128 -> role_split, smaller Dqk ->
// column_split. At the MLA shape sm90 ran faster than sm90_dq (role_split's dK/dV kernel with the sm90 dQ kernel),
// which ran faster than role_split, on the H200 (bench_attention's `bwd/mla` beside `sm90_dq/bwd/mla` and
// `role_split/bwd/mla`; the runs are listed in reports/results/h200/README.md); (128, 128) takes it untimed.
// The sm90 forward runs Hopper's asynchronous tensor-core product (wgmma) from tiles the copy engine (TMA) streams,
// which the mma.sync kernels cannot use; it is built for Dv = 128 (its P V product is one m64n128 instruction per
// 16 keys) and Dqk a multiple of 64 (its tiles are 64-element boxes of the 128-byte swizzle). At the MLA shape it
// ran faster than key32 on the H200 (bench_attention's `fwd/mla` beside `key32/fwd/mla`; the run is listed in
// reports/results/h200/README.md); (128, 128) takes the same code untimed.
// The mma.sync rule was chosen from timings on an H200 of five forward and five backward kernels on the same inputs,
// at the MLA shape (Dqk/Dv 192/128) and a small one (96/64); the runs and their results are listed in
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
  // flash_attention_fwd_sm90.cu: sm_90a only; one thread block per 128-query tile (two consumer warpgroups of 64
  // rows, one producer warpgroup issuing TMA copies of 128-key K and V blocks, two stages), wgmma for both products,
  // the two consumers' products taking turns on the tensor cores; head-grouped block order (block_tile).
  sm90,
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
  // role_split's dK/dV kernel, then flash_attention_bwd_sm90.cu's dQ kernel: sm_90a only; one thread block per
  // 128-query tile (two consumer warpgroups of 64 rows, one producer warpgroup issuing TMA copies of Q and dO once
  // and of 64-key K and V blocks, two stages), wgmma for S, dP and dQ; head-grouped block order (block_tile).
  sm90_dq,
  // flash_attention_bwd_sm90_dkdv.cu's dK/dV kernel, then the sm90 dQ kernel of sm90_dq: sm_90a only; one thread
  // block per 128-key tile (two consumer warpgroups of 64 keys, one producer warpgroup issuing TMA copies of K and V
  // once and of 64-query Q and dO blocks, two stages), wgmma for S^T, dP^T, dV and dK (P^T and dS^T from registers);
  // head-grouped block order (block_tile).
  sm90,
};

// Compute capability of the devices the sm90 forward runs on (major * 10 + minor): 9.0, the sm_90a build.
constexpr int kSm90ComputeCapability = 90;

// Whether `kernel` is built for (Dqk, Dv), for the pairs of kAttentionPairs (flash_attention.h): key32 for Dqk >= 128,
// key64 below (each pair has one of the two), sm90 for (128, 128) and (192, 128).
constexpr bool forward_kernel_builds(FwdKernel kernel, int64_t Dqk, int64_t Dv) {
  switch (kernel) {
    case FwdKernel::key64: return Dqk < 128;
    case FwdKernel::key32: return Dqk >= 128;
    case FwdKernel::sm90: return Dv == 128 && (Dqk == 128 || Dqk == 192);
  }
  return false;
}

// The forward kernel for (Dqk, Dv) of kAttentionPairs on a device of compute capability `cc` (major * 10 + minor).
constexpr FwdKernel forward_kernel_for(int64_t Dqk, int64_t Dv, int cc) {
  if (cc == kSm90ComputeCapability && forward_kernel_builds(FwdKernel::sm90, Dqk, Dv)) return FwdKernel::sm90;
  return forward_kernel_builds(FwdKernel::key32, Dqk, Dv) ? FwdKernel::key32 : FwdKernel::key64;
}

constexpr const char* forward_kernel_name(FwdKernel kernel) {
  return kernel == FwdKernel::key64 ? "key64" : kernel == FwdKernel::key32 ? "key32" : "sm90";
}

// Whether the backward variant `kernels` is built for (Dqk, Dv), for the pairs of kAttentionPairs: column_split for
// Dqk < 128, role_split for Dqk >= 128 (each pair has one of the two), sm90_dq and sm90 for (128, 128) and (192, 128)
// (their dQ and dK products are whole 64-column boxes of Dqk, their dP and dV products whole 64-element boxes of Dv;
// sm90's dK and dV accumulators, Dqk / 2 + Dv / 2 FP32 per thread, fit beside one 64 x 64 score tile, which S^T,
// P^T, dP^T and dS^T share in turn, up to Dqk + Dv = 320).
constexpr bool backward_kernels_build(BwdKernels kernels, int64_t Dqk, int64_t Dv) {
  switch (kernels) {
    case BwdKernels::column_split: return Dqk < 128;
    case BwdKernels::role_split: return Dqk >= 128;
    case BwdKernels::sm90_dq:
    case BwdKernels::sm90: return Dv == 128 && (Dqk == 128 || Dqk == 192);
  }
  return false;
}

// The backward kernels for (Dqk, Dv) of kAttentionPairs on a device of compute capability `cc` (major * 10 + minor);
// after the D = rowsum(dO * O) kernel.
constexpr BwdKernels backward_kernels_for(int64_t Dqk, int64_t Dv, int cc) {
  if (cc == kSm90ComputeCapability && backward_kernels_build(BwdKernels::sm90, Dqk, Dv)) return BwdKernels::sm90;
  return backward_kernels_build(BwdKernels::role_split, Dqk, Dv) ? BwdKernels::role_split : BwdKernels::column_split;
}

constexpr const char* backward_kernels_name(BwdKernels kernels) {
  return kernels == BwdKernels::column_split ? "column_split"
         : kernels == BwdKernels::role_split ? "role_split"
         : kernels == BwdKernels::sm90_dq    ? "sm90_dq"
                                             : "sm90";
}

}  // namespace fp4moe::attn
