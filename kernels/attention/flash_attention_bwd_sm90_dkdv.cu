// Causal flash attention, backward (flash_attention.h): the sm90 dK/dV kernel of the sm90 backward variant
// (attention_heuristics.h: (Dqk, Dv) = (128, 128) and (192, 128) on devices of compute capability 9.0), run after the
// D = rowsum(dO * O) kernel and before the sm90 dQ kernel (flash_attention_bwd_sm90.cu). It recomputes S^T and dP^T
// for a tile of keys from Q, K, V, dO, the forward's lse and D (FlashAttention-2, Dao 2023, Algorithm 2, dK/dV part)
// in the structure of FlashAttention-3's backward (Shah et al. 2024, sec. 3.1 and appendix B.1): warp specialisation,
// wgmma products from tiles the copy engine (TMA) streams; dQ is left to its own kernel (no atomics).
//
// One thread block of three warpgroups per (128-key tile, sequence-head), in block_tile's head-grouped order, tile 0
// (keys 0-127, seen by the most queries) first:
// - producer (warpgroup 2, its first warp): TMA copies of the K and V tiles (once, 128 rows each) and of (Q, dO)
//   blocks of 64 queries, from the diagonal block to the last one, into a ring of two stages; the same warp writes
//   lse * log2e and D of the block's 64 queries into the stage with plain loads (rows at or past T: lse = +inf,
//   D = 0), as lse and D rows need not be 16-byte aligned for a bulk copy. Tiles are rows of 64-element boxes
//   (128 bytes: the 128-byte swizzle) of the 4-D tensor maps of attention_tensor_map; rows past the sequence's end
//   arrive as zeros. mbarriers: K/V full; per stage full (the 32 lanes' arrivals, lane 0's carrying the copies'
//   bytes) and empty (one arrival per consumer warp once its products reading the stage are done);
// - consumers (warpgroups 0 and 1: keys 0-63 and 64-127 of the tile), per query block:
//   S^T = K Q^T by wgmma m64n64k16 (both operands K-major in shared memory); P^T = 2^(S^T scale log2e - lse log2e)
//   with the causal mask, kept in FP32 in this thread's slots of a shared-memory stash and rounded to BF16 in
//   registers; then dP^T = V dO^T (K-major) and dV += P^T dO (register A, dO as B N-major: the transpose bit) as two
//   wgmma groups; once dP^T is done (dV still running) dS^T = P^T (dP^T - D) from the stash, rounded to BF16 in
//   registers; dK += dS^T Q (register A, Q as B N-major). The register-A products run one m64n64k16 per 64-column box
//   of Dv or Dqk. A warpgroup whose keys all lie after a block's queries releases the block unread. dK scaled by
//   `scale`, dK and dV rounded to BF16 once at the end and stored from registers (keys past T dropped).
// Registers: setmaxnreg leaves the producer warpgroup 24 per thread and gives each consumer thread 240. A consumer
// thread holds dK (Dqk / 2 FP32) and dV (Dv / 2 FP32) for the whole sweep: 160 at (192, 128), so only one 64 x 64 FP32
// score tile fits beside them with the BF16 fragments of P^T and dS^T (16 each) and the products' operands: S^T,
// P^T, dP^T and dS^T take turns in it, and P^T waits for dS^T in the stash (32 KiB: 64 x 64 FP32 per warpgroup; each
// thread reads back only what it wrote, so no barrier). With S^T and dP^T in registers together (224 of 240) ptxas
// serialises the wgmma instructions or spills. The products of one block therefore run in sequence inside a
// warpgroup (S^T; dP^T with dV; dK), the exponentials and dS^T between them, and the two consumer warpgroups overlap
// each other. The alternative of one consumer warpgroup of 64 keys per thread block has the same per-thread need and
// streams each Q and dO block for half as many keys; 64-query blocks keep the score products at m64n64 (a 32-query
// block would halve the score tile but read K and V from shared memory twice as often per product).
// Arithmetic: role_split's (FP32 accumulation, P^T and dS^T from FP32 scores, rounded to BF16 before their products,
// one rounding of dK and dV); the sums over queries run in another order: dK and dV differ from role_split's by FP32
// rounding only. Deterministic (fixed order, no atomics).
#include <cuda.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/attention/attention_heuristics.h"
#include "kernels/attention/attention_params.cuh"
#include "kernels/attention/attention_sm90.cuh"
#include "kernels/attention/attention_tile.cuh"
#include "kernels/common/check.h"
#include "kernels/gemm/sm90_ptx.cuh"

namespace fp4moe::attn {
namespace {

// ---- configuration ------------------------------------------------------------------------------------------------

constexpr int kBlockN = 128;  // keys per thread block: two consumer warpgroups of 64
constexpr int kBlockM = 64;   // queries per block: the N of S^T and dP^T, the K (4 steps of 16) of dV's and dK's
constexpr int kWgKeys = 64;   // keys per consumer warpgroup (the M of wgmma)
constexpr int kNT = kBlockM / 8;                             // n-tiles of S^T and dP^T per warp
constexpr uint32_t kKeyBoxBytes = kBlockN * kBox * 2;        // one box of the K or V tile: 128 rows of 128 bytes
constexpr uint32_t kRowBoxBytes = kBlockM * kBox * 2;        // one box of a Q or dO block: 64 rows of 128 bytes
constexpr uint32_t kDescPerRowStep = (16 * kBox * 2) >> 4;   // 16 rows of an N-major box (two 1024-byte atoms)
static_assert(kBlockN == 2 * kWgKeys && kBlockM == kBox, "two consumer warpgroups; S^T, dP^T, each box m64n64");
static_assert(kBlockN % kBlockM == 0, "the first query block of a key tile starts at its first key (the diagonal)");

// Shared memory from a 1024-byte aligned base: K [Dqk / 64 boxes][128 rows][64], V [Dv / 64][128][64],
// Q [stage][Dqk / 64][64][64], dO [stage][Dv / 64][64][64] (BF16, each 128-byte row swizzled), lse * log2e and D
// [stage][64] FP32, the P^T stash [consumer warp][n-tile][lane] float4 (each thread's FP32 P^T, read back by the
// same thread), then the barriers.
template <int Dqk, int Dv>
struct Sm90DkdvLayout {
  static_assert(Dqk % kBox == 0 && Dv % kBox == 0, "head dims of whole 64-element boxes");
  static_assert(Dqk / 2 + Dv / 2 + kBlockM / 2 + kBlockM / 4 <= 208,
                "dK, dV, a score tile and P^T's BF16 fragments would not fit in 240 registers");
  static constexpr int kQBoxes = Dqk / kBox, kVBoxes = Dv / kBox;
  static constexpr uint32_t kKBytes = kQBoxes * kKeyBoxBytes, kVBytes = kVBoxes * kKeyBoxBytes;
  static constexpr uint32_t kQBytes = kQBoxes * kRowBoxBytes, kdOBytes = kVBoxes * kRowBoxBytes;  // a stage of each
  static constexpr uint32_t kOffK = 0;
  static constexpr uint32_t kOffV = kOffK + kKBytes;
  static constexpr uint32_t kOffQ = kOffV + kVBytes;
  static constexpr uint32_t kOffdO = kOffQ + kStages * kQBytes;
  static constexpr uint32_t kOffLse = kOffdO + kStages * kdOBytes;
  static constexpr uint32_t kOffDelta = kOffLse + kStages * kBlockM * sizeof(float);
  static constexpr uint32_t kOffStash = kOffDelta + kStages * kBlockM * sizeof(float);
  static constexpr uint32_t kOffBars = kOffStash + kConsumerThreads * kNT * sizeof(float4);
  static constexpr int kBars = 1 + 2 * kStages;  // K/V full; full, empty per stage
  static constexpr uint32_t kBytes = 1024 + kOffBars + kBars * sizeof(uint64_t);  // + the alignment of the base
  static_assert(kOffV % 1024 == 0 && kOffQ % 1024 == 0 && kOffdO % 1024 == 0 && kRowBoxBytes % 1024 == 0,
                "boxes on 1024-byte atoms");
  static_assert(kOffBars % 8 == 0, "mbarriers are 8-byte aligned");
  static_assert(kBytes <= 227 * 1024, "tiles exceed the 227 KiB of shared memory of a Hopper thread block");
};

// The barriers in shared memory.
struct Bars {
  uint64_t* kv_full;  // K and V
  uint64_t* full;     // [kStages]: Q, dO, lse, D of a query block
  uint64_t* empty;    // [kStages]
  explicit __device__ Bars(uint64_t* b) : kv_full(b), full(b + 1), empty(b + 1 + kStages) {}
};

// ---- producer -------------------------------------------------------------------------------------------------------

// One warp (lane = its lane): lane 0 copies K and V once; then, for query blocks j = 0 .. n_blocks - 1 (queries
// m_first + 64 j ..), once the consumers have released the block two before it in its stage (a fresh empty barrier
// lets the first two through), every lane writes lse * log2e and D of queries `lane` and `lane + 32` of the block
// and arrives on the stage's full barrier, lane 0 with the bytes of the Q and dO copies it then issues.
template <typename L>
__device__ void produce(const Sm90BwdMaps& maps, const BwdParams& p, uint8_t* smem, const Bars& bars, int64_t bh, int b,
                        int h, int n0, int m_first, int n_blocks, int lane) {
  if (lane == 0) {
    sm90::prefetch_tensor_map(maps.q);
    sm90::prefetch_tensor_map(maps.k);
    sm90::prefetch_tensor_map(maps.v);
    sm90::prefetch_tensor_map(maps.dout);
    sm90::mbar_arrive_expect_tx(bars.kv_full, L::kKBytes + L::kVBytes);
    load_boxes(smem + L::kOffK, maps.k, L::kQBoxes, kKeyBoxBytes, h, n0, b, bars.kv_full);
    load_boxes(smem + L::kOffV, maps.v, L::kVBoxes, kKeyBoxBytes, h, n0, b, bars.kv_full);
  }
  const float* lse = p.lse + bh * p.T;
  const float* delta = p.delta + bh * p.T;
  float* s_lse = reinterpret_cast<float*>(smem + L::kOffLse);
  float* s_delta = reinterpret_cast<float*>(smem + L::kOffDelta);
  for (int j = 0; j < n_blocks; ++j) {
    const int s = stage_of(j), m0 = m_first + j * kBlockM;
    sm90::mbar_wait(&bars.empty[s], phase_of(j) ^ 1);
#pragma unroll
    for (int i = 0; i < kBlockM / 32; ++i) {
      const int r = lane + 32 * i, q = m0 + r;
      s_lse[s * kBlockM + r] = q < p.T ? lse[q] * kLog2e : INFINITY;
      s_delta[s * kBlockM + r] = q < p.T ? delta[q] : 0.0f;
    }
    if (lane == 0) {
      sm90::mbar_arrive_expect_tx(&bars.full[s], L::kQBytes + L::kdOBytes);
      load_boxes(smem + L::kOffQ + s * L::kQBytes, maps.q, L::kQBoxes, kRowBoxBytes, h, m0, b, &bars.full[s]);
      load_boxes(smem + L::kOffdO + s * L::kdOBytes, maps.dout, L::kVBoxes, kRowBoxBytes, h, m0, b, &bars.full[s]);
    } else {
      sm90::mbar_arrive(&bars.full[s]);
    }
  }
}

// ---- consumer products ----------------------------------------------------------------------------------------------

// Adds to one wgmma group the product acc = A B^T over kBoxes boxes of 64 columns (4 k-steps each): desc_a this
// warpgroup's 64 keys of the K or V tile (boxes kKeyBoxBytes apart), desc_b a stage's 64 queries of Q or dO (boxes
// kRowBoxBytes apart), both K-major.
template <int kBoxes>
__device__ __forceinline__ void add_scores_product(float (&acc)[32], uint64_t desc_a, uint64_t desc_b) {
#pragma unroll
  for (int i = 0; i < kBoxes; ++i)
#pragma unroll
    for (int k = 0; k < kBox / 16; ++k)
      sm90::wgmma_m64n64k16_bf16(acc, desc_a + i * (kKeyBoxBytes >> 4) + k * kDescPerKStep,
                                 desc_b + i * (kRowBoxBytes >> 4) + k * kDescPerKStep, (i | k) != 0 ? 1u : 0u);
}

// Issues S^T = K Q^T as one wgmma group.
template <typename L>
__device__ __forceinline__ void issue_scores(float (&acc_s)[32], uint64_t desc_k, uint64_t desc_q) {
  fence_fragments(acc_s);
  sm90::wgmma_fence();
  add_scores_product<L::kQBoxes>(acc_s, desc_k, desc_q);
  sm90::wgmma_commit();
}

// Adds to the open wgmma group acc += A B over kBoxes boxes of 64 columns of B: A in registers (a[kk]: queries
// 16 kk .. 16 kk + 15 of the block), desc_b a stage's Q or dO block, N-major (box i at i * kRowBoxBytes).
template <int kBoxes>
__device__ __forceinline__ void add_register_a_product(float (&acc)[kBoxes][32], const uint32_t (&a)[kBlockM / 16][4],
                                                       uint64_t desc_b) {
#pragma unroll
  for (int i = 0; i < kBoxes; ++i)
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk)
      sm90::wgmma_m64n64k16_bf16_rs_tb(acc[i], a[kk], desc_b + i * (kRowBoxBytes >> 4) + kk * kDescPerRowStep);
}

// Issues dP^T = V dO^T into acc_dp, then dV += P^T dO (P^T in pf), as two wgmma groups (dP^T completes first).
template <typename L>
__device__ __forceinline__ void issue_dp_dv(float (&acc_dp)[32], float (&dv)[L::kVBoxes][32],
                                            uint32_t (&pf)[kBlockM / 16][4], uint64_t desc_v, uint64_t desc_do,
                                            uint64_t desc_do_n) {
  fence_fragments(acc_dp);
#pragma unroll
  for (int i = 0; i < L::kVBoxes; ++i) fence_fragments(dv[i]);
  fence_fragments(pf);
  sm90::wgmma_fence();
  add_scores_product<L::kVBoxes>(acc_dp, desc_v, desc_do);
  sm90::wgmma_commit();
  add_register_a_product<L::kVBoxes>(dv, pf, desc_do_n);
  sm90::wgmma_commit();
}

// Issues dK += dS^T Q (dS^T in dsf) as one wgmma group.
template <typename L>
__device__ __forceinline__ void issue_dk(float (&dk)[L::kQBoxes][32], uint32_t (&dsf)[kBlockM / 16][4],
                                         uint64_t desc_q_n) {
#pragma unroll
  for (int i = 0; i < L::kQBoxes; ++i) fence_fragments(dk[i]);
  fence_fragments(dsf);
  sm90::wgmma_fence();
  add_register_a_product<L::kQBoxes>(dk, dsf, desc_q_n);
  sm90::wgmma_commit();
}

// P^T = 2^(S^T scale log2e - lse log2e) in place of the scores acc_s (rows: the thread's keys warp_key_first + g and
// + g + 8; columns: queries m0 + 8 j + 2 c and + 1 of n-tile j), 0 where the key is after the query; s_lse the
// block's lse * log2e (+inf past T: P^T = 0 there).
__device__ __forceinline__ void scores_to_probabilities(float (&acc_s)[kNT][4], const float* s_lse, float scale_log2,
                                                        int warp_key_first, int m0, int g, int c) {
  const bool need_mask = warp_key_first + 15 > m0;
#pragma unroll
  for (int j = 0; j < kNT; ++j) {
    const float2 l = *reinterpret_cast<const float2*>(s_lse + j * 8 + 2 * c);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int key = warp_key_first + g + 8 * (r / 2), query = m0 + j * 8 + 2 * c + (r & 1);
      const bool masked = need_mask && key > query;
      acc_s[j][r] = masked ? 0.0f : fast_exp2(fmaf(acc_s[j][r], scale_log2, -((r & 1) ? l.y : l.x)));
    }
  }
}

// dS^T = P^T (dP^T - D) in place of acc_dp; P^T from this thread's slots of the stash (stash[j][lane]: n-tile j),
// s_delta the block's D (0 past T).
__device__ __forceinline__ void probabilities_to_ds(float (&acc_dp)[kNT][4], const float4* stash, const float* s_delta,
                                                    int lane) {
  const int c = lane % 4;
#pragma unroll
  for (int j = 0; j < kNT; ++j) {
    const float2 d = *reinterpret_cast<const float2*>(s_delta + j * 8 + 2 * c);
    const float4 pv = stash[j * 32 + lane];
    acc_dp[j][0] = pv.x * (acc_dp[j][0] - d.x);
    acc_dp[j][1] = pv.y * (acc_dp[j][1] - d.y);
    acc_dp[j][2] = pv.z * (acc_dp[j][2] - d.x);
    acc_dp[j][3] = pv.w * (acc_dp[j][3] - d.y);
  }
}

// Stores rows (keys) warp_key_first + g and + g + 8 of acc (kT n-tiles: D = 8 kT columns) times `mul` into `out`
// for sequence b, head h, rounded to BF16; keys at or past T dropped.
template <int kT>
__device__ __forceinline__ void store_key_rows(const AttnOut& out, const float (&acc)[kT][4], float mul, int T,
                                               int64_t b, int64_t h, int warp_key_first, int g, int c) {
  bf16* base = out.data + b * T * out.token_stride + h * out.head_stride;
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int key = warp_key_first + g + 8 * hr;
    if (key >= T) continue;
    bf16* row = base + static_cast<int64_t>(key) * out.token_stride;
#pragma unroll
    for (int j = 0; j < kT; ++j) store_bf16x2(row + j * 8 + 2 * c, acc[j][2 * hr] * mul, acc[j][2 * hr + 1] * mul);
  }
}

// ---- kernel ---------------------------------------------------------------------------------------------------------

template <int Dqk, int Dv>
__global__ void __launch_bounds__(kThreads, 1)
    flash_attention_backward_dkdv_sm90_kernel(const __grid_constant__ CUtensorMap map_q,
                                              const __grid_constant__ CUtensorMap map_k,
                                              const __grid_constant__ CUtensorMap map_v,
                                              const __grid_constant__ CUtensorMap map_do, const BwdParams p) {
  using L = Sm90DkdvLayout<Dqk, Dv>;
  Sm90Block blk;
  if (!sm90_block_start(p, blk)) return;
  const int64_t bh = blk.bh;
  const int tile = blk.tile, b = blk.b, h = blk.h;
  uint8_t* smem = blk.smem;
  const Bars bars(reinterpret_cast<uint64_t*>(smem + L::kOffBars));
  const int T = p.T;
  const int n0 = tile * kBlockN;  // tile 0 first: its keys are seen by every query
  const int m_first = n0;         // the diagonal query block
  const int n_blocks = (T + kBlockM - 1) / kBlockM - m_first / kBlockM;  // >= 1: n0 < T

  if (threadIdx.x == 0) {
    sm90::mbar_init(bars.kv_full, 1);  // the producer's arrive.expect_tx; the copies complete it
    for (int s = 0; s < kStages; ++s) {
      sm90::mbar_init(&bars.full[s], 32);  // the producer warp's lanes (lane 0 with the copies' bytes)
      sm90::mbar_init(&bars.empty[s], kConsumerWarps);
    }
    sm90::mbar_init_fence();
  }
  __syncthreads();

  if (sm90_producer_role()) {
    if (threadIdx.x < kConsumerThreads + 32)
      produce<L>(Sm90BwdMaps{&map_q, &map_k, &map_v, &map_do}, p, smem, bars, bh, b, h, n0, m_first, n_blocks,
                 threadIdx.x % 32);
    return;
  }

  const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;
  const int wg_key_first = n0 + wg * kWgKeys;
  const int warp_key_first = wg_key_first + warp * 16;  // keys warp_key_first + g and + g + 8 in this thread
  const uint64_t desc_k = sm90::smem_desc_k_major_sw128(smem + L::kOffK + wg * kWgKeys * 128);
  const uint64_t desc_v = sm90::smem_desc_k_major_sw128(smem + L::kOffV + wg * kWgKeys * 128);
  // Descriptors of stage 0; a stage's start address field lies s * (stage bytes >> 4) further (shared addresses stay
  // below 2^18 bytes: the 14-bit field does not overflow).
  const uint64_t desc_q0 = sm90::smem_desc_k_major_sw128(smem + L::kOffQ);
  const uint64_t desc_do0 = sm90::smem_desc_k_major_sw128(smem + L::kOffdO);
  const uint64_t desc_q0_n = sm90::smem_desc_mn_major_sw128(smem + L::kOffQ, kRowBoxBytes);
  const uint64_t desc_do0_n = sm90::smem_desc_mn_major_sw128(smem + L::kOffdO, kRowBoxBytes);
  const auto desc_q = [&](int s) { return desc_q0 + s * (L::kQBytes >> 4); };
  const auto desc_do = [&](int s) { return desc_do0 + s * (L::kdOBytes >> 4); };
  const auto desc_q_n = [&](int s) { return desc_q0_n + s * (L::kQBytes >> 4); };
  const auto desc_do_n = [&](int s) { return desc_do0_n + s * (L::kdOBytes >> 4); };
  const float* s_lse = reinterpret_cast<const float*>(smem + L::kOffLse);
  const float* s_delta = reinterpret_cast<const float*>(smem + L::kOffDelta);
  float4* stash = reinterpret_cast<float4*>(smem + L::kOffStash) + (threadIdx.x / 32) * kNT * 32;  // this warp's

  // acc_sd: S^T, then P^T, then (once P^T is in the stash and in pf) dP^T, then dS^T. One set of registers for both
  // score tiles: dK, dV, a score tile and the BF16 fragments then leave room for the products' operands.
  float acc_dk[Dqk / 8][4], acc_dv[Dv / 8][4], acc_sd[kNT][4];
  uint32_t pf[kBlockM / 16][4], dsf[kBlockM / 16][4];
  zero_fragments(acc_dk);
  zero_fragments(acc_dv);
  float(&dk_boxes)[L::kQBoxes][32] = *reinterpret_cast<float(*)[L::kQBoxes][32]>(&acc_dk[0][0]);
  float(&dv_boxes)[L::kVBoxes][32] = *reinterpret_cast<float(*)[L::kVBoxes][32]>(&acc_dv[0][0]);
  float(&sd32)[32] = *reinterpret_cast<float(*)[32]>(&acc_sd[0][0]);
#pragma unroll
  for (int i = 0; i < L::kQBoxes; ++i) fence_fragments(dk_boxes[i]);  // zeroed before the loop, not inside it
#pragma unroll
  for (int i = 0; i < L::kVBoxes; ++i) fence_fragments(dv_boxes[i]);

  sm90::mbar_wait(bars.kv_full, 0);
  for (int j = 0; j < n_blocks; ++j) {
    const int s = stage_of(j), m0 = m_first + j * kBlockM;
    sm90::mbar_wait(&bars.full[s], phase_of(j));  // also before a release unread: the release counts for this use
    if (m0 + kBlockM <= wg_key_first) {           // every key of the warpgroup after every query: P^T = 0
      release_stage(&bars.empty[s], lane);
      continue;
    }
    issue_scores<L>(sd32, desc_k, desc_q(s));
    sm90::wgmma_wait<0>();
    fence_fragments(sd32);
    scores_to_probabilities(acc_sd, s_lse + s * kBlockM, p.scale_log2, warp_key_first, m0, g, c);
#pragma unroll
    for (int jj = 0; jj < kNT; ++jj)
      stash[jj * 32 + lane] = make_float4(acc_sd[jj][0], acc_sd[jj][1], acc_sd[jj][2], acc_sd[jj][3]);
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) a_from_acc(pf[kk], acc_sd[2 * kk], acc_sd[2 * kk + 1]);
    issue_dp_dv<L>(sd32, dv_boxes, pf, desc_v, desc_do(s), desc_do_n(s));
    sm90::wgmma_wait<1>();  // dP^T done; dV += P^T dO may still run
    fence_fragments(sd32);
    probabilities_to_ds(acc_sd, stash, s_delta + s * kBlockM, lane);
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) a_from_acc(dsf[kk], acc_sd[2 * kk], acc_sd[2 * kk + 1]);
    sm90::wgmma_wait<0>();  // dV done: P^T's registers free before dK's product is issued
#pragma unroll
    for (int i = 0; i < L::kVBoxes; ++i) fence_fragments(dv_boxes[i]);
    fence_fragments(pf);
    issue_dk<L>(dk_boxes, dsf, desc_q_n(s));
    sm90::wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < L::kQBoxes; ++i) fence_fragments(dk_boxes[i]);
    fence_fragments(dsf);  // dS^T's registers stay untouched until its product is done
    release_stage(&bars.empty[s], lane);
  }

  store_key_rows(p.dv, acc_dv, 1.0f, T, b, h, warp_key_first, g, c);     // dV = P^T dO
  store_key_rows(p.dk, acc_dk, p.scale, T, b, h, warp_key_first, g, c);  // dK = scale dS^T Q
}

// ---- host -----------------------------------------------------------------------------------------------------------

template <int Dqk, int Dv>
void launch_dkdv(const BwdParams& p, int64_t B, cudaStream_t stream) {
  using L = Sm90DkdvLayout<Dqk, Dv>;
  const Sm90BwdTensorMaps maps =
      sm90_bwd_tensor_maps("flash_attention_backward (sm90 dK/dV)", p, B, Dqk, Dv, kBlockM, kBlockN);
  const dim3 grid = tile_grid(p.group_heads, p.bh_count, (p.T + kBlockN - 1) / kBlockN);
  launch_sm90_attention(flash_attention_backward_dkdv_sm90_kernel<Dqk, Dv>,
                        "flash_attention_backward_dkdv_sm90_kernel", grid, L::kBytes, stream, maps.q, maps.k, maps.v,
                        maps.dout, p);
}

}  // namespace

void launch_backward_dkdv_sm90(const BwdParams& p, int64_t B, int64_t Dqk, int64_t Dv, cudaStream_t stream) {
  with_family_head_dims<BwdKernels::sm90>(
      "flash_attention_backward", "launch_backward_dkdv_sm90", Dqk, Dv,
      [&](auto dqk, auto dv) { launch_dkdv<decltype(dqk)::value, decltype(dv)::value>(p, B, stream); });
}

}  // namespace fp4moe::attn
