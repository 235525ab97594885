// Device-side placement of one 128-token block of a ragged group in an FP8 column tensor (layouts.h), found by
// the thread block itself from the device offsets: no host sync, no per-expert host loop.
//
// The grid holds one slot per possible token block: sum_g ceil(M_g / 128) <= ceil(M / 128) + G whatever the
// split, so a grid of ceil(M/128) + G slots always suffices. Every thread block scans the G+1 offsets (a warp
// scan of (ceil(M_g/128), round_up(M_g, 16) - M_g) pairs), finds the group whose token blocks hold its slot and
// exits when the slot is past the last one.
#pragma once

#include <cstdint>

#include "kernels/quant/layouts.h"

namespace fp4moe::detail {

constexpr int kMaxColGroups = 1024;  // groups a column kernel accepts

struct TokenBlock {
  int64_t row0;          // first input row of this token block (offsets[g] + 128 * block)
  int rows;              // tokens of the block that exist: min(128, M_g - 128 * block), >= 1
  int64_t ld;            // L_g = round_up(M_g, kPad), the row length of the group's codes (kPad: TokenBlockFinder)
  int col0;              // first token of the block within the group (128 * block)
  int64_t codes_offset;  // K * P_g (elements), P_g = sum_{h<g} L_h: start of the group's [K, L_g] codes
  int64_t scales_offset; // K * (Q_g + block): start of this block's K scales
};

// Every thread block finds its token block on its own; each warp computes the answer by itself (no shared
// memory, no block barrier before the block's loads). kThreads: the block size (whole warps). kPad: the token
// padding of each group's rows, kColAlign (16) for the FP8 column tensor, kMxBlock (32) for the MXFP4 column
// tensor (bf16_to_mxfp4_col_ragged); ld and codes_offset follow it (L_g = round_up(M_g, kPad)).
template <int kThreads, int kPad = kColAlign>
struct TokenBlockFinder {
  static_assert(kThreads % 32 == 0, "whole warps");
  static_assert(kPad >= 1 && kPad <= kFp8Block, "padding of at most one token block");
  static __device__ __forceinline__ int64_t group_ld(int64_t rows) { return (rows + kPad - 1) / kPad * kPad; }
  // Lanes take 32 groups at a time; a warp scan of the packed (token blocks << 32 | padding columns) pairs gives
  // each group's prefix (both parts small: token blocks <= 2^31 / 128 + 1024 and padding <= 127 * 1024, so the
  // packed sum never carries), and a ballot names the lane whose group holds the slot. Every lane of every warp
  // must call it (warps may run it at their own pace). Returns false when the slot has no token block, or when
  // the device offsets are not a valid split of M rows (offsets[0] != 0, a decrease, offsets[G] != M): then
  // nothing may be written, so an invalid split can never write out of bounds. Host checks reject invalid
  // host_offsets earlier. Unlike a block scan of the same pairs, no barrier stands before the first load, which
  // made the column conversion faster when the two were timed side by side (bench_quant).
  static __device__ bool find_by_warp(const int32_t* offsets, int G, int64_t M, int64_t K, long long slot,
                                      TokenBlock& tb) {
    const int lane = threadIdx.x & 31;
    unsigned long long carry = 0;  // packed prefix of the groups before this chunk
    bool bad = false, found = false;
    int32_t f_row0 = 0, f_rows = 0;
    unsigned long long f_prefix = 0;
    for (int g0 = 0; g0 < G; g0 += 32) {
      const int g = g0 + lane;
      int32_t lo = 0, hi = 0;
      if (g < G) {
        lo = offsets[g];
        hi = offsets[g + 1];
      }
      const int64_t rows = int64_t{hi} - lo;
      unsigned long long item = 0;
      if (g < G) {
        if (rows < 0 || (g == 0 && lo != 0) || (g == G - 1 && hi != M)) bad = true;
        if (rows > 0)
          item = (static_cast<unsigned long long>((rows + kFp8Block - 1) / kFp8Block) << 32) |
                 static_cast<unsigned long long>(group_ld(rows) - rows);
      }
      unsigned long long incl = item;  // inclusive warp scan
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const unsigned long long up = __shfl_up_sync(0xFFFFFFFFu, incl, d);
        if (lane >= d) incl += up;
      }
      const unsigned long long excl = carry + incl - item;
      const long long q0 = static_cast<long long>(excl >> 32), n = static_cast<long long>(item >> 32);
      const unsigned hit = __ballot_sync(0xFFFFFFFFu, !found && slot >= q0 && slot < q0 + n);
      if (hit != 0) {
        const int src = __ffs(hit) - 1;
        f_row0 = __shfl_sync(0xFFFFFFFFu, lo, src);
        f_rows = __shfl_sync(0xFFFFFFFFu, static_cast<int32_t>(rows), src);
        f_prefix = __shfl_sync(0xFFFFFFFFu, excl, src);
        found = true;
      }
      carry += __shfl_sync(0xFFFFFFFFu, incl, 31);
    }
    if (__any_sync(0xFFFFFFFFu, bad) || !found) return false;
    const long long q = static_cast<long long>(f_prefix >> 32);
    const int64_t pad = static_cast<int64_t>(f_prefix & 0xFFFFFFFFull);
    const int block = static_cast<int>(slot - q);
    tb.col0 = block * kFp8Block;
    tb.row0 = f_row0 + tb.col0;
    tb.rows = static_cast<int>(f_rows - tb.col0 < kFp8Block ? f_rows - tb.col0 : kFp8Block);
    tb.ld = group_ld(f_rows);
    tb.codes_offset = K * (f_row0 + pad);
    tb.scales_offset = K * (q + block);
    return true;
  }
};

}  // namespace fp4moe::detail
