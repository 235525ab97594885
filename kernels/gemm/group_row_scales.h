// Per-group repacking of the scales of an FP8 1x128 row tensor, for the grouped Fprop/Dgrad GEMMs.
//
// cuBLASLt's VEC128_32F scales of a GEMM operand with n rows are [ceil(C/128), n] block-major with leading
// dimension exactly n, and n must be a multiple of 4 (measured, cublaslt_matmul.h). A row tensor's scales are
// [ceil(C/128), round_up(M, 4)] for all M rows (layouts.h), so the rows of one expert group are not a valid
// cuBLASLt scale tensor by themselves: this kernel copies each group's columns into a tensor of its own.
//
// Rows of group g handed to cuBLASLt directly ("main rows", n_main(g) below): round_up(M_g, 4) when those rows
// stay inside the tensor (the 1..3 rows past the group's end then belong to later groups, whose own GEMMs run
// afterwards on the same stream and overwrite them), else M_g rounded down to a multiple of 4 (the remaining
// 1..3 rows go through a 4-row scratch GEMM). Host code and kernel use the same function.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/formats/formats.h"

namespace fp4moe {

// Rows of a group (offset `off`, `rows` rows, tensor of M rows) computed by its main cuBLASLt GEMM.
FP4MOE_HD int64_t group_main_rows(int64_t off, int64_t rows, int64_t M) {
  int64_t up = (rows + 3) / 4 * 4;
  return off + up <= M ? up : rows / 4 * 4;
}

// Capacity in floats of the packed scales for any split of M rows into G groups with C columns.
inline int64_t packed_group_scales_capacity(int64_t M, int64_t C, int64_t G) {
  return (C + 127) / 128 * (M + 3 * G);
}

// scales: fp32 [ceil(C/128), round_up(M, 4)] (FP8 1x128 row layout of an [M, C] tensor, layouts.h), device.
// offsets: int32 [G+1] on the device (offsets[G] = M). max_group_rows: an upper bound of M_g (host knowledge,
// sizes the grid). packed: device, capacity packed_group_scales_capacity(M, C, G); group g's tensor starts at
// ceil(C/128) * sum_{h<g} group_main_rows(h) and is [ceil(C/128), group_main_rows(g)] block-major.
// Every value read is a scale of a real row (< M). Rejects: M < 0, C <= 0, G < 1, null pointers.
void pack_group_row_scales(const float* scales, int64_t M, int64_t C, const int32_t* offsets, int64_t G,
                           int64_t max_group_rows, float* packed, cudaStream_t stream);

}  // namespace fp4moe
