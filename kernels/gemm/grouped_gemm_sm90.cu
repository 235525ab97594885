#include "kernels/gemm/grouped_gemm_sm90.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "kernels/common/check.h"
#include "kernels/gemm/grouped_tiles.h"
#include "kernels/gemm/setmaxnreg_check.h"
#include "kernels/gemm/sm90_grouped_device.cuh"
#include "kernels/gemm/sm90_launch.h"
#include "kernels/gemm/sm90_ptx.cuh"
#include "kernels/gemm/tensor_map.h"
#include "kernels/quant/cp_async.cuh"
#include "kernels/quant/layouts.h"
#include "kernels/quant/mxfp4_fp8_direct.cuh"

namespace fp4moe {

namespace {

constexpr int kBlockM = 128;           // two consumer warpgroups of 64 rows
constexpr int kBlockK = kFp8Block;     // one scale block per stage: 128 E4M3 codes, one 128-byte swizzle row
constexpr int kWgmmaK = 32;            // K of one m64n128k32 instruction (32 bytes of E4M3)
constexpr int kConsumerThreads = 256;  // warpgroups 0 and 1
constexpr int kThreads = 384;          // + warpgroup 2, the producer
constexpr int kConsumerWarps = kConsumerThreads / 32;
constexpr int kMaxGroups = 1024;
// Registers per thread after setmaxnreg (sm90_ptx.cuh setmaxnreg_fits: at most the 64512 the block holds).
constexpr uint32_t kProducerRegs = 40, kConsumerRegs = 232;
// With the MXFP4 operand the producer converts codes as well and needs more registers.
constexpr uint32_t kProducerRegsMx = 56, kConsumerRegsMx = 224;
static_assert(sm90::setmaxnreg_fits(kThreads, kThreads - kConsumerThreads, kProducerRegs, kConsumerRegs) &&
                  sm90::setmaxnreg_fits(kThreads, kThreads - kConsumerThreads, kProducerRegsMx, kConsumerRegsMx),
              "setmaxnreg asks for more registers than the thread block holds");
constexpr int kProducerThreads = kThreads - kConsumerThreads;
static_assert(kBlockK == 128, "one 128-byte swizzle row of E4M3 per stage and per row");
static_assert(kBlockK % kWgmmaK == 0, "whole WGMMA steps per K block");

// The direct rule's per-block tables (e2m1_e4m3_lut.h) of an MXFP4 row operand, in shared memory: entry
// shift - kMxLutShiftMin for the shifts kMxLutShiftMin .. 6 (below -12 every E2M1 magnitude rounds to zero, so
// shifts under the range take its first entry), and entry kMxLutNaN the NaN block's 0x7F codes (its signs dropped).
constexpr int kMxLutShiftMin = -15, kMxLutShiftMax = 6;
constexpr int kMxLutNaN = kMxLutShiftMax - kMxLutShiftMin + 1, kMxLutEntries = kMxLutNaN + 1;

// Shared memory of the kernel with kNSub column sub-tiles of 128 (BLOCK_N = 128 kNSub), from a 1024-byte aligned
// base: the stage ring (A tiles, B tiles, the rows' X scales, the W scales), with an MXFP4 row operand (kMx) the
// staging slots of its packed codes and scale bytes, the full and empty barriers of each stage, with an MXFP4 row
// operand the conversion tables, the safe group offsets and tile starts [G+1] each.
template <int kNSub, bool kMx = false>
struct Layout {
  static constexpr int kNSubTiles = kNSub;
  static constexpr bool kMxOperand = kMx;
  static constexpr int kBlockN = 128 * kNSub;
  // kMx: the producer converts K block i while the copies of blocks i + 1 .. i + kLookahead are in flight, in
  // kLookahead + 1 staging slots; the ring gives up a stage where the slots would not fit (kSm90MaxSmemPerBlock).
  static constexpr int kLookahead = kMx ? (kNSub == 1 ? 2 : 1) : 0;
  static constexpr int kStagingSlots = kMx ? kLookahead + 1 : 0;
  static constexpr int kStages = kNSub == 1 ? (kMx ? 5 : 6) : 4;
  static constexpr uint32_t kABytes = kBlockM * kBlockK;  // 16 KiB, 1024-aligned atoms
  static constexpr uint32_t kBBytes = kBlockN * kBlockK;
  // The rows' X scales of a stage: x_scale[row0 & ~3 .. + kSaBox - 1, kb]. A tiled copy's innermost start must lie
  // on 16 bytes (the engine raises an illegal instruction otherwise), and a group's first row is any row, so the box
  // starts at row0 rounded down to 4 scales and is 4 longer; its stage slot is padded to the 128 bytes a copy's
  // shared-memory destination needs. kMx: the converted rows' scales, tile row i at float i.
  static constexpr uint32_t kSaBox = kBlockM + 4;
  static constexpr uint32_t kSaBytes = kSaBox * 4;
  static constexpr uint32_t kSaSlot = (kSaBytes + 127) / 128 * 128;
  static constexpr uint32_t kSbBytes = 16 * kNSub;   // per column block: w_scale[nb, kb & ~3 .. + 3]
  static constexpr uint32_t kTxBytes = kMx ? kBBytes + kSbBytes : kABytes + kBBytes + kSaBytes + kSbBytes;
  // A staging slot (kMx): the tile's packed E2M1 codes of one K block, 32 bytes (two MX blocks) per producer thread
  // and pass, [kMxPasses][128 threads][32 bytes]; then each row's four UE8M0 scale bytes as one word, [128] in
  // the order of the threads that copy them (mx_scale_word_row).
  static constexpr uint32_t kStagedCodeBytes = kBlockM * kBlockK / 2;
  static constexpr uint32_t kSlotBytes = kStagedCodeBytes + kBlockM * 4;
  static constexpr uint32_t kOffA = 0;
  static constexpr uint32_t kOffB = kOffA + kStages * kABytes;
  static constexpr uint32_t kOffSa = kOffB + kStages * kBBytes;
  static constexpr uint32_t kOffSb = kOffSa + kStages * kSaSlot;
  static constexpr uint32_t kOffStaging = kOffSb + kStages * kSbBytes;
  static constexpr uint32_t kOffBars = kOffStaging + kStagingSlots * kSlotBytes;
  static constexpr uint32_t kOffLut = kOffBars + 2 * kStages * sizeof(uint64_t);  // kMx: kMxLutEntries tables
  static constexpr uint32_t kOffGroups = kOffLut + (kMx ? kMxLutEntries * sizeof(uint2) : 0);
  static size_t bytes(int64_t G) { return 1024 + kOffGroups + 2 * sizeof(int32_t) * static_cast<size_t>(G + 1); }
  static_assert(kOffB % 1024 == 0 && kOffSa % 1024 == 0 && kABytes % 1024 == 0 && kBBytes % 1024 == 0,
                "WGMMA tiles start on 1024-byte swizzle atoms");
  static_assert(kSaBytes % 16 == 0 && kSaSlot % 128 == 0 && kOffSb % 16 == 0 && kOffStaging % 16 == 0 &&
                    kOffBars % 8 == 0 && kOffLut % 8 == 0,
                "TMA, cp.async and mbarrier alignment");
  static_assert(1024 + kOffGroups + 2 * sizeof(int32_t) * (kMaxGroups + 1) <= kSm90MaxSmemPerBlock,
                "the ring, the staging slots and the largest group table fit one block's shared memory");
  // The producer converts block i after waiting for block i + kLookahead's stage, which the consumers free once
  // block i + kLookahead - kStages is done, in the overlapped main loop only when block i + kLookahead - kStages + 1
  // has arrived: that must be block i at the latest.
  static_assert(kStages >= kLookahead + 2, "the converter never waits for a stage held for the block it converts");
};

struct Params {
  const int32_t* offsets;  // device [G+1], raw
  int32_t G;
  int32_t M;          // rows of the row operand and of the output
  int32_t P;          // output columns (N for Fprop, K for Dgrad)
  int32_t k_blocks;   // reduction / 128
  const float* w_scales;
  int64_t w_scales_per_group;  // fp8_block_scale_count(P, R)
  int32_t w_scale_ld;          // fp8_block_scale_ld(R)
  bf16* out;
  const uint8_t* mx_codes;     // MXFP4 row operand (kMx only): packed E2M1 [M, R/2] and UE8M0 [M, R/32]
  const uint8_t* mx_scales;
};

// Warp 0: the raw offsets in s_o [G+1] become the safe offsets, and s_start [G+1] the tile starts, of
// grouped_tiles.h (the same values as grouped_tile_starts).
__device__ void group_tiles_warp(const Params& p, int32_t col_blocks, int32_t* s_o, int32_t* s_start) {
  sm90::safe_offsets_warp(s_o, p.G, p.M);
  sm90::exclusive_sum_warp(
      p.G, [&](int g) { return group_tile_count(s_o[g + 1] - s_o[g], kBlockM, col_blocks); }, s_start);
}

template <int kStages>
using RingPos = sm90::RingPos<kStages>;

// What a consumer thread needs to address its stages and rows (L: the kernel's Layout).
template <class L>
struct ConsumerCtx {
  uint8_t* smem;      // 1024-aligned base of L
  uint64_t* full;     // [kStages]
  uint64_t* empty;    // [kStages]
  int wg, lane;       // consumer warpgroup 0/1, lane in the warp
  int row_in_tile;    // this thread's first fragment row (the second is + 8)
};

// Promotion factors of K block kb for this thread's two fragment rows, read from `stage` (before it is released):
// s_lo[j] = x_scale[row, kb] * w_scale[column sub-tile j, kb], s_hi[j] the same for row + 8.
template <class L, int kNSub = L::kNSubTiles>
__device__ __forceinline__ void block_scales(const ConsumerCtx<L>& c, uint32_t stage, int32_t row0, int32_t kb,
                                             float (&s_lo)[kNSub], float (&s_hi)[kNSub]) {
  const float* sa =
      reinterpret_cast<const float*>(c.smem + L::kOffSa + stage * L::kSaSlot) + (L::kMxOperand ? 0 : (row0 & 3));
  const float* sb = reinterpret_cast<const float*>(c.smem + L::kOffSb + stage * L::kSbBytes);
  const float x_lo = sa[c.row_in_tile], x_hi = sa[c.row_in_tile + 8];
#pragma unroll
  for (int j = 0; j < kNSub; ++j) {
    const float w = sb[4 * j + (kb & 3)];
    s_lo[j] = x_lo * w;
    s_hi[j] = x_hi * w;
  }
}

__device__ __forceinline__ void fence_fragment(float (&f)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) sm90::fence_operand(f[i]);
}

// partial = A B over the 128 of K in `stage`, column sub-tile j: four m64n128k32 WGMMAs, committed as one group
// (asynchronous: wait for the group before reading partial).
template <class L>
__device__ __forceinline__ void issue_block(const ConsumerCtx<L>& c, uint32_t stage, int j, float (&partial)[64]) {
  const uint64_t desc_a = sm90::smem_desc_k_major_sw128(c.smem + L::kOffA + stage * L::kABytes + 64 * c.wg * kBlockK);
  const uint64_t desc_b = sm90::smem_desc_k_major_sw128(c.smem + L::kOffB + stage * L::kBBytes + 128 * j * kBlockK);
  fence_fragment(partial);
  sm90::wgmma_fence();
#pragma unroll
  for (int k = 0; k < kBlockK / kWgmmaK; ++k)  // + 32 bytes along K = + 2 in the descriptor's address field
    sm90::wgmma_m64n128k32_e4m3(partial, desc_a + 2 * k, desc_b + 2 * k, k > 0 ? 1u : 0u);
  sm90::wgmma_commit();
}

// This warp is done with `stage` (its WGMMAs that read it complete, its scales in registers): one of the
// kConsumerWarps arrivals that let the producer refill it.
template <class L>
__device__ __forceinline__ void release_stage(const ConsumerCtx<L>& c, uint32_t stage) {
  __syncwarp();
  if (c.lane == 0) sm90::mbar_arrive(&c.empty[stage]);
}

// Promotion (DeepSeek-V3): a K block's partial sums, scaled, into the FP32 accumulator, one FMA each.
__device__ __forceinline__ void promote(float (&acc)[64], const float (&partial)[64], float s_lo, float s_hi) {
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = __fmaf_rn(partial[i], (i & 2) ? s_hi : s_lo, acc[i]);
}

// Main loop, serial: per K block and column sub-tile, the WGMMAs into `partial`, wait for them, promote.
template <class L, int kNSub = L::kNSubTiles>
__device__ __forceinline__ void mainloop_serial(const ConsumerCtx<L>& c, const GroupedTile& tile, int32_t k_blocks,
                                                RingPos<L::kStages>& pos, float (&acc)[kNSub][64],
                                                float (&partial)[64]) {
  for (int32_t kb = 0; kb < k_blocks; ++kb) {
    sm90::mbar_wait(&c.full[pos.stage], pos.phase);
    float s_lo[kNSub], s_hi[kNSub];
    block_scales(c, pos.stage, tile.row0, kb, s_lo, s_hi);
#pragma unroll
    for (int j = 0; j < kNSub; ++j) {
      issue_block(c, pos.stage, j, partial);
      sm90::wgmma_wait<0>();
      fence_fragment(partial);
      if (j == kNSub - 1) release_stage(c, pos.stage);
      promote(acc[j], partial, s_lo[j], s_hi[j]);
    }
    pos.advance();
  }
}

// The K-block state of the overlapped main loop: the stage of the block whose WGMMAs are in flight or being
// promoted (held until they complete) and its promotion factors.
struct HeldBlock {
  uint32_t stage;
  float s_lo, s_hi;
};

// One step of the overlapped main loop: block kb's WGMMAs (into `cur`) are in flight; issue block kb + 1's into
// `next` from the stage at `pos`, wait until only those are pending, release kb's stage, promote `cur` while kb + 1
// runs on the tensor cores.
template <class L>
__device__ __forceinline__ void overlapped_step(const ConsumerCtx<L>& c, const GroupedTile& tile, int32_t kb,
                                                RingPos<L::kStages>& pos, HeldBlock& held, float (&acc)[64],
                                                float (&cur)[64], float (&next)[64]) {
  sm90::mbar_wait(&c.full[pos.stage], pos.phase);
  float s_lo[1], s_hi[1];
  block_scales(c, pos.stage, tile.row0, kb + 1, s_lo, s_hi);
  issue_block(c, pos.stage, 0, next);
  sm90::wgmma_wait<1>();  // groups complete in order: kb's is done, kb + 1's may run
  fence_fragment(cur);
  release_stage(c, held.stage);
  promote(acc, cur, held.s_lo, held.s_hi);
  held = HeldBlock{pos.stage, s_lo[0], s_hi[0]};
  pos.advance();
}

// The last K block of a tile, in `cur`: wait for it, release its stage, promote.
template <class L>
__device__ __forceinline__ void overlapped_finish(const ConsumerCtx<L>& c, const HeldBlock& held, float (&acc)[64],
                                                  float (&cur)[64]) {
  sm90::wgmma_wait<0>();
  fence_fragment(cur);
  release_stage(c, held.stage);
  promote(acc, cur, held.s_lo, held.s_hi);
}

// Main loop, overlapped (128-wide tile): two partials used alternately over the K blocks, so that block kb + 1's
// WGMMAs run while block kb is promoted. The same products, promotions and order as mainloop_serial: the same bits.
template <class L>
__device__ __forceinline__ void mainloop_overlapped(const ConsumerCtx<L>& c, const GroupedTile& tile,
                                                    int32_t k_blocks, RingPos<L::kStages>& pos, float (&acc)[64],
                                                    float (&p0)[64], float (&p1)[64]) {
  static_assert(L::kNSubTiles == 1, "the overlapped main loop's two partials fit the 128-wide tile only");
  sm90::mbar_wait(&c.full[pos.stage], pos.phase);
  float s_lo[1], s_hi[1];
  block_scales(c, pos.stage, tile.row0, 0, s_lo, s_hi);
  issue_block(c, pos.stage, 0, p0);
  HeldBlock held{pos.stage, s_lo[0], s_hi[0]};
  pos.advance();
  // Block kb is in p0 for even kb, in p1 for odd kb (two calls per turn keep every register index static).
  for (int32_t kb = 0;; kb += 2) {
    if (kb + 1 == k_blocks) {
      overlapped_finish(c, held, acc, p0);
      break;
    }
    overlapped_step(c, tile, kb, pos, held, acc, p0, p1);
    if (kb + 2 == k_blocks) {
      overlapped_finish(c, held, acc, p1);
      break;
    }
    overlapped_step(c, tile, kb + 1, pos, held, acc, p1, p0);
  }
}

__device__ __forceinline__ uint32_t bf16x2_bits(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (the lower address) from lo
  uint32_t u;
  memcpy(&u, &v, sizeof(u));
  return u;
}

// 4 x 4 transpose of 32-bit words over the 4 lanes of a quad: lane q's v[i] becomes lane i's v[q]. Two butterfly
// rounds (lane bit 0, then bit 1), in each the two words whose slot bit differs from the lane bit cross over.
__device__ __forceinline__ void quad_transpose(uint32_t (&v)[4], int lane) {
#pragma unroll
  for (int m = 1; m <= 2; m *= 2) {
    const bool upper = (lane & m) != 0;
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      if (s & m) continue;  // pairs (s, s + m)
      const uint32_t send = upper ? v[s] : v[s + m];
      const uint32_t got = __shfl_xor_sync(0xFFFFFFFFu, send, m);
      if (upper) v[s] = got;
      else v[s + m] = got;
    }
  }
}

// Epilogue: this thread's rows of the group as BF16 (round to nearest even), rows past the group's end not stored.
// Direct: each lane stores its BF16 pairs (4 bytes; a quad covers 16 bytes of a row per store). Coalesced: per 4
// consecutive 8-column groups a quad transposes its pairs so that each lane holds 8 consecutive columns and stores
// them as 16 bytes (a quad covers 64 bytes of a row per store). The same values either way.
template <bool kCoalesced, class L, int kNSub = L::kNSubTiles>
__device__ __forceinline__ void store_tile(const ConsumerCtx<L>& c, const Params& p, const GroupedTile& tile,
                                           const float (&acc)[kNSub][64]) {
  const int32_t r_lo = tile.row0 + c.row_in_tile, r_hi = r_lo + 8;
  bf16* out_lo = p.out + static_cast<int64_t>(r_lo) * p.P + tile.col0;
  bf16* out_hi = out_lo + 8 * static_cast<int64_t>(p.P);
  const bool lo_ok = r_lo < tile.row_end, hi_ok = r_hi < tile.row_end;
  const int q = c.lane % 4;
#pragma unroll
  for (int j = 0; j < kNSub; ++j) {
    if constexpr (kCoalesced) {
#pragma unroll
      for (int c4 = 0; c4 < 16; c4 += 4) {  // 8-column groups c4 .. c4 + 3
        uint32_t lo[4], hi[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          lo[i] = bf16x2_bits(acc[j][4 * (c4 + i)], acc[j][4 * (c4 + i) + 1]);
          hi[i] = bf16x2_bits(acc[j][4 * (c4 + i) + 2], acc[j][4 * (c4 + i) + 3]);
        }
        quad_transpose(lo, c.lane);  // lane q now holds columns 8 (c4 + q) .. + 7
        quad_transpose(hi, c.lane);
        const int col = 128 * j + 8 * (c4 + q);
        if (lo_ok) sm90::st_global_v4(out_lo + col, lo[0], lo[1], lo[2], lo[3]);
        if (hi_ok) sm90::st_global_v4(out_hi + col, hi[0], hi[1], hi[2], hi[3]);
      }
    } else {
#pragma unroll
      for (int c8 = 0; c8 < 16; ++c8) {
        const int col = 128 * j + 8 * c8 + 2 * q;
        if (lo_ok)
          *reinterpret_cast<__nv_bfloat162*>(out_lo + col) =
              __floats2bfloat162_rn(acc[j][4 * c8], acc[j][4 * c8 + 1]);
        if (hi_ok)
          *reinterpret_cast<__nv_bfloat162*>(out_hi + col) =
              __floats2bfloat162_rn(acc[j][4 * c8 + 2], acc[j][4 * c8 + 3]);
      }
    }
  }
}

// What the producer warpgroup needs to fill the stage ring (L: the kernel's Layout).
template <class L>
struct ProducerCtx {
  uint8_t* smem;             // 1024-aligned base of L
  uint64_t* full;            // [kStages]
  uint64_t* empty;           // [kStages]
  const int32_t* s_o;        // safe group offsets [G+1]
  const int32_t* s_start;    // tile starts [G+1]
  int32_t tiles, col_blocks;
};

// The copies of the B tile (W's rows b_row .. + BLOCK_N - 1 of the stacked [G * P, R] view, K block kb) and of its
// W scales into `stage`, completing on the stage's full barrier (after the arrive.expect_tx of the stage's
// transaction bytes, L::kTxBytes).
template <class L>
__device__ __forceinline__ void load_b(const ProducerCtx<L>& c, const Params& p, const CUtensorMap* map_b,
                                       const GroupedTile& tile, int32_t kb, uint32_t stage) {
  const int32_t b_row = tile.group * p.P + tile.col0;  // row of W's stacked [G * P, R] view
  const float* w_scales = p.w_scales + tile.group * p.w_scales_per_group + (tile.col0 / 128) * p.w_scale_ld;
  uint64_t* bar = &c.full[stage];
  sm90::tma_load_2d(c.smem + L::kOffB + stage * L::kBBytes, map_b, kb * kBlockK, b_row, bar);
#pragma unroll
  for (int j = 0; j < L::kNSubTiles; ++j)
    sm90::bulk_load(c.smem + L::kOffSb + stage * L::kSbBytes + 16 * j, w_scales + j * p.w_scale_ld + (kb & ~3), 16,
                    bar);
}

// Producer with an FP8 row operand: one thread issues every copy (A, B and both scales by the copy engine).
template <class L>
__device__ __forceinline__ void produce_fp8(const ProducerCtx<L>& c, const Params& p, const CUtensorMap* map_a,
                                            const CUtensorMap* map_b, const CUtensorMap* map_sa) {
  RingPos<L::kStages> pos;
  for (int32_t t = blockIdx.x; t < c.tiles; t += gridDim.x) {
    const GroupedTile tile = grouped_tile(t, c.s_o, c.s_start, p.G, kBlockM, L::kBlockN, c.col_blocks);
    for (int32_t kb = 0; kb < p.k_blocks; ++kb) {
      sm90::mbar_wait(&c.empty[pos.stage], pos.phase ^ 1);
      uint64_t* bar = &c.full[pos.stage];
      sm90::mbar_arrive_expect_tx(bar, L::kTxBytes);
      sm90::tma_load_2d(c.smem + L::kOffA + pos.stage * L::kABytes, map_a, kb * kBlockK, tile.row0, bar);
      load_b(c, p, map_b, tile, kb, pos.stage);
      sm90::tma_load_2d(c.smem + L::kOffSa + pos.stage * L::kSaSlot, map_sa, tile.row0 & ~3, kb, bar);
      pos.advance();
    }
  }
}

// MXFP4 row operand, the producer warpgroup's thread pt (0..127) in each of kMxPasses passes: tile row
// pt / 2 + 64 pass, MX blocks 2 (pt % 2) and 2 (pt % 2) + 1 of the K block (32 code bytes; the two threads of a
// row, neighbours in one warp, read its 64 contiguous bytes). The passes are unrolled: their shared-memory addresses
// differ by constants, their global ones by 64 rows of the operand.
constexpr int kMxPasses = 2;
constexpr int kMxRowsPerPass = kProducerThreads / 2;
static_assert(kMxPasses * kMxRowsPerPass == kBlockM && kBlockK / kMxBlock == 4,
              "four MX blocks per K block, two per thread of a pair, every row of the tile in one of the passes");

// The tile row whose scale word thread pt copies: the pair's rows pt / 2 and pt / 2 + 64, one each, so that both
// threads of a pair find both words written by their own warp.
__device__ __forceinline__ int mx_scale_word_row(int pt) { return pt / 2 + kMxRowsPerPass * (pt % 2); }

// Where thread pt copies the codes and scale bytes of one tile from (the tile's K block 0), and which of its rows
// lie inside the operand (bit pass: row pt / 2 + 64 pass < M; bit kMxPasses: its scale word's row).
struct MxTileSource {
  const uint8_t* codes;   // row pt / 2, bytes 32 (pt % 2) ..
  const uint8_t* scales;  // row mx_scale_word_row(pt)
  uint32_t valid;
};

__device__ __forceinline__ MxTileSource mx_tile_source(const Params& p, int pt, int32_t row0) {
  const int64_t code_ld = int64_t{p.k_blocks} * (kBlockK / 2), scale_ld = int64_t{p.k_blocks} * (kBlockK / kMxBlock);
  const int64_t r = int64_t{row0} + pt / 2, r_scale = int64_t{row0} + mx_scale_word_row(pt);
  uint32_t valid = r_scale < p.M ? 1u << kMxPasses : 0u;
#pragma unroll
  for (int pass = 0; pass < kMxPasses; ++pass) valid |= r + kMxRowsPerPass * pass < p.M ? 1u << pass : 0u;
  // Rows past M are never read (their copies zero-fill), so their pointers are clamped to the operand's start.
  return {valid & 1u ? p.mx_codes + r * code_ld + 32 * (pt % 2) : p.mx_codes,
          valid >> kMxPasses ? p.mx_scales + r_scale * scale_ld : p.mx_scales, valid};
}

// Stages K block kb of the tile into staging `slot` with cp.async (one commit group): this thread's 32 code bytes
// per pass and one row's four scale bytes (one word: the row's K/32 scale bytes are a multiple of 4). Rows at or
// past M are zero-filled (never stored).
template <class L>
__device__ __forceinline__ void stage_mx_block(const ProducerCtx<L>& c, const Params& p, int pt,
                                               const MxTileSource& src, int32_t kb, int slot) {
  uint8_t* staged = c.smem + L::kOffStaging + slot * L::kSlotBytes;
  uint32_t* words = reinterpret_cast<uint32_t*>(staged + L::kStagedCodeBytes);
  const int64_t pass_ld = int64_t{kMxRowsPerPass} * p.k_blocks * (kBlockK / 2);
  const uint8_t* codes = src.codes + kb * (kBlockK / 2);
#pragma unroll
  for (int pass = 0; pass < kMxPasses; ++pass) {
    const bool valid = (src.valid >> pass) & 1u;
    const uint8_t* from = valid ? codes + pass * pass_ld : p.mx_codes;
    uint8_t* to = staged + (pass * kProducerThreads + pt) * 32;
    detail::cp_async_16(to, from, valid);
    detail::cp_async_16(to + 16, from + 16, valid);
  }
  const bool valid = (src.valid >> kMxPasses) & 1u;
  detail::cp_async_4(words + pt, valid ? src.scales + kb * (kBlockK / kMxBlock) : p.mx_scales, valid);
  detail::cp_async_commit();
}

// 32 E4M3 codes of MX block b (16 code bytes q) of a row whose scale word is `word` and group scale exponent s,
// with the kernel's tables (luts): the direct rule's bytes (mxfp4_fp8_direct.cuh), 0x7F for a NaN block.
__device__ __forceinline__ void convert_mx32(const uint2* luts, uint4 q, uint32_t word, int b, int s, uint4& lo,
                                             uint4& hi) {
  const uint32_t own = (word >> (8 * b)) & 0xFFu;
  const bool nan = own == kUE8M0NaN;
  const int shift = min(max(static_cast<int>(own) - kUE8M0Bias - s, kMxLutShiftMin), kMxLutShiftMax);
  const uint2 lut = luts[nan ? kMxLutNaN : shift - kMxLutShiftMin];
  const E2M1ToE4M3Lut t{lut.x, lut.y};
  const uint32_t sign_mask = nan ? 0u : 0x80808080u;
  const uint2 e0 = detail::convert8(q.x, t, sign_mask), e1 = detail::convert8(q.y, t, sign_mask);
  const uint2 e2 = detail::convert8(q.z, t, sign_mask), e3 = detail::convert8(q.w, t, sign_mask);
  lo = make_uint4(e0.x, e0.y, e1.x, e1.y);
  hi = make_uint4(e2.x, e2.y, e3.x, e3.y);
}

// Converts staging `slot` (complete and visible to this warp) into `stage`'s A tile and X scales with the direct
// rule (the bytes of mxfp4_row_to_fp8_row: mxfp4_fp8_direct.cuh's group scale and code conversion, the block's
// table read from the kernel's tables instead of computed), then hands them to WGMMA: this thread's ordinary
// shared-memory writes ordered before the async proxy's reads, and one of the 128 converter arrivals on the
// stage's full barrier. A tile: K-major, 128 bytes per row, as the copy engine's 128-byte swizzle writes it
// (16-byte chunk c of row r at chunk c ^ (r % 8), the tile 1024-byte aligned); X scale of tile row i at float i.
template <class L>
__device__ __forceinline__ void convert_mx_block(const ProducerCtx<L>& c, int pt, int slot, uint32_t stage) {
  const uint8_t* staged = c.smem + L::kOffStaging + slot * L::kSlotBytes;
  const uint32_t* words = reinterpret_cast<const uint32_t*>(staged + L::kStagedCodeBytes);
  const uint2* luts = reinterpret_cast<const uint2*>(c.smem + L::kOffLut);
  const int h = pt % 2, r = pt / 2;  // MX blocks 2h, 2h + 1 of rows r + 64 pass
  // Rows r + 64 pass share r % 8, so each pass writes the same four swizzled chunks of its row.
  uint8_t* a = c.smem + L::kOffA + stage * L::kABytes + r * kBlockK;
  float* sa = reinterpret_cast<float*>(c.smem + L::kOffSa + stage * L::kSaSlot) + r;
#pragma unroll
  for (int pass = 0; pass < kMxPasses; ++pass) {
    const uint32_t word = words[2 * r + pass];  // copied by thread 2r + pass (mx_scale_word_row)
    const int s = detail::group_scale_exponent(word);
    const uint4* q = reinterpret_cast<const uint4*>(staged + (pass * kProducerThreads + pt) * 32);
    uint8_t* a_row = a + kMxRowsPerPass * pass * kBlockK;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int b = 2 * h + j;
      uint4 lo, hi;
      convert_mx32(luts, q[j], word, b, s, lo, hi);
      *reinterpret_cast<uint4*>(a_row + ((2 * b) ^ (r % 8)) * 16) = lo;
      *reinterpret_cast<uint4*>(a_row + ((2 * b + 1) ^ (r % 8)) * 16) = hi;
    }
    if (h == 0) sa[kMxRowsPerPass * pass] = exp2_exact(s);
  }
  sm90::fence_proxy_async_shared();
  sm90::mbar_arrive(&c.full[stage]);
}

// A position in the MXFP4 producer's sequence of K blocks: the stage and its use's parity, and the staging slot.
template <class L>
struct MxPos {
  RingPos<L::kStages> ring;
  int slot = 0;
  __device__ __forceinline__ void advance() {
    ring.advance();
    slot = slot + 1 == L::kStagingSlots ? 0 : slot + 1;
  }
};

// Producer with an MXFP4 row operand: all 128 threads. Per K block of every tile (in the consumers' order): wait
// for the stage to be free, the first thread copies B and its scales in, every thread stages its share of the
// packed codes and scale bytes (cp.async), and then converts the block staged kLookahead blocks earlier (its
// copies awaited) into that block's stage; the last blocks are converted after the walk. The stage's full barrier
// completes when the B copies have landed and the 128 converters have arrived.
template <class L>
__device__ __forceinline__ void produce_mx(const ProducerCtx<L>& c, const Params& p, const CUtensorMap* map_b) {
  const int pt = static_cast<int>(threadIdx.x) - kConsumerThreads;
  MxPos<L> load_pos, convert_pos;
  detail::CpAsyncWindow<L::kLookahead> staged;  // blocks staged and not yet converted
  const auto convert_oldest = [&] {
    __syncwarp();  // the oldest staged block has landed and is visible to the other threads of its rows
    convert_mx_block(c, pt, convert_pos.slot, convert_pos.ring.stage);
    convert_pos.advance();
  };
  for (int32_t t = blockIdx.x; t < c.tiles; t += gridDim.x) {
    const GroupedTile tile = grouped_tile(t, c.s_o, c.s_start, p.G, kBlockM, L::kBlockN, c.col_blocks);
    const MxTileSource src = mx_tile_source(p, pt, tile.row0);
    for (int32_t kb = 0; kb < p.k_blocks; ++kb) {
      const uint32_t stage = load_pos.ring.stage;
      sm90::mbar_wait(&c.empty[stage], load_pos.ring.phase ^ 1);  // its A tile and scales are ours to write
      if (pt == 0) {
        sm90::mbar_arrive_expect_tx(&c.full[stage], L::kTxBytes);
        load_b(c, p, map_b, tile, kb, stage);
      }
      __syncwarp();  // the pair has read the slot's scale words (its previous conversion) before they refill
      stage_mx_block(c, p, pt, src, kb, load_pos.slot);
      load_pos.advance();
      staged.issued(convert_oldest);
    }
  }
  staged.drain(convert_oldest);
}

// kNSub column sub-tiles of 128; kOverlap: mainloop_overlapped (kNSub = 1 only), else mainloop_serial; kCoalesced:
// store_tile's coalesced epilogue; kMx: the row operand is MXFP4 (p.mx_codes, p.mx_scales), converted by the
// producer warpgroup (produce_mx; map_a and map_sa unused), else FP8 (map_a, map_sa).
template <int kNSub, bool kOverlap, bool kCoalesced, bool kMx>
__global__ void __launch_bounds__(kThreads, 1)
    grouped_gemm_sm90_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                             const __grid_constant__ CUtensorMap map_sa, const Params p) {
  static_assert(!kOverlap || kNSub == 1, "the overlapped main loop's two partials fit the 128-wide tile only");
  using L = Layout<kNSub, kMx>;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (sm90::smem_addr(smem_raw) & 1023)) & 1023);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kOffBars);
  uint64_t* empty = full + L::kStages;
  int32_t* s_o = reinterpret_cast<int32_t*>(smem + L::kOffGroups);
  int32_t* s_start = s_o + p.G + 1;
  const int32_t col_blocks = p.P / L::kBlockN;

  if (threadIdx.x == 0) {
    // full: the producer's arrive.expect_tx, completed by the copies (and, kMx, the 128 converters' arrivals)
    for (int s = 0; s < L::kStages; ++s) {
      sm90::mbar_init(&full[s], kMx ? 1 + kProducerThreads : 1);
      sm90::mbar_init(&empty[s], kConsumerWarps);   // one arrival per consumer warp
    }
    sm90::mbar_init_fence();
  }
  if (threadIdx.x == kConsumerThreads) {
    if constexpr (!kMx) sm90::prefetch_tensor_map(&map_a);
    sm90::prefetch_tensor_map(&map_b);
    if constexpr (!kMx) sm90::prefetch_tensor_map(&map_sa);
  }
  if constexpr (kMx) {
    if (threadIdx.x < kMxLutEntries) {
      const int e = static_cast<int>(threadIdx.x);
      const E2M1ToE4M3Lut t =
          e == kMxLutNaN ? E2M1ToE4M3Lut{0x7F7F7F7Fu, 0x7F7F7F7Fu} : e2m1_to_e4m3_lut(e + kMxLutShiftMin);
      reinterpret_cast<uint2*>(smem + L::kOffLut)[e] = make_uint2(t.lo, t.hi);
    }
  }
  for (int i = threadIdx.x; i <= p.G; i += kThreads) s_o[i] = p.offsets[i];  // one load in flight per thread
  __syncthreads();
  if (threadIdx.x < 32) group_tiles_warp(p, col_blocks, s_o, s_start);
  __syncthreads();
  const int32_t tiles = s_start[p.G];

  if (threadIdx.x >= kConsumerThreads) {
    // ---- producer warpgroup ------------------------------------------------------------------------------------
    const ProducerCtx<L> pc{smem, full, empty, s_o, s_start, tiles, col_blocks};
    if constexpr (kMx) {
      sm90::warpgroup_regs_dec<kProducerRegsMx>();
      produce_mx(pc, p, &map_b);
    } else {
      sm90::warpgroup_regs_dec<kProducerRegs>();
      if (threadIdx.x == kConsumerThreads) produce_fp8(pc, p, &map_a, &map_b, &map_sa);
    }
    return;
  }

  // ---- consumer warpgroups: rows 64 wg .. 64 wg + 63 of each tile -------------------------------------------------
  sm90::warpgroup_regs_inc<kMx ? kConsumerRegsMx : kConsumerRegs>();
  const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const ConsumerCtx<L> c{smem, full, empty, wg, lane, 64 * wg + 16 * warp + lane / 4};
  float partial[kOverlap ? 2 : 1][64];
#pragma unroll
  for (int b = 0; b < (kOverlap ? 2 : 1); ++b)
#pragma unroll
    for (int i = 0; i < 64; ++i) partial[b][i] = 0.0f;
  RingPos<L::kStages> pos;
  for (int32_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const GroupedTile tile = grouped_tile(t, s_o, s_start, p.G, kBlockM, L::kBlockN, col_blocks);
    float acc[kNSub][64];
#pragma unroll
    for (int j = 0; j < kNSub; ++j)
#pragma unroll
      for (int i = 0; i < 64; ++i) acc[j][i] = 0.0f;
    if constexpr (kOverlap) mainloop_overlapped(c, tile, p.k_blocks, pos, acc[0], partial[0], partial[1]);
    else mainloop_serial(c, tile, p.k_blocks, pos, acc, partial[0]);
    store_tile<kCoalesced>(c, p, tile, acc);
  }
}

// Row operand [M, R] times each expert's block tensor [P, R]^T into out [M, P] (Fprop: P = N, R = K; Dgrad: P = K,
// R = N), with the kernel of the template arguments.
template <int kNSub, bool kOverlap, bool kCoalesced, bool kMx>
void launch(const CUtensorMap& map_a, const CUtensorMap& map_b, const CUtensorMap& map_sa, const Params& p,
            cudaStream_t stream) {
  using L = Layout<kNSub, kMx>;
  const auto kernel = grouped_gemm_sm90_kernel<kNSub, kOverlap, kCoalesced, kMx>;
  const size_t smem = L::bytes(p.G);
  FP4MOE_CHECK(smem <= static_cast<size_t>(current_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin)),
               "grouped GEMM (sm90): the kernel needs {} bytes of shared memory per block, the device offers {}",
               smem, current_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin));
  check_setmaxnreg_pool(reinterpret_cast<const void*>(kernel),
                        kMx ? "grouped_gemm_sm90_kernel (MXFP4 operand)" : "grouped_gemm_sm90_kernel (FP8)", kThreads,
                        {kMx ? kConsumerRegsMx : kConsumerRegs, kMx ? kConsumerRegsMx : kConsumerRegs,
                         kMx ? kProducerRegsMx : kProducerRegs});
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  // At most ceil(M / 128) + G row blocks over all groups: no CTA beyond the tiles.
  const int64_t max_tiles = (ceil_div(p.M, kBlockM) + p.G) * (p.P / L::kBlockN);
  const int64_t grid = std::min<int64_t>(current_device_attribute(cudaDevAttrMultiProcessorCount), max_tiles);
  kernel<<<static_cast<unsigned>(grid), kThreads, smem, stream>>>(map_a, map_b, map_sa, p);
  CUDA_CHECK_LAUNCH();
}

// The kernel of a tile width (128 or 256) and config's variant.
template <bool kMx>
void launch_variant(int block_n, Sm90GemmConfig config, const CUtensorMap& map_a, const CUtensorMap& map_b,
                    const CUtensorMap& map_sa, const Params& p, cudaStream_t stream) {
  const bool coalesced = config.coalesced_epilogue;
  if (block_n == 256) {
    if (coalesced) launch<2, false, true, kMx>(map_a, map_b, map_sa, p, stream);
    else launch<2, false, false, kMx>(map_a, map_b, map_sa, p, stream);
  } else if (config.overlap_promotion) {
    if (coalesced) launch<1, true, true, kMx>(map_a, map_b, map_sa, p, stream);
    else launch<1, true, false, kMx>(map_a, map_b, map_sa, p, stream);
  } else {
    if (coalesced) launch<1, false, true, kMx>(map_a, map_b, map_sa, p, stream);
    else launch<1, false, false, kMx>(map_a, map_b, map_sa, p, stream);
  }
}

// Shape rules of the kernel (no CUDA call): empty when (N, K, G) is taken.
std::string shape_problem(int64_t N, int64_t K, int64_t G) {
  if (N < 128 || K < 128 || N % 128 != 0 || K % 128 != 0)
    return fmt::format("N and K must be positive multiples of 128 (the kernel's tile and scale block), got N={} K={}",
                       N, K);
  if (G < 1 || G > kMaxGroups) return fmt::format("expected 1 <= G <= {} groups, got G={}", kMaxGroups, G);
  if (G * std::max(N, K) > INT32_MAX)
    return fmt::format("G * max(N, K) must fit int32 tensor coordinates, got G={} N={} K={}", G, N, K);
  return {};
}

// Empty when the current device runs the kernel (compute capability 9.0: the sm_90a build).
std::string device_problem() {
  int device = 0, major = 0, minor = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return fmt::format("no usable CUDA device ({})", cudaGetErrorString(err));
  }
  if (major != 9 || minor != 0)
    return fmt::format("the kernel is built for sm_90a and needs a device of compute capability 9.0, got {}.{}", major,
                       minor);
  return {};
}

// The argument checks every entry shares, before any CUDA call (output [M, P], reduction R; (N, K) the problem's
// shape): false when M = 0, which reads and writes nothing.
bool check_arguments(const char* what, int64_t M, int64_t P, int64_t N, int64_t K, const int32_t* offsets, int64_t G,
                     Sm90GemmConfig config) {
  const std::string shape = shape_problem(N, K, G);
  FP4MOE_CHECK(shape.empty(), "{}: {}", what, shape);
  FP4MOE_CHECK(M >= 0 && M <= INT32_MAX - kBlockM, "{}: expected 0 <= M <= {} rows, got M={}", what,
               INT32_MAX - kBlockM, M);
  FP4MOE_CHECK((ceil_div(M, kBlockM) + G) * (P / 128) <= INT32_MAX,
               "{}: too many output tiles for int32 tile indices (M={}, width {}, G={})", what, M, P, G);
  FP4MOE_CHECK(config.block_n == 0 || config.block_n == 128 || (config.block_n == 256 && P % 256 == 0),
               "{}: block_n must be 0 (automatic), 128, or 256 with an output width that is a multiple of 256, got "
               "block_n={} for width {}", what, config.block_n, P);
  FP4MOE_CHECK(!config.overlap_promotion || config.block_n != 256,
               "{}: overlap_promotion runs the 128-wide tile only; expected block_n 0 or 128, got 256", what);
  FP4MOE_CHECK(offsets != nullptr && reinterpret_cast<uintptr_t>(offsets) % 4 == 0,
               "{}: device group offsets must be a non-null int32 pointer, got {}", what,
               static_cast<const void*>(offsets));
  return M > 0;
}

// After the pointer checks: the device's, then the tile width of `config` for an output [M, P] (Sm90GemmConfig's
// automatic rule for block_n 0).
int checked_tile_width(const char* what, int64_t M, int64_t P, Sm90GemmConfig config) {
  const std::string device = device_problem();
  FP4MOE_CHECK(device.empty(), "{}: {}", what, device);
  if (config.overlap_promotion) return 128;
  if (config.block_n != 0) return config.block_n;
  return P % 256 == 0 && ceil_div(M, kBlockM) * (P / 256) >= current_device_attribute(cudaDevAttrMultiProcessorCount)
             ? 256
             : 128;
}

// The tensor map of G stacked [P, R] E4M3 block tensors, boxes of block_n rows x one 128-wide K block.
CUtensorMap block_stack_map(const char* what, Fp8BlockStack w, int64_t P, int64_t R, int64_t G, int block_n) {
  return make_tensor_map_2d(what, w.codes, TmaElem::u8, static_cast<uint64_t>(R), static_cast<uint64_t>(G * P),
                            static_cast<uint64_t>(R), kBlockK, static_cast<uint32_t>(block_n),
                            TmaSwizzle::swizzle_128b);
}

Params params_of(const int32_t* offsets, int64_t G, int64_t M, int64_t P, int64_t R, Fp8BlockStack w, bf16* out) {
  return Params{offsets,
                static_cast<int32_t>(G),
                static_cast<int32_t>(M),
                static_cast<int32_t>(P),
                static_cast<int32_t>(R / kBlockK),
                w.scales,
                fp8_block_scale_count(P, R),
                static_cast<int32_t>(fp8_block_scale_ld(R)),
                out,
                nullptr,
                nullptr};
}

void row_times_blocks(const char* what, Fp8RowOperand rows, Fp8BlockStack w, int64_t M, int64_t P, int64_t R,
                      int64_t N, int64_t K, const int32_t* offsets, int64_t G, bf16* out, cudaStream_t stream,
                      Sm90GemmConfig config) {
  // Every argument check before the first CUDA call.
  if (!check_arguments(what, M, P, N, K, offsets, G, config)) return;
  FP4MOE_CHECK(nonnull_aligned16(rows.codes) && nonnull_aligned16(rows.scales) && nonnull_aligned16(w.codes) &&
                   nonnull_aligned16(w.scales) && nonnull_aligned16(out),
               "{}: operands and output must be non-null 16-byte aligned device pointers, got codes {} scales {}, "
               "weights {} scales {}, output {}", what, static_cast<const void*>(rows.codes),
               static_cast<const void*>(rows.scales), static_cast<const void*>(w.codes),
               static_cast<const void*>(w.scales), static_cast<const void*>(out));
  const int block_n = checked_tile_width(what, M, P, config);
  const CUtensorMap map_a = make_tensor_map_2d(what, rows.codes, TmaElem::u8, static_cast<uint64_t>(R),
                                               static_cast<uint64_t>(M), static_cast<uint64_t>(R), kBlockK, kBlockM,
                                               TmaSwizzle::swizzle_128b);
  const CUtensorMap map_b = block_stack_map(what, w, P, R, G, block_n);
  const int64_t scale_ld = fp8_row_scale_ld(M);
  const CUtensorMap map_sa = make_tensor_map_2d(what, rows.scales, TmaElem::f32, static_cast<uint64_t>(scale_ld),
                                                static_cast<uint64_t>(R / kBlockK),
                                                static_cast<uint64_t>(scale_ld * sizeof(float)), Layout<1>::kSaBox, 1,
                                                TmaSwizzle::none);
  launch_variant<false>(block_n, config, map_a, map_b, map_sa, params_of(offsets, G, M, P, R, w, out), stream);
}

}  // namespace

std::string sm90_device_unsupported() { return device_problem(); }

std::string grouped_gemm_sm90_unsupported(int64_t N, int64_t K, int64_t G) {
  const std::string shape = shape_problem(N, K, G);
  return shape.empty() ? device_problem() : shape;
}

void grouped_fprop_fp8_sm90(Fp8RowOperand x, Fp8BlockStack w, int64_t M, int64_t N, int64_t K, const int32_t* offsets,
                            int64_t G, bf16* y, cudaStream_t stream, Sm90GemmConfig config) {
  row_times_blocks("grouped_fprop_fp8_sm90", x, w, M, N, K, N, K, offsets, G, y, stream, config);
}

void grouped_dgrad_fp8_sm90(Fp8RowOperand dy, Fp8BlockStack w_t, int64_t M, int64_t N, int64_t K,
                            const int32_t* offsets, int64_t G, bf16* dx, cudaStream_t stream, Sm90GemmConfig config) {
  row_times_blocks("grouped_dgrad_fp8_sm90", dy, w_t, M, K, N, N, K, offsets, G, dx, stream, config);
}

void grouped_fprop_mxfp4_sm90(Mxfp4RowOperand x, Fp8BlockStack w, int64_t M, int64_t N, int64_t K,
                              const int32_t* offsets, int64_t G, bf16* y, cudaStream_t stream, Sm90GemmConfig config) {
  const char* what = "grouped_fprop_mxfp4_sm90";
  if (!check_arguments(what, M, N, N, K, offsets, G, config)) return;
  FP4MOE_CHECK(nonnull_aligned16(x.codes) && x.scales != nullptr && reinterpret_cast<uintptr_t>(x.scales) % 4 == 0 &&
                   nonnull_aligned16(w.codes) && nonnull_aligned16(w.scales) && nonnull_aligned16(y),
               "{}: expected non-null device pointers, MXFP4 codes 16-byte and scales 4-byte aligned, weights, their "
               "scales and the output 16-byte aligned; got codes {} scales {}, weights {} scales {}, output {}",
               what, static_cast<const void*>(x.codes), static_cast<const void*>(x.scales),
               static_cast<const void*>(w.codes), static_cast<const void*>(w.scales), static_cast<const void*>(y));
  const int block_n = checked_tile_width(what, M, N, config);
  const CUtensorMap map_b = block_stack_map(what, w, N, K, G, block_n);
  Params p = params_of(offsets, G, M, N, K, w, y);
  p.mx_codes = x.codes;
  p.mx_scales = x.scales;
  launch_variant<true>(block_n, config, map_b, map_b, map_b, p, stream);  // the kernel reads only map_b
}

}  // namespace fp4moe
