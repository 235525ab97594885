// The public entry points of causal flash attention (flash_attention.h): argument checks, the kernel parameters,
// and the launches of the kernels that attention_heuristics.h picks for the (Dqk, Dv) pair.
#include "kernels/attention/flash_attention.h"

#include "kernels/attention/attention_checks.h"
#include "kernels/attention/attention_heuristics.h"
#include "kernels/attention/attention_params.cuh"
#include "kernels/attention/attention_tile.cuh"
#include "kernels/common/check.h"

namespace fp4moe {

void flash_attention_forward(const AttentionShape& s, AttnIn q, AttnIn k, AttnIn v, AttnOut o, float* lse,
                             cudaStream_t stream) {
  if (!attn_detail::check_forward_call("flash_attention_forward", s, q, k, v, o, lse)) return;
  attn::FwdParams p{q, k, v, o, lse, static_cast<int>(s.T), static_cast<int>(s.H), s.scale * attn::kLog2e};
  switch (attn::forward_kernel_for(s.Dqk, s.Dv)) {
    case attn::FwdKernel::key64: attn::launch_forward_key64(p, s.B, s.Dqk, s.Dv, stream); break;
    case attn::FwdKernel::key32:
      p.bh_count = s.B * s.H;
      p.group_heads = attn::group_heads_for(p.bh_count);
      attn::launch_forward_key32(p, s.Dqk, s.Dv, stream);
      break;
  }
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
  attn::BwdParams p{q,  k,  v,  o,  dout, lse, static_cast<float*>(workspace), dq, dk, dv, static_cast<int>(s.T),
                    static_cast<int>(s.H), static_cast<int>(s.Dv), s.scale, s.scale * attn::kLog2e};
  attn::launch_backward_delta(p, s.B, stream);
  switch (attn::backward_kernels_for(s.Dqk, s.Dv)) {
    case attn::BwdKernels::column_split:
      attn::launch_backward_column_split_dkdv(p, s.B, s.Dqk, s.Dv, stream);
      attn::launch_backward_dq(p, s.B, s.Dqk, s.Dv, stream);
      break;
    case attn::BwdKernels::role_split:
      p.bh_count = s.B * s.H;
      p.group_heads = attn::group_heads_for(p.bh_count);
      attn::launch_backward_role_split_dkdv(p, s.Dqk, s.Dv, stream);
      attn::launch_backward_dq_grouped(p, s.Dqk, s.Dv, stream);
      break;
  }
}

}  // namespace fp4moe
