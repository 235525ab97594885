// Transforms applied to a tensor along its reduction dimension before MXFP4 quantization (paper 2's ladder,
// ../shared/PAPER-NUMBERS.md P2; Tseng et al. 2025, "Training LLMs with MXFP4", for the random Hadamard transform
// with stochastic rounding). Applied to both operands of a GEMM along the same reduction dimension K, a transform
// T with T T^T = I leaves the exact product unchanged: (X T)(W T)^T = X W^T.
//
//   none  the identity.
//   h16   y = x H16 on every block of 16 consecutive elements along K (k = 16b .. 16b + 15).
//   h32   y = x H32 on every block of 32 (one MX block).
//   rht   random Hadamard transform: y = (x D) H16 per block of 16, D = diag(s_k), s_k = +-1 drawn from a seed
//         (rht_sign_bits8 below): the same signs for every row, fresh signs when the caller passes a new seed.
// H_n = W_n / sqrt(n), W_n the Walsh-Hadamard matrix in Sylvester order (W_1 = [1], W_2n = [[W_n, W_n],
// [W_n, -W_n]]; entry (i, j) = (-1)^popcount(i & j)): symmetric, W_n W_n^T = n I, H_n H_n^T = I, so the inverse
// of h16/h32 is the transform itself and rht's is y -> (y H16) D.
//
// In FP32, element by element (the CPU reference and the kernels compute the same bits): x (BF16, exact in FP32)
// times s_k (a sign flip, exact), then log2(n) butterfly stages h = 1, 2, 4, ... n/2 in this order, each replacing
// the pair (a, b) = (y_j, y_{j+h}), j in [i, i + h) for i a multiple of 2h, by (a + b, a - b) rounded to nearest
// even, then every element multiplied by hadamard_scale(n) (exact for 16: 1/4; for 32 the FP32 value nearest
// 1/sqrt(32)). A sum beyond the FP32 range is +-Inf (its MX block then holds a non-finite value). The MXFP4
// quantizer (bf16_to_mxfp4_row.h) rounds the result to BF16 before its block rule.
#pragma once

#include <cstdint>

#include "kernels/common/types.h"
#include "kernels/formats/formats.h"
#include "kernels/quant/mx_random.h"

namespace fp4moe {

enum class HadamardTransform : int { none = 0, h16 = 1, h32 = 2, rht = 3 };

// Largest K a random Hadamard transform accepts (column indices are 32-bit in the kernels).
constexpr int64_t kRhtMaxK = int64_t{1} << 30;

// Elements per transform block: 1 (none), 16 (h16, rht), 32 (h32).
FP4MOE_HD constexpr int hadamard_block_size(HadamardTransform t) {
  return t == HadamardTransform::h32 ? 32 : (t == HadamardTransform::none ? 1 : 16);
}

// 1/sqrt(n) in FP32 for n = 16 (exactly 0.25) and n = 32 (nearest FP32, 0x3E3504F3).
FP4MOE_HD constexpr float hadamard_scale(int n) { return n == 16 ? 0.25f : 0.17677669529663687f; }

// Random Hadamard signs of columns k0 .. k0 + 7 (k0 a multiple of 8): bit i set <=> s_{k0+i} = -1. s_k is bit
// (k mod 64) of splitmix64_at(rht_seed, k / 64) (mx_random.h).
FP4MOE_HD uint32_t rht_sign_bits8(uint64_t rht_seed, uint64_t k0) {
  return static_cast<uint32_t>(splitmix64_at(rht_seed, k0 / 64) >> (k0 % 64)) & 0xFFu;
}

// The signs of positions k0 .. k0 + 31 (k0 a multiple of 32: one MX block), the same rule: bit i set <=> s_{k0+i}
// = -1, i.e. the low or the high half of one hash (rht_sign_bits8 of each of its four chunks, side by side).
FP4MOE_HD uint32_t rht_sign_bits32(uint64_t rht_seed, uint64_t k0) {
  const uint64_t h = splitmix64_at(rht_seed, k0 / 64);
  return static_cast<uint32_t>((k0 & 32) != 0 ? h >> 32 : h);
}

// n mod d (d >= 1) given inverse = floor((2^32 - 1) / d): for n < 2^32 (every tensor of fewer than 2^32 MX blocks)
// the quotient q = floor(n inverse / 2^32) is floor(n / d) or one less (n/d - q < n/2^32 + 1 < 2), so n - q d needs
// at most one subtraction of d: a multiply-high, a multiply-add and a compare in place of a 64-bit remainder (the
// row quantizer's rht: a block's column, from its flat index). Larger n take the remainder.
FP4MOE_HD uint32_t mod_by_inverse(uint64_t n, uint32_t d, uint32_t inverse) {
  if ((n >> 32) != 0) return static_cast<uint32_t>(n % d);
  const uint32_t lo = static_cast<uint32_t>(n);
  const uint32_t r = lo - static_cast<uint32_t>((uint64_t{lo} * inverse) >> 32) * d;
  return r >= d ? r - d : r;
}

// CPU references, FP32, row-major [M, K] host arrays (y may alias x).
// y[m, :] = T(x[m, :]) along K (the rule above); the inverse maps T(x) back to x up to FP32 rounding.
// Rejects (fp4moe::Error): an unknown transform, M < 0, K <= 0, K not a multiple of the transform's block size,
// K > 2^30 for rht, and for M > 0 null pointers. M = 0 does nothing.
void mx_transform_rows_ref(const float* x, int64_t M, int64_t K, HadamardTransform t, uint64_t rht_seed, float* y);
void mx_transform_rows_inverse_ref(const float* x, int64_t M, int64_t K, HadamardTransform t, uint64_t rht_seed,
                                   float* y);
// The values the MXFP4 quantizer's block rule sees (bf16_to_mxfp4_row.h): v[m, :] = T(x[m, :]) in FP32 rounded to
// BF16 (RNE, f32_to_bf16_bits), held in FP32; x itself for none. x: BF16 [M, K] host, row-major; same rejections.
void mx_transform_rows_bf16_ref(const bf16* x, int64_t M, int64_t K, HadamardTransform t, uint64_t rht_seed,
                                float* v);

namespace detail {
// The argument checks of the transforms, shared by the references and the quantizer (`what` names the caller).
void check_mx_transform(const char* what, HadamardTransform t, int64_t K);
}  // namespace detail

}  // namespace fp4moe
