// Argument checks shared by the layer ops of kernels/nn (rmsnorm, rope, swiglu, adamw): run on the host before any
// launch and by the CPU references, so that both reject the same arguments with the same messages.
#pragma once

#include <cstdint>

#include "kernels/common/check.h"

namespace fp4moe::nn_detail {

// `name` of op `what` must be >= `min`: "rmsnorm_forward: C must be >= 1, got C=0".
inline void check_at_least(const char* what, const char* name, int64_t value, int64_t min) {
  FP4MOE_CHECK(value >= min, "{}: {} must be >= {}, got {}={}", what, name, min, name, value);
}

// A product of dimensions (elements of one tensor) must stay below 2^62 so that int64 offsets cannot overflow.
inline void check_elements(const char* what, int64_t a, int64_t b) {
  FP4MOE_CHECK(a == 0 || b <= (int64_t{1} << 62) / a, "{}: {} x {} elements exceed 2^62", what, a, b);
}

// A [rows, cols] tensor: rows >= 0 (0 launches nothing), cols >= 1, rows * cols below 2^62.
inline void check_matrix_shape(const char* what, const char* rows_name, int64_t rows, const char* cols_name,
                               int64_t cols) {
  check_at_least(what, rows_name, rows, 0);
  check_at_least(what, cols_name, cols, 1);
  check_elements(what, rows, cols);
}

inline void check_not_null(const char* what, const char* name, const void* p) {
  FP4MOE_CHECK(p != nullptr, "{}: {} is null (a device pointer is required)", what, name);
}

inline bool is_aligned(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}

// Element types need their natural alignment (2 bytes for BF16, 4 for FP32); wider vector paths are chosen, not
// required.
inline void check_aligned(const char* what, const char* name, const void* p, int64_t bytes) {
  FP4MOE_CHECK(is_aligned(p, bytes), "{}: {} must be {}-byte aligned, got address {}", what, name, bytes,
               reinterpret_cast<uintptr_t>(p));
}

}  // namespace fp4moe::nn_detail
