// CPU references of the BF16 -> FP8 quantizers (bf16_to_fp8.h): one block rule (quantize_block) applied over
// the three layouts of layouts.h, element by element with the formats.h encoder.
#include <algorithm>
#include <cstdint>

#include "kernels/common/check.h"
#include "kernels/common/offsets.h"
#include "kernels/formats/formats.h"
#include "kernels/quant/bf16_to_fp8.h"
#include "kernels/quant/fp8_block_scale.h"
#include "kernels/quant/fp8_col_groups.h"
#include "kernels/quant/fp8_shape_checks.h"
#include "kernels/quant/layouts.h"

namespace fp4moe {
namespace {

float to_f32(bf16 v) { return bf16_bits_to_f32(bf16_bits(v)); }

// One FP8 block of n elements: value(i) gives element i, code(i) is where its E4M3 code goes.
// Returns the block scale; `nonfinite` is set when the block holds NaN or Inf.
template <typename Value, typename Code>
float quantize_block(int64_t n, Fp8ScaleMode mode, Value value, Code code, bool& nonfinite) {
  float amax = 0.0f;
  nonfinite = false;
  for (int64_t i = 0; i < n; ++i) {
    float v = value(i);
    if (!f32_is_finite(v)) nonfinite = true;
    else amax = std::max(amax, v < 0 ? -v : v);
  }
  if (nonfinite) {
    for (int64_t i = 0; i < n; ++i) code(i) = kE4M3NaN;
    return f32_from_bits(kFp8NanScaleBits);
  }
  const Fp8BlockScale sc = fp8_block_scale(amax, mode);
  for (int64_t i = 0; i < n; ++i) code(i) = f32_to_e4m3_satfinite(value(i) * sc.multiplier);
  return sc.scale;
}

void check_mode(const char* what, Fp8ScaleMode mode) {
  FP4MOE_CHECK(mode == Fp8ScaleMode::pow2 || mode == Fp8ScaleMode::fp32, "{}: unknown scale mode {}", what,
               static_cast<int>(mode));
}

}  // namespace

int64_t bf16_to_fp8_row_ref(const bf16* x, int64_t M, int64_t K, Fp8ScaleMode mode, uint8_t* codes,
                            float* scales) {
  const char* what = "bf16_to_fp8_row_ref";
  detail::check_fp8_shape(what, "x", "M", M, K, false);
  check_mode(what, mode);
  if (M == 0) return 0;
  FP4MOE_CHECK(x != nullptr && codes != nullptr && scales != nullptr, "{}: null pointer (x, codes or scales)", what);
  const int64_t ld = fp8_row_scale_ld(M), blocks = ceil_div(K, kFp8Block);
  int64_t bad = 0;
  for (int64_t r = 0; r < ld; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      if (r >= M) {
        scales[fp8_row_scale_index(r, b, M)] = 1.0f;  // padding rows
        continue;
      }
      const int64_t k0 = b * kFp8Block, n = std::min<int64_t>(kFp8Block, K - k0);
      const bf16* src = x + r * K + k0;
      uint8_t* dst = codes + r * K + k0;
      bool nonfinite;
      scales[fp8_row_scale_index(r, b, M)] =
          quantize_block(n, mode, [&](int64_t i) { return to_f32(src[i]); }, [&](int64_t i) -> uint8_t& { return dst[i]; },
                         nonfinite);
      bad += nonfinite;
    }
  return bad;
}

int64_t bf16_to_fp8_col_ref(const bf16* x, int64_t M, int64_t K, const int32_t* offsets, int64_t G,
                            Fp8ScaleMode mode, uint8_t* codes, float* scales) {
  const char* what = "bf16_to_fp8_col_ref";
  detail::check_fp8_shape(what, "x", "M", M, K, false);
  check_mode(what, mode);
  validate_group_offsets(offsets, G, M, what);
  FP4MOE_CHECK(codes != nullptr && scales != nullptr, "{}: output pointers are null", what);
  FP4MOE_CHECK(M == 0 || x != nullptr, "{}: input pointer is null", what);
  int64_t bad = 0;
  for (const Fp8ColGroup& grp : fp8_col_groups(offsets, G, K))
    for (int64_t k = 0; k < K; ++k) {
      uint8_t* dst = codes + grp.codes_offset + k * grp.ld;
      for (int64_t b = 0; b < grp.token_blocks; ++b) {
        const int64_t t0 = b * kFp8Block, n = std::min<int64_t>(kFp8Block, grp.rows - t0);
        const bf16* src = x + (grp.row0 + t0) * K + k;
        bool nonfinite;
        scales[grp.scales_offset + b * K + k] = quantize_block(
            n, mode, [&](int64_t i) { return to_f32(src[i * K]); },
            [&](int64_t i) -> uint8_t& { return dst[t0 + i]; }, nonfinite);
        bad += nonfinite;
      }
      for (int64_t t = grp.rows; t < grp.ld; ++t) dst[t] = 0;  // zero padding columns
    }
  return bad;
}

int64_t bf16_to_fp8_block128_ref(const bf16* w, int64_t N, int64_t K, Fp8ScaleMode mode, bool transpose,
                                 uint8_t* codes, float* scales) {
  const char* what = "bf16_to_fp8_block128_ref";
  detail::check_fp8_shape(what, "w", "N", N, K, true);
  check_mode(what, mode);
  FP4MOE_CHECK(w != nullptr && codes != nullptr && scales != nullptr, "{}: null pointer (w, codes or scales)", what);
  const int64_t nbs = ceil_div(N, kFp8Block), kbs = ceil_div(K, kFp8Block);
  // Scale of block (nb, kb): [nb, kb] of a [nbs, round_up(kbs, 4)] matrix, or [kb, nb] of its transpose.
  const int64_t ld = transpose ? fp8_block_scale_ld(N) : fp8_block_scale_ld(K);
  const int64_t scale_rows = transpose ? kbs : nbs, scale_cols = transpose ? nbs : kbs;
  for (int64_t i = 0; i < scale_rows; ++i)
    for (int64_t j = scale_cols; j < ld; ++j) scales[i * ld + j] = 1.0f;  // padding entries
  int64_t bad = 0;
  for (int64_t nb = 0; nb < nbs; ++nb)
    for (int64_t kb = 0; kb < kbs; ++kb) {
      const int64_t n0 = nb * kFp8Block, k0 = kb * kFp8Block;
      const int64_t rows = std::min<int64_t>(kFp8Block, N - n0), cols = std::min<int64_t>(kFp8Block, K - k0);
      auto value = [&](int64_t i) { return to_f32(w[(n0 + i / cols) * K + k0 + i % cols]); };
      auto code = [&](int64_t i) -> uint8_t& {
        int64_t n = n0 + i / cols, k = k0 + i % cols;
        return transpose ? codes[k * N + n] : codes[n * K + k];
      };
      bool nonfinite;
      float s = quantize_block(rows * cols, mode, value, code, nonfinite);
      scales[transpose ? kb * ld + nb : nb * ld + kb] = s;
      bad += nonfinite;
    }
  return bad;
}

}  // namespace fp4moe
