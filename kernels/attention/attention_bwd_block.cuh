// The per-warp arithmetic of the dQ kernels (flash_attention_bwd.cu's mma.sync kernel and flash_attention_bwd_sm90.cu's
// wgmma kernel), which differ only in their products, copies and tiles: the row statistics a warp reads, the scores of
// one key block turned into dS, and the scaled store of dQ. One copy, so that both kernels do the same arithmetic and
// rounding. Fragments as in attention_tile.cuh (lane = 4 g + c; a thread holds rows g and g + 8 of the warp's 16 rows,
// n-tiles of 8 columns); the wgmma kernel's m64nN accumulators are the same fragments per warp.
#pragma once

#include <cmath>

#include "kernels/attention/attention_params.cuh"
#include "kernels/attention/attention_tile.cuh"

namespace fp4moe::attn {

// lse * log2(e) and D of the thread's rows warp_q_first + g and + g + 8 of (sequence-head) bh; rows at or past T get
// lse = +inf (so P = 0) and D = 0.
__device__ __forceinline__ void dq_row_stats(const BwdParams& p, int64_t bh, int warp_q_first, int g, float (&lse2)[2],
                                             float (&delta)[2]) {
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int q = warp_q_first + g + 8 * hr;
    lse2[hr] = q < p.T ? p.lse[bh * p.T + q] * kLog2e : INFINITY;
    delta[hr] = q < p.T ? p.delta[bh * p.T + q] : 0.0f;
  }
}

// dS = P (dP - D) in place of the scores acc_s of kNT * 8 keys from key n0, P = 2^(S scale log2e - lse log2e) and 0
// where the key is after the query (keys at or past T are after every valid query).
template <int kNT>
__device__ __forceinline__ void dq_scores_to_ds(float (&acc_s)[kNT][4], const float (&acc_dp)[kNT][4],
                                                const float (&lse2)[2], const float (&delta)[2], float scale_log2,
                                                int warp_q_first, int n0, int g, int c) {
  const bool need_mask = n0 + kNT * 8 - 1 > warp_q_first;
#pragma unroll
  for (int j = 0; j < kNT; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int hr = r / 2;
      const bool masked = need_mask && n0 + j * 8 + 2 * c + (r & 1) > warp_q_first + g + 8 * hr;
      const float pv = masked ? 0.0f : fast_exp2(fmaf(acc_s[j][r], scale_log2, -lse2[hr]));
      acc_s[j][r] = pv * (acc_dp[j][r] - delta[hr]);
    }
}

// dQ = scale * acc_dq (kQT n-tiles: Dqk = 8 kQT) of the thread's rows into p.dq for sequence b, head h, rounded to
// BF16; rows at or past T dropped.
template <int kQT>
__device__ __forceinline__ void dq_rows_store(const BwdParams& p, const float (&acc_dq)[kQT][4], int64_t b, int64_t h,
                                              int warp_q_first, int g, int c) {
  bf16* gdQ = p.dq.data + b * p.T * p.dq.token_stride + h * p.dq.head_stride;
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int q = warp_q_first + g + 8 * hr;
    if (q >= p.T) continue;
    bf16* row = gdQ + static_cast<int64_t>(q) * p.dq.token_stride;
#pragma unroll
    for (int j = 0; j < kQT; ++j)
      store_bf16x2(row + j * 8 + 2 * c, acc_dq[j][2 * hr] * p.scale, acc_dq[j][2 * hr + 1] * p.scale);
  }
}

}  // namespace fp4moe::attn
