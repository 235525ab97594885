// AttentionCore (attention_core.h): the backend resolved at the run's shape, then per shape and pass at first call.
#include "kernels/attention/attention_core.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>

#include "kernels/common/check.h"

namespace fp4moe {

AttentionCore::AttentionCore(AttentionBackend choice, bool deterministic, const AttentionShape& main,
                             const SdpaLayout& layout, int64_t timing_max_bytes, cudaStream_t stream)
    : choice_(choice), deterministic_(deterministic), main_text_(attention_shape_text(main)) {
  const CudnnAtShape at =
      choice == AttentionBackend::own ? CudnnAtShape{} : try_cudnn(main, layout, timing_max_bytes, stream);
  backend_ = choose_attention_backend(choice, main, deterministic, at, &note_);
  if (backend_ != AttentionBackend::cudnn) {
    sdpa_.reset();
    return;
  }
  workspace_bytes_ = std::max(sdpa_->forward_workspace_bytes(main, layout),
                              sdpa_->backward_workspace_bytes(main, layout, deterministic));
}

AttentionCore::~AttentionCore() = default;

CudnnAtShape AttentionCore::try_cudnn(const AttentionShape& main, const SdpaLayout& layout, int64_t timing_max_bytes,
                                      cudaStream_t stream) {
  CudnnAtShape at;
  try {
    sdpa_ = std::make_unique<CudnnSdpa>();
  } catch (const Error& e) {  // not built, no device, a library older than 9.0 or not matching the driver
    at.refusal = e.what();
    return at;
  }
  if (!sdpa_->supports(main, layout, deterministic_, &at.refusal)) return at;
  if (choice_ == AttentionBackend::automatic)
    at.times = time_attention_backends(*sdpa_, main, layout, deterministic_, timing_max_bytes, stream, &at.untimed);
  return at;
}

void AttentionCore::set_workspace(void* workspace, int64_t bytes) {
  FP4MOE_CHECK(!workspace_set_ && decided_.empty(),
               "AttentionCore::set_workspace: the workspace is given once, before the first forward or backward");
  FP4MOE_CHECK(bytes >= workspace_bytes_, "AttentionCore::set_workspace: {} bytes given, cuDNN's plans at {} ask {}",
               bytes, main_text_, workspace_bytes_);
  FP4MOE_CHECK(bytes == 0 || (workspace != nullptr && reinterpret_cast<uintptr_t>(workspace) % 16 == 0),
               "AttentionCore::set_workspace: expected a 16-byte aligned device pointer for {} bytes, got {:#x}", bytes,
               reinterpret_cast<uintptr_t>(workspace));
  workspace_ = workspace;
  workspace_given_ = bytes;
  workspace_set_ = true;
}

AttentionBackend AttentionCore::backend_at(const AttentionShape& s, const SdpaLayout& layout, bool backward) {
  if (!sdpa_) return AttentionBackend::own;
  std::vector<int64_t> key = {backward, s.B, s.T, s.H, s.Dqk, s.Dv};
  for (const AttnStrides& t : {layout.q, layout.k, layout.v, layout.o, layout.dout, layout.dq, layout.dk, layout.dv})
    key.insert(key.end(), {t.token_stride, t.head_stride});
  if (auto it = decided_.find(key); it != decided_.end()) return it->second;
  CudnnAtShape at;
  try {  // builds the plan: a refusal is cuDNN's reason
    const int64_t need = backward ? sdpa_->backward_workspace_bytes(s, layout, deterministic_)
                                  : sdpa_->forward_workspace_bytes(s, layout);
    if (need > workspace_given_)
      at.refusal = fmt::format("the {} plan asks {} bytes of workspace, {} were allocated (for {})",
                               backward ? "backward" : "forward", need, workspace_given_, main_text_);
  } catch (const Error& e) {
    at.refusal = e.what();
  }
  // The choice at main was cudnn: under auto a shape cuDNN can run follows it (untimed), one it cannot runs ours.
  const AttentionBackend b = choose_attention_backend(choice_, s, deterministic_, at, nullptr);
  decided_.emplace(std::move(key), b);
  return b;
}

void AttentionCore::forward(const AttentionShape& s, AttnIn q, AttnIn k, AttnIn v, AttnOut o, float* lse,
                            cudaStream_t stream) {
  if (backend_at(s, SdpaLayout::of_forward(s, q, k, v, o), false) == AttentionBackend::cudnn)
    sdpa_->forward(s, q, k, v, o, lse, workspace_, workspace_given_, stream);
  else
    flash_attention_forward(s, q, k, v, o, lse, stream);
}

void AttentionCore::backward(const AttentionShape& s, AttnIn q, AttnIn k, AttnIn v, AttnIn o, AttnIn dout,
                             const float* lse, AttnOut dq, AttnOut dk, AttnOut dv, void* own_workspace,
                             cudaStream_t stream) {
  if (backend_at(s, SdpaLayout::of_backward(q, k, v, o, dout, dq, dk, dv), true) == AttentionBackend::cudnn)
    sdpa_->backward(s, q, k, v, o, dout, lse, dq, dk, dv, deterministic_, workspace_, workspace_given_, stream);
  else
    flash_attention_backward(s, q, k, v, o, dout, lse, dq, dk, dv, own_workspace, stream);
}

}  // namespace fp4moe
