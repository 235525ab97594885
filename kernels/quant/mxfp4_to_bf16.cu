// MXFP4 -> BF16 dequantization (mxfp4_to_bf16.h). The tensor is walked as a flat sequence of 8-element units:
// one thread reads 4 bytes of packed codes and its block's scale byte, and writes 8 BF16 with one 16-byte store
// (four consecutive lanes make one MX block; a warp stores 512 contiguous bytes). Each thread keeps
// kUnitsPerThread units in flight; the grid strides.
//
// For scale bytes 2..252 every nonzero product is a BF16 normal, so the BF16 bits are the code's bits at scale 1
// plus (scale - 127) in the exponent field: a per-unit byte table and byte permutes, integer operations only.
// Other scale bytes (tiny results, overflow) take one exact fp32 product and the fp32 -> BF16 round to nearest
// even per element, as the CPU reference does everywhere.
#include "kernels/quant/mx_row_checks.h"
#include "kernels/quant/mx_row_launch.cuh"
#include "kernels/quant/mxfp4_to_bf16.h"

namespace fp4moe {
namespace {

constexpr int kThreads = 256;
constexpr int kUnitsPerThread = 4;  // independent 4-byte loads in flight per thread
constexpr int kUnit = 8;  // elements per thread and unit: 4 bytes of codes in, 16 bytes of BF16 out
static_assert(kMxBlock % kUnit == 0, "a unit never straddles two MX blocks");

constexpr uint32_t kBf16QuietNaNPair = 0x7FC07FC0u;

// BF16 bits of e2m1(code) * 2^(scale - 127) by one exact fp32 product and the fp32 -> BF16 round to nearest
// even, as the CPU reference computes every element (used for the scale bytes 0, 1, 253 and 254).
__device__ __forceinline__ uint32_t dequantize_one_f32(uint32_t code, uint32_t scale) {
  return f32_to_bf16_bits(
      __fmul_rn(e2m1_to_f32(static_cast<uint8_t>(code)), ue8m0_to_f32(static_cast<uint8_t>(scale))));
}

// Eight codes (element i in bits 4i..4i+3) with a scale byte in 2..252: every nonzero product is a BF16 normal
// whose bits are the magnitude's bits at scale 1 plus (scale - 127) in the exponent field. The eight magnitudes
// for this scale become a byte table (low bytes, high bytes), read four codes at a time with byte permutes; the
// sign bits move to bit 15 of their BF16. Integer operations only.
__device__ __forceinline__ uint4 dequantize_unit_normal(uint32_t codes8, uint32_t scale) {
  // BF16 bits of the magnitudes at scale 1, two per word: (0, 0.5), (1, 1.5), (2, 3), (4, 6).
  const uint32_t step = (scale - 127u) << 7;  // modulo 2^32; each 16-bit result stays in 0x0080..0x7F40
  const uint32_t p0 = 0x3F000000u + (step << 16), p1 = 0x3FC03F80u + step * 0x00010001u,
                 p2 = 0x40404000u + step * 0x00010001u, p3 = 0x40C04080u + step * 0x00010001u;
  const uint32_t lo0 = __byte_perm(p0, p1, 0x6420u), lo1 = __byte_perm(p2, p3, 0x6420u);  // low bytes, codes 0..7
  const uint32_t hi0 = __byte_perm(p0, p1, 0x7531u), hi1 = __byte_perm(p2, p3, 0x7531u);  // high bytes
  uint32_t out[4];
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    const uint32_t quad = codes8 >> (16 * q);  // four codes in the low 16 bits
    const uint32_t lo = __byte_perm(lo0, lo1, quad & 0x7777u), hi = __byte_perm(hi0, hi1, quad & 0x7777u);
    out[2 * q] = __byte_perm(lo, hi, 0x5140u) | ((quad << 12) & 0x8000u) | ((quad << 24) & 0x80000000u);
    out[2 * q + 1] = __byte_perm(lo, hi, 0x7362u) | ((quad << 4) & 0x8000u) | ((quad << 16) & 0x80000000u);
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

__device__ __forceinline__ uint4 dequantize_unit(uint32_t codes8, uint32_t scale) {
  if (scale == kUE8M0NaN) return make_uint4(kBf16QuietNaNPair, kBf16QuietNaNPair, kBf16QuietNaNPair, kBf16QuietNaNPair);
  if (scale >= 2u && scale <= 252u) return dequantize_unit_normal(codes8, scale);
  uint32_t w[4];  // results below 2^-126 or overflowing: element by element
#pragma unroll
  for (int p = 0; p < 4; ++p)
    w[p] = dequantize_one_f32((codes8 >> (8 * p)) & 0xFu, scale) |
           (dequantize_one_f32((codes8 >> (8 * p + 4)) & 0xFu, scale) << 16);
  return make_uint4(w[0], w[1], w[2], w[3]);
}

__global__ void __launch_bounds__(kThreads)
mxfp4_to_bf16_kernel(const uint32_t* __restrict__ codes, const uint8_t* __restrict__ scales, int64_t num_units,
                     uint4* __restrict__ y) {
  const int64_t sweep = int64_t{gridDim.x} * kThreads * kUnitsPerThread;
  for (int64_t base = int64_t{blockIdx.x} * kThreads * kUnitsPerThread; base < num_units; base += sweep) {
    uint32_t c[kUnitsPerThread], s[kUnitsPerThread];
#pragma unroll
    for (int j = 0; j < kUnitsPerThread; ++j) {
      const int64_t u = base + j * kThreads + threadIdx.x;
      if (u < num_units) {
        c[j] = __ldcs(codes + u);
        s[j] = __ldg(scales + u / (kMxBlock / kUnit));
      }
    }
#pragma unroll
    for (int j = 0; j < kUnitsPerThread; ++j) {
      const int64_t u = base + j * kThreads + threadIdx.x;
      if (u < num_units) __stcs(y + u, dequantize_unit(c[j], s[j]));
    }
  }
}

}  // namespace

void mxfp4_to_bf16(const uint8_t* codes, const uint8_t* scales, int64_t M, int64_t K, bf16* y,
                   cudaStream_t stream) {
  const char* what = "mxfp4_to_bf16";
  detail::check_mx_row_shape(what, M, K);
  if (M == 0) return;
  detail::check_mx_pointer(what, "codes", codes, 16);
  detail::check_mx_pointer(what, "scales", scales, 1);
  detail::check_mx_pointer(what, "y", y, 16);

  const int64_t num_units = M * K / kUnit;
  const unsigned grid =
      detail::mx_grid_blocks<mxfp4_to_bf16_kernel, kThreads>(ceil_div(num_units, int64_t{kThreads} * kUnitsPerThread));
  mxfp4_to_bf16_kernel<<<grid, kThreads, 0, stream>>>(reinterpret_cast<const uint32_t*>(codes), scales, num_units,
                                                       reinterpret_cast<uint4*>(y));
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe
