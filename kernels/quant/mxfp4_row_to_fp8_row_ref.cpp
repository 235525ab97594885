// CPU reference of the direct MXFP4 -> FP8 1x128 row conversion (mxfp4_row_to_fp8_row.h), element by element
// with e2m1_to_e4m3_shifted (formats.h).
#include "kernels/quant/mxfp4_row_to_fp8_row.h"
#include "kernels/formats/formats.h"
#include "kernels/quant/layouts.h"
#include "kernels/quant/mx_row_checks.h"

namespace fp4moe {

void mxfp4_row_to_fp8_row_ref(const uint8_t* in_codes, const uint8_t* in_scales, int64_t M, int64_t K,
                              uint8_t* out_codes, float* out_scales) {
  const char* what = "mxfp4_row_to_fp8_row_ref";
  detail::check_mx_row_shape(what, M, K);
  if (M == 0) return;
  detail::check_mx_host_pointer(what, "in_codes", in_codes);
  detail::check_mx_host_pointer(what, "in_scales", in_scales);
  detail::check_mx_host_pointer(what, "out_codes", out_codes);
  detail::check_mx_host_pointer(what, "out_scales", out_scales);

  const int64_t blocks_per_row = K / kMxBlock;
  const int64_t groups = ceil_div(K, kFp8Block);
  for (int64_t m = 0; m < M; ++m) {
    const uint8_t* row_scales = in_scales + m * blocks_per_row;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t k_begin = g * kFp8Block, k_end = k_begin + kFp8Block < K ? k_begin + kFp8Block : K;
      // E = the largest exponent among the group's non-NaN MX blocks; a group of NaN blocks only gets S = 1.
      bool any_finite = false;
      int E = 0;
      for (int64_t k = k_begin; k < k_end; k += kMxBlock) {
        const uint8_t sb = row_scales[k / kMxBlock];
        if (sb == kUE8M0NaN) continue;
        const int e = static_cast<int>(sb) - kUE8M0Bias;
        E = any_finite && E > e ? E : e;
        any_finite = true;
      }
      const int s = any_finite ? direct_group_scale_exponent(E) : 0;
      out_scales[fp8_row_scale_index(m, g, M)] = exp2_exact(s);
      for (int64_t k = k_begin; k < k_end; ++k) {
        const uint8_t sb = row_scales[k / kMxBlock];
        const int64_t i = m * K + k;
        const uint8_t code = static_cast<uint8_t>((in_codes[i / 2] >> (4 * (i % 2))) & 0xF);
        out_codes[i] = sb == kUE8M0NaN
                           ? kE4M3NaN
                           : e2m1_to_e4m3_shifted(code, static_cast<int>(sb) - kUE8M0Bias - s);
      }
    }
  }
  // Padding rows of the scale layout hold 1.0.
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t r = M; r < fp8_row_scale_ld(M); ++r) out_scales[fp8_row_scale_index(r, g, M)] = 1.0f;
}

}  // namespace fp4moe
