// The staged kernel of the BF16 -> MXFP4 column quantizers (bf16_to_mxfp4_col.h, detail::MxColKernel::staged): the
// block-per-thread kernel's rule and thread work (mx_col_block.cuh quantize_col_block: one MX block of 4 adjacent
// columns per thread, the same instructions and bits), its loads moved off the threads' registers and critical path.
//
// Why: the block-per-thread kernel holds its 32 row loads in registers and waits for them before any work, so each
// thread block's life is a load phase with nothing to issue followed by a compute phase with no load in flight;
// with 4-5 blocks of 4 warps per SM the schedulers often have no eligible warp (Nsight Compute's view of it:
// reports/results/h200/quant-sr8-20261202/README.md). Here the loads of the next tile are in flight while the
// current one is quantized, whatever the occupancy.
//
// Thread block: 4 warps, persistent: block b takes tiles b, b + gridDim.x, ... of tiles = slots x col_tiles (tile t:
// token-block slot t / col_tiles, as col_grid_slot of the other kernels, columns 128 (t % col_tiles) .. + 127), so
// the blocks resident at once read adjacent column tiles of the same rows. Per tile of 128 rows x 128 columns:
//   1. wait for this thread's copies of the tile (cp.async.wait_group 0) and a barrier: the whole tile is in shared
//      memory (32 KiB, row r at r x 256 bytes, rows past the tokens and columns past K zero-filled);
//   2. each thread reads its block (32 rows x 8 bytes) into registers, then a barrier: the buffer is free;
//   3. the block finds the next tile's token block and issues its copies (16 cp.async of 16 bytes per thread:
//      thread i copies 16-byte piece i % 16 of rows i / 16 + 8 j, j = 0..15; a warp instruction copies 2 rows x
//      256 contiguous bytes), then one commit (empty when there is no next tile);
//   4. quantize_col_block and the stores, while step 3's copies are in flight.
// Every barrier is reached by every thread the same number of times (the loop bound and the token-block search
// results are uniform over the block), and cp.async.wait_group waits for copies this thread issued (no arrival
// counts, no transaction bytes): nothing can wait forever.
// Warp w holds rows 64 (w % 2) .. + 63 and columns 64 (w / 2) .. + 63 of the tile; lane 16 b + c holds MX block b
// (rows 32 b .. + 31 of the warp's) of columns 4 c .. 4 c + 3: the 16 lanes of a half-warp read 128 contiguous
// bytes of one shared row (no bank conflict), and a store instruction writes 16 rows of X^T x 32 contiguous bytes
// (lanes c and 16 + c: one full 32-byte sector per column in the dense form). The stochastic-rounding partner of a
// lane (the other 4 columns of the same 8) is lane ^ 1.
// Registers: quantize_col_block's as in the block-per-thread kernel (__launch_bounds__ with the same
// col_block_min_blocks); 32 KiB of shared memory per block (static), so 6 blocks fit in an SM's shared memory and
// the registers decide the occupancy.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/quant/cp_async.cuh"
#include "kernels/quant/mx_col_block.cuh"
#include "kernels/quant/mx_col_device.cuh"

namespace fp4moe::detail {

constexpr int kColStagedThreads = 128;
constexpr int kColStagedTileCols = 128;  // columns of X per tile
constexpr int kColStagedRowPieces = kColStagedTileCols * 2 / 16;  // 16-byte pieces per tile row: 16
static_assert(kColStagedThreads == 4 * 32 && kMxColTileRows == 2 * 64 && kColStagedTileCols == 2 * 64,
              "4 warps of 64 rows x 64 columns");
static_assert(kColStagedThreads % kColStagedRowPieces == 0 &&
                  kMxColTileRows % (kColStagedThreads / kColStagedRowPieces) == 0,
              "whole rows per copy instruction of the block");

// Blocks per SM the kernel is compiled for: 4 (128 registers per thread) for every option. The loads no longer wait
// on the threads, so fewer warps suffice; at 96 registers (5 blocks) the 64 words of a block held over the next
// tile's copies spill.
constexpr int kColStagedMinBlocks = 4;

// One tile in shared memory: row r's 128 BF16 as 32 x 8 bytes (4 columns each).
using ColStagedTile = uint2[kMxColTileRows][kColStagedTileCols / 4];

// Step 3 above: this thread's copies of the token block tb's rows, columns k_tile .. k_tile + 127 of X (K % 8 == 0:
// a 16-byte piece is all in or all out), zeros where rows lie past tb.rows or columns past K.
__device__ __forceinline__ void issue_col_tile_copies(ColStagedTile& tile, const bf16* __restrict__ x,
                                                      const MxColParams& p, const TokenBlock& tb, int64_t k_tile) {
  constexpr int kRowStep = kColStagedThreads / kColStagedRowPieces;  // 8 rows per copy instruction of the block
  const int piece = static_cast<int>(threadIdx.x) % kColStagedRowPieces;
  const int row = static_cast<int>(threadIdx.x) / kColStagedRowPieces;
  const int64_t k = k_tile + 8 * piece;
  const bool cols_in = k < p.K;
  // Row row + kRowStep j of the token block: kRowStep K elements past the previous one.
  const bf16* src = x + (tb.row0 + row) * p.K + (cols_in ? k : 0);
  const int64_t step = kRowStep * p.K;
  // Partly unrolled: the copies' addresses stay few registers, as the caller holds its block's 64 words meanwhile.
#pragma unroll 4
  for (int r = row; r < kMxColTileRows; r += kRowStep, src += step) {
    const bool valid = cols_in && r < tb.rows;
    cp_async_16(&tile[r][2 * piece], valid ? src : x, valid);  // !valid: 16 zero bytes, x not read
  }
}

// The token block of tile t (false: none; the same answer on every thread of the block).
template <bool kRagged>
__device__ __forceinline__ bool find_col_staged_tile(const MxColParams& p, long long t, int col_tiles, TokenBlock& tb) {
  return find_col_token_block<kRagged, kColStagedThreads>(p, t / col_tiles, tb);
}

// tiles: token-block slots x col_tiles (col_tiles = ceil(K / 128)); gridDim.x <= tiles, one dimension.
template <Rounding kRounding, HadamardTransform kTransform, bool kRagged>
__global__ void __launch_bounds__(kColStagedThreads, kColStagedMinBlocks)
bf16_to_mxfp4_col_staged_kernel(const bf16* __restrict__ x, MxColParams p, uint8_t* __restrict__ codes,
                                uint8_t* __restrict__ scales, long long tiles, int col_tiles) {
  __shared__ __align__(16) ColStagedTile tile;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) & 31;
  const int r0 = 64 * (warp & 1) + kMxBlock * (lane >> 4);          // first row of the thread's MX block
  const int quad = (kColStagedTileCols / 8) * (warp >> 1) + (lane & 15);  // its 4 columns: 8-byte word of a row
  unsigned nonfinite = 0;

  long long t = blockIdx.x;
  {
    TokenBlock tb;
    if (t < tiles && find_col_staged_tile<kRagged>(p, t, col_tiles, tb))
      issue_col_tile_copies(tile, x, p, tb, int64_t{t % col_tiles} * kColStagedTileCols);
  }
  cp_async_commit();
  for (; t < tiles; t += gridDim.x) {
    cp_async_wait<0>();
    __syncthreads();  // every thread's copies of tile t have landed
    // Tile t's token block, found again rather than kept from its copies' issue: fewer registers held over the work.
    TokenBlock tb;
    const bool have = find_col_staged_tile<kRagged>(p, t, col_tiles, tb);
    const int64_t k0 = int64_t{t % col_tiles} * kColStagedTileCols + 4 * quad;
    // K % 8 == 0: the 4 columns are all in or all out. r0 < padded rows: at least one of the block's rows exists.
    const bool in = have && k0 < p.K && r0 < padded_tile_rows(tb);
    PairWords w[2];
    if (in) {
#pragma unroll
      for (int i = 0; i < kMxBlock; ++i) {
        const uint2 u = tile[r0 + i][quad];
        w[0][i] = u.x;
        w[1][i] = u.y;
      }
    }
    __syncthreads();  // every read of the buffer is done: it takes the next tile
    {
      const long long next = t + gridDim.x;
      TokenBlock nb;
      if (next < tiles && find_col_staged_tile<kRagged>(p, next, col_tiles, nb))
        issue_col_tile_copies(tile, x, p, nb, int64_t{next % col_tiles} * kColStagedTileCols);
    }
    cp_async_commit();
    // The lanes with work: the stochastic-rounding partners (lane ^ 1) are in or out together.
    const unsigned lanes = kRounding == Rounding::stochastic ? __ballot_sync(0xFFFFFFFFu, in) : 0u;
    if (in) nonfinite += quantize_col_block<kRounding, kTransform, 1>(w, p, tb, k0, r0, lanes, codes, scales);
  }
  if (p.nonfinite_blocks != nullptr) {
    const unsigned warp_total = __reduce_add_sync(0xFFFFFFFFu, nonfinite);
    if (lane == 0 && warp_total != 0) atomicAdd(p.nonfinite_blocks, static_cast<unsigned long long>(warp_total));
  }
}

}  // namespace fp4moe::detail
