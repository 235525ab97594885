// The per-warp arithmetic of the causal forward kernels (flash_attention_fwd_key64.cu, flash_attention_fwd_key32.cu),
// which differ only in their tiles, copies and block order: the running state of the online softmax, one key
// block (S = Q K^T, causal mask, online softmax, O += P V) and the final O and lse. One copy, so that both kernels do
// the same products, roundings and operation order. The sm90 forward (flash_attention_fwd_sm90.cu) takes the mask,
// the online softmax, the rescale and the final O and lse from here: its warpgroup products leave in each warp the
// same fragments as a warp's m16n8 products (16 rows, n-tiles of 8 columns), only its products differ.
//
// C is the kernel's configuration: kMTiles (m-tiles of 16 query rows per warp), kBlockN (keys per block), kBlockM,
// kPitchQK and kPitchV (shared-memory pitches of the Q/K and V tiles), kSmemBytes; forward_key_block checks them. lane
// = 4 g + c in the warp (the fragment layout of attention_tile.cuh; the kernel computes g and c once). A warp's state,
// for rows g and g + 8 of each m-tile:
//   acc_o   [kMTiles][Dv / 8][4]  unnormalised O
//   row_max [kMTiles][2]          largest raw score so far (-inf: no visible key yet)
//   row_sum [kMTiles][2]          this lane's partial sum of 2^(S scale log2e - max scale log2e)
#pragma once

#include <cmath>

#include "kernels/attention/attention_params.cuh"
#include "kernels/attention/attention_tile.cuh"

namespace fp4moe::attn {

// O = 0, max = -inf, sum = 0.
template <int Dv, typename C>
__device__ __forceinline__ void forward_rows_init(float (&acc_o)[C::kMTiles][Dv / 8][4],
                                                  float (&row_max)[C::kMTiles][2], float (&row_sum)[C::kMTiles][2]) {
  constexpr int kVT = Dv / 8;  // n-tiles of an output row block
#pragma unroll
  for (int mt = 0; mt < C::kMTiles; ++mt) {
#pragma unroll
    for (int j = 0; j < kVT; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc_o[mt][j][r] = 0.0f;
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) row_max[mt][hr] = -INFINITY, row_sum[mt][hr] = 0.0f;
  }
}

// Causal mask of a block of kNT * 8 keys from key n0 on the warp's kMTiles * 16 rows (query warp_q_first onwards):
// key after query -> -inf (keys at or past T are after every valid query). Nothing to do, and nothing done, when the
// block's last key is at or before the warp's first row.
template <int kMTiles, int kNT>
__device__ __forceinline__ void forward_causal_mask(float (&acc_s)[kMTiles][kNT][4], int warp_q_first, int n0, int g,
                                                    int c) {
  if (n0 + kNT * 8 - 1 > warp_q_first) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int j = 0; j < kNT; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int q = warp_q_first + mt * 16 + g + (r >= 2 ? 8 : 0);
          const int key = n0 + j * 8 + 2 * c + (r & 1);
          if (key > q) acc_s[mt][j][r] = -INFINITY;
        }
  }
}

// Rows g (hr = 0) or g + 8 (hr = 1) of an m-tile's output accumulator times alpha.
template <int kVT>
__device__ __forceinline__ void rescale_output_row(float (&acc)[kVT][4], int hr, float alpha) {
#pragma unroll
  for (int j = 0; j < kVT; ++j) acc[j][2 * hr] *= alpha, acc[j][2 * hr + 1] *= alpha;
}

// Online softmax over a key block's scores (raw, masked), per row: the new row max, alpha = 2^((old max - new max)
// scale log2e), the running sum times alpha, then on_rescale(mt, hr, alpha) (the caller rescales its output rows
// by alpha there, or keeps alpha for later), then P = 2^(S scale log2e - max scale log2e) in place of the scores,
// added to the running sum.
template <int kMTiles, int kNT, typename OnRescale>
__device__ __forceinline__ void forward_online_softmax(float (&acc_s)[kMTiles][kNT][4], float (&row_max)[kMTiles][2],
                                                       float (&row_sum)[kMTiles][2], float scale_log2,
                                                       OnRescale&& on_rescale) {
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      float mx = row_max[mt][hr];
#pragma unroll
      for (int j = 0; j < kNT; ++j) mx = fmaxf(mx, fmaxf(acc_s[mt][j][2 * hr], acc_s[mt][j][2 * hr + 1]));
      mx = quad_max(mx);
      // A row with no visible key yet keeps max -inf; subtracting 0 then gives P = 0, never NaN.
      const float max_scaled = mx == -INFINITY ? 0.0f : mx * scale_log2;
      const float alpha = fast_exp2(fmaf(row_max[mt][hr], scale_log2, -max_scaled));
      row_max[mt][hr] = mx;
      row_sum[mt][hr] *= alpha;
      on_rescale(mt, hr, alpha);
#pragma unroll
      for (int j = 0; j < kNT; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& s = acc_s[mt][j][2 * hr + e];
          s = fast_exp2(fmaf(s, scale_log2, -max_scaled));
          row_sum[mt][hr] += s;
        }
    }
}

// Adds the key block n0 .. n0 + kBlockN - 1 to the warp's rows: sQ the Q tile (the warp's rows from warp_row0, query
// warp_q_first onwards), sKs and sVs the key block's K and V tiles in shared memory (rows past T zero-filled; their
// keys are after every valid query and masked). The caller skips a block whose first key is after the warp's last row.
template <int Dqk, int Dv, typename C>
__device__ __forceinline__ void forward_key_block(const FwdParams& p, float (&acc_o)[C::kMTiles][Dv / 8][4],
                                                  float (&row_max)[C::kMTiles][2], float (&row_sum)[C::kMTiles][2],
                                                  const bf16* sQ, const bf16* sKs, const bf16* sVs, int warp_row0,
                                                  int warp_q_first, int n0, int lane, int g, int c) {
  static_assert(Dqk % 16 == 0 && Dv % 16 == 0, "head dims must be multiples of 16 (mma k-steps, ldmatrix pairs)");
  static_assert(C::kBlockN % 16 == 0 && C::kBlockM % 16 == 0, "tiles must be multiples of 16");
  static_assert(C::kSmemBytes <= 227 * 1024, "tiles exceed the 227 KiB of shared memory of a Hopper thread block");
  static_assert(C::kMTiles * (Dv / 2 + C::kBlockN / 2) <= 192, "accumulators would not fit in registers");
  constexpr int kNT = C::kBlockN / 8;  // n-tiles of a score row block
  constexpr int kVT = Dv / 8;          // n-tiles of an output row block

  // S = Q K^T (raw scores)
  float acc_s[C::kMTiles][kNT][4];
#pragma unroll
  for (int mt = 0; mt < C::kMTiles; ++mt)
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc_s[mt][j][r] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < Dqk / 16; ++kk) {
    uint32_t a[C::kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < C::kMTiles; ++mt) load_a(a[mt], sQ, C::kPitchQK, warp_row0 + mt * 16, kk * 16, lane);
#pragma unroll
    for (int jj = 0; jj < kNT / 2; ++jj) {
      uint32_t bk[4];
      load_b_from_rows_n(bk, sKs, C::kPitchQK, jj * 16, kk * 16, lane);
#pragma unroll
      for (int mt = 0; mt < C::kMTiles; ++mt) {
        mma_bf16_16816(acc_s[mt][2 * jj], a[mt], bk[0], bk[1]);
        mma_bf16_16816(acc_s[mt][2 * jj + 1], a[mt], bk[2], bk[3]);
      }
    }
  }

  forward_causal_mask(acc_s, warp_q_first, n0, g, c);
  forward_online_softmax(acc_s, row_max, row_sum, p.scale_log2,
                         [&](int mt, int hr, float alpha) { rescale_output_row(acc_o[mt], hr, alpha); });

  // O += P V, P rounded to BF16 straight from the score fragments.
#pragma unroll
  for (int kk = 0; kk < kNT / 2; ++kk) {
    uint32_t a[C::kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < C::kMTiles; ++mt) a_from_acc(a[mt], acc_s[mt][2 * kk], acc_s[mt][2 * kk + 1]);
#pragma unroll
    for (int jj = 0; jj < kVT / 2; ++jj) {
      uint32_t bv[4];
      load_b_from_rows_k(bv, sVs, C::kPitchV, kk * 16, jj * 16, lane);
#pragma unroll
      for (int mt = 0; mt < C::kMTiles; ++mt) {
        mma_bf16_16816(acc_o[mt][2 * jj], a[mt], bv[0], bv[1]);
        mma_bf16_16816(acc_o[mt][2 * jj + 1], a[mt], bv[2], bv[3]);
      }
    }
  }
}

// O = acc / rowsum, lse = (max scale log2e + log2 rowsum) ln 2 for the warp's rows (query warp_q_first onwards) of
// sequence b, head h (bh = b H + h); rows at or past T dropped.
template <int Dv, typename C>
__device__ __forceinline__ void forward_rows_store(const FwdParams& p, const float (&acc_o)[C::kMTiles][Dv / 8][4],
                                                   const float (&row_max)[C::kMTiles][2],
                                                   const float (&row_sum)[C::kMTiles][2], int T, int64_t b, int64_t h,
                                                   int64_t bh, int warp_q_first, int g, int c) {
  constexpr int kVT = Dv / 8;  // n-tiles of an output row block
  bf16* gO = p.o.data + b * T * p.o.token_stride + h * p.o.head_stride;
  float* gL = p.lse + bh * T;
#pragma unroll
  for (int mt = 0; mt < C::kMTiles; ++mt)
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const float l = quad_sum(row_sum[mt][hr]);
      const int q = warp_q_first + mt * 16 + g + 8 * hr;
      if (q >= T) continue;
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      bf16* orow = gO + static_cast<int64_t>(q) * p.o.token_stride;
#pragma unroll
      for (int j = 0; j < kVT; ++j)
        store_bf16x2(orow + j * 8 + 2 * c, acc_o[mt][j][2 * hr] * inv, acc_o[mt][j][2 * hr + 1] * inv);
      if (c == 0) gL[q] = (row_max[mt][hr] * p.scale_log2 + log2f(l)) * kLn2;
    }
}

}  // namespace fp4moe::attn
