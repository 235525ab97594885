// Causal flash attention, backward (flash_attention.h): the dK/dV kernel of the role_split family
// (attention_heuristics.h: the pairs with Dqk >= 128), whose warps split the products by role instead of by columns;
// dQ then comes from flash_attention_bwd.cu's dQ kernel (which recomputes S and dP) with row-stepping copies.
//
// Thread block: 64 keys (n0..n0+63) of one (sequence, head), 8 warps; warp w owns the 16 keys 16 (w % 4).. of the
// block and plays role w / 4 for them, over steps of 64 queries (the query blocks at or after the key block):
//   role 0: S^T = K Q^T (16 x 64), P^T = 2^(S^T scale log2e - lse log2e) (0 where the key is after the query),
//           P^T in FP32 to shared memory for its partner, then dV += P^T dO (16 x Dv, in registers);
//   role 1: dP^T = V dO^T (16 x 64), then, with its partner's P^T, dS^T = P^T (dP^T - D) and dK += dS^T Q
//           (16 x Dqk, in registers).
// Each warp computes a 16 x 64 block of scores for all 64 queries, so P^T and dS^T go from the score fragments
// into the next product without a round trip through shared memory (a_from_acc), and (where registers allow) each
// role reads its K or V fragments (the A operand of its first product) into registers once per thread block. Both
// roles do Dqk + Dv columns of products per step (192 + 128 at Dqk = 192, Dv = 128): balanced. Blocks in the
// head-grouped order of block_tile, so that the Q and dO a block streams is reused from L2 by the other blocks of
// its head.
#include <algorithm>
#include <cmath>

#include "kernels/attention/attention_heuristics.h"
#include "kernels/attention/attention_params.cuh"
#include "kernels/attention/attention_tile.cuh"
#include "kernels/common/check.h"

namespace fp4moe::attn {
namespace {

// ---- configuration ------------------------------------------------------------------------------------------------

template <int Dqk, int Dv>
struct SplitConfig {
  static constexpr int kGroups = 4;             // key groups of 16: warps per role
  static constexpr int kWarps = 2 * kGroups;    // role 0: warps 0..3, role 1: warps 4..7
  static constexpr int kThreads = 32 * kWarps;  // 256
  static constexpr int kBlockN = 16 * kGroups;  // keys of the thread block
  static constexpr int kBlockM = 64;            // queries per step (= kBlockN: query blocks j.. for key block j)
  static constexpr int kST = kBlockM / 8;       // n-tiles of a warp's S^T / dP^T (16 x kBlockM)
  // K (role 0) and V (role 1) fragments held in registers, where they fit beside the accumulators (ptxas -v).
  static constexpr bool kKeepK = Dqk / 4 + Dv / 2 <= 112, kKeepV = Dv / 4 + Dqk / 2 <= 128;
  static constexpr int kPitchQK = smem_pitch(Dqk), kPitchV = smem_pitch(Dv);
  // Shared memory (bytes): K [kBlockN][kPitchQK], V [kBlockN][kPitchV], Q [2][kBlockM][kPitchQK],
  // dO [2][kBlockM][kPitchV] (BF16); P^T exchange [kGroups][kST][32 lanes] float4; lse * log2e and D [2][kBlockM]
  // (FP32).
  static constexpr int kOffV = 2 * kBlockN * kPitchQK;
  static constexpr int kOffQ = kOffV + 2 * kBlockN * kPitchV;
  static constexpr int kOffdO = kOffQ + 2 * 2 * kBlockM * kPitchQK;
  static constexpr int kOffP = kOffdO + 2 * 2 * kBlockM * kPitchV;
  static constexpr int kOffLse = kOffP + 16 * kGroups * kST * 32;
  static constexpr int kOffDelta = kOffLse + 4 * 2 * kBlockM;
  static constexpr int kSmemBytes = kOffDelta + 4 * 2 * kBlockM;
};

// Pointers into the shared memory of SplitConfig.
struct SplitSmem {
  bf16 *k, *v, *q, *dout;
  float4* p;  // P^T exchange
  float *lse2, *delta;
};

// The work item of a thread block.
struct SplitItem {
  int64_t bh, b, h;
  int j;        // key block
  int n0;       // its first key
  int n_steps;  // query blocks j .. M - 1
};

// Named barrier 1 + kg (kg = 0..3) of the two warps of key group kg: role 0 arrives once its P^T is stored, role 1
// waits for it.
__device__ __forceinline__ void pair_arrive(int kg) {
  switch (kg) {
    case 0: named_barrier_arrive<1, 64>(); break;
    case 1: named_barrier_arrive<2, 64>(); break;
    case 2: named_barrier_arrive<3, 64>(); break;
    default: named_barrier_arrive<4, 64>(); break;
  }
}
__device__ __forceinline__ void pair_sync(int kg) {
  switch (kg) {
    case 0: named_barrier_sync<1, 64>(); break;
    case 1: named_barrier_sync<2, 64>(); break;
    case 2: named_barrier_sync<3, 64>(); break;
    default: named_barrier_sync<4, 64>(); break;
  }
}

// Role 0's step: S^T, P^T (to its partner through shared memory), dV += P^T dO.
template <int Dqk, int Dv, typename C>
__device__ __forceinline__ void role0_step(const BwdParams& p, const SplitSmem& sm, const bf16* sQs, const bf16* sdOs,
                                           const float* lse2, const uint32_t (&kf)[C::kKeepK ? Dqk / 16 : 1][4],
                                           float (&acc_dv)[Dv / 8][4], int kg, int lane, bool need_mask, int n0,
                                           int m0) {
  constexpr int kST = C::kST;
  const int g = lane / 4, c = lane % 4, key_row0 = 16 * kg;
  float acc_s[kST][4];
  zero_fragments(acc_s);
#pragma unroll
  for (int kk = 0; kk < Dqk / 16; ++kk) {
    uint32_t a[4];
    if constexpr (C::kKeepK) {
#pragma unroll
      for (int r = 0; r < 4; ++r) a[r] = kf[kk][r];
    } else {
      load_a(a, sm.k, C::kPitchQK, key_row0, kk * 16, lane);
    }
    mma_b_rows_n(acc_s, a, sQs, C::kPitchQK, 0, kk * 16, lane);
  }
  // P^T = 2^(S^T scale log2e - lse log2e), 0 where key n0 + kr is after query m0 + qc (rows past T: lse = +inf).
#pragma unroll
  for (int j = 0; j < kST; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int kr = key_row0 + g + (r >= 2 ? 8 : 0), qc = j * 8 + 2 * c + (r & 1);
      const bool masked = need_mask && n0 + kr > m0 + qc;
      acc_s[j][r] = masked ? 0.0f : fast_exp2(fmaf(acc_s[j][r], p.scale_log2, -lse2[qc]));
    }
#pragma unroll
  for (int j = 0; j < kST; ++j)
    sm.p[(kg * kST + j) * 32 + lane] = make_float4(acc_s[j][0], acc_s[j][1], acc_s[j][2], acc_s[j][3]);
  pair_arrive(kg);
  // dV += P^T dO, P^T rounded to BF16 (A fragments, packed at once: half the registers of the FP32 scores).
  uint32_t pf[C::kBlockM / 16][4];
#pragma unroll
  for (int kk = 0; kk < C::kBlockM / 16; ++kk) a_from_acc(pf[kk], acc_s[2 * kk], acc_s[2 * kk + 1]);
#pragma unroll
  for (int kk = 0; kk < C::kBlockM / 16; ++kk) mma_b_rows_k(acc_dv, pf[kk], sdOs, C::kPitchV, kk * 16, 0, lane);
}

// Role 1's step: dP^T, dS^T = P^T (dP^T - D) with its partner's P^T, dK += dS^T Q.
template <int Dqk, int Dv, typename C>
__device__ __forceinline__ void role1_step(const SplitSmem& sm, const bf16* sQs, const bf16* sdOs, const float* delta,
                                           const uint32_t (&vf)[C::kKeepV ? Dv / 16 : 1][4],
                                           float (&acc_dk)[Dqk / 8][4], int kg, int lane) {
  constexpr int kST = C::kST;
  const int c = lane % 4, key_row0 = 16 * kg;
  float acc_dp[kST][4];
  zero_fragments(acc_dp);
#pragma unroll
  for (int kk = 0; kk < Dv / 16; ++kk) {
    uint32_t a[4];
    if constexpr (C::kKeepV) {
#pragma unroll
      for (int r = 0; r < 4; ++r) a[r] = vf[kk][r];
    } else {
      load_a(a, sm.v, C::kPitchV, key_row0, kk * 16, lane);
    }
    mma_b_rows_n(acc_dp, a, sdOs, C::kPitchV, 0, kk * 16, lane);
  }
  pair_sync(kg);  // the partner's P^T of this step is in shared memory
#pragma unroll
  for (int j = 0; j < kST; ++j) {
    const float4 pv = sm.p[(kg * kST + j) * 32 + lane];
    const float d0 = delta[j * 8 + 2 * c], d1 = delta[j * 8 + 2 * c + 1];
    acc_dp[j][0] = pv.x * (acc_dp[j][0] - d0);
    acc_dp[j][1] = pv.y * (acc_dp[j][1] - d1);
    acc_dp[j][2] = pv.z * (acc_dp[j][2] - d0);
    acc_dp[j][3] = pv.w * (acc_dp[j][3] - d1);
  }
  // dS^T rounded to BF16 (A fragments of dK += dS^T Q, packed at once).
  uint32_t dsf[C::kBlockM / 16][4];
#pragma unroll
  for (int kk = 0; kk < C::kBlockM / 16; ++kk) a_from_acc(dsf[kk], acc_dp[2 * kk], acc_dp[2 * kk + 1]);
#pragma unroll
  for (int kk = 0; kk < C::kBlockM / 16; ++kk) mma_b_rows_k(acc_dk, dsf[kk], sQs, C::kPitchQK, kk * 16, 0, lane);
}

// ---- kernel -------------------------------------------------------------------------------------------------------

// One role's whole sweep over the query blocks of the item; both roles pass the same block barriers in the same
// order. Ends with dK (role 1) or dV (role 0) written.
template <int Dqk, int Dv, int Role>
__device__ __forceinline__ void split_sweep(const BwdParams& p, const SplitSmem& sm, const SplitItem& it,
                                            float next_lse2, float next_delta) {
  using C = SplitConfig<Dqk, Dv>;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, kg = warp % C::kGroups;
  const int g = lane / 4, c = lane % 4, key_row0 = 16 * kg;
  const int T = p.T;
  const bf16* gQ = p.q.data + it.b * T * p.q.token_stride + it.h * p.q.head_stride;
  const bf16* gdO = p.dout.data + it.b * T * p.dout.token_stride + it.h * p.dout.head_stride;
  const float* gL = p.lse + it.bh * T;
  const float* gD = p.delta + it.bh * T;

  // The A operand of this role's first product, from the K and V copy the prologue waited for.
  uint32_t kf[C::kKeepK ? Dqk / 16 : 1][4], vf[C::kKeepV ? Dv / 16 : 1][4];
  if constexpr (Role == 0 && C::kKeepK) {
#pragma unroll
    for (int kk = 0; kk < Dqk / 16; ++kk) load_a(kf[kk], sm.k, C::kPitchQK, key_row0, kk * 16, lane);
  }
  if constexpr (Role == 1 && C::kKeepV) {
#pragma unroll
    for (int kk = 0; kk < Dv / 16; ++kk) load_a(vf[kk], sm.v, C::kPitchV, key_row0, kk * 16, lane);
  }
  constexpr int kOutT = Role == 0 ? Dv / 8 : Dqk / 8;  // dV or dK n-tiles
  float acc_out[kOutT][4];
  zero_fragments(acc_out);

  for (int i = 0; i < it.n_steps; ++i) {
    const int mb = it.j + i, m0 = mb * C::kBlockM, buf = i & 1;
    const bool has_next = i + 1 < it.n_steps;
    if (i > 0 && tid < 2 * C::kBlockM) {  // lse / D of this step, loaded during the last one
      if (tid < C::kBlockM) sm.lse2[buf * C::kBlockM + tid] = next_lse2;
      else sm.delta[buf * C::kBlockM + tid - C::kBlockM] = next_delta;
    }
    cp_async_wait<0>();  // Q and dO of this step
    block_barrier();     // ... visible to all; every warp is done with step i - 1
    if (has_next) {  // Q and dO of the next step into the other stage (last read during step i - 1)
      const int m1 = m0 + C::kBlockM, next = buf ^ 1;
      load_tile_rows_async<C::kBlockM, Dqk, C::kThreads>(sm.q + next * C::kBlockM * C::kPitchQK, gQ, p.q.token_stride,
                                                         m1, T, tid);
      load_tile_rows_async<C::kBlockM, Dv, C::kThreads>(sm.dout + next * C::kBlockM * C::kPitchV, gdO,
                                                        p.dout.token_stride, m1, T, tid);
      cp_async_commit();
      if (tid < 2 * C::kBlockM) {
        const int q = m1 + (tid % C::kBlockM);
        if (tid < C::kBlockM) next_lse2 = q < T ? gL[q] * kLog2e : INFINITY;
        else next_delta = q < T ? gD[q] : 0.0f;
      }
    }
    const bf16* sQs = sm.q + buf * C::kBlockM * C::kPitchQK;
    const bf16* sdOs = sm.dout + buf * C::kBlockM * C::kPitchV;
    if constexpr (Role == 0)
      role0_step<Dqk, Dv, C>(p, sm, sQs, sdOs, sm.lse2 + buf * C::kBlockM, kf, acc_out, kg, lane, i == 0, it.n0,
                             m0);
    else
      role1_step<Dqk, Dv, C>(sm, sQs, sdOs, sm.delta + buf * C::kBlockM, vf, acc_out, kg, lane);
  }

  // dK = scale dS^T Q (role 1), dV = P^T dO (role 0); keys past T dropped.
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int key = it.n0 + key_row0 + g + 8 * hr;
    if (key >= T) continue;
    if constexpr (Role == 0) {
      bf16* row = p.dv.data + (it.b * T + key) * p.dv.token_stride + it.h * p.dv.head_stride;
#pragma unroll
      for (int j = 0; j < kOutT; ++j) store_bf16x2(row + j * 8 + 2 * c, acc_out[j][2 * hr], acc_out[j][2 * hr + 1]);
    } else {
      bf16* row = p.dk.data + (it.b * T + key) * p.dk.token_stride + it.h * p.dk.head_stride;
#pragma unroll
      for (int j = 0; j < kOutT; ++j)
        store_bf16x2(row + j * 8 + 2 * c, acc_out[j][2 * hr] * p.scale, acc_out[j][2 * hr + 1] * p.scale);
    }
  }
}

// Blocks over (sequence-head bh, key block j) in block_tile's order with p.group_heads (tile = j: the first key
// blocks, with the most queries, first), grid tile_grid's.
template <int Dqk, int Dv>
__global__ void __launch_bounds__(SplitConfig<Dqk, Dv>::kThreads, 1)
    flash_attention_backward_dkdv_role_split_kernel(BwdParams p) {
  using C = SplitConfig<Dqk, Dv>;
  static_assert(Dqk % 16 == 0 && Dv % 16 == 0, "head dims must be multiples of 16 (mma k-steps, ldmatrix pairs)");
  static_assert(C::kBlockM == C::kBlockN, "query steps as long as key blocks: key block j starts at query block j");
  static_assert(C::kSmemBytes <= 227 * 1024, "tiles exceed the 227 KiB of shared memory of a Hopper thread block");
  static_assert(Dqk / 2 + C::kST * 4 + (C::kKeepV ? Dv / 4 : 0) <= 192 &&
                    Dv / 2 + C::kST * 4 + (C::kKeepK ? Dqk / 4 : 0) <= 192,
                "accumulators would not fit in registers");

  unsigned char* smem = dynamic_smem<unsigned char>();
  const SplitSmem sm{reinterpret_cast<bf16*>(smem),
                     reinterpret_cast<bf16*>(smem + C::kOffV),
                     reinterpret_cast<bf16*>(smem + C::kOffQ),
                     reinterpret_cast<bf16*>(smem + C::kOffdO),
                     reinterpret_cast<float4*>(smem + C::kOffP),
                     reinterpret_cast<float*>(smem + C::kOffLse),
                     reinterpret_cast<float*>(smem + C::kOffDelta)};
  const int tid = threadIdx.x, warp = tid / 32;
  const int T = p.T, n_kb = (T + C::kBlockN - 1) / C::kBlockN;

  SplitItem it{};
  if (!block_tile(p.group_heads, p.bh_count, it.bh, it.j)) return;
  it.b = it.bh / p.H;
  it.h = it.bh % p.H;
  it.n0 = it.j * C::kBlockN;
  it.n_steps = n_kb - it.j;  // query blocks j .. n_kb - 1 (kBlockM == kBlockN)

  const bf16* gK = p.k.data + it.b * T * p.k.token_stride + it.h * p.k.head_stride;
  const bf16* gV = p.v.data + it.b * T * p.v.token_stride + it.h * p.v.head_stride;
  const bf16* gQ = p.q.data + it.b * T * p.q.token_stride + it.h * p.q.head_stride;
  const bf16* gdO = p.dout.data + it.b * T * p.dout.token_stride + it.h * p.dout.head_stride;
  load_tile_rows_async<C::kBlockN, Dqk, C::kThreads>(sm.k, gK, p.k.token_stride, it.n0, T, tid);
  load_tile_rows_async<C::kBlockN, Dv, C::kThreads>(sm.v, gV, p.v.token_stride, it.n0, T, tid);
  load_tile_rows_async<C::kBlockM, Dqk, C::kThreads>(sm.q, gQ, p.q.token_stride, it.n0, T, tid);
  load_tile_rows_async<C::kBlockM, Dv, C::kThreads>(sm.dout, gdO, p.dout.token_stride, it.n0, T, tid);
  cp_async_commit();
  // lse * log2e and D of the first step (query block j) into stage 0; rows past T get lse = +inf (P = 0), D = 0.
  if (tid < 2 * C::kBlockM) {
    const int q = it.n0 + (tid % C::kBlockM);
    if (tid < C::kBlockM) sm.lse2[tid] = q < T ? p.lse[it.bh * T + q] * kLog2e : INFINITY;
    else sm.delta[tid - C::kBlockM] = q < T ? p.delta[it.bh * T + q] : 0.0f;
  }
  cp_async_wait<0>();
  __syncthreads();  // K and V (and the first Q, dO, lse, D) visible: the sweeps read their K or V fragments

  if (warp < C::kGroups) split_sweep<Dqk, Dv, 0>(p, sm, it, 0.0f, 0.0f);
  else split_sweep<Dqk, Dv, 1>(p, sm, it, 0.0f, 0.0f);
}

template <int Dqk, int Dv>
void launch_role_split_dkdv(const BwdParams& p, cudaStream_t stream) {
  using C = SplitConfig<Dqk, Dv>;
  const dim3 grid = tile_grid(p.group_heads, p.bh_count, (p.T + C::kBlockN - 1) / C::kBlockN);
  launch_with_smem(flash_attention_backward_dkdv_role_split_kernel<Dqk, Dv>, grid, C::kThreads, C::kSmemBytes, p,
                   stream);
}

}  // namespace

void launch_backward_role_split_dkdv(const BwdParams& p, int64_t Dqk, int64_t Dv, cudaStream_t stream) {
  with_family_head_dims<BwdKernels::role_split>(
      "flash_attention_backward", "launch_backward_role_split_dkdv", Dqk, Dv,
      [&](auto dqk, auto dv) { launch_role_split_dkdv<decltype(dqk)::value, decltype(dv)::value>(p, stream); });
}

}  // namespace fp4moe::attn
