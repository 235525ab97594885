// A model's tensors in a checkpoint file (trainer/checkpoint.h) and back: what `fp4moe train` saves and resumes.
//
// Contents, for a ParamStore (trainer/model/params.h):
//   model section      every Param's FP32 master, named as the Param ("layers.0.attn.q_down"), shape Param::shape;
//                      every StateTensor, FP32, named as it ("layers.1.moe.router.bias")
//   optimizer section  every Param's AdamW moments, FP32: "<name>.m" and "<name>.v", shape Param::shape
// BF16 params and grads are not saved: params are BF16(master) (refresh_bf16_from_master), grads are zeroed at the
// start of every step.
// A store sharded by ZeRO-1 (ParamStore::set_shard) holds only one rank's shard of the masters and moments, and
// the other ranks' shards are not emulated, so no checkpoint of whole tensors can be written or read for it: both
// functions refuse one (require_whole_optimizer_state).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "trainer/checkpoint.h"
#include "trainer/model/params.h"

namespace fp4moe {

// Throws fp4moe::Error "<what>: ..." when `parts` shards the optimizer state (Zero1Parts::sharded): checkpoints
// hold whole FP32 masters and moments, one GPU of a ZeRO-1 layout only its shard of them.
void require_whole_optimizer_state(const Zero1Parts& parts, const std::string& what);

// Synchronizes `stream`, copies every tensor above to the host and writes them with `state` atomically
// (write_checkpoint). Throws fp4moe::Error: a sharded or unallocated store, CUDA and I/O errors (naming the file).
void save_param_checkpoint(const std::string& path, ParamStore& params, const CheckpointState& state,
                           cudaStream_t stream);

// Opens `path` (CheckpointReader: validated, and refused when its configuration hash differs from
// expected_config_hash unless that is 0), reads every tensor above into the store's device tensors, checking
// dtype, shape and CRC, then sets every BF16 param from its master (refresh_bf16_from_master) and synchronizes.
// Throws fp4moe::Error for a sharded or unallocated store, and naming the file and the tensor for a tensor the file
// lacks or has with another shape, and for tensors in the file that this store does not have. Returns the file's state (step, counters, RNG, loader).
CheckpointState load_param_checkpoint(const std::string& path, ParamStore& params, uint64_t expected_config_hash,
                                      cudaStream_t stream);

}  // namespace fp4moe
