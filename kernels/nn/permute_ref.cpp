// CPU references of the MoE permutation (permute.h), from the definitions in the header.
#include <vector>

#include "kernels/common/check.h"
#include "kernels/nn/permute.h"
#include "kernels/nn/router.h"

namespace fp4moe {

void permute_map_ref(const int32_t* topk_idx, int64_t T, int64_t k, int64_t E, int32_t* counts, int32_t* offsets,
                     int32_t* row_of, int32_t* assignment_of) {
  const char* what = "permute_map_ref";
  detail::check_permute_shape(what, T, k, 1);
  FP4MOE_CHECK(k <= E, "{}: top-k must be <= the expert count, got k={} E={}", what, k, E);
  FP4MOE_CHECK(T == 0 || (row_of && assignment_of), "{}: row_of [T*k] and assignment_of [T*k] must not be null",
               what);
  expert_counts_and_offsets_ref(topk_idx, T, k, E, counts, offsets);  // validates topk_idx
  std::vector<int32_t> next(offsets, offsets + E);  // next free row of each expert
  for (int64_t a = 0; a < T * k; ++a) {             // assignments in order: stable within an expert
    const int32_t r = next[topk_idx[a]]++;
    row_of[a] = r;
    assignment_of[r] = static_cast<int32_t>(a);
  }
}

template <typename Real>
void permute_forward_ref(const Real* x, const int32_t* assignment_of, int64_t T, int64_t k, int64_t D, Real* xs) {
  detail::check_permute_shape("permute_forward_ref", T, k, D);
  for (int64_t r = 0; r < T * k; ++r) {
    const int64_t t = assignment_of[r] / k;
    for (int64_t d = 0; d < D; ++d) xs[r * D + d] = x[t * D + d];
  }
}

template <typename Real>
void permute_backward_ref(const Real* dxs, const int32_t* row_of, int64_t T, int64_t k, int64_t D, Real* dx) {
  detail::check_permute_shape("permute_backward_ref", T, k, D);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t d = 0; d < D; ++d) {
      Real acc = 0;
      for (int64_t j = 0; j < k; ++j) acc += dxs[static_cast<int64_t>(row_of[t * k + j]) * D + d];
      dx[t * D + d] = acc;
    }
}

template <typename Real>
void unpermute_forward_ref(const Real* ys, const Real* w, const int32_t* row_of, int64_t T, int64_t k, int64_t D,
                           Real* y) {
  detail::check_permute_shape("unpermute_forward_ref", T, k, D);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t d = 0; d < D; ++d) {
      Real acc = 0;
      for (int64_t j = 0; j < k; ++j) {
        const Real prod = w[t * k + j] * ys[static_cast<int64_t>(row_of[t * k + j]) * D + d];
        acc += prod;
      }
      y[t * D + d] = acc;
    }
}

template <typename Real>
void unpermute_backward_ref(const Real* dy, const Real* ys, const Real* w, const int32_t* row_of, int64_t T,
                            int64_t k, int64_t D, Real* dys, Real* dw) {
  detail::check_permute_shape("unpermute_backward_ref", T, k, D);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = row_of[t * k + j];
      Real acc = 0;
      for (int64_t d = 0; d < D; ++d) {
        dys[r * D + d] = w[t * k + j] * dy[t * D + d];
        const Real prod = dy[t * D + d] * ys[r * D + d];
        acc += prod;
      }
      dw[t * k + j] = acc;
    }
}

#define FP4MOE_PERMUTE_REF_INSTANTIATE(Real)                                                                       \
  template void permute_forward_ref<Real>(const Real*, const int32_t*, int64_t, int64_t, int64_t, Real*);          \
  template void permute_backward_ref<Real>(const Real*, const int32_t*, int64_t, int64_t, int64_t, Real*);         \
  template void unpermute_forward_ref<Real>(const Real*, const Real*, const int32_t*, int64_t, int64_t, int64_t,   \
                                            Real*);                                                                \
  template void unpermute_backward_ref<Real>(const Real*, const Real*, const Real*, const int32_t*, int64_t,       \
                                             int64_t, int64_t, Real*, Real*);
FP4MOE_PERMUTE_REF_INSTANTIATE(float)
FP4MOE_PERMUTE_REF_INSTANTIATE(double)
#undef FP4MOE_PERMUTE_REF_INSTANTIATE

}  // namespace fp4moe
