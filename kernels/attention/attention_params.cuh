// Internals shared by the attention kernel files (flash_attention_fwd*.cu, flash_attention_bwd*.cu and
// flash_attention.cu): the kernel parameter blocks, the compile-time dispatch over kAttentionPairs and the host
// launchers of each kernel family. Not part of the public API (flash_attention.h).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/attention/attention_heuristics.h"
#include "kernels/attention/flash_attention.h"
#include "kernels/common/check.h"

namespace fp4moe::attn {

struct FwdParams {
  AttnIn q, k, v;
  AttnOut o;
  float* lse;
  int T, H;
  float scale_log2;  // scale * log2(e)
  // Block order of the key32 kernel (block_tile in attention_tile.cuh): heads per group (0: none), B*H.
  int group_heads = 0;
  int64_t bh_count = 0;
};

struct BwdParams {
  AttnIn q, k, v, o, dout;
  const float* lse;  // [B, H, T], natural log
  float* delta;      // [B, H, T], D = rowsum(dO * O) (workspace)
  AttnOut dq, dk, dv;
  int T, H, Dv;
  float scale, scale_log2;  // scale, scale * log2(e)
  // Block order of the role_split kernels (block_tile in attention_tile.cuh): heads per group (0: none), B*H.
  int group_heads = 0;
  int64_t bh_count = 0;
};

// f(Dqk, Dv) with both as std::integral_constant, for the (Dqk, Dv) of kAttentionPairs; an Error naming `what`
// otherwise (the launchers check the pair before, so this is a second line of defence).
template <typename F>
void with_head_dims(const char* what, int64_t Dqk, int64_t Dv, F&& f) {
  using std::integral_constant;
  switch (Dqk * 1000 + Dv) {
    case 32016: f(integral_constant<int, 32>{}, integral_constant<int, 16>{}); break;
    case 32032: f(integral_constant<int, 32>{}, integral_constant<int, 32>{}); break;
    case 64064: f(integral_constant<int, 64>{}, integral_constant<int, 64>{}); break;
    case 96064: f(integral_constant<int, 96>{}, integral_constant<int, 64>{}); break;
    case 128128: f(integral_constant<int, 128>{}, integral_constant<int, 128>{}); break;
    case 192128: f(integral_constant<int, 192>{}, integral_constant<int, 128>{}); break;
    case 192192: f(integral_constant<int, 192>{}, integral_constant<int, 192>{}); break;
    default: FP4MOE_CHECK(false, "{}: no kernel for (Dqk, Dv) = ({},{})", what, Dqk, Dv);
  }
}

// Whether the forward kernel or backward family `k` is built for (Dqk, Dv) (attention_heuristics.h).
constexpr bool family_builds(int64_t Dqk, int64_t Dv, FwdKernel k) { return forward_kernel_builds(k, Dqk, Dv); }
constexpr bool family_builds(int64_t Dqk, int64_t Dv, BwdKernels k) { return backward_kernels_build(k, Dqk, Dv); }

// f(Dqk, Dv) as in with_head_dims for the pairs attention_heuristics.h builds kFamily (a FwdKernel or a BwdKernels)
// for; an Error naming `launcher` for another pair. Each family's launcher instantiates its kernels for its own
// pairs only.
template <auto kFamily, typename F>
void with_family_head_dims(const char* what, const char* launcher, int64_t Dqk, int64_t Dv, F&& f) {
  with_head_dims(what, Dqk, Dv, [&](auto dqk, auto dv) {
    constexpr int kDqk = decltype(dqk)::value, kDv = decltype(dv)::value;
    if constexpr (family_builds(kDqk, kDv, kFamily)) f(dqk, dv);
    else FP4MOE_CHECK(false, "{}: no kernel of this family for (Dqk, Dv) = ({},{})", launcher, kDqk, kDv);
  });
}

// Allows `kernel` smem_bytes of dynamic shared memory and launches it on grid x threads with p (asynchronous on
// `stream`).
template <typename Params>
void launch_with_smem(void (*kernel)(Params), dim3 grid, int threads, int smem_bytes, const Params& p,
                      cudaStream_t stream) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
  kernel<<<grid, threads, smem_bytes, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

// ---- launchers (asynchronous on `stream`; arguments checked by the caller) ---------------------------------------
// Each takes the pairs that forward_kernel_builds / backward_kernels_build (attention_heuristics.h) give its family
// and is instantiated for those only; another pair is an Error.

// flash_attention_fwd_key64.cu: the key64 forward kernel, grid (B*H, query tiles).
void launch_forward_key64(const FwdParams& p, int64_t B, int64_t Dqk, int64_t Dv, cudaStream_t stream);

// flash_attention_fwd_key32.cu: the key32 forward kernel, in block_tile's order with p.group_heads over p.bh_count.
void launch_forward_key32(const FwdParams& p, int64_t Dqk, int64_t Dv, cudaStream_t stream);

// flash_attention_fwd_sm90.cu: the sm90 forward kernel, in block_tile's order with p.group_heads over p.bh_count
// (B * H); its tensor maps made here from p's q, k, v and (B, p.T, p.H). The caller checks the device (compute
// capability 9.0).
void launch_forward_sm90(const FwdParams& p, int64_t B, int64_t Dqk, int64_t Dv, cudaStream_t stream);

// flash_attention_bwd_sm90.cu: the sm90 dQ kernel, in block_tile's order with p.group_heads over p.bh_count
// (B * H); its tensor maps made here from p's q, k, v, dout and (B, p.T, p.H). The caller checks the device (compute
// capability 9.0). Runs after launch_backward_delta (reads p.delta).
void launch_backward_dq_sm90(const BwdParams& p, int64_t B, int64_t Dqk, int64_t Dv, cudaStream_t stream);

// flash_attention_bwd_sm90_dkdv.cu: the sm90 dK/dV kernel, in block_tile's order with p.group_heads over p.bh_count
// (B * H), one thread block per 128-key tile; its tensor maps made here from p's q, k, v, dout and (B, p.T, p.H). The
// caller checks the device (compute capability 9.0). Runs after launch_backward_delta (reads p.delta).
void launch_backward_dkdv_sm90(const BwdParams& p, int64_t B, int64_t Dqk, int64_t Dv, cudaStream_t stream);

// flash_attention_fwd_sm90.cu: the 4-D tensor map (d, head, token, sequence) of one [B*T, H, D] BF16 input of the
// sm90 kernels, boxes of 64 x 1 x box_rows x 1 (64 BF16: one 128-byte row) with the 128-byte swizzle, so that rows
// past a sequence's end arrive as zeros. `what` names the tensor in errors (make_tensor_map's checks).
CUtensorMap attention_tensor_map(const char* what, AttnIn t, int64_t B, int64_t T, int64_t H, int64_t D,
                                 uint32_t box_rows);

// flash_attention_bwd.cu: D = rowsum(dO * O) into p.delta for the B*T rows (every pair); the dQ kernel of the
// column_split family (all heads side by side, grid (B*H, tiles)) and of the role_split family (the same kernel with
// row-stepping copies, in block_tile's order with p.group_heads over p.bh_count).
void launch_backward_delta(const BwdParams& p, int64_t B, cudaStream_t stream);
void launch_backward_dq(const BwdParams& p, int64_t B, int64_t Dqk, int64_t Dv, cudaStream_t stream);
void launch_backward_dq_grouped(const BwdParams& p, int64_t Dqk, int64_t Dv, cudaStream_t stream);

// flash_attention_bwd_column_split.cu: the column_split dK/dV kernel, all heads side by side, grid (B*H, tiles).
void launch_backward_column_split_dkdv(const BwdParams& p, int64_t B, int64_t Dqk, int64_t Dv, cudaStream_t stream);

// flash_attention_bwd_role_split.cu: the role_split dK/dV kernel, in block_tile's order with p.group_heads over
// p.bh_count.
void launch_backward_role_split_dkdv(const BwdParams& p, int64_t Dqk, int64_t Dv, cudaStream_t stream);

}  // namespace fp4moe::attn
