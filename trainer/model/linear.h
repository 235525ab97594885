// A linear layer without bias, Y = X W^T (DESIGN.md "Recipes": Fprop, Dgrad, Wgrad), the building block of the
// attention projections, the dense FFN and the shared experts.
//
// Shapes (row-major): X [M, K] BF16, W [N, K] BF16 (PyTorch nn.Linear layout, registered in the ParamStore as
// `name` with shape {N, K}), Y [M, N] BF16.
//   Fprop  Y  = X W^T                      (BF16 output)
//   Dgrad  dX = dY W                       (BF16 output, or FP32 with optional accumulation: dX += dY W)
//   Wgrad  dW += dY^T X                    (FP32, into the parameter's grad: gradient accumulation over
//                                           micro-batches and over the uses of the layer)
// FP32 accumulation in every GEMM. The recipe is chosen per layer (trainer/config.h, one per layer class):
//
// | recipe | Fprop                          | Dgrad                 | Wgrad                      | kept for backward |
// | bf16   | BF16 X, W (cuBLASLt)           | BF16 dY, W            | BF16 dY, X                 | the caller's X    |
// | fp8    | X 1x128 row, W 128x128 (FP8)   | dY 1x128 row, W^T     | dY, X 1x128 along tokens   | FP8 X column copy |
// |        |                                | 128x128               |                            |                   |
// | mxfp4  | X -> MXFP4 (bf16_to_mxfp4_row) | as fp8                | X: MXFP4 -> FP8 column     | MXFP4 X only      |
// |        | -> FP8 row (direct)            |                       | (direct), dY as fp8        |                   |
//
// Paper 2's ladder (recipe.h: each GEMM class fp8 or mxfp4, rounding, transform) runs through the same Group Linear
// (group_linear.h states the operands of each mxfp4 class); an mxfp4 Fprop or Dgrad needs M % 4 == 0, and the
// layer's quantizer seed is layer_quant_seed(ctx.quant_seed, name) at each forward.
//
// The fp8 and mxfp4 recipes run through Group Linear with one group (trainer/model/group_linear.h, pow2 FP8
// scales, OCP floor MX scales with RNE); the bf16 recipe through the model's cuBLASLt handle (ModelContext::lt).
// FP32 Dgrad in the fp8/mxfp4 recipes: Group Linear writes BF16 dX into a scratch, then cast_bf16_to_f32 (or,
// accumulating, add_bf16_into_f32) brings it into the FP32 output, one BF16 rounding more than the bf16 recipe.
//
// State between forward and backward (fp8, mxfp4): forward keeps what backward reads (the FP8 column copy, or
// the MXFP4 copy, of this forward's X, and FP8 copies of W and W^T made from the BF16 parameters at every
// forward), so backward differentiates the LAST forward of this layer in the active slot of ctx.mem (the in-flight
// micro-batches, trainer/memory/device_memory.h: the copies of X and the token count exist once per slot): call
// backward after the forward it belongs to, with the same M and slot, before the next forward of the layer in that
// slot (a recomputed forward that repeats it is fine). forward and backward are const for the parameters' sake;
// these copies are the layer's cache.
//
// Device memory (fp8, mxfp4): taken at the first forward from ctx.mem (required for these recipes) and grown
// when a larger M arrives (a grow frees the old buffer: cudaFree synchronises the device), counted there as
//   weights      FP8 W [N, K] and W^T [K, N] codes + FP32 128x128 block scales (weight_copy_bytes)
//   activations  what backward reads: fp8 the FP8 column copy of X; mxfp4 the MXFP4 copy of X
//                (held_activation_bytes, each buffer rounded up to DeviceMemory's 256 bytes)
//   workspace    FP8 row copies of X and dY, dY's column copy, mxfp4's X column copy (backward), the device
//                offsets {0, M}, and the BF16 dX scratch of an FP32 Dgrad
// (every buffer as Linear::buffers states it). Not counted: the cuBLASLt handle and 32 MiB workspace, the model's one
// (ctx.lt, with which every fp8/mxfp4 layer builds its Group Linear at its first forward; a Linear run without ctx.lt
// makes its own), and GroupedGemm's scratch for a token count M % 4 != 0 (cudaMalloc inside kernels/gemm), as
// model.cpp says. The caller's BF16 X is the caller's: the fp8 and mxfp4 recipes do not read it in backward
// (backward_reads_input() is false), so a caller may free or reuse it after forward.
//
// Shape rules: K and N multiples of 8 for bf16 (16-byte BF16 rows), of 16 for fp8 and mxfp4 (FP8 GEMMs), and
// K a multiple of 32 for mxfp4 (MX blocks); the constructor rejects others before registering anything. M = 0
// is a no-op in every recipe. Pointers 16-byte aligned for fp8 and mxfp4. One stream (ctx.stream); not
// thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "kernels/common/types.h"
#include "trainer/config.h"
#include "trainer/memory/buffer_plan.h"
#include "trainer/model/context.h"
#include "trainer/model/params.h"
#include "trainer/model/profile.h"

namespace fp4moe {

// Where Dgrad writes: BF16 (overwrite) or FP32 (overwrite, or += when accumulate).
struct LinearGradOut {
  void* data = nullptr;   // null: no Dgrad
  bool fp32 = false;
  bool accumulate = false;  // FP32 only
};

class LinearQuantized;  // the fp8/mxfp4 path (linear_quantized.h)

class Linear {
 public:
  // Registers the weight `name` [out_features, in_features], N(0, init_std^2), with weight decay. Rejects
  // (fp4moe::Error, before registering) a recipe that is not built (check_recipe_built), the shapes above, and
  // out_features % 32 != 0 for an mxfp4 Dgrad (MX blocks along N). Needs no device: the fp8/mxfp4 recipes build
  // their Group Linear at the first forward.
  Linear(ParamStore& store, const std::string& name, int64_t in_features, int64_t out_features,
         const Recipe& recipe, float init_std);
  ~Linear();
  Linear(Linear&&) noexcept;
  Linear& operator=(Linear&&) noexcept;
  Linear(const Linear&) = delete;
  Linear& operator=(const Linear&) = delete;

  // y [M, N] = x [M, K] W^T. Rejects null x or y (M > 0); fp8/mxfp4 also a null ctx.mem, or another DeviceMemory
  // or cuBLASLt object (ctx.lt) than the first forward's.
  void forward(ModelContext& ctx, const bf16* x, int64_t M, bf16* y) const;
  // dx (see LinearGradOut) from dy [M, N], and W's grad += dy^T x (FP32). x: the forward's input, read by the
  // bf16 recipe only (fp8 and mxfp4 read their own copy of it: x may be null there). Rejects a null dy, FP32
  // accumulation into a BF16 dx, a null x for bf16, and for fp8/mxfp4 a backward without a forward or with
  // another M than the last forward's.
  void backward(ModelContext& ctx, const bf16* dy, const bf16* x, int64_t M, LinearGradOut dx) const;

  int64_t in_features() const { return K_; }
  int64_t out_features() const { return N_; }
  Recipe recipe() const { return recipe_; }
  const Param& weight() const { return *w_; }
  // The step profile's module of this layer's forward and backward (trainer/model/profile.h; the pass is the
  // caller's scope's): MLA tags its projections mla_proj; untagged (inherit) the time stays with the caller's scope.
  void set_profile_module(ProfileModule m) { profile_module_ = m; }
  // Whether backward reads the caller's X (bf16 only).
  bool backward_reads_input() const { return recipe_ == Recipe::bf16; }

  // Activation bytes that must stay alive from a forward over M tokens to its backward, whoever holds them
  // (DESIGN.md "Recipes", column "cached for backward"): bf16 the caller's X, 2 M K; fp8 the layer's FP8 column
  // copy of X as allocated, K (M + 15) E4M3 codes + K (ceil(M/128) + 1) FP32 scales (the capacity of a column
  // tensor of one group, layouts.h), or with an mxfp4 Wgrad its MXFP4 column copy (GroupLinear::
  // held_activation_bytes); mxfp4 the layer's MXFP4 X, M K / 2 + M K / 32. Rejects M < 0, K < 1, and
  // K % 32 != 0 for mxfp4.
  static size_t held_activation_bytes(const Recipe& recipe, int64_t M, int64_t K);
  // FP8 copies of W and W^T held for the whole step (fp8, mxfp4; 0 for bf16). Rejects N or K < 1.
  static size_t weight_copy_bytes(const Recipe& recipe, int64_t N, int64_t K);
  // Every buffer the layer holds once it has run a forward and a backward over M tokens (trainer/memory/
  // buffer_plan.h, all allocated by the first forward or backward from ctx.mem and kept; module "linear"): bf16
  // none; fp8 and mxfp4 its Group Linear's (GroupLinear::buffers with G = 1), "token offsets" [2] int32 (workspace),
  // mxfp4 "X MXFP4 codes" [M, K/2] packed E2M1 and "X MXFP4 scales" [M, K/32] UE8M0 (activations: what backward
  // reads), and with fp32_dgrad (the caller takes Dgrad in FP32) "BF16 Dgrad before FP32" [M, K] (workspace).
  // Rejects M < 0, N or K < 1, K % 32 != 0 for mxfp4 and a recipe that is not built.
  static BufferPlan buffers(const Recipe& recipe, int64_t M, int64_t N, int64_t K, bool fp32_dgrad);

 private:
  void backward_bf16(ModelContext& ctx, const bf16* dy, const bf16* x, int64_t M, LinearGradOut dx) const;

  Param* w_;
  int64_t K_, N_;
  Recipe recipe_;
  std::unique_ptr<LinearQuantized> q_;  // fp8 and mxfp4 only
  ProfileModule profile_module_ = ProfileModule::inherit;
};

}  // namespace fp4moe
