// Grouped FP8 Wgrad of the MoE experts for Hopper (sm_90a): the reduction (tokens) grouped by expert, the group
// offsets read on the device (no host copy of the routing), one kernel launch for all experts.
//
// Per expert g with tokens o[g] .. o[g+1]-1 (int32 offsets [G+1] on the device), M_g = o[g+1] - o[g]:
//   dW_g [N, K] = dY_g^T X_g = sum over the group's tokens t of dy[t, n] x[t, k]
// Operands: FP8 column tensors over the ragged groups (kernels/quant/layouts.h), token padding `token_pad` (16: the
// FP8 column tensor of bf16_to_fp8_col; 32: the FP8 conversion of an MXFP4 column tensor, mxfp4_gemm.h):
//   dy: group g's E4M3 codes at dy.codes + N * P_g, [N, L_g] row-major, L_g = round_up(M_g, token_pad),
//       P_g = sum_{h<g} L_h, codes of tokens M_g .. L_g - 1 zero; fp32 scales at dy.scales + N * Q_g,
//       [ceil(M_g / 128), N] block-major, Q_g = sum_{h<g} ceil(M_h / 128)
//   x:  the same over K features
// Both are K-major for WGMMA (the reduction, tokens, is contiguous). Output dW [G, N, K] row-major: BF16 written,
// FP32 written, or FP32 accumulated (dW_g += product), as GemmOutput says. An empty group gives dW_g = 0, or leaves
// it unchanged when accumulating: the semantics of GroupedGemm::wgrad_fp8 (grouped_gemm.h).
//
// Arithmetic (DeepSeek-V3 technical report, section 3.3: 1x128 scaling groups, promotion to FP32 every 128 of the
// reduction): per 128-token block b of a group the tensor cores multiply the E4M3 codes into an FP32 partial sum,
// promoted in CUDA cores as
//   acc[n, k] += partial_b[n, k] * (dy_scale[b][n] * x_scale[b][k])      (VEC128 x VEC128: a per-row times a
//                                                                         per-column factor, one FMA each)
// Tokens of a group's last block past M_g contribute exactly 0 (their codes are zero up to L_g, and the chunks
// past L_g are zero-filled in shared memory, never read). The result equals the FP64 product of the dequantized
// operands within the tensor cores' accumulation inside a 128-block, the FP32 rounding of the scale product
// dy_scale * x_scale (exact for power-of-two scales) and the output's rounding; deterministic (the
// same bits run after run), not bit-equal to cuBLASLt's (another summation order).
//
// Kernel (grouped_wgrad_sm90.cu), design:
// - Tiles: static, G x (N / 128) x (K / 128) output tiles of 128 rows (n) x 128 columns (k), walked by a persistent
//   grid (one CTA of 3 warpgroups per SM) with a stride scheduler; only a tile's reduction length,
//   ceil(M_g / 128) blocks, depends on the offsets. The safe offsets (grouped_tiles.h's rule, clamped to [0, M])
//   and the prefix sums P_g, Q_g are computed once per CTA into shared memory (sm90_grouped_device.cuh).
// - Loads: each group has its own row stride L_g, so one host-encoded tensor map does not describe an operand; the
//   producer warpgroup's 128 threads copy each stage with 16-byte cp.async straight into the 128-byte-swizzled
//   layout WGMMA's descriptor reads (chunk c of row r at chunk c ^ (r % 8)), chunks past L_g zero-filled (L_g is a
//   multiple of 16: a chunk is all in or all out), and the stage's 128 dY and 128 X scales of the block (512
//   contiguous bytes each). Each thread keeps up to kLookahead stages in flight; when the oldest has landed
//   (cp.async.wait_group) it orders its writes before the async proxy (fence.proxy.async) and arrives on that
//   stage's full barrier (128 arrivals, no transaction bytes).
// - Consumers: two warpgroups of 64 rows (n) each, m64n128k32 E4M3 WGMMAs per 32 tokens, promotion as above after
//   each block (overlapped with the next block's WGMMAs: Sm90WgradConfig), the stage released per warp; epilogue
//   straight from the registers (row-major stores of the FP32 pairs, or BF16 pairs rounded to nearest even;
//   accumulation by pair reductions in global memory, or reading the old pair first: Sm90WgradConfig).
// - Registers: setmaxnreg 56 for the producer, 224 for the consumers (sm90::setmaxnreg_fits).
// Sources: PTX ISA 8.x (wgmma.mma_async and its shared-memory matrix descriptor with the 128-byte swizzle; cp.async
// with src-size zero-fill; cp.async.wait_group; mbarrier; fence.proxy.async; setmaxnreg).
//
// Rejected with fp4moe::Error before anything is launched, first the arguments, with no CUDA call: N or K not a
// positive multiple of 128, G outside [1, 1024], more than INT32_MAX output tiles, token_pad other than 16 or 32,
// M outside [0, kWgradSm90MaxTokens], null or not 4-byte aligned offsets, accumulation into a BF16 output, a null or
// not 16-byte aligned operand (codes, scales) or output pointer; then no usable device or one of compute capability
// other than 9.0 (the kernel is built for sm_90a only), too little shared memory per block, a build whose register
// count per thread cannot hold the setmaxnreg counts (setmaxnreg_check.h). M = 0 still launches
// (every group empty: zeros, or dW unchanged when accumulating). Asynchronous on `stream`; never synchronises.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/gemm/grouped_gemm.h"

namespace fp4moe {

// The largest token bound M the kernel takes (P_g and Q_g stay in int32 for any offsets clamped to [0, M]).
constexpr int64_t kWgradSm90MaxTokens = (int64_t{1} << 30);

// Empty when the kernel takes an (N, K, G, token_pad) problem on the current device, else why not.
std::string grouped_wgrad_sm90_unsupported(int64_t N, int64_t K, int64_t G, int64_t token_pad);

// The kernel's variant. overlap_promotion (the default): two partial accumulators used alternately over a tile's
// 128-token blocks, so that block b + 1's WGMMAs run while block b is promoted (64 accumulator and 2 x 64 partial
// registers per consumer thread; the stage of the block being promoted is held until then); false: each block's
// WGMMAs waited for before its promotion (kept for the benchmark's comparison). The same bits either way.
// reduce_accumulate (the default), for an accumulated FP32 output: each pair added by a reduction in global memory
// (red.global.add.v2.f32, sm90_ptx.cuh), performed at the L2 while the thread goes on to the next tile, instead of
// read, added and written back by the thread. The same bits except where the old value, the call's contribution or
// the exact sum is subnormal (magnitude below 2^-126): the L2's add flushes subnormal inputs and results to zero
// (REDG ... FTZ), so such an element can come out different, even as a normal number. Each element is added to once
// per call: deterministic. GroupedGemm (and so the trainer) runs the default.
struct Sm90WgradConfig {
  bool overlap_promotion = true;
  bool reduce_accumulate = true;
};

// dw [G, N, K] (+)= dY_g^T X_g per group. dy: column tensor over [M, N]; x: column tensor over [M, K]; offsets:
// device int32 [G+1], made safe on the device (clamped to [0, M], non-decreasing) so that even a bad split reads
// nothing outside the operands' capacities for M tokens (layouts.h) and writes nothing outside dw; a caller
// without a host copy of the offsets passes its token count (GroupSplit::rows), or M = kWgradSm90MaxTokens where
// it has none, and must pass a valid split.
void grouped_wgrad_fp8_sm90(Fp8ColOperand dy, Fp8ColOperand x, int64_t M, int64_t N, int64_t K,
                            const int32_t* offsets, int64_t G, GemmOutput dw, cudaStream_t stream,
                            int64_t token_pad = 16, Sm90WgradConfig config = {});

}  // namespace fp4moe
