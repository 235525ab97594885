// A model's tensors in a checkpoint file (trainer/checkpoint.h) and back: what `fp4moe train` saves and resumes.
//
// Contents, for a ParamStore (trainer/model/params.h):
//   model section      every Param's FP32 master, named as the Param ("layers.0.attn.q_down"), shape Param::shape;
//                      every StateTensor, FP32, named as it ("layers.1.moe.router.bias")
//   optimizer section  every Param's AdamW moments in the store's moment dtype (ParamStore::moments, recorded as
//                      each tensor's dtype: f32, or bf16 under train.moments = "bf16"): "<name>.m" and "<name>.v",
//                      shape Param::shape
// BF16 params and grads are not saved: params are BF16(master) (refresh_bf16_from_master), grads are zeroed at the
// start of every step.
// Over W >= 2 expert-parallel ranks (trainer/model/model.h) the same tensors are split in two parts
// (checkpoint.h "A checkpoint over W >= 2 ranks"): the routed experts' Params (Param::expert: this rank's E/W
// experts) with their moments in each rank's shard file, everything else (replicated: the same bits on every rank,
// the v3 router bias included) in rank 0's replicated file.
// A store sharded by ZeRO-1 (ParamStore::set_shard) holds only one rank's shard of the masters and moments, and
// the other ranks' shards are not emulated, so no checkpoint of whole tensors can be written or read for it: both
// functions refuse one (require_whole_optimizer_state).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "trainer/checkpoint.h"
#include "trainer/comm/transport.h"
#include "trainer/memory/device_memory.h"
#include "trainer/model/params.h"

namespace fp4moe {

// Throws fp4moe::Error "<what>: ..." when `parts` shards the optimizer state (Zero1Parts::sharded): checkpoints
// hold whole masters and moments, one GPU of a ZeRO-1 layout only its shard of them.
void require_whole_optimizer_state(const Zero1Parts& parts, const std::string& what);

// Synchronizes `stream`, copies every tensor above to the host and writes them with `state` atomically
// (write_checkpoint). Throws fp4moe::Error: a sharded or unallocated store, CUDA and I/O errors (naming the file).
void save_param_checkpoint(const std::string& path, ParamStore& params, const CheckpointState& state,
                           cudaStream_t stream);

// Opens `path` (CheckpointReader: validated, and refused when its configuration hash differs from
// expected_config_hash unless that is 0), reads every tensor above into the store's device tensors, checking
// dtype, shape and CRC, then sets every BF16 param from its master (refresh_bf16_from_master) and synchronizes.
// Throws fp4moe::Error for a sharded or unallocated store, a part of a checkpoint over ranks, and naming the file
// and the tensor for a tensor the file lacks or has with another shape, for tensors in the file that this
// store does not have, and, before any tensor is read, for moments stored in another dtype than the store's
// (train.moments; they are not converted: resume with the checkpoint's dtype). Returns the file's state (step, counters, RNG, loader).
CheckpointState load_param_checkpoint(const std::string& path, ParamStore& params, uint64_t expected_config_hash,
                                      cudaStream_t stream);

// Collective over the W >= 2 ranks of `transport` (every rank calls it with its own store, the same `path` and `state`;
// part, rank and world_size of `state` are set here; the agreements' all-reduce buffers, 3 W FP32 at most, come from
// `mem` under MemCategory::comm and go back before it returns). Writes the checkpoint over ranks whose replicated file
// is `path` (a name ending in ".ckpt"): every rank its shard (checkpoint_shard_path) atomically; an all-reduce then
// gathers every rank's success and shard header CRC (the barrier); only when every shard is in place does rank 0 write
// `path`, listing the shards' CRCs, and a second all-reduce tells every rank whether it did. Throws fp4moe::Error on
// every rank when any rank's write failed (a rank its own error; the others naming the ranks that failed): the
// checkpoint is then not complete, and the previous file at `path`, if any, no longer matches the rewritten shards.
// Throws for what save_param_checkpoint throws and for a transport of one rank.
void save_ranks_checkpoint(const std::string& path, ParamStore& params, CheckpointState state,
                           EpTransport& transport, DeviceMemory& mem, cudaStream_t stream);

// Collective over the W >= 2 ranks of `transport` (the agreements' buffers from `mem`, as above): restores the
// checkpoint over ranks whose replicated file is `path` into every rank's store (rank r: `path`'s tensors and its
// shard's), checked as load_param_checkpoint checks, and returns the replicated file's state. Every rank first opens
// and validates both files; the ranks then agree (an all-reduce of every rank's failure) before any tensor is read, and
// again after reading, so that every rank throws when one fails. Refused (fp4moe::Error naming the file): a `path` that
// is one GPU's whole model or a shard rather than the replicated file; a checkpoint of another world size; a missing or
// corrupt shard; a shard of another rank, world size or configuration hash, of another step or training state than the
// replicated file, or whose header CRC is not the one the replicated file lists (a shard of another write of the same
// step); and on the other ranks when one rank fails, naming it.
CheckpointState load_ranks_checkpoint(const std::string& path, ParamStore& params, uint64_t expected_config_hash,
                                      EpTransport& transport, DeviceMemory& mem, cudaStream_t stream);

}  // namespace fp4moe
