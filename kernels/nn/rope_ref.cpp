// CPU reference of decoupled RoPE (rope.h) and the argument checks shared with the GPU launchers.
#include <cmath>
#include <vector>

#include "kernels/formats/formats.h"
#include "kernels/nn/nn_checks.h"
#include "kernels/nn/rope.h"

namespace fp4moe {
namespace {

double to_f64(bf16 v) { return bf16_bits_to_f32(bf16_bits(v)); }
bf16 to_bf16(double v) { return bf16_from_bits(f32_to_bf16_bits(static_cast<float>(v))); }

int64_t position_of(const RopeConfig& cfg, int64_t T, int64_t t) {
  const int64_t period = cfg.seq_len > 0 ? cfg.seq_len : T;
  return cfg.position_offset + t % period;
}

// The FP32 angle of pair i at position p, as the kernel forms it.
float angle_of(int64_t p, float inv_freq) { return static_cast<float>(p) * inv_freq; }

}  // namespace

namespace nn_detail {

void check_rope_strides(const char* what, const char* name, int64_t token_stride, int64_t head_stride, int64_t H,
                        int64_t D) {
  FP4MOE_CHECK(token_stride % 2 == 0 && head_stride % 2 == 0,
               "{}: {} strides must be even (pairs are read together), got token_stride={} head_stride={}", what,
               name, token_stride, head_stride);
  FP4MOE_CHECK(head_stride >= D || H == 1, "{}: {}.head_stride={} is below D={} (heads would overlap)", what, name,
               head_stride, D);
  const int64_t row = H == 1 ? D : (H - 1) * head_stride + D;
  FP4MOE_CHECK(token_stride >= row, "{}: {}.token_stride={} is below the {} elements of one token's heads", what,
               name, token_stride, row);
}

void check_rope(const char* what, const RopeTensor& x, int64_t T, int64_t H, int64_t D, const RopeConfig& cfg,
                const RopeTensorOut& y, bool device) {
  check_at_least(what, "T", T, 0);
  check_at_least(what, "H", H, 1);
  check_at_least(what, "D", D, 2);
  FP4MOE_CHECK(D % 2 == 0, "{}: D must be even (interleaved pairs), got D={}", what, D);
  FP4MOE_CHECK(D <= kRopeMaxDim, "{}: D={} exceeds the supported {}", what, D, kRopeMaxDim);
  check_elements(what, T, H * D);
  check_rope_strides(what, "x", x.token_stride, x.head_stride, H, D);
  check_rope_strides(what, "y", y.token_stride, y.head_stride, H, D);
  check_elements(what, T, x.token_stride);
  check_elements(what, T, y.token_stride);
  FP4MOE_CHECK(std::isfinite(cfg.theta) && cfg.theta > 1.0f, "{}: theta must be finite and > 1, got {}", what,
               cfg.theta);
  check_at_least(what, "position_offset", cfg.position_offset, 0);
  check_at_least(what, "seq_len", cfg.seq_len, 0);
  if (T == 0) return;
  const int64_t period = cfg.seq_len > 0 && cfg.seq_len < T ? cfg.seq_len : T;
  FP4MOE_CHECK(cfg.position_offset <= (int64_t{1} << 24) - period,
               "{}: largest position {} + {} - 1 must stay below 2^24 (exact in FP32)", what, cfg.position_offset,
               period);
  check_not_null(what, "x", x.data);
  check_not_null(what, "y", y.data);
  if (device) {
    check_aligned(what, "x", x.data, 4);
    check_aligned(what, "y", y.data, 4);
  }
}

}  // namespace nn_detail

void rope_f64(const double* x, int64_t T, int64_t H, int64_t D, const RopeConfig& cfg, double* y, bool inverse) {
  for (int64_t t = 0; t < T; ++t) {
    const int64_t p = position_of(cfg, T, t);
    for (int64_t i = 0; i < D / 2; ++i) {
      const double a = angle_of(p, rope_inv_freq(cfg.theta, D, i));
      const double c = std::cos(a), s = inverse ? -std::sin(a) : std::sin(a);
      for (int64_t h = 0; h < H; ++h) {
        const int64_t o = (t * H + h) * D + 2 * i;
        const double x0 = x[o], x1 = x[o + 1];
        y[o] = x0 * c - x1 * s;
        y[o + 1] = x0 * s + x1 * c;
      }
    }
  }
}

void rope_ref(RopeTensor x, int64_t T, int64_t H, int64_t D, const RopeConfig& cfg, RopeTensorOut y, bool inverse) {
  const char* what = inverse ? "rope_backward_ref" : "rope_forward_ref";
  nn_detail::check_rope(what, x, T, H, D, cfg, y, /*device=*/false);
  std::vector<double> xd(T * H * D), yd(T * H * D);  // dense copies: in-place views work too
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t d = 0; d < D; ++d)
        xd[(t * H + h) * D + d] = to_f64(x.data[t * x.token_stride + h * x.head_stride + d]);
  rope_f64(xd.data(), T, H, D, cfg, yd.data(), inverse);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t d = 0; d < D; ++d)
        y.data[t * y.token_stride + h * y.head_stride + d] = to_bf16(yd[(t * H + h) * D + d]);
}

}  // namespace fp4moe
