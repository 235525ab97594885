// The optimizer step over a ParamStore (trainer/model/params.h): AdamW (kernels/nn/adamw.h) on every Param's
// shard, with the store's moment dtype (ParamStore::moments: FP32, or BF16 as DeepSeek-V3 sec. 3.3.3). Without
// ZeRO-1 the shard is the whole tensor; with it (ParamStore::set_shard) this GPU, rank 0 of its data-parallel
// group, updates the elements [shard_begin, shard_end) of each tensor: its FP32 master and its m and v (FP32 or BF16) shards from
// grad[shard_begin, shard_end), and param[shard_begin, shard_end) := BF16(master). The other BF16 elements belong
// to the other ranks' shards (their all-gather is not emulated) and are left as they are.
// The clip scale comes from the global gradient norm over the whole gradients, as ZeRO-1's norm of the
// reduce-scattered shards all-reduced over the group would give (here: this GPU's own gradients, not reduced).
//
// GradNorm: the global gradient norm and clip scale of the step, on one GPU or over the W ranks of an expert- and
// data-parallel group (trainer/model/model.h):
//   one GPU (no transport): grad_global_norm over every Param's grad in store order with max_norm (as the trainer
//     has always taken it);
//   W ranks: the norm of the group's whole gradient, sqrt(|g_rep|^2 + sum_r |g_exp,r|^2): the replicated gradients
//     counted once (after Model::reduce_gradients they are the same on every rank) and every rank's routed experts'
//     (each rank's squared norm summed over the ranks with EpTransport::all_reduce_sum, FP32). Each part's norm by
//     grad_global_norm (FP64 sums), combined on the host in double; the clip scale grad_clip_scale(norm, max_norm):
//     the same norm and scale on every rank, so every rank takes the same skip / stop decision.
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "kernels/nn/adamw.h"
#include "trainer/comm/transport.h"
#include "trainer/memory/device_memory.h"
#include "trainer/model/params.h"

namespace fp4moe {

class GradNorm {
 public:
  // Over `store`'s gradients (allocated; its tensors' grads stay where they are). transport: the group (outliving
  // this), or null on one GPU. Device buffers from mem under MemCategory::workspace: "gradient norm partial sums"
  // [kGradNormSlots] FP64, "gradient norm and clip scale" [2] FP32, and over a transport "expert gradient norms" [2]
  // FP32. Host page-locked [2] FP32. Rejects an unallocated store.
  GradNorm(const ParamStore& store, DeviceMemory& mem, EpTransport* transport);
  ~GradNorm();
  GradNorm(const GradNorm&) = delete;
  GradNorm& operator=(const GradNorm&) = delete;

  // The norm above (host; synchronises `stream`), and clip_scale() on the device: min(1, max_norm / (norm + 1e-6)),
  // NaN for a non-finite norm (adamw.h). max_norm > 0, +Inf: no clipping. A collective over a transport.
  double compute(float max_norm, cudaStream_t stream);
  float* norm() const { return values_.data(); }             // device FP32 [1], after compute()
  float* clip_scale() const { return values_.data() + 1; }   // device FP32 [1], after compute()

 private:
  EpTransport* transport_;
  std::vector<GradTensor> all_, replicated_, expert_;
  DeviceArray<double> workspace_;
  DeviceArray<float> values_;  // [2] norm, clip scale
  DeviceArray<float> expert_norms_;  // [2] this rank's routed experts' norm; the squared norms summed over the ranks
  float* host_ = nullptr;      // page-locked [2]
};

// One AdamW step on every Param's shard of `store` (allocated): `cfg` with weight_decay = `weight_decay` for Params
// with Param::decay and 0 for the others; grad_scale as adamw_step (a device scalar or null for 1). Asynchronous
// on `stream`. Throws fp4moe::Error for an unallocated store and for what adamw_step rejects.
void adamw_step_shards(ParamStore& store, AdamWConfig cfg, float weight_decay, const float* grad_scale,
                       cudaStream_t stream);

}  // namespace fp4moe
