// Device-side placement of a run of consecutive token-block slots of an FP8 column tensor (the slots of
// ragged_token_blocks.cuh, kSlots at a time), found with one block scan of the offsets: a thread block that
// converts several token blocks pays for one scan.
#pragma once

#include <cub/block/block_scan.cuh>

#include <cstdint>

#include "kernels/quant/layouts.h"
#include "kernels/quant/ragged_token_blocks.cuh"

namespace fp4moe::detail {

// The group holding one slot, as the scan found it; group < 0: the slot is past the last token block.
struct SlotGroup {
  int group;
  int32_t row0, rows;          // offsets[g] and M_g
  unsigned long long prefix;   // (token blocks << 32) | padding columns of the groups before g
};

// The token block of `slot` from its SlotGroup (group >= 0). K: features.
__device__ __forceinline__ TokenBlock token_block_of(const SlotGroup& f, long long slot, int64_t K) {
  TokenBlock tb;
  const int64_t row0 = f.row0, rows = f.rows;
  const long long q = static_cast<long long>(f.prefix >> 32);
  const int64_t pad = static_cast<int64_t>(f.prefix & 0xFFFFFFFFull);
  const int block = static_cast<int>(slot - q);
  tb.col0 = block * kFp8Block;
  tb.row0 = row0 + tb.col0;
  tb.rows = static_cast<int>(rows - tb.col0 < kFp8Block ? rows - tb.col0 : kFp8Block);
  tb.ld = fp8_col_group_ld(rows);
  tb.codes_offset = K * (row0 + pad);  // P_g = offsets[g] + the padding of the groups before g
  tb.scales_offset = K * (q + block);
  return tb;
}

template <int kThreads, int kSlots>
struct TokenBlockRunFinder {
  static_assert(kMaxColGroups % kThreads == 0, "the scan gives every thread the same number of groups");
  static constexpr int kItems = kMaxColGroups / kThreads;
  using Scan = cub::BlockScan<unsigned long long, kThreads>;
  using TempStorage = typename Scan::TempStorage;

  // All threads of the block call this. Fills found[i] for slot first_slot + i (group -1 past the last token
  // block; the slots that exist come first). Returns false when the device offsets are not a valid split of M
  // rows (then nothing may be written), as TokenBlockFinder::find. found must not alias temp.
  static __device__ bool find(const int32_t* offsets, int G, int64_t M, long long first_slot, TempStorage& temp,
                              SlotGroup (&found)[kSlots]) {
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
    if (threadIdx.x < kSlots) found[threadIdx.x].group = -1;
    if (__syncthreads_or(bad)) return false;
    unsigned long long excl[kItems];
    Scan(temp).ExclusiveSum(items, excl);
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const long long q0 = static_cast<long long>(excl[i] >> 32), n = static_cast<long long>(items[i] >> 32);
#pragma unroll
      for (int k = 0; k < kSlots; ++k) {
        const long long slot = first_slot + k;
        if (slot >= q0 && slot < q0 + n) found[k] = SlotGroup{first + i, lo[i], hi[i] - lo[i], excl[i]};
      }
    }
    __syncthreads();
    return true;
  }
};

}  // namespace fp4moe::detail
