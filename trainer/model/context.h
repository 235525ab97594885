// What every layer's forward and backward needs besides its own tensors: the stream, the cuBLASLt handle with
// its plan cache, the allocator and the shared scratch (DESIGN.md "Trainer"). One per model; layers do not own
// handles, and they keep no per-layer scratch: their backward gradients, FP32 sums, kernel workspaces and the
// activations their recompute policy does not keep come from `scratch`, one call at a time.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "kernels/common/check.h"
#include "kernels/gemm/cublaslt_matmul.h"
#include "trainer/memory/device_memory.h"
#include "trainer/memory/scratch.h"

namespace fp4moe {

class StepProfiler;   // trainer/model/profile.h
class AttentionCore;  // kernels/attention/attention_core.h

struct ModelContext {
  cudaStream_t stream = nullptr;
  CublasLtMatmul* lt = nullptr;
  DeviceMemory* mem = nullptr;
  // The shared scratch (trainer/memory/scratch.h), sized by its owner to the most any layer call takes (each layer
  // reports it: scratch_bytes()). The Model owns one; a test of a single layer makes one for that layer.
  ScratchArena* scratch = nullptr;
  // The seed of this optimizer step's MXFP4 quantizer choices (random Hadamard signs, stochastic rounding of
  // gradients): Model::begin_step sets it to splitmix64_at(train.seed, step); each layer mixes in its weight's name
  // (layer_quant_seed, trainer/model/recipe.h). 0 until then.
  uint64_t quant_seed = 0;
  // The step profile (`fp4moe train --profile`, trainer/model/profile.h): the layers' ProfileScopes record on it
  // while a step is open; null (the default) records nothing.
  StepProfiler* profiler = nullptr;
  // The layers' attention core on model.attention_backend, resolved per shape (kernels/attention/attention_core.h;
  // the model's, with its cuDNN workspace from DeviceMemory's workspace category); null (the default) runs our
  // kernels (flash_attention.h).
  AttentionCore* attention = nullptr;
  // The pass runs without host synchronisation (Model::set_host_sync_free, so that a step's forward and backward can
  // be captured in a CUDA graph): the routers keep the expert counts on the device (moe_router.h), the expert GEMMs
  // read the device offsets (kernels/gemm/grouped_gemm.h "Without a host copy"). False (the default): one host copy
  // of the counts per MoE layer.
  bool host_sync_free = false;
  // Writes to the device of state that a layer keeps there across passes and rewrites only when the pass's shape
  // changes (a quantized Linear's one-group offsets {0, M}, linear_quantized.h): a CUDA graph captured without such
  // a write replays the state as it was at its capture, so it is valid while this count is unchanged
  // (trainer/train/step_graph.h).
  uint64_t device_state_writes = 0;
};

// ctx.scratch, or fp4moe::Error naming `who` when the context has none.
inline ScratchArena& scratch_of(const ModelContext& ctx, const std::string& who) {
  FP4MOE_CHECK(ctx.scratch != nullptr,
               "{}: the ModelContext has no scratch arena (ModelContext::scratch); size one to the layer's "
               "scratch_bytes() (trainer/memory/scratch.h)",
               who);
  return *ctx.scratch;
}

}  // namespace fp4moe
