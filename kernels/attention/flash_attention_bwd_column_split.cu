// Causal flash attention, backward (flash_attention.h): the dK/dV kernel of the column_split variant
// (attention_heuristics.h: the pairs with Dqk < 128), after D = rowsum(dO * O) and before the dQ kernel, both in
// flash_attention_bwd.cu:
//   2. dK, dV: one thread block per (key block, sequence, head), looping over the query blocks at or after it,
//      P^T and dS^T recomputed per step from Q, K and the forward's lse (no atomics) and passed through shared
//      memory to the products with dO and Q.
#include <cmath>

#include "kernels/attention/attention_heuristics.h"
#include "kernels/attention/attention_params.cuh"
#include "kernels/attention/attention_tile.cuh"
#include "kernels/common/check.h"

namespace fp4moe::attn {
namespace {

// ---- configuration ------------------------------------------------------------------------------------------------

// dK/dV: kWarpsN warps along the block's keys (16 each) times kWarpsX warps that split the query columns of
// S^T = K Q^T and dP^T = V dO^T, then the D columns of the dK and dV accumulators (kWarpsX = 2 keeps 16 x Dqk/2 and
// 16 x Dv/2 per warp; (32, 16) cannot split Dv = 16 into ldmatrix pairs and takes 1).
template <int Dqk, int Dv>
struct BwdKVConfig {
  static constexpr int kWarpsN = 4;
  static constexpr int kWarpsX = (Dqk % 32 == 0 && Dv % 32 == 0) ? 2 : 1;
  static constexpr int kWarps = kWarpsN * kWarpsX;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBlockN = 16 * kWarpsN;  // keys of the thread block
  static constexpr int kBlockM = 64;            // queries per step
  static constexpr int kQCols = kBlockM / kWarpsX, kDkCols = Dqk / kWarpsX, kDvCols = Dv / kWarpsX;
  static constexpr int kPitchQK = smem_pitch(Dqk), kPitchV = smem_pitch(Dv), kPitchP = smem_pitch(kBlockM);
  // K [kBlockN][kPitchQK], V [kBlockN][kPitchV], Q [2][kBlockM][kPitchQK], dO [2][kBlockM][kPitchV],
  // P^T and dS^T [kBlockN][kPitchP] (BF16); lse * log2e and D [kBlockM] (FP32)
  static constexpr int kSmemBytes = 2 * (kBlockN * (kPitchQK + kPitchV) + 2 * kBlockM * (kPitchQK + kPitchV) +
                                         2 * kBlockN * kPitchP) +
                                    4 * 2 * kBlockM;
};

// ---- 2. dK, dV ----------------------------------------------------------------------------------------------------

// grid (B*H, ceil(T / kBlockN)); the first key blocks (the most queries) are scheduled first.
template <int Dqk, int Dv>
__global__ void __launch_bounds__(BwdKVConfig<Dqk, Dv>::kThreads) flash_attention_backward_dkdv_kernel(BwdParams p) {
  using C = BwdKVConfig<Dqk, Dv>;
  static_assert(Dqk % 16 == 0 && Dv % 16 == 0, "head dims must be multiples of 16 (mma k-steps, ldmatrix pairs)");
  static_assert(C::kQCols % 16 == 0 && C::kDkCols % 16 == 0 && C::kDvCols % 16 == 0,
                "each warp's columns must come in ldmatrix pairs of n-tiles");
  static_assert(C::kBlockM % 16 == 0 && C::kBlockN == 16 * C::kWarpsN, "tiles must be multiples of 16");
  static_assert(C::kSmemBytes <= 227 * 1024, "tiles exceed the 227 KiB of shared memory of a Hopper thread block");
  static_assert(C::kDkCols / 2 + C::kDvCols / 2 + C::kQCols <= 160, "accumulators would not fit in registers");
  constexpr int kST = C::kQCols / 8;   // n-tiles of a warp's S^T / dP^T columns
  constexpr int kKT = C::kDkCols / 8;  // n-tiles of a warp's dK columns
  constexpr int kVT = C::kDvCols / 8;  // n-tiles of a warp's dV columns

  bf16* sK = dynamic_smem<bf16>();
  bf16* sV = sK + C::kBlockN * C::kPitchQK;
  bf16* sQ = sV + C::kBlockN * C::kPitchV;
  bf16* sdO = sQ + 2 * C::kBlockM * C::kPitchQK;
  bf16* sP = sdO + 2 * C::kBlockM * C::kPitchV;
  bf16* sdS = sP + C::kBlockN * C::kPitchP;
  float* sLse2 = reinterpret_cast<float*>(sdS + C::kBlockN * C::kPitchP);
  float* sDelta = sLse2 + C::kBlockM;

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, c = lane % 4;
  const int wn = warp % C::kWarpsN, wx = warp / C::kWarpsN;
  const int key_row0 = wn * 16;  // this warp's 16 keys within the block
  const int T = p.T;
  const int64_t bh = blockIdx.x, b = bh / p.H, h = bh % p.H;
  const int n0 = blockIdx.y * C::kBlockN;
  const int mb_first = n0 / C::kBlockM, mb_end = (T + C::kBlockM - 1) / C::kBlockM;

  const bf16* gQ = p.q.data + b * T * p.q.token_stride + h * p.q.head_stride;
  const bf16* gK = p.k.data + b * T * p.k.token_stride + h * p.k.head_stride;
  const bf16* gV = p.v.data + b * T * p.v.token_stride + h * p.v.head_stride;
  const bf16* gdO = p.dout.data + b * T * p.dout.token_stride + h * p.dout.head_stride;
  const float* gL = p.lse + bh * T;
  const float* gD = p.delta + bh * T;

  load_tile_async<C::kBlockN, Dqk, C::kThreads>(sK, gK, p.k.token_stride, n0, T, tid);
  load_tile_async<C::kBlockN, Dv, C::kThreads>(sV, gV, p.v.token_stride, n0, T, tid);
  load_tile_async<C::kBlockM, Dqk, C::kThreads>(sQ, gQ, p.q.token_stride, mb_first * C::kBlockM, T, tid);
  load_tile_async<C::kBlockM, Dv, C::kThreads>(sdO, gdO, p.dout.token_stride, mb_first * C::kBlockM, T, tid);
  cp_async_commit();
  // lse * log2e and D of query mb_first * kBlockM + tid, held in registers until the step that uses them; rows
  // past T get lse = +inf (P = 0) and D = 0.
  float next_lse2 = 0.0f, next_delta = 0.0f;
  if (tid < C::kBlockM) {
    const int q = mb_first * C::kBlockM + tid;
    next_lse2 = q < T ? gL[q] * kLog2e : INFINITY;
    next_delta = q < T ? gD[q] : 0.0f;
  }

  float acc_dk[kKT][4], acc_dv[kVT][4];
  zero_fragments(acc_dk);
  zero_fragments(acc_dv);

  for (int mb = mb_first; mb < mb_end; ++mb) {
    const int stage = (mb - mb_first) & 1, m0 = mb * C::kBlockM;
    if (tid < C::kBlockM) sLse2[tid] = next_lse2, sDelta[tid] = next_delta;  // read since the last barrier: free
    if (mb + 1 < mb_end) {  // prefetch the next query block into the other stage
      const int next = stage ^ 1, m1 = m0 + C::kBlockM;
      load_tile_async<C::kBlockM, Dqk, C::kThreads>(sQ + next * C::kBlockM * C::kPitchQK, gQ, p.q.token_stride, m1,
                                                    T, tid);
      load_tile_async<C::kBlockM, Dv, C::kThreads>(sdO + next * C::kBlockM * C::kPitchV, gdO, p.dout.token_stride, m1,
                                                   T, tid);
      cp_async_commit();
      if (tid < C::kBlockM) {
        const int q = m1 + tid;
        next_lse2 = q < T ? gL[q] * kLog2e : INFINITY;
        next_delta = q < T ? gD[q] : 0.0f;
      }
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const bf16* sQs = sQ + stage * C::kBlockM * C::kPitchQK;
    const bf16* sdOs = sdO + stage * C::kBlockM * C::kPitchV;

    // S^T = K Q^T and dP^T = V dO^T for this warp's 16 keys x kQCols queries.
    float acc_s[kST][4], acc_dp[kST][4];
    zero_fragments(acc_s);
    zero_fragments(acc_dp);
#pragma unroll
    for (int kk = 0; kk < Dqk / 16; ++kk) {
      uint32_t a[4];
      load_a(a, sK, C::kPitchQK, key_row0, kk * 16, lane);
      mma_b_rows_n(acc_s, a, sQs, C::kPitchQK, wx * C::kQCols, kk * 16, lane);
    }
#pragma unroll
    for (int kk = 0; kk < Dv / 16; ++kk) {
      uint32_t a[4];
      load_a(a, sV, C::kPitchV, key_row0, kk * 16, lane);
      mma_b_rows_n(acc_dp, a, sdOs, C::kPitchV, wx * C::kQCols, kk * 16, lane);
    }

    // P^T = 2^(S^T scale log2e - lse log2e) (0 where the key is after the query), dS^T = P^T (dP^T - D), both
    // rounded to BF16 into shared memory.
    const bool need_mask = m0 < n0 + C::kBlockN - 1;
#pragma unroll
    for (int j = 0; j < kST; ++j)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int kr = key_row0 + g + 8 * hr;  // key row within the block
        const int qc = wx * C::kQCols + j * 8 + 2 * c;  // query column within the step
        float pv[2], ds[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const bool masked = need_mask && n0 + kr > m0 + qc + e;
          pv[e] = masked ? 0.0f : fast_exp2(fmaf(acc_s[j][2 * hr + e], p.scale_log2, -sLse2[qc + e]));
          ds[e] = pv[e] * (acc_dp[j][2 * hr + e] - sDelta[qc + e]);
        }
        store_bf16x2(sP + kr * C::kPitchP + qc, pv[0], pv[1]);
        store_bf16x2(sdS + kr * C::kPitchP + qc, ds[0], ds[1]);
      }
    __syncthreads();

    // dV += P^T dO and dK += dS^T Q for this warp's 16 keys x (kDvCols, kDkCols) columns.
#pragma unroll
    for (int kk = 0; kk < C::kBlockM / 16; ++kk) {
      uint32_t a[4];
      load_a(a, sP, C::kPitchP, key_row0, kk * 16, lane);
      mma_b_rows_k(acc_dv, a, sdOs, C::kPitchV, kk * 16, wx * C::kDvCols, lane);
      load_a(a, sdS, C::kPitchP, key_row0, kk * 16, lane);
      mma_b_rows_k(acc_dk, a, sQs, C::kPitchQK, kk * 16, wx * C::kDkCols, lane);
    }
    __syncthreads();  // P^T, dS^T, this stage and lse/D are free for the next step
  }

  // dK = scale dS^T Q, dV = P^T dO, rows past T dropped.
  bf16* gdK = p.dk.data + b * T * p.dk.token_stride + h * p.dk.head_stride + wx * C::kDkCols;
  bf16* gdV = p.dv.data + b * T * p.dv.token_stride + h * p.dv.head_stride + wx * C::kDvCols;
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int key = n0 + key_row0 + g + 8 * hr;
    if (key >= T) continue;
    bf16* krow = gdK + static_cast<int64_t>(key) * p.dk.token_stride;
    bf16* vrow = gdV + static_cast<int64_t>(key) * p.dv.token_stride;
#pragma unroll
    for (int j = 0; j < kKT; ++j)
      store_bf16x2(krow + j * 8 + 2 * c, acc_dk[j][2 * hr] * p.scale, acc_dk[j][2 * hr + 1] * p.scale);
#pragma unroll
    for (int j = 0; j < kVT; ++j) store_bf16x2(vrow + j * 8 + 2 * c, acc_dv[j][2 * hr], acc_dv[j][2 * hr + 1]);
  }
}

// ---- launchers ----------------------------------------------------------------------------------------------------

template <int Dqk, int Dv>
void launch_column_split_dkdv(const BwdParams& p, int64_t B, cudaStream_t stream) {
  using KV = BwdKVConfig<Dqk, Dv>;
  const dim3 kv_grid(static_cast<unsigned>(B * p.H), static_cast<unsigned>((p.T + KV::kBlockN - 1) / KV::kBlockN));
  launch_with_smem(flash_attention_backward_dkdv_kernel<Dqk, Dv>, kv_grid, KV::kThreads, KV::kSmemBytes, p, stream);
}

}  // namespace

void launch_backward_column_split_dkdv(const BwdParams& p, int64_t B, int64_t Dqk, int64_t Dv, cudaStream_t stream) {
  with_family_head_dims<BwdKernels::column_split>(
      "flash_attention_backward", "launch_backward_column_split_dkdv", Dqk, Dv,
      [&](auto dqk, auto dv) { launch_column_split_dkdv<decltype(dqk)::value, decltype(dv)::value>(p, B, stream); });
}

}  // namespace fp4moe::attn
