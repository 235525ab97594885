// CPU reference of MXFP4 -> BF16 dequantization (mxfp4_to_bf16.h): one exact fp32 product per element, then
// fp32 -> BF16 round to nearest even.
#include "kernels/quant/mxfp4_to_bf16.h"
#include "kernels/formats/formats.h"
#include "kernels/quant/mx_row_checks.h"

namespace fp4moe {

void mxfp4_to_bf16_ref(const uint8_t* codes, const uint8_t* scales, int64_t M, int64_t K, bf16* y) {
  const char* what = "mxfp4_to_bf16_ref";
  detail::check_mx_row_shape(what, M, K);
  if (M == 0) return;
  detail::check_mx_host_pointer(what, "codes", codes);
  detail::check_mx_host_pointer(what, "scales", scales);
  detail::check_mx_host_pointer(what, "y", y);

  constexpr uint16_t kBf16QuietNaN = 0x7FC0;
  for (int64_t i = 0; i < M * K; ++i) {
    const uint8_t scale = scales[i / kMxBlock];
    const uint8_t code = static_cast<uint8_t>((codes[i / 2] >> (4 * (i % 2))) & 0xF);
    const uint16_t bits = scale == kUE8M0NaN ? kBf16QuietNaN
                                             : f32_to_bf16_bits(e2m1_to_f32(code) * ue8m0_to_f32(scale));
    y[i] = bf16_from_bits(bits);
  }
}

}  // namespace fp4moe
