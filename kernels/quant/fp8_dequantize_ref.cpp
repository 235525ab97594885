// Host dequantization of the three FP8 layouts (bf16_to_fp8.h, layouts.h): value = e4m3(code) * scale.
#include <cstdint>

#include "kernels/common/check.h"
#include "kernels/common/offsets.h"
#include "kernels/formats/formats.h"
#include "kernels/quant/bf16_to_fp8.h"
#include "kernels/quant/fp8_col_groups.h"
#include "kernels/quant/fp8_shape_checks.h"
#include "kernels/quant/layouts.h"

namespace fp4moe {

void fp8_row_dequantize_ref(const uint8_t* codes, const float* scales, int64_t M, int64_t K, float* y) {
  const char* what = "fp8_row_dequantize_ref";
  detail::check_fp8_shape(what, "codes", "M", M, K, false);
  if (M == 0) return;
  FP4MOE_CHECK(codes != nullptr && scales != nullptr && y != nullptr, "{}: null pointer", what);
  for (int64_t r = 0; r < M; ++r)
    for (int64_t k = 0; k < K; ++k)
      y[r * K + k] = e4m3_to_f32(codes[r * K + k]) * scales[fp8_row_scale_index(r, k / kFp8Block, M)];
}

void fp8_col_dequantize_ref(const uint8_t* codes, const float* scales, int64_t M, int64_t K, const int32_t* offsets,
                            int64_t G, float* y) {
  const char* what = "fp8_col_dequantize_ref";
  detail::check_fp8_shape(what, "y", "M", M, K, false);
  validate_group_offsets(offsets, G, M, what);
  if (M == 0) return;
  FP4MOE_CHECK(codes != nullptr && scales != nullptr && y != nullptr, "{}: null pointer", what);
  for (const Fp8ColGroup& grp : fp8_col_groups(offsets, G, K))
    for (int64_t k = 0; k < K; ++k)
      for (int64_t t = 0; t < grp.rows; ++t)
        y[(grp.row0 + t) * K + k] = e4m3_to_f32(codes[grp.codes_offset + k * grp.ld + t]) *
                                    scales[grp.scales_offset + (t / kFp8Block) * K + k];
}

void fp8_block128_dequantize_ref(const uint8_t* codes, const float* scales, int64_t N, int64_t K, bool transpose,
                                 float* y) {
  const char* what = "fp8_block128_dequantize_ref";
  detail::check_fp8_shape(what, "w", "N", N, K, true);
  FP4MOE_CHECK(codes != nullptr && scales != nullptr && y != nullptr, "{}: null pointer", what);
  // transpose: codes and y are W^T [K, N], scales [ceil(K/128), round_up(ceil(N/128), 4)].
  const int64_t rows = transpose ? K : N, cols = transpose ? N : K, ld = fp8_block_scale_ld(cols);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      y[i * cols + j] = e4m3_to_f32(codes[i * cols + j]) * scales[(i / kFp8Block) * ld + j / kFp8Block];
}

}  // namespace fp4moe
