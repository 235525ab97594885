// Device-side placement of one 128-token block of a ragged group in an FP8 column tensor (layouts.h), found by
// the thread block itself from the device offsets: no host sync, no per-expert host loop.
//
// The grid holds one slot per possible token block: sum_g ceil(M_g / 128) <= ceil(M / 128) + G whatever the
// split, so a grid of ceil(M/128) + G slots always suffices. Every thread block scans the G+1 offsets (a block
// scan of (ceil(M_g/128), round_up(M_g, 16) - M_g) pairs), finds the group whose token blocks hold its slot and
// exits when the slot is past the last one.
#pragma once

#include <cub/block/block_scan.cuh>

#include <cstdint>

#include "kernels/quant/layouts.h"

namespace fp4moe::detail {

constexpr int kMaxColGroups = 1024;  // groups a column kernel accepts (the scan holds 1024 / threads per thread)

struct TokenBlock {
  int64_t row0;          // first input row of this token block (offsets[g] + 128 * block)
  int rows;              // tokens of the block that exist: min(128, M_g - 128 * block), >= 1
  int64_t ld;            // L_g = round_up(M_g, 16), the row length of the group's codes
  int col0;              // first token of the block within the group (128 * block)
  int64_t codes_offset;  // K * P_g (elements): start of the group's [K, L_g] codes
  int64_t scales_offset; // K * (Q_g + block): start of this block's K scales
};

template <int kThreads>
struct TokenBlockFinder {
  static_assert(kMaxColGroups % kThreads == 0, "the scan gives every thread the same number of groups");
  static constexpr int kItems = kMaxColGroups / kThreads;
  using Scan = cub::BlockScan<unsigned long long, kThreads>;
  struct Storage {
    typename Scan::TempStorage scan;
    int group;
    int32_t row0, rows;  // offsets[g] and M_g of the group found, kept from the scan's own loads
    unsigned long long prefix;
  };

  // All threads of the block call this. Returns false when the slot has no token block, or when the device
  // offsets are not a valid split of M rows (offsets[0] != 0, a decrease, offsets[G] != M): then nothing may be
  // written, so an invalid split can never write out of bounds. Host checks reject invalid host_offsets earlier.
  static __device__ bool find(const int32_t* offsets, int G, int64_t M, int64_t K, long long slot, Storage& s,
                              TokenBlock& tb) {
    // Item i of thread t is group t * kItems + i; packed (token blocks << 32) | padding columns, both small:
    // token blocks <= 2^31 / 128 + 1024 and padding <= 15 * 1024, so the packed sum never carries.
    unsigned long long items[kItems];
    int32_t lo[kItems], hi[kItems];
    bool bad = false;
    const int first = threadIdx.x * kItems;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      int g = first + i;
      lo[i] = g < G ? offsets[g] : 0;
      hi[i] = g < G ? offsets[g + 1] : 0;
    }
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      int g = first + i;
      items[i] = 0;
      if (g < G) {
        int64_t rows = int64_t{hi[i]} - lo[i];
        if (rows < 0 || (g == 0 && lo[i] != 0) || (g == G - 1 && hi[i] != M)) bad = true;
        if (rows > 0)
          items[i] = (static_cast<unsigned long long>((rows + kFp8Block - 1) / kFp8Block) << 32) |
                     static_cast<unsigned long long>(fp8_col_group_ld(rows) - rows);
      }
    }
    if (threadIdx.x == 0) s.group = -1;
    if (__syncthreads_or(bad)) return false;
    unsigned long long excl[kItems];
    Scan(s.scan).ExclusiveSum(items, excl);
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      long long q0 = static_cast<long long>(excl[i] >> 32), n = static_cast<long long>(items[i] >> 32);
      if (slot >= q0 && slot < q0 + n) {  // exactly one item of one thread holds the slot, if any
        s.group = first + i;
        s.row0 = lo[i];
        s.rows = hi[i] - lo[i];
        s.prefix = excl[i];
      }
    }
    __syncthreads();
    if (s.group < 0) return false;
    const int64_t row0 = s.row0, rows = s.rows;
    const long long q = static_cast<long long>(s.prefix >> 32);
    const int64_t pad = static_cast<int64_t>(s.prefix & 0xFFFFFFFFull);
    const int block = static_cast<int>(slot - q);
    tb.col0 = block * kFp8Block;
    tb.row0 = row0 + tb.col0;
    tb.rows = static_cast<int>(rows - tb.col0 < kFp8Block ? rows - tb.col0 : kFp8Block);
    tb.ld = fp8_col_group_ld(rows);
    tb.codes_offset = K * (row0 + pad);  // P_g = offsets[g] + the padding of the groups before g
    tb.scales_offset = K * (q + block);
    return true;
  }
};

}  // namespace fp4moe::detail
