// Causal flash attention, backward variants 2 to 4 (flash_attention_variants.h): a dK/dV kernel whose warps split
// the products by role instead of by columns; variants 2 and 4 take dQ from variant 1's dQ kernel
// (flash_attention_bwd.cu, which recomputes S and dP), variant 3 computes dQ in the same sweep (5 products, not 7).
//
// Thread block: 64 keys (n0..n0+63) of one (sequence, head), 8 warps; warp w owns the 16 keys 16 (w % 4).. of the
// block and plays role w / 4 for them, over steps of 64 queries (the query blocks at or after the key block):
//   role 0: S^T = K Q^T (16 x 64), P^T = 2^(S^T scale log2e - lse log2e) (0 where the key is after the query),
//           P^T in FP32 to shared memory for its partner, then dV += P^T dO (16 x Dv, in registers);
//   role 1: dP^T = V dO^T (16 x 64), then, with its partner's P^T, dS^T = P^T (dP^T - D) and dK += dS^T Q
//           (16 x Dqk, in registers).
// Each warp computes a 16 x 64 block of scores for all 64 queries, so P^T and dS^T go from the score fragments
// into the next product without a round trip through shared memory (a_from_acc), and (unfused, where registers
// allow) each role reads its K or V fragments (the A operand of its first product) into registers once per thread
// block. Both roles do Dqk + Dv columns of products per step (192 + 128 at Dqk = 192, Dv = 128): balanced.
//
// Variant 3 (fused dQ): role 1 also stores dS^T (BF16) to shared memory, and after a block barrier all 8 warps
// compute the block's dQ contribution dS K (64 queries x Dqk: warp w takes the queries 16 (w % 4).. and, by role,
// the first kDqCols0 or the remaining columns) and add it into an FP32 accumulator dq_acc [B*H, T, Dqk] in a fixed
// order: query block m receives the contributions of key blocks m, m-1, ..., 0 in that order. Key block j, at query
// block m, waits until dq_flags[bh][m] == m - j (the m - j key blocks before it have stored), reads the partial sum
// (cp.async into shared memory, started at the beginning of the step), adds its own and stores it (or, as the last
// contributor j = 0, writes dQ = scale * sum as BF16), then sets the flag to m - j + 1. The sum for each element
// is ((c_m + c_{m-1}) + ...) + c_0 whatever the timing: deterministic, with integer flags and no float atomics.
// Work items are handed out by an atomic ticket counter (an integer atomicAdd), head by head and, within a head,
// from the last key block to the first, so that every key block a block waits for holds an earlier ticket: it is
// already running, and the block with the earliest unfinished ticket never waits. The thread blocks therefore make
// progress whatever order the hardware starts them in (no co-residency assumption). Within a head, key block j
// starts one ticket after key block j + 1 and reaches query block m one step after it: in the steady state the
// flag is already set when asked for.
#include <algorithm>
#include <cmath>

#include "kernels/attention/attention_params.cuh"
#include "kernels/attention/attention_tile.cuh"
#include "kernels/common/check.h"

namespace fp4moe::attn {
namespace {

// ---- configuration ------------------------------------------------------------------------------------------------

// Columns of the dQ contribution taken by role 0 warps: about 2/3 (role 0 does the lighter dV and waits less), a
// multiple of 16 in [16, Dqk - 16].
constexpr int dq_cols_role0(int Dqk) {
  const int steps = Dqk / 16, r0 = (2 * steps + 1) / 3;
  return 16 * (r0 < 1 ? 1 : r0 > steps - 1 ? steps - 1 : r0);
}

template <int Dqk, int Dv, bool Fused>
struct SplitConfig {
  static constexpr int kGroups = 4;             // key groups of 16: warps per role
  static constexpr int kWarps = 2 * kGroups;    // role 0: warps 0..3, role 1: warps 4..7
  static constexpr int kThreads = 32 * kWarps;  // 256
  static constexpr int kBlockN = 16 * kGroups;  // keys of the thread block
  static constexpr int kBlockM = 64;            // queries per step (= kBlockN: one dQ flag per query block)
  static constexpr int kST = kBlockM / 8;       // n-tiles of a warp's S^T / dP^T (16 x kBlockM)
  // K (role 0) and V (role 1) fragments held in registers, where they fit beside the accumulators (ptxas -v).
  static constexpr bool kKeepK = !Fused && Dqk / 4 + Dv / 2 <= 112, kKeepV = Dv / 4 + Dqk / 2 <= 128;
  static constexpr int kDqCols0 = dq_cols_role0(Dqk), kDqCols1 = Dqk - kDqCols0;
  static constexpr int kPitchQK = smem_pitch(Dqk), kPitchV = smem_pitch(Dv), kPitchS = smem_pitch(kBlockM);
  static constexpr int kPitchAcc = Dqk + 8;  // FP32 elements: rows 32 bytes apart modulo 128 (no bank conflicts)
  // Shared memory (bytes): K [kBlockN][kPitchQK], V [kBlockN][kPitchV], Q [2][kBlockM][kPitchQK],
  // dO [2][kBlockM][kPitchV] (BF16); P^T exchange [kGroups][kST][32 lanes] float4; lse * log2e and D [2][kBlockM]
  // (FP32); fused: dS^T [kBlockN][kPitchS] (BF16) and the dq_acc rows of the step [kBlockM][kPitchAcc] (FP32).
  static constexpr int kOffV = 2 * kBlockN * kPitchQK;
  static constexpr int kOffQ = kOffV + 2 * kBlockN * kPitchV;
  static constexpr int kOffdO = kOffQ + 2 * 2 * kBlockM * kPitchQK;
  static constexpr int kOffP = kOffdO + 2 * 2 * kBlockM * kPitchV;
  static constexpr int kOffLse = kOffP + 16 * kGroups * kST * 32;
  static constexpr int kOffDelta = kOffLse + 4 * 2 * kBlockM;
  static constexpr int kOffdS = kOffDelta + 4 * 2 * kBlockM;
  static constexpr int kOffAcc = kOffdS + (Fused ? 2 * kBlockN * kPitchS : 0);
  static constexpr int kSmemBytes = kOffAcc + (Fused ? 4 * kBlockM * kPitchAcc : 0);
};

// Pointers into the shared memory of SplitConfig.
struct SplitSmem {
  bf16 *k, *v, *q, *dout, *ds;
  float4* p;  // P^T exchange
  float *lse2, *delta, *acc;
};

// The work item of a thread block.
struct SplitItem {
  int64_t bh, b, h;
  int j;        // key block
  int n0;       // its first key
  int n_steps;  // query blocks j .. M - 1
};

// Starts the copy of rows row0 .. row0 + ROWS - 1 of an FP32 [rows][D] matrix (row r at base + r * D, 16-byte
// aligned, D % 4 == 0) into smem [ROWS][pitch]; rows at or past row_end are zero-filled. All THREADS threads call
// it. Each thread keeps one 16-byte column and steps over rows, so that its addresses advance by a constant (no
// per-copy index arithmetic for the compiler to hoist out of the caller's loop and keep in registers).
template <int ROWS, int D, int THREADS>
__device__ __forceinline__ void load_rows_f32_async(float* smem, int pitch, const float* base, int row0, int row_end,
                                                    int tid) {
  constexpr int kChunks = D / 4, kRowsPerPass = THREADS / kChunks;
  static_assert(kRowsPerPass >= 1, "a row of 16-byte pieces per pass at most");
  if (tid >= kRowsPerPass * kChunks) return;
  const int c = tid % kChunks, r0 = tid / kChunks;
#pragma unroll
  for (int r = r0; r < ROWS; r += kRowsPerPass) {
    const bool valid = row0 + r < row_end;
    detail::cp_async_16(smem + r * pitch + c * 4, base + (valid ? static_cast<int64_t>(row0 + r) * D : 0) + c * 4,
                        valid);
  }
}

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
#pragma unroll
  for (int j = 0; j < kST; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) acc_s[j][r] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < Dqk / 16; ++kk) {
    uint32_t a[4];
    if constexpr (C::kKeepK) {
#pragma unroll
      for (int r = 0; r < 4; ++r) a[r] = kf[kk][r];
    } else {
      load_a(a, sm.k, C::kPitchQK, key_row0, kk * 16, lane);
    }
#pragma unroll
    for (int jj = 0; jj < kST / 2; ++jj) {
      uint32_t bq[4];
      load_b_from_rows_n(bq, sQs, C::kPitchQK, jj * 16, kk * 16, lane);
      mma_bf16_16816(acc_s[2 * jj], a, bq[0], bq[1]);
      mma_bf16_16816(acc_s[2 * jj + 1], a, bq[2], bq[3]);
    }
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
  for (int kk = 0; kk < C::kBlockM / 16; ++kk) {
#pragma unroll
    for (int jj = 0; jj < Dv / 16; ++jj) {
      uint32_t bo[4];
      load_b_from_rows_k(bo, sdOs, C::kPitchV, kk * 16, jj * 16, lane);
      mma_bf16_16816(acc_dv[2 * jj], pf[kk], bo[0], bo[1]);
      mma_bf16_16816(acc_dv[2 * jj + 1], pf[kk], bo[2], bo[3]);
    }
  }
}

// Role 1's step: dP^T, dS^T = P^T (dP^T - D) with its partner's P^T (and, fused, dS^T to shared memory as BF16),
// dK += dS^T Q.
template <int Dqk, int Dv, typename C, bool Fused>
__device__ __forceinline__ void role1_step(const SplitSmem& sm, const bf16* sQs, const bf16* sdOs, const float* delta,
                                           const uint32_t (&vf)[C::kKeepV ? Dv / 16 : 1][4],
                                           float (&acc_dk)[Dqk / 8][4], int kg, int lane) {
  constexpr int kST = C::kST;
  const int g = lane / 4, c = lane % 4, key_row0 = 16 * kg;
  float acc_dp[kST][4];
#pragma unroll
  for (int j = 0; j < kST; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) acc_dp[j][r] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < Dv / 16; ++kk) {
    uint32_t a[4];
    if constexpr (C::kKeepV) {
#pragma unroll
      for (int r = 0; r < 4; ++r) a[r] = vf[kk][r];
    } else {
      load_a(a, sm.v, C::kPitchV, key_row0, kk * 16, lane);
    }
#pragma unroll
    for (int jj = 0; jj < kST / 2; ++jj) {
      uint32_t bo[4];
      load_b_from_rows_n(bo, sdOs, C::kPitchV, jj * 16, kk * 16, lane);
      mma_bf16_16816(acc_dp[2 * jj], a, bo[0], bo[1]);
      mma_bf16_16816(acc_dp[2 * jj + 1], a, bo[2], bo[3]);
    }
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
  // dS^T rounded to BF16 (A fragments of dK += dS^T Q, packed at once); fused: also to shared memory for dQ, where
  // dsf[kk][i] holds (row g + 8 (i % 2), columns 16 kk + 8 (i / 2) + 2c, +1).
  uint32_t dsf[C::kBlockM / 16][4];
#pragma unroll
  for (int kk = 0; kk < C::kBlockM / 16; ++kk) a_from_acc(dsf[kk], acc_dp[2 * kk], acc_dp[2 * kk + 1]);
  if constexpr (Fused) {
#pragma unroll
    for (int kk = 0; kk < C::kBlockM / 16; ++kk)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        *reinterpret_cast<uint32_t*>(sm.ds + (key_row0 + g + 8 * (i % 2)) * C::kPitchS + kk * 16 + 8 * (i / 2) +
                                     2 * c) = dsf[kk][i];
  }
#pragma unroll
  for (int kk = 0; kk < C::kBlockM / 16; ++kk) {
#pragma unroll
    for (int jj = 0; jj < Dqk / 16; ++jj) {
      uint32_t bq[4];
      load_b_from_rows_k(bq, sQs, C::kPitchQK, kk * 16, jj * 16, lane);
      mma_bf16_16816(acc_dk[2 * jj], dsf[kk], bq[0], bq[1]);
      mma_bf16_16816(acc_dk[2 * jj + 1], dsf[kk], bq[2], bq[3]);
    }
  }
}

// The fused dQ of one step for this warp: queries 16 kg.. of the step, columns col0 .. col0 + COLS - 1:
// part = dS K over the block's 64 keys; then sum = part (first contributor) or the stored partial sum + part;
// the last contributor writes dQ = scale * sum as BF16, the others store sum into dq_acc. The dS fragments are read
// once; the columns go in chunks of 32 (or 16) so that only one chunk's accumulator is live.
template <int Dqk, int COLS, typename C>
__device__ __forceinline__ void dq_step(const BwdParams& p, const SplitSmem& sm, const SplitItem& it, int col0,
                                        int kg, int lane, int m0, bool first, bool last) {
  constexpr int kKS = C::kBlockN / 16, kChunk = COLS % 32 == 0 ? 32 : 16;
  const int g = lane / 4, c = lane % 4, T = p.T;
  uint32_t a[kKS][4];
#pragma unroll
  for (int kk = 0; kk < kKS; ++kk) load_a_trans(a[kk], sm.ds, C::kPitchS, 16 * kg, kk * 16, lane);
#pragma unroll
  for (int c0 = 0; c0 < COLS; c0 += kChunk) {
    float acc[kChunk / 8][4];
#pragma unroll
    for (int j = 0; j < kChunk / 8; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[j][r] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kKS; ++kk)
#pragma unroll
      for (int jj = 0; jj < kChunk / 16; ++jj) {
        uint32_t bk[4];
        load_b_from_rows_k(bk, sm.k, C::kPitchQK, kk * 16, col0 + c0 + jj * 16, lane);
        mma_bf16_16816(acc[2 * jj], a[kk], bk[0], bk[1]);
        mma_bf16_16816(acc[2 * jj + 1], a[kk], bk[2], bk[3]);
      }
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int r = 16 * kg + g + 8 * hr, q = m0 + r;
      if (q >= T) continue;
      const int col = col0 + c0 + 2 * c;
      const float* prev = sm.acc + r * C::kPitchAcc + col;
      float* acc_row = p.dq_acc + (it.bh * T + q) * Dqk + col;
      bf16* dq_row = p.dq.data + (it.b * T + q) * p.dq.token_stride + it.h * p.dq.head_stride + col;
#pragma unroll
      for (int j = 0; j < kChunk / 8; ++j) {
        float2 v = make_float2(acc[j][2 * hr], acc[j][2 * hr + 1]);
        if (!first) {
          const float2 s = *reinterpret_cast<const float2*>(prev + j * 8);
          v.x = s.x + v.x;
          v.y = s.y + v.y;
        }
        if (last) store_bf16x2(dq_row + j * 8, v.x * p.scale, v.y * p.scale);
        else __stcg(reinterpret_cast<float2*>(acc_row + j * 8), v);
      }
    }
  }
}

// ---- kernel -------------------------------------------------------------------------------------------------------

// One role's whole sweep over the query blocks of the item; both roles pass the same block barriers in the same
// order. Ends with dK (role 1) or dV (role 0) written.
template <int Dqk, int Dv, bool Fused, int Role>
__device__ __forceinline__ void split_sweep(const BwdParams& p, const SplitSmem& sm, const SplitItem& it,
                                            float next_lse2, float next_delta) {
  using C = SplitConfig<Dqk, Dv, Fused>;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, kg = warp % C::kGroups;
  const int g = lane / 4, c = lane % 4, key_row0 = 16 * kg;
  const int T = p.T;
  const bf16* gQ = p.q.data + it.b * T * p.q.token_stride + it.h * p.q.head_stride;
  const bf16* gdO = p.dout.data + it.b * T * p.dout.token_stride + it.h * p.dout.head_stride;
  const float* gL = p.lse + it.bh * T;
  const float* gD = p.delta + it.bh * T;
  int* flags = Fused ? p.dq_flags + it.bh * ((T + C::kBlockM - 1) / C::kBlockM) : nullptr;

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
#pragma unroll
  for (int j = 0; j < kOutT; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) acc_out[j][r] = 0.0f;

  for (int i = 0; i < it.n_steps; ++i) {
    const int mb = it.j + i, m0 = mb * C::kBlockM, buf = i & 1;
    const bool has_next = i + 1 < it.n_steps;
    if (i > 0 && tid < 2 * C::kBlockM) {  // lse / D of this step, loaded during the last one
      if (tid < C::kBlockM) sm.lse2[buf * C::kBlockM + tid] = next_lse2;
      else sm.delta[buf * C::kBlockM + tid - C::kBlockM] = next_delta;
    }
    cp_async_wait<0>();  // Q and dO of this step
    block_barrier();     // (A) ... visible to all; every warp is done with step i - 1
    if constexpr (Fused) {
      // Step i - 1's sums are stored (before barrier A): publish them to key block j - 1 at once (not after this
      // step's wait, which would chain the releases of a head's key blocks one after the other).
      if (tid == 0 && i > 0 && it.j > 0) {
        __threadfence();
        store_release_gpu(flags + mb - 1, i);
      }
      if (i > 0) {
        // Each thread waits for the i key blocks after this one to have added into query block mb (already so in
        // the steady state), then starts its part of the copy of the partial sum.
        while (load_acquire_gpu(flags + mb) < i) __nanosleep(32);
        load_rows_f32_async<C::kBlockM, Dqk, C::kThreads>(sm.acc, C::kPitchAcc, p.dq_acc + it.bh * T * Dqk, m0, T,
                                                          tid);
        cp_async_commit();
      }
    }
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
      role1_step<Dqk, Dv, C, Fused>(sm, sQs, sdOs, sm.delta + buf * C::kBlockM, vf, acc_out, kg, lane);

    if constexpr (Fused) {
      if (i > 0) {  // the partial sum has landed (the next step's copy may still fly)
        if (has_next) cp_async_wait<1>();
        else cp_async_wait<0>();
      }
      block_barrier();  // (B) dS^T and the partial sum visible to all
      if constexpr (Role == 0) dq_step<Dqk, C::kDqCols0, C>(p, sm, it, 0, kg, lane, m0, i == 0, it.j == 0);
      else dq_step<Dqk, C::kDqCols1, C>(p, sm, it, C::kDqCols0, kg, lane, m0, i == 0, it.j == 0);
    }
  }
  if constexpr (Fused) {  // publish the last step's sums
    block_barrier();
    if (tid == 0 && it.j > 0) {
      __threadfence();
      store_release_gpu(flags + it.j + it.n_steps - 1, it.n_steps);
    }
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

// Unfused: blocks over (sequence-head bh, key block j) in block_tile's order with p.group_heads (tile = j: the first
// key blocks, with the most queries, first), grid tile_grid's. Fused: grid (B*H, ceil(T / 64)), the item of a block
// comes from the ticket counter (see the top of the file).
template <int Dqk, int Dv, bool Fused>
__global__ void __launch_bounds__(SplitConfig<Dqk, Dv, Fused>::kThreads, 1)
    flash_attention_backward_split_kernel(BwdParams p) {
  using C = SplitConfig<Dqk, Dv, Fused>;
  static_assert(Dqk % 16 == 0 && Dv % 16 == 0, "head dims must be multiples of 16 (mma k-steps, ldmatrix pairs)");
  static_assert(C::kBlockM == C::kBlockN, "one dQ flag per query block needs query steps as long as key blocks");
  static_assert(C::kDqCols0 % 16 == 0 && C::kDqCols1 % 16 == 0 && C::kDqCols1 > 0, "dQ columns in ldmatrix pairs");
  static_assert(C::kSmemBytes <= 227 * 1024, "tiles exceed the 227 KiB of shared memory of a Hopper thread block");
  static_assert(Dqk / 2 + C::kST * 4 + (C::kKeepV ? Dv / 4 : 0) <= 192 &&
                    Dv / 2 + C::kST * 4 + (C::kKeepK ? Dqk / 4 : 0) <= 192,
                "accumulators would not fit in registers");

  unsigned char* smem = dynamic_smem<unsigned char>();
  const SplitSmem sm{reinterpret_cast<bf16*>(smem),
                     reinterpret_cast<bf16*>(smem + C::kOffV),
                     reinterpret_cast<bf16*>(smem + C::kOffQ),
                     reinterpret_cast<bf16*>(smem + C::kOffdO),
                     reinterpret_cast<bf16*>(smem + C::kOffdS),
                     reinterpret_cast<float4*>(smem + C::kOffP),
                     reinterpret_cast<float*>(smem + C::kOffLse),
                     reinterpret_cast<float*>(smem + C::kOffDelta),
                     reinterpret_cast<float*>(smem + C::kOffAcc)};
  const int tid = threadIdx.x, warp = tid / 32;
  const int T = p.T, n_kb = (T + C::kBlockN - 1) / C::kBlockN;

  SplitItem it{};
  if constexpr (Fused) {
    __shared__ unsigned long long s_ticket;
    if (tid == 0) s_ticket = atomicAdd(p.ticket, 1ull);
    __syncthreads();
    const unsigned long long t = s_ticket;
    it.bh = static_cast<int64_t>(t / n_kb);
    it.j = n_kb - 1 - static_cast<int>(t % n_kb);
  } else {
    if (!block_tile(p.group_heads, p.bh_count, it.bh, it.j)) return;
  }
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

  if (warp < C::kGroups) split_sweep<Dqk, Dv, Fused, 0>(p, sm, it, 0.0f, 0.0f);
  else split_sweep<Dqk, Dv, Fused, 1>(p, sm, it, 0.0f, 0.0f);
}

template <int Dqk, int Dv, bool Fused>
void launch_split(const BwdParams& p, int64_t B, cudaStream_t stream) {
  using C = SplitConfig<Dqk, Dv, Fused>;
  auto* kernel = flash_attention_backward_split_kernel<Dqk, Dv, Fused>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes));
  const int64_t tiles = (p.T + C::kBlockN - 1) / C::kBlockN;
  const dim3 grid = Fused ? dim3(static_cast<unsigned>(B * p.H), static_cast<unsigned>(tiles))
                          : tile_grid(p.group_heads, p.bh_count, tiles);
  kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_backward_split(bool fused_dq, const BwdParams& p, int64_t B, int64_t Dqk, int64_t Dv,
                           cudaStream_t stream) {
  with_head_dims("flash_attention_backward", Dqk, Dv, [&](auto dqk, auto dv) {
    constexpr int kDqk = decltype(dqk)::value, kDv = decltype(dv)::value;
    if (fused_dq) launch_split<kDqk, kDv, true>(p, B, stream);
    else launch_split<kDqk, kDv, false>(p, B, stream);
  });
}

}  // namespace fp4moe::attn
