// The sum over ranks of the in-process all-reduce (in_process_transport.h, EpTransport::all_reduce_sum): N
// simulated ranks on one device each hold an FP32 buffer of n elements; afterwards every buffer holds, element by
// element, the sum over the ranks in rank order ((b_0[i] + b_1[i]) + b_2[i]) + ..., in FP32 with round-to-nearest
// (no fused or reassociated additions), so every rank holds the same bits. In place: each element is read from every
// buffer before it is written to any.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace fp4moe {

// Ranks one launch sums (the buffers' pointers travel as a kernel argument).
inline constexpr int kRankSumMaxRanks = 64;

// buffers: host array of `ranks` device pointers to FP32 [n] (distinct, non-overlapping, 4-byte aligned).
// Asynchronous on `stream`. Rejects (fp4moe::Error) ranks outside [1, kRankSumMaxRanks], n < 0, a null buffers
// array or (n > 0) a null buffer. n = 0 launches nothing.
void rank_sum_device(float* const* buffers, int ranks, int64_t n, cudaStream_t stream);
// The CPU reference on host buffers, the same order of additions.
void rank_sum_ref(float* const* buffers, int ranks, int64_t n);

namespace comm_detail {
void check_rank_sum(const char* what, float* const* buffers, int ranks, int64_t n);  // rank_sum_ref.cpp
}  // namespace comm_detail

}  // namespace fp4moe
