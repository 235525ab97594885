// Grouped expert GEMMs on the CUDA cores that read the routing offsets on the device: the path of a split without
// the host copy of its offsets (grouped_gemm.h "Without a host copy") wherever the Hopper kernels do not take the
// problem (BF16 operands, paper 2's 1x128 weights, N or K not multiples of 128, FP32 outputs, another device). They
// exist so that every recipe's expert GEMMs can run without a host synchronisation (a step captured in a CUDA
// graph) at any shape; they are plain tiled FP32 kernels, written to be correct rather than fast (the tensor-core
// paths are the Hopper kernels and cuBLASLt).
//
// Products (grouped_gemm.h; per expert g, rows o[g] .. o[g+1]-1 of the device offsets [G+1]):
//   rows form   out[r, p] = sum_q a[r, q] b_g[p, q]        (Fprop: a = X [M, K], b_g = W_g [N, K];
//                                                           Dgrad: a = dY [M, N], b_g = W_g^T [K, N])
//   Wgrad form  dW_g[n, k] = sum_{t in g} dy[t, n] x[t, k]
// Operands and layouts (kernels/quant/layouts.h):
//   bf16: BF16 row-major; the rows form's b_g either [P, Q] (Fprop) or stored [Q, P] (b_transposed: BF16 Dgrad reads
//         W_g [N, K] as b_g^T); Wgrad's dy [M, N] and x [M, K] row-major.
//   fp8:  E4M3 codes. a: 1x128 row tensor [M, Q] (scales ld round_up(M, 4)); b_g: a 128x128 block tensor [P, Q]
//         (group stride P Q codes and fp8_block_scale_count(P, Q) scales) or a 1x128 row tensor [P, Q] (group
//         stride fp8_row_scale_count(P, Q) scales); Wgrad: FP8 column tensors over the split with token padding
//         16 or 32 (grouped_wgrad_sm90.h).
// Arithmetic: FP32 fused multiply-adds. FP8: the products of codes are exact in FP32; they are summed per 128 of
// the reduction and promoted with both scales (acc += partial * (scale_a * scale_b)), as the tensor-core paths do
// (DeepSeek-V3 section 3.3). Deterministic (a fixed order per output element), not bit-equal to the other paths.
// Outputs: BF16 or FP32 written; Wgrad also FP32 accumulated (dW_g += ...). An empty group's dW_g is written as 0
// (left unchanged when accumulating); the rows form writes only the rows of its groups.
// Launch: one persistent grid over output tiles of 64 x 64 (the rows form's tiles never cross a group), the safe
// offsets (grouped_tiles.h: clamped to [0, M], non-decreasing) and per-group prefixes computed once per thread block
// in shared memory: an invalid split makes no access outside [0, M) rows (M: the split's token count, which the
// caller gives), it may leave rows unwritten.
// Rejects (fp4moe::Error, before launching): G outside [1, kGroupedSimtMaxGroups], M outside [0, 2^30], P or Q
// (N or K) < 1, null pointers (operands and scales may be null when M = 0), accumulation outside Wgrad or into
// BF16, a Wgrad token padding other than 16 or 32 for fp8, b_transposed with fp8 operands.
// Asynchronous on `stream`; no host synchronisation, no allocation: capturable in a CUDA graph.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/types.h"
#include "kernels/gemm/grouped_gemm.h"

namespace fp4moe {

constexpr int64_t kGroupedSimtMaxGroups = 2048;
constexpr int64_t kGroupedSimtMaxTokens = int64_t{1} << 30;  // int32 prefixes of padded groups never overflow

enum class SimtWeightScales { none, block128, row128 };

struct SimtRowsProblem {
  bool fp8 = false;
  const void* a = nullptr;         // [M, Q] bf16 or E4M3 codes
  const float* a_scales = nullptr;  // fp8: 1x128 row scales of a
  const void* b = nullptr;         // G stacked b_g
  const float* b_scales = nullptr;  // fp8: G stacked scales (b_scale_kind)
  SimtWeightScales b_scale_kind = SimtWeightScales::none;  // fp8: block128 or row128; bf16: none
  bool b_transposed = false;       // bf16 only: b_g stored [Q, P]
  int64_t M = 0, P = 0, Q = 0;     // rows, output width, reduction
};

struct SimtWgradProblem {
  bool fp8 = false;
  const void* dy = nullptr;          // bf16 [M, N] or the FP8 column tensor's codes
  const float* dy_scales = nullptr;  // fp8 only
  const void* x = nullptr;           // bf16 [M, K] or codes
  const float* x_scales = nullptr;
  int64_t M = 0, N = 0, K = 0;
  int64_t token_pad = 16;            // fp8: 16 or 32
};

void grouped_rows_simt(const SimtRowsProblem& problem, const int32_t* offsets, int64_t G, GemmOutput out,
                       cudaStream_t stream);
void grouped_wgrad_simt(const SimtWgradProblem& problem, const int32_t* offsets, int64_t G, GemmOutput out,
                        cudaStream_t stream);

}  // namespace fp4moe
