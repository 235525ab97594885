// CPU references of the MXFP4 GEMM (mxfp4_gemm.h): the exact FP64 products of the dequantized MXFP4 operands and of
// their direct FP8 conversions.
#include <vector>

#include "kernels/common/check.h"
#include "kernels/formats/formats.h"
#include "kernels/gemm/mxfp4_gemm.h"
#include "kernels/quant/layouts.h"
#include "kernels/quant/mx_row_checks.h"
#include "kernels/quant/mxfp4_row_to_fp8_row.h"

namespace fp4moe {

namespace {

void check_ref(const char* what, Mxfp4RowOperand a, Mxfp4RowOperand b, int64_t M, int64_t N, int64_t K,
               const double* y) {
  FP4MOE_CHECK(M > 0 && M % 4 == 0 && N > 0 && N % 16 == 0 && K > 0 && K % kMxBlock == 0,
               "{}: expected M a positive multiple of 4, N of 16 and K of 32, got [M, N, K] = [{}, {}, {}]", what, M,
               N, K);
  FP4MOE_CHECK(a.codes && a.scales && b.codes && b.scales && y, "{}: null pointer", what);
}

// y [M, N] = A [M, K] B [N, K]^T in FP64 (products and sums of FP64 values).
void product_f64(const std::vector<double>& a, const std::vector<double>& b, int64_t M, int64_t N, int64_t K,
                 double* y) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0.0;
      for (int64_t k = 0; k < K; ++k) s += a[m * K + k] * b[n * K + k];
      y[m * N + n] = s;
    }
}

// The FP8 1x128 row tensor [R, K] (E4M3 codes and fp32 scales) of an MXFP4 row tensor, dequantized into FP64.
std::vector<double> fp8_values(Mxfp4RowOperand t, int64_t R, int64_t K) {
  std::vector<uint8_t> codes(static_cast<size_t>(R * K));
  std::vector<float> scales(static_cast<size_t>(fp8_row_scale_count(R, K)));
  mxfp4_row_to_fp8_row_ref(t.codes, t.scales, R, K, codes.data(), scales.data());
  std::vector<double> v(codes.size());
  for (int64_t r = 0; r < R; ++r)
    for (int64_t k = 0; k < K; ++k)
      v[r * K + k] = static_cast<double>(e4m3_to_f32(codes[r * K + k])) *
                     static_cast<double>(scales[fp8_row_scale_index(r, k / kFp8Block, R)]);
  return v;
}

}  // namespace

void mxfp4_dequantize_f64_ref(Mxfp4RowOperand t, int64_t R, int64_t K, double* out) {
  const char* what = "mxfp4_dequantize_f64_ref";
  detail::check_mx_row_shape(what, R, K);
  FP4MOE_CHECK(R == 0 || (t.codes && t.scales && out), "{}: null pointer", what);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t k = 0; k < K; ++k) {
      const uint8_t byte = t.codes[(r * K + k) / 2];
      const uint8_t code = (k % 2) ? static_cast<uint8_t>(byte >> 4) : static_cast<uint8_t>(byte & 0xF);
      out[r * K + k] = static_cast<double>(e2m1_to_f32(code)) *
                       static_cast<double>(ue8m0_to_f32(t.scales[(r * K + k) / kMxBlock]));
    }
}

void mxfp4_gemm_exact_ref(Mxfp4RowOperand a, Mxfp4RowOperand b, int64_t M, int64_t N, int64_t K, double* y) {
  check_ref("mxfp4_gemm_exact_ref", a, b, M, N, K, y);
  std::vector<double> av(static_cast<size_t>(M * K)), bv(static_cast<size_t>(N * K));
  mxfp4_dequantize_f64_ref(a, M, K, av.data());
  mxfp4_dequantize_f64_ref(b, N, K, bv.data());
  product_f64(av, bv, M, N, K, y);
}

void mxfp4_gemm_fp8_ref(Mxfp4RowOperand a, Mxfp4RowOperand b, int64_t M, int64_t N, int64_t K, double* y) {
  check_ref("mxfp4_gemm_fp8_ref", a, b, M, N, K, y);
  product_f64(fp8_values(a, M, K), fp8_values(b, N, K), M, N, K, y);
}

}  // namespace fp4moe
