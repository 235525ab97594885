// A linear layer without bias, Y = X W^T (DESIGN.md "Recipes": Fprop, Dgrad, Wgrad), the building block of the
// attention projections, the dense FFN and the shared experts.
//
// Shapes (row-major): X [M, K] BF16, W [N, K] BF16 (PyTorch nn.Linear layout, registered in the ParamStore as
// `name` with shape {N, K}), Y [M, N] BF16.
//   Fprop  Y  = X W^T                      (BF16 output)
//   Dgrad  dX = dY W                       (BF16 output, or FP32 with optional accumulation: dX += dY W)
//   Wgrad  dW += dY^T X                    (FP32, into the parameter's grad: gradient accumulation over
//                                           micro-batches and over the uses of the layer)
// GEMMs run through cuBLASLt with FP32 accumulation. The recipe is chosen per layer; only `bf16` is built here
// (the constructor rejects fp8 and mxfp4 with a message saying so); M = 0 is a no-op. Rows of 16 bytes: K and N
// must be multiples of 8.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/common/types.h"
#include "trainer/config.h"
#include "trainer/model/context.h"
#include "trainer/model/params.h"

namespace fp4moe {

// Where Dgrad writes: BF16 (overwrite) or FP32 (overwrite, or += when accumulate).
struct LinearGradOut {
  void* data = nullptr;   // null: no Dgrad
  bool fp32 = false;
  bool accumulate = false;  // FP32 only
};

class Linear {
 public:
  Linear(ParamStore& store, const std::string& name, int64_t in_features, int64_t out_features, Recipe recipe,
         float init_std);
  // y [M, N] = x [M, K] W^T
  void forward(ModelContext& ctx, const bf16* x, int64_t M, bf16* y) const;
  // dx (see LinearGradOut) from dy [M, N], and W's grad += dy^T x (FP32).
  void backward(ModelContext& ctx, const bf16* dy, const bf16* x, int64_t M, LinearGradOut dx) const;

  int64_t in_features() const { return K_; }
  int64_t out_features() const { return N_; }
  Recipe recipe() const { return recipe_; }
  const Param& weight() const { return *w_; }

 private:
  Param* w_;
  int64_t K_, N_;
  Recipe recipe_;
};

}  // namespace fp4moe
