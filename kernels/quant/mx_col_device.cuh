// What the kernels of the BF16 -> MXFP4 column quantizers share (bf16_to_mxfp4_col.cu, mx_col_block.cuh): their
// parameters, the token block of 128 rows a thread block quantizes (a slot of the dense tensor, or found from the
// ragged groups' device offsets) and where a run of tokens of one column sits in the layout (bf16_to_mxfp4_col.h).
#pragma once

#include <cstdint>

#include "kernels/quant/bf16_to_mxfp4_row.h"
#include "kernels/quant/layouts.h"
#include "kernels/quant/ragged_token_blocks.cuh"

namespace fp4moe::detail {

constexpr int kMxColThreads = 256;   // threads per block of the shared- and register-tile kernels
constexpr int kMxColTileRows = 128;  // rows of X per thread block: one token block (4 MX blocks along M)
constexpr int64_t kMxColMaxGridY = 65535;  // the grid's largest second dimension: slots run over (y, z)

// The token-block slot of this thread block in a grid (column tiles, slots over y and z).
__device__ __forceinline__ long long col_grid_slot() {
  return static_cast<long long>(blockIdx.z) * kMxColMaxGridY + blockIdx.y;
}

struct MxColParams {
  MxScaleMode mode;
  uint64_t seed;
  uint64_t row_offset;  // stochastic rounding: index of x's first row in the full tensor
  uint64_t rht_seed;
  int64_t M;
  int64_t K;
  const int32_t* offsets;  // ragged only
  int G;
  unsigned long long* nonfinite_blocks;
};

// The token block of kMxColTileRows rows in slot `slot`: from the device offsets (ragged) or the slot itself
// (dense). False when the slot has none or the device offsets are invalid: the thread block then writes nothing.
// Every thread of the block (kThreads threads) calls it (the ragged search runs per warp).
template <bool kRagged, int kThreads = kMxColThreads>
__device__ __forceinline__ bool find_col_token_block(const MxColParams& p, long long slot, TokenBlock& tb) {
  if constexpr (kRagged) {
    return TokenBlockFinder<kThreads, kMxBlock>::find_by_warp(p.offsets, p.G, p.M, p.K, slot, tb);
  } else {
    tb.row0 = static_cast<int64_t>(slot) * kMxColTileRows;
    if (tb.row0 >= p.M) return false;
    tb.rows = static_cast<int>(p.M - tb.row0 < kMxColTileRows ? p.M - tb.row0 : kMxColTileRows);
    tb.ld = p.M;
    tb.col0 = static_cast<int>(tb.row0);
    tb.codes_offset = 0;
    return true;
  }
}

// Rows of the token block that the layout holds (a multiple of 32: the group's zero padding included).
__device__ __forceinline__ int padded_tile_rows(const TokenBlock& tb) {
  return static_cast<int>(tb.ld - tb.col0 < kMxColTileRows ? tb.ld - tb.col0 : kMxColTileRows);
}

// Element offset in the layout of column k of X, row r0 of the token block: the group's K * P_g, its row k of X^T
// (length L_g), its token. Its codes are byte e / 2 (word e / 8), its MX block's scale byte e / 32.
__device__ __forceinline__ int64_t col_layout_offset(const TokenBlock& tb, int64_t k, int r0) {
  return tb.codes_offset + k * tb.ld + tb.col0 + r0;
}

}  // namespace fp4moe::detail
