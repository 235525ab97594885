// CPU reference of RMSNorm forward and backward (rmsnorm.h): double arithmetic, one rounding per output.
#include <cmath>
#include <vector>

#include "kernels/formats/formats.h"
#include "kernels/nn/nn_checks.h"
#include "kernels/nn/rmsnorm.h"

namespace fp4moe {
namespace {

double to_f64(bf16 v) { return bf16_bits_to_f32(bf16_bits(v)); }
bf16 to_bf16(double v) { return bf16_from_bits(f32_to_bf16_bits(static_cast<float>(v))); }

}  // namespace

void rmsnorm_forward_f64(const double* x, const double* weight, int64_t N, int64_t C, double eps, double* y,
                         double* rstd) {
  for (int64_t n = 0; n < N; ++n) {
    const double* xr = x + n * C;
    double sum_sq = 0;
    for (int64_t c = 0; c < C; ++c) sum_sq += xr[c] * xr[c];
    const double r = 1.0 / std::sqrt(sum_sq / static_cast<double>(C) + eps);
    if (rstd != nullptr) rstd[n] = r;
    for (int64_t c = 0; c < C; ++c) y[n * C + c] = xr[c] * r * weight[c];
  }
}

void rmsnorm_backward_f64(const double* dy, const double* x, const double* weight, const double* rstd, int64_t N,
                          int64_t C, double* dx, double* dweight) {
  for (int64_t c = 0; c < C; ++c) dweight[c] = 0;
  for (int64_t n = 0; n < N; ++n) {
    const double r = rstd[n];
    double dot = 0;  // sum_c g * xhat
    for (int64_t c = 0; c < C; ++c) dot += dy[n * C + c] * weight[c] * (x[n * C + c] * r);
    const double mean = dot / static_cast<double>(C);
    for (int64_t c = 0; c < C; ++c) {
      const double xhat = x[n * C + c] * r;
      dx[n * C + c] = r * (dy[n * C + c] * weight[c] - xhat * mean);
      dweight[c] += dy[n * C + c] * xhat;
    }
  }
}

void rmsnorm_forward_ref(const bf16* x, const bf16* weight, int64_t N, int64_t C, float eps, bf16* y, float* rstd) {
  const char* what = "rmsnorm_forward_ref";
  nn_detail::check_matrix_shape(what, "N", N, "C", C);
  FP4MOE_CHECK(std::isfinite(eps) && eps > 0, "{}: eps must be finite and > 0, got {}", what, eps);
  std::vector<double> xd(N * C), wd(C), yd(N * C), rd(N);
  for (int64_t i = 0; i < N * C; ++i) xd[i] = to_f64(x[i]);
  for (int64_t c = 0; c < C; ++c) wd[c] = to_f64(weight[c]);
  rmsnorm_forward_f64(xd.data(), wd.data(), N, C, static_cast<double>(eps), yd.data(), rd.data());
  for (int64_t i = 0; i < N * C; ++i) y[i] = to_bf16(yd[i]);
  if (rstd != nullptr)
    for (int64_t n = 0; n < N; ++n) rstd[n] = static_cast<float>(rd[n]);
}

void rmsnorm_backward_ref(const bf16* dy, const bf16* x, const bf16* weight, const float* rstd, int64_t N, int64_t C,
                          bf16* dx, float* dweight, bool accumulate_dweight) {
  const char* what = "rmsnorm_backward_ref";
  nn_detail::check_matrix_shape(what, "N", N, "C", C);
  nn_detail::check_not_null(what, "rstd", rstd);
  nn_detail::check_not_null(what, "dweight", dweight);
  std::vector<double> dyd(N * C), xd(N * C), wd(C), rd(N), dxd(N * C), dwd(C);
  for (int64_t i = 0; i < N * C; ++i) {
    dyd[i] = to_f64(dy[i]);
    xd[i] = to_f64(x[i]);
  }
  for (int64_t c = 0; c < C; ++c) wd[c] = to_f64(weight[c]);
  for (int64_t n = 0; n < N; ++n) rd[n] = rstd[n];
  rmsnorm_backward_f64(dyd.data(), xd.data(), wd.data(), rd.data(), N, C, dxd.data(), dwd.data());
  for (int64_t i = 0; i < N * C; ++i) dx[i] = to_bf16(dxd[i]);
  for (int64_t c = 0; c < C; ++c)
    dweight[c] = static_cast<float>(accumulate_dweight ? static_cast<double>(dweight[c]) + dwd[c] : dwd[c]);
}

}  // namespace fp4moe
