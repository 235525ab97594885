// The tensor-core kernel of the BF16 -> MXFP4 row quantizer with a Hadamard transform (bf16_to_mxfp4_row.h
// detail::MxRowKernel::block_mma; h16, h32 and rht, RNE or stochastic rounding): the butterflies of the transform
// (mx_transform.h) replaced by BF16 tensor-core products with the +-1 Walsh-Hadamard matrix W16 wherever that gives
// the same bits, the rule as written (the chunk-per-lane kernel's code) elsewhere.
//
// When the products are exact. A block of 16 BF16 inputs whose magnitudes are all normals with exponent fields in
// [30, 247] and whose largest and smallest exponent differ by at most 12 ("regular"): every input is a multiple of
// q = 2^(E_min - 7) (BF16 has 8 significant bits) below 2^(E_max + 1), so every signed sum of any of them is a
// multiple of q below 16 2^(E_max + 1) = 2^(E_min + 12 + 5) in magnitude: at most 2^24 multiples of q, exact in
// FP32. The butterflies' partial sums are such sums, so each of their FP32 additions is exact and their outputs are
// the exact W16 x. The tensor core's products x_i (+-1) are exact and their sum is representable with its bits all
// within 20 of the largest product's leading bit (spread 12 plus 8 significant bits), inside the FP32 accumulator's
// alignment window: the same exact W16 x. Zeros: an exact sum of 0 is +0 in both (nonzero inputs cancelling); a
// block of +0 inputs gives +0 everywhere in both; a block with any other zero (-0, or a zero beside nonzeros, whose
// partial sums could be -0 in the butterflies) is not regular. The bounds keep the outputs normal and finite
// (|W16 x| < 2^125) and, for RNE with a 16-point transform, inside mx_h16_fold_exact's window (the largest |W16 x|
// is at least the largest |x| >= 2^-97: sum of squares 16 |x|^2): the rest is the block-per-thread kernel's rule.
// h32 adds its last stage (h = 16) in FP32 to the two halves' exact W16 outputs, as the rule does.
// The tests compare every kernel with the CPU reference bit for bit on random data and on blocks at each side of
// these bounds (tests/quant/test_quant_row_gpu.cpp).
//
// Layout. A warp takes units of 8 consecutive MX blocks (256 elements): lane (g, c) = (lane / 4, lane % 4) loads
// elements 4c .. 4c + 3 of both halves of block g (two 8-byte loads) as the A fragment of mma.m16n8k16 (A rows g
// and g + 8: block g's halves; the reduction index permuted so that the four loaded elements fill the lane's
// registers), and two products with W16 (its rows and columns permuted to match, kept in 4 registers per lane) give
// the lane outputs 4c .. 4c + 3 of both halves: 8 of the block's 32 values, the four lanes of a quad the whole
// block. The regularity test reduces the 16-bit magnitudes' minimum and maximum over the quad (two shuffles each);
// a unit with any irregular block (or a NaN/Inf) runs the chunk-per-lane code for all of its 8 blocks, which
// reloads block g's chunk c (its 16 bytes, now in L1/L2) and applies the rule as written. Each lane writes its 2
// + 2 code bytes of each half, lane c = 0 the scale byte.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/formats/formats.h"
#include "kernels/quant/mx_fast_codecs.h"
#include "kernels/quant/mx_quant_device.cuh"
#include "kernels/quant/mx_transform.h"

namespace fp4moe::detail {

constexpr int kMmaUnitBlocks = 8;   // MX blocks per warp unit (one pair of m16n8k16 products)
constexpr int kMmaUnitsInFlight = 4;  // units whose loads a warp issues before quantizing the first
static_assert(kMmaUnitsInFlight == 4, "rht: lane (g, c) draws the signs of unit c's block g");

// W16 entry (i, j) as BF16 bits: +1 (0x3F80) or -1 (0xBF80).
__device__ __forceinline__ uint32_t w16_entry_bits(uint32_t i, uint32_t j) {
  return (__popc(i & j) & 1) != 0 ? 0xBF80u : 0x3F80u;
}

// The lane's B fragments of W16 for output tile t (columns n = g of tile t are outputs 4 (g / 2) + 2 t + g % 2):
// reg 0 rows k = 2c, 2c + 1 (inputs 4c, 4c + 1), reg 1 rows k = 2c + 8, 2c + 9 (inputs 4c + 2, 4c + 3).
struct W16Fragments {
  uint32_t b[2][2];
};

__device__ __forceinline__ W16Fragments w16_fragments(int lane) {
  const uint32_t g = static_cast<uint32_t>(lane) >> 2, c = static_cast<uint32_t>(lane) & 3u;
  W16Fragments f;
#pragma unroll
  for (uint32_t t = 0; t < 2; ++t) {
    const uint32_t i = 4 * (g >> 1) + 2 * t + (g & 1u);  // the output this lane's column n = g holds
    f.b[t][0] = w16_entry_bits(i, 4 * c) | (w16_entry_bits(i, 4 * c + 1) << 16);
    f.b[t][1] = w16_entry_bits(i, 4 * c + 2) | (w16_entry_bits(i, 4 * c + 3) << 16);
  }
  return f;
}

// D = A B (FP32 accumulation from +0), m16n8k16, A row-major BF16, B column-major BF16.
__device__ __forceinline__ void mma_bf16_16816(const uint32_t (&a)[4], const uint32_t (&b)[2], float (&d)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %10, %10, %10};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(0.0f));
}

// Whether both 16-element halves of the quad's MX block are regular (the file's head). w: the lane's words, w[0],
// w[1] of the first half (elements 4c .. 4c + 3), w[2], w[3] of the second. Every lane of the warp calls it.
__device__ __forceinline__ bool mma_block_regular(const uint32_t (&w)[4]) {
  const uint32_t a0 = w[0] & 0x7FFF7FFFu, a1 = w[1] & 0x7FFF7FFFu, a2 = w[2] & 0x7FFF7FFFu, a3 = w[3] & 0x7FFF7FFFu;
  // Low 16 bits: the first half's; high: the second's.
  const uint32_t p = __byte_perm(a0, a2, 0x5410), q = __byte_perm(a0, a2, 0x7632);
  const uint32_t r = __byte_perm(a1, a3, 0x5410), s = __byte_perm(a1, a3, 0x7632);
  uint32_t mn = __vimin3_u16x2(p, q, __vminu2(r, s)), mx = __vimax3_u16x2(p, q, __vmaxu2(r, s));
  mn = __vminu2(mn, __shfl_xor_sync(0xFFFFFFFFu, mn, 1));
  mx = __vmaxu2(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 1));
  mn = __vminu2(mn, __shfl_xor_sync(0xFFFFFFFFu, mn, 2));
  mx = __vmaxu2(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 2));
  bool regular = true, zero_half = false;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t lo = ((mn >> (16 * h)) & 0xFFFFu) >> 7, hi = ((mx >> (16 * h)) & 0xFFFFu) >> 7;
    const bool nonzero_regular = lo >= 30 && hi <= 247 && hi - lo <= 12;
    zero_half |= ((mx >> (16 * h)) & 0xFFFFu) == 0;
    regular &= nonzero_regular || ((mx >> (16 * h)) & 0xFFFFu) == 0;
  }
  // A half of zero magnitudes is regular only if every one of them is +0 (rare: reduce the raw words then).
  if (__any_sync(0xFFFFFFFFu, zero_half)) {
    uint32_t raw = __byte_perm(w[0] | w[1], w[2] | w[3], 0x5410) | __byte_perm(w[0] | w[1], w[2] | w[3], 0x7632);
    raw |= __shfl_xor_sync(0xFFFFFFFFu, raw, 1);
    raw |= __shfl_xor_sync(0xFFFFFFFFu, raw, 2);
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if (((mx >> (16 * h)) & 0xFFFFu) == 0 && ((raw >> (16 * h)) & 0xFFFFu) != 0) regular = false;
  }
  return regular;
}

// rht's sign flips on the lane's words of an MX block (signs: rht_sign_bits32 of the block): word i of the lane is
// the block's BF16 pair m = 2c + i (i < 2) or 8 + 2c + (i - 2), elements 2m and 2m + 1 (flip_block_signs' rule).
__device__ __forceinline__ void flip_lane_signs(uint32_t (&w)[4], uint32_t signs, uint32_t c) {
  const uint32_t lo = (signs & 0x5555u) | ((signs & 0xAAAAu) << 15);
  const uint32_t hi = ((signs >> 16) & 0x5555u) | (((signs >> 16) & 0xAAAAu) << 15);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t m = 2 * c + (i & 1);  // the pair's index within its half
    const uint32_t spread = (i < 2 ? lo : hi) << (15 - 2 * m);
    w[i] ^= spread & 0x80008000u;
  }
}

// The unit's fallback: lane (g, c) quantizes chunk c of block `b` (= unit block g) by the chunk-per-lane code (the
// rule as written, bit-exact with the reference), reloading its 16 bytes.
template <Rounding kRounding, HadamardTransform kTransform, class Params>
__device__ __forceinline__ void mma_unit_fallback(const uint4* __restrict__ x, int64_t b, bool in, uint32_t c,
                                                  uint32_t k_block, const Params& p, uint32_t* __restrict__ codes,
                                                  uint8_t* __restrict__ scales, unsigned long long& counted) {
  const uint4 v = in ? __ldg(x + 4 * b + c) : make_uint4(0, 0, 0, 0);
  const uint64_t first_index = p.index_base + static_cast<uint64_t>(b) * kMxBlock + 8 * c;
  const ChunkCodes q = quantize_chunk<kRounding, kTransform>(v, k_block + 8 * c, p.rht_seed, p.mode,
                                                             [&] { return chunk_draws(p.seed, first_index / 8); });
  if (in) {
    codes[4 * b + c] = q.packed;
    if (c == 0) scales[b] = q.scale;
  }
  if (p.nonfinite_blocks != nullptr) count_nonfinite_blocks(in, q.nonfinite, counted);
}

// One regular unit (every lane's block regular): the products, h32's last stage, the scale, the block rule.
template <Rounding kRounding, HadamardTransform kTransform, class Params>
__device__ __forceinline__ void mma_unit_regular(const uint32_t (&w)[4], const W16Fragments& f, int64_t b, bool in,
                                                 uint32_t c, const Params& p, uint16_t* __restrict__ codes16,
                                                 uint8_t* __restrict__ scales) {
  float d[2][4];
  const uint32_t a[4] = {w[0], w[2], w[1], w[3]};  // rows g (first half) and g + 8 (second), k low then k + 8
  mma_bf16_16816(a, f.b[0], d[0]);
  mma_bf16_16816(a, f.b[1], d[1]);
  // The lane's 8 outputs in order: first half 4c .. 4c + 3, second half 4c .. 4c + 3.
  float y[8] = {d[0][0], d[0][1], d[1][0], d[1][1], d[0][2], d[0][3], d[1][2], d[1][3]};
  if constexpr (hadamard_block_size(kTransform) == 32) {  // stage h = 16: (a, b) -> (a + b, a - b)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float u = y[i], v = y[i + 4];
      y[i] = __fadd_rn(u, v);
      y[i + 4] = __fsub_rn(u, v);
    }
  }
  // RNE with a 16-point transform: the scale 1/4 folded into the block exponent (exact here, see the head).
  constexpr bool kFold = kRounding == Rounding::rne && hadamard_block_size(kTransform) == 16;
  const float scale = hadamard_scale(hadamard_block_size(kTransform));
  uint32_t v[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    v[i] = kFold ? bits_of_bf162(__floats2bfloat162_rn(y[2 * i], y[2 * i + 1]))
                 : bits_of_bf162(__floats2bfloat162_rn(__fmul_rn(y[2 * i], scale), __fmul_rn(y[2 * i + 1], scale)));
  const uint4 vv = make_uint4(v[0], v[1], v[2], v[3]);
  const uint32_t amax_bits = block_max(chunk_amax_bits(vv));  // nonzero and finite: a regular block's outputs
  const int e = block_exponent(amax_bits, p.mode);
  uint32_t packed;
  if constexpr (kRounding == Rounding::rne) {
    packed = encode_chunk_rne(vv, e);
  } else {
    // Element 4c + i of the first half is byte i of word c % 2 of chunk c / 2's hash; of the second, of chunk
    // 2 + c / 2's. The block's first hash: n0.
    const uint64_t n0 = (p.index_base + static_cast<uint64_t>(b) * kMxBlock) / 8;
    const ChunkDraws lo = chunk_draws(p.seed, n0 + c / 2), hi = chunk_draws(p.seed, n0 + 2 + c / 2);
    const ChunkDraws draws{{lo.word[c & 1u], hi.word[c & 1u]}};
    packed = encode_chunk_stochastic_bf16x2(vv, sr_bf16x2_scale(e), draws);
  }
  if (in) {
    codes16[8 * b + c] = static_cast<uint16_t>(packed);            // first half: code bytes 2c, 2c + 1
    codes16[8 * b + 4 + c] = static_cast<uint16_t>(packed >> 16);  // second half: bytes 8 + 2c, 8 + 2c + 1
    if (c == 0) scales[b] = static_cast<uint8_t>(e - (kFold ? 2 : 0) + kUE8M0Bias);
  }
}

// Warps stride over groups of kMmaUnitsInFlight units; every lane of a warp runs every iteration (shuffles, mma).
template <Rounding kRounding, HadamardTransform kTransform, int kThreads, class Params>
__global__ void __launch_bounds__(kThreads)
bf16_to_mxfp4_row_mma_kernel(const uint4* __restrict__ x, int64_t num_blocks, Params p, uint8_t* __restrict__ codes,
                             uint8_t* __restrict__ scales) {
  static_assert(kTransform != HadamardTransform::none, "the tensor-core kernel computes a Hadamard transform");
  constexpr int kGroupBlocks = kMmaUnitBlocks * kMmaUnitsInFlight;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const uint32_t g = static_cast<uint32_t>(lane) >> 2, c = static_cast<uint32_t>(lane) & 3u;
  const W16Fragments f = w16_fragments(lane);
  const int64_t warps = int64_t{gridDim.x} * (kThreads / 32);
  unsigned long long counted = 0;
  const uint2* x2 = reinterpret_cast<const uint2*>(x);
  for (int64_t base = (int64_t{blockIdx.x} * (kThreads / 32) + threadIdx.x / 32) * kGroupBlocks; base < num_blocks;
       base += warps * kGroupBlocks) {
    uint32_t w[kMmaUnitsInFlight][4];
#pragma unroll
    for (int u = 0; u < kMmaUnitsInFlight; ++u) {
      const int64_t b = base + u * kMmaUnitBlocks + g;
      const bool in = b < num_blocks;
      // Block b's 64 bytes are 8 uint2: the lane's first-half elements 4c .. 4c + 3 are uint2 c, second half 4 + c.
      const uint2 lo = in ? __ldcs(x2 + 8 * b + c) : make_uint2(0, 0);
      const uint2 hi = in ? __ldcs(x2 + 8 * b + 4 + c) : make_uint2(0, 0);
      w[u][0] = lo.x;
      w[u][1] = lo.y;
      w[u][2] = hi.x;
      w[u][3] = hi.y;
    }
    // rht: lane (g, c) draws the signs of unit c's block g (one hash per MX block), the others take them by shuffle.
    uint32_t k_mine = 0, signs_mine = 0;
    if constexpr (kTransform == HadamardTransform::rht) {
      const int64_t b = base + c * kMmaUnitBlocks + g;
      k_mine = mod_by_inverse(static_cast<uint64_t>(b < num_blocks ? b : 0), p.k_blocks, p.k_blocks_inverse) *
               kMxBlock;
      signs_mine = rht_sign_bits32(p.rht_seed, k_mine);
    }
#pragma unroll
    for (int u = 0; u < kMmaUnitsInFlight; ++u) {
      const int64_t b = base + u * kMmaUnitBlocks + g;
      const bool in = b < num_blocks;
      uint32_t k_block = 0;
      if constexpr (kTransform == HadamardTransform::rht) {
        const int src = static_cast<int>(4 * g) + u;  // lane (g, u) drew unit u's block g
        k_block = __shfl_sync(0xFFFFFFFFu, k_mine, src);
        const uint32_t signs = __shfl_sync(0xFFFFFFFFu, signs_mine, src);
        // The regularity test looks at magnitudes: the flips change none; applied before the products.
        flip_lane_signs(w[u], signs, c);
      }
      if (__all_sync(0xFFFFFFFFu, mma_block_regular(w[u]))) {
        mma_unit_regular<kRounding, kTransform>(w[u], f, b, in, c, p, reinterpret_cast<uint16_t*>(codes), scales);
      } else {
        mma_unit_fallback<kRounding, kTransform>(x, b, in, c, k_block, p, reinterpret_cast<uint32_t*>(codes), scales,
                                                 counted);
      }
    }
  }
  if (p.nonfinite_blocks != nullptr && lane == 0 && counted != 0) atomicAdd(p.nonfinite_blocks, counted);
}

}  // namespace fp4moe::detail
