// rank_sum_device (rank_sum.h): one thread per element, grid-stride; the buffers' pointers by value.
#include <algorithm>

#include "kernels/common/check.h"
#include "kernels/common/types.h"
#include "trainer/comm/rank_sum.h"

namespace fp4moe {
namespace {

constexpr int kThreads = 256;

struct RankBuffers {
  float* p[kRankSumMaxRanks];
};

__global__ void __launch_bounds__(kThreads) rank_sum_kernel(RankBuffers b, int ranks, int64_t n) {
  for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < n; i += int64_t{gridDim.x} * kThreads) {
    float s = b.p[0][i];
    for (int r = 1; r < ranks; ++r) s = __fadd_rn(s, b.p[r][i]);  // no contraction: the reference's order
    for (int r = 0; r < ranks; ++r) b.p[r][i] = s;
  }
}

}  // namespace

void rank_sum_device(float* const* buffers, int ranks, int64_t n, cudaStream_t stream) {
  comm_detail::check_rank_sum("rank_sum_device", buffers, ranks, n);
  if (n == 0) return;
  RankBuffers b{};
  for (int r = 0; r < ranks; ++r) b.p[r] = buffers[r];
  const int grid = static_cast<int>(std::clamp<int64_t>(ceil_div(n, kThreads), 1, 132 * 16));
  rank_sum_kernel<<<grid, kThreads, 0, stream>>>(b, ranks, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp4moe
