// The variant entry points of flash attention (flash_attention_variants.h): argument checks, workspace layout and
// the launches of each variant.
#include "kernels/attention/flash_attention_variants.h"

#include "kernels/attention/attention_checks.h"
#include "kernels/attention/attention_params.cuh"
#include "kernels/attention/attention_tile.cuh"
#include "kernels/common/check.h"

namespace fp4moe::attn_detail {
namespace {

constexpr const char* kForwardSummaries[kForwardVariants] = {
    "flash_attention_forward (64-key blocks, 16 or 32 rows per warp)",
    "0 with row-stepping tile copies",
    "0's tiles, row copies, one barrier per key block, Q fragments in registers, head-grouped block order",
    "32 rows per warp x 32-key blocks, 4 warps, 2 blocks per SM, head-grouped block order",
    "2 without the head-grouped block order",
};
constexpr const char* kBackwardSummaries[kBackwardVariants] = {
    "flash_attention_backward (dK/dV kernel by columns, dQ kernel recomputing S and dP)",
    "0 with row-stepping tile copies (no spills)",
    "role-split dK/dV kernel (S^T,P^T,dV | dP^T,dS^T,dK) + 1's dQ kernel, head-grouped block order",
    "role-split kernel with fused dQ, FP32 accumulator summed in a fixed order (flags)",
    "2 without the head-grouped block order",
};

constexpr int64_t kQueryBlock = 64;  // the dQ flags' query blocks (flash_attention_bwd_split.cu's kBlockM)

// Byte offsets of the parts of a backward workspace; D first (all variants), then for variant 3 the dQ accumulator,
// the flags and the ticket counter (the flags and the ticket are contiguous: one memset clears both).
struct BwdWorkspace {
  int64_t delta = 0, acc = 0, flags = 0, ticket = 0, flag_bytes = 0, total = 0;
};

BwdWorkspace backward_workspace(int variant, const AttentionShape& s) {
  BwdWorkspace w;
  w.total = round_up(s.B * s.H * s.T * static_cast<int64_t>(sizeof(float)), 256);
  if (variant == 3 && s.B > 0 && s.T > 0 && s.H > 0) {
    w.acc = w.total;
    w.total += round_up(s.B * s.H * s.T * s.Dqk * static_cast<int64_t>(sizeof(float)), 256);
    w.flags = w.total;
    w.ticket = w.flags + round_up(s.B * s.H * ceil_div(s.T, kQueryBlock) * static_cast<int64_t>(sizeof(int)), 256);
    w.flag_bytes = w.ticket + 256 - w.flags;
    w.total = w.ticket + 256;
  }
  return w;
}

void check_variant(const char* what, int variant, int count) {
  FP4MOE_CHECK(variant >= 0 && variant < count, "{}: variant must be in [0, {}), got {}", what, count, variant);
}

}  // namespace

const char* forward_variant_summary(int variant) {
  check_variant("forward_variant_summary", variant, kForwardVariants);
  return kForwardSummaries[variant];
}

const char* backward_variant_summary(int variant) {
  check_variant("backward_variant_summary", variant, kBackwardVariants);
  return kBackwardSummaries[variant];
}

void flash_attention_forward_variant(int variant, const AttentionShape& s, AttnIn q, AttnIn k, AttnIn v, AttnOut o,
                                     float* lse, cudaStream_t stream) {
  const char* what = "flash_attention_forward_variant";
  check_variant(what, variant, kForwardVariants);
  if (!check_forward_call(what, s, q, k, v, o, lse)) return;
  attn::FwdParams p{q, k, v, o, lse, static_cast<int>(s.T), static_cast<int>(s.H), s.scale * attn::kLog2e};
  p.bh_count = s.B * s.H;
  p.group_heads = variant == 2 || variant == 3 ? attn::group_heads_for(p.bh_count) : 0;
  if (variant <= 1) attn::launch_forward_v0(variant == 1, p, s.B, s.Dqk, s.Dv, stream);
  else attn::launch_forward_tiled(variant == 3 ? 3 : 2, p, s.Dqk, s.Dv, stream);
}

int64_t flash_attention_backward_variant_workspace_bytes(int variant, const AttentionShape& s) {
  const char* what = "flash_attention_backward_variant_workspace_bytes";
  check_variant(what, variant, kBackwardVariants);
  FP4MOE_CHECK(s.B >= 0 && s.T >= 0 && s.H >= 0, "{}: B, T, H must be >= 0, got B={} T={} H={}", what, s.B, s.T,
               s.H);
  FP4MOE_CHECK(variant != 3 || s.Dqk >= 0, "{}: Dqk must be >= 0, got {}", what, s.Dqk);
  return backward_workspace(variant, s).total;
}

void flash_attention_backward_variant(int variant, const AttentionShape& s, AttnIn q, AttnIn k, AttnIn v, AttnIn o,
                                      AttnIn dout, const float* lse, AttnOut dq, AttnOut dk, AttnOut dv,
                                      void* workspace, cudaStream_t stream) {
  const char* what = "flash_attention_backward_variant";
  check_variant(what, variant, kBackwardVariants);
  if (!check_backward_call(what, s, q, k, v, o, dout, lse, dq, dk, dv, workspace)) return;
  FP4MOE_CHECK(variant != 3 || reinterpret_cast<uintptr_t>(workspace) % 16 == 0,
               "{}: variant 3 needs a 16-byte aligned workspace, got address {:#x}", what,
               reinterpret_cast<uintptr_t>(workspace));
  const BwdWorkspace w = backward_workspace(variant, s);
  auto* ws = static_cast<unsigned char*>(workspace);
  attn::BwdParams p{q,  k,  v,  o,  dout, lse, reinterpret_cast<float*>(ws + w.delta), dq, dk, dv,
                    static_cast<int>(s.T), static_cast<int>(s.H), static_cast<int>(s.Dv), s.scale,
                    s.scale * attn::kLog2e};
  p.bh_count = s.B * s.H;
  p.group_heads = variant == 2 ? attn::group_heads_for(p.bh_count) : 0;
  if (variant == 3) {
    p.dq_acc = reinterpret_cast<float*>(ws + w.acc);
    p.dq_flags = reinterpret_cast<int*>(ws + w.flags);
    p.ticket = reinterpret_cast<unsigned long long*>(ws + w.ticket);
    CUDA_CHECK(cudaMemsetAsync(ws + w.flags, 0, static_cast<size_t>(w.flag_bytes), stream));
  }
  attn::launch_backward_delta(p, s.B, stream);
  switch (variant) {
    case 0:
    case 1:
      attn::launch_backward_dkdv_v0(variant == 1, p, s.B, s.Dqk, s.Dv, stream);
      attn::launch_backward_dq_v0(variant == 1, false, p, s.B, s.Dqk, s.Dv, stream);
      break;
    case 3: attn::launch_backward_split(true, p, s.B, s.Dqk, s.Dv, stream); break;
    default:  // 2 (grouped) and 4
      attn::launch_backward_split(false, p, s.B, s.Dqk, s.Dv, stream);
      attn::launch_backward_dq_v0(true, variant == 2, p, s.B, s.Dqk, s.Dv, stream);
      break;
  }
}

}  // namespace fp4moe::attn_detail
