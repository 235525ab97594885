// BF16 -> MXFP4 row quantization (the paper's BF16ToFP4Row): the MoE expert input is quantized to MXFP4 before
// the expert-parallel dispatch and cached in this form for backward and recompute; with a transform and stochastic
// rounding, the quantizer of paper 2's MXFP4 GEMM operands (quantized along the reduction dimension K).
//
// Rules (OCP MX v1.0 sec. 6.3, DESIGN.md "Number formats"), per row:
//   v = x, or with a transform v = T(x) along K computed in FP32 (mx_transform.h: h16, h32, rht) and rounded to
//   BF16 (RNE), as a transform kernel writing BF16 would hand it over. Then per block of 32 contiguous elements
//   of v: amax = max |v|. A NaN or +-Inf in the block -> scale 0xFF and codes 0 (the block
//   decodes to NaN; counted). amax = 0 -> scale byte 0 and codes 0. Otherwise e = mx_scale_exponent(amax, mode)
//   (floor: OCP, ceil: no clipping), clamped to [-127, 127]; scale byte e + 127; code_i = E2M1(v_i * 2^-e) with
//   the exact power-of-two product rounded to nearest even (or stochastically, see Rounding).
// The codes and scales are those of the transformed tensor: dequantized they give T(x) approximately, and
// T^-1 of that approximates x (mx_transform_rows_inverse_ref).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/types.h"
#include "kernels/formats/formats.h"
#include "kernels/quant/mx_transform.h"

namespace fp4moe {

enum class Rounding : int {
  rne = 0,         // round to nearest, ties to even
  // Up with probability proportional to proximity: f32_to_e2m1_stochastic(v_i * 2^-e, u) with u =
  // mx_sr_uniform(seed, m * K + k) (mx_random.h: 8 bits per element, eight elements per 64-bit hash; unbiased for
  // |v_i| 2^-e >= 0.25, biased by under 2^(e-9) below). Stochastic rounding for MXFP4 training: Tseng et al. 2025.
  stochastic = 1,
};

struct MxQuantConfig {
  MxScaleMode scale_mode = MxScaleMode::floor;
  Rounding rounding = Rounding::rne;
  uint64_t seed = 0;  // stochastic rounding only; the result does not depend on the launch shape
  // Stochastic rounding only: index of the first row of `x` in the full tensor, so that a tensor quantized in
  // several launches over row ranges (x + r0 * K, row_offset = r0) draws the same numbers as one launch over all
  // rows: element (m, k) of the launch uses mx_sr_uniform(seed, (row_offset + m) * K + k). Must be >= 0.
  int64_t row_offset = 0;
  // Transform along K before quantization (mx_transform.h; the trainer's recipe names it MxTransform).
  HadamardTransform transform = HadamardTransform::none;
  uint64_t rht_seed = 0;  // rht only: the seed of the signs (pass a new one per step for fresh signs)
};

// x      [M, K] BF16, row-major, device, 16-byte aligned.
// codes  [M, K/2] uint8 packed E2M1 (layouts.h), device, 16-byte aligned.
// scales [M, K/32] uint8 UE8M0, device, any alignment (so that a launch over rows r0.. may pass scales + r0*K/32).
// nonfinite_blocks: optional device counter (8-byte aligned), incremented by the number of blocks holding NaN/Inf;
//   the caller zeroes it.
// Every byte of codes and scales is written. Reads and writes stay inside the three tensors.
// Rejects (fp4moe::Error, before any launch): M < 0, K <= 0 or K % 32 != 0 (the message names the shape),
// M * K beyond 2^62, an unknown scale mode, rounding or transform, K > 2^30 with rht, row_offset < 0, and for M > 0
// null or misaligned pointers.
// M = 0 launches nothing and accepts null pointers. Asynchronous on `stream`.
void bf16_to_mxfp4_row(const bf16* x, int64_t M, int64_t K, uint8_t* codes, uint8_t* scales,
                       const MxQuantConfig& cfg, unsigned long long* nonfinite_blocks, cudaStream_t stream);

// CPU reference, same layouts on host memory, same rejections (alignment aside). Returns the number of NaN/Inf
// blocks. Written element by element from the rule above; the GPU kernel must match it bit for bit.
int64_t bf16_to_mxfp4_row_ref(const bf16* x, int64_t M, int64_t K, uint8_t* codes, uint8_t* scales,
                              const MxQuantConfig& cfg);

namespace detail {
// The argument checks of bf16_to_mxfp4_row and its references (`what` names the caller); pointers aside.
void check_mx_quant_config(const char* what, int64_t M, int64_t K, const MxQuantConfig& cfg);
// The shape-free part: scale mode, rounding, row_offset >= 0 and a known transform.
void check_mx_quant_options(const char* what, const MxQuantConfig& cfg);
// The block rule on one row of values v [L] (L % 32 == 0; BF16 values held in FP32, already transformed), host
// memory: codes [L/2], scales [L/32]; element j's stochastic-rounding index is index_base + index_stride * j.
// Returns the NaN/Inf blocks. The CPU reference of every MXFP4 quantizer.
int64_t mx_quantize_values_ref(const float* v, int64_t L, uint64_t index_base, uint64_t index_stride,
                               uint8_t* codes, uint8_t* scales, const MxQuantConfig& cfg);

// The two kernels behind bf16_to_mxfp4_row (bf16_to_mxfp4_row.cu), which give the same bits: chunk_per_lane (four
// lanes per MX block, 8 elements each, the block amax and the Hadamard stages h >= 8 over warp shuffles) and
// block_per_thread (one MX block per thread, no shuffle, one hash for rht's 32 signs). bf16_to_mxfp4_row runs
// mx_row_default_kernel(transform) (block_per_thread for every option; the measurement behind it:
// bf16_to_mxfp4_row.cu); bench_quant and the GPU tests run both. bf16_to_mxfp4_row_using: same arguments and
// rejections as bf16_to_mxfp4_row.
enum class MxRowKernel : int { chunk_per_lane = 0, block_per_thread = 1 };
MxRowKernel mx_row_default_kernel(HadamardTransform t);
void bf16_to_mxfp4_row_using(MxRowKernel kernel, const bf16* x, int64_t M, int64_t K, uint8_t* codes,
                             uint8_t* scales, const MxQuantConfig& cfg, unsigned long long* nonfinite_blocks,
                             cudaStream_t stream);
}  // namespace detail

}  // namespace fp4moe
