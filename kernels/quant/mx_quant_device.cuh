// Device helpers of the BF16 -> MXFP4 quantizers (bf16_to_mxfp4_row.cu along K, bf16_to_mxfp4_col.cu along M):
// both hand each thread "chunks" of 8 consecutive elements along the reduction dimension as a uint4 (element i in
// the low half of word i/2 when i is even, the high half when odd), four consecutive lanes holding the four chunks
// of one MX block in order (lane & 3 = chunk within the block). quantize_chunk then applies the rule of
// bf16_to_mxfp4_row.h (transform, block amax over the four lanes, UE8M0 scale, E2M1 codes) with the same bits in
// both kernels. Every lane of a warp must call the helpers that shuffle (whole warps, all lanes active).
//
// Cost per element on sm_90a: reports/results/h200/quant-speed-ranks-20261202/NOTES-speed.md (static SASS
// counts per kernel and option, how they are taken, what they predict). Against the budget: at copy bandwidth the
// H200 moves about 1.7e12 elements/s (2.5 bytes each: BF16 in, code and scale out) and issues about 33e12 thread
// instructions/s (132 SMs x 4 schedulers x 32 lanes x 1.98 GHz), so about 20 instructions per element at full
// issue, about 16 for 0.80 of copy at a realistic issue efficiency.
//   - RNE: about 7 (the BF16x2 encoder, two elements per instruction, plus the amax): memory-bound. Its integer
//     steps are multiply-adds and its magnitudes absolute-value operands, on the FMA pipe (encode_chunk_rne;
//     reports/results/h200/quant-encoder-alu-20261203/), which matters once a transform makes it compute-bound.
//   - SR: one hash per eight elements (mx_random.h mx_sr_hash64, 8-bit draws), about 14 instructions (two 64-bit
//     multiplies between three folds by 32 bits, the counter one 64-bit addition), 1.7 per element; the encoder
//     (encode_chunk_stochastic) about 11.6 per element with its loads and store (a product, a minimum, a sum
//     rounded up, one DPX maximum with a fused addition, the draw's mask and a shift-add, a shift and a shift-add
//     into the chunk's word, the signs by byte permutations per chunk). About 14.5 in all. The row quantizer's
//     block-per-thread kernel scales and clamps two elements per BF16x2 instruction instead
//     (encode_chunk_stochastic_bf16x2), 1.5 fewer per element in its static count. The column
//     block-per-thread kernel shares each row's hash between the two lanes that hold its 8 columns (one shuffle).
//   - H16 / H32: unpack 1, in-chunk butterflies 3, per stage across lanes one shuffle and one fused multiply-add
//     (a sign flip and an addition before), scale 1, BF16 pack 0.5: about 7 (H16) and 8 (H32) on top of RNE, plus
//     the shuffles' latency (8 per chunk for H16, 16 for H32, 2 for the amax). The row quantizer's block-per-thread
//     kernel (bf16_to_mxfp4_row.cu) holds a whole MX block per thread and needs none of them.
//   - RHT: the signs cost one splitmix64 per chunk in the chunk-per-lane row kernel (3 per element; a thread's
//     chunks lie 2048 columns apart), one per MX block in the block-per-thread row kernel (0.75 per element; the
//     flips one shift and one masked XOR per BF16 pair, flip_block_signs), one per MX block of 4 columns in the
//     column block-per-thread kernel (one shift per row and one masked XOR per BF16 pair).
//   - Column, shared-tile kernel: tiles of 128 rows x 32 columns with the grid's fast dimension along M, so the
//     blocks resident at once read one 64-byte strip of many rows (short DRAM bursts); 2 loads in flight per thread,
//     a barrier before any work, 8 two-byte shared loads per chunk. Register-tile kernel: 8 loads in flight per
//     thread, tiles of 128 x 128 with column tiles fastest, 4 byte permutations per chunk for the transpose, no
//     shared memory or barrier; 56-64 registers (RNE) or 80-106 (SR): 4 or 2 blocks of 256 threads per SM.
//     Block-per-thread kernel (mx_col_block.cuh): 32 loads of 8 bytes in flight per thread, the rule once per MX
//     block, no transpose or shuffle; 96 registers (RNE alone, with h16 or rht: 5 blocks of 128 threads per SM) or
//     128 (4 blocks).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/formats/formats.h"
#include "kernels/quant/bf16_to_mxfp4_row.h"
#include "kernels/quant/layouts.h"
#include "kernels/quant/mx_fast_codecs.h"
#include "kernels/quant/mx_random.h"
#include "kernels/quant/mx_transform.h"

namespace fp4moe::detail {

constexpr int kMxChunk = 8;  // BF16 elements per chunk (16 bytes); 4 chunks per MX block
static_assert(kMxBlock == 4 * kMxChunk, "four lanes per MX block");

constexpr uint32_t kBf16AbsNonFinite = 0x7F80;  // |x| bits >= this: Inf or NaN

// The magnitudes of a chunk's 8 elements (bf16x2_magnitude of each word).
__device__ __forceinline__ uint4 chunk_magnitudes(const uint4& v) {
  return make_uint4(bf16x2_magnitude(v.x), bf16x2_magnitude(v.y), bf16x2_magnitude(v.z), bf16x2_magnitude(v.w));
}

// Largest BF16 magnitude bits of one chunk (bits order like magnitudes; >= kBf16AbsNonFinite: Inf or NaN), from
// chunk_magnitudes (the same operation as encode_chunk_rne's).
__device__ __forceinline__ uint32_t chunk_amax_bits(const uint4& v) {
  const uint4 m = chunk_magnitudes(v);
  const uint32_t m2 = __vmaxu2(__vmaxu2(m.x, m.y), __vmaxu2(m.z, m.w));
  return max(m2 & 0xFFFFu, m2 >> 16);
}

// mx_scale_exponent of a finite, nonzero BF16 amax given by its magnitude bits, read off the exponent field when
// amax is a normal (floor: exponent - 2; ceil: one more when the 7-bit fraction exceeds 1.5; clamped at -127).
__device__ __forceinline__ int block_exponent(uint32_t amax_bits, MxScaleMode mode) {
  const int biased = static_cast<int>(amax_bits >> 7);
  if (biased == 0) return mx_scale_exponent(bf16_bits_to_f32(static_cast<uint16_t>(amax_bits)), mode);
  const int up = (mode == MxScaleMode::ceil && (amax_bits & 0x7Fu) > 0x40u) ? 1 : 0;
  return max(biased - kUE8M0Bias - 2 + up, -127);
}

// The sign bits of a chunk's 8 BF16 elements where its codes hold them: element i's (bit 15 of the low or the high
// half of word i / 2) in bit 4 i + 3. Four byte permutations gather the bytes holding the signs (bit 7 of each):
// the even elements' (shifted down to bit 3) and the odd elements' in byte order.
__device__ __forceinline__ uint32_t chunk_sign_bits(const uint4& v) {
  const uint32_t lo = __byte_perm(v.x, v.y, 0x7531);        // high bytes of elements 0, 1, 2, 3
  const uint32_t hi = __byte_perm(v.z, v.w, 0x7531);        // of elements 4, 5, 6, 7
  const uint32_t even = __byte_perm(lo, hi, 0x6420) >> 4;   // elements 0, 2, 4, 6: sign in bit 3 of each byte
  const uint32_t odd = __byte_perm(lo, hi, 0x7531);         // elements 1, 3, 5, 7: sign in bit 7 of each byte
  return (even & 0x08080808u) | (odd & 0x80808080u);
}

// 2^-e for a block exponent e in [-127, 126] (block_exponent: a finite BF16 amax gives e <= 126), a normal FP32
// built from its exponent field alone (exp2_exact without its subnormal case).
__device__ __forceinline__ float inv_block_scale(int e) {
  return __uint_as_float(static_cast<uint32_t>(127 - e) << 23);
}

// RNE: two elements per BF16x2 instruction (mx_fast_codecs.h e2m1_pair_rne_bf16x2): half the instructions of an
// fp32 encoder (one fp32 product and one rounding per element), which it replaced when timed faster (bench_quant).
// Encode 8 BF16 (one chunk) of a finite block with RNE: element i's code in bits 4i..4i+3. Each pair's codes come
// times 2^12 (e2m1_pair_magnitude_x4096_rne_bf16x2: element 2i's in the high nibble of byte 1 of word i, element
// 2i+1's in that of byte 3, right below their BF16 sign bits, which one masked OR per word adds); four byte
// permutations gather the even and the odd elements' nibbles, and one shift-add packs them. e: the block exponent,
// in [-127, 126].
__device__ __forceinline__ uint32_t encode_chunk_rne(const uint4& v, int e) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  const uint4 mag = chunk_magnitudes(v);
  const uint32_t m[4] = {mag.x, mag.y, mag.z, mag.w};
  // 2^-e in both BF16 halves (a BF16 normal for e in [-127, 126]: exponent field 127 - e in [1, 254]).
  const __nv_bfloat162 inv2 = bf162_from_bits((static_cast<uint32_t>(127 - e) << 7) * 0x00010001u);
  uint32_t c[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) c[i] = e2m1_pair_magnitude_x4096_rne_bf16x2(m[i], inv2) | (w[i] & 0x80008000u);
  const uint32_t p01 = __byte_perm(c[0], c[1], 0x7351);  // high nibbles: elements 0, 2, 1, 3
  const uint32_t p23 = __byte_perm(c[2], c[3], 0x7351);  // 4, 6, 5, 7
  const uint32_t even = __byte_perm(p01, p23, 0x5410);   // 0, 2, 4, 6 (low nibbles 0)
  const uint32_t odd = __byte_perm(p01, p23, 0x7632);    // 1, 3, 5, 7 (low nibbles 0)
  return (odd & 0xF0F0F0F0u) + (even >> 4);              // byte j: element 2j low nibble, 2j + 1 high
}

// One butterfly stage across lanes `kLaneXor` apart: the lower lane holds a = y_j, the upper b = y_{j+h}; the
// lower keeps a + b, the upper a - b (mx_transform.h). Both as one sum, other + (+-own): IEEE addition commutes
// and a - b is a + (-b), so the bits are those of the rule, without a branch per element. The sum is one fused
// multiply-add fma(own, +-1, other): the product by +-1 is exact (zeros, infinities and NaN included), so its
// single rounding is that of the addition; one instruction per element instead of a sign flip and an addition.
template <int kLaneXor>
__device__ __forceinline__ void butterfly_across_lanes(float (&y)[kMxChunk]) {
  const float own_sign = (threadIdx.x & kLaneXor) != 0 ? -1.0f : 1.0f;
#pragma unroll
  for (int i = 0; i < kMxChunk; ++i) {
    const float other = __shfl_xor_sync(0xFFFFFFFFu, y[i], kLaneXor);
    y[i] = __fmaf_rn(y[i], own_sign, other);
  }
}

// The 8 BF16 of a chunk in FP32 (exact).
__device__ __forceinline__ void unpack_chunk(const uint4& v, float (&y)[kMxChunk]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < kMxChunk; ++i)
    y[i] = __uint_as_float((i & 1) ? (w[i / 2] & 0xFFFF0000u) : (w[i / 2] << 16));
}

// T(x) on the chunk's 8 BF16 elements (mx_transform.h) in FP32, the chunk starting at position k0 along the
// reduction dimension (rht: its signs s_k0 .. s_k0+7; k0 % 8 == 0), rounded back to BF16 (RNE, as
// f32_to_bf16_bits). Every lane runs it (shuffles).
template <HadamardTransform kTransform>
__device__ __forceinline__ uint4 transform_chunk(const uint4& v, uint32_t k0, uint64_t rht_seed) {
  float y[kMxChunk];
  unpack_chunk(v, y);
  if constexpr (kTransform == HadamardTransform::rht) {
    const uint32_t signs = rht_sign_bits8(rht_seed, k0);
#pragma unroll
    for (int i = 0; i < kMxChunk; ++i) y[i] = __uint_as_float(__float_as_uint(y[i]) ^ (((signs >> i) & 1u) << 31));
  }
#pragma unroll
  for (int h = 1; h < kMxChunk; h *= 2)
#pragma unroll
    for (int i = 0; i < kMxChunk; i += 2 * h)
#pragma unroll
      for (int j = i; j < i + h; ++j) {
        const float a = y[j], b = y[j + h];
        y[j] = __fadd_rn(a, b);
        y[j + h] = __fsub_rn(a, b);
      }
  butterfly_across_lanes<1>(y);  // h = 8
  constexpr int n = hadamard_block_size(kTransform);
  if constexpr (n == 32) butterfly_across_lanes<2>(y);  // h = 16
  const float c = hadamard_scale(n);
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    w[i] = bits_of_bf162(__floats2bfloat162_rn(__fmul_rn(y[2 * i], c), __fmul_rn(y[2 * i + 1], c)));
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// The 8 random bits of stochastic rounding of a chunk's 8 elements: element i's are byte i % 4 of word[i / 4]. When
// the 8 flat indices are consecutive and the first is a multiple of 8 (the row quantizer), the words are the low and
// high halves of mx_sr_hash64(seed, first / 8), as mx_sr_bits8 packs them; the column quantizers gather each word
// from four rows' hashes.
struct ChunkDraws {
  uint32_t word[2];
};

// The 64 bits of mx_sr_hash64, computed once: the empty asm hides them from the compiler, which would otherwise
// recompute the hash for each slice taken from it (narrowing each use to the bits it needs).
__device__ __forceinline__ uint64_t sr_hash_once(uint64_t counter) {
  uint64_t h = mx_sr_mix(counter);
  asm("" : "+l"(h));
  return h;
}

// The ChunkDraws of a chunk whose first flat index is 8 n (hash n).
__device__ __forceinline__ ChunkDraws chunk_draws(uint64_t seed, uint64_t n) {
  const uint64_t h = sr_hash_once(mx_sr_counter(seed, n));
  return ChunkDraws{{static_cast<uint32_t>(h), static_cast<uint32_t>(h >> 32)}};
}

// ~w & mask as one PTX and.b32 (one LOP3), so that the compiler keeps the mask before the shift that follows and
// folds that shift into the next addition (LEA, LEA.HI) rather than shifting first and masking after.
template <uint32_t kMask>
__device__ __forceinline__ uint32_t masked_complement(uint32_t w) {
  uint32_t r;
  asm("and.b32 %0, %1, %2;" : "=r"(r) : "r"(~w), "n"(kMask));
  return r;
}

// e2m1_sr_offset of the draw in byte kByte of a 32-bit word w holding four draws: that byte's complement moved to
// bits 14..21.
template <int kByte>
__device__ __forceinline__ uint32_t sr_draw_offset(uint32_t w) {
  static_assert(kByte >= 0 && kByte < 4, "a byte of a 32-bit word");
  constexpr int kShift = 14 - 8 * kByte;
  const uint32_t m = masked_complement<(0xFFu << (8 * kByte))>(w);
  return kShift >= 0 ? m << (kShift >= 0 ? kShift : 0) : m >> (kShift < 0 ? -kShift : 0);
}

// The offsets of the four draws of a word, byte j's in o[j].
__device__ __forceinline__ void sr_draw_offsets(uint32_t w, uint32_t (&o)[4]) {
  o[0] = sr_draw_offset<0>(w);
  o[1] = sr_draw_offset<1>(w);
  o[2] = sr_draw_offset<2>(w);
  o[3] = sr_draw_offset<3>(w);
}

// The E2M1 magnitude code (0..7) of y * inv_scale under stochastic rounding with a draw's offset (sr_draw_offset).
__device__ __forceinline__ uint32_t sr_magnitude_code(float y, float inv_scale, uint32_t offset) {
  return e2m1_sr_step(e2m1_sr_fixed(fminf(fabsf(__fmul_rn(y, inv_scale)), 6.0f)), offset);
}

// Stochastic rounding of 8 BF16 (one chunk) of a finite block with inv_scale = 2^-e: element i's code in bits
// 4i..4i+3, the sign of v kept (-0 included). The product is an exact power-of-two scaling (rounded only below
// 2^-126), clamped at 6 (E2M1's largest). Per element (mx_fast_codecs.h e2m1_sr_fixed, e2m1_sr_step): the product,
// the minimum, a sum rounded up, one maximum with a fused addition (sm_90 DPX), the draw's offset (a mask, its
// shift folded into the addition that follows), one shift and one shift-add into the chunk's word; the signs
// gathered apart.
__device__ __forceinline__ uint32_t encode_chunk_stochastic(const uint4& v, float inv_scale, const ChunkDraws& d) {
  float y[kMxChunk];
  unpack_chunk(v, y);
  uint32_t offset[2][4];  // element i's draw offset in offset[i / 4][i % 4]
  sr_draw_offsets(d.word[0], offset[0]);
  sr_draw_offsets(d.word[1], offset[1]);
  // Horner's rule from the last element: codes = 16 codes + code_i, one multiply-add (LEA) per element after the
  // code's shift, pinned in PTX (left to itself the compiler masks each shifted code and sums pairs: 2.5 per element).
  uint32_t codes = 0;
#pragma unroll
  for (int i = kMxChunk - 1; i >= 0; --i) {
    const uint32_t code = sr_magnitude_code(y[i], inv_scale, offset[i / 4][i % 4]);
    asm("mad.lo.u32 %0, %0, 16, %1;" : "+r"(codes) : "r"(code));
  }
  return codes | chunk_sign_bits(v);
}

// Smallest block exponent encode_chunk_stochastic_bf16x2 takes: 2^(16 - e) must be a BF16 normal (e <= 126 holds
// for every finite block, block_exponent).
constexpr int kSrBf16x2MinExponent = -111;

// 2^(16 - e) in both BF16 halves, for a block exponent e in [kSrBf16x2MinExponent, 126] (exponent field 143 - e
// in [17, 254]).
__device__ __forceinline__ __nv_bfloat162 sr_bf16x2_scale(int e) {
  return bf162_from_bits((static_cast<uint32_t>(143 - e) << 7) * 0x00010001u);
}

// encode_chunk_stochastic with the same bits, the magnitudes scaled two at a time: min(|v| 2^(16 - e), 6 2^16)
// in BF16x2 (one product and one minimum per pair instead of an FP32 product and minimum per element), each half
// moved to FP32 by a shift or a mask, then e2m1_sr_fixed_x65536 (mx_fast_codecs.h: why the factor 2^16 keeps the
// bits, products that vanish or turn subnormal included). inv2_x65536 = sr_bf16x2_scale(e), e the block exponent
// in [kSrBf16x2MinExponent, 126] of a finite block (so |v| 2^-e < 8: the products are finite and exact above
// 2^-126 2^-16). Rounding and draws as encode_chunk_stochastic.
__device__ __forceinline__ uint32_t encode_chunk_stochastic_bf16x2(const uint4& v, __nv_bfloat162 inv2_x65536,
                                                                   const ChunkDraws& d) {
  constexpr uint32_t kSixes = 0x48C048C0u;  // 6 2^16 in both halves
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  uint32_t offset[2][4];  // element i's draw offset in offset[i / 4][i % 4]
  sr_draw_offsets(d.word[0], offset[0]);
  sr_draw_offsets(d.word[1], offset[1]);
  uint32_t codes = 0;  // Horner's rule from the last element, as encode_chunk_stochastic; a pair at a time
#pragma unroll
  for (int i = 3; i >= 0; --i) {
    const uint32_t m = bits_of_bf162(
        __hmin2(__hmul2_rn(bf162_from_bits(w[i] & 0x7FFF7FFFu), inv2_x65536), bf162_from_bits(kSixes)));
    const uint32_t hi = e2m1_sr_step(e2m1_sr_fixed_x65536(__uint_as_float(m & 0xFFFF0000u)),
                                     offset[(2 * i + 1) / 4][(2 * i + 1) % 4]);
    asm("mad.lo.u32 %0, %0, 16, %1;" : "+r"(codes) : "r"(hi));
    const uint32_t lo = e2m1_sr_step(e2m1_sr_fixed_x65536(__uint_as_float(m << 16)), offset[(2 * i) / 4][(2 * i) % 4]);
    asm("mad.lo.u32 %0, %0, 16, %1;" : "+r"(codes) : "r"(lo));
  }
  return codes | chunk_sign_bits(v);
}

// The largest of a value over the four lanes of an MX block.
__device__ __forceinline__ uint32_t block_max(uint32_t v) {
  v = max(v, __shfl_xor_sync(0xFFFFFFFFu, v, 1));
  return max(v, __shfl_xor_sync(0xFFFFFFFFu, v, 2));
}

// One chunk's share of its MX block: the 8 codes (element i in bits 4i..4i+3) and the block's scale byte.
struct ChunkCodes {
  uint32_t packed;
  uint8_t scale;
  bool nonfinite;  // the block holds a NaN or Inf (scale 0xFF, codes 0)
};

// The MXFP4 rule of bf16_to_mxfp4_row.h on one chunk v of BF16 elements at position k0 of the reduction dimension
// (rht signs), every lane of the warp calling it. draws() gives the chunk's ChunkDraws; it is called for
// stochastic rounding of a finite nonzero block only.
template <Rounding kRounding, HadamardTransform kTransform, typename Draws>
__device__ __forceinline__ ChunkCodes quantize_chunk(uint4 v, uint32_t k0, uint64_t rht_seed, MxScaleMode mode,
                                                     Draws&& draws) {
  if constexpr (kTransform != HadamardTransform::none) v = transform_chunk<kTransform>(v, k0, rht_seed);
  const uint32_t amax_bits = block_max(chunk_amax_bits(v));
  ChunkCodes out{0, 0, amax_bits >= kBf16AbsNonFinite};  // NaN/Inf block and all-zero block: codes 0
  if (out.nonfinite) {
    out.scale = kUE8M0NaN;
  } else if (amax_bits != 0) {
    const int e = block_exponent(amax_bits, mode);
    out.scale = static_cast<uint8_t>(e + kUE8M0Bias);
    if constexpr (kRounding == Rounding::rne)
      out.packed = encode_chunk_rne(v, e);
    else
      out.packed = encode_chunk_stochastic(v, inv_block_scale(e), draws());
  }
  return out;
}

// One butterfly stage h of mx_transform.h over the 32 values of an MX block held by one thread (pairs (j, j + h),
// j % 2h < h), a template so that every index is a constant: the block stays in registers (as nested loops over h
// it was placed in local memory, the stages not unrolled).
template <int h>
__device__ __forceinline__ void butterfly_stage(float (&y)[kMxBlock]) {
#pragma unroll
  for (int p = 0; p < kMxBlock / 2; ++p) {
    const int j = (p / h) * 2 * h + p % h;
    const float a = y[j], b = y[j + h];
    y[j] = __fadd_rn(a, b);
    y[j + h] = __fsub_rn(a, b);
  }
}

// The butterfly stages of kTransform (h16, rht: h = 1, 2, 4, 8 on each half; h32: h = 1 .. 16) over one MX block
// held by one thread, without the scale.
template <HadamardTransform kTransform>
__device__ __forceinline__ void block_butterflies(float (&y)[kMxBlock]) {
  butterfly_stage<1>(y);
  butterfly_stage<2>(y);
  butterfly_stage<4>(y);
  butterfly_stage<8>(y);
  if constexpr (hadamard_block_size(kTransform) == 32) butterfly_stage<16>(y);
}

// rht's sign flips on the BF16 words of one MX block held by one thread in the row layout (word i of chunk j holds
// elements 8 j + 2 i and 8 j + 2 i + 1 in its low and high halves), signs = rht_sign_bits32 of the block: the sign
// of element 2 m + 1 moved 15 places up beside that of element 2 m (per half of the block), so that one shift and
// one masked XOR flip both halves of word m (exact, as the FP32 flips of mx_transform.h). The shift by
// s = 15 - 2 (m % 8) is a product by 3 * 2^(s - 1) = 2^s + 2^(s - 1): the sign words hold bits at even positions
// only, so the two shifted copies (odd and even positions) never overlap or carry, and bits 15 and 31 are those of
// the shift. An integer multiply runs on the FMA pipe, where a shift would take the integer/logic pipe (the one
// that bounds the quantizers with a transform); a power of two alone would become a shift again.
__device__ __forceinline__ void flip_block_signs(uint4 (&v)[4], uint32_t signs) {
  // Word m < 8 (elements 0..15): bit 2 m = s_2m, bit 2 m + 16 = s_2m+1; word m >= 8 likewise from elements 16..31.
  const uint32_t lo = (signs & 0x5555u) | ((signs & 0xAAAAu) << 15);
  const uint32_t hi = ((signs >> 16) & 0x5555u) | (((signs >> 16) & 0xAAAAu) << 15);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t w[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int m = 4 * j + i;  // elements 2 m, 2 m + 1
      const uint32_t spread = (m < 8 ? lo : hi) * (3u << (14 - 2 * (m % 8)));
      // w ^ (spread & 0x80008000) as one LOP3 (left to itself, the compiler masks and XORs apart).
      asm("lop3.b32 %0, %0, %1, %2, 0x78;" : "+r"(w[i]) : "r"(spread), "n"(0x80008000u));
    }
    v[j] = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// Adds to `counted` (per lane; the caller sums lane 0's) the warp's NaN/Inf blocks among chunks that are `in`:
// counted once per block, by the lane with lane & 3 == 0.
__device__ __forceinline__ void count_nonfinite_blocks(bool in, bool nonfinite, unsigned long long& counted) {
  const unsigned ballot = __ballot_sync(0xFFFFFFFFu, in && nonfinite && (threadIdx.x & 3) == 0);
  counted += static_cast<unsigned long long>(__popc(ballot));
}

}  // namespace fp4moe::detail
