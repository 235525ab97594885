#include "trainer/model/linear_ref.h"

#include "kernels/common/check.h"
#include "kernels/formats/formats.h"
#include "kernels/gemm/grouped_gemm_ref.h"
#include "kernels/quant/bf16_to_fp8.h"
#include "kernels/quant/bf16_to_mxfp4_row.h"
#include "kernels/quant/layouts.h"
#include "kernels/quant/mxfp4_row_to_fp8_col.h"
#include "kernels/quant/mxfp4_row_to_fp8_row.h"

namespace fp4moe {

namespace {

constexpr Fp8ScaleMode kMode = Fp8ScaleMode::pow2;  // Group Linear's default, what Linear uses

std::vector<float> to_float(const bf16* v, int64_t n) {
  std::vector<float> f(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) f[i] = bf16_bits_to_f32(bf16_bits(v[i]));
  return f;
}

// An FP8 1x128 row tensor of the [rows, cols] BF16 matrix v, dequantized.
std::vector<float> fp8_row(const bf16* v, int64_t rows, int64_t cols) {
  std::vector<uint8_t> codes(static_cast<size_t>(rows * cols));
  std::vector<float> scales(static_cast<size_t>(fp8_row_scale_count(rows, cols))), out(codes.size());
  bf16_to_fp8_row_ref(v, rows, cols, kMode, codes.data(), scales.data());
  fp8_row_dequantize_ref(codes.data(), scales.data(), rows, cols, out.data());
  return out;
}

// An FP8 column tensor (one group of all `rows` tokens) of the [rows, cols] BF16 matrix v, dequantized back to
// [rows, cols].
std::vector<float> fp8_col(const bf16* v, int64_t rows, int64_t cols, const int32_t* offsets) {
  std::vector<uint8_t> codes(static_cast<size_t>(fp8_col_codes_capacity(rows, cols, 1)));
  std::vector<float> scales(static_cast<size_t>(fp8_col_scales_capacity(rows, cols, 1)));
  std::vector<float> out(static_cast<size_t>(rows * cols));
  bf16_to_fp8_col_ref(v, rows, cols, offsets, 1, kMode, codes.data(), scales.data());
  fp8_col_dequantize_ref(codes.data(), scales.data(), rows, cols, offsets, 1, out.data());
  return out;
}

// W [N, K] through its FP8 128x128 block tensor (transpose = false), or through W^T's (transpose = true), stored
// back as [N, K].
std::vector<float> fp8_weight(const bf16* w, int64_t N, int64_t K, bool transpose) {
  std::vector<uint8_t> codes(static_cast<size_t>(N * K));
  std::vector<float> scales(static_cast<size_t>(transpose ? fp8_block_scale_count(K, N) : fp8_block_scale_count(N, K)));
  std::vector<float> deq(static_cast<size_t>(N * K));
  bf16_to_fp8_block128_ref(w, N, K, kMode, transpose, codes.data(), scales.data());
  fp8_block128_dequantize_ref(codes.data(), scales.data(), N, K, transpose, deq.data());
  if (!transpose) return deq;
  std::vector<float> out(deq.size());  // deq is W^T [K, N]
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) out[n * K + k] = deq[k * N + n];
  return out;
}

}  // namespace

LinearRecipeOperands linear_recipe_operands(Recipe recipe, const bf16* x, const bf16* w, const bf16* dy, int64_t M,
                                            int64_t N, int64_t K) {
  FP4MOE_CHECK(M >= 0 && N >= 1 && K >= 1, "linear_recipe_operands: expected M >= 0, N >= 1, K >= 1, got M={} N={} "
               "K={}", M, N, K);
  FP4MOE_CHECK(w != nullptr && (M == 0 || (x != nullptr && dy != nullptr)), "linear_recipe_operands: null input");
  LinearRecipeOperands ops;
  if (recipe == Recipe::bf16) {
    ops.x_fprop = ops.x_wgrad = to_float(x, M * K);
    ops.w_fprop = ops.w_dgrad = to_float(w, N * K);
    ops.dy_dgrad = ops.dy_wgrad = to_float(dy, M * N);
    return ops;
  }
  FP4MOE_CHECK(recipe != Recipe::mxfp4 || K % kMxBlock == 0,
               "linear_recipe_operands: the mxfp4 recipe needs K % 32 == 0, got K={}", K);
  ops.w_fprop = fp8_weight(w, N, K, false);
  ops.w_dgrad = fp8_weight(w, N, K, true);
  if (M == 0) return ops;
  const int32_t offsets[2] = {0, static_cast<int32_t>(M)};
  ops.dy_dgrad = fp8_row(dy, M, N);
  ops.dy_wgrad = fp8_col(dy, M, N, offsets);
  if (recipe == Recipe::fp8) {
    ops.x_fprop = fp8_row(x, M, K);
    ops.x_wgrad = fp8_col(x, M, K, offsets);
    return ops;
  }
  std::vector<uint8_t> mx_codes(static_cast<size_t>(M * K / 2)), mx_scales(static_cast<size_t>(M * K / kMxBlock));
  bf16_to_mxfp4_row_ref(x, M, K, mx_codes.data(), mx_scales.data(), MxQuantConfig{});
  {
    std::vector<uint8_t> codes(static_cast<size_t>(M * K));
    std::vector<float> scales(static_cast<size_t>(fp8_row_scale_count(M, K)));
    ops.x_fprop.resize(codes.size());
    mxfp4_row_to_fp8_row_ref(mx_codes.data(), mx_scales.data(), M, K, codes.data(), scales.data());
    fp8_row_dequantize_ref(codes.data(), scales.data(), M, K, ops.x_fprop.data());
  }
  {
    std::vector<uint8_t> codes(static_cast<size_t>(fp8_col_codes_capacity(M, K, 1)));
    std::vector<float> scales(static_cast<size_t>(fp8_col_scales_capacity(M, K, 1)));
    ops.x_wgrad.resize(static_cast<size_t>(M * K));
    mxfp4_row_to_fp8_col_ref(mx_codes.data(), mx_scales.data(), M, K, offsets, 1, codes.data(), scales.data());
    fp8_col_dequantize_ref(codes.data(), scales.data(), M, K, offsets, 1, ops.x_wgrad.data());
  }
  return ops;
}

void linear_recipe_ref(const LinearRecipeOperands& ops, int64_t M, int64_t N, int64_t K, std::vector<float>& y,
                       std::vector<float>& dx, std::vector<float>& dw) {
  FP4MOE_CHECK(M >= 0 && N >= 1 && K >= 1, "linear_recipe_ref: expected M >= 0, N >= 1, K >= 1, got M={} N={} K={}",
               M, N, K);
  const auto sized = [](const std::vector<float>& v, int64_t n) { return static_cast<int64_t>(v.size()) == n; };
  FP4MOE_CHECK(sized(ops.x_fprop, M * K) && sized(ops.x_wgrad, M * K) && sized(ops.dy_dgrad, M * N) &&
                   sized(ops.dy_wgrad, M * N) && sized(ops.w_fprop, N * K) && sized(ops.w_dgrad, N * K),
               "linear_recipe_ref: operands of other shapes than [M, K] = [{}, {}], [N, K] = [{}, {}]", M, K, N, K);
  y.assign(static_cast<size_t>(M * N), 0.0f);
  dx.assign(static_cast<size_t>(M * K), 0.0f);
  dw.assign(static_cast<size_t>(N * K), 0.0f);
  if (M == 0) return;
  const int32_t offsets[2] = {0, static_cast<int32_t>(M)};
  grouped_fprop_ref(ops.x_fprop.data(), ops.w_fprop.data(), M, N, K, offsets, 1, y.data());
  grouped_dgrad_ref(ops.dy_dgrad.data(), ops.w_dgrad.data(), M, N, K, offsets, 1, dx.data());
  grouped_wgrad_ref(ops.dy_wgrad.data(), ops.x_wgrad.data(), M, N, K, offsets, 1, dw.data());
}

}  // namespace fp4moe
