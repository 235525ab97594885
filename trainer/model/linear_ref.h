// CPU reference of Linear's recipes (linear.h, DESIGN.md "Recipes"): the operands each recipe feeds its three
// GEMMs, made by the CPU references of the same quantizers (kernels/quant/) and dequantized to FP32, and the
// GEMMs on them (kernels/gemm/grouped_gemm_ref.h with one group: products summed in double, rounded once to FP32).
// A GPU Linear must match linear_recipe_ref on these operands up to its BF16 output rounding (Y, dX) and FP32
// summation order (dW); the distance of the quantized results from the bf16 recipe's is the recipe's error.
//
//   bf16   every operand is the BF16 value itself
//   fp8    Fprop  X: bf16_to_fp8_row (pow2)             W: bf16_to_fp8_block128
//          Dgrad  dY: bf16_to_fp8_row                   W: bf16_to_fp8_block128 of W^T (transpose = true)
//          Wgrad  dY, X: bf16_to_fp8_col with one group {0, M} (1x128 blocks along tokens)
//   mxfp4  X: bf16_to_mxfp4_row (OCP floor scales, RNE); Fprop X: mxfp4_row_to_fp8_row of it; Wgrad X:
//          mxfp4_row_to_fp8_col of it; W, dY as fp8
// Host memory, row-major. Shapes as Linear's: x [M, K], w [N, K], dy [M, N]; K and N multiples of 16 (32 for K
// in mxfp4). Rejects (fp4moe::Error): M < 0, N or K < 1, shapes the quantizer references reject.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/common/types.h"
#include "trainer/config.h"

namespace fp4moe {

// What one recipe feeds its GEMMs, dequantized to FP32.
struct LinearRecipeOperands {
  std::vector<float> x_fprop, w_fprop;   // [M, K], [N, K]
  std::vector<float> dy_dgrad, w_dgrad;  // [M, N], [N, K] (the dequantized W^T blocks, stored back as [N, K])
  std::vector<float> dy_wgrad, x_wgrad;  // [M, N], [M, K]
};

LinearRecipeOperands linear_recipe_operands(Recipe recipe, const bf16* x, const bf16* w, const bf16* dy, int64_t M,
                                            int64_t N, int64_t K);

// y [M, N] = x_fprop w_fprop^T; dx [M, K] = dy_dgrad w_dgrad; dw [N, K] = dy_wgrad^T x_wgrad (not accumulated).
// Outputs are resized here.
void linear_recipe_ref(const LinearRecipeOperands& ops, int64_t M, int64_t N, int64_t K, std::vector<float>& y,
                       std::vector<float>& dx, std::vector<float>& dw);

}  // namespace fp4moe
