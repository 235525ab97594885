// Seeded MXFP4 test data shared by the CPU and GPU tests of the column quantizer and the MXFP4 GEMM.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/common/types.h"
#include "kernels/formats/formats.h"
#include "kernels/gemm/mxfp4_gemm.h"

namespace fp4moe::test {

// BF16 [M, K]: N(0, 1) values times 2^u per row (u uniform in [-20, 20]), one in sixteen an exact zero; with
// `nonfinite`, five NaN/Inf elements at seeded places.
inline std::vector<bf16> mx_random_bf16(int64_t M, int64_t K, uint32_t seed, bool nonfinite = false) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 20), zero(0, 15);
  std::vector<bf16> x(static_cast<size_t>(M * K));
  for (int64_t m = 0; m < M; ++m) {
    const float row_scale = std::ldexp(1.0f, exponent(rng));
    for (int64_t k = 0; k < K; ++k)
      x[m * K + k] = bf16_from_bits(zero(rng) == 0 ? 0 : f32_to_bf16_bits(normal(rng) * row_scale));
  }
  if (nonfinite && M * K > 0) {
    const uint16_t specials[] = {0x7FC0, 0xFFC1, 0x7F80, 0xFF80};  // NaN, -NaN, +Inf, -Inf
    for (int j = 0; j < 5; ++j) x[rng() % (M * K)] = bf16_from_bits(specials[j % 4]);
  }
  return x;
}

// The edges of the folded 1/4 of h16 and rht under RNE (bf16_to_mxfp4_row.cu mx_h16_fold_exact) and of the BF16x2
// scaling of stochastic rounding, as MX blocks of 32 elements: two 16-element halves, each zero but for its first
// two elements (a, b), so that every transformed value of a half is +-(a + b) or +-(a - b) (rht: with its signs).
// The big half's pairs put the block amax at and around the bounds of the folded path (2^-100, 2^126), in the
// window where an FP32 sum rounds to a BF16 Inf but its quarter does not (2^128 - 2^119), at the largest BF16, at
// NaN/Inf, at 0, and at BF16 subnormals; the tiny half's pairs (+-2^-133, +-2^-132, 3 2^-133, 2^-126, 2^-123 and
// their sums) have quarters that round to 0 or to other subnormals than bf16(y) / 4. Every big pair with every tiny
// pair, the tiny half first and second: 384 blocks, element i of block n at blocks[32 n + i].
inline std::vector<bf16> mx_fold_edge_blocks() {
  const uint16_t big[][2] = {
      {0x3F80, 0x0000}, {0x3F80, 0x3F00},  // 1; 1 and 0.5
      {0x0D80, 0x0000}, {0x0D7F, 0x0000},  // 2^-100 and the BF16 below it
      {0x0D00, 0x0D00}, {0x0CFF, 0x0CFF},  // a + b at 2^-100 (and just under), a - b = 0
      {0x7E80, 0x0000}, {0x7E7F, 0x0000},  // 2^126 and the BF16 below it
      {0x7E00, 0x7E00}, {0x7DFF, 0x7E00},  // a + b = 2^126; just under it (FP32 sum, BF16 round up)
      {0x7F7F, 0x7B00}, {0x7F7F, 0x7A80},  // 2^128 - 2^120 + 2^119 (FP32 finite, BF16 Inf; its quarter finite)
      {0x7F7F, 0x0000}, {0x7F7F, 0x7F7F},  // largest BF16; its double (FP32 Inf)
      {0x7F80, 0x0000}, {0x7FC0, 0x3F80},  // Inf; NaN
      {0x0000, 0x8000}, {0x0001, 0x0000},  // +0, -0; 2^-133
      {0x0003, 0x0002}, {0x0080, 0x0001},  // subnormal sums; 2^-126 +- 2^-133
      {0x0200, 0x0000}, {0x0180, 0x0100},  // 2^-123; 2^-124 +- 2^-125
      {0x4040, 0x3DCC}, {0xC2F0, 0x4100},  // ordinary values, signs mixed
  };
  const uint16_t tiny[][2] = {{0x0000, 0x0000}, {0x0001, 0x0000}, {0x0002, 0x0000}, {0x0003, 0x0001},
                              {0x8001, 0x0002}, {0x0080, 0x0000}, {0x0200, 0x8001}, {0x0001, 0x0001}};
  std::vector<bf16> blocks;
  for (const auto& hi : big)
    for (const auto& lo : tiny)
      for (int swap = 0; swap < 2; ++swap) {  // the tiny half first or second
        bf16 block[32];
        for (auto& e : block) e = bf16_from_bits(0);
        const int h0 = swap ? 16 : 0, h1 = swap ? 0 : 16;
        block[h0] = bf16_from_bits(hi[0]);
        block[h0 + 1] = bf16_from_bits(hi[1]);
        block[h1] = bf16_from_bits(lo[0]);
        block[h1 + 1] = bf16_from_bits(lo[1]);
        blocks.insert(blocks.end(), block, block + 32);
      }
  return blocks;
}

// An MXFP4 row tensor [R, K] in host memory.
struct MxTensor {
  int64_t R, K;
  std::vector<uint8_t> codes, scales;
  MxTensor(int64_t rows, int64_t cols) : R(rows), K(cols), codes(rows * cols / 2), scales(rows * cols / 32) {}
  Mxfp4RowOperand op() const { return {codes.data(), scales.data()}; }
};

// Random codes (both signs, -0 included); block scale exponents uniform in [e_lo, e_hi] (so a spread of at most
// e_hi - e_lo within any 128-group); one block in eight all zero (scale byte 0, codes 0).
inline MxTensor random_mx(int64_t R, int64_t K, int e_lo, int e_hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> code(0, 15), e(e_lo, e_hi), zero(0, 7);
  MxTensor t(R, K);
  for (auto& c : t.codes) c = static_cast<uint8_t>(code(rng) | (code(rng) << 4));
  for (int64_t b = 0; b < R * K / 32; ++b) {
    if (zero(rng) == 0) {
      t.scales[b] = 0;
      for (int i = 0; i < 16; ++i) t.codes[b * 16 + i] = 0;
    } else {
      t.scales[b] = static_cast<uint8_t>(e(rng) + 127);
    }
  }
  return t;
}

}  // namespace fp4moe::test
