// The public entry points of causal flash attention (flash_attention.h): argument checks, the kernel parameters,
// and the launches of the kernels that attention_heuristics.h picks for the (Dqk, Dv) pair.
#include "kernels/attention/flash_attention.h"

#include "kernels/attention/attention_checks.h"
#include "kernels/attention/attention_heuristics.h"
#include "kernels/attention/attention_params.cuh"
#include "kernels/attention/attention_tile.cuh"
#include "kernels/common/check.h"

namespace fp4moe {
namespace {

// Compute capability of the current device, major * 10 + minor.
int current_compute_capability() {
  int device = 0, major = 0, minor = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major * 10 + minor;
}

// The launch of forward kernel `kernel` on a checked call.
void run_forward(attn::FwdKernel kernel, const AttentionShape& s, AttnIn q, AttnIn k, AttnIn v, AttnOut o, float* lse,
                 cudaStream_t stream) {
  attn::FwdParams p{q, k, v, o, lse, static_cast<int>(s.T), static_cast<int>(s.H), s.scale * attn::kLog2e};
  p.bh_count = s.B * s.H;
  p.group_heads = attn::group_heads_for(p.bh_count);
  switch (kernel) {
    case attn::FwdKernel::key64: attn::launch_forward_key64(p, s.B, s.Dqk, s.Dv, stream); break;
    case attn::FwdKernel::key32: attn::launch_forward_key32(p, s.Dqk, s.Dv, stream); break;
    case attn::FwdKernel::sm90: attn::launch_forward_sm90(p, s.B, s.Dqk, s.Dv, stream); break;
  }
}

// An Error unless the current device has compute capability 9.0 (sm_90a kernels); `kernel` names the one asked for.
void require_sm90(const char* what, const char* kernel) {
  const int cc = current_compute_capability();
  FP4MOE_CHECK(cc == attn::kSm90ComputeCapability,
               "{}: {} is sm_90a code: it runs on a device of compute capability 9.0 only, got {}.{}", what, kernel,
               cc / 10, cc % 10);
}

// The launches of backward variant `kernels` on a checked call: D, then dK/dV, then dQ.
void run_backward(attn::BwdKernels kernels, const AttentionShape& s, AttnIn q, AttnIn k, AttnIn v, AttnIn o,
                  AttnIn dout, const float* lse, AttnOut dq, AttnOut dk, AttnOut dv, void* workspace,
                  cudaStream_t stream) {
  attn::BwdParams p{q,  k,  v,  o,  dout, lse, static_cast<float*>(workspace), dq, dk, dv, static_cast<int>(s.T),
                    static_cast<int>(s.H), static_cast<int>(s.Dv), s.scale, s.scale * attn::kLog2e};
  p.bh_count = s.B * s.H;
  p.group_heads = attn::group_heads_for(p.bh_count);
  attn::launch_backward_delta(p, s.B, stream);
  switch (kernels) {
    case attn::BwdKernels::column_split:
      attn::launch_backward_column_split_dkdv(p, s.B, s.Dqk, s.Dv, stream);
      attn::launch_backward_dq(p, s.B, s.Dqk, s.Dv, stream);
      break;
    case attn::BwdKernels::role_split:
      attn::launch_backward_role_split_dkdv(p, s.Dqk, s.Dv, stream);
      attn::launch_backward_dq_grouped(p, s.Dqk, s.Dv, stream);
      break;
    case attn::BwdKernels::sm90_dq:
      attn::launch_backward_role_split_dkdv(p, s.Dqk, s.Dv, stream);
      attn::launch_backward_dq_sm90(p, s.B, s.Dqk, s.Dv, stream);
      break;
    case attn::BwdKernels::sm90:
      attn::launch_backward_dkdv_sm90(p, s.B, s.Dqk, s.Dv, stream);
      attn::launch_backward_dq_sm90(p, s.B, s.Dqk, s.Dv, stream);
      break;
  }
}

// Rejects (fp4moe::Error naming `what`) a (Dqk, Dv) pair the GPU kernels are not instantiated for.
void require_supported_pair(const char* what, int64_t Dqk, int64_t Dv) {
  FP4MOE_CHECK(attn_detail::is_supported_pair(Dqk, Dv), "{}: (Dqk, Dv) = ({},{}) is not supported; supported pairs: {}",
               what, Dqk, Dv, attn_detail::supported_pairs_text());
}

}  // namespace

void flash_attention_forward(const AttentionShape& s, AttnIn q, AttnIn k, AttnIn v, AttnOut o, float* lse,
                             cudaStream_t stream) {
  if (!attn_detail::check_forward_call("flash_attention_forward", s, q, k, v, o, lse)) return;
  run_forward(attn::forward_kernel_for(s.Dqk, s.Dv, current_compute_capability()), s, q, k, v, o, lse, stream);
}

attn::FwdKernel flash_attention_forward_kernel(int64_t Dqk, int64_t Dv) {
  require_supported_pair("flash_attention_forward_kernel", Dqk, Dv);
  return attn::forward_kernel_for(Dqk, Dv, current_compute_capability());
}

void flash_attention_forward_with(attn::FwdKernel kernel, const AttentionShape& s, AttnIn q, AttnIn k, AttnIn v,
                                  AttnOut o, float* lse, cudaStream_t stream) {
  const char* what = "flash_attention_forward_with";
  if (!attn_detail::check_forward_call(what, s, q, k, v, o, lse)) return;
  FP4MOE_CHECK(attn::forward_kernel_builds(kernel, s.Dqk, s.Dv),
               "{}: the {} forward kernel is not built for (Dqk, Dv) = ({},{})", what,
               attn::forward_kernel_name(kernel), s.Dqk, s.Dv);
  if (kernel == attn::FwdKernel::sm90) require_sm90(what, "the sm90 forward kernel");
  run_forward(kernel, s, q, k, v, o, lse, stream);
}

int64_t flash_attention_backward_workspace_bytes(const AttentionShape& s) {
  FP4MOE_CHECK(s.B >= 0 && s.T >= 0 && s.H >= 0,
               "flash_attention_backward_workspace_bytes: B, T, H must be >= 0, got B={} T={} H={}", s.B, s.T, s.H);
  return round_up(s.B * s.H * s.T * static_cast<int64_t>(sizeof(float)), 256);
}

void flash_attention_backward(const AttentionShape& s, AttnIn q, AttnIn k, AttnIn v, AttnIn o, AttnIn dout,
                              const float* lse, AttnOut dq, AttnOut dk, AttnOut dv, void* workspace,
                              cudaStream_t stream) {
  if (!attn_detail::check_backward_call("flash_attention_backward", s, q, k, v, o, dout, lse, dq, dk, dv, workspace))
    return;
  run_backward(attn::backward_kernels_for(s.Dqk, s.Dv, current_compute_capability()), s, q, k, v, o, dout, lse, dq,
               dk, dv, workspace, stream);
}

attn::BwdKernels flash_attention_backward_kernels(int64_t Dqk, int64_t Dv) {
  require_supported_pair("flash_attention_backward_kernels", Dqk, Dv);
  return attn::backward_kernels_for(Dqk, Dv, current_compute_capability());
}

void flash_attention_backward_with(attn::BwdKernels kernels, const AttentionShape& s, AttnIn q, AttnIn k, AttnIn v,
                                   AttnIn o, AttnIn dout, const float* lse, AttnOut dq, AttnOut dk, AttnOut dv,
                                   void* workspace, cudaStream_t stream) {
  const char* what = "flash_attention_backward_with";
  if (!attn_detail::check_backward_call(what, s, q, k, v, o, dout, lse, dq, dk, dv, workspace)) return;
  FP4MOE_CHECK(attn::backward_kernels_build(kernels, s.Dqk, s.Dv),
               "{}: the {} backward kernels are not built for (Dqk, Dv) = ({},{})", what,
               attn::backward_kernels_name(kernels), s.Dqk, s.Dv);
  if (kernels == attn::BwdKernels::sm90_dq) require_sm90(what, "the sm90 dQ kernel of sm90_dq");
  if (kernels == attn::BwdKernels::sm90) require_sm90(what, "the sm90 backward (dK/dV and dQ kernels)");
  run_backward(kernels, s, q, k, v, o, dout, lse, dq, dk, dv, workspace, stream);
}

}  // namespace fp4moe
