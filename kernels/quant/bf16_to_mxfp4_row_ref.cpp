// CPU reference of BF16 -> MXFP4 row quantization (bf16_to_mxfp4_row.h), written element by element from the rule
// in DESIGN.md "Number formats" with the codecs of formats.h.
#include "kernels/quant/bf16_to_mxfp4_row.h"
#include "kernels/quant/mx_row_checks.h"

namespace fp4moe {

int64_t bf16_to_mxfp4_row_ref(const bf16* x, int64_t M, int64_t K, uint8_t* codes, uint8_t* scales,
                              const MxQuantConfig& cfg) {
  const char* what = "bf16_to_mxfp4_row_ref";
  detail::check_mx_row_shape(what, M, K);
  FP4MOE_CHECK(cfg.scale_mode == MxScaleMode::floor || cfg.scale_mode == MxScaleMode::ceil,
               "{}: unknown MX scale mode {}", what, static_cast<int>(cfg.scale_mode));
  FP4MOE_CHECK(cfg.rounding == Rounding::rne || cfg.rounding == Rounding::stochastic, "{}: unknown rounding {}",
               what, static_cast<int>(cfg.rounding));
  FP4MOE_CHECK(cfg.row_offset >= 0, "{}: row_offset must be >= 0, got {}", what, cfg.row_offset);
  if (M == 0) return 0;
  detail::check_mx_host_pointer(what, "x", x);
  detail::check_mx_host_pointer(what, "codes", codes);
  detail::check_mx_host_pointer(what, "scales", scales);

  int64_t nonfinite = 0;
  const int64_t blocks_per_row = K / kMxBlock;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t b = 0; b < blocks_per_row; ++b) {
      const bf16* v = x + m * K + b * kMxBlock;
      uint8_t* c = codes + (m * K + b * kMxBlock) / 2;
      uint8_t& scale = scales[m * blocks_per_row + b];
      float amax = 0.0f;
      bool finite = true;
      for (int i = 0; i < kMxBlock; ++i) {
        float f = bf16_bits_to_f32(bf16_bits(v[i]));
        if (!f32_is_finite(f)) finite = false;
        float a = f < 0 ? -f : f;
        if (a > amax) amax = a;
      }
      for (int i = 0; i < kMxBlock / 2; ++i) c[i] = 0;
      if (!finite) {  // NaN or +-Inf: the block decodes to NaN
        scale = kUE8M0NaN;
        ++nonfinite;
        continue;
      }
      if (amax == 0.0f) {  // all +-0: scale 2^-127, codes +0
        scale = 0;
        continue;
      }
      const int e = mx_scale_exponent(amax, cfg.scale_mode);
      scale = static_cast<uint8_t>(e + kUE8M0Bias);
      const float inv_scale = exp2_exact(-e);
      for (int i = 0; i < kMxBlock; ++i) {
        const float scaled = bf16_bits_to_f32(bf16_bits(v[i])) * inv_scale;  // exact power-of-two product
        uint8_t code;
        if (cfg.rounding == Rounding::rne) {
          code = f32_to_e2m1_rne(scaled);
        } else {
          const uint64_t index = static_cast<uint64_t>((cfg.row_offset + m) * K + b * kMxBlock + i);
          code = f32_to_e2m1_stochastic(scaled, uniform_from_counter(cfg.seed, index));
        }
        c[i / 2] |= static_cast<uint8_t>(code << (4 * (i % 2)));
      }
    }
  }
  return nonfinite;
}

}  // namespace fp4moe
