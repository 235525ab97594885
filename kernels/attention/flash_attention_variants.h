// Variants of the causal flash attention kernels (flash_attention.h), selectable by id so that one benchmark run can
// compare them on the same inputs (benchmarks/bench_attention.cu: cases fwd@vN/<shape>, bwd@vN/<shape>) and the GPU
// tests can check each (tests/gpu/test_attention.cpp). Variant 0 is exactly what flash_attention_forward and
// flash_attention_backward run; they keep it until measurements pick another. Every variant takes the arguments,
// layouts and strides of the public function, computes the same products with the same roundings (BF16 P and dS, FP32
// accumulation, RNE outputs; results differ from variant 0 only by the order of FP32 sums, within the accuracy stated
// in flash_attention.h) and is deterministic: same inputs, same bits, no float atomics.
//
// Forward (flash_attention_fwd.cu, flash_attention_fwd_tiled.cu):
//   0  64-key blocks; 32 query rows per warp and 4 warps up to Dqk = 96, else 16 rows and 8 warps; Q fragments
//      re-read from shared memory at every key block; two barriers per key block; blocks (sequence-head,
//      query tile) with all heads side by side.
//   1  0 with row-stepping tile copies (load_tile_rows_async): each thread keeps one 16-byte column of a tile, so
//      the compiler no longer hoists a copy index per 16-byte piece out of the key loop into registers (ptxas -v at
//      (192,128): 203 -> 171 registers).
//   2  0's tiles, row-stepping copies, one barrier per key block, the warp's Q fragments held in registers for the
//      whole key loop (16-row warps with Dv <= 128, or Dqk <= 64), and the head-grouped block order (block_tile in
//      attention_tile.cuh: 8 heads side by side, heaviest tiles first, so that the K/V a block streams is still in
//      L2 for the other blocks of its head; all heads side by side, ~130 blocks in flight stream ~130 heads' K/V
//      from HBM: ~5.5 GB per MLA forward).
//   3  32 query rows per warp against 32-key blocks (4 warps, 128-row tiles; 16 rows, 8 warps at Dv = 192): twice
//      the fragment reuse of 0 at Dqk >= 128, two thread blocks per SM (94 KiB of shared memory at (192,128));
//      head-grouped order.
//   4  2 without the head-grouped order (2 against 4 measures the order alone).
// Backward (flash_attention_bwd.cu, flash_attention_bwd_split.cu), all after the D = rowsum(dO * O) kernel:
//   0  dK/dV kernel (64 keys, 8 warps splitting the query columns, P^T and dS^T through shared memory), then a dQ
//      kernel that recomputes S and dP (7 products in all).
//   1  0 with row-stepping tile copies: at (192,128) the dK/dV kernel drops from 255 registers and 52 bytes of
//      spill to 166 registers, no spill.
//   2  role-split dK/dV kernel (64 keys; 4 warps compute S^T, P^T and dV, 4 compute dP^T, dS^T and dK, for all 64
//      queries of a step each, exchanging P^T through shared memory; K and V fragments in registers where they
//      fit), then 1's dQ kernel; both in the head-grouped order (Q/dO, K/V of a head reused in L2).
//   3  2's kernel with dQ fused into the same sweep (5 products): each key block adds its dS K into an FP32 dQ
//      accumulator in a fixed order (key blocks m, m-1, ..., 0 for query block m) ordered by integer flags, work
//      handed out by an integer ticket counter head by head; the last contributor writes dQ. Deterministic, no
//      float atomics; one kernel after D, plus a memset of the flags.
//      Extra workspace: the accumulator, B*H*T*Dqk FP32 (at B = 1, T = 4096, H = 128, Dqk = 192: 384 MiB, twice dQ
//      in BF16, as FlashAttention-2's dq_accum), and one int per (sequence, head, 64-query block).
//   4  2 without the head-grouped order.
// The alternative of a per-key-block FP32 dQ partial reduced by a second kernel needs sum_j (T - 64 j) * Dqk * 4
// bytes per (sequence, head): about T^2 / 128 * Dqk * 4 = 100 MiB at T = 4096, Dqk = 192, i.e. 12.6 GiB for
// H = 128, written and read once (25 GiB of HBM traffic, more than variant 0's whole dQ kernel takes): not kept.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/attention/flash_attention.h"

namespace fp4moe::attn_detail {

constexpr int kForwardVariants = 5;
constexpr int kBackwardVariants = 5;

// One line naming what a variant changes (for benchmark tables and test traces). Rejects an id outside
// [0, kForwardVariants) or [0, kBackwardVariants).
const char* forward_variant_summary(int variant);
const char* backward_variant_summary(int variant);

// flash_attention_forward with the kernel of `variant`: same arguments, outputs and rejections, plus an id outside
// [0, kForwardVariants).
void flash_attention_forward_variant(int variant, const AttentionShape& s, AttnIn q, AttnIn k, AttnIn v, AttnOut o,
                                     float* lse, cudaStream_t stream);

// Bytes of device workspace flash_attention_backward_variant needs for `variant`: flash_attention_backward's for
// every variant but 3; for variant 3 also the FP32 dQ accumulator (B*H*T*Dqk * 4 bytes) and the flags
// (B*H*ceil(T/64) ints), each part rounded up to 256 bytes. 0 for an empty shape. Rejects negative B, T, H and a bad id.
int64_t flash_attention_backward_variant_workspace_bytes(int variant, const AttentionShape& s);

// flash_attention_backward with the kernels of `variant`: same arguments, outputs and rejections, plus an id outside
// [0, kBackwardVariants); workspace: flash_attention_backward_variant_workspace_bytes(variant, s) bytes, contents
// ignored, 16-byte aligned for variant 3 (rejected otherwise). Launches on `stream` (variant 3: a memset of the
// flags, the D kernel, the fused kernel); the workspace must not be used by another call until they are done.
void flash_attention_backward_variant(int variant, const AttentionShape& s, AttnIn q, AttnIn k, AttnIn v, AttnIn o,
                                      AttnIn dout, const float* lse, AttnOut dq, AttnOut dk, AttnOut dv,
                                      void* workspace, cudaStream_t stream);

}  // namespace fp4moe::attn_detail
