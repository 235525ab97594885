// CPU reference of SwiGLU forward and backward (swiglu.h): double arithmetic, one rounding per output.
#include <cmath>
#include <vector>

#include "kernels/formats/formats.h"
#include "kernels/nn/nn_checks.h"
#include "kernels/nn/swiglu.h"

namespace fp4moe {
namespace {

double to_f64(bf16 v) { return bf16_bits_to_f32(bf16_bits(v)); }
bf16 to_bf16(double v) { return bf16_from_bits(f32_to_bf16_bits(static_cast<float>(v))); }
double sigmoid(double g) { return 1.0 / (1.0 + std::exp(-g)); }

std::vector<double> widen(const bf16* p, int64_t n) {
  std::vector<double> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = to_f64(p[i]);
  return out;
}

}  // namespace

void swiglu_forward_f64(const double* input, int64_t M, int64_t F, double* y) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t f = 0; f < F; ++f) {
      const double g = input[m * 2 * F + f], u = input[m * 2 * F + F + f];
      y[m * F + f] = g * sigmoid(g) * u;
    }
}

void swiglu_backward_f64(const double* dy, const double* input, int64_t M, int64_t F, double* dinput) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t f = 0; f < F; ++f) {
      const double g = input[m * 2 * F + f], u = input[m * 2 * F + F + f], d = dy[m * F + f];
      const double s = sigmoid(g);
      dinput[m * 2 * F + f] = d * u * s * (1.0 + g * (1.0 - s));
      dinput[m * 2 * F + F + f] = d * g * s;
    }
}

void swiglu_forward_ref(const bf16* input, int64_t M, int64_t F, bf16* y) {
  nn_detail::check_matrix_shape("swiglu_forward_ref", "M", M, "F", F);
  nn_detail::check_elements("swiglu_forward_ref", M, 2 * F);
  const std::vector<double> in = widen(input, M * 2 * F);
  std::vector<double> out(M * F);
  swiglu_forward_f64(in.data(), M, F, out.data());
  for (int64_t i = 0; i < M * F; ++i) y[i] = to_bf16(out[i]);
}

void swiglu_backward_ref(const bf16* dy, const bf16* input, int64_t M, int64_t F, bf16* dinput) {
  nn_detail::check_matrix_shape("swiglu_backward_ref", "M", M, "F", F);
  nn_detail::check_elements("swiglu_backward_ref", M, 2 * F);
  const std::vector<double> in = widen(input, M * 2 * F), d = widen(dy, M * F);
  std::vector<double> out(M * 2 * F);
  swiglu_backward_f64(d.data(), in.data(), M, F, out.data());
  for (int64_t i = 0; i < M * 2 * F; ++i) dinput[i] = to_bf16(out[i]);
}

}  // namespace fp4moe
