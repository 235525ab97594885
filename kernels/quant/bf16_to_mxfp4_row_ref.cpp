// CPU reference of BF16 -> MXFP4 row quantization (bf16_to_mxfp4_row.h), written element by element from the rule
// in DESIGN.md "Number formats" with the codecs of formats.h and the transforms of mx_transform_ref.cpp.
#include <vector>

#include "kernels/quant/bf16_to_mxfp4_row.h"
#include "kernels/quant/mx_random.h"
#include "kernels/quant/mx_row_checks.h"

namespace fp4moe {

namespace detail {
void check_mx_quant_config(const char* what, int64_t M, int64_t K, const MxQuantConfig& cfg) {
  check_mx_row_shape(what, M, K);
  check_mx_quant_options(what, cfg);
  check_mx_transform(what, cfg.transform, K);
}

void check_mx_quant_options(const char* what, const MxQuantConfig& cfg) {
  FP4MOE_CHECK(cfg.scale_mode == MxScaleMode::floor || cfg.scale_mode == MxScaleMode::ceil,
               "{}: unknown MX scale mode {}", what, static_cast<int>(cfg.scale_mode));
  FP4MOE_CHECK(cfg.rounding == Rounding::rne || cfg.rounding == Rounding::stochastic, "{}: unknown rounding {}",
               what, static_cast<int>(cfg.rounding));
  FP4MOE_CHECK(cfg.row_offset >= 0, "{}: row_offset must be >= 0, got {}", what, cfg.row_offset);
  check_mx_transform(what, cfg.transform, kMxBlock);  // the kind only: every block size divides 32
}

int64_t mx_quantize_values_ref(const float* v, int64_t L, uint64_t index_base, uint64_t index_stride,
                               uint8_t* codes, uint8_t* scales, const MxQuantConfig& cfg) {
  int64_t nonfinite = 0;
  for (int64_t b = 0; b < L / kMxBlock; ++b) {
    const float* w = v + b * kMxBlock;
    uint8_t* c = codes + b * kMxBlock / 2;
    uint8_t& scale = scales[b];
    float amax = 0.0f;
    bool finite = true;
    for (int i = 0; i < kMxBlock; ++i) {
      if (!f32_is_finite(w[i])) finite = false;
      const float a = w[i] < 0 ? -w[i] : w[i];
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
      const float scaled = w[i] * inv_scale;  // exact power-of-two product (rounded only below 2^-126)
      uint8_t code;
      if (cfg.rounding == Rounding::rne) {
        code = f32_to_e2m1_rne(scaled);
      } else {
        const uint64_t index = index_base + index_stride * static_cast<uint64_t>(b * kMxBlock + i);
        code = f32_to_e2m1_stochastic(scaled, mx_sr_uniform(cfg.seed, index));
      }
      c[i / 2] |= static_cast<uint8_t>(code << (4 * (i % 2)));
    }
  }
  return nonfinite;
}
}  // namespace detail

int64_t bf16_to_mxfp4_row_ref(const bf16* x, int64_t M, int64_t K, uint8_t* codes, uint8_t* scales,
                              const MxQuantConfig& cfg) {
  const char* what = "bf16_to_mxfp4_row_ref";
  detail::check_mx_quant_config(what, M, K, cfg);
  if (M == 0) return 0;
  detail::check_mx_host_pointer(what, "x", x);
  detail::check_mx_host_pointer(what, "codes", codes);
  detail::check_mx_host_pointer(what, "scales", scales);
  int64_t nonfinite = 0;
  std::vector<float> v(K);
  for (int64_t m = 0; m < M; ++m) {
    mx_transform_rows_bf16_ref(x + m * K, 1, K, cfg.transform, cfg.rht_seed, v.data());
    nonfinite += detail::mx_quantize_values_ref(v.data(), K, static_cast<uint64_t>(cfg.row_offset + m) * K, 1,
                                                codes + m * K / 2, scales + m * (K / kMxBlock), cfg);
  }
  return nonfinite;
}

}  // namespace fp4moe
