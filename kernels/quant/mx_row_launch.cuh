// Launch helpers of the MXFP4 row kernels: grid-stride grids of exactly one wave of resident blocks.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/check.h"

namespace fp4moe::detail {

// Blocks for the grid-stride kernel `kKernel` launched with `threads` threads per block (no dynamic shared
// memory) that needs `blocks_needed` blocks to cover its work in one sweep: at most as many as the current device
// holds at once (occupancy x multiprocessors), so that no block waits for a second wave; at least 1. The
// occupancy is computed once per kernel and thread count (it depends on the architecture only; the devices of
// one process are assumed alike).
template <auto kKernel, int kThreadsPerBlock>
unsigned mx_grid_blocks(int64_t blocks_needed) {
  static const int blocks_per_sm = [] {
    int n = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kKernel, kThreadsPerBlock, 0));
    return n > 0 ? n : 1;
  }();
  int device = 0, sms = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t cap = int64_t{sms} * blocks_per_sm;
  const int64_t blocks = blocks_needed < cap ? blocks_needed : cap;
  return static_cast<unsigned>(blocks > 0 ? blocks : 1);
}

}  // namespace fp4moe::detail
