// The small data movements of multi-head latent attention (DeepSeek-V2 sec. 2.1, DeepSeek-V3 sec. 2.1.1) around the
// attention core, as trained (keys and values materialised per head, not absorbed into the projections):
//
//   assemble K (forward): the key of head h is [k_nope_h | k_pe], k_nope_h from the kv up-projection and the RoPE
//   key k_pe shared by all heads:
//       k[m, h, 0:nope]      = kv[m, h, 0:nope]                 kv [M, H, nope + dv] per head: k_nope | v
//       k[m, h, nope:+rope]  = k_pe[m, 0:rope]
//   split dK (backward, the adjoint of assemble K):
//       dkv[m, h, 0:nope]    = dk[m, h, 0:nope]                 (the v part of dkv is left alone: the attention
//                                                                backward writes dV there)
//       dk_pe[m, 0:rope]     = BF16( sum_{h = 0, 1, .., H-1} float(dk[m, h, nope:+rope]) )
//   The head sum runs in FP32 in increasing h (one rounding per addition, no FMA) and is rounded once to BF16: the
//   GPU equals the CPU reference bit for bit; no atomics (each output element has one writer).
//
// Layouts (BF16, element strides): k, dk [M, H, nope + rope] dense; kv, dkv [M, H, nope + dv] dense; k_pe, dk_pe
// [M, rope] with row stride pe_stride >= rope (so that k_pe may be a column slice of a wider tensor, e.g. the kv
// down-projection output [M, kv_lora + rope] at column kv_lora). M = tokens, H = heads.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/types.h"

namespace fp4moe {

struct MlaDims {
  int64_t H = 0;     // heads
  int64_t nope = 0;  // qk_nope_head_dim
  int64_t rope = 0;  // qk_rope_head_dim
  int64_t dv = 0;    // v_head_dim
};

// kv [M, H, nope + dv], k_pe [M, rope] (row stride pe_stride) -> k [M, H, nope + rope] (overwritten; must not
// overlap the inputs). Device pointers. When nope, rope, dv and pe_stride are multiples of 8 and the pointers
// 16-byte aligned, 16-byte copies; otherwise 2-byte (same results).
// Rejects (fp4moe::Error, before any launch): M < 0, H < 1, nope < 1, rope < 1, dv < 1, pe_stride < rope, element
// counts beyond 2^62, and for M > 0 null or misaligned (2 bytes) pointers. M = 0 launches nothing.
// Asynchronous on `stream`.
void mla_assemble_k(const bf16* kv, const bf16* k_pe, int64_t pe_stride, int64_t M, const MlaDims& dims, bf16* k,
                    cudaStream_t stream);

// dk [M, H, nope + rope] -> the k_nope part of dkv [M, H, nope + dv] (the dv part untouched) and dk_pe [M, rope]
// (row stride pe_stride, overwritten). dkv and dk_pe must not overlap dk or each other. Same paths and rejections
// as mla_assemble_k.
void mla_split_dk(const bf16* dk, int64_t M, const MlaDims& dims, bf16* dkv, bf16* dk_pe, int64_t pe_stride,
                  cudaStream_t stream);

// ---- CPU references (mla_ops_ref.cpp) -----------------------------------------------------------------------

// Same contracts on host memory, same arithmetic (bitwise equal to the GPU). Same rejections (alignment aside).
void mla_assemble_k_ref(const bf16* kv, const bf16* k_pe, int64_t pe_stride, int64_t M, const MlaDims& dims, bf16* k);
void mla_split_dk_ref(const bf16* dk, int64_t M, const MlaDims& dims, bf16* dkv, bf16* dk_pe, int64_t pe_stride);

namespace nn_detail {
// Shape checks shared by the launchers and the references (mla_ops_ref.cpp).
void check_mla_dims(const char* what, int64_t M, const MlaDims& dims, int64_t pe_stride);
}  // namespace nn_detail

}  // namespace fp4moe
