#include "trainer/train/optimizer_step.h"

#include <cmath>
#include <limits>

#include "kernels/common/check.h"

namespace fp4moe {

void adamw_step_shards(ParamStore& store, AdamWConfig cfg, float weight_decay, const float* grad_scale,
                       cudaStream_t stream) {
  FP4MOE_CHECK(store.allocated(), "adamw_step_shards: the parameter store is not allocated");
  for (Param& p : store.params()) {
    cfg.weight_decay = p.decay ? weight_decay : 0.0f;
    const int64_t b = p.shard_begin;
    if (store.moments() == MomentDtype::bf16)
      adamw_step(AdamWTensorBf16Moments{p.master, p.param + b, p.grad + b, p.m_bf16, p.v_bf16, p.shard_size()}, cfg,
                 grad_scale, stream);
    else
      adamw_step(AdamWTensor{p.master, p.param + b, p.grad + b, p.m, p.v, p.shard_size()}, cfg, grad_scale, stream);
  }
}

GradNorm::GradNorm(const ParamStore& store, DeviceMemory& mem, EpTransport* transport) : transport_(transport) {
  FP4MOE_CHECK(store.allocated(), "GradNorm: the parameter store is not allocated");
  for (const Param& p : store.params()) {
    all_.push_back({p.grad, p.n});
    (p.expert ? expert_ : replicated_).push_back({p.grad, p.n});
  }
  workspace_ = DeviceArray<double>(mem, kGradNormSlots, MemCategory::workspace, "gradient norm partial sums");
  values_ = DeviceArray<float>(mem, 2, MemCategory::workspace, "gradient norm and clip scale");
  if (transport_) expert_norms_ = DeviceArray<float>(mem, 2, MemCategory::workspace, "expert gradient norms");
  CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host_), 2 * sizeof(float), cudaHostAllocDefault));
}

GradNorm::~GradNorm() {
  if (host_) cudaFreeHost(host_);
}

double GradNorm::compute(float max_norm, cudaStream_t stream) {
  if (!transport_) {
    grad_global_norm(all_.data(), static_cast<int>(all_.size()), max_norm, workspace_.data(), norm(), clip_scale(),
                     stream);
    CUDA_CHECK(cudaMemcpyAsync(host_, norm(), sizeof(float), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    return host_[0];
  }
  FP4MOE_CHECK(max_norm > 0, "GradNorm: max_norm must be > 0 (+Inf: no clipping), got {}", max_norm);
  const float inf = std::numeric_limits<float>::infinity();
  float* e = expert_norms_.data();
  grad_global_norm(replicated_.data(), static_cast<int>(replicated_.size()), inf, workspace_.data(), norm(), nullptr,
                   stream);
  grad_global_norm(expert_.data(), static_cast<int>(expert_.size()), inf, workspace_.data(), e, nullptr, stream);
  CUDA_CHECK(cudaMemcpyAsync(host_, norm(), sizeof(float), cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaMemcpyAsync(host_ + 1, e, sizeof(float), cudaMemcpyDeviceToHost, stream));
  transport_->wait(stream);
  const double replicated = host_[0], local_expert = host_[1];
  host_[1] = static_cast<float>(local_expert * local_expert);  // this rank's routed experts' squared norm
  CUDA_CHECK(cudaMemcpyAsync(e + 1, host_ + 1, sizeof(float), cudaMemcpyHostToDevice, stream));
  transport_->all_reduce_sum(e + 1, 1, stream);
  CUDA_CHECK(cudaMemcpyAsync(host_ + 1, e + 1, sizeof(float), cudaMemcpyDeviceToHost, stream));
  transport_->wait(stream);
  const double total = std::sqrt(replicated * replicated + static_cast<double>(host_[1]));
  host_[0] = static_cast<float>(total);
  host_[1] = grad_clip_scale(total, max_norm);
  CUDA_CHECK(cudaMemcpyAsync(values_.data(), host_, 2 * sizeof(float), cudaMemcpyHostToDevice, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));  // host_ is read by the copy
  return total;
}

}  // namespace fp4moe
