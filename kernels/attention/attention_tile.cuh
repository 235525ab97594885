// Device tile helpers of the attention kernels (flash_attention_fwd*.cu, flash_attention_bwd*.cu): the warp-level
// BF16 tensor-core product mma.sync.aligned.m16n8k16 with FP32 accumulation, its operand fragments read from
// shared memory with ldmatrix, asynchronous 16-byte tile copies (cp.async) that zero-fill the rows past a
// sequence's end, the quad reductions of the online softmax, barriers for warp-specialised kernels and the
// head-grouped block order.
//
// Fragments of m16n8k16 with .bf16 operands (PTX ISA, "Matrix Fragments for mma.m16n8k16"); in a warp, lane =
// 4 g + c (g = lane / 4 the group, c = lane % 4 the thread in its group):
//   A 16x16 (row-major, m x k):  a[0] = (g, 2c..2c+1)    a[1] = (g+8, 2c..2c+1)
//                                a[2] = (g, 2c+8..2c+9)  a[3] = (g+8, 2c+8..2c+9)
//   B 16x8  (k x n):             b[0] = (k 2c..2c+1, n g)   b[1] = (k 2c+8..2c+9, n g)
//   C 16x8  (m x n, FP32):       c[0], c[1] = (g, 2c), (g, 2c+1)    c[2], c[3] = (g+8, 2c), (g+8, 2c+1)
// A 32-bit register holds two BF16, the lower column (or k) in the low half. Two C fragments of n-tiles 2i and 2i+1
// are, rounded to BF16, exactly the A fragment of the k-slice [16 i, 16 i + 16) (a_from_acc): the softmax
// probabilities go from one product into the next without leaving registers.
//
// Shared-memory tiles are row-major [rows][D + kSmemPad] BF16. For D % 16 == 0 the pitch is an odd multiple of
// 16 bytes, so the eight 16-byte rows one ldmatrix phase reads fall in eight different bank groups (no conflicts).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/types.h"
#include "kernels/quant/cp_async.cuh"

namespace fp4moe::attn {

using detail::cp_async_commit;
using detail::cp_async_wait;

constexpr int kSmemPad = 8;  // BF16 elements (16 bytes) of padding per shared-memory row
constexpr int smem_pitch(int D) { return D + kSmemPad; }
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// The dynamic shared memory of the thread block (16-byte aligned).
template <typename T>
__device__ __forceinline__ T* dynamic_smem() {
  extern __shared__ __align__(16) unsigned char attn_smem[];
  return reinterpret_cast<T*>(attn_smem);
}

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- fragments ---------------------------------------------------------------------------------------------------

// Four 8x8 BF16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, r[i] receives this lane's part of it:
// row g, columns 2c..2c+1 (trans: row 2c..2c+1, column g, i.e. the transposed matrix).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p)));
}

// A fragment of the 16x16 block at (row0, col0) of a row-major tile (rows = m, columns = k).
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16* tile, int pitch, int row0, int col0, int lane) {
  ldmatrix_x4(a, tile + (row0 + (lane & 15)) * pitch + col0 + (lane >> 4) * 8);
}

// B fragments of two n-tiles, n0..n0+7 (b[0], b[1]) and n0+8..n0+15 (b[2], b[3]), over k0..k0+15, from a tile
// that stores B transposed: rows = n, columns = k (K for S = Q K^T: a key per row).
__device__ __forceinline__ void load_b_from_rows_n(uint32_t (&b)[4], const bf16* tile, int pitch, int n0, int k0,
                                                   int lane) {
  ldmatrix_x4(b, tile + (n0 + (lane & 7) + ((lane >> 4) << 3)) * pitch + k0 + ((lane >> 3) & 1) * 8);
}

// The same two n-tiles from a tile that stores B itself: rows = k, columns = n (V for O = P V: a key per row).
__device__ __forceinline__ void load_b_from_rows_k(uint32_t (&b)[4], const bf16* tile, int pitch, int k0, int n0,
                                                   int lane) {
  ldmatrix_x4_trans(b, tile + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * pitch + n0 + (lane >> 4) * 8);
}

// d += a b (16x8x16, BF16 inputs, FP32 accumulation).
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// acc[n] += a b[n] for the kNT n-tiles of B (over k0..k0+15), two per fragment read: B stored transposed (rows = n,
// from row n0; load_b_from_rows_n) or as itself (rows = k from row k0, n from column n0; load_b_from_rows_k).
template <int kNT>
__device__ __forceinline__ void mma_b_rows_n(float (&acc)[kNT][4], const uint32_t (&a)[4], const bf16* tile, int pitch,
                                             int n0, int k0, int lane) {
#pragma unroll
  for (int jj = 0; jj < kNT / 2; ++jj) {
    uint32_t b[4];
    load_b_from_rows_n(b, tile, pitch, n0 + jj * 16, k0, lane);
    mma_bf16_16816(acc[2 * jj], a, b[0], b[1]);
    mma_bf16_16816(acc[2 * jj + 1], a, b[2], b[3]);
  }
}
template <int kNT>
__device__ __forceinline__ void mma_b_rows_k(float (&acc)[kNT][4], const uint32_t (&a)[4], const bf16* tile, int pitch,
                                             int k0, int n0, int lane) {
#pragma unroll
  for (int jj = 0; jj < kNT / 2; ++jj) {
    uint32_t b[4];
    load_b_from_rows_k(b, tile, pitch, k0, n0 + jj * 16, lane);
    mma_bf16_16816(acc[2 * jj], a, b[0], b[1]);
    mma_bf16_16816(acc[2 * jj + 1], a, b[2], b[3]);
  }
}

// Sets kN accumulator fragments to 0.
template <int kN>
__device__ __forceinline__ void zero_fragments(float (&acc)[kN][4]) {
#pragma unroll
  for (int j = 0; j < kN; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[j][r] = 0.0f;
}

// Two floats rounded to BF16 (RNE), lo in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The A fragment (k-slice of 16) made of the C fragments of n-tiles 2i (c0) and 2i + 1 (c1), rounded to BF16.
__device__ __forceinline__ void a_from_acc(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
  a[0] = pack_bf16x2(c0[0], c0[1]);
  a[1] = pack_bf16x2(c0[2], c0[3]);
  a[2] = pack_bf16x2(c1[0], c1[1]);
  a[3] = pack_bf16x2(c1[2], c1[3]);
}

// Stores two floats as BF16 (RNE) to p, p + 1 (4-byte aligned).
__device__ __forceinline__ void store_bf16x2(bf16* p, float lo, float hi) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(lo, hi);
}

// ---- softmax arithmetic -------------------------------------------------------------------------------------------

// 2^x (ex2.approx: about 2 ulp, subnormal results flushed to 0; 2^-inf = 0).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Max and sum over the four lanes of a group (the lanes holding one accumulator row).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
__device__ __forceinline__ float warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// ---- synchronisation -----------------------------------------------------------------------------------------------

// Barriers for warps that run different code (warp-specialised kernels), in the non-.aligned form, which allows the
// warps of a block to reach one barrier from different instructions (PTX ISA, "barrier"). block_barrier: all threads
// of the block, as __syncthreads. Named barrier `id` (1..15) over `threads` threads (whole warps): arrive without
// waiting, or wait for all; shared-memory writes made before an arrive are visible after the matching sync.
__device__ __forceinline__ void block_barrier() { asm volatile("barrier.sync 0;\n" ::: "memory"); }
// The id is a template argument so that ptxas sees which barriers a kernel uses (a run-time id reserves all 16).
template <int kId, int kThreads>
__device__ __forceinline__ void named_barrier_arrive() {
  static_assert(kId >= 1 && kId < 16 && kThreads % 32 == 0, "barrier ids 1..15, whole warps");
  asm volatile("barrier.arrive %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
}
template <int kId, int kThreads>
__device__ __forceinline__ void named_barrier_sync() {
  static_assert(kId >= 1 && kId < 16 && kThreads % 32 == 0, "barrier ids 1..15, whole warps");
  asm volatile("barrier.sync %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
}

// ---- tile copies ----------------------------------------------------------------------------------------------------

// Starts the copy of rows row0 .. row0 + ROWS - 1 of one (sequence, head) slice into the tile smem [ROWS][pitch]:
// row t of the slice is at base + t * token_stride, D contiguous BF16 (16-byte aligned, D % 8 == 0). Rows at or past
// row_end are filled with zeros (nothing read). Every thread of the block (THREADS) calls it; completes at
// cp_async_wait.
template <int ROWS, int D, int THREADS>
__device__ __forceinline__ void load_tile_async(bf16* smem, const bf16* base, int64_t token_stride, int row0,
                                                int row_end, int tid) {
  constexpr int kChunks = D / 8;  // 16-byte pieces per row
  constexpr int kTotal = ROWS * kChunks;
#pragma unroll
  for (int i0 = 0; i0 < kTotal; i0 += THREADS) {
    const int i = i0 + tid;
    if (kTotal % THREADS == 0 || i < kTotal) {
      const int r = i / kChunks, c = i % kChunks;
      const bool valid = row0 + r < row_end;
      const bf16* src = base + (valid ? static_cast<int64_t>(row0 + r) * token_stride : 0) + c * 8;
      detail::cp_async_16(smem + r * smem_pitch(D) + c * 8, src, valid);
    }
  }
}

// As load_tile_async, with each thread keeping one 16-byte column and stepping over rows (THREADS / (D / 8) rows
// per pass): its addresses advance by a constant, so the compiler has no per-copy indices to hoist out of the
// caller's loop and keep in registers (the key32 forward and the role_split backward kernels use it).
template <int ROWS, int D, int THREADS>
__device__ __forceinline__ void load_tile_rows_async(bf16* smem, const bf16* base, int64_t token_stride, int row0,
                                                     int row_end, int tid) {
  constexpr int kChunks = D / 8, kRowsPerPass = THREADS / kChunks;
  static_assert(kRowsPerPass >= 1, "a row of 16-byte pieces per pass at most");
  if (tid >= kRowsPerPass * kChunks) return;
  const int c = tid % kChunks, r0 = tid / kChunks;
#pragma unroll
  for (int r = r0; r < ROWS; r += kRowsPerPass) {
    const bool valid = row0 + r < row_end;
    const bf16* src = base + (valid ? static_cast<int64_t>(row0 + r) * token_stride : 0) + c * 8;
    detail::cp_async_16(smem + r * smem_pitch(D) + c * 8, src, valid);
  }
}

// ---- block order ----------------------------------------------------------------------------------------------------

// The block order of the key32 forward and role_split backward kernels (attention_heuristics.h) over (sequence-head,
// tile). group_heads = 0: grid (B*H, tiles), block (bh, tile) = (blockIdx.x, blockIdx.y), all heads side by side.
// group_heads = G > 0: grid (G * tiles, ceil(B*H / G)), block x of row y is tile x / G of sequence-head y G + x % G:
// the hardware starts blocks in linear order, so the blocks in flight at a time cover a few heads at neighbouring
// tiles, and the K/V (or Q/dO) each block streams is read by the other blocks of its head while it is still in L2.
// Tiles keep the caller's meaning (the caller orders them heaviest first). Returns false for a block past the last
// head (the grid is rounded up to whole groups): the block has nothing to do.
__device__ __forceinline__ bool block_tile(int group_heads, int64_t bh_count, int64_t& bh, int& tile) {
  if (group_heads == 0) {
    bh = blockIdx.x;
    tile = static_cast<int>(blockIdx.y);
    return true;
  }
  tile = static_cast<int>(blockIdx.x / group_heads);
  bh = static_cast<int64_t>(blockIdx.y) * group_heads + blockIdx.x % group_heads;
  return bh < bh_count;
}

// The grid of block_tile's order, and the group size to use: kGroupHeads, or 0 (all heads side by side) where the
// grouped grid would exceed 65535 rows.
constexpr int kGroupHeads = 8;
inline int group_heads_for(int64_t bh_count) {
  return (bh_count + kGroupHeads - 1) / kGroupHeads <= 65535 ? kGroupHeads : 0;
}
inline dim3 tile_grid(int group_heads, int64_t bh_count, int64_t tiles) {
  if (group_heads == 0) return dim3(static_cast<unsigned>(bh_count), static_cast<unsigned>(tiles));
  return dim3(static_cast<unsigned>(group_heads * tiles),
              static_cast<unsigned>((bh_count + group_heads - 1) / group_heads));
}

// load_tile_rows_async (kRowCopies) or load_tile_async: the copy order of a kernel that both families run (the dQ
// kernel of flash_attention_bwd.cu) as a template choice.
template <bool kRowCopies, int ROWS, int D, int THREADS>
__device__ __forceinline__ void copy_tile_async(bf16* smem, const bf16* base, int64_t token_stride, int row0,
                                                int row_end, int tid) {
  if constexpr (kRowCopies) load_tile_rows_async<ROWS, D, THREADS>(smem, base, token_stride, row0, row_end, tid);
  else load_tile_async<ROWS, D, THREADS>(smem, base, token_stride, row0, row_end, tid);
}

}  // namespace fp4moe::attn
