// The block-per-thread kernel of the BF16 -> MXFP4 column quantizers (bf16_to_mxfp4_col.h,
// detail::MxColKernel::block_per_thread and block_staged): one thread quantizes 4 adjacent columns x 32 rows of X,
// one MX block of each of 4 rows of X^T, as the row quantizer's block-per-thread kernel does one block of a row: the
// block rule once per block, the transform in registers with constant indices, one stochastic-rounding hash per 8
// elements.
//
// Registers: row i of the thread's block is one 8-byte load, two 32-bit words, word i of column pair 0 (columns
// k0, k0 + 1 in its low and high halves) and of pair 1 (k0 + 2, k0 + 3). Every step works on a pair's words as
// they were loaded, without a transpose:
//   - amax: 16-bit maxima of the magnitudes over the 32 words (one three-input DPX maximum per two words) give both
//     columns' amax, one per half;
//   - RNE: e2m1_pair_magnitude_x4096_rne_bf16x2 with each half's own 2^-e (the two columns' scales in one BF16x2),
//     the codes right below their sign bits, packed by byte permutations (encode_col_block_rne);
//   - SR: the row quantizer's FP32 path per element; row i's hash mx_sr_hash64(seed, (m K + k0) / 8) holds the
//     draws of the 8 columns k0 - k0 % 8 .. + 7, the thread's 4 in one 32-bit half (one byte per column): the two
//     lanes holding those 8 columns share the hashes of their 32 rows, half each, by one shuffle per row pair;
//   - transforms: a pair's two columns unpacked to FP32 (2 x 32 values), the row kernel's butterflies along the
//     rows, rounded back into the pair's words; rht's sign of row i flips both halves of word i of both pairs (one
//     shift shared by the pairs and one masked XOR per word);
//   - SR codes: rows 2p and 2p + 1 of a pair make one word of four codes (byte 0: the first column's rows 2p,
//     2p + 1; byte 2: the second column's), the signs placed by one byte permutation that replicates each element's
//     sign bit over its byte and one masked OR, and one shift-add packs each column's two codes into its byte; four
//     byte permutations per 16 elements gather each column's bytes into its 16 bytes of codes.
// Thread block: 4 warps over a token block of 128 rows x 128 columns. Warp w holds rows 64 (w % 2) .. + 63 and
// columns 64 (w / 2) .. + 63; lane 2 c + b holds MX block b (rows 32 b .. 32 b + 31 of the warp's) of columns
// 4 c .. 4 c + 3. A load instruction of a warp reads 2 rows x 128 contiguous bytes; a store, 16 rows of X^T x 32
// contiguous bytes (the two lanes that hold one column), or with block_staged (StagedColOutput) 8 rows of X^T x 64
// bytes. Threads whose MX block lies past the token block's padded rows or whose columns lie past K do nothing.
// Grid: (column tiles, token-block slots over y and z), as the register-tile kernel's.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/formats/formats.h"
#include "kernels/quant/mx_col_device.cuh"
#include "kernels/quant/mx_fast_codecs.h"
#include "kernels/quant/mx_quant_device.cuh"
#include "kernels/quant/mx_random.h"
#include "kernels/quant/mx_transform.h"

namespace fp4moe::detail {

// Thread blocks of 4 warps, each over 128 rows x 128 columns: small blocks that start and end apart keep loads in
// flight while others compute.
constexpr int kColBlockThreads = 128;
constexpr int kColBlockTileCols = 128;  // columns of X per thread block
static_assert(kMxColTileRows == 2 * 64 && kColBlockTileCols == 2 * 64 && kColBlockThreads == 4 * 32,
              "4 warps of 64 rows x 64 columns");

// Blocks per SM the kernel is compiled for (__launch_bounds__): 5 (96 registers per thread) where the option fits
// in them with no more instructions (RNE alone, with h16 or with rht; ragged rht spills one word), else 4 (128
// registers: h32's 2 x 32 FP32 butterfly values and stochastic rounding's hashes spill at 96).
constexpr int col_block_min_blocks(Rounding r, HadamardTransform t) {
  return r == Rounding::rne && t != HadamardTransform::h32 ? 5 : 4;
}

// The 32 words of one column pair of an MX block (word i: row i; low half the pair's first column).
using PairWords = uint32_t[kMxBlock];

// Row i's 4 columns, row_bytes (2 K) per row past x0: its address one 32 x 32 -> 64-bit multiply-add from x0 (the
// empty asm keeps the compiler from turning the rows' addresses into a chain of 64-bit additions, two instructions
// per row). Read once: evict first.
__device__ __forceinline__ uint2 load_col_row(const bf16* x0, uint32_t row_bytes, int i) {
  asm("" : "+r"(row_bytes));
  const char* row = reinterpret_cast<const char*>(x0) + static_cast<uint64_t>(static_cast<uint32_t>(i)) * row_bytes;
  return __ldcs(reinterpret_cast<const uint2*>(row));
}

// Rows r0 .. r0 + 31 of 4 columns from x0 (row r0's first column; rows K elements apart, K < 2^21): `rows` of them
// exist (1..32), the rest are zeros. All 32 loads are issued before any is used.
__device__ __forceinline__ void load_col_block(const bf16* x0, uint32_t K, int rows, PairWords (&w)[2]) {
  const uint32_t row_bytes = K * static_cast<uint32_t>(sizeof(bf16));
  if (rows == kMxBlock) {
#pragma unroll
    for (int i = 0; i < kMxBlock; ++i) {
      const uint2 u = load_col_row(x0, row_bytes, i);
      w[0][i] = u.x;
      w[1][i] = u.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < kMxBlock; ++i) {
      const uint2 u = i < rows ? load_col_row(x0, row_bytes, i) : make_uint2(0, 0);
      w[0][i] = u.x;
      w[1][i] = u.y;
    }
  }
}

// rht: s_i of the block's row i (bit i of signs) flips both halves of word i of both pairs. Row i's sign is brought
// to bits 15 and 31 of one shifted word (bits 0..15 of signs doubled into both halves for rows 0..15, bits 16..31
// for rows 16..31).
__device__ __forceinline__ void flip_row_signs(PairWords (&w)[2], uint32_t signs) {
  const uint32_t lo = __byte_perm(signs, 0, 0x1010), hi = __byte_perm(signs, 0, 0x3232);
#pragma unroll
  for (int i = 0; i < kMxBlock; ++i) {
    const uint32_t m = (i < 16 ? lo << (15 - i) : hi << (31 - i)) & 0x80008000u;
    w[0][i] ^= m;
    w[1][i] ^= m;
  }
}

// T(x) along the rows of both columns of a pair (mx_transform.h, after rht's sign flips), in FP32, rounded back to
// BF16 (RNE) into the pair's words: the row quantizer's operations in the same order per element.
template <HadamardTransform kTransform>
__device__ __forceinline__ void transform_pair(PairWords& w) {
  float a[kMxBlock], b[kMxBlock];
#pragma unroll
  for (int i = 0; i < kMxBlock; ++i) {
    a[i] = __uint_as_float(w[i] << 16);
    b[i] = __uint_as_float(w[i] & 0xFFFF0000u);
  }
  block_butterflies<kTransform>(a);
  block_butterflies<kTransform>(b);
  const float c = hadamard_scale(hadamard_block_size(kTransform));
#pragma unroll
  for (int i = 0; i < kMxBlock; ++i)
    w[i] = bits_of_bf162(__floats2bfloat162_rn(__fmul_rn(a[i], c), __fmul_rn(b[i], c)));
}

// Both columns' amax as BF16 magnitude bits, the first column's in the low half.
__device__ __forceinline__ uint32_t pair_amax_bits(const PairWords& w) {
  uint32_t m0 = 0, m1 = 0;  // two chains for the latency
#pragma unroll
  for (int i = 0; i < kMxBlock; i += 4) {
    m0 = __vimax3_u16x2(m0, w[i] & 0x7FFF7FFFu, w[i + 1] & 0x7FFF7FFFu);
    m1 = __vimax3_u16x2(m1, w[i + 2] & 0x7FFF7FFFu, w[i + 3] & 0x7FFF7FFFu);
  }
  return __vmaxu2(m0, m1);
}

// The block rule's scale of one column's MX block from its amax bits (bf16_to_mxfp4_row.h).
struct ColBlockScale {
  int e;          // the block exponent when `regular`, else 0 (an all-zero block's codes come out 0, its signs
                  // masked; a NaN/Inf block's are replaced)
  uint8_t scale;  // UE8M0 byte: e + 127, 0 for an all-zero block, 0xFF for a NaN/Inf block
  bool regular;   // finite and nonzero: codes as the rule gives them
  bool nonfinite;
};

__device__ __forceinline__ ColBlockScale col_block_scale(uint32_t amax_bits, MxScaleMode mode) {
  ColBlockScale s;
  s.nonfinite = amax_bits >= kBf16AbsNonFinite;
  s.regular = !s.nonfinite && amax_bits != 0;
  s.e = s.regular ? block_exponent(amax_bits, mode) : 0;
  s.scale = s.nonfinite ? kUE8M0NaN : (s.regular ? static_cast<uint8_t>(s.e + kUE8M0Bias) : 0);
  return s;
}

// Each byte the sign of one element replicated over it: bytes 0, 1 the low halves' (first column) of words w0, w1
// (rows 2p, 2p + 1), bytes 2, 3 their high halves' (second column). PTX prmt: a selector nibble's bit 3 replicates
// the selected byte's sign bit (which __byte_perm does not offer).
__device__ __forceinline__ uint32_t row_pair_sign_bytes(uint32_t w0, uint32_t w1) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, 0xFBD9;" : "=r"(r) : "r"(w0), "r"(w1));
  return r;
}

// One word of a pair's codes for rows 2p and 2p + 1: c0, c1 their magnitude codes (the first column's in bits 0..2,
// the second's in bits 16..18), w0, w1 their BF16 words. Byte 0 of the result is the first column's code byte p
// (row 2p in the low nibble), byte 2 the second column's; bytes 1 and 3 are not used. sign_mask: 0x08 in bytes 0
// and 1 (first column), 2 and 3 (second column) where that column's block is regular (an all-zero block keeps no
// sign). No byte carries into the next: every byte of t is at most 0x0F.
__device__ __forceinline__ uint32_t pack_row_pair(uint32_t c0, uint32_t c1, uint32_t w0, uint32_t w1,
                                                  uint32_t sign_mask) {
  const uint32_t t = (c0 + (c1 << 8)) | (row_pair_sign_bytes(w0, w1) & sign_mask);
  return t + (t >> 4);
}

// Word q of each column's codes (rows 8q .. 8q + 7) from the pack_row_pair words of rows 8q .. 8q + 7.
__device__ __forceinline__ void gather_pair_codes(uint32_t y0, uint32_t y1, uint32_t y2, uint32_t y3, uint32_t& first,
                                                  uint32_t& second) {
  const uint32_t u = __byte_perm(y0, y1, 0x6240);  // bytes 0, 1: the first column's rows 8q .. 8q + 3
  const uint32_t v = __byte_perm(y2, y3, 0x6240);  // rows 8q + 4 .. 8q + 7
  first = __byte_perm(u, v, 0x5410);
  second = __byte_perm(u, v, 0x7632);
}

// sign_mask of pack_row_pair for the pair of columns 2q, 2q + 1.
__device__ __forceinline__ uint32_t pair_sign_mask(const ColBlockScale (&s)[4], int q) {
  return (s[2 * q].regular ? 0x00000808u : 0u) | (s[2 * q + 1].regular ? 0x08080000u : 0u);
}

// RNE codes of the 4 columns (codes[c][q]: column k0 + c's word q, rows 8q .. 8q + 7); a NaN/Inf block's codes are
// replaced later. Per word (one row, both columns of a pair): e2m1_pair_magnitude_x4096_rne_bf16x2 puts each
// column's magnitude code right below its BF16 sign bit (bits 12..14 and 28..30, the high nibbles of bytes 1 and
// 3), one masked OR adds the signs of regular blocks, so that byte 1 of word i holds the first column's code of row
// i in its high nibble and byte 3 the second column's. Per 4 rows, two byte permutations gather those bytes (rows
// 0 and 2, rows 1 and 3) and one shift and one masked merge pack each column's two rows per byte; per 8 rows, two
// more permutations give each column's word.
__device__ __forceinline__ void encode_col_block_rne(const PairWords (&w)[2], const ColBlockScale (&s)[4],
                                                     uint32_t (&codes)[4][4]) {
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    // 2^-e of both columns, BF16 normals for e in [-127, 126].
    const __nv_bfloat162 inv2 = bf162_from_bits((static_cast<uint32_t>(127 - s[2 * q].e) << 7) |
                                                (static_cast<uint32_t>(127 - s[2 * q + 1].e) << 23));
    // The sign bits kept: a regular block's (an all-zero block has none; a NaN/Inf block's codes are replaced).
    const uint32_t sign_mask = (s[2 * q].regular ? 0x00008000u : 0u) | (s[2 * q + 1].regular ? 0x80000000u : 0u);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t r[8];  // rows 8 j .. 8 j + 7: codes and signs in the high nibbles of bytes 1 and 3
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const uint32_t word = w[q][8 * j + i];
        r[i] = e2m1_pair_magnitude_x4096_rne_bf16x2(bf16x2_magnitude(word), inv2) | (word & sign_mask);
      }
      uint32_t t[2];  // rows 4h .. 4h + 3: bytes [first column rows 0|1, rows 2|3, second column rows 0|1, 2|3]
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t even = __byte_perm(r[4 * h], r[4 * h + 2], 0x7351);     // rows 0, 2 of each column
        const uint32_t odd = __byte_perm(r[4 * h + 1], r[4 * h + 3], 0x7351);  // rows 1, 3
        t[h] = (odd & 0xF0F0F0F0u) | ((even >> 4) & 0x0F0F0F0Fu);
      }
      codes[2 * q][j] = __byte_perm(t[0], t[1], 0x5410);
      codes[2 * q + 1][j] = __byte_perm(t[0], t[1], 0x7632);
    }
  }
}

// Stochastic-rounding codes of the 4 columns (k0 % 4 == 0). Row i's draws are the 32-bit half `half` = (k0 / 4) % 2
// of mx_sr_hash64(seed, n0 + i K / 8), n0 = (flat index of element (r0, k0)) / 8, column k0 + c byte c of that half
// (mx_sr_bits8). The lane 2 apart (lane ^ 2) holds the other 4 columns of the same 8 and the same rows, so it needs
// the same hashes: each lane of the pair computes those of the rows with i % 2 == half (`counter`: the counter of
// row `half`'s hash; `pair_step`: the counter's step over two rows) and hands the other half to its partner with one
// shuffle. `lanes`: the lanes running this (partners come in pairs).
__device__ __forceinline__ void encode_col_block_sr(const PairWords (&w)[2], const ColBlockScale (&s)[4],
                                                    uint64_t counter, uint64_t pair_step, uint32_t half,
                                                    unsigned lanes, uint32_t (&codes)[4][4]) {
  float inv[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) inv[c] = inv_block_scale(s[c].e);
  uint32_t y[2][kMxBlock / 2];  // [pair][row pair p]: pack_row_pair words
#pragma unroll
  for (int p = 0; p < kMxBlock / 2; ++p, counter += pair_step) {
    const uint64_t h = sr_hash_once(counter);  // the hash of row 2 p + half
    const uint32_t lo = static_cast<uint32_t>(h), hi = static_cast<uint32_t>(h >> 32);
    const uint32_t own = half != 0 ? hi : lo;
    const uint32_t other = __shfl_xor_sync(lanes, half != 0 ? lo : hi, 2);  // the partner's row's half
    const uint32_t draws[2] = {half != 0 ? other : own, half != 0 ? own : other};  // rows 2 p, 2 p + 1
    uint32_t c[2][2];  // [pair][row 2p + r]: magnitude codes, first column in bits 0..2, second in 16..18
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      uint32_t offset[4];  // column k0 + c's draw offset
      sr_draw_offsets(draws[r], offset);
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const uint32_t word = w[q][2 * p + r];
        const uint32_t first = sr_magnitude_code(__uint_as_float(word << 16), inv[2 * q], offset[2 * q]);
        const uint32_t second =
            sr_magnitude_code(__uint_as_float(word & 0xFFFF0000u), inv[2 * q + 1], offset[2 * q + 1]);
        c[q][r] = first | (second << 16);
      }
    }
#pragma unroll
    for (int q = 0; q < 2; ++q)
      y[q][p] = pack_row_pair(c[q][0], c[q][1], w[q][2 * p], w[q][2 * p + 1], pair_sign_mask(s, q));
  }
#pragma unroll
  for (int q = 0; q < 2; ++q)
#pragma unroll
    for (int j = 0; j < 4; ++j)
      gather_pair_codes(y[q][4 * j], y[q][4 * j + 1], y[q][4 * j + 2], y[q][4 * j + 3], codes[2 * q][j],
                        codes[2 * q + 1][j]);
}

// The outputs of one thread block (128 columns x 4 MX blocks of the token block) gathered in shared memory, then
// written by whole runs: each column's 64 code bytes (a row of X^T, 4 blocks of 16) by 4 adjacent lanes, 8 rows of
// X^T per store instruction, and its 4 scale bytes by one 4-byte store where they start on 4 bytes (else one store
// per byte). Without it (StagedColOutput<false>, which holds nothing) every thread stores its own 16 code bytes and
// scale byte per column: a store instruction writes 32 code bytes or 2 scale bytes into each sector it touches,
// and the L2 handles twice the write requests (Nsight Compute: reports/results/h200/quant-col-staged-20261203/).
// The block index of a column's 16-byte slot is XORed with (column / 4) % 4 so that the 8 lanes of a store phase
// meet at most two to a bank group when they put, none when they store (a column's 4 slots stay in its 64 bytes).
template <bool kStaged>
struct StagedColOutput {
  __device__ __forceinline__ void put(int, int, uint4, uint8_t) {}
};

template <>
struct StagedColOutput<true> {
  uint4 code[kColBlockTileCols * 4];  // [column][block ^ swizzle]
  uint32_t scale[kColBlockTileCols];  // [column]: byte b the scale of block b

  static __device__ __forceinline__ int slot(int col, int block) { return 4 * col + (block ^ ((col >> 2) & 3)); }

  // Column col's block `block` (both within the thread block's tile).
  __device__ __forceinline__ void put(int col, int block, uint4 codes, uint8_t s) {
    code[slot(col, block)] = codes;
    reinterpret_cast<uint8_t*>(scale)[4 * col + block] = s;
  }

  // Writes columns k_tile .. k_tile + cols - 1 (cols a multiple of 4), blocks 0 .. blocks - 1, of the token block.
  // After a barrier; every thread of the block calls it.
  __device__ __forceinline__ void store(const TokenBlock& tb, int64_t k_tile, int cols, int blocks,
                                        uint8_t* __restrict__ codes, uint8_t* __restrict__ scales) const {
    const int t = static_cast<int>(threadIdx.x);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int i = j * kColBlockThreads + t, col = i >> 2, block = i & 3;
      if (col < cols && block < blocks)
        reinterpret_cast<uint4*>(codes)[col_layout_offset(tb, k_tile + col, kMxBlock * block) / kMxBlock] =
            code[slot(col, block)];
    }
    static_assert(kColBlockThreads == kColBlockTileCols, "one thread per column for the scales");
    if (t < cols) {
      uint8_t* const dst = scales + col_layout_offset(tb, k_tile + t, 0) / kMxBlock;
      const uint32_t v = scale[t];
      if (blocks == 4 && (reinterpret_cast<uintptr_t>(dst) & 3) == 0) {
        *reinterpret_cast<uint32_t*>(dst) = v;
      } else {
        for (int b = 0; b < blocks; ++b) dst[b] = static_cast<uint8_t>(v >> (8 * b));
      }
    }
  }
};

// Quantizes the thread's MX block of 4 columns from its 32 rows (w, rows past the token block's zeros; consumed):
// the transform, the block rule per column, the codes (out[c]: column k0 + c's 16 bytes, zeros for a NaN/Inf
// block) and the scales (s). r0, k0: the block's first row within the token block and its first column. lanes: the
// lanes of the warp running this (stochastic rounding's partners, lane ^ 2, are in or out together). Returns the
// number of NaN/Inf blocks among the 4.
template <Rounding kRounding, HadamardTransform kTransform>
__device__ __forceinline__ unsigned quantize_col_block(PairWords (&w)[2], const MxColParams& p, const TokenBlock& tb,
                                                       int r0, int64_t k0, unsigned lanes, uint32_t (&out)[4][4],
                                                       ColBlockScale (&s)[4]) {
  if constexpr (kTransform != HadamardTransform::none) {
    if constexpr (kTransform == HadamardTransform::rht)
      flip_row_signs(w, rht_sign_bits32(p.rht_seed, static_cast<uint64_t>(tb.col0 + r0)));  // group position
    transform_pair<kTransform>(w[0]);
    transform_pair<kTransform>(w[1]);
  }
  const uint32_t amax0 = pair_amax_bits(w[0]), amax1 = pair_amax_bits(w[1]);
  s[0] = col_block_scale(amax0 & 0xFFFFu, p.mode);
  s[1] = col_block_scale(amax0 >> 16, p.mode);
  s[2] = col_block_scale(amax1 & 0xFFFFu, p.mode);
  s[3] = col_block_scale(amax1 >> 16, p.mode);
  if constexpr (kRounding == Rounding::rne) {
    encode_col_block_rne(w, s, out);
  } else {
    // Element (r0, k0) has flat index (row_offset + row0 + r0) K + k0, 4 half past a multiple of 8; row i is
    // K / 8 hashes on.
    const uint64_t first = (p.row_offset + static_cast<uint64_t>(tb.row0 + r0)) * static_cast<uint64_t>(p.K) +
                           static_cast<uint64_t>(k0);
    const uint32_t half = static_cast<uint32_t>(k0 >> 2) & 1u;
    const uint64_t row_hashes = static_cast<uint64_t>(p.K) / 8;
    encode_col_block_sr(w, s, mx_sr_counter(p.seed, first / 8 + half * row_hashes), 2 * row_hashes * kMxSrWeyl, half,
                        lanes, out);
  }
  const unsigned nonfinite = s[0].nonfinite + s[1].nonfinite + s[2].nonfinite + s[3].nonfinite;
  if (nonfinite != 0) {
#pragma unroll
    for (int c = 0; c < 4; ++c)
      if (s[c].nonfinite) out[c][0] = out[c][1] = out[c][2] = out[c][3] = 0;  // a NaN/Inf block: codes 0
  }
  return nonfinite;
}

// kStaged: the thread block's codes and scales go through shared memory (StagedColOutput) instead of each thread
// storing its own.
template <Rounding kRounding, HadamardTransform kTransform, bool kRagged, bool kStaged>
__global__ void __launch_bounds__(kColBlockThreads, col_block_min_blocks(kRounding, kTransform))
bf16_to_mxfp4_col_block_kernel(const bf16* __restrict__ x, MxColParams p, uint8_t* __restrict__ codes,
                               uint8_t* __restrict__ scales) {
  __shared__ StagedColOutput<kStaged> staged;
  TokenBlock tb;
  if (!find_col_token_block<kRagged, kColBlockThreads>(p, col_grid_slot(), tb)) return;  // the whole thread block
  // Warp w: rows 64 (w % 2) .. + 63 and columns 64 (w / 2) .. + 63 of the tile; lane 2 c + b: MX block b of those
  // rows (first row r0 within the token block), columns col .. col + 3 within the tile.
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) & 31;
  const int r0 = 64 * (warp & 1) + kMxBlock * (lane & 1), col = 64 * (warp >> 1) + 4 * (lane >> 1);
  const int64_t k_tile = int64_t{blockIdx.x} * kColBlockTileCols, k0 = k_tile + col;
  // K % 8 == 0: the 4 columns are all in or all out. r0 < padded rows: at least one of the block's rows exists.
  const bool in = k0 < p.K && r0 < padded_tile_rows(tb);
  unsigned nonfinite = 0;
  // The lanes with work: the stochastic-rounding partners (lane ^ 2) are in or out together.
  const unsigned lanes = kRounding == Rounding::stochastic ? __ballot_sync(0xFFFFFFFFu, in) : 0u;
  if (in) {
    PairWords w[2];
    load_col_block(x + (tb.row0 + r0) * p.K + k0, static_cast<uint32_t>(p.K), min(tb.rows - r0, kMxBlock), w);
    uint32_t out[4][4];  // column k0 + c's 16 code bytes
    ColBlockScale s[4];
    nonfinite = quantize_col_block<kRounding, kTransform>(w, p, tb, r0, k0, lanes, out, s);
    if constexpr (kStaged) {
      const int block = r0 / kMxBlock;  // the MX block within the token block
#pragma unroll
      for (int c = 0; c < 4; ++c)
        staged.put(col + c, block, make_uint4(out[c][0], out[c][1], out[c][2], out[c][3]), s[c].scale);
    } else {
      // Column k0 + c is c rows of X^T (ld elements: ld / 32 blocks of 16 code bytes and 1 scale byte) further.
      const int64_t e0 = col_layout_offset(tb, k0, r0);  // a multiple of 32
      uint4* const code0 = reinterpret_cast<uint4*>(codes) + e0 / kMxBlock;
      uint8_t* const scale0 = scales + e0 / kMxBlock;
      const uint32_t ld_blocks = static_cast<uint32_t>(tb.ld / kMxBlock);
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        code0[c * ld_blocks] = make_uint4(out[c][0], out[c][1], out[c][2], out[c][3]);
        scale0[c * ld_blocks] = s[c].scale;
      }
    }
  }
  if constexpr (kStaged) {
    __syncthreads();
    const int64_t cols = p.K - k_tile < kColBlockTileCols ? p.K - k_tile : kColBlockTileCols;
    staged.store(tb, k_tile, static_cast<int>(cols), padded_tile_rows(tb) / kMxBlock, codes, scales);
  }
  if (p.nonfinite_blocks != nullptr) {  // the warp's NaN/Inf blocks, one atomic
    const unsigned warp_total = __reduce_add_sync(0xFFFFFFFFu, nonfinite);
    if (lane == 0 && warp_total != 0) atomicAdd(p.nonfinite_blocks, static_cast<unsigned long long>(warp_total));
  }
}

}  // namespace fp4moe::detail
