// The attention core of one model (flash_attention.h's causal forward and backward) on the backend
// model.attention_backend resolves to (attention_backend.h), decided per shape and pass, once, and cached.
//
// At construction, for the run's shape `main` (micro_batch x seq_len tokens, forward and backward):
//   own    nothing else: every call runs our kernels.
//   cudnn  a CudnnSdpa is made and asked for both plans at `main`; a failure (not built, no usable device or
//          library, no plan) is an fp4moe::Error naming the shape and the reason.
//   auto   the same, a failure giving own with the reason in note(); where cuDNN can run `main`, both backends
//          are timed there (time_attention_backends, on `stream`, within `timing_max_bytes`) and the faster kept.
// The CudnnSdpa is kept only where cudnn was chosen at `main`; workspace_bytes() is then what its plans ask there,
// and the owner gives that much device memory (set_workspace) before the first call.
//
// Calls at any other shape or layout (an evaluation with fewer sequences) are decided at their first call, for
// forward and backward apart: our kernels where `main` chose own; else cuDNN where it has the plan and the plan's
// workspace fits the one given; where not, our kernels under auto, an fp4moe::Error naming the shape and the reason
// under cudnn (before any launch). Building that plan happens during the call (tens to hundreds of ms). Forward and
// backward may then run on different backends at one shape: both write and read the same lse (cudnn_sdpa.h).
//
// Not thread-safe: one per model (device and stream), as CudnnSdpa.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/attention/attention_backend.h"
#include "kernels/attention/cudnn_sdpa.h"
#include "kernels/attention/flash_attention.h"

namespace fp4moe {

class AttentionCore {
 public:
  // Resolves `choice` at `main` with `layout` (the strides of the owner's calls) and cuDNN's backward
  // `deterministic` as above. `timing_max_bytes`: the most device memory the timing may take (auto only).
  // Rejects (fp4moe::Error) what cudnn cannot run, as above.
  AttentionCore(AttentionBackend choice, bool deterministic, const AttentionShape& main, const SdpaLayout& layout,
                int64_t timing_max_bytes, cudaStream_t stream);
  ~AttentionCore();
  AttentionCore(const AttentionCore&) = delete;
  AttentionCore& operator=(const AttentionCore&) = delete;

  // The backend chosen at `main` (own or cudnn), and one line saying which and why (choose_attention_backend's:
  // with auto, both times in ms or why untimed; where cuDNN could not run, its reason).
  AttentionBackend backend() const { return backend_; }
  const std::string& note() const { return note_; }
  bool deterministic() const { return deterministic_; }

  // Bytes of device workspace the cuDNN calls need at `main` (the larger of forward and backward; 0 on own).
  int64_t workspace_bytes() const { return workspace_bytes_; }
  // The workspace the cuDNN calls use: `bytes` >= workspace_bytes() of device memory, 16-byte aligned (null when 0),
  // the owner's, alive while this object is used; contents ignored. Once, before the first forward or backward.
  // Rejects a smaller or misaligned workspace, and a second call.
  void set_workspace(void* workspace, int64_t bytes);

  // The backend that runs `s` with `layout` in forward (backward = false) or backward: decided now on the first
  // query (above; an Error under cudnn where cuDNN cannot), then cached.
  AttentionBackend backend_at(const AttentionShape& s, const SdpaLayout& layout, bool backward);

  // flash_attention_forward's contract (shapes, layouts, lse, rejections, empty shapes), asynchronous on `stream`,
  // on backend_at(s, the call's strides, false).
  void forward(const AttentionShape& s, AttnIn q, AttnIn k, AttnIn v, AttnOut o, float* lse, cudaStream_t stream);
  // flash_attention_backward's contract on backend_at(s, the call's strides, true). `own_workspace`:
  // flash_attention_backward_workspace_bytes(s) bytes of device memory (4-byte aligned), used where our kernels run
  // (the cuDNN calls use set_workspace's).
  void backward(const AttentionShape& s, AttnIn q, AttnIn k, AttnIn v, AttnIn o, AttnIn dout, const float* lse,
                AttnOut dq, AttnOut dk, AttnOut dv, void* own_workspace, cudaStream_t stream);

 private:
  // What is known of cuDNN at `main`: makes sdpa_ and asks its plans; with auto, times both backends.
  CudnnAtShape try_cudnn(const AttentionShape& main, const SdpaLayout& layout, int64_t timing_max_bytes,
                         cudaStream_t stream);

  AttentionBackend choice_;
  bool deterministic_;
  AttentionBackend backend_ = AttentionBackend::own;
  std::string note_;
  std::string main_text_;               // attention_shape_text(main), for refusals at other shapes
  std::unique_ptr<CudnnSdpa> sdpa_;     // where cudnn was chosen at main
  int64_t workspace_bytes_ = 0;         // cuDNN's need at main
  void* workspace_ = nullptr;           // set_workspace's
  int64_t workspace_given_ = 0;
  bool workspace_set_ = false;
  std::map<std::vector<int64_t>, AttentionBackend> decided_;  // (pass, shape, strides) -> backend
};

}  // namespace fp4moe
