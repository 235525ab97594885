// Causal flash attention, forward (flash_attention.h), the sm90 kernel (attention_heuristics.h: (Dqk, Dv) = (128, 128)
// and (192, 128) on devices of compute capability 9.0), with the structure of FlashAttention-3 (Shah et al. 2024,
// "FlashAttention-3: Fast and Accurate Attention with Asynchrony and Low-precision", sec. 3.1-3.2): warp
// specialisation, asynchronous warpgroup products (wgmma) from tiles the copy engine (TMA) streams, products of the
// two consumer warpgroups taking turns ("pingpong"), and the softmax of one key block overlapping the P V product of
// the previous one inside a warpgroup.
//
// One thread block of three warpgroups per (128-query tile, sequence-head), in block_tile's head-grouped order, the
// tile with the most keys first:
// - producer (warpgroup 2, one thread): TMA copies of the Q tile (once) and of the 128-key K and V blocks into a ring
//   of two stages. Every tile is a row of 64-element boxes (128 bytes: the 128-byte swizzle) of a 4-D tensor map
//   over (d, head, token, sequence) (attention_tensor_map): rows past the sequence's end arrive as zeros, so a tile
//   never reads into the next sequence. mbarriers: Q full; per stage K full and V full apart (S = Q K^T starts
//   before V lands) and K empty and V empty apart (K is released as soon as S is done, V after its product);
// - consumers (warpgroups 0 and 1: query rows 0-63 and 64-127 of the tile): S = Q K^T by wgmma m64n128k16 with both
//   operands K-major in shared memory; the causal mask (it acts on the last, diagonal, key block only), the online
//   softmax and the final O and lse of attention_fwd_block.cuh (a warp of a warpgroup holds 16 rows in the fragment
//   layout of the mma.sync kernels); P rounded to BF16 in registers and O += P V by the register-A wgmma (V as B,
//   N-major: the transpose bit).
// Order in a consumer over key blocks j = 0 .. n-1: S_0 and its softmax; then for j >= 1: S_j and O += P_{j-1} V_{j-1}
// issued together, the softmax of S_j while the P V product runs, then (that product done) O rescaled by the new row
// max and P_j rounded to BF16; O += P_{n-1} V_{n-1} last. Each issue of products is a turn: warpgroup w waits on named
// barrier 1 + w, issues, and signals the other's barrier, so that one warpgroup's softmax runs while the other's
// products hold the tensor cores (n + 1 turns each; warpgroup 1 opens warpgroup 0's first turn and does not signal
// after its last, so that every barrier phase it starts completes).
// Registers: setmaxnreg leaves the producer warpgroup 24 per thread and gives each consumer thread 240 (S 64 FP32,
// O Dv / 2 FP32, P 32 BF16 pairs).
// Arithmetic: the mma.sync kernels' (BF16 P, FP32 accumulation, base-2 online softmax, one rounding of O) with
// 128-key rescale steps: O and lse differ from key32's by FP32 rounding only. Deterministic (fixed order, no atomics).
#include <cuda.h>

#include <cstdint>

#include "kernels/attention/attention_fwd_block.cuh"
#include "kernels/attention/attention_heuristics.h"
#include "kernels/attention/attention_params.cuh"
#include "kernels/attention/attention_sm90.cuh"
#include "kernels/attention/attention_tile.cuh"
#include "kernels/common/check.h"
#include "kernels/gemm/sm90_ptx.cuh"
#include "kernels/gemm/tensor_map.h"

namespace fp4moe::attn {
namespace {

// ---- configuration ------------------------------------------------------------------------------------------------

constexpr int kBlockM = 128;  // query rows per thread block: two consumer warpgroups of 64
constexpr int kBlockN = 128;  // keys per block: the N of the S product, the K (8 steps of 16) of the P V product
constexpr int kWgRows = 64;   // query rows per consumer warpgroup (the M of wgmma)
constexpr uint32_t kTileBoxBytes = 128 * kBox * 2;         // one box of a 128-row tile: 128 rows of 128 bytes
constexpr uint32_t kDescPerBox = kTileBoxBytes >> 4;       // the same in a descriptor's address field
constexpr uint32_t kDescPerVStep = (16 * kBox * 2) >> 4;   // 16 rows of V (two 1024-byte swizzle atoms)
static_assert(kBlockM == 2 * kWgRows && kBlockN == 128, "two consumer warpgroups; S is one m64n128 product per k-step");

// Shared memory from a 1024-byte aligned base: Q [Dqk / 64 boxes][128 rows][64], K [stage][Dqk / 64][128][64],
// V [stage][Dv / 64][128][64] (BF16, each 128-byte row swizzled), then the barriers. C::kMTiles is the view of
// attention_fwd_block.cuh: one 16-row m-tile per warp.
template <int Dqk, int Dv>
struct Sm90FwdLayout {
  static_assert(Dqk % kBox == 0 && Dv == 128, "Q/K rows of whole 64-element boxes; O += P V is one m64n128 product");
  static constexpr int kMTiles = 1;
  static constexpr int kQBoxes = Dqk / kBox, kVBoxes = Dv / kBox;
  static constexpr uint32_t kQBytes = kQBoxes * kTileBoxBytes;  // also a K stage
  static constexpr uint32_t kVBytes = kVBoxes * kTileBoxBytes;
  static constexpr uint32_t kOffQ = 0;
  static constexpr uint32_t kOffK = kOffQ + kQBytes;
  static constexpr uint32_t kOffV = kOffK + kStages * kQBytes;
  static constexpr uint32_t kOffBars = kOffV + kStages * kVBytes;
  static constexpr int kBars = 1 + 4 * kStages;  // Q full; K full, V full, K empty, V empty per stage
  static constexpr uint32_t kBytes = 1024 + kOffBars + kBars * sizeof(uint64_t);  // + the alignment of the base
  static_assert(kOffK % 1024 == 0 && kOffV % 1024 == 0 && kTileBoxBytes % 1024 == 0, "boxes on 1024-byte atoms");
  static_assert(kBytes <= 227 * 1024, "tiles exceed the 227 KiB of shared memory of a Hopper thread block");
};

// The barriers in shared memory.
struct Bars {
  uint64_t* q_full;
  uint64_t* k_full;   // [kStages]
  uint64_t* v_full;   // [kStages]
  uint64_t* k_empty;  // [kStages]
  uint64_t* v_empty;  // [kStages]
  explicit __device__ Bars(uint64_t* b)
      : q_full(b), k_full(b + 1), v_full(b + 1 + kStages), k_empty(b + 1 + 2 * kStages),
        v_empty(b + 1 + 3 * kStages) {}
};

// ---- producer -------------------------------------------------------------------------------------------------------

// One thread: Q once, then K and V of key blocks 0 .. n_blocks - 1, each into its stage once the consumers have
// released the block two before it there (a fresh empty barrier lets the first two through).
template <typename L>
__device__ void produce(const CUtensorMap* map_q, const CUtensorMap* map_k, const CUtensorMap* map_v, uint8_t* smem,
                        const Bars& bars, int b, int h, int m0, int n_blocks) {
  sm90::prefetch_tensor_map(map_q);
  sm90::prefetch_tensor_map(map_k);
  sm90::prefetch_tensor_map(map_v);
  sm90::mbar_arrive_expect_tx(bars.q_full, L::kQBytes);
  for (int i = 0; i < L::kQBoxes; ++i)
    sm90::tma_load_4d(smem + L::kOffQ + i * kTileBoxBytes, map_q, i * kBox, h, m0, b, bars.q_full);
  for (int j = 0; j < n_blocks; ++j) {
    const int s = stage_of(j);
    const uint32_t phase = phase_of(j);
    sm90::mbar_wait(&bars.k_empty[s], phase ^ 1);
    sm90::mbar_arrive_expect_tx(&bars.k_full[s], L::kQBytes);
    for (int i = 0; i < L::kQBoxes; ++i)
      sm90::tma_load_4d(smem + L::kOffK + s * L::kQBytes + i * kTileBoxBytes, map_k, i * kBox, h, j * kBlockN, b,
                        &bars.k_full[s]);
    sm90::mbar_wait(&bars.v_empty[s], phase ^ 1);
    sm90::mbar_arrive_expect_tx(&bars.v_full[s], L::kVBytes);
    for (int i = 0; i < L::kVBoxes; ++i)
      sm90::tma_load_4d(smem + L::kOffV + s * L::kVBytes + i * kTileBoxBytes, map_v, i * kBox, h, j * kBlockN, b,
                        &bars.v_full[s]);
  }
}

// ---- consumer products ----------------------------------------------------------------------------------------------

// Issues S = Q K^T (Dqk / 16 steps: kQBoxes boxes of four) as one wgmma group: desc_q this warpgroup's 64 Q rows,
// desc_k the stage's 128 keys, both K-major.
template <int kQBoxes>
__device__ __forceinline__ void issue_scores(float (&s)[64], uint64_t desc_q, uint64_t desc_k) {
  fence_fragments(s);
  sm90::wgmma_fence();
#pragma unroll
  for (int i = 0; i < kQBoxes; ++i)
#pragma unroll
    for (int k = 0; k < kBox / 16; ++k) {
      const uint32_t step = i * kDescPerBox + k * kDescPerKStep;
      sm90::wgmma_m64n128k16_bf16(s, desc_q + step, desc_k + step, (i | k) != 0 ? 1u : 0u);
    }
  sm90::wgmma_commit();
}

// Issues O += P V (kBlockN / 16 steps) as one wgmma group: P in registers (pf[kk]: keys 16 kk .. 16 kk + 15), desc_v
// the stage's V block, N-major.
__device__ __forceinline__ void issue_pv(float (&o)[64], uint32_t (&pf)[kBlockN / 16][4], uint64_t desc_v) {
  fence_fragments(o);
  fence_fragments(pf);
  sm90::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) sm90::wgmma_m64n128k16_bf16_rs_tb(o, pf[kk], desc_v + kk * kDescPerVStep);
  sm90::wgmma_commit();
}

// P (the probabilities in acc_s) rounded to BF16 as the A fragments of the P V product.
__device__ __forceinline__ void round_probabilities(uint32_t (&pf)[kBlockN / 16][4],
                                                    const float (&acc_s)[1][kBlockN / 8][4]) {
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) a_from_acc(pf[kk], acc_s[0][2 * kk], acc_s[0][2 * kk + 1]);
}

// The turns of the two consumer warpgroups (named barriers 1 and 2 over their 256 threads).
__device__ __forceinline__ void turn_begin(int wg) {
  if (wg == 0) named_barrier_sync<1, kConsumerThreads>();
  else named_barrier_sync<2, kConsumerThreads>();
}
__device__ __forceinline__ void turn_end(int wg, bool last) {
  if (wg == 0) named_barrier_arrive<2, kConsumerThreads>();
  else if (!last) named_barrier_arrive<1, kConsumerThreads>();
}

// ---- kernel ---------------------------------------------------------------------------------------------------------

template <int Dqk, int Dv>
__global__ void __launch_bounds__(kThreads, 1)
    flash_attention_forward_sm90_kernel(const __grid_constant__ CUtensorMap map_q,
                                        const __grid_constant__ CUtensorMap map_k,
                                        const __grid_constant__ CUtensorMap map_v, const FwdParams p) {
  using L = Sm90FwdLayout<Dqk, Dv>;
  Sm90Block blk;
  if (!sm90_block_start(p, blk)) return;
  const int64_t bh = blk.bh;
  const int tile = blk.tile, b = blk.b, h = blk.h;
  uint8_t* smem = blk.smem;
  const Bars bars(reinterpret_cast<uint64_t*>(smem + L::kOffBars));
  const int T = p.T;
  const int m0 = ((T + kBlockM - 1) / kBlockM - 1 - tile) * kBlockM;
  const int n_blocks = m0 / kBlockN + 1;  // key blocks 0 .. the diagonal one (m0 < T)

  if (threadIdx.x == 0) {
    sm90::mbar_init(bars.q_full, 1);  // the producer's arrive.expect_tx; the copies complete it
    for (int s = 0; s < kStages; ++s) {
      sm90::mbar_init(&bars.k_full[s], 1);
      sm90::mbar_init(&bars.v_full[s], 1);
      sm90::mbar_init(&bars.k_empty[s], kConsumerWarps);
      sm90::mbar_init(&bars.v_empty[s], kConsumerWarps);
    }
    sm90::mbar_init_fence();
  }
  __syncthreads();

  if (sm90_producer_role()) {
    if (threadIdx.x == kConsumerThreads) produce<L>(&map_q, &map_k, &map_v, smem, bars, b, h, m0, n_blocks);
    return;
  }

  const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;
  const int warp_q_first = m0 + wg * kWgRows + warp * 16;  // rows warp_q_first + g and + g + 8 in this thread
  const uint64_t desc_q = sm90::smem_desc_k_major_sw128(smem + L::kOffQ + wg * kWgRows * 128);
  const auto desc_k = [&](int s) { return sm90::smem_desc_k_major_sw128(smem + L::kOffK + s * L::kQBytes); };
  const auto desc_v = [&](int s) {
    return sm90::smem_desc_mn_major_sw128(smem + L::kOffV + s * L::kVBytes, kTileBoxBytes);
  };

  float acc_o[1][Dv / 8][4], row_max[1][2], row_sum[1][2], alpha[1][2];
  float acc_s[1][kBlockN / 8][4];
  uint32_t pf[kBlockN / 16][4];
  float(&o64)[64] = *reinterpret_cast<float(*)[64]>(&acc_o[0][0][0]);
  float(&s64)[64] = *reinterpret_cast<float(*)[64]>(&acc_s[0][0][0]);
  forward_rows_init<Dv, L>(acc_o, row_max, row_sum);
  const auto keep_alpha = [&](int mt, int hr, float a) { alpha[mt][hr] = a; };

  if (wg == 1) named_barrier_arrive<1, kConsumerThreads>();  // warpgroup 0 takes the first turn
  sm90::mbar_wait(bars.q_full, 0);

  // Key block 0: S_0, its softmax (O is still 0: nothing to rescale), P_0.
  sm90::mbar_wait(&bars.k_full[0], 0);
  turn_begin(wg);
  issue_scores<L::kQBoxes>(s64, desc_q, desc_k(0));
  turn_end(wg, false);
  sm90::wgmma_wait<0>();
  fence_fragments(s64);
  release_stage(&bars.k_empty[0], lane);
  forward_causal_mask(acc_s, warp_q_first, 0, g, c);
  forward_online_softmax(acc_s, row_max, row_sum, p.scale_log2, keep_alpha);
  round_probabilities(pf, acc_s);

  for (int j = 1; j < n_blocks; ++j) {
    const int s = stage_of(j), sp = stage_of(j - 1);
    sm90::mbar_wait(&bars.k_full[s], phase_of(j));
    sm90::mbar_wait(&bars.v_full[sp], phase_of(j - 1));
    turn_begin(wg);
    issue_scores<L::kQBoxes>(s64, desc_q, desc_k(s));
    issue_pv(o64, pf, desc_v(sp));
    turn_end(wg, false);
    sm90::wgmma_wait<1>();  // S_j done; O += P_{j-1} V_{j-1} may still run
    fence_fragments(s64);
    release_stage(&bars.k_empty[s], lane);
    forward_causal_mask(acc_s, warp_q_first, j * kBlockN, g, c);
    forward_online_softmax(acc_s, row_max, row_sum, p.scale_log2, keep_alpha);
    sm90::wgmma_wait<0>();
    fence_fragments(o64);
    fence_fragments(pf);  // P_{j-1}'s registers stay untouched until its product is done
    release_stage(&bars.v_empty[sp], lane);
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) rescale_output_row(acc_o[0], hr, alpha[0][hr]);
    round_probabilities(pf, acc_s);
  }

  // O += P_{n-1} V_{n-1} (its stage is not released: nothing is copied after it).
  const int sl = stage_of(n_blocks - 1);
  sm90::mbar_wait(&bars.v_full[sl], phase_of(n_blocks - 1));
  turn_begin(wg);
  issue_pv(o64, pf, desc_v(sl));
  turn_end(wg, true);
  sm90::wgmma_wait<0>();
  fence_fragments(o64);

  forward_rows_store<Dv, L>(p, acc_o, row_max, row_sum, T, b, h, bh, warp_q_first, g, c);
}

// ---- host -----------------------------------------------------------------------------------------------------------

template <int Dqk, int Dv>
void launch_forward(const FwdParams& p, int64_t B, cudaStream_t stream) {
  using L = Sm90FwdLayout<Dqk, Dv>;
  const CUtensorMap map_q = attention_tensor_map("flash_attention_forward (sm90): q", p.q, B, p.T, p.H, Dqk, kBlockM);
  const CUtensorMap map_k = attention_tensor_map("flash_attention_forward (sm90): k", p.k, B, p.T, p.H, Dqk, kBlockN);
  const CUtensorMap map_v = attention_tensor_map("flash_attention_forward (sm90): v", p.v, B, p.T, p.H, Dv, kBlockN);
  const dim3 grid = tile_grid(p.group_heads, p.bh_count, (p.T + kBlockM - 1) / kBlockM);
  launch_sm90_attention(flash_attention_forward_sm90_kernel<Dqk, Dv>, "flash_attention_forward_sm90_kernel", grid,
                        L::kBytes, stream, map_q, map_k, map_v, p);
}

}  // namespace

// attention_tensor_map (attention_params.cuh). At H = 1 the head dimension is never stepped along; it gets the stride D (the contract allows
// any head_stride there, 0 included, which the copy engine would not take).
CUtensorMap attention_tensor_map(const char* what, AttnIn t, int64_t B, int64_t T, int64_t H, int64_t D,
                                 uint32_t box_rows) {
  const uint64_t e = sizeof(bf16);
  const uint64_t dims[4] = {static_cast<uint64_t>(D), static_cast<uint64_t>(H), static_cast<uint64_t>(T),
                            static_cast<uint64_t>(B)};
  const uint64_t token_bytes = static_cast<uint64_t>(t.token_stride) * e;
  const uint64_t strides[3] = {static_cast<uint64_t>(H > 1 ? t.head_stride : D) * e, token_bytes,
                               static_cast<uint64_t>(T) * token_bytes};
  const uint32_t box[4] = {kBox, 1, box_rows, 1};
  return make_tensor_map(what, t.data, TmaElem::bf16, 4, dims, strides, box, TmaSwizzle::swizzle_128b);
}

void launch_forward_sm90(const FwdParams& p, int64_t B, int64_t Dqk, int64_t Dv, cudaStream_t stream) {
  with_family_head_dims<FwdKernel::sm90>(
      "flash_attention_forward", "launch_forward_sm90", Dqk, Dv,
      [&](auto dqk, auto dv) { launch_forward<decltype(dqk)::value, decltype(dv)::value>(p, B, stream); });
}

}  // namespace fp4moe::attn
