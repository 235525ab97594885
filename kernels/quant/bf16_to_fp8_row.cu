// BF16 -> FP8 1x128 row quantization (bf16_to_fp8.h). One half-warp per 128-element block: each lane loads 8
// BF16 (16 bytes), the amax is a shuffle maximum of magnitude bits, each lane writes its 8 codes (8 bytes).
// A thread block covers 64 rows of one 128-column block (each half-warp 4 rows, its 4 loads issued together),
// so its 64 scales are contiguous (block-major layout).
#include "kernels/common/check.h"
#include "kernels/quant/bf16_fp8_device.cuh"
#include "kernels/quant/bf16_to_fp8.h"
#include "kernels/quant/fp8_shape_checks.h"
#include "kernels/quant/layouts.h"

namespace fp4moe {
namespace {

constexpr int kThreads = 256;
constexpr int kHalfWarps = kThreads / 16;  // 16 lanes x 8 elements = one 128-element block
constexpr int kRowsPerHalfWarp = 4;
constexpr int kRowsPerCta = kHalfWarps * kRowsPerHalfWarp;

__global__ void __launch_bounds__(kThreads)
bf16_to_fp8_row_kernel(const bf16* __restrict__ x, int64_t M, int64_t K, Fp8ScaleMode mode,
                       uint8_t* __restrict__ codes, float* __restrict__ scales,
                       unsigned long long* __restrict__ nonfinite_blocks) {
  const int lane16 = threadIdx.x & 15;
  const int64_t r0 = int64_t{blockIdx.x} * kRowsPerCta + (threadIdx.x >> 4);  // rows r0 + 16 i
  const int64_t b = blockIdx.y, k = b * kFp8Block + 8 * lane16;
  const int64_t ld = fp8_row_scale_ld(M);

  uint4 v[kRowsPerHalfWarp];
#pragma unroll
  for (int i = 0; i < kRowsPerHalfWarp; ++i) {
    const int64_t r = r0 + kHalfWarps * i;
    v[i] = make_uint4(0, 0, 0, 0);
    if (r < M && k < K) v[i] = __ldg(reinterpret_cast<const uint4*>(x + r * K + k));  // K % 16 == 0: all 8 or none
  }
#pragma unroll
  for (int i = 0; i < kRowsPerHalfWarp; ++i) {
    const int64_t r = r0 + kHalfWarps * i;
    uint32_t m2 = detail::bf16x2_abs_max(detail::bf16x2_abs_max(0u, v[i].x), v[i].y);
    m2 = detail::bf16x2_abs_max(detail::bf16x2_abs_max(m2, v[i].z), v[i].w);
    uint32_t amax_bits = max(m2 & 0xFFFFu, m2 >> 16);
#pragma unroll
    for (int off = 8; off > 0; off >>= 1) amax_bits = max(amax_bits, __shfl_xor_sync(0xFFFFFFFFu, amax_bits, off));
    const Fp8BlockScale sc = fp8_block_scale(bf16_bits_to_f32(static_cast<uint16_t>(amax_bits)), mode);
    if (r < M && k < K) {
      uint2 out = sc.nonfinite ? make_uint2(0x7F7F7F7Fu, 0x7F7F7F7Fu)
                               : make_uint2(detail::bf16x4_to_e4m3x4(v[i].x, v[i].y, sc.multiplier),
                                            detail::bf16x4_to_e4m3x4(v[i].z, v[i].w, sc.multiplier));
      *reinterpret_cast<uint2*>(codes + r * K + k) = out;
    }
    if (lane16 == 0) {
      if (r < M) {
        scales[b * ld + r] = sc.scale;
        if (sc.nonfinite && nonfinite_blocks) atomicAdd(nonfinite_blocks, 1ull);
      } else if (r < ld) {
        scales[b * ld + r] = 1.0f;  // padding rows of the scale layout
      }
    }
  }
}

}  // namespace

void bf16_to_fp8_row(const bf16* x, int64_t M, int64_t K, Fp8ScaleMode mode, uint8_t* codes, float* scales,
                     unsigned long long* nonfinite_blocks, cudaStream_t stream) {
  const char* what = "bf16_to_fp8_row";
  detail::check_fp8_shape(what, "x", "M", M, K, false);
  FP4MOE_CHECK(mode == Fp8ScaleMode::pow2 || mode == Fp8ScaleMode::fp32, "{}: unknown scale mode {}", what,
               static_cast<int>(mode));
  FP4MOE_CHECK(ceil_div(K, kFp8Block) <= 65535, "{}: K={} too large (at most {})", what, K, 65535 * kFp8Block);
  detail::check_nonfinite_counter(what, nonfinite_blocks);
  if (M == 0) return;
  FP4MOE_CHECK(x != nullptr && codes != nullptr && scales != nullptr, "{}: null pointer (x, codes or scales)", what);
  FP4MOE_CHECK(detail::aligned16(x) && detail::aligned16(codes) && detail::aligned16(scales),
               "{}: x, codes and scales must be 16-byte aligned", what);
  dim3 grid(static_cast<unsigned>(ceil_div(M, kRowsPerCta)), static_cast<unsigned>(ceil_div(K, kFp8Block)));
  bf16_to_fp8_row_kernel<<<grid, kThreads, 0, stream>>>(x, M, K, mode, codes, scales, nonfinite_blocks);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe
