#include "trainer/train/optimizer_step.h"

#include "kernels/common/check.h"

namespace fp4moe {

void adamw_step_shards(ParamStore& store, AdamWConfig cfg, float weight_decay, const float* grad_scale,
                       cudaStream_t stream) {
  FP4MOE_CHECK(store.allocated(), "adamw_step_shards: the parameter store is not allocated");
  for (Param& p : store.params()) {
    cfg.weight_decay = p.decay ? weight_decay : 0.0f;
    const int64_t b = p.shard_begin;
    adamw_step({p.master, p.param + b, p.grad + b, p.m, p.v, p.shard_size()}, cfg, grad_scale, stream);
  }
}

}  // namespace fp4moe
