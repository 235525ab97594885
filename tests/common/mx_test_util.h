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
