// CPU reference of trainer/model/layout_emulation.h's local expert routing.
#include "kernels/common/check.h"
#include "trainer/model/layout_emulation.h"

namespace fp4moe {

void local_expert_routing_ref(const int32_t* topk_idx, int64_t n, int64_t E_local, int32_t* local_idx,
                              int32_t* counts, int32_t* offsets) {
  FP4MOE_CHECK(n >= 0 && n <= (int64_t{1} << 31) - 1 && E_local >= 1 && E_local <= kMaxLocalExperts,
               "local_expert_routing_ref: expected 0 <= n < 2^31 and E_local in [1, {}], got n={} E_local={}",
               kMaxLocalExperts, n, E_local);
  for (int64_t e = 0; e < E_local; ++e) counts[e] = 0;
  for (int64_t a = 0; a < n; ++a) {
    FP4MOE_CHECK(topk_idx[a] >= 0, "local_expert_routing_ref: expert id {} at assignment {} is negative", topk_idx[a],
                 a);
    local_idx[a] = static_cast<int32_t>(topk_idx[a] % E_local);
    ++counts[local_idx[a]];
  }
  offsets[0] = 0;
  for (int64_t e = 0; e < E_local; ++e) offsets[e + 1] = offsets[e] + counts[e];
}

}  // namespace fp4moe
