// CPU reference of trainer/model/layout_emulation.h's local expert routing and of the rows the local experts process
// under a skewed routed load.
#include <vector>

#include "kernels/common/check.h"
#include "trainer/model/layout_emulation.h"

namespace fp4moe {

void local_expert_routing_ref(const int32_t* topk_idx, int64_t n, int64_t rows, int64_t E_local, int32_t* local_idx,
                              int32_t* counts, int32_t* offsets) {
  FP4MOE_CHECK(n >= 0 && rows >= n && rows <= (int64_t{1} << 31) - 1 && (n > 0 || rows == 0) && E_local >= 1 &&
                   E_local <= kMaxLocalExperts,
               "local_expert_routing_ref: expected 0 <= n <= rows < 2^31 (rows 0 when n is) and E_local in [1, {}], "
               "got n={} rows={} E_local={}", kMaxLocalExperts, n, rows, E_local);
  for (int64_t e = 0; e < E_local; ++e) counts[e] = 0;
  for (int64_t a = 0; a < rows; ++a) {
    if (a < n)
      FP4MOE_CHECK(topk_idx[a] >= 0, "local_expert_routing_ref: expert id {} at assignment {} is negative",
                   topk_idx[a], a);
    local_idx[a] = static_cast<int32_t>(a < n ? topk_idx[a] % E_local : (a - n) % E_local);
    ++counts[local_idx[a]];
  }
  offsets[0] = 0;
  for (int64_t e = 0; e < E_local; ++e) offsets[e + 1] = offsets[e] + counts[e];
}

void skewed_rows_ref(const int32_t* local_idx, const int32_t* offsets, const float* topk_weight, int64_t n,
                     int64_t rows, int64_t k, int64_t E_local, int32_t* row_token, float* row_weight) {
  FP4MOE_CHECK(k >= 1 && rows >= n && rows <= (int64_t{1} << 31) - 1 && (rows == 0 || n >= 1) && E_local >= 1,
               "skewed_rows_ref: expected k, E_local >= 1 and 1 <= n <= rows < 2^31 (or rows 0), got n={} rows={} "
               "k={} E_local={}", n, rows, k, E_local);
  std::vector<int64_t> next(offsets, offsets + E_local);  // the next row of each local expert
  for (int64_t a = 0; a < rows; ++a) {  // assignment order within an expert: the real rows first, then the extra
    const int32_t e = local_idx[a];
    FP4MOE_CHECK(e >= 0 && e < E_local, "skewed_rows_ref: local expert {} of row {} is outside [0, {})", e, a,
                 E_local);
    const int64_t r = next[e]++;
    row_token[r] = static_cast<int32_t>((a % n) / k);  // an extra row copies real assignment (a - n) mod n
    row_weight[r] = a < n ? topk_weight[a] : 0.0f;
  }
}

}  // namespace fp4moe
