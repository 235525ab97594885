// Causal attention of MLA (DeepSeek-V2 sec. 2.1, DeepSeek-V3 sec. 2.1.1) as trained: per head a query/key dim
// Dqk = qk_nope + qk_rope and a value dim Dv (192/128 for the DeepSeek shapes, 96/64 for `small`, 32/16 for
// `tiny`), computed tile by tile on BF16 tensor cores without ever storing the T x T score matrix (FlashAttention-2,
// Dao 2023: online softmax in forward, recomputation of the scores from the saved log-sum-exp in backward).
//
//   S = scale * Q K^T,   S[t, j] = -inf for j > t (causal, within each sequence)
//   P = softmax_rows(S), O = P V,    lse[t] = ln sum_j exp(S[t, j])
// Backward, with D[t] = sum_d dO[t, d] O[t, d]:
//   dV = P^T dO,  dP = dO V^T,  dS = P * (dP - D),  dQ = scale * dS K,  dK = scale * dS^T Q
//
// Layouts: Q, K, dQ, dK are [B*T, H, Dqk] and V, O, dO, dV [B*T, H, Dv] BF16, each given by strides in elements
// (AttnIn/AttnOut below): row r = b*T + t is token t of sequence b, and rows attend only to the rows 0..t of
// their own sequence. lse is [B, H, T] FP32 (element (b, h, t) at (b*H + h)*T + t), natural log.
//
// Arithmetic: BF16 inputs, FP32 accumulation in mma.sync.m16n8k16 (the sm90 kernels: wgmma); online
// softmax in FP32 in the base-2 domain
// (scores times scale*log2(e), ex2.approx); P (and dS in backward) rounded to BF16 for the products with V
// (dO, K, Q), as FlashAttention-2 does; D is computed from the BF16 O that forward stored; outputs rounded once to
// BF16 (RNE). Expected accuracy against an FP64 reference on the same BF16 inputs
// (tests/attention/test_attention_gpu.cpp): relative L2 error of O around the BF16 rounding (< 1e-2), of dQ, dK, dV
// below 2e-2; lse to ~1e-6 relative.
// Deterministic: no atomics, a fixed summation order for a given shape, so the same inputs give the same bits.
//
// Kernels per (Dqk, Dv) pair and device, picked by one rule (attention_heuristics.h, where the reasons are): on a
// device of compute capability 9.0, (192, 128) and (128, 128) -> the sm90 forward (flash_attention_fwd_sm90.cu:
// WGMMA, TMA, warp specialisation, FlashAttention-3's structure); otherwise Dqk >= 128 -> the 32-key forward
// (flash_attention_fwd_key32.cu), smaller Dqk -> the 64-key forward. Backward: on a device of compute capability
// 9.0, (192, 128) and (128, 128) -> variant sm90: the sm90 dK/dV kernel (flash_attention_bwd_sm90_dkdv.cu) and the
// sm90 dQ kernel (flash_attention_bwd_sm90.cu), both WGMMA, TMA, warp specialisation; otherwise Dqk >= 128 -> the
// role-split kernels, smaller Dqk -> the column-split ones. Variant sm90_dq (the role-split dK/dV kernel with the
// sm90 dQ kernel) and role_split run on Hopper by name only. The mma.sync rule comes from H200 timings of two shapes
// (runs listed in reports/results/h200/README.md); (128, 128) and (192, 192) follow the Dqk >= 128 rule unmeasured, and (32, 16),
// (32, 32) and (64, 64) the small-Dqk rule. The kernels sum in different orders: results differ between them by
// FP32 rounding only (flash_attention_forward_with and flash_attention_backward_with run named kernels, for such
// comparisons).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/attention/attention_heuristics.h"
#include "kernels/common/types.h"

namespace fp4moe {

struct AttentionShape {
  int64_t B = 0;    // sequences
  int64_t T = 0;    // tokens per sequence (queries and keys; causal: query t sees keys 0..t of its sequence)
  int64_t H = 0;    // heads
  int64_t Dqk = 0;  // query/key head dim
  int64_t Dv = 0;   // value head dim
  float scale = 0;  // softmax scale (the model passes 1/sqrt(Dqk))
};

// A [B*T, H, D] BF16 tensor given by strides in elements: element (row r = b*T + t, head h, dim d) is at
// data[r * token_stride + h * head_stride + d]; the last dim is contiguous. Lets the model pass slices of wider
// projection outputs (the nope and rope parts of q, k_nope and v out of the kv up-projection) without copies.
struct AttnIn {
  const bf16* data = nullptr;
  int64_t token_stride = 0;
  int64_t head_stride = 0;
};
struct AttnOut {
  bf16* data = nullptr;
  int64_t token_stride = 0;
  int64_t head_stride = 0;
};

// The (Dqk, Dv) pairs the GPU kernels are instantiated for.
constexpr int kAttentionPairs[][2] = {{32, 16}, {32, 32}, {64, 64}, {96, 64}, {128, 128}, {192, 128}, {192, 192}};
// Longest sequence the GPU kernels take (tile counts along T must fit a grid dimension).
constexpr int64_t kAttentionMaxT = int64_t{1} << 21;

// Forward: q, k [B*T, H, Dqk], v [B*T, H, Dv] -> o [B*T, H, Dv] BF16 and lse [B, H, T] FP32 (kept for backward).
// Device pointers, asynchronous on `stream`. B = 0, T = 0 or H = 0 launches nothing (pointers may then be null).
// Rejects (fp4moe::Error, before any launch): B, T or H negative; (Dqk, Dv) not one of kAttentionPairs; scale not
// finite or <= 0; T > kAttentionMaxT; B * H > 2^31 - 1; for a non-empty shape: null data or lse; data not 16-byte
// aligned; a stride that is negative or not a multiple of 8 elements; head_stride < D (when H > 1) or token_stride
// smaller than one token's heads ((H - 1) * head_stride + D); lse not 4-byte aligned. o must not overlap q, k, v.
void flash_attention_forward(const AttentionShape& s, AttnIn q, AttnIn k, AttnIn v, AttnOut o, float* lse,
                             cudaStream_t stream);

// The forward kernel flash_attention_forward runs for (Dqk, Dv) on the current device (attention_heuristics.h's
// forward_kernel_for with its compute capability). Rejects a pair outside kAttentionPairs and a failing CUDA device
// query.
attn::FwdKernel flash_attention_forward_kernel(int64_t Dqk, int64_t Dv);

// flash_attention_forward on the named kernel instead of the rule's (comparisons between kernels: tests,
// benchmarks); the same contract and results within FP32 rounding. Rejects, after flash_attention_forward's checks:
// a kernel not built for (Dqk, Dv) (attention_heuristics.h's forward_kernel_builds), and sm90 on a device whose
// compute capability is not 9.0.
void flash_attention_forward_with(attn::FwdKernel kernel, const AttentionShape& s, AttnIn q, AttnIn k, AttnIn v,
                                  AttnOut o, float* lse, cudaStream_t stream);

// Bytes of device workspace flash_attention_backward needs: D = rowsum(dO * O), B*H*T FP32 (0 for an empty
// shape). Rejects negative B, T, H.
int64_t flash_attention_backward_workspace_bytes(const AttentionShape& s);

// Backward: dq [B*T, H, Dqk], dk [B*T, H, Dqk], dv [B*T, H, Dv] BF16 (overwritten) from dout [B*T, H, Dv];
// o and lse are forward's outputs for the same q, k, v. workspace: flash_attention_backward_workspace_bytes(s)
// bytes of device memory, 4-byte aligned, contents ignored. Three launches on `stream`: D into the workspace,
// then dK and dV (one thread block per key block, looping over the query blocks at or after it), then dQ (one
// thread block per query block, looping over the key blocks up to it); deterministic, no atomics. The dK/dV kernel
// is the sm90, the column-split or the role-split one by the rule above.
// Rejects: as flash_attention_forward for every tensor, plus a null or misaligned workspace. Outputs must not
// overlap the inputs or each other.
void flash_attention_backward(const AttentionShape& s, AttnIn q, AttnIn k, AttnIn v, AttnIn o, AttnIn dout,
                              const float* lse, AttnOut dq, AttnOut dk, AttnOut dv, void* workspace,
                              cudaStream_t stream);

// The backward kernels flash_attention_backward runs for (Dqk, Dv) on the current device (attention_heuristics.h's
// backward_kernels_for with its compute capability). Rejects a pair outside kAttentionPairs and a failing CUDA device
// query.
attn::BwdKernels flash_attention_backward_kernels(int64_t Dqk, int64_t Dv);

// flash_attention_backward on the named backward variant instead of the rule's (comparisons between kernels: tests,
// benchmarks); the same contract and results within FP32 rounding. Rejects, after flash_attention_backward's checks:
// a variant not built for (Dqk, Dv) (attention_heuristics.h's backward_kernels_build), and sm90_dq or sm90 on a
// device whose compute capability is not 9.0.
void flash_attention_backward_with(attn::BwdKernels kernels, const AttentionShape& s, AttnIn q, AttnIn k, AttnIn v,
                                   AttnIn o, AttnIn dout, const float* lse, AttnOut dq, AttnOut dk, AttnOut dv,
                                   void* workspace, cudaStream_t stream);

// ---- CPU references (attention_ref.cpp) ------------------------------------------------------------------------

// Naive: the full T x T score matrix of each (sequence, head), softmax in Real (max subtracted), for the tests.
// Host arrays, dense: q, k [B*T, H, Dqk], v, o [B*T, H, Dv], lse [B, H, T] (lse may be null: not written).
// Any Dqk, Dv >= 1 (no pair restriction) and any finite scale. Real is float or double.
// Rejects: B, T, H < 0, Dqk or Dv < 1, scale not finite, null arrays for a non-empty shape.
template <typename Real>
void attention_forward_ref(const AttentionShape& s, const Real* q, const Real* k, const Real* v, Real* o, Real* lse);

// Gradients dq, dk [B*T, H, Dqk] and dv [B*T, H, Dv] (overwritten) of sum(dout * O) for the forward above,
// recomputing P from q, k; D = rowsum(dout * O) from the exact O. Same rules and rejections.
template <typename Real>
void attention_backward_ref(const AttentionShape& s, const Real* q, const Real* k, const Real* v, const Real* dout,
                            Real* dq, Real* dk, Real* dv);

}  // namespace fp4moe
