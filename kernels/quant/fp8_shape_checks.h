// Host argument checks shared by the BF16 -> FP8 kernels, their CPU references and the FP8 dequantization.
#pragma once

#include <climits>
#include <cstdint>

#include "kernels/common/check.h"

namespace fp4moe::detail {

// A [rows, cols] operand of an FP8 layout: rows >= 0 (or > 0 and a multiple of 16 when `rows_multiple_of_16`),
// cols a positive multiple of 16 (FP8 GEMMs in cuBLASLt need the reduction dimension to be a multiple of 16).
inline void check_fp8_shape(const char* what, const char* tensor, const char* rows_name, int64_t rows,
                            int64_t cols, bool rows_multiple_of_16) {
  FP4MOE_CHECK(cols > 0 && cols % 16 == 0, "{}: K must be a positive multiple of 16, got {} [{}, K] = [{}, {}]",
               what, tensor, rows_name, rows, cols);
  if (rows_multiple_of_16)
    FP4MOE_CHECK(rows > 0 && rows % 16 == 0, "{}: {} must be a positive multiple of 16, got {} [{}, K] = [{}, {}]",
                 what, rows_name, tensor, rows_name, rows, cols);
  else
    FP4MOE_CHECK(rows >= 0 && rows <= INT32_MAX, "{}: {} must be in [0, 2^31), got {} [{}, K] = [{}, {}]", what,
                 rows_name, tensor, rows_name, rows, cols);
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// The optional device counter of NaN/Inf blocks: null, or 8-byte aligned (the kernels add to it atomically).
inline void check_nonfinite_counter(const char* what, const unsigned long long* counter) {
  FP4MOE_CHECK((reinterpret_cast<uintptr_t>(counter) & 7u) == 0,
               "{}: nonfinite_blocks must be null or an 8-byte aligned device counter, got address {}", what,
               static_cast<const void*>(counter));
}

}  // namespace fp4moe::detail
