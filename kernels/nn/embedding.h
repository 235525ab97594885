// Token embedding (DESIGN.md "Trainer": the first layer, BF16 table, FP32 master gradient): a gather of table rows
// forward, and a deterministic scatter-add backward without floating-point atomics.
//
//   forward:   out[m, :]  = table[tokens[m], :]                                          (a copy, exact)
//   backward:  grad[v, :] += sum over m with tokens[m] == v, in increasing m, of float(dout[m, :])
// The backward sum of each token id v starts from 0, adds its positions' rows in position order in FP32 (one
// rounding per addition, no FMA), and is then added once to grad[v, :]: the GPU result equals the CPU reference bit
// for bit, and repeats run to run. On the GPU the positions are grouped by token id with a stable radix sort
// (cub::DeviceRadixSort on (token id, position) pairs), then one thread block per token id and 256 columns walks
// that id's positions in order; every grad element is written by one thread.
//
// Token ids outside [0, V): forward writes a zero row and sets the device flag *error_flag = 1 (the caller zeroes
// the flag beforehand and reads it back: a device cannot throw); backward skips them (their dout rows reach no
// gradient). The trainer's Model checks its tokens on the host before any launch (trainer/model/model.cpp), so this
// flag serves other callers and the tests.
//
// Layouts: tokens int32 [M]; table [V, d] BF16 row-major; out, dout [M, d] BF16 row-major; grad [V, d] FP32
// row-major. M = tokens (B * T), V = vocabulary, d = hidden size.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/types.h"

namespace fp4moe {

// tokens [M], table [V, d] -> out [M, d]; error_flag: device int32 [1] set to 1 when some token id is outside
// [0, V) (null: not reported). Device pointers; d % 8 == 0 with 16-byte aligned table and out takes the 16-byte
// path, anything else 2-byte accesses (same results).
// Rejects (fp4moe::Error, before any launch): M < 0, V < 1, d < 1, M >= 2^31, M * d or V * d beyond 2^62, d beyond
// the grid (2^23 columns), and for M > 0 null tokens, table or out, and misaligned (2-byte BF16, 4-byte int32)
// pointers. M = 0 launches nothing. Asynchronous on `stream`.
void embedding_forward(const int32_t* tokens, int64_t M, const bf16* table, int64_t V, int64_t d, bf16* out,
                       int32_t* error_flag, cudaStream_t stream);

// Bytes of device workspace embedding_backward needs for M tokens and vocabulary V (the sort's keys, positions and
// cub's temporary storage). Queries cub, so it needs a CUDA device; the same arguments give the same size.
int64_t embedding_backward_workspace_bytes(int64_t M, int64_t V);
// The part of it that needs no device: the four [M] 32-bit arrays of the sort (keys and positions, in and out), each
// rounded up to 256 bytes; the rest is cub's temporary storage. Rejects M < 0.
int64_t embedding_backward_array_bytes(int64_t M);

// dout [M, d], tokens [M] -> grad [V, d] += per-token-id sums (above). workspace: device, workspace_bytes >=
// embedding_backward_workspace_bytes(M, V), 256-byte aligned (what cudaMalloc and DeviceMemory give), contents
// ignored. Rejects: as embedding_forward (grad instead of table and out, 4-byte aligned), plus a null or too small
// workspace for M > 0. M = 0 leaves grad alone. Asynchronous on `stream`.
void embedding_backward(const int32_t* tokens, int64_t M, const bf16* dout, int64_t V, int64_t d, float* grad,
                        void* workspace, int64_t workspace_bytes, cudaStream_t stream);

// ---- CPU references (embedding_ref.cpp) ---------------------------------------------------------------------

// Same contract on host memory; returns the number of token ids outside [0, V) (rows written as zeros).
// Same rejections (alignment aside).
int64_t embedding_forward_ref(const int32_t* tokens, int64_t M, const bf16* table, int64_t V, int64_t d, bf16* out);
// Same sums in the same order as the GPU (bitwise equal results); ids outside [0, V) skipped.
void embedding_backward_ref(const int32_t* tokens, int64_t M, const bf16* dout, int64_t V, int64_t d, float* grad);

namespace nn_detail {
// Shape checks shared by the launchers and the references (embedding_ref.cpp).
void check_embedding_shape(const char* what, int64_t M, int64_t V, int64_t d);
}  // namespace nn_detail

}  // namespace fp4moe
