// Causal flash attention, backward (flash_attention.h): the kernels that both backward variants run
// (attention_heuristics.h), deterministic (no atomics):
//   1. D = rowsum(dO * O) into the workspace, one warp per (token, head), before either variant's dK/dV kernel;
//   3. dQ: one thread block per (query block, sequence, head), looping over the key blocks up to it, dS kept in
//      registers for the product with K; after column_split's dK/dV kernel (flash_attention_bwd_column_split.cu)
//      with tile copies by 16-byte piece, after role_split's (flash_attention_bwd_role_split.cu) with row-stepping
//      tile copies and the head-grouped block order.
// Scores are recomputed from Q, K and the forward's lse in dQ as in the dK/dV kernels (the price of having no
// atomics).
#include <algorithm>
#include <cmath>

#include "kernels/attention/attention_bwd_block.cuh"
#include "kernels/attention/attention_heuristics.h"
#include "kernels/attention/attention_params.cuh"
#include "kernels/attention/attention_tile.cuh"
#include "kernels/common/check.h"

namespace fp4moe::attn {
namespace {

// ---- configuration ------------------------------------------------------------------------------------------------

// dQ: each warp owns 16 query rows with their full dQ accumulator (16 x Dqk); the key block is narrower at
// Dqk = 192 so that the score and dP fragments fit beside it.
template <int Dqk, int Dv>
struct BwdQConfig {
  static constexpr int kWarps = 8;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBlockM = 16 * kWarps;
  static constexpr int kBlockN = Dqk >= 192 ? 32 : 64;
  static constexpr int kPitchQK = smem_pitch(Dqk), kPitchV = smem_pitch(Dv);
  // Q [kBlockM][kPitchQK], dO [kBlockM][kPitchV], K [2][kBlockN][kPitchQK], V [2][kBlockN][kPitchV]
  static constexpr int kSmemBytes = 2 * (kBlockM * (kPitchQK + kPitchV) + 2 * kBlockN * (kPitchQK + kPitchV));
};

// ---- 1. D = rowsum(dO * O) --------------------------------------------------------------------------------------

constexpr int kDeltaWarps = 8;

constexpr int max_dv_of_pairs() {
  int m = 0;
  for (const auto& pair : kAttentionPairs) m = pair[1] > m ? pair[1] : m;
  return m;
}

// One warp per (row r = b*T + t, head h) (grid-stride): lane i multiplies the 16-byte pieces i of dO and O
// (Dv <= 256), then a fixed shuffle tree adds the lanes.
__global__ void __launch_bounds__(32 * kDeltaWarps) attention_backward_delta_kernel(BwdParams p, int64_t rows) {
  static_assert(max_dv_of_pairs() <= 32 * 8, "one 16-byte piece of a row per lane: Dv <= 256");
  const int lane = threadIdx.x % 32;
  const int64_t total = rows * p.H;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * kDeltaWarps + threadIdx.x / 32; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * kDeltaWarps) {  // the same for every lane: whole warps
    const int64_t r = idx / p.H, h = idx % p.H, b = r / p.T, t = r % p.T;
    float sum = 0.0f;
    if (lane * 8 < p.Dv) {
      const uint4 ov =
          *reinterpret_cast<const uint4*>(p.o.data + r * p.o.token_stride + h * p.o.head_stride + lane * 8);
      const uint4 dv =
          *reinterpret_cast<const uint4*>(p.dout.data + r * p.dout.token_stride + h * p.dout.head_stride + lane * 8);
      const auto* o2 = reinterpret_cast<const __nv_bfloat162*>(&ov);
      const auto* d2 = reinterpret_cast<const __nv_bfloat162*>(&dv);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 of = __bfloat1622float2(o2[i]), df = __bfloat1622float2(d2[i]);
        sum = fmaf(of.x, df.x, sum);
        sum = fmaf(of.y, df.y, sum);
      }
    }
    sum = warp_sum(sum);
    if (lane == 0) p.delta[(b * p.H + h) * p.T + t] = sum;
  }
}

// ---- 3. dQ --------------------------------------------------------------------------------------------------------

// The last query blocks (the most keys) are scheduled first. kGrouped false (column_split): grid (B*H,
// ceil(T / kBlockM)), tile copies by 16-byte piece (load_tile_async). kGrouped true (role_split): block_tile's order
// with p.group_heads, grid tile_grid's, and row-stepping tile copies (load_tile_rows_async).
template <int Dqk, int Dv, bool kGrouped>
__global__ void __launch_bounds__(BwdQConfig<Dqk, Dv>::kThreads) flash_attention_backward_dq_kernel(BwdParams p) {
  using C = BwdQConfig<Dqk, Dv>;
  static_assert(Dqk % 16 == 0 && Dv % 16 == 0, "head dims must be multiples of 16 (mma k-steps, ldmatrix pairs)");
  static_assert(C::kBlockN % 16 == 0 && C::kBlockM == 16 * C::kWarps, "tiles must be multiples of 16");
  static_assert(C::kSmemBytes <= 227 * 1024, "tiles exceed the 227 KiB of shared memory of a Hopper thread block");
  static_assert(Dqk / 2 + C::kBlockN <= 160, "accumulators would not fit in registers");
  constexpr int kNT = C::kBlockN / 8;  // n-tiles of a score row block
  constexpr int kQT = Dqk / 8;         // n-tiles of a dQ row block

  bf16* sQ = dynamic_smem<bf16>();
  bf16* sdO = sQ + C::kBlockM * C::kPitchQK;
  bf16* sK = sdO + C::kBlockM * C::kPitchV;
  bf16* sV = sK + 2 * C::kBlockN * C::kPitchQK;

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, c = lane % 4;
  const int T = p.T;
  int64_t bh = blockIdx.x;
  int m0 = (gridDim.y - 1 - blockIdx.y) * C::kBlockM;
  if constexpr (kGrouped) {
    int tile = 0;
    if (!block_tile(p.group_heads, p.bh_count, bh, tile)) return;
    m0 = ((T + C::kBlockM - 1) / C::kBlockM - 1 - tile) * C::kBlockM;
  }
  const int64_t b = bh / p.H, h = bh % p.H;
  const int warp_row0 = warp * 16;
  const int warp_q_first = m0 + warp_row0, warp_q_last = warp_q_first + 15;
  const int n_blocks = (std::min(m0 + C::kBlockM, T) + C::kBlockN - 1) / C::kBlockN;

  const bf16* gQ = p.q.data + b * T * p.q.token_stride + h * p.q.head_stride;
  const bf16* gK = p.k.data + b * T * p.k.token_stride + h * p.k.head_stride;
  const bf16* gV = p.v.data + b * T * p.v.token_stride + h * p.v.head_stride;
  const bf16* gdO = p.dout.data + b * T * p.dout.token_stride + h * p.dout.head_stride;

  copy_tile_async<kGrouped, C::kBlockM, Dqk, C::kThreads>(sQ, gQ, p.q.token_stride, m0, T, tid);
  copy_tile_async<kGrouped, C::kBlockM, Dv, C::kThreads>(sdO, gdO, p.dout.token_stride, m0, T, tid);
  copy_tile_async<kGrouped, C::kBlockN, Dqk, C::kThreads>(sK, gK, p.k.token_stride, 0, T, tid);
  copy_tile_async<kGrouped, C::kBlockN, Dv, C::kThreads>(sV, gV, p.v.token_stride, 0, T, tid);
  cp_async_commit();

  float lse2[2], delta[2];
  dq_row_stats(p, bh, warp_q_first, g, lse2, delta);

  float acc_dq[kQT][4];
  zero_fragments(acc_dq);

  for (int nb = 0; nb < n_blocks; ++nb) {
    const int stage = nb & 1, n0 = nb * C::kBlockN;
    if (nb + 1 < n_blocks) {  // prefetch the next key block into the other stage
      const int next = stage ^ 1;
      copy_tile_async<kGrouped, C::kBlockN, Dqk, C::kThreads>(sK + next * C::kBlockN * C::kPitchQK, gK,
                                                              p.k.token_stride, n0 + C::kBlockN, T, tid);
      copy_tile_async<kGrouped, C::kBlockN, Dv, C::kThreads>(sV + next * C::kBlockN * C::kPitchV, gV,
                                                             p.v.token_stride, n0 + C::kBlockN, T, tid);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const bf16* sKs = sK + stage * C::kBlockN * C::kPitchQK;
    const bf16* sVs = sV + stage * C::kBlockN * C::kPitchV;

    if (n0 <= warp_q_last) {  // else every key of the block is after every row of this warp
      // S = Q K^T, dP = dO V^T
      float acc_s[kNT][4], acc_dp[kNT][4];
      zero_fragments(acc_s);
      zero_fragments(acc_dp);
#pragma unroll
      for (int kk = 0; kk < Dqk / 16; ++kk) {
        uint32_t a[4];
        load_a(a, sQ, C::kPitchQK, warp_row0, kk * 16, lane);
        mma_b_rows_n(acc_s, a, sKs, C::kPitchQK, 0, kk * 16, lane);
      }
#pragma unroll
      for (int kk = 0; kk < Dv / 16; ++kk) {
        uint32_t a[4];
        load_a(a, sdO, C::kPitchV, warp_row0, kk * 16, lane);
        mma_b_rows_n(acc_dp, a, sVs, C::kPitchV, 0, kk * 16, lane);
      }

      // dS = P (dP - D), kept in acc_s.
      dq_scores_to_ds(acc_s, acc_dp, lse2, delta, p.scale_log2, warp_q_first, n0, g, c);

      // dQ += dS K, dS rounded to BF16 straight from the fragments.
#pragma unroll
      for (int kk = 0; kk < kNT / 2; ++kk) {
        uint32_t a[4];
        a_from_acc(a, acc_s[2 * kk], acc_s[2 * kk + 1]);
        mma_b_rows_k(acc_dq, a, sKs, C::kPitchQK, kk * 16, 0, lane);
      }
    }
    __syncthreads();  // every warp is done with this stage before the next prefetch overwrites it
  }

  dq_rows_store(p, acc_dq, b, h, warp_q_first, g, c);  // dQ = scale dS K
}

// ---- launchers ----------------------------------------------------------------------------------------------------

template <int Dqk, int Dv>
void launch_dq(const BwdParams& p, int64_t B, cudaStream_t stream) {
  using Q = BwdQConfig<Dqk, Dv>;
  const dim3 q_grid(static_cast<unsigned>(B * p.H), static_cast<unsigned>((p.T + Q::kBlockM - 1) / Q::kBlockM));
  launch_with_smem(flash_attention_backward_dq_kernel<Dqk, Dv, false>, q_grid, Q::kThreads, Q::kSmemBytes, p, stream);
}

template <int Dqk, int Dv>
void launch_dq_grouped(const BwdParams& p, cudaStream_t stream) {
  using Q = BwdQConfig<Dqk, Dv>;
  const dim3 grid = tile_grid(p.group_heads, p.bh_count, (p.T + Q::kBlockM - 1) / Q::kBlockM);
  launch_with_smem(flash_attention_backward_dq_kernel<Dqk, Dv, true>, grid, Q::kThreads, Q::kSmemBytes, p, stream);
}

}  // namespace

void launch_backward_delta(const BwdParams& p, int64_t B, cudaStream_t stream) {
  const int64_t rows = B * p.T;
  const int64_t blocks = std::min<int64_t>(ceil_div(rows * p.H, kDeltaWarps), int64_t{1} << 20);
  attention_backward_delta_kernel<<<static_cast<unsigned>(blocks), 32 * kDeltaWarps, 0, stream>>>(p, rows);
  CUDA_CHECK_LAUNCH();
}

void launch_backward_dq(const BwdParams& p, int64_t B, int64_t Dqk, int64_t Dv, cudaStream_t stream) {
  with_family_head_dims<BwdKernels::column_split>(
      "flash_attention_backward", "launch_backward_dq", Dqk, Dv,
      [&](auto dqk, auto dv) { launch_dq<decltype(dqk)::value, decltype(dv)::value>(p, B, stream); });
}

void launch_backward_dq_grouped(const BwdParams& p, int64_t Dqk, int64_t Dv, cudaStream_t stream) {
  with_family_head_dims<BwdKernels::role_split>(
      "flash_attention_backward", "launch_backward_dq_grouped", Dqk, Dv,
      [&](auto dqk, auto dv) { launch_dq_grouped<decltype(dqk)::value, decltype(dv)::value>(p, stream); });
}

}  // namespace fp4moe::attn
