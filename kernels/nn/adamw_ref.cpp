// CPU reference of the AdamW step and the global gradient norm (adamw.h), and the argument checks shared with the
// GPU launchers.
#include <cmath>
#include <limits>

#include "kernels/formats/formats.h"
#include "kernels/nn/adamw.h"
#include "kernels/nn/nn_checks.h"

namespace fp4moe {

namespace nn_detail {

template <typename Moment>
void check_adamw(const char* what, const AdamWTensorOf<Moment>& t, const AdamWConfig& cfg, bool device) {
  check_at_least(what, "n", t.n, 0);
  FP4MOE_CHECK(std::isfinite(cfg.lr) && cfg.lr >= 0, "{}: lr must be finite and >= 0, got {}", what, cfg.lr);
  FP4MOE_CHECK(cfg.beta1 >= 0 && cfg.beta1 < 1, "{}: beta1 must be in [0, 1), got {}", what, cfg.beta1);
  FP4MOE_CHECK(cfg.beta2 >= 0 && cfg.beta2 < 1, "{}: beta2 must be in [0, 1), got {}", what, cfg.beta2);
  FP4MOE_CHECK(std::isfinite(cfg.eps) && cfg.eps > 0, "{}: eps must be finite and > 0, got {}", what, cfg.eps);
  FP4MOE_CHECK(std::isfinite(cfg.weight_decay) && cfg.weight_decay >= 0,
               "{}: weight_decay must be finite and >= 0, got {}", what, cfg.weight_decay);
  check_at_least(what, "step", cfg.step, 1);
  if (t.n == 0) return;
  check_not_null(what, "master", t.master);
  check_not_null(what, "param", t.param);
  check_not_null(what, "grad", t.grad);
  check_not_null(what, "m", t.m);
  check_not_null(what, "v", t.v);
  if (device) {
    check_aligned(what, "master", t.master, 4);
    check_aligned(what, "param", t.param, 2);
    check_aligned(what, "grad", t.grad, 4);
    check_aligned(what, "m", t.m, sizeof(Moment));
    check_aligned(what, "v", t.v, sizeof(Moment));
  }
}

template void check_adamw<float>(const char*, const AdamWTensor&, const AdamWConfig&, bool);
template void check_adamw<bf16>(const char*, const AdamWTensorBf16Moments&, const AdamWConfig&, bool);

void check_grad_tensors(const char* what, const GradTensor* tensors, int count, float max_norm, bool device) {
  FP4MOE_CHECK(count >= 0, "{}: count must be >= 0, got {}", what, count);
  FP4MOE_CHECK(count == 0 || tensors != nullptr, "{}: tensors is null with count={}", what, count);
  FP4MOE_CHECK(max_norm > 0, "{}: max_norm must be > 0 (+Inf disables clipping), got {}", what, max_norm);
  for (int i = 0; i < count; ++i) {
    FP4MOE_CHECK(tensors[i].n >= 0, "{}: tensor {} has n={} (must be >= 0)", what, i, tensors[i].n);
    if (tensors[i].n == 0) continue;
    FP4MOE_CHECK(tensors[i].grad != nullptr, "{}: tensor {} (n={}) has a null grad", what, i, tensors[i].n);
    if (device)
      FP4MOE_CHECK(is_aligned(tensors[i].grad, 4), "{}: tensor {} grad must be 4-byte aligned", what, i);
  }
}

}  // namespace nn_detail

namespace {

// BF16 bits of a double rounded once to nearest even: first to FP32 rounding to odd (truncate, then set the last
// bit when inexact; FP32 keeps 16 more bits than BF16, so the second rounding cannot meet a false tie), then FP32 to
// BF16 nearest even.
uint16_t bf16_bits_rounded_once(double x) {
  float f = static_cast<float>(x);
  if (std::isnan(x)) return f32_to_bf16_bits(f);
  if (std::fabs(static_cast<double>(f)) > std::fabs(x)) f = std::nextafter(f, 0.0f);  // truncated toward zero
  if (static_cast<double>(f) != x) f = f32_from_bits(f32_bits(f) | 1u);
  return f32_to_bf16_bits(f);
}

// A moment's stored value: FP32, or BF16, each rounded once from the double (nearest even).
void store_moment(float& dst, double x) { dst = static_cast<float>(x); }
void store_moment(bf16& dst, double x) { dst = bf16_from_bits(bf16_bits_rounded_once(x)); }
double load_moment(float x) { return x; }
double load_moment(bf16 x) { return bf16_bits_to_f32(bf16_bits(x)); }

template <typename Moment>
void adamw_ref(const AdamWTensorOf<Moment>& t, const AdamWConfig& cfg, float grad_scale) {
  nn_detail::check_adamw("adamw_step_ref", t, cfg, /*device=*/false);
  const double b1 = cfg.beta1, b2 = cfg.beta2, lr = cfg.lr, wd = cfg.weight_decay, eps = cfg.eps;
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(cfg.step));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(cfg.step));
  for (int64_t i = 0; i < t.n; ++i) {
    const double g = static_cast<double>(t.grad[i]) * grad_scale;
    const double m = b1 * load_moment(t.m[i]) + (1.0 - b1) * g;
    const double v = b2 * load_moment(t.v[i]) + (1.0 - b2) * g * g;
    double w = t.master[i];
    w -= lr * wd * w;
    w -= (lr / bc1) * m / (std::sqrt(v) / std::sqrt(bc2) + eps);
    store_moment(t.m[i], m);
    store_moment(t.v[i], v);
    t.master[i] = static_cast<float>(w);
    t.param[i] = bf16_from_bits(f32_to_bf16_bits(t.master[i]));
  }
}

}  // namespace

const char* moment_dtype_name(MomentDtype d) { return d == MomentDtype::bf16 ? "bf16" : "fp32"; }
int64_t moment_dtype_bytes(MomentDtype d) { return d == MomentDtype::bf16 ? 2 : 4; }

void adamw_step_ref(const AdamWTensor& t, const AdamWConfig& cfg, float grad_scale) { adamw_ref(t, cfg, grad_scale); }
void adamw_step_ref(const AdamWTensorBf16Moments& t, const AdamWConfig& cfg, float grad_scale) {
  adamw_ref(t, cfg, grad_scale);
}

double grad_global_norm_ref(const GradTensor* tensors, int count) {
  nn_detail::check_grad_tensors("grad_global_norm_ref", tensors, count, 1.0f, /*device=*/false);
  double sum_sq = 0;
  for (int i = 0; i < count; ++i)
    for (int64_t k = 0; k < tensors[i].n; ++k) {
      const double g = tensors[i].grad[k];
      sum_sq += g * g;
    }
  return std::sqrt(sum_sq);
}

float grad_clip_scale(double norm, float max_norm) {
  if (!std::isfinite(norm)) return std::numeric_limits<float>::quiet_NaN();
  const double scale = static_cast<double>(max_norm) / (norm + 1e-6);
  return scale < 1.0 ? static_cast<float>(scale) : 1.0f;
}

}  // namespace fp4moe
