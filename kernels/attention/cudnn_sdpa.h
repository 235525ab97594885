// The attention core of flash_attention.h through cuDNN 9's fused flash attention ("scaled dot product attention",
// SDPA): the same causal forward and backward, on the same tensors and layouts, computed by cuDNN's engines instead
// of our kernels. The backend the model's attention runs on is chosen in attention_backend.h.
//
// Source: the cuDNN 9 backend API (cudnnBackendCreateDescriptor / SetAttribute / Finalize, cudnnBackendExecute) and
// the graph patterns its fused-attention engines match (cuDNN Developer Guide, "Graph API" > "Supported Graph
// Patterns" > scaled dot product attention, FP16/BF16 forward and backward). The operation graphs are the ones
// cuDNN's own C++ frontend (NVIDIA/cudnn-frontend, graph::sdpa and graph::sdpa_backward) builds for cuDNN 9.0 to
// 9.20 for a causal, dropout-free, bias-free attention with a softmax scale; the comments in cudnn_sdpa.cpp spell
// them out node by node.
//
//   forward:  S = Q K^T (FP32), S *= scale, S[t, j] = -inf for j > t (causal, top-left aligned: query t of a
//             sequence sees its keys 0..t), M = rowmax S, Z = rowsum exp(S - M), stats = M + ln Z,
//             P = exp(S - M) / Z rounded to BF16, O = P V (FP32 accumulation, BF16 out)
//   backward: D = rowsum(dO * O); P = exp(scale Q K^T - stats) (masked); dV = P^T dO; dS = P * (dO V^T - D) * scale;
//             dK = dS^T Q; dQ = dS K (FP32 accumulator in the workspace, then BF16, unless deterministic)
//
// Layouts: exactly flash_attention.h's, by strides, so nothing is copied: Q, K, dQ, dK [B*T, H, Dqk] and V, O, dO,
// dV [B*T, H, Dv] BF16 (AttnIn / AttnOut: row b*T + t, any token and head strides that are multiples of 8 elements,
// last dim contiguous), given to cuDNN as [B, H, T, D] with strides (T token_stride, head_stride, token_stride, 1).
// stats [B, H, T] FP32 = lse of flash_attention.h: the log-sum-exp in natural log of the scaled, masked scores, the
// same quantity as our kernel's (the tests check both against the FP64 reference), so the two backends share the
// kept lse tensor and one's backward can take the other's forward outputs.
//
// Accuracy: as flash_attention.h states for our kernels (P and dS rounded to BF16 for their products, FP32
// accumulation), checked with the same tolerances against the FP64 reference (tests/attention/test_cudnn_sdpa_gpu.cpp).
// Determinism: the forward is deterministic. The backward is deterministic only with `deterministic` = true: cuDNN
// then takes its dP-workspace decomposition on Hopper (no atomics; a workspace that grows with T^2, by cudnn-frontend's
// account B H T^2 BF16 values for T rounded up, 4 GiB at B 1, H 128, T 4096: backward_workspace_bytes says what the
// plan asks); with false it accumulates dQ with FP32 atomics (bits may change from run to run), needs a workspace
// linear in T and is the variant cuDNN (and PyTorch's cuDNN attention) runs by default.
//
// Plans: built on first use per key (B, T, H, Dqk, Dv, every tensor's strides, pass, deterministic; causal always;
// the scale is passed by value at each call), the engine configuration the first one cuDNN's heuristics (CUDNN_HEUR_MODE_A) rank that finalizes, and
// kept for the object's life (building one compiles kernels: tens to hundreds of milliseconds). The workspace comes
// from the caller (the trainer's allocator, a benchmark's pool), sized by forward_workspace_bytes /
// backward_workspace_bytes, which build the plan; nothing is allocated per call.
// Not thread-safe: one object per device and stream (it holds a cuDNN handle of the device current at construction).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>

#include "kernels/attention/flash_attention.h"

namespace fp4moe {

// Whether this build has the cuDNN backend (CMake found cuDNN 9: FP4MOE_WITH_CUDNN).
bool cudnn_sdpa_built();
// "built against cuDNN 9.19.0, running 9.14.0" (cudnnGetVersion of the library loaded), or "not built with cuDNN
// (...)": for logs and error messages.
std::string cudnn_sdpa_version_text();

// Token and head strides of one [B*T, H, D] tensor (AttnIn / AttnOut without the pointer).
struct AttnStrides {
  int64_t token_stride = 0;
  int64_t head_stride = 0;
};
inline AttnStrides strides_of(AttnIn t) { return {t.token_stride, t.head_stride}; }
inline AttnStrides strides_of(AttnOut t) { return {t.token_stride, t.head_stride}; }
inline AttnIn attn_in(const bf16* data, AttnStrides s) { return {data, s.token_stride, s.head_stride}; }
inline AttnOut attn_out(bf16* data, AttnStrides s) { return {data, s.token_stride, s.head_stride}; }
// The strides of every tensor of a forward and backward call: what a plan depends on besides the shape.
struct SdpaLayout {
  AttnStrides q, k, v, o, dout, dq, dk, dv;
  // Every tensor dense: token stride H * D, head stride D.
  static SdpaLayout dense(const AttentionShape& s);
  // The strides of a forward call's tensors (dense(s) for the backward-only ones, which a forward plan ignores).
  static SdpaLayout of_forward(const AttentionShape& s, AttnIn q, AttnIn k, AttnIn v, AttnOut o);
  // The strides of a backward call's tensors.
  static SdpaLayout of_backward(AttnIn q, AttnIn k, AttnIn v, AttnIn o, AttnIn dout, AttnOut dq, AttnOut dk,
                                AttnOut dv);
};

class CudnnSdpa {
 public:
  // A cuDNN handle on the current device. Throws fp4moe::Error when this build has no cuDNN ("CudnnSdpa: not built
  // with cuDNN (...)", cudnn_sdpa_version_text), the library loaded is older than 9.0, or cudnnCreate fails (no
  // device, a cuDNN library that does not match the driver), with cuDNN's message.
  CudnnSdpa();
  ~CudnnSdpa();
  CudnnSdpa(const CudnnSdpa&) = delete;
  CudnnSdpa& operator=(const CudnnSdpa&) = delete;

  // Whether cuDNN builds both plans (forward; backward with `deterministic`) for this shape and layout; when not,
  // `why` (if given) receives cuDNN's reason. Builds and keeps the plans. Shapes flash_attention.h rejects are not
  // supported either (why names the rule).
  bool supports(const AttentionShape& s, const SdpaLayout& layout, bool deterministic, std::string* why = nullptr);

  // Bytes of device workspace forward / backward need for this shape and layout (the plan's, plus for backward the
  // FP32 tensors the graph keeps there: D [B, H, T] and, unless deterministic, the dQ accumulator [B, H, T, Dqk]),
  // each part 256-byte aligned; 0 for an empty shape. Builds the plan. Throws fp4moe::Error when cuDNN has none
  // (with cuDNN's message) or the shape is one forward() rejects.
  int64_t forward_workspace_bytes(const AttentionShape& s, const SdpaLayout& layout);
  int64_t backward_workspace_bytes(const AttentionShape& s, const SdpaLayout& layout, bool deterministic);

  // flash_attention_forward's contract (shapes, layouts, lse, rejections, empty shapes), asynchronous on `stream`,
  // plus a workspace: at least forward_workspace_bytes(s, layout of these tensors) bytes of device memory, 16-byte
  // aligned (null only when that is 0), contents ignored. Rejects (fp4moe::Error, before any launch) a smaller or
  // misaligned workspace, and what flash_attention_forward rejects.
  void forward(const AttentionShape& s, AttnIn q, AttnIn k, AttnIn v, AttnOut o, float* lse, void* workspace,
               int64_t workspace_bytes, cudaStream_t stream);

  // flash_attention_backward's contract: dq, dk, dv (overwritten) from q, k, v, o, dout and lse (forward's, of
  // either backend), with `deterministic` as above and a workspace of at least backward_workspace_bytes(s, layout,
  // deterministic) bytes, 16-byte aligned, contents ignored. Rejects a smaller or misaligned workspace and what
  // flash_attention_backward rejects.
  void backward(const AttentionShape& s, AttnIn q, AttnIn k, AttnIn v, AttnIn o, AttnIn dout, const float* lse,
                AttnOut dq, AttnOut dk, AttnOut dv, bool deterministic, void* workspace, int64_t workspace_bytes,
                cudaStream_t stream);

  // Plans built so far (benchmarks and tests report it).
  int64_t plans_built() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fp4moe
