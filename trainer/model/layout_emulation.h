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

// ---- device (layout_emulation.cu), asynchronous on `stream`; M = 0 (n = 0) launches nothing --------------------
// tokens [M] int32 (device) -> h [M, d] BF16 = the stand-in input. Rejects M < 0, d < 1, null pointers for M > 0.
void standin_input(const int32_t* tokens, int64_t M, int64_t d, bf16* h, cudaStream_t stream);
// dh [n] BF16 = the stand-in output gradient of (seed, micro_batch) with `scale`. Rejects n < 0, a scale not finite,
// a null dh for n > 0.
void standin_output_grad(uint64_t seed, int64_t micro_batch, int64_t n, float scale, bf16* dh, cudaStream_t stream);
// topk_idx [n] int32 (n = M k, entries in [0, E), not checked on the device) -> local_idx [n] = topk_idx mod E_local,
// counts [E_local] (assignments per local expert), offsets [E_local + 1] (their exclusive prefix sum). One block
// per local expert: deterministic, no atomics. Rejects n < 0 or beyond int32, E_local outside [1, kMaxLocalExperts],
// null pointers (topk_idx and local_idx only for n > 0).
void local_expert_routing(const int32_t* topk_idx, int64_t n, int64_t E_local, int32_t* local_idx, int32_t* counts,
                          int32_t* offsets, cudaStream_t stream);

// ---- CPU reference (layout_emulation_ref.cpp), host memory, same layouts ---------------------------------------
// local_expert_routing on the host; also rejects an entry of topk_idx < 0.
void local_expert_routing_ref(const int32_t* topk_idx, int64_t n, int64_t E_local, int32_t* local_idx,
                              int32_t* counts, int32_t* offsets);

}  // namespace fp4moe
