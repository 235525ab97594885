// Internals shared by the attention kernel files (flash_attention_fwd*.cu, flash_attention_bwd*.cu and
// flash_attention_variants.cu): the kernel parameter blocks, the compile-time dispatch over kAttentionPairs and the
// host launchers of each kernel family. Not part of the public API (flash_attention.h, flash_attention_variants.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/attention/flash_attention.h"
#include "kernels/common/check.h"

namespace fp4moe::attn {

struct FwdParams {
  AttnIn q, k, v;
  AttnOut o;
  float* lse;
  int T, H;
  float scale_log2;  // scale * log2(e)
  // Block order of the variant kernels (block_tile in attention_tile.cuh): heads per group (0: none), B*H.
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
  // Fused-dQ variants only (flash_attention_bwd_split.cu), else null: the FP32 dQ accumulator [B*H, T, Dqk], one
  // int per (sequence, head, 64-query block) counting the key blocks that have added into it, and the ticket
  // counter that hands out the work items. flags and ticket are zero before the launch.
  float* dq_acc = nullptr;
  int* dq_flags = nullptr;
  unsigned long long* ticket = nullptr;
  // Block order of the variant kernels (block_tile in attention_tile.cuh): heads per group (0: none), B*H.
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

// ---- launchers (asynchronous on `stream`; arguments checked by the caller) ---------------------------------------

// flash_attention_fwd.cu: the forward kernel of flash_attention_forward (variant 0: row_copies false), or the
// same with load_tile_rows_async's copy order (variant 1).
void launch_forward_v0(bool row_copies, const FwdParams& p, int64_t B, int64_t Dqk, int64_t Dv,
                       cudaStream_t stream);

// flash_attention_fwd_tiled.cu: the kernel of forward variants 2 and 4 (tiles = 2: variant 0's tiles, Q in
// registers) or 3 (tiles = 3: 32 rows x 32 keys), in block_tile's order with p.group_heads over p.bh_count heads.
void launch_forward_tiled(int tiles, const FwdParams& p, int64_t Dqk, int64_t Dv, cudaStream_t stream);

// flash_attention_bwd.cu: D = rowsum(dO * O) into p.delta for the B*T rows; the dK/dV and dQ kernels of
// flash_attention_backward (row_copies false), or the same with load_tile_rows_async's copy order, and the dQ
// kernel also in block_tile's order with p.group_heads (grouped, with row copies only).
void launch_backward_delta(const BwdParams& p, int64_t B, cudaStream_t stream);
void launch_backward_dkdv_v0(bool row_copies, const BwdParams& p, int64_t B, int64_t Dqk, int64_t Dv,
                             cudaStream_t stream);
void launch_backward_dq_v0(bool row_copies, bool grouped, const BwdParams& p, int64_t B, int64_t Dqk, int64_t Dv,
                           cudaStream_t stream);

// flash_attention_bwd_split.cu: the dK/dV kernel of backward variants 2 to 4 (role-split warps), in block_tile's
// order with p.group_heads; with fused_dq it also produces dQ through p.dq_acc, p.dq_flags and p.ticket (variant
// 3, whose blocks take their work from the ticket counter instead).
void launch_backward_split(bool fused_dq, const BwdParams& p, int64_t B, int64_t Dqk, int64_t Dv,
                           cudaStream_t stream);

}  // namespace fp4moe::attn
