#include "kernels/common/check.h"
#include "trainer/comm/rank_sum.h"

namespace fp4moe {

namespace comm_detail {
void check_rank_sum(const char* what, float* const* buffers, int ranks, int64_t n) {
  FP4MOE_CHECK(ranks >= 1 && ranks <= kRankSumMaxRanks, "{}: {} ranks, expected 1 to {}", what, ranks,
               kRankSumMaxRanks);
  FP4MOE_CHECK(n >= 0, "{}: n must be >= 0, got {}", what, n);
  FP4MOE_CHECK(buffers, "{}: null array of buffers", what);
  if (n == 0) return;
  for (int r = 0; r < ranks; ++r) FP4MOE_CHECK(buffers[r], "{}: rank {}'s buffer of {} elements is null", what, r, n);
}
}  // namespace comm_detail

void rank_sum_ref(float* const* buffers, int ranks, int64_t n) {
  comm_detail::check_rank_sum("rank_sum_ref", buffers, ranks, n);
  for (int64_t i = 0; i < n; ++i) {
    volatile float s = buffers[0][i];  // one FP32 rounding per addition, as the device does
    for (int r = 1; r < ranks; ++r) s = s + buffers[r][i];
    for (int r = 0; r < ranks; ++r) buffers[r][i] = s;
  }
}

}  // namespace fp4moe
