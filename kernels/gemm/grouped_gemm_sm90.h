// Grouped FP8 GEMM of the MoE experts for Hopper (sm_90a), Fprop and Dgrad, over ragged expert groups whose
// offsets stay on the device: no host copy of the routing, one kernel launch for all experts.
//
// Per expert g with rows o[g] .. o[g+1]-1 (int32 offsets [G+1] on the device):
//   Fprop  Y_g  = X_g  W_g^T    X [M, K] FP8 1x128 row tensor, W [G, N, K] stacked 128x128 block tensors, Y  [M, N]
//   Dgrad  dX_g = dY_g W_g      dY [M, N] FP8 1x128 row tensor, W^T [G, K, N] stacked 128x128 block tensors
//                               (bf16_to_fp8_block128 with transpose = true), dX [M, K]
//   Fprop with X an MXFP4 row tensor (grouped_fprop_mxfp4_sm90): X converted in shared memory by the direct rule
//                               of mxfp4_row_to_fp8_row.h into the FP8 operand above
// Layouts: kernels/quant/layouts.h (codes E4M3 row-major; row scales fp32 [R/128, round_up(M, 4)]; block scales fp32
// [rows/128, round_up(R/128, 4)], expert g's at g * fp8_block_scale_count); the operand types of grouped_gemm.h.
// Output BF16 [M, N] (Fprop) or [M, K] (Dgrad), row-major, round-to-nearest-even from FP32.
//
// Arithmetic (DeepSeek-V3 technical report, section 3.3 "FP8 training": fine-grained quantization, increased
// accumulation precision): per 128-wide block kb of the reduction dimension the tensor cores multiply the E4M3
// codes into an FP32 partial sum, which is then promoted into the FP32 accumulator in CUDA cores:
//   acc[r, n] += partial_kb[r, n] * (x_scale[r, kb] * w_scale[n / 128, kb])      (one fused multiply-add)
// The result equals the FP64 product of the dequantized operands within the tensor cores' accumulation inside a
// 128-block (DESIGN.md: about 14 bits) and the BF16 rounding of the output; it is deterministic (the same bits run
// after run), but not bit-equal to cuBLASLt's (another summation order).
//
// Kernel (grouped_gemm_sm90.cu): persistent (one CTA of 3 warpgroups per SM), output tiles of 128 rows x BLOCK_N
// (128 or 256) columns walked in the order of grouped_tiles.h from the device offsets; a producer warpgroup loads
// X, W and both scales of each 128-wide K block with the bulk tensor copy engine (TMA, 128-byte swizzle) into a
// 4-6 stage shared-memory ring guarded by mbarriers; two consumer warpgroups of 64 rows each run WGMMA
// (m64n128k32, E4M3 x E4M3 -> FP32), promote as above (optionally with the next block's WGMMAs in flight:
// Sm90GemmConfig) and store their rows of the group as BF16. Rows of a tile past its group's end are computed from
// the next group's (or zero-filled) rows and never stored. With an MXFP4 X the producer warpgroup's 128 threads
// stage its packed codes and scale bytes (cp.async) and write the converted A tile and row scales themselves.
// Sources: PTX ISA 8.x (wgmma.mma_async, its shared-memory matrix descriptor and 128-byte swizzle;
// cp.async.bulk.tensor; cp.async; mbarrier; fence.proxy.async; setmaxnreg), CUDA Driver API (cuTensorMapEncodeTiled).
//
// Groups: any sizes, empty groups included; offsets need not end at M: rows at or past o[G] (and before o[0]) are
// left untouched. The offsets are read on the device and made safe there (grouped_tiles.h: clamped to [0, M],
// non-decreasing), so even bad offsets write nothing outside [0, M) rows; callers must still pass a valid split.
//
// Rejected with fp4moe::Error before anything is launched (the caller falls back to GroupedGemm's cuBLASLt path),
// first the arguments, with no CUDA call: N or K not a positive multiple of 128, G outside [1, 1024] or G * max(N,
// K) beyond int32, M < 0 or beyond int32 tile coordinates, a block_n other than 0, 128, 256 (256: the output width
// a multiple of 256; 256 with overlap_promotion), null offsets; then, unless M = 0 (which launches nothing), a null
// or not 16-byte aligned operand or output pointer, no usable device or one of compute capability other than 9.0
// (the kernel is built for sm_90a only), too little shared memory per block. Asynchronous on `stream`; never
// synchronises.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/common/types.h"
#include "kernels/gemm/grouped_gemm.h"
#include "kernels/gemm/mxfp4_gemm.h"

namespace fp4moe {

// Variants of the kernel; every combination gives the same output bits for the same tile width (the same
// products, promotion order and rounding).
struct Sm90GemmConfig {
  // Tile width: 0 (default) picks 256 columns when the output width is a multiple of 256 and the tiles of 256
  // columns still fill every SM at least once (ceil(M/128) * width/256 >= SM count), else 128.
  int block_n = 0;
  // WGMMAs in flight across the promotion: two partial accumulators used alternately over the K blocks, so that
  // block kb + 1's WGMMAs run while block kb's partial is promoted (otherwise each block's WGMMAs are waited for
  // before its promotion). Runs the 128-wide tile (block_n 0 means 128 here; 256 is rejected): 64 accumulator and
  // 2 x 64 partial registers per consumer thread.
  bool overlap_promotion = false;
  // Coalesced BF16 epilogue (the default): the 4 lanes holding a row's columns exchange their pairs by shuffles so
  // that each lane stores 8 consecutive columns as 16 bytes; false: each lane stores its 4-byte pairs (half of each
  // 32-byte sector per store; kept for the benchmark's comparison).
  bool coalesced_epilogue = true;
};

// Empty when the kernel takes an (N, K, G) problem on the current device, else why not (the shape rules above, or
// no usable device, or not compute capability 9.0). For callers choosing between this kernel and GroupedGemm.
std::string grouped_gemm_sm90_unsupported(int64_t N, int64_t K, int64_t G);

// Empty when the current device runs the sm_90a kernels (a usable device of compute capability 9.0), else why not.
std::string sm90_device_unsupported();

// Fprop: y [M, N] bf16 = X_g W_g^T per group (x: [M, K] row tensor; w: G stacked [N, K] block tensors).
// offsets: device int32 [G+1].
void grouped_fprop_fp8_sm90(Fp8RowOperand x, Fp8BlockStack w, int64_t M, int64_t N, int64_t K, const int32_t* offsets,
                            int64_t G, bf16* y, cudaStream_t stream, Sm90GemmConfig config = {});

// Dgrad: dx [M, K] bf16 = dY_g W_g per group (dy: [M, N] row tensor; w_t: G stacked [K, N] block tensors, W^T).
void grouped_dgrad_fp8_sm90(Fp8RowOperand dy, Fp8BlockStack w_t, int64_t M, int64_t N, int64_t K,
                            const int32_t* offsets, int64_t G, bf16* dx, cudaStream_t stream,
                            Sm90GemmConfig config = {});

// Fprop with the MXFP4 row operand read directly: y [M, N] bf16 = X_g W_g^T per group, x the MXFP4 row tensor
// [M, K] (layouts.h: codes packed E2M1 [M, K/2], 16-byte aligned; scales UE8M0 [M, K/32], 4-byte aligned), w as in
// grouped_fprop_fp8_sm90. The producer warpgroup stages each K block's packed codes and scale bytes (cp.async) and
// converts them in shared memory into the WGMMA operand with the direct rule of mxfp4_row_to_fp8_row.h (the
// 1x128 group scale becomes the row's operand scale), so that the output is bit for bit that of
// mxfp4_row_to_fp8_row followed by grouped_fprop_fp8_sm90 with the same config (NaN MX blocks included: codes
// 0x7F, their rows' outputs NaN), without the FP8 copy of X in memory. Same rules, rejections and asynchrony as
// grouped_fprop_fp8_sm90 (K a multiple of 128 among them), the scales' alignment 4 bytes.
void grouped_fprop_mxfp4_sm90(Mxfp4RowOperand x, Fp8BlockStack w, int64_t M, int64_t N, int64_t K,
                              const int32_t* offsets, int64_t G, bf16* y, cudaStream_t stream,
                              Sm90GemmConfig config = {});

}  // namespace fp4moe
