// The model's trainable parameters and non-trainable state, in one place (DESIGN.md "Trainer").
//
// Each parameter is a row-major tensor (linear weights [out, in] as in PyTorch's nn.Linear; routed experts
// [E, out, in]) with four device copies: `param` BF16 (what forward and backward read), `master` FP32 (what the
// optimizer updates), `grad` FP32 (what backward accumulates into, +=), and the AdamW moments `m`, `v`: FP32, or
// `m_bf16`, `v_bf16` BF16 when the store keeps them in BF16 (set_moments; DeepSeek-V3 sec. 3.3.3).
// Names follow one scheme, e.g. "embed", "layers.0.attn.q_down", "layers.1.moe.experts.fc1", "lm_head", so that
// checkpoints and the PyTorch parity check can match tensors by name.
//
// ZeRO-1 (set_shard, before allocate()): the store then holds what rank 0 of its data-parallel group holds under
// the shard rule of trainer/model/param_shard.h: the BF16 params and the FP32 grads whole, the FP32 masters and
// the moments only for each Param's shard [shard_begin, shard_end) of its elements (routed experts' tensors over
// the expert parts, the rest over the dense parts; state tensors are never sharded). The optimizer step updates the
// shard and writes the shard's BF16 params; the rest of the BF16 params would come from the other ranks'
// all-gather, which is not emulated: they keep their values. Without set_shard every shard is the whole tensor.
//
// Use: layers call add()/add_state() in their constructors and keep the returned pointers (stable: the store is a
// deque); allocate() then gives every tensor its device memory (weights under MemCategory::weights, grads under
// grads, m and v under optimizer, in the moment dtype) in one block per kind, so a tensor's pointers are views into those blocks;
// init() fills them. Adding after allocate() throws. The grad block holds the tensors that are not routed experts'
// first, then the routed experts' (each kind in registration order), so that the gradients a data-parallel group
// all-reduces lie in one contiguous range (replicated_grads; the routed experts' are local to their rank under
// expert parallelism, trainer/model/model.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "kernels/common/types.h"
#include "kernels/nn/adamw.h"
#include "trainer/memory/device_memory.h"
#include "trainer/model/param_shard.h"

namespace fp4moe {

enum class ParamInit { normal, ones, zeros };

struct Param {
  std::string name;
  std::vector<int64_t> shape;  // row-major
  int64_t n = 0;               // elements (product of shape)
  ParamInit init = ParamInit::normal;
  float init_std = 0.0f;       // standard deviation of ParamInit::normal
  bool decay = true;           // AdamW weight decay applies (matrices); false for norm weights
  bool expert = false;         // a routed experts' tensor (is_routed_expert_param): ZeRO-1's expert parts
  int64_t init_index = 0;      // init() draws element i from the generator's index init_index + i: a rank's slice
                               // of a larger tensor (an expert-parallel rank's experts) gets the slice's values
  int64_t shard_begin = 0;     // this GPU's ZeRO-1 shard: elements [shard_begin, shard_end) of the tensor
  int64_t shard_end = 0;       // (set by allocate(); [0, n) without sharding; may be empty under it)
  bf16* param = nullptr;       // device [n]
  float* master = nullptr;     // device [shard_end - shard_begin]: element i of the tensor at master[i - shard_begin];
                               // null when the shard is empty
  float* grad = nullptr;       // device [n], accumulated by backward
  float* m = nullptr;          // device [shard_end - shard_begin], as master: FP32 moments (null under BF16 ones)
  float* v = nullptr;          // device [shard_end - shard_begin], as master
  bf16* m_bf16 = nullptr;      // device [shard_end - shard_begin], as master: BF16 moments (null under FP32 ones)
  bf16* v_bf16 = nullptr;      // device [shard_end - shard_begin], as master

  int64_t shard_size() const { return shard_end - shard_begin; }
};

// Non-trainable FP32 state saved in checkpoints (e.g. the v3 router's aux-loss-free bias [E]); zero-initialised.
struct StateTensor {
  std::string name;
  std::vector<int64_t> shape;
  int64_t n = 0;
  float* data = nullptr;  // device [n], counted under MemCategory::weights
};

class ParamStore {
 public:
  ParamStore() = default;
  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;

  // Registers a parameter; throws for a duplicate name, an empty or non-positive shape, or after allocate().
  Param& add(const std::string& name, std::vector<int64_t> shape, ParamInit init, float init_std, bool decay);
  StateTensor& add_state(const std::string& name, std::vector<int64_t> shape);

  // ZeRO-1: hold only rank 0's shard of the masters and moments (param_shard.h), split over parts.dense ranks
  // (non-expert tensors) and parts.expert ranks (routed experts'). Before allocate(); Zero1Parts{} (the default):
  // whole tensors. Rejects parts < 1 and a call after allocate().
  void set_shard(Zero1Parts parts);
  const Zero1Parts& shard_parts() const { return shard_parts_; }
  bool sharded() const { return shard_parts_.sharded(); }

  // The AdamW moments' storage (train.moments): FP32 (the default; Param::m, v) or BF16 (Param::m_bf16, v_bf16).
  // Before allocate(); rejects a call after it.
  void set_moments(MomentDtype dtype);
  MomentDtype moments() const { return moments_; }

  // Device memory for everything registered (every tensor starts at a multiple of kParamAlignElems elements of its
  // block: 256 bytes for FP32, 128 for BF16): param and grad blocks of every tensor padded to kParamAlignElems, the
  // params in registration order, the grads in registration order with the routed experts' last
  // (replicated_grads); master, m and v blocks of zero1_layout's storage (the non-expert shard, then the routed
  // experts'; m and v in the moment dtype, "AdamW m (FP32)" or "AdamW m (BF16)"); the state block.
  void allocate(DeviceMemory& mem);
  bool allocated() const { return allocated_; }

  // Deterministic initialisation from `seed`: element i of the parameter named `name` draws N(0, init_std^2) from a
  // counter-based generator keyed by (seed, FNV-1a hash of name, Param::init_index + i), so a tensor's values do not
  // depend on the order or number of the others. Writes param (the BF16 rounding, RNE, of every element: the same
  // values sharded or not) and the master (FP32) of the shard's elements, zeroes grad, m, v and the state tensors.
  // Generated on the device (param_init.h); synchronous.
  void init(uint64_t seed, cudaStream_t stream);
  void zero_grads(cudaStream_t stream);
  // param := BF16(master) on every tensor's shard (after loading masters from a checkpoint).
  void refresh_bf16_from_master(cudaStream_t stream);

  // The grads of every tensor that is not a routed experts' (Param::expert false), padding included (zeroed with the
  // rest): one contiguous device FP32 range [data, data + n) of the grad block. After allocate().
  struct GradRange {
    float* data = nullptr;
    int64_t n = 0;
  };
  GradRange replicated_grads() const;

  std::deque<Param>& params() { return params_; }
  const std::deque<Param>& params() const { return params_; }
  std::deque<StateTensor>& states() { return states_; }
  const Param* find(const std::string& name) const;  // null if absent
  int64_t total_elements() const;
  int64_t shard_elements() const;  // the sum of shard_size() (total_elements() without sharding)

 private:
  std::deque<Param> params_;
  std::deque<StateTensor> states_;
  Zero1Parts shard_parts_;
  MomentDtype moments_ = MomentDtype::fp32;
  bool allocated_ = false;
  DeviceArray<bf16> param_block_;
  DeviceArray<float> master_block_, grad_block_, m_block_, v_block_, state_block_;
  DeviceArray<bf16> m_block_bf16_, v_block_bf16_;  // the moments under MomentDtype::bf16 (m_block_, v_block_ empty)
  int64_t replicated_grad_elems_ = 0;  // the grad block's first part (replicated_grads)
};

// The generator of init() on the host (its reference; init() runs param_init.h's device copy of it): a standard
// normal for (seed, key, index), via splitmix64 and Box-Muller.
float param_init_normal(uint64_t seed, uint64_t key, uint64_t index);
uint64_t param_name_key(const std::string& name);  // FNV-1a 64 of the name

}  // namespace fp4moe
