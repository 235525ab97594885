// One GPU of a parallel layout, emulated on the local GPU (DESIGN.md "Trainer", Emulated layout): the stand-ins for
// the neighbours that GPU would exchange data with, and the expert-parallel share of the routed load. No other rank
// exists and nothing is transferred; the communication buffers are allocated and counted (Model::comm_buffers) and
// the stand-ins below fill the pipeline's.
//
// Pipeline stand-ins (pp > 1), deterministic and table-free:
//   input     a stage without the embedding receives its input hidden state h [M, d] from the previous stage; here
//             a fixed pseudo-random embedding keyed by (token id, column):
//               h[m, c] = BF16(kStandinInputAmplitude * u(token_key(tokens[m], c)))
//             u uniform in [-1, 1) (std 1/sqrt(3)), so h has the embedding init's std 0.02 (model.cpp). A function of
//             the token alone: a later stage still learns the next token from it.
//   output    a stage without the LM head receives the gradient of its output from the next stage; here
//               dh[i] = BF16(scale * u(grad_key(seed, micro_batch, i))),   i = m d + c,  scale = grad_scale / M
//             (the size of a mean-over-M loss's gradient), micro_batch counting the Model's backward passes.
// u(x) = (splitmix64(x) >> 40) 2^-23 - 1: 24 random bits, exact in FP32, computed alike on host and device.
//
// Expert-parallel share (ep > 1): a GPU holds E_l = E / ep routed experts; the router scores all E (it is
// replicated under expert parallelism). The rows expert parallelism delivers to this GPU are emulated from its own
// tokens: every chosen expert e maps to local expert e mod E_l, so the E_l local experts receive the N k rows a
// balanced routing delivers (a token may meet one local expert twice).
//
// Skewed routed load (parallel.routed_load r in [1, ep]): the hottest rank of a skewed expert-parallel run receives
// R = ceil(N k r) rows (routed_row_count) instead of N k. Its local experts process R rows: the n = N k real rows above
// (assignments a < n, a = token k + slot) and R - n extra rows standing for rows other ranks would send. Extra row j
// (assignment n + j, 0 <= j < R - n) goes to local expert j mod E_l (spread evenly: each local expert gets
// floor or ceil of (R - n) / E_l) and copies the input of real assignment j mod n, i.e. token (j mod n) / k
// (routed_row_tokens: the source token of assignment a is (a mod n) / k). Within a local expert the real rows come
// first in assignment order, then the extra ones (permute_map over the R local ids as R tokens of top-1,
// kernels/nn/permute.h). Extra rows carry combine weight 0: the combine (unpermute_forward) reads only the n real
// rows, so the output and the loss are the balanced run's; backward gives them a zero output gradient
// (zero_extra_rows on the expert-sorted dys), so their expert Wgrad and Dgrad contributions are zero and their
// gate gradients do not exist (the top-k weights' gradient is [N, k]): nothing of them reaches the router. The
// expert GEMMs run over all R rows, and every buffer sized by R is allocated at R (the estimator's R, estimate.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/types.h"

namespace fp4moe {

// The most local experts local_expert_routing takes (kRouterMaxExperts, kernels/nn/router.h).
constexpr int64_t kMaxLocalExperts = 1024;
// std 0.02 (the embedding init) over u's 1/sqrt(3): 0.02 sqrt(3).
constexpr float kStandinInputAmplitude = 0.034641016f;

namespace emulation_detail {
__host__ __device__ inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
// Uniform in [-1, 1) from the top 24 bits of mix64(key): exact in FP32.
__host__ __device__ inline float uniform_pm1(uint64_t key) {
  return static_cast<float>(mix64(key) >> 40) * 0x1.0p-23f - 1.0f;
}
}  // namespace emulation_detail

// The stand-in input element (before the BF16 rounding) for token id `token` and column `c`.
__host__ __device__ inline float standin_input_value(int32_t token, int64_t c) {
  const uint64_t key = emulation_detail::mix64(static_cast<uint64_t>(static_cast<uint32_t>(token)) ^
                                               0x5354414745494E50ull) ^ static_cast<uint64_t>(c);
  return kStandinInputAmplitude * emulation_detail::uniform_pm1(key);
}
// The stand-in output-gradient element (before the BF16 rounding) at flat index i of micro-batch `micro_batch`.
__host__ __device__ inline float standin_output_grad_value(uint64_t seed, int64_t micro_batch, int64_t i, float scale) {
  const uint64_t key = emulation_detail::mix64(seed ^ emulation_detail::mix64(static_cast<uint64_t>(micro_batch))) ^
                       static_cast<uint64_t>(i);
  return scale * emulation_detail::uniform_pm1(key);
}

// R: the routed rows a GPU's local experts receive, ceil(balanced_rows x routed_load / tp) (estimate.h's R; the
// emulation runs tp 1, balanced_rows = N k); with routed_load = 1 exactly ceil(balanced_rows / tp). Rejects
// (fp4moe::Error) balanced_rows < 0, tp < 1, routed_load < 1 or not finite, and an R beyond int64.
int64_t routed_row_count(int64_t balanced_rows, double routed_load, int64_t tp = 1);

// ---- device (layout_emulation.cu), asynchronous on `stream`; M = 0 (n = 0) launches nothing --------------------
// tokens [M] int32 (device) -> h [M, d] BF16 = the stand-in input. Rejects M < 0, d < 1, null pointers for M > 0.
void standin_input(const int32_t* tokens, int64_t M, int64_t d, bf16* h, cudaStream_t stream);
// dh [n] BF16 = the stand-in output gradient of (seed, micro_batch) with `scale`. Rejects n < 0, a scale not finite,
// a null dh for n > 0.
void standin_output_grad(uint64_t seed, int64_t micro_batch, int64_t n, float scale, bf16* dh, cudaStream_t stream);
// topk_idx [n] int32 (n = M k, entries in [0, E), not checked on the device) -> local_idx [rows]: topk_idx mod
// E_local for a < n, (a - n) mod E_local for the extra rows a >= n (skewed load, above); counts [E_local] (rows per
// local expert), offsets [E_local + 1] (their exclusive prefix sum). One block per local expert: deterministic, no
// atomics. Rejects rows < n, rows > 0 with n = 0, rows beyond int32, E_local outside [1, kMaxLocalExperts], null
// pointers (topk_idx only for n > 0, local_idx for rows > 0).
void local_expert_routing(const int32_t* topk_idx, int64_t n, int64_t rows, int64_t E_local, int32_t* local_idx,
                          int32_t* counts, int32_t* offsets, cudaStream_t stream);
// assignment_of [rows] (permute_map's inverse map over the rows' assignments, values in [0, rows)) -> token_of
// [rows] = (assignment_of mod n) / k: the token whose input each row copies (extra rows: real assignment j mod n).
// token_of may be assignment_of (in place). Rejects n < 1 for rows > 0, rows < n, k < 1, rows beyond int32, null
// pointers for rows > 0.
void routed_row_tokens(const int32_t* assignment_of, int64_t rows, int64_t n, int64_t k, int32_t* token_of,
                       cudaStream_t stream);
// rows_data [rows, d] BF16 (expert-sorted) with row_of [rows] (permute_map's row of each assignment): zeroes the
// rows of the extra assignments n..rows-1 (the output gradient of rows with combine weight 0). Rejects n < 0,
// rows < n, d < 1, null pointers when rows > n.
void zero_extra_rows(const int32_t* row_of, int64_t n, int64_t rows, int64_t d, bf16* rows_data,
                     cudaStream_t stream);

// ---- CPU reference (layout_emulation_ref.cpp), host memory, same layouts ---------------------------------------
// local_expert_routing on the host; also rejects an entry of topk_idx < 0.
void local_expert_routing_ref(const int32_t* topk_idx, int64_t n, int64_t rows, int64_t E_local, int32_t* local_idx,
                              int32_t* counts, int32_t* offsets);
// The rows the local experts process, in expert-sorted order (row r of offsets' ranges), from the definitions
// above: local_idx [rows] and offsets [E_local + 1] of local_expert_routing_ref, topk_weight [n] (the combine
// weights of the n = M k real assignments) -> row_token [rows] (the token whose input row r copies) and row_weight
// [rows] (its combine weight: the assignment's for a real row, 0 for an extra one). Rejects what
// routed_row_tokens rejects and a local id outside [0, E_local).
void skewed_rows_ref(const int32_t* local_idx, const int32_t* offsets, const float* topk_weight, int64_t n,
                     int64_t rows, int64_t k, int64_t E_local, int32_t* row_token, float* row_weight);

}  // namespace fp4moe
