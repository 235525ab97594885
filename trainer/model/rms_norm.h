// An RMSNorm layer (kernels/nn/rmsnorm.h) with its weight in the ParamStore: the attention and FFN input norms of
// every decoder layer, the final norm, and MLA's q and kv latent norms (DESIGN.md "Trainer").
//
//   y [M, C] = x * rstd * weight,  weight "<name>" [C] BF16 param / FP32 master and grad, init ones, no decay.
//
// Kept from forward to backward: rstd [max_tokens] FP32 (MemCategory::activations). x is not copied: backward
// takes the pointer forward saw. Scratch: the dweight partial sums of rmsnorm_backward (MemCategory::workspace).
#pragma once

#include <cstdint>
#include <string>

#include "kernels/common/types.h"
#include "trainer/memory.h"
#include "trainer/model/context.h"
#include "trainer/model/params.h"

namespace fp4moe {

class RmsNorm {
 public:
  // C >= 1 features, eps > 0, max_tokens >= 0 rows per forward. Registers "<name>" [C].
  RmsNorm(ParamStore& store, const std::string& name, int64_t C, float eps, int64_t max_tokens, DeviceMemory& mem);

  // x [M, C] BF16 -> y [M, C] BF16 (y may be x). 0 <= M <= max_tokens; M = 0 does nothing. Keeps rstd [M].
  void forward(ModelContext& ctx, const bf16* x, int64_t M, bf16* y);
  // dy [M, C], x as in forward -> dx [M, C] BF16 (overwritten; may be dy); weight grad += (FP32). M must equal
  // the last forward's.
  void backward(ModelContext& ctx, const bf16* dy, const bf16* x, int64_t M, bf16* dx);

  int64_t features() const { return C_; }
  const Param& weight() const { return *w_; }

 private:
  std::string name_;
  int64_t C_, max_tokens_;
  float eps_;
  Param* w_;
  int64_t last_M_ = -1;
  DeviceArray<float> rstd_;       // [max_tokens] FP32 1 / rms of each row            (activations)
  DeviceArray<float> workspace_;  // [rmsnorm_backward_workspace_floats(max_tokens, C)] (workspace)
};

}  // namespace fp4moe
