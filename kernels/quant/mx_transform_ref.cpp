// CPU references of the transforms of mx_transform.h, written from the rule stated there.
#include <vector>

#include "kernels/common/check.h"
#include "kernels/quant/mx_transform.h"

namespace fp4moe {

namespace detail {
void check_mx_transform(const char* what, HadamardTransform t, int64_t K) {
  FP4MOE_CHECK(t == HadamardTransform::none || t == HadamardTransform::h16 || t == HadamardTransform::h32 ||
                   t == HadamardTransform::rht,
               "{}: unknown transform {} (expected none, h16, h32 or rht)", what, static_cast<int>(t));
  const int n = hadamard_block_size(t);
  FP4MOE_CHECK(K > 0 && K % n == 0, "{}: K must be a positive multiple of {} (the transform's block), got K = {}",
               what, n, K);
  FP4MOE_CHECK(t != HadamardTransform::rht || K <= kRhtMaxK, "{}: rht takes K <= 2^30, got K = {}", what, K);
}
}  // namespace detail

namespace {

// The butterflies of W_n on y[0, n), stage by stage (h = 1, 2, ..., n/2), then the scale 1/sqrt(n).
void hadamard_block(float* y, int n) {
  for (int h = 1; h < n; h *= 2)
    for (int i = 0; i < n; i += 2 * h)
      for (int j = i; j < i + h; ++j) {
        const float a = y[j], b = y[j + h];
        y[j] = a + b;
        y[j + h] = a - b;
      }
  const float c = hadamard_scale(n);
  for (int j = 0; j < n; ++j) y[j] *= c;
}

// s_k applied to y[0, n), the columns k0 .. k0 + n - 1 (n a multiple of 8).
void apply_rht_signs(float* y, int n, uint64_t seed, uint64_t k0) {
  for (int i = 0; i < n; i += 8) {
    const uint32_t bits = rht_sign_bits8(seed, k0 + i);
    for (int j = 0; j < 8; ++j)
      if ((bits >> j) & 1u) y[i + j] = -y[i + j];
  }
}

void transform_rows(const char* what, const float* x, int64_t M, int64_t K, HadamardTransform t, uint64_t seed,
                    float* y, bool inverse) {
  detail::check_mx_transform(what, t, K);
  FP4MOE_CHECK(M >= 0, "{}: M must be >= 0, got {}", what, M);
  if (M == 0) return;
  FP4MOE_CHECK(x != nullptr && y != nullptr, "{}: x and y must not be null", what);
  const int n = hadamard_block_size(t);
  std::vector<float> block(n);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; k += n) {
      for (int j = 0; j < n; ++j) block[j] = x[m * K + k + j];
      if (t != HadamardTransform::none) {
        // Forward: signs, then H16. Inverse (H16 D)^T = D H16: H16, then signs.
        if (t == HadamardTransform::rht && !inverse) apply_rht_signs(block.data(), n, seed, k);
        hadamard_block(block.data(), n);
        if (t == HadamardTransform::rht && inverse) apply_rht_signs(block.data(), n, seed, k);
      }
      for (int j = 0; j < n; ++j) y[m * K + k + j] = block[j];
    }
}

}  // namespace

void mx_transform_rows_ref(const float* x, int64_t M, int64_t K, HadamardTransform t, uint64_t rht_seed, float* y) {
  transform_rows("mx_transform_rows_ref", x, M, K, t, rht_seed, y, false);
}

void mx_transform_rows_inverse_ref(const float* x, int64_t M, int64_t K, HadamardTransform t, uint64_t rht_seed,
                                   float* y) {
  transform_rows("mx_transform_rows_inverse_ref", x, M, K, t, rht_seed, y, true);
}

void mx_transform_rows_bf16_ref(const bf16* x, int64_t M, int64_t K, HadamardTransform t, uint64_t rht_seed,
                                float* v) {
  const char* what = "mx_transform_rows_bf16_ref";
  detail::check_mx_transform(what, t, K);
  FP4MOE_CHECK(M >= 0, "{}: M must be >= 0, got {}", what, M);
  if (M == 0) return;
  FP4MOE_CHECK(x != nullptr && v != nullptr, "{}: x and v must not be null", what);
  for (int64_t i = 0; i < M * K; ++i) v[i] = bf16_bits_to_f32(bf16_bits(x[i]));
  if (t == HadamardTransform::none) return;
  transform_rows(what, v, M, K, t, rht_seed, v, false);
  for (int64_t i = 0; i < M * K; ++i) v[i] = bf16_bits_to_f32(f32_to_bf16_bits(v[i]));
}

}  // namespace fp4moe
