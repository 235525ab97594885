#include "trainer/model/params.h"

#include <cmath>
#include <vector>

#include "kernels/common/check.h"
#include "kernels/formats/formats.h"
#include "trainer/model/param_init.h"

namespace fp4moe {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
}  // namespace

uint64_t param_name_key(const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

float param_init_normal(uint64_t seed, uint64_t key, uint64_t index) {
  const uint64_t a = splitmix64(seed ^ splitmix64(key ^ splitmix64(index)));
  const uint64_t b = splitmix64(a);
  // Two uniforms in (0, 1] and [0, 1) from the top 53 bits.
  const double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;
  const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

Param& ParamStore::add(const std::string& name, std::vector<int64_t> shape, ParamInit init, float init_std,
                       bool decay) {
  FP4MOE_CHECK(!allocated_, "ParamStore::add({}): parameters must be registered before allocate()", name);
  FP4MOE_CHECK(find(name) == nullptr, "ParamStore::add: duplicate parameter name {}", name);
  FP4MOE_CHECK(!shape.empty(), "ParamStore::add({}): empty shape", name);
  int64_t n = 1;
  for (int64_t d : shape) {
    FP4MOE_CHECK(d >= 1, "ParamStore::add({}): every dimension must be >= 1, got {}", name, d);
    n *= d;
  }
  FP4MOE_CHECK(init != ParamInit::normal || init_std > 0.0f, "ParamStore::add({}): normal init needs std > 0", name);
  Param p;
  p.name = name;
  p.shape = std::move(shape);
  p.n = n;
  p.init = init;
  p.init_std = init_std;
  p.decay = decay;
  p.expert = is_routed_expert_param(p.name);
  params_.push_back(std::move(p));
  return params_.back();
}

StateTensor& ParamStore::add_state(const std::string& name, std::vector<int64_t> shape) {
  FP4MOE_CHECK(!allocated_, "ParamStore::add_state({}): state must be registered before allocate()", name);
  for (const auto& s : states_) FP4MOE_CHECK(s.name != name, "ParamStore::add_state: duplicate name {}", name);
  int64_t n = 1;
  for (int64_t d : shape) {
    FP4MOE_CHECK(d >= 1, "ParamStore::add_state({}): every dimension must be >= 1, got {}", name, d);
    n *= d;
  }
  states_.push_back(StateTensor{name, std::move(shape), n, nullptr});
  return states_.back();
}

const Param* ParamStore::find(const std::string& name) const {
  for (const auto& p : params_)
    if (p.name == name) return &p;
  return nullptr;
}

int64_t ParamStore::total_elements() const {
  int64_t n = 0;
  for (const auto& p : params_) n += p.n;
  return n;
}

int64_t ParamStore::shard_elements() const {
  int64_t n = 0;
  for (const auto& p : params_) n += p.shard_size();
  return n;
}

void ParamStore::set_shard(Zero1Parts parts) {
  FP4MOE_CHECK(!allocated_, "ParamStore::set_shard: the shard must be set before allocate()");
  FP4MOE_CHECK(parts.dense >= 1 && parts.expert >= 1,
               "ParamStore::set_shard: parts must be >= 1 (1: not sharded), got dense {} and expert {}", parts.dense,
               parts.expert);
  shard_parts_ = parts;
}

void ParamStore::set_moments(MomentDtype dtype) {
  FP4MOE_CHECK(!allocated_, "ParamStore::set_moments: the moment dtype must be set before allocate()");
  moments_ = dtype;
}

void ParamStore::allocate(DeviceMemory& mem) {
  FP4MOE_CHECK(!allocated_, "ParamStore::allocate: called twice");
  std::vector<int64_t> sizes;
  std::vector<bool> expert;
  for (const auto& p : params_) {
    sizes.push_back(p.n);
    expert.push_back(p.expert);
  }
  const Zero1Layout shard = zero1_layout(sizes, expert, shard_parts_);
  int64_t total = 0, state_total = 0;
  for (const auto& p : params_) total += param_padded(p.n);
  for (const auto& s : states_) state_total += param_padded(s.n);
  param_block_ = DeviceArray<bf16>(mem, total, MemCategory::weights, "parameters (BF16)");
  master_block_ = DeviceArray<float>(mem, shard.storage(), MemCategory::weights, "master weights (FP32)");
  grad_block_ = DeviceArray<float>(mem, total, MemCategory::grads, "gradients (FP32)");
  const bool bf16_moments = moments_ == MomentDtype::bf16;
  if (bf16_moments) {
    m_block_bf16_ = DeviceArray<bf16>(mem, shard.storage(), MemCategory::optimizer, "AdamW m (BF16)");
    v_block_bf16_ = DeviceArray<bf16>(mem, shard.storage(), MemCategory::optimizer, "AdamW v (BF16)");
  } else {
    m_block_ = DeviceArray<float>(mem, shard.storage(), MemCategory::optimizer, "AdamW m (FP32)");
    v_block_ = DeviceArray<float>(mem, shard.storage(), MemCategory::optimizer, "AdamW v (FP32)");
  }
  state_block_ = DeviceArray<float>(mem, state_total, MemCategory::weights, "model state (FP32)");
  // The grad block: the tensors that are not routed experts' first, then the routed experts' (replicated_grads).
  replicated_grad_elems_ = 0;
  for (const auto& p : params_)
    if (!p.expert) replicated_grad_elems_ += param_padded(p.n);
  int64_t off = 0, grad_off[2] = {0, replicated_grad_elems_};
  size_t i = 0;
  for (auto& p : params_) {
    const Zero1Slot& slot = shard.slots[i++];
    p.param = param_block_.data() + off;
    p.grad = grad_block_.data() + grad_off[p.expert ? 1 : 0];
    grad_off[p.expert ? 1 : 0] += param_padded(p.n);
    p.shard_begin = slot.range.begin;
    p.shard_end = slot.range.end;
    const bool owned = !slot.range.empty();
    p.master = owned ? master_block_.data() + slot.storage_offset : nullptr;
    p.m = owned && !bf16_moments ? m_block_.data() + slot.storage_offset : nullptr;
    p.v = owned && !bf16_moments ? v_block_.data() + slot.storage_offset : nullptr;
    p.m_bf16 = owned && bf16_moments ? m_block_bf16_.data() + slot.storage_offset : nullptr;
    p.v_bf16 = owned && bf16_moments ? v_block_bf16_.data() + slot.storage_offset : nullptr;
    off += param_padded(p.n);
  }
  off = 0;
  for (auto& s : states_) {
    s.data = state_block_.data() + off;
    off += param_padded(s.n);
  }
  allocated_ = true;
}

void ParamStore::init(uint64_t seed, cudaStream_t stream) {
  FP4MOE_CHECK(allocated_, "ParamStore::init: allocate() first");
  for (auto& p : params_) {
    const MasterShard shard{p.master, p.shard_begin, p.shard_end};
    if (p.init == ParamInit::normal)
      param_init_normal_device(shard, p.param, p.n, seed, param_name_key(p.name), p.init_index, p.init_std, stream);
    else
      param_fill_device(shard, p.param, p.n, p.init == ParamInit::ones ? 1.0f : 0.0f, stream);
  }
  CUDA_CHECK(cudaMemsetAsync(grad_block_.data(), 0, grad_block_.bytes(), stream));
  if (m_block_.data()) CUDA_CHECK(cudaMemsetAsync(m_block_.data(), 0, m_block_.bytes(), stream));
  if (v_block_.data()) CUDA_CHECK(cudaMemsetAsync(v_block_.data(), 0, v_block_.bytes(), stream));
  for (const DeviceArray<bf16>* b : {&m_block_bf16_, &v_block_bf16_})  // BF16 zero: every bit 0
    if (b->data()) CUDA_CHECK(cudaMemsetAsync(b->data(), 0, b->bytes(), stream));
  if (state_block_.data()) CUDA_CHECK(cudaMemsetAsync(state_block_.data(), 0, state_block_.bytes(), stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
}

ParamStore::GradRange ParamStore::replicated_grads() const {
  FP4MOE_CHECK(allocated_, "ParamStore::replicated_grads: allocate() first");
  return GradRange{const_cast<float*>(grad_block_.data()), replicated_grad_elems_};
}

void ParamStore::zero_grads(cudaStream_t stream) {
  FP4MOE_CHECK(allocated_, "ParamStore::zero_grads: allocate() first");
  CUDA_CHECK(cudaMemsetAsync(grad_block_.data(), 0, grad_block_.bytes(), stream));
}

}  // namespace fp4moe

namespace fp4moe {

void ParamStore::refresh_bf16_from_master(cudaStream_t stream) {
  FP4MOE_CHECK(allocated_, "ParamStore::refresh_bf16_from_master: allocate() first");
  // Through the host: runs once per checkpoint load, not per step.
  std::vector<float> master;
  std::vector<bf16> param;
  for (auto& p : params_) {
    if (p.shard_size() == 0) continue;
    master.resize(static_cast<size_t>(p.shard_size()));
    param.resize(master.size());
    CUDA_CHECK(cudaMemcpyAsync(master.data(), p.master, master.size() * 4, cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    for (size_t i = 0; i < master.size(); ++i) param[i] = __float2bfloat16_rn(master[i]);
    CUDA_CHECK(cudaMemcpyAsync(p.param + p.shard_begin, param.data(), param.size() * 2, cudaMemcpyHostToDevice,
                               stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
  }
}

}  // namespace fp4moe
