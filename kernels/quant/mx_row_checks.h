// Host argument checks shared by the MXFP4 row kernels (bf16_to_mxfp4_row, mxfp4_to_bf16, mxfp4_row_to_fp8_row)
// and their CPU references, so that both reject the same arguments with the same messages.
#pragma once

#include <cstdint>

#include "kernels/common/check.h"
#include "kernels/quant/layouts.h"

namespace fp4moe::detail {

// Largest M * K accepted: flat element indices (and the stochastic-rounding counter) stay far from overflow.
constexpr int64_t kMxMaxElements = int64_t{1} << 62;

// An MXFP4 row tensor [M, K]: M >= 0, K a positive multiple of 32 (OCP MX v1.0 block size), M * K <= 2^62.
inline void check_mx_row_shape(const char* what, int64_t M, int64_t K) {
  FP4MOE_CHECK(M >= 0, "{}: M must be >= 0, got shape [M, K] = [{}, {}]", what, M, K);
  FP4MOE_CHECK(K > 0 && K % kMxBlock == 0,
               "{}: K must be a positive multiple of {} (the MX block size), got shape [M, K] = [{}, {}]", what,
               kMxBlock, M, K);
  FP4MOE_CHECK(M <= kMxMaxElements / K, "{}: M * K must be at most 2^62, got shape [M, K] = [{}, {}]", what, M, K);
}

// A non-null pointer aligned to `align` bytes (a power of two).
inline void check_mx_pointer(const char* what, const char* name, const void* p, uintptr_t align) {
  FP4MOE_CHECK(p != nullptr, "{}: {} is null", what, name);
  FP4MOE_CHECK((reinterpret_cast<uintptr_t>(p) & (align - 1)) == 0, "{}: {} must be {}-byte aligned, got address {}",
               what, name, align, p);
}

// A non-null host pointer (CPU references).
inline void check_mx_host_pointer(const char* what, const char* name, const void* p) {
  FP4MOE_CHECK(p != nullptr, "{}: {} is null", what, name);
}

}  // namespace fp4moe::detail
