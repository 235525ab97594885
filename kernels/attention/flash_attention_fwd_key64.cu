// Causal flash attention, forward (flash_attention.h), the key64 kernel (attention_heuristics.h: the pairs with
// Dqk < 128): one thread block per (query block, sequence, head), K and V streamed through shared memory in 64-key
// blocks (double-buffered cp.async), online softmax in registers (attention_fwd_block.cuh, shared with the key32
// kernel).
#include <algorithm>
#include <cmath>

#include "kernels/attention/attention_fwd_block.cuh"
#include "kernels/attention/attention_heuristics.h"
#include "kernels/attention/attention_params.cuh"
#include "kernels/attention/attention_tile.cuh"
#include "kernels/common/check.h"

namespace fp4moe::attn {
namespace {

// ---- configuration ------------------------------------------------------------------------------------------------

// Tiles per (Dqk, Dv): each warp owns kMTiles * 16 query rows of the block's kBlockM; the key block kBlockN keeps
// the score fragments (kMTiles * kBlockN / 2 FP32 per thread) beside the output's (kMTiles * Dv / 2) in registers.
// Up to Dqk = 96 a warp takes 32 rows (each K and V fragment read from shared memory feeds two products); from 128
// on it takes 16 rows with twice the warps, so that the accumulators fit in registers without spilling.
template <int Dqk, int Dv>
struct FwdConfig {
  static constexpr int kMTiles = Dqk >= 128 ? 1 : 2;
  static constexpr int kWarps = Dqk >= 128 ? 8 : 4;
  static constexpr int kBlockM = 16 * kMTiles * kWarps;
  static constexpr int kBlockN = 64;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kPitchQK = smem_pitch(Dqk), kPitchV = smem_pitch(Dv);
  // Q [kBlockM][kPitchQK], K [2][kBlockN][kPitchQK], V [2][kBlockN][kPitchV]
  static constexpr int kSmemBytes = 2 * (kBlockM * kPitchQK + 2 * kBlockN * (kPitchQK + kPitchV));
};

// ---- kernel -------------------------------------------------------------------------------------------------------

// grid (B*H, ceil(T / kBlockM)); the last query blocks (the most keys) are scheduled first.
template <int Dqk, int Dv>
__global__ void __launch_bounds__(FwdConfig<Dqk, Dv>::kThreads) flash_attention_forward_key64_kernel(FwdParams p) {
  using C = FwdConfig<Dqk, Dv>;
  constexpr int kVT = Dv / 8;  // n-tiles of an output row block

  bf16* sQ = dynamic_smem<bf16>();
  bf16* sK = sQ + C::kBlockM * C::kPitchQK;
  bf16* sV = sK + 2 * C::kBlockN * C::kPitchQK;

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, c = lane % 4;
  const int T = p.T;
  const int64_t bh = blockIdx.x, b = bh / p.H, h = bh % p.H;
  const int m0 = (gridDim.y - 1 - blockIdx.y) * C::kBlockM;
  const int warp_row0 = warp * 16 * C::kMTiles;                // first row of this warp in the block
  const int warp_q_first = m0 + warp_row0, warp_q_last = warp_q_first + 16 * C::kMTiles - 1;
  const int n_blocks = (std::min(m0 + C::kBlockM, T) + C::kBlockN - 1) / C::kBlockN;

  const bf16* gQ = p.q.data + b * T * p.q.token_stride + h * p.q.head_stride;
  const bf16* gK = p.k.data + b * T * p.k.token_stride + h * p.k.head_stride;
  const bf16* gV = p.v.data + b * T * p.v.token_stride + h * p.v.head_stride;

  load_tile_async<C::kBlockM, Dqk, C::kThreads>(sQ, gQ, p.q.token_stride, m0, T, tid);
  load_tile_async<C::kBlockN, Dqk, C::kThreads>(sK, gK, p.k.token_stride, 0, T, tid);
  load_tile_async<C::kBlockN, Dv, C::kThreads>(sV, gV, p.v.token_stride, 0, T, tid);
  cp_async_commit();

  float acc_o[C::kMTiles][kVT][4];
  float row_max[C::kMTiles][2], row_sum[C::kMTiles][2];  // rows g and g + 8 of each m-tile; raw scores, partial sums
  forward_rows_init<Dv, C>(acc_o, row_max, row_sum);

  for (int nb = 0; nb < n_blocks; ++nb) {
    const int stage = nb & 1, n0 = nb * C::kBlockN;
    if (nb + 1 < n_blocks) {  // prefetch the next key block into the other stage (free since the last barrier)
      const int next = stage ^ 1;
      load_tile_async<C::kBlockN, Dqk, C::kThreads>(sK + next * C::kBlockN * C::kPitchQK, gK, p.k.token_stride,
                                                    n0 + C::kBlockN, T, tid);
      load_tile_async<C::kBlockN, Dv, C::kThreads>(sV + next * C::kBlockN * C::kPitchV, gV, p.v.token_stride,
                                                   n0 + C::kBlockN, T, tid);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const bf16* sKs = sK + stage * C::kBlockN * C::kPitchQK;
    const bf16* sVs = sV + stage * C::kBlockN * C::kPitchV;

    if (n0 <= warp_q_last)  // else every key of the block is after every row of this warp: nothing to add
      forward_key_block<Dqk, Dv, C>(p, acc_o, row_max, row_sum, sQ, sKs, sVs, warp_row0, warp_q_first, n0,
                                    lane, g, c);
    __syncthreads();  // every warp is done with this stage before the next prefetch overwrites it
  }

  forward_rows_store<Dv, C>(p, acc_o, row_max, row_sum, T, b, h, bh, warp_q_first, g, c);
}

// ---- launcher -----------------------------------------------------------------------------------------------------

template <int Dqk, int Dv>
void launch_forward(const FwdParams& p, int64_t B, cudaStream_t stream) {
  using C = FwdConfig<Dqk, Dv>;
  const dim3 grid(static_cast<unsigned>(B * p.H), static_cast<unsigned>((p.T + C::kBlockM - 1) / C::kBlockM));
  launch_with_smem(flash_attention_forward_key64_kernel<Dqk, Dv>, grid, C::kThreads, C::kSmemBytes, p, stream);
}

}  // namespace

void launch_forward_key64(const FwdParams& p, int64_t B, int64_t Dqk, int64_t Dv, cudaStream_t stream) {
  with_family_head_dims<FwdKernel::key64>(
      "flash_attention_forward", "launch_forward_key64", Dqk, Dv,
      [&](auto dqk, auto dv) { launch_forward<decltype(dqk)::value, decltype(dv)::value>(p, B, stream); });
}

}  // namespace fp4moe::attn
