#include "kernels/common/check.h"
#include "kernels/nn/elementwise.h"

namespace fp4moe {

void add_bf16_ref(const bf16* a, const bf16* b, int64_t n, bf16* y) {
  FP4MOE_CHECK(n >= 0, "add_bf16_ref: element count n must be >= 0, got {}", n);
  for (int64_t i = 0; i < n; ++i) y[i] = __float2bfloat16_rn(__bfloat162float(a[i]) + __bfloat162float(b[i]));
}

void cast_f32_to_bf16_ref(const float* x, int64_t n, bf16* y) {
  FP4MOE_CHECK(n >= 0, "cast_f32_to_bf16_ref: element count n must be >= 0, got {}", n);
  for (int64_t i = 0; i < n; ++i) y[i] = __float2bfloat16_rn(x[i]);
}

void add_bf16_into_f32_ref(const bf16* x, int64_t n, float* y) {
  FP4MOE_CHECK(n >= 0, "add_bf16_into_f32_ref: element count n must be >= 0, got {}", n);
  for (int64_t i = 0; i < n; ++i) y[i] += __bfloat162float(x[i]);
}

}  // namespace fp4moe
