// Causal flash attention, forward (flash_attention.h), the key32 kernel (attention_heuristics.h: the pairs with
// Dqk >= 128): the arithmetic of the key64 kernel (attention_fwd_block.cuh: the same products, online softmax and
// roundings) with 32 query rows per warp (4 warps, 128-row query tiles) against 32-key blocks: every K and V fragment
// read from shared memory feeds two m-tiles (S: 4 ldmatrix per 8 mma, P V: 1 per 4), the score fragments stay small
// enough for the 32-row output accumulator, and two thread blocks fit an SM (94 KiB of shared memory at Dqk = 192,
// Dv = 128). At Dv = 192 the output accumulator of 32 rows would not fit in registers: 16 rows, 8 warps there. The
// online softmax rescales every 32 keys instead of 64: O and lse differ from the key64 kernel's by FP32 rounding.
// Tile copies step over rows (load_tile_rows_async); blocks in the head-grouped order of block_tile.
// Pipeline: K/V blocks double-buffered; at each key block: wait for its copy, one barrier (the copy is visible and
// every warp is done with the previous block, whose stage the next prefetch then overwrites), prefetch, compute.
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

// Each warp owns kMTiles * 16 query rows of the block's kBlockM; 32-key blocks; 32 rows per warp and 4 warps, or
// 16 rows and 8 warps at Dv > 128.
template <int Dqk, int Dv>
struct Key32FwdConfig {
  static constexpr int kMTiles = Dv <= 128 ? 2 : 1, kWarps = Dv <= 128 ? 4 : 8, kBlockN = 32;
  static constexpr int kBlockM = 16 * kMTiles * kWarps;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kPitchQK = smem_pitch(Dqk), kPitchV = smem_pitch(Dv);
  // Q [kBlockM][kPitchQK], K [2][kBlockN][kPitchQK], V [2][kBlockN][kPitchV]
  static constexpr int kSmemBytes = 2 * (kBlockM * kPitchQK + 2 * kBlockN * (kPitchQK + kPitchV));
};

// ---- kernel -------------------------------------------------------------------------------------------------------

// Blocks over (sequence-head, 128-row query tile) in block_tile's order with p.group_heads; tile 0 is the last
// query tile (the most keys): the heaviest first.
template <int Dqk, int Dv>
__global__ void __launch_bounds__(Key32FwdConfig<Dqk, Dv>::kThreads)
    flash_attention_forward_key32_kernel(FwdParams p) {
  using C = Key32FwdConfig<Dqk, Dv>;
  constexpr int kVT = Dv / 8;  // n-tiles of an output row block

  bf16* sQ = dynamic_smem<bf16>();
  bf16* sK = sQ + C::kBlockM * C::kPitchQK;
  bf16* sV = sK + 2 * C::kBlockN * C::kPitchQK;

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, c = lane % 4;
  const int T = p.T;
  int64_t bh = 0;
  int tile = 0;
  if (!block_tile(p.group_heads, p.bh_count, bh, tile)) return;
  const int64_t b = bh / p.H, h = bh % p.H;
  const int m0 = ((T + C::kBlockM - 1) / C::kBlockM - 1 - tile) * C::kBlockM;
  const int warp_row0 = warp * 16 * C::kMTiles;  // first row of this warp in the block
  const int warp_q_first = m0 + warp_row0, warp_q_last = warp_q_first + 16 * C::kMTiles - 1;
  const int n_blocks = (std::min(m0 + C::kBlockM, T) + C::kBlockN - 1) / C::kBlockN;

  const bf16* gQ = p.q.data + b * T * p.q.token_stride + h * p.q.head_stride;
  const bf16* gK = p.k.data + b * T * p.k.token_stride + h * p.k.head_stride;
  const bf16* gV = p.v.data + b * T * p.v.token_stride + h * p.v.head_stride;

  // Q and the first key block as two cp.async groups, as measured (one group: 248 registers instead of 251 at
  // (192, 128), a different schedule); the first wait of the key loop takes both.
  load_tile_rows_async<C::kBlockM, Dqk, C::kThreads>(sQ, gQ, p.q.token_stride, m0, T, tid);
  cp_async_commit();
  load_tile_rows_async<C::kBlockN, Dqk, C::kThreads>(sK, gK, p.k.token_stride, 0, T, tid);
  load_tile_rows_async<C::kBlockN, Dv, C::kThreads>(sV, gV, p.v.token_stride, 0, T, tid);
  cp_async_commit();

  float acc_o[C::kMTiles][kVT][4];
  float row_max[C::kMTiles][2], row_sum[C::kMTiles][2];  // rows g and g + 8 of each m-tile; raw scores, partial sums
  forward_rows_init<Dv, C>(acc_o, row_max, row_sum);

  for (int nb = 0; nb < n_blocks; ++nb) {
    const int stage = nb & 1, n0 = nb * C::kBlockN;
    cp_async_wait<0>();  // this key block (at the first, also Q): nothing else in flight
    __syncthreads();     // ... visible to all; every warp is done with key block nb - 1 (the other stage)
    if (nb + 1 < n_blocks) {
      const int next = stage ^ 1;
      load_tile_rows_async<C::kBlockN, Dqk, C::kThreads>(sK + next * C::kBlockN * C::kPitchQK, gK, p.k.token_stride,
                                                         n0 + C::kBlockN, T, tid);
      load_tile_rows_async<C::kBlockN, Dv, C::kThreads>(sV + next * C::kBlockN * C::kPitchV, gV, p.v.token_stride,
                                                        n0 + C::kBlockN, T, tid);
      cp_async_commit();
    }
    if (n0 > warp_q_last) continue;  // every key of the block is after every row of this warp: nothing to add
    const bf16* sKs = sK + stage * C::kBlockN * C::kPitchQK;
    const bf16* sVs = sV + stage * C::kBlockN * C::kPitchV;

    forward_key_block<Dqk, Dv, C>(p, acc_o, row_max, row_sum, sQ, sKs, sVs, warp_row0, warp_q_first, n0,
                                  lane, g, c);
  }

  forward_rows_store<Dv, C>(p, acc_o, row_max, row_sum, T, b, h, bh, warp_q_first, g, c);
}

template <int Dqk, int Dv>
void launch_forward(const FwdParams& p, cudaStream_t stream) {
  using C = Key32FwdConfig<Dqk, Dv>;
  const dim3 grid = tile_grid(p.group_heads, p.bh_count, (p.T + C::kBlockM - 1) / C::kBlockM);
  launch_with_smem(flash_attention_forward_key32_kernel<Dqk, Dv>, grid, C::kThreads, C::kSmemBytes, p, stream);
}

}  // namespace

void launch_forward_key32(const FwdParams& p, int64_t Dqk, int64_t Dv, cudaStream_t stream) {
  with_family_head_dims<FwdKernel::key32>(
      "flash_attention_forward", "launch_forward_key32", Dqk, Dv,
      [&](auto dqk, auto dv) { launch_forward<decltype(dqk)::value, decltype(dv)::value>(p, stream); });
}

}  // namespace fp4moe::attn
