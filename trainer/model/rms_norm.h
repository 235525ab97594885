// An RMSNorm layer (kernels/nn/rmsnorm.h) with its weight in the ParamStore: the attention and FFN input norms of
// every decoder layer, the final norm, and MLA's q and kv latent norms (DESIGN.md "Trainer").
//
//   y [M, C] = x * rstd * weight,  weight "<name>" [C] BF16 param / FP32 master and grad, init ones, no decay.
//
// Kept from forward to backward: rstd [max_tokens] FP32, 4 bytes per token (MemCategory::activations), unless the
// layer is built with keep_rstd = false (the `layernorm` and `full` recompute policies, trainer/model/recompute.h):
// then forward saves nothing and the caller reruns the norm with recompute() before backward, which takes rstd from
// the shared scratch in the caller's scope. The norm's output y is the caller's (kept or recomputed by it). x is not
// copied: backward takes the pointer forward saw. Scratch (ModelContext::scratch): the dweight partial sums of
// rmsnorm_backward, in backward only. In-flight micro-batches (trainer/memory/device_memory.h): rstd and the token
// count have one copy per slot; backward reads the active slot's.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/common/types.h"
#include "trainer/memory/buffer_plan.h"
#include "trainer/memory/device_memory.h"
#include "trainer/memory/scratch.h"
#include "trainer/model/context.h"
#include "trainer/model/params.h"
#include "trainer/model/profile.h"

namespace fp4moe {

class RmsNorm {
 public:
  // C >= 1 features, eps > 0, max_tokens >= 0 rows per forward. Registers "<name>" [C].
  RmsNorm(ParamStore& store, const std::string& name, int64_t C, float eps, int64_t max_tokens, DeviceMemory& mem,
          bool keep_rstd = true);

  // x [M, C] BF16 -> y [M, C] BF16 (y may be x). 0 <= M <= max_tokens; M = 0 does nothing. Keeps rstd [M] when
  // keep_rstd (else saves nothing). Takes no scratch.
  void forward(ModelContext& ctx, const bf16* x, int64_t M, bf16* y);
  // The same forward, for a backward that follows in the caller's current scratch scope: with keep_rstd it is
  // forward(); else rstd [M] FP32 is taken from ctx.scratch and left in the caller's scope (recompute_bytes).
  void recompute(ModelContext& ctx, const bf16* x, int64_t M, bf16* y);
  // dy [M, C], x as in forward -> dx [M, C] BF16 (overwritten; may be dy); weight grad += (FP32). M must equal the
  // last forward's; without keep_rstd, a recompute() in a scratch scope still open must come first (else
  // fp4moe::Error).
  void backward(ModelContext& ctx, const bf16* dy, const bf16* x, int64_t M, bf16* dx);

  int64_t features() const { return C_; }
  const Param& weight() const { return *w_; }
  bool keeps_rstd() const { return keep_rstd_; }
  // The layer's buffers for `tokens` rows of C features (trainer/memory/buffer_plan.h; module "norm"): "rstd"
  // [tokens] FP32, held when keep_rstd (else taken by recompute()); backward's "dweight partials"
  // [rmsnorm_backward_workspace_floats(tokens, C)] FP32. Rejects tokens < 0, C < 1.
  static BufferPlan buffers(int64_t tokens, int64_t C, bool keep_rstd);
  // Activations held from forward to backward (buffers() at max_tokens, as DeviceMemory counts them).
  size_t kept_bytes() const {
    return static_cast<size_t>(buffers(max_tokens_, C_, keep_rstd_).counted_bytes(MemCategory::activations));
  }
  // The shared scratch of the passes for `tokens` rows (trainer/memory/scratch.h): recompute "rstd", left in the
  // caller's scope (0 with keep_rstd); backward (and backward_after_recompute) "dweight partials" in its own scope;
  // forward nothing. Rejects what buffers() rejects.
  static PassScratch scratch(int64_t tokens, int64_t C, bool keep_rstd);
  // scratch() for M = max_tokens.
  size_t recompute_bytes() const { return scratch(max_tokens_, C_, keep_rstd_).recompute; }
  size_t backward_bytes() const { return scratch(max_tokens_, C_, keep_rstd_).backward; }

 private:
  void run(ModelContext& ctx, const bf16* x, int64_t M, bf16* y, float* rstd, ProfilePass pass);

  std::string name_;
  int64_t C_, max_tokens_;
  float eps_;
  bool keep_rstd_;
  Param* w_;
  KeptValue<int64_t> last_M_;     // per slot: tokens of its forward or recompute (-1: none)
  float* recomputed_rstd_ = nullptr;  // rstd of the last recompute, in the scratch (keep_rstd = false)
  uint64_t rstd_stamp_ = 0;       // scratch stamp of that recompute
  KeptArray<float> rstd_;         // [max_tokens] FP32 1 / rms of each row  (activations; empty without keep_rstd)
};

}  // namespace fp4moe
