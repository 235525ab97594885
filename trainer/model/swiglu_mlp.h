// The SwiGLU feed-forward block (DESIGN.md "Trainer"): the dense FFN of the first n_dense_layers and the shared
// experts of the MoE layers (one block of width shared_experts * expert_ffn, as DeepSeek-V2/V3 fuse them).
//
//   h = x W1^T          fc1: Linear hidden -> 2 ffn, "<prefix>.fc1" [2 ffn, hidden], packed gate | up
//                       (rows 0..ffn-1 of W1 make the gate, rows ffn..2 ffn-1 the up projection: swiglu.h)
//   a = silu(h_gate) * h_up                                                              (kernels/nn/swiglu.h)
//   y = a W2^T          fc2: Linear ffn -> hidden,   "<prefix>.fc2" [hidden, ffn]
//
// Init: fc1 N(0, 0.02^2); fc2 N(0, fc2_init_std^2), where the caller passes 0.02 / sqrt(2 * layers) (fc2 writes
// into the residual stream; model.cpp documents the init of every tensor). Both decay.
//
// Kept from forward to backward (MemCategory::activations, sized for max_tokens rows), 6 ffn bytes per token:
//   h [max_tokens, 2 ffn] BF16 (swiglu's input), a [max_tokens, ffn] BF16 (fc2's input, for its Wgrad; only with a
//   bf16 fc2: an fp8/mxfp4 Linear keeps its own copy of its input, counted by Linear, linear.h);
// nothing when built with recompute = true (the `mlp` policy for the dense FFN; `shared_experts`, `moe` for the
// shared experts; `full`): forward then writes h and a into the shared scratch, and backward reruns fc1 and swiglu
// (not fc2) into the scratch before its own work.
// Scratch (ModelContext::scratch, per call): forward h and a when not kept; backward h and a when not kept, da
// [M, ffn] and dh [M, 2 ffn] BF16.
// x is not copied: backward takes the same pointer forward saw (owned by the caller, still valid). In-flight
// micro-batches (trainer/memory/device_memory.h): h, a and the token count have one copy per slot.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/common/types.h"
#include "trainer/config.h"
#include "trainer/memory/buffer_plan.h"
#include "trainer/memory/device_memory.h"
#include "trainer/memory/scratch.h"
#include "trainer/model/context.h"
#include "trainer/model/linear.h"
#include "trainer/model/params.h"

namespace fp4moe {

class SwigluMlp {
 public:
  // hidden, ffn: multiples of 8 (Linear's rule); recipe for both Linears (what Linear builds); max_tokens >= 0
  // rows per forward; fc2_init_std > 0; recompute: keep nothing, rerun fc1 and swiglu in backward (above).
  // Registers "<prefix>.fc1" and "<prefix>.fc2".
  SwigluMlp(ParamStore& store, const std::string& prefix, int64_t hidden, int64_t ffn, Recipe recipe,
            int64_t max_tokens, DeviceMemory& mem, float fc2_init_std, bool recompute = false);

  // x [M, hidden] BF16 -> y [M, hidden] BF16 (overwritten; must not overlap x). 0 <= M <= max_tokens; M = 0
  // does nothing. Keeps h and a for backward (unless recompute).
  void forward(ModelContext& ctx, const bf16* x, int64_t M, bf16* y);
  // dy [M, hidden], x as in forward (may be null when !backward_reads_input()) -> dx [M, hidden] BF16
  // (overwritten); fc1 and fc2 grads += (FP32).
  void backward(ModelContext& ctx, const bf16* dy, const bf16* x, int64_t M, bf16* dx);
  // The same with dx as Linear's Dgrad output: BF16, or FP32 with accumulation (dx += ...), which the MoE layer
  // uses to sum the shared experts' dx with the routed and router contributions before one cast.
  void backward(ModelContext& ctx, const bf16* dy, const bf16* x, int64_t M, LinearGradOut dx);

  int64_t hidden() const { return hidden_; }
  int64_t ffn() const { return ffn_; }
  const Linear& fc1() const { return fc1_; }
  const Linear& fc2() const { return fc2_; }
  bool recomputes() const { return recompute_; }
  // Whether backward reads x: a bf16 fc1's Wgrad, or the recompute. With an fp8/mxfp4 fc1 and no recompute it
  // does not: backward then takes x = null, and the caller need not keep it.
  bool backward_reads_input() const;
  // Every buffer of the block (trainer/memory/buffer_plan.h) in module `module` ("mlp", "moe.shared"), for
  // `tokens` rows (h, a, fc2's input) of which fc1's input holds `fc1_tokens` (the sequence-parallel share of a
  // tensor-parallel layout; `tokens` on one GPU) and a width `ffn` (this GPU's share): "h" [tokens, 2 ffn] BF16
  // (held without recompute), "a" [tokens, ffn] BF16 (held without recompute for a bf16 fc2), backward's "d a"
  // [tokens, ffn] and "d h" [tokens, 2 ffn] BF16 (scratch), then fc1's and fc2's
  // Linear::buffers prefixed "fc1 " and "fc2 " (fp32_dgrad: fc1's Dgrad goes to an FP32 sum, as the shared
  // experts' does). Rejects negative sizes and what Linear::buffers rejects.
  static BufferPlan buffers(const std::string& module, int64_t tokens, int64_t fc1_tokens, int64_t hidden,
                            int64_t ffn, const Recipe& recipe, bool recompute, bool fp32_dgrad);
  // Activations held from forward to backward (buffers() at max_tokens, without the Linears' own copies), as
  // DeviceMemory counts them.
  size_t kept_bytes() const;
  // The shared scratch of the passes (trainer/memory/scratch.h) for `tokens` rows of width `ffn` (buffers()'s h, a,
  // d a, d h): forward h and a where not kept; backward h (and a for a bf16 fc2, which reads it) when recomputed,
  // then d a and d h; no recompute. Rejects what buffers() rejects.
  static PassScratch scratch(int64_t tokens, int64_t hidden, int64_t ffn, const Recipe& recipe, bool recompute);
  // scratch() for M = max_tokens; scratch_bytes() the larger.
  size_t forward_bytes() const { return scratch(max_tokens_, hidden_, ffn_, recipe_, recompute_).forward; }
  size_t backward_bytes() const { return scratch(max_tokens_, hidden_, ffn_, recipe_, recompute_).backward; }
  size_t scratch_bytes() const { return std::max(forward_bytes(), backward_bytes()); }

 private:
  void check_tokens(const char* what, int64_t M) const;
  const BufferPlan& plan_for(int64_t M);  // buffers() for M tokens, kept from the last call with the same M

  std::string prefix_;
  int64_t hidden_, ffn_, max_tokens_;
  Recipe recipe_;
  bool recompute_;
  Linear fc1_, fc2_;
  bool keep_a_ = false;       // a kept: no recompute and a bf16 fc2 (which reads it in backward)
  BufferPlan plan() const {  // buffers() at max_tokens
    return buffers("mlp", max_tokens_, max_tokens_, hidden_, ffn_, recipe_, recompute_, false);
  }
  KeptValue<int64_t> last_M_;  // per slot: tokens of its forward (backward must match; -1: none)
  KeptArray<bf16> h_;         // [max_tokens, 2 ffn] fc1 output, gate | up      (activations; empty with recompute)
  KeptArray<bf16> a_;         // [max_tokens, ffn]   swiglu output, fc2 input   (activations; when keep_a_)
  BufferPlan pass_plan_{"mlp"};
  int64_t pass_M_ = -1;
};

}  // namespace fp4moe
