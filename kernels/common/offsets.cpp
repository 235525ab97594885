#include "kernels/common/offsets.h"

#include "kernels/common/check.h"

namespace fp4moe {

void validate_group_offsets(const int32_t* o, int64_t G, int64_t M, const char* what) {
  FP4MOE_CHECK(G >= 1, "{}: expected at least one group, got G={}", what, G);
  FP4MOE_CHECK(o != nullptr, "{}: group offsets are null (expected int32 [G+1] = [{}])", what, G + 1);
  FP4MOE_CHECK(o[0] == 0, "{}: group offsets must start at 0, got offsets[0]={}", what, o[0]);
  for (int64_t g = 0; g < G; ++g)
    FP4MOE_CHECK(o[g + 1] >= o[g], "{}: group offsets must be non-decreasing, got offsets[{}]={} > offsets[{}]={}",
                 what, g, o[g], g + 1, o[g + 1]);
  FP4MOE_CHECK(o[G] == M, "{}: group offsets must end at M={}, got offsets[{}]={}", what, M, G, o[G]);
}

}  // namespace fp4moe
