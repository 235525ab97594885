// The optimizer step over a ParamStore (trainer/model/params.h): AdamW (kernels/nn/adamw.h) on every Param's
// shard. Without ZeRO-1 the shard is the whole tensor; with it (ParamStore::set_shard) this GPU, rank 0 of its
// data-parallel group, updates the elements [shard_begin, shard_end) of each tensor: its FP32 master, m and v
// shards from grad[shard_begin, shard_end), and param[shard_begin, shard_end) := BF16(master). The other BF16
// elements belong to the other ranks' shards (their all-gather is not emulated) and are left as they are.
// The clip scale comes from the global gradient norm over the whole gradients, as ZeRO-1's norm of the
// reduce-scattered shards all-reduced over the group would give (here: this GPU's own gradients, not reduced).
#pragma once

#include <cuda_runtime.h>

#include "kernels/nn/adamw.h"
#include "trainer/model/params.h"

namespace fp4moe {

// One AdamW step on every Param's shard of `store` (allocated): `cfg` with weight_decay = `weight_decay` for Params
// with Param::decay and 0 for the others; grad_scale as adamw_step (a device scalar or null for 1). Asynchronous
// on `stream`. Throws fp4moe::Error for an unallocated store and for what adamw_step rejects.
void adamw_step_shards(ParamStore& store, AdamWConfig cfg, float weight_decay, const float* grad_scale,
                       cudaStream_t stream);

}  // namespace fp4moe
