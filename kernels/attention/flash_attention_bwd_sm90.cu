// Causal flash attention, backward (flash_attention.h): the sm90 dQ kernel of the sm90_dq and sm90 backward variants
// (attention_heuristics.h: (Dqk, Dv) = (128, 128) and (192, 128) on devices of compute capability 9.0), run after the
// D = rowsum(dO * O) kernel and a dK/dV kernel (role_split's, or flash_attention_bwd_sm90_dkdv.cu's). It recomputes S and dP from Q, K, V, dO and the forward's
// lse (FlashAttention-2, Dao 2023, Algorithm 2, dQ part), with the structure of the sm90 forward
// (flash_attention_fwd_sm90.cu; FlashAttention-3, Shah et al. 2024, sec. 3.1): warp specialisation, wgmma products
// from tiles the copy engine (TMA) streams.
//
// One thread block of three warpgroups per (128-query tile, sequence-head), in block_tile's head-grouped order, the
// tile with the most keys first:
// - producer (warpgroup 2, one thread): TMA copies of the Q and dO tiles (once) and of 64-key K and V blocks into a
//   ring of two stages, each tile a row of 64-element boxes (128 bytes: the 128-byte swizzle) of the 4-D tensor maps
//   of attention_tensor_map (rows past the sequence's end arrive as zeros). mbarriers: Q/dO full; per stage K/V full
//   and K/V empty (a stage is released once the dQ product that reads K is done);
// - consumers (warpgroups 0 and 1: query rows 0-63 and 64-127 of the tile), per key block j up to the diagonal:
//   S = Q K^T and dP = dO V^T by wgmma m64n64k16 (all operands K-major in shared memory), then dS = P (dP - D) in
//   FP32 with P = 2^(S scale log2e - lse log2e) and the causal mask (attention_bwd_block.cuh, as the mma.sync dQ
//   kernel), dS rounded to BF16 in registers, and dQ += dS K by the register-A wgmma m64n64k16, one product per
//   64-column box of Dqk (K as B, N-major: the transpose bit). The dQ product of block j runs while S and dP of block
//   j + 1 are computed. dQ scaled by `scale` and rounded to BF16 once at the end.
// Warpgroup 0's rows end 64 keys before warpgroup 1's: it skips the last key block when that block lies after all of
//   its rows (the producer never waits on the release of the last two blocks).
// Registers: setmaxnreg leaves the producer warpgroup 24 per thread and gives each consumer thread 240 (dQ Dqk / 2
// FP32, S and dP 32 FP32 each, dS 16 BF16 pairs).
// Arithmetic: that of the mma.sync dQ kernel (FP32 accumulation, dS rounded to BF16, one rounding of dQ); the sums
// over keys run in another order: dQ differs from it by FP32 rounding only. Deterministic (fixed order, no atomics).
#include <cuda.h>

#include <algorithm>
#include <cstdint>

#include "kernels/attention/attention_bwd_block.cuh"
#include "kernels/attention/attention_heuristics.h"
#include "kernels/attention/attention_params.cuh"
#include "kernels/attention/attention_sm90.cuh"
#include "kernels/attention/attention_tile.cuh"
#include "kernels/common/check.h"
#include "kernels/gemm/sm90_ptx.cuh"

namespace fp4moe::attn {
namespace {

// ---- configuration ------------------------------------------------------------------------------------------------

constexpr int kBlockM = 128;  // query rows per thread block: two consumer warpgroups of 64
constexpr int kBlockN = 64;   // keys per block: the N of the S and dP products, the K (4 steps of 16) of dQ's
constexpr int kWgRows = 64;   // query rows per consumer warpgroup (the M of wgmma)
constexpr int kNT = kBlockN / 8;                             // n-tiles of S and dP per warp
constexpr uint32_t kRowBoxBytes = kBlockM * kBox * 2;        // one box of the Q or dO tile: 128 rows of 128 bytes
constexpr uint32_t kKeyBoxBytes = kBlockN * kBox * 2;        // one box of a K or V block: 64 rows of 128 bytes
constexpr uint32_t kDescPerKeyStep = (16 * kBox * 2) >> 4;   // 16 keys of an N-major K box (two 1024-byte atoms)
static_assert(kBlockM == 2 * kWgRows && kBlockN == kBox, "two consumer warpgroups; S, dP and each dQ box are m64n64");

// Shared memory from a 1024-byte aligned base: Q [Dqk / 64 boxes][128 rows][64], dO [Dv / 64][128][64],
// K [stage][Dqk / 64][64][64], V [stage][Dv / 64][64][64] (BF16, each 128-byte row swizzled), then the barriers.
template <int Dqk, int Dv>
struct Sm90DqLayout {
  static_assert(Dqk % kBox == 0 && Dv % kBox == 0, "head dims of whole 64-element boxes");
  static_assert(Dqk / 2 + 2 * kBlockN / 2 + kBlockN / 4 <= 192, "dQ, S, dP and dS would not fit in 240 registers");
  static constexpr int kQBoxes = Dqk / kBox, kVBoxes = Dv / kBox;
  static constexpr uint32_t kQBytes = kQBoxes * kRowBoxBytes, kdOBytes = kVBoxes * kRowBoxBytes;
  static constexpr uint32_t kKBytes = kQBoxes * kKeyBoxBytes, kVBytes = kVBoxes * kKeyBoxBytes;  // a stage of each
  static constexpr uint32_t kOffQ = 0;
  static constexpr uint32_t kOffdO = kOffQ + kQBytes;
  static constexpr uint32_t kOffK = kOffdO + kdOBytes;
  static constexpr uint32_t kOffV = kOffK + kStages * kKBytes;
  static constexpr uint32_t kOffBars = kOffV + kStages * kVBytes;
  static constexpr int kBars = 1 + 2 * kStages;  // Q/dO full; K/V full, K/V empty per stage
  static constexpr uint32_t kBytes = 1024 + kOffBars + kBars * sizeof(uint64_t);  // + the alignment of the base
  static_assert(kOffdO % 1024 == 0 && kOffK % 1024 == 0 && kOffV % 1024 == 0 && kKeyBoxBytes % 1024 == 0,
                "boxes on 1024-byte atoms");
  static_assert(kBytes <= 227 * 1024, "tiles exceed the 227 KiB of shared memory of a Hopper thread block");
};

// The barriers in shared memory.
struct Bars {
  uint64_t* q_full;    // Q and dO
  uint64_t* kv_full;   // [kStages]
  uint64_t* kv_empty;  // [kStages]
  explicit __device__ Bars(uint64_t* b) : q_full(b), kv_full(b + 1), kv_empty(b + 1 + kStages) {}
};

// ---- producer -------------------------------------------------------------------------------------------------------

// One thread: Q and dO once, then K and V of key blocks 0 .. n_blocks - 1, each into its stage once the consumers
// have released the block two before it there (a fresh empty barrier lets the first two through).
template <typename L>
__device__ void produce(const Sm90BwdMaps& maps, uint8_t* smem, const Bars& bars, int b, int h, int m0, int n_blocks) {
  sm90::prefetch_tensor_map(maps.q);
  sm90::prefetch_tensor_map(maps.k);
  sm90::prefetch_tensor_map(maps.v);
  sm90::prefetch_tensor_map(maps.dout);
  sm90::mbar_arrive_expect_tx(bars.q_full, L::kQBytes + L::kdOBytes);
  load_boxes(smem + L::kOffQ, maps.q, L::kQBoxes, kRowBoxBytes, h, m0, b, bars.q_full);
  load_boxes(smem + L::kOffdO, maps.dout, L::kVBoxes, kRowBoxBytes, h, m0, b, bars.q_full);
  for (int j = 0; j < n_blocks; ++j) {
    const int s = stage_of(j);
    sm90::mbar_wait(&bars.kv_empty[s], phase_of(j) ^ 1);
    sm90::mbar_arrive_expect_tx(&bars.kv_full[s], L::kKBytes + L::kVBytes);
    load_boxes(smem + L::kOffK + s * L::kKBytes, maps.k, L::kQBoxes, kKeyBoxBytes, h, j * kBlockN, b,
               &bars.kv_full[s]);
    load_boxes(smem + L::kOffV + s * L::kVBytes, maps.v, L::kVBoxes, kKeyBoxBytes, h, j * kBlockN, b,
               &bars.kv_full[s]);
  }
}

// ---- consumer products ----------------------------------------------------------------------------------------------

// Adds to one wgmma group the product acc = A B^T over kBoxes boxes of 64 columns (4 k-steps each): desc_a this
// warpgroup's 64 rows of a 128-row tile (Q or dO), desc_b a stage's 64 keys (K or V), both K-major.
template <int kBoxes>
__device__ __forceinline__ void add_scores_product(float (&acc)[32], uint64_t desc_a, uint64_t desc_b) {
#pragma unroll
  for (int i = 0; i < kBoxes; ++i)
#pragma unroll
    for (int k = 0; k < kBox / 16; ++k)
      sm90::wgmma_m64n64k16_bf16(acc, desc_a + i * (kRowBoxBytes >> 4) + k * kDescPerKStep,
                                 desc_b + i * (kKeyBoxBytes >> 4) + k * kDescPerKStep, (i | k) != 0 ? 1u : 0u);
}

// Issues S = Q K^T, then dP = dO V^T, as two wgmma groups (S completes first).
template <typename L>
__device__ __forceinline__ void issue_scores(float (&s)[32], float (&dp)[32], uint64_t desc_q, uint64_t desc_do,
                                             uint64_t desc_k, uint64_t desc_v) {
  fence_fragments(s);
  fence_fragments(dp);
  sm90::wgmma_fence();
  add_scores_product<L::kQBoxes>(s, desc_q, desc_k);
  sm90::wgmma_commit();
  add_scores_product<L::kVBoxes>(dp, desc_do, desc_v);
  sm90::wgmma_commit();
}

// Issues dQ += dS K (per 64-column box of Dqk, kBlockN / 16 steps) as one wgmma group: dS in registers (dsf[kk]:
// keys 16 kk .. 16 kk + 15), desc_k the stage's K block, N-major (box i at i * kKeyBoxBytes).
template <int kQBoxes>
__device__ __forceinline__ void issue_dq(float (&dq)[kQBoxes][32], uint32_t (&dsf)[kBlockN / 16][4],
                                         uint64_t desc_k) {
#pragma unroll
  for (int i = 0; i < kQBoxes; ++i) fence_fragments(dq[i]);
  fence_fragments(dsf);
  sm90::wgmma_fence();
#pragma unroll
  for (int i = 0; i < kQBoxes; ++i)
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk)
      sm90::wgmma_m64n64k16_bf16_rs_tb(dq[i], dsf[kk], desc_k + i * (kKeyBoxBytes >> 4) + kk * kDescPerKeyStep);
  sm90::wgmma_commit();
}

// ---- kernel ---------------------------------------------------------------------------------------------------------

template <int Dqk, int Dv>
__global__ void __launch_bounds__(kThreads, 1)
    flash_attention_backward_dq_sm90_kernel(const __grid_constant__ CUtensorMap map_q,
                                            const __grid_constant__ CUtensorMap map_k,
                                            const __grid_constant__ CUtensorMap map_v,
                                            const __grid_constant__ CUtensorMap map_do, const BwdParams p) {
  using L = Sm90DqLayout<Dqk, Dv>;
  Sm90Block blk;
  if (!sm90_block_start(p, blk)) return;
  const int64_t bh = blk.bh;
  const int tile = blk.tile, b = blk.b, h = blk.h;
  uint8_t* smem = blk.smem;
  const Bars bars(reinterpret_cast<uint64_t*>(smem + L::kOffBars));
  const int T = p.T;
  const int m0 = ((T + kBlockM - 1) / kBlockM - 1 - tile) * kBlockM;
  const int n_blocks = (std::min(m0 + kBlockM, T) + kBlockN - 1) / kBlockN;  // key blocks up to the tile's last row

  if (threadIdx.x == 0) {
    sm90::mbar_init(bars.q_full, 1);  // the producer's arrive.expect_tx; the copies complete it
    for (int s = 0; s < kStages; ++s) {
      sm90::mbar_init(&bars.kv_full[s], 1);
      sm90::mbar_init(&bars.kv_empty[s], kConsumerWarps);
    }
    sm90::mbar_init_fence();
  }
  __syncthreads();

  if (sm90_producer_role()) {
    if (threadIdx.x == kConsumerThreads)
      produce<L>(Sm90BwdMaps{&map_q, &map_k, &map_v, &map_do}, smem, bars, b, h, m0, n_blocks);
    return;
  }

  const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;
  const int wg_q_first = m0 + wg * kWgRows;
  const int warp_q_first = wg_q_first + warp * 16;  // rows warp_q_first + g and + g + 8 in this thread
  // Key blocks this warpgroup reads: up to the one holding its last row (m0 and wg_q_first are multiples of 64).
  const int n_wg = std::min(n_blocks, wg_q_first / kBlockN + 1);
  const uint64_t desc_q = sm90::smem_desc_k_major_sw128(smem + L::kOffQ + wg * kWgRows * 128);
  const uint64_t desc_do = sm90::smem_desc_k_major_sw128(smem + L::kOffdO + wg * kWgRows * 128);
  const auto desc_k = [&](int s) { return sm90::smem_desc_k_major_sw128(smem + L::kOffK + s * L::kKBytes); };
  const auto desc_v = [&](int s) { return sm90::smem_desc_k_major_sw128(smem + L::kOffV + s * L::kVBytes); };
  const auto desc_k_n = [&](int s) {
    return sm90::smem_desc_mn_major_sw128(smem + L::kOffK + s * L::kKBytes, kKeyBoxBytes);
  };

  float lse2[2], delta[2];
  dq_row_stats(p, bh, warp_q_first, g, lse2, delta);

  float acc_dq[Dqk / 8][4], acc_s[kNT][4], acc_dp[kNT][4];
  uint32_t dsf[kBlockN / 16][4];
  zero_fragments(acc_dq);
  float(&dq_boxes)[L::kQBoxes][32] = *reinterpret_cast<float(*)[L::kQBoxes][32]>(&acc_dq[0][0]);
  float(&s32)[32] = *reinterpret_cast<float(*)[32]>(&acc_s[0][0]);
  float(&dp32)[32] = *reinterpret_cast<float(*)[32]>(&acc_dp[0][0]);
#pragma unroll
  for (int i = 0; i < L::kQBoxes; ++i) fence_fragments(dq_boxes[i]);  // zeroed before the loop, not inside it

  sm90::mbar_wait(bars.q_full, 0);
  for (int j = 0; j < n_wg; ++j) {
    const int s = stage_of(j);
    sm90::mbar_wait(&bars.kv_full[s], phase_of(j));
    issue_scores<L>(s32, dp32, desc_q, desc_do, desc_k(s), desc_v(s));
    sm90::wgmma_wait<1>();  // dQ += dS_{j-1} K_{j-1} and S_j done; dP_j may still run
    fence_fragments(dsf);   // dS_{j-1}'s registers stay untouched until its product is done
    if (j > 0) release_stage(&bars.kv_empty[stage_of(j - 1)], lane);
    sm90::wgmma_wait<0>();
    fence_fragments(s32);
    fence_fragments(dp32);
    dq_scores_to_ds(acc_s, acc_dp, lse2, delta, p.scale_log2, warp_q_first, j * kBlockN, g, c);
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) a_from_acc(dsf[kk], acc_s[2 * kk], acc_s[2 * kk + 1]);
    issue_dq<L::kQBoxes>(dq_boxes, dsf, desc_k_n(s));
  }
  sm90::wgmma_wait<0>();  // the last block's stage is not released: nothing is copied after it
#pragma unroll
  for (int i = 0; i < L::kQBoxes; ++i) fence_fragments(dq_boxes[i]);

  dq_rows_store(p, acc_dq, bh / p.H, bh % p.H, warp_q_first, g, c);  // dQ = scale dS K
}

// ---- host -----------------------------------------------------------------------------------------------------------

template <int Dqk, int Dv>
void launch_dq(const BwdParams& p, int64_t B, cudaStream_t stream) {
  using L = Sm90DqLayout<Dqk, Dv>;
  const Sm90BwdTensorMaps maps =
      sm90_bwd_tensor_maps("flash_attention_backward (sm90 dQ)", p, B, Dqk, Dv, kBlockM, kBlockN);
  const dim3 grid = tile_grid(p.group_heads, p.bh_count, (p.T + kBlockM - 1) / kBlockM);
  launch_sm90_attention(flash_attention_backward_dq_sm90_kernel<Dqk, Dv>, "flash_attention_backward_dq_sm90_kernel",
                        grid, L::kBytes, stream, maps.q, maps.k, maps.v, maps.dout, p);
}

}  // namespace

void launch_backward_dq_sm90(const BwdParams& p, int64_t B, int64_t Dqk, int64_t Dv, cudaStream_t stream) {
  with_family_head_dims<BwdKernels::sm90_dq>(
      "flash_attention_backward", "launch_backward_dq_sm90", Dqk, Dv,
      [&](auto dqk, auto dv) { launch_dq<decltype(dqk)::value, decltype(dv)::value>(p, B, stream); });
}

}  // namespace fp4moe::attn
